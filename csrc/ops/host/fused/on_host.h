// How the fused ops' host kernels (this folder) run: on host tensors for npu or
// cpu tensors, their rows in vector-loop clones, their parallel loops' grain.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "../../../core/device.h"
#include "../../../core/profile.h"
#include "../../../runtime/tracing.h"
#include "../host_execution.h"

// Row loops in float, built for AVX-512, AVX2 and the baseline and chosen at load
// time; `omp simd` vectorises them without fast-math.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NPU_VECTOR_CLONES
#endif

namespace npu::ops {

// Rows per task of at::parallel_for: enough elements (ATen's grain, 32768) that
// small tensors run on the calling thread rather than waking the thread team.
inline int64_t rowGrain(int64_t row_elements) {
  constexpr int64_t kGrain = 32768;
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, row_elements));
}

// Runs `compute` on host tensors: for npu inputs inside a HostExecution (so the
// tensors it allocates are npu memory, and writes to an input's alias write the
// npu tensor), for cpu inputs directly. `compute(input, output)` or
// `compute(input, inout, output)`: `input` gives a contiguous host tensor to read,
// `inout` the host alias to update in place (the tensor itself on the cpu),
// `output` the result as a tensor of the inputs' device. The defined tensors must
// share one device. `describe()`, when given, is what the kernel does
// (runtime::tracing::Work), stamped on its launch while a profiler records.
template <class Compute, class Describe = std::nullptr_t>
auto onHost(const char* op, c10::ArrayRef<at::Tensor> tensors, Compute&& compute, Describe&& describe = nullptr) {
  const at::Tensor* first = nullptr;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (first == nullptr) first = &t;
    TORCH_CHECK(t.device() == first->device(), "Expected all tensors to be on the same device, but found at least "
                "two devices, ", first->device(), " and ", t.device(), "! (npu::", op, "; move them with .to('",
                first->device(), "'))");
  }
  auto run = [&](auto input, auto inout, auto output) {
    if constexpr (std::is_invocable_v<Compute&, decltype(input), decltype(inout), decltype(output)>) {
      return compute(input, inout, output);
    } else {
      return compute(input, output);
    }
  };
  if (first == nullptr || first->device().type() != kNPU) {
    auto same = [](const at::Tensor& t) { return t; };
    return run([](const at::Tensor& t) { return t.defined() ? t.contiguous() : t; }, same, same);
  }
  std::optional<runtime::tracing::WorkHint> work;
  if constexpr (!std::is_same_v<std::decay_t<Describe>, std::nullptr_t>) {
    if (C10_UNLIKELY(profile::describingWork())) work.emplace(describe());
  }
  HostExecution exec(first->device(), op);
  return run([&](const at::Tensor& t) { return t.defined() ? exec.alias(t).contiguous() : t; },
             [&](const at::Tensor& t) { return exec.alias(t); },
             [&](const at::Tensor& t) { return t.defined() ? exec.toNpu(t) : t; });
}

}  // namespace npu::ops
