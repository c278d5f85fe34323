// What the fused ops' definitions share (the .cpp files of this folder): their
// one check idiom and their registration for npu and cpu tensors. How their host
// kernels run is ops/host/fused/on_host.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>

// "npu::op (device): " before every message, so each error names the operator and the device.
#define NPU_OP_CHECK(cond, op, device, ...) TORCH_CHECK(cond, "npu::", op, " (", device, "): ", __VA_ARGS__)

// Registers a family's kernels, `register_kernels(torch::Library&)`, for npu and
// cpu tensors: the fused ops serve both (their Meta kernels register apart).
#define NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(register_kernels)        \
  TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) { register_kernels(m); } \
  TORCH_LIBRARY_IMPL(npu, CPU, m) { register_kernels(m); }

namespace npu::ops {

// An optional tensor argument as a tensor: undefined when absent (the families' checks take both alike).
inline at::Tensor valueOr(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

}  // namespace npu::ops
