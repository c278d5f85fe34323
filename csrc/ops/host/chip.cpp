#include "chip.h"

#include <ATen/ATen.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../core/device.h"
#include "../../core/profile.h"
#include "../../dispatch/arguments.h"
#include "../../dispatch/cpu_kernel.h"
#include "../../dispatch/op_names.h"

namespace npu::ops {
namespace {

bool isLowPrecision(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

bool writes(const c10::Argument& arg) { return arg.alias_info() != nullptr && arg.alias_info()->isWrite(); }

// The one 16-bit floating dtype of every floating tensor argument, if they all
// share it (mixed dtypes are left to ATen, which raises its own error).
std::optional<c10::ScalarType> commonLowPrecision(const torch::jit::Stack& stack, size_t begin) {
  std::optional<c10::ScalarType> found;
  bool mixed = false;
  for (size_t i = begin; i < stack.size(); ++i) {
    dispatch::forEachTensor(stack[i], [&](const at::Tensor& t, bool) {
      if (!t.defined() || !c10::isFloatingType(t.scalar_type())) return;
      if (!found) found = t.scalar_type();
      else if (*found != t.scalar_type()) mixed = true;
    });
  }
  if (mixed || !found || !isLowPrecision(*found)) return std::nullopt;
  return found;
}

// mm(a, b) on 16-bit operands: the operands widened to float32, the float32
// kernel, the result rounded once into the 16-bit outputs.
bool runOnCube(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  const auto low = commonLowPrecision(*stack, begin);
  if (!low) return false;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (16-bit argument, its float32 stand-in)
  for (size_t i = begin; i < stack->size(); ++i) {
    if (!(*stack)[i].isTensor()) continue;
    const at::Tensor t = (*stack)[i].toTensor();
    if (!t.defined() || !c10::isFloatingType(t.scalar_type())) continue;
    at::Tensor wide = t.to(c10::kFloat);
    if (writes(args[i - begin])) written.emplace_back(t, wide);
    (*stack)[i] = wide;
  }
  op.redispatchBoxed(cpu_keys, stack);
  for (auto& [narrow, wide] : written) {
    if (!narrow.sizes().equals(wide.sizes())) narrow.resize_(wide.sizes());
    narrow.copy_(wide);
  }
  const size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    if (!(*stack)[i].isTensor()) continue;
    const at::Tensor result = (*stack)[i].toTensor();
    bool stand_in = false;
    for (auto& [narrow, wide] : written) {
      if (result.is_same(wide)) {
        (*stack)[i] = narrow;
        stand_in = true;
        break;
      }
    }
    if (!stand_in && result.defined() && result.scalar_type() == c10::kFloat) (*stack)[i] = result.to(*low);
  }
  return true;
}

bool isHalf(const at::Tensor& t) { return t.defined() && t.scalar_type() == c10::kHalf; }

void saturate(const at::Tensor& t, const at::Tensor& finite_before = at::Tensor()) {
  profile::saturateHalf(t, finite_before);
}

bool isUnscaleOp(const c10::OperatorHandle& op) {
  return op.operator_name().name == "aten::_amp_foreach_non_finite_check_and_unscale_";
}

}  // namespace

bool isCubeOp(const c10::OperatorHandle& op) {
  // Asked for every kernel: a name whose last letter (before an in-place "_")
  // no matrix op ends with leaves at once.
  const std::string& name = op.operator_name().name;
  const size_t end = name.size() - (!name.empty() && name.back() == '_' ? 1 : 0);
  if (end < 3 || std::string_view("mvtn").find(name[end - 1]) == std::string_view::npos) return false;
  static const std::set<std::string> ops = {
      "aten::mm",     "aten::bmm",     "aten::addmm", "aten::addmm_", "aten::baddbmm", "aten::baddbmm_",
      "aten::addbmm", "aten::addbmm_", "aten::mv",    "aten::addmv",  "aten::addmv_",  "aten::dot",
      "aten::vdot",   "aten::_addmm_activation"};
  return ops.count(name) != 0;
}

void saturateIfChipDoes(const at::Tensor& t) {
  if (isHalf(t) && !profile::active().inf_nan) saturate(t);
}

void runCpuKernel(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack,
                  c10::DeviceIndex device) {
  const auto& schema = op.schema();
  const bool saturates = !profile::active().inf_nan;
  // Float16 arguments the kernel writes (in place, out=), with the elements
  // that were inf before it: only what the kernel makes inf saturates.
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  const size_t begin = stack->size() - schema.arguments().size();
  if (saturates) {
    for (size_t i = begin; i < stack->size(); ++i) {
      if (!writes(schema.arguments()[i - begin])) continue;
      dispatch::forEachTensor((*stack)[i], [&](const at::Tensor& t, bool) {
        if (isHalf(t)) written.emplace_back(t, t.isinf().logical_not_());
      });
    }
  }
  // GradScaler's check: the chip reports saturated overflow through its flag.
  at::Tensor found_inf;
  if (saturates && isUnscaleOp(op) && (*stack)[begin + 1].isTensor()) found_inf = (*stack)[begin + 1].toTensor();
  if (!(isCubeOp(op) && runOnCube(op, cpu_keys, stack))) dispatch::redispatchToCpu(op, cpu_keys, stack, device);
  if (!saturates) return;
  for (const auto& [t, finite_before] : written) saturate(t, finite_before);
  const size_t returns = schema.returns().size();
  for (size_t i = 0; i < returns; ++i) {
    const auto* alias = schema.returns()[i].alias_info();
    if (alias != nullptr) continue;  // a view of, or the same as, an argument: already handled
    dispatch::forEachTensor((*stack)[stack->size() - returns + i], [&](const at::Tensor& t, bool) {
      if (isHalf(t)) saturate(t);
    });
  }
  if (found_inf.defined() && profile::takeOverflowFlag()) found_inf.fill_(1.0);
}

void checkChipDtype(c10::ScalarType type, const char* what) {
  const auto& chip = profile::active();
  TORCH_CHECK_TYPE(type != c10::kBFloat16 || chip.bfloat16, what, " on npu: bfloat16 is not supported by ",
                   chip.device_name, " (device profile '", chip.name, "'): the chip has no bfloat16 units ",
                   "(torch.npu.is_bf16_supported() is False). Use float16, or a profile of a chip with bfloat16 ",
                   "(torch_npu.npu.list_profiles()).");
}

void checkChipDtypes(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (profile::active().bfloat16) return;
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  const std::string name = dispatch::displayName(op);
  for (size_t i = begin; i < stack.size(); ++i) {
    dispatch::forEachTensor(stack[i], [&](const at::Tensor& t, bool) {
      if (t.defined() && t.device().type() == kNPU) checkChipDtype(t.scalar_type(), name.c_str());
    });
    if (stack[i].isInt() && dispatch::isScalarTypeArgument(args[i - begin])) {
      checkChipDtype(static_cast<c10::ScalarType>(stack[i].toInt()), name.c_str());
    }
  }
}

}  // namespace npu::ops
