#include "arguments.h"

#include <c10/util/Exception.h>

#include <optional>
#include <set>
#include <string>

#include "../core/device.h"
#include "op_names.h"

namespace npu::dispatch {

bool isScalarTypeArgument(const c10::Argument& arg) {
  const auto& type = arg.real_type();
  return type->kind() == c10::TypeKind::ScalarTypeType ||
         (type->kind() == c10::TypeKind::OptionalType &&
          type->containedType(0)->kind() == c10::TypeKind::ScalarTypeType);
}

bool isCpuSideArgument(const c10::OperatorHandle& op, const c10::Argument& arg) {
  // (op, argument): what PyTorch documents as host-side for accelerators. (The
  // packed-sequence ops, which also take cpu lengths, are device-generic
  // composites of PyTorch's and never reach the npu's kernels.)
  static const std::set<std::pair<std::string, std::string>> cpu_side = {
      {"aten::_ctc_loss", "input_lengths"},
      {"aten::_ctc_loss", "target_lengths"},
      {"aten::_ctc_loss_backward", "input_lengths"},
      {"aten::_ctc_loss_backward", "target_lengths"},
  };
  return cpu_side.count({op.schema().name(), arg.name()}) != 0;
}

namespace {
bool isNpuTensor(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

[[noreturn]] void raiseDeviceMismatch(const c10::OperatorHandle& op, const c10::Argument& arg, c10::Device device,
                                      const at::Tensor& t, const char* why) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", device,
              " and ", t.device(), "! (", displayName(op), ", argument '", arg.name(), "'", why,
              "; move it with .to('", device, "'))");
}
}  // namespace

c10::Device deviceOfArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t begin) {
  const auto& args = op.schema().arguments();
  std::optional<c10::Device> device;
  for (size_t i = begin; i < stack.size() && !device; ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t, bool) {
      if (!device && isNpuTensor(t)) device = t.device();
    });
  }
  for (size_t i = begin; i < stack.size() && !device; ++i) {
    if (stack[i].isDevice() && stack[i].toDevice().type() == kNPU) {
      device = c10::Device(kNPU, resolveDevice(stack[i].toDevice().index()));
    }
  }
  if (!device) return c10::Device(kNPU, currentDevice());

  for (size_t i = begin; i < stack.size() && i - begin < args.size(); ++i) {
    const auto& v = stack[i];
    const auto& arg = args[i - begin];
    const bool writes = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    auto check = [&](const at::Tensor& t, bool index_list) {  // index_list: an element of a Tensor?[]
      if (!t.defined()) return;
      if (isNpuTensor(t)) {
        if (t.device() != *device) raiseDeviceMismatch(op, arg, *device, t, "");
        return;
      }
      if (t.device().is_cpu() && ((t.dim() == 0 && !writes) || index_list || isCpuSideArgument(op, arg))) return;
      raiseDeviceMismatch(op, arg, *device, t,
                          t.device().is_cpu() && t.dim() == 0
                              ? ": a cpu tensor cannot receive the result of an npu op"
                              : ": only 0-dim cpu tensors may be mixed with npu tensors");
    };
    forEachTensor(v, check);
  }
  return *device;
}

}  // namespace npu::dispatch
