// Convolution on the npu. PyTorch sends convolution on PrivateUse1 to
// convolution_overrideable and convolution_backward_overrideable; there is no
// CPU kernel of those names, so these kernels call ATen's convolution on npu
// memory themselves (and fall back by hand for dtypes the npu lacks).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <chrono>
#include <functional>
#include <initializer_list>

#include "../../core/profile.h"
#include "../../dispatch/fallback.h"
#include "../../dispatch/arguments.h"
#include "../../dispatch/op_names.h"
#include "../../runtime/tracing.h"
#include "chip.h"
#include "host_execution.h"
#include "native_kernel.h"

namespace npu::ops {
namespace {

using dispatch::FallbackReason;

// Whether every defined tensor is on `device` (else the device rule raises).
bool onDevice(c10::Device device, std::initializer_list<std::reference_wrapper<const at::Tensor>> tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.device() != device) return false;
  }
  return true;
}

bool supported(const at::Tensor& t) { return !t.defined() || floatingTypes().contains(t.scalar_type()); }

at::Tensor host(const at::Tensor& t, int64_t* bytes) {
  if (!t.defined()) return t;
  *bytes += static_cast<int64_t>(t.numel() * t.itemsize());
  return t.cpu();
}

const c10::OperatorHandle& convolutionOp() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_overrideable", "");
  return op;
}
const c10::OperatorHandle& convolutionBackwardOp() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward_overrideable", "");
  return op;
}

// Runs `compute` on host copies after the fallback checks, and records it.
template <typename Compute>
auto fallBackByHand(const c10::OperatorHandle& op, const torch::jit::Stack& stack, Compute compute) {
  dispatch::checkFallbackAllowed(op, stack, FallbackReason::Dtype);
  const auto start = std::chrono::steady_clock::now();
  int64_t to_cpu = 0;
  int64_t to_npu = 0;
  auto result = compute(&to_cpu, &to_npu);
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  dispatch::FallbackPolicy::instance().record(dispatch::displayName(op), FallbackReason::Dtype, ns, to_cpu, to_npu);
  return result;
}

// The chip's matrix unit: 16-bit operands widened to float32, one rounding at the end (ops/host/chip.h).
at::Tensor onCube(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == c10::kHalf || t.scalar_type() == c10::kBFloat16) ? t.to(c10::kFloat) : t;
}
at::Tensor roundedTo(const at::Tensor& t, c10::ScalarType type) {
  if (!t.defined()) return t;
  at::Tensor out = t.scalar_type() == type ? t : t.to(type);
  saturateIfChipDoes(out);
  return out;
}

at::Tensor back(const at::Tensor& t, c10::Device device, int64_t* bytes) {
  if (!t.defined()) return t;
  *bytes += static_cast<int64_t>(t.numel() * t.itemsize());
  return t.to(device);
}

// PyTorch's metadata for a convolution on PrivateUse1 (the fake tensors of
// torch.compile and export: _select_conv_backend gives Overrideable, whose memory
// format is contiguous) promises contiguous results, while ATen's CPU kernels keep
// a channels-last input's layout. Compiled code asserts the promised strides, so
// the npu keeps the promise: a channels-last result is made contiguous.
at::Tensor inPromisedLayout(const at::Tensor& t) {
  return t.defined() && !t.is_contiguous() ? t.contiguous() : t;
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  const at::Tensor bias_t = bias.value_or(at::Tensor());
  auto boxed = [&] {
    torch::jit::Stack stack;
    torch::jit::push(stack, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
    return stack;
  };
  // A cpu weight is the caller's error: the device rule raises it.
  if (!onDevice(input.device(), {weight, bias_t})) dispatch::deviceOfArguments(convolutionOp(), boxed(), 0);
  if (!supported(input) || !supported(weight) || !supported(bias_t)) {
    return fallBackByHand(convolutionOp(), boxed(), [&](int64_t* to_cpu, int64_t* to_npu) {
      auto out = at::convolution(host(input, to_cpu), host(weight, to_cpu), host(bias_t, to_cpu), stride, padding,
                                 dilation, transposed, output_padding, groups);
      return back(out, input.device(), to_npu);
    });
  }
  for (const auto* t : {&input, &weight, &bias_t}) {
    if (t->defined()) checkChipDtype(t->scalar_type(), "aten::convolution");
  }
  std::optional<runtime::tracing::WorkHint> work;
  if (C10_UNLIKELY(profile::describingWork())) work.emplace(profile::workOf(convolutionOp(), boxed()));
  HostExecution exec(input.device(), "aten::convolution");
  auto out = at::convolution(onCube(exec.alias(input)), onCube(exec.alias(weight)), onCube(exec.alias(bias_t)),
                             stride, padding, dilation, transposed, output_padding, groups);
  return exec.toNpu(inPromisedLayout(roundedTo(out, input.scalar_type())));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  // The bias gradient's size: output channels.
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  const auto bias_arg = output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef();
  auto boxed = [&] {
    torch::jit::Stack stack;
    torch::jit::push(stack, grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                     groups, output_mask);
    return stack;
  };
  if (!onDevice(input.device(), {grad_output, weight})) {
    dispatch::deviceOfArguments(convolutionBackwardOp(), boxed(), 0);
  }
  if (!supported(grad_output) || !supported(input) || !supported(weight)) {
    return fallBackByHand(convolutionBackwardOp(), boxed(),
                          [&](int64_t* to_cpu, int64_t* to_npu) {
                            auto [gi, gw, gb] = at::convolution_backward(
                                host(grad_output, to_cpu), host(input, to_cpu), host(weight, to_cpu), bias_arg, stride,
                                padding, dilation, transposed, output_padding, groups, output_mask);
                            const auto d = input.device();
                            return std::make_tuple(back(gi, d, to_npu), back(gw, d, to_npu), back(gb, d, to_npu));
                          });
  }
  for (const auto* t : {&grad_output, &input, &weight}) checkChipDtype(t->scalar_type(), "aten::convolution_backward");
  std::optional<runtime::tracing::WorkHint> work;
  if (C10_UNLIKELY(profile::describingWork())) work.emplace(profile::workOf(convolutionBackwardOp(), boxed()));
  HostExecution exec(input.device(), "aten::convolution_backward");
  auto [gi, gw, gb] = at::convolution_backward(onCube(exec.alias(grad_output)), onCube(exec.alias(input)),
                                               onCube(exec.alias(weight)), bias_arg, stride, padding, dilation,
                                               transposed, output_padding, groups, output_mask);
  const auto type = input.scalar_type();
  return {exec.toNpu(inPromisedLayout(roundedTo(gi, type))), exec.toNpu(inPromisedLayout(roundedTo(gw, type))),
          exec.toNpu(roundedTo(gb, type))};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolutionBackward));
}

}  // namespace npu::ops
