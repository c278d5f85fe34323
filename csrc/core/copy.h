// Copies between the cpu and npu devices and between npu devices: the kernel
// behind copy_, tensor.to(), .npu() and .cpu().
#pragma once

#include <ATen/core/Tensor.h>

namespace npu {

// dst.copy_(src) where at least one side is an npu tensor. `src` broadcasts to
// dst's shape; dtypes convert. Reading npu memory from the host is a
// synchronisation point; non_blocking applies to pinned host memory.
at::Tensor& copyTensor(at::Tensor& dst, const at::Tensor& src, bool non_blocking);

}  // namespace npu
