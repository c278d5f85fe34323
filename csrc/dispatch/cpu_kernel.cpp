#include "cpu_kernel.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/enum_tag.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "../core/generator.h"
#include "op_names.h"

namespace npu::dispatch {

bool isRandomWithoutGeneratorArgument(const c10::OperatorHandle& op) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  for (const auto& arg : op.schema().arguments()) {
    if (isGeneratorArgument(arg)) return false;
  }
  return true;
}

namespace {

// The overload of the same op that takes the same arguments plus a Generator
// (randperm -> randperm.generator, randperm.out -> randperm.generator_out).
std::optional<c10::OperatorHandle> findGeneratorTwin(const c10::OperatorHandle& op) {
  const auto& ours = op.schema().arguments();
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != op.operator_name().name || name == op.operator_name()) continue;
    auto twin = c10::Dispatcher::singleton().findSchema(name);
    if (!twin) continue;
    const auto& theirs = twin->schema().arguments();
    if (theirs.size() != ours.size() + 1) continue;
    size_t i = 0;
    bool same = true;
    for (const auto& arg : theirs) {
      if (isGeneratorArgument(arg)) continue;
      if (i >= ours.size() || arg.name() != ours[i].name() || *arg.type() != *ours[i].type()) {
        same = false;
        break;
      }
      ++i;
    }
    if (same && i == ours.size()) return twin;
  }
  return std::nullopt;
}

std::optional<c10::OperatorHandle> generatorTwin(const c10::OperatorHandle& op) {
  // Only aten's twins are kept: their registrations live as long as the process.
  if (op.schema().name().rfind("aten::", 0) != 0) return findGeneratorTwin(op);
  static std::mutex mutex;
  static std::unordered_map<c10::OperatorName, std::optional<c10::OperatorHandle>> twins;  // looked up once per op
  std::lock_guard<std::mutex> lock(mutex);
  auto it = twins.find(op.operator_name());
  if (it == twins.end()) it = twins.emplace(op.operator_name(), findGeneratorTwin(op)).first;
  return it->second;
}

// native_dropout's CPU kernel with an explicit generator: a bool mask (in the
// input's layout) drawn by bernoulli_(1 - p), the output input * mask *
// (1 / (1 - p)), the same computation as ATen's (tests/device/test_contracts.py and
// tests/device/test_random.py compare them on the cpu). A nested input drops out its
// buffer, as ATen's nested kernel does.
std::pair<at::Tensor, at::Tensor> dropoutWithDraw(const at::Tensor& input, double p, const at::Generator& draw) {
  if (input.is_nested()) {
    const auto* nested = at::native::get_nested_tensor_impl(input);
    auto [output, mask] = dropoutWithDraw(nested->get_unsafe_storage_as_tensor(), p, draw);
    auto wrap = [&](const at::Tensor& buffer) {
      return at::detail::make_tensor<at::native::NestedTensorImpl>(
          buffer, nested->get_nested_sizes().clone(), nested->get_nested_strides().clone(),
          nested->get_storage_offsets().clone());
    };
    return {wrap(output), wrap(mask)};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  mask.bernoulli_(keep, draw);
  return {input.mul(mask).mul_(scale), mask};
}

void nativeDropoutWithDraw(const c10::OperatorHandle& op, torch::jit::Stack* stack, const at::Generator& draw) {
  const size_t n = op.schema().arguments().size();
  const size_t begin = stack->size() - n;
  auto [output, mask] = dropoutWithDraw((*stack)[begin].toTensor(), (*stack)[begin + 1].toDouble(), draw);
  if (n == 5) {  // native_dropout.out(input, p, train, *, out0, out1)
    at::Tensor out0 = (*stack)[begin + 3].toTensor();
    at::Tensor out1 = (*stack)[begin + 4].toTensor();
    at::native::resize_output(out0, output.sizes());
    at::native::resize_output(out1, mask.sizes());
    out0.copy_(output);
    out1.copy_(mask);
    output = out0;
    mask = out1;
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, output, mask);
}

bool isNativeDropout(const c10::OperatorHandle& op) { return op.schema().name() == "aten::native_dropout"; }

// native_dropout draws only when it drops: in training, on a non-empty input.
bool nativeDropoutDraws(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t begin = stack.size() - op.schema().arguments().size();
  const c10::IValue& train = stack[begin + 2];
  return stack[begin].toTensor().numel() > 0 && (train.isNone() || train.toBool());
}

}  // namespace

void redispatchToCpu(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack,
                     c10::DeviceIndex device) {
  if (C10_LIKELY(!isRandomWithoutGeneratorArgument(op))) {
    op.redispatchBoxed(cpu_keys, stack);
    return;
  }
  if (isNativeDropout(op)) {
    if (!nativeDropoutDraws(op, *stack)) {
      op.redispatchBoxed(cpu_keys, stack);  // draws nothing: a copy and an all-true mask
      return;
    }
    nativeDropoutWithDraw(op, stack, drawFor(std::nullopt, device));
    return;
  }
  if (auto twin = generatorTwin(op)) {
    const size_t n = op.schema().arguments().size();
    std::vector<c10::IValue> ours(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    torch::jit::drop(*stack, n);
    size_t next = 0;
    for (const auto& arg : twin->schema().arguments()) {
      if (isGeneratorArgument(arg)) {
        stack->emplace_back(drawFor(std::nullopt, device));
      } else {
        stack->push_back(std::move(ours[next++]));
      }
    }
    twin->redispatchBoxed(cpu_keys, stack);
    return;
  }
  // Tagged random but drawing nothing on the cpu (_fused_sdp_choice picks a
  // kernel; the cpu's flash attention refuses dropout): runs as it is.
  op.redispatchBoxed(cpu_keys, stack);
}

std::vector<std::string> randomOpsGivenTheNpuDraw() {
  std::vector<std::string> names;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findSchema(name);
    if (!op || !isRandomWithoutGeneratorArgument(*op)) continue;
    if (isNativeDropout(*op) || generatorTwin(*op)) names.push_back(displayName(*op));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace npu::dispatch
