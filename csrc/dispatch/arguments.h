// An op's arguments on the boxed stack: the tensors of each argument, CUDA's
// device rule over them, and the schema facts kernels ask about.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace npu::dispatch {

// The npu device an op on stack[begin:] runs on: its first npu tensor, else
// its npu device argument, else the current device. Checks CUDA's device rule
// on the way and raises PyTorch's "Expected all tensors to be on the same
// device" error naming the op and the argument: every npu tensor is on that
// device, and a cpu tensor may join only as a 0-dim value the op reads (a
// wrapped scalar), as an element of a Tensor?[] argument (indices), or as an
// argument the op's schema documents as cpu-side (isCpuSideArgument).
c10::Device deviceOfArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin);
// Arguments PyTorch wants on the cpu whatever the device, such as the
// lengths of _ctc_loss.Tensor.
bool isCpuSideArgument(const c10::OperatorHandle& op, const c10::Argument& arg);
// Calls f(tensor, in_optional_list) for the tensors of one argument: a Tensor,
// each of a Tensor[], each present one of a Tensor?[]. Copies nothing (this
// runs for every op).
template <class F>
void forEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor(), false);
  } else if (v.isTensorList()) {
    for (const c10::IValue& e : v.toListRef()) f(e.toTensor(), false);
  } else if (v.isOptionalTensorList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor(), true);
    }
  }
}
// A ScalarType? argument (dtype=) arrives as an int; its real type says so.
bool isScalarTypeArgument(const c10::Argument& arg);
// The argument `v` with each of its tensors (a Tensor, each of a Tensor[], each
// present one of a Tensor?[]) replaced by f(tensor, in_optional_list); other
// values are returned as they are. The one walk over an argument's tensors
// that builds new arguments (aliases, host copies, meta tensors).
template <class F>
c10::IValue mapTensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor(), false);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toListRef().size());
    for (const c10::IValue& e : v.toListRef()) out.push_back(f(e.toTensor(), false));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    out.reserve(v.toListRef().size());
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(f(e.toTensor(), true)) : std::nullopt);
    }
    return out;
  }
  return v;
}

}  // namespace npu::dispatch
