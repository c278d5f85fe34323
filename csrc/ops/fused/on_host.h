// The fused ops' way of running a kernel written for host tensors on npu or cpu
// tensors (fused_ops.cpp, attention_ops.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <functional>
#include <initializer_list>

#include "../../core/device.h"
#include "../host_execution.h"

namespace npu::ops {

// Runs `compute(input, output)` on host tensors: for npu inputs inside a
// HostExecution (so the outputs it allocates are npu memory, and writes to an
// input's alias write the npu tensor), for cpu inputs directly. `input` gives a
// contiguous host tensor, `output` the result as a tensor of the inputs' device.
// All defined tensors must be on the device of the first.
template <class Compute>
auto onHost(const char* op, std::initializer_list<std::reference_wrapper<const at::Tensor>> tensors,
            Compute compute) {
  const at::Tensor& first = tensors.begin()->get();
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(!t.defined() || t.device() == first.device(), "Expected all tensors to be on the same device, but "
                "found at least two devices, ", first.device(), " and ", t.device(), "! (npu::", op,
                "; move them with .to('", first.device(), "'))");
  }
  if (first.device().type() != kNPU) return compute([](const at::Tensor& t) { return t.defined() ? t.contiguous() : t; },
                                                    [](const at::Tensor& t) { return t; });
  HostExecution exec(first.device(), op);
  return compute([&](const at::Tensor& t) { return t.defined() ? exec.alias(t).contiguous() : t; },
                 [&](const at::Tensor& t) { return exec.toNpu(t); });
}

}  // namespace npu::ops
