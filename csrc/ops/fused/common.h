// What the fused ops share (fused_ops.cpp, attention_ops.cpp, moe_quant_ops.cpp,
// position_ops.cpp): their one check idiom, the vector-loop clones, the row grain
// of their parallel loops and their registration for npu and cpu tensors. How
// they run on host tensors is on_host.h.
#pragma once

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

// "npu::op (device): " before every message, so each error names the operator and the device.
#define NPU_OP_CHECK(cond, op, device, ...) TORCH_CHECK(cond, "npu::", op, " (", device, "): ", __VA_ARGS__)

// Row loops in float, built for AVX-512, AVX2 and the baseline and chosen at load
// time; `omp simd` vectorises them without fast-math.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NPU_VECTOR_CLONES
#endif

// Registers a family's kernels, `register_kernels(torch::Library&)`, for npu and
// cpu tensors: the fused ops serve both (their Meta kernels register apart).
#define NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(register_kernels)        \
  TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) { register_kernels(m); } \
  TORCH_LIBRARY_IMPL(npu, CPU, m) { register_kernels(m); }

namespace npu::ops {

// Rows per task of at::parallel_for: enough elements (ATen's grain, 32768) that
// small tensors run on the calling thread rather than waking the thread team.
inline int64_t rowGrain(int64_t row_elements) {
  constexpr int64_t kGrain = 32768;
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, row_elements));
}

}  // namespace npu::ops
