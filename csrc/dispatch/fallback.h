// The CPU fallback: every aten op without a native npu kernel (or with one
// that does not support the inputs' dtypes, or that a policy sends to the cpu)
// runs here: synchronise, copy inputs to the host, run the CPU kernel, copy
// results back, count it (policy.h holds the mode, policies and statistics).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

#include "policy.h"

namespace npu::dispatch {

// For FallbackReason::Dtype: the dtype the native kernel refused and the ones
// it supports, as error messages name them.
struct DtypeRefusal {
  std::string refused;    // "Double"
  std::string supported;  // "Float, Half, BFloat16, Byte, ..."
};

// Runs `op` on the CPU with the stack's npu tensors copied to the host, per the
// mode and policies. Raises for mode "error" or an op policy "npu". The op runs
// in stream order: it holds the current stream of its device (core/stream.h).
void cpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, FallbackReason reason,
                 const DtypeRefusal* refusal = nullptr);

// The checks cpuFallback() makes before it runs `op` on the CPU: raises for
// mode "error" or an op policy "npu"; with `announce`, warns (mode "warn") and
// logs. For kernels that fall back by hand: convolution (no CPU kernel of its
// own name) and custom operators, whose cpu implementations run above autograd
// (they copy differentiably in Python, then record()); announce is false
// while they are traced on fake tensors.
void checkFallbackAllowed(const c10::OperatorHandle& op, const torch::jit::Stack& stack, FallbackReason reason,
                          const DtypeRefusal* refusal = nullptr, bool announce = true);

}  // namespace npu::dispatch
