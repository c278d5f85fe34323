#include "native_kernel.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include <sstream>

#include "../core/device.h"
#include "../core/generator.h"
#include "../core/launch.h"
#include "../dispatch/fallback.h"
#include "host_execution.h"

namespace npu::ops {

using dispatch::FallbackPolicy;
using dispatch::FallbackReason;
using dispatch::OpPolicy;

DtypeSet floatingTypes() { return {c10::kFloat, c10::kHalf, c10::kBFloat16}; }
DtypeSet integralTypes() {
  return {c10::kByte, c10::kChar, c10::kShort, c10::kInt, c10::kLong, c10::kBool,
          c10::kUInt16, c10::kUInt32, c10::kUInt64};
}

std::string DtypeSet::toString() const {
  std::ostringstream out;
  bool first = true;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    if (bits_ & (uint64_t(1) << i)) {
      out << (first ? "" : ", ") << static_cast<c10::ScalarType>(i);
      first = false;
    }
  }
  return out.str();
}

namespace {

const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);

bool isNpu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

// The npu device an op runs on: its first npu tensor, else its device argument.
c10::Device deviceOf(const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = begin; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor() && isNpu(v.toTensor())) return v.toTensor().device();
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (isNpu(t)) return t.device();
      }
    }
    if (v.isOptionalTensorList()) {
      for (const auto& t : v.toOptionalTensorVector()) {
        if (t.has_value() && isNpu(*t)) return t->device();
      }
    }
  }
  for (size_t i = begin; i < stack.size(); ++i) {
    if (stack[i].isDevice() && stack[i].toDevice().type() == kNPU) {
      return c10::Device(kNPU, resolveDevice(stack[i].toDevice().index()));
    }
  }
  return c10::Device(kNPU, currentDevice());
}

void checkSameDevice(const at::Tensor& t, c10::Device device) {
  TORCH_CHECK(!isNpu(t) || t.device() == device, "Expected all tensors to be on the same device, but found at ",
              "least two devices, ", device, " and ", t.device(), "! Move them with .to('", device, "') first.");
}

// As on CUDA, only 0-dim cpu tensors (wrapped scalars) may be mixed with npu
// tensors (indices, a Tensor?[] argument, may also live on the cpu).
void checkNotHost(const c10::OperatorHandle& op, const c10::Argument& arg, const at::Tensor& t, c10::Device device) {
  TORCH_CHECK(!t.defined() || isNpu(t) || t.dim() == 0, "Expected all tensors to be on the same device, but found at ",
              "least two devices, ", device, " and ", t.device(), "! (", dispatch::displayName(op), ", argument '",
              arg.name(), "': only 0-dim cpu tensors may be mixed with npu tensors; move it with .to('", device,
              "'))");
}

bool isGeneratorArgument(const c10::Argument& arg) {
  return arg.type()->kind() == c10::TypeKind::OptionalType &&
         arg.type()->containedType(0)->kind() == c10::TypeKind::GeneratorType;
}

// The npu engine for a generator argument: the given npu generator's, or for
// None the device's default one (so torch.manual_seed governs npu sampling).
bool isGeneratorValue(const c10::IValue& v, const c10::Argument& arg) {
  return v.isGenerator() || (v.isNone() && isGeneratorArgument(arg));
}

at::Generator engineOf(const c10::IValue& v, c10::Device device) {
  return engineFor(v.isGenerator() ? std::optional<at::Generator>(v.toGenerator()) : std::nullopt, device.index());
}

// A ScalarType? argument (dtype=) arrives as an int; its real type says so.
bool isScalarTypeArgument(const c10::Argument& arg) {
  const auto& type = arg.real_type();
  return type->kind() == c10::TypeKind::ScalarTypeType ||
         (type->kind() == c10::TypeKind::OptionalType &&
          type->containedType(0)->kind() == c10::TypeKind::ScalarTypeType);
}

}  // namespace

const NativeKernel::Traits& NativeKernel::traits(const c10::OperatorHandle& op) {
  std::call_once(analysed_, [&] {
    const auto& schema = op.schema();
    bool returns_only_written_args = true;
    for (const auto& ret : schema.returns()) {
      const auto* alias = ret.alias_info();
      if (alias != nullptr && !alias->isWrite()) traits_.is_view = true;
      if (alias == nullptr || !alias->isWrite()) returns_only_written_args = false;
    }
    bool has_out = false;
    bool writes = false;
    for (const auto& arg : schema.arguments()) {
      if (arg.is_out()) has_out = true;
      if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) writes = true;
    }
    // addbmm_ may resize self (it is addbmm.out with self as out): a queued kernel
    // cannot, the host path can (HostExecution::syncBack).
    const bool may_resize_self = schema.name() == "aten::addbmm_";
    traits_.in_place = writes && !has_out && returns_only_written_args && !traits_.is_view && !may_resize_self;
  });
  return traits_;
}

// Integer and bool tensors pass as indices, targets and masks (nll_loss's target,
// embedding's ids); the set decides which floating and complex types compute.
bool NativeKernel::accepts(c10::ScalarType type) const {
  return dtypes_.contains(type) || c10::isIntegralType(type, /*includeBool=*/true);
}

bool NativeKernel::supportsDtypes(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const {
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  for (size_t i = begin; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      if (isNpu(t) && !accepts(t.scalar_type())) return false;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (isNpu(t) && !accepts(t.scalar_type())) return false;
      }
    } else if (v.isOptionalTensorList()) {
      for (const auto& t : v.toOptionalTensorVector()) {
        if (t.has_value() && isNpu(*t) && !accepts(t->scalar_type())) return false;
      }
    } else if (v.isInt() && isScalarTypeArgument(args[i - begin])) {
      if (!accepts(static_cast<c10::ScalarType>(v.toInt()))) return false;
    } else if (v.isComplexDouble()) {
      return false;
    }
  }
  return true;
}

void NativeKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                              torch::jit::Stack* stack) {
  const Traits& t = traits(op);
  auto& policy = FallbackPolicy::instance();
  if (policy.hasOpPolicies() && policy.opPolicy(op.schema().name()) == OpPolicy::Cpu) {
    dispatch::cpuFallback(op, stack, FallbackReason::Policy);
    return;
  }
  if (!t.is_view && !supportsDtypes(op, *stack)) {
    dispatch::cpuFallback(op, stack, FallbackReason::Dtype);
    return;
  }
  if (policy.retryOnKernelError() && !t.is_view) {
    // Run now on the host thread so an error is seen here and can be retried.
    const size_t begin = stack->size() - op.schema().arguments().size();
    const std::vector<c10::IValue> arguments(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
    try {
      runOnHost(op, stack);
    } catch (const c10::Error&) {
      stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      stack->insert(stack->end(), arguments.begin(), arguments.end());
      dispatch::cpuFallback(op, stack, FallbackReason::KernelError);
    }
    return;
  }
  if (t.in_place) {
    runQueued(op, stack);
  } else {
    runOnHost(op, stack);
  }
}

void NativeKernel::runQueued(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const c10::Device device = deviceOf(*stack, begin);
  c10::DeviceGuard guard(device);

  // The closure gets aliases only (no tensor Python has seen, see core/launch.h).
  std::vector<c10::IValue> args;
  args.reserve(n);
  std::size_t bytes = 0;
  auto alias_of = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (isNpu(t)) {
      checkSameDevice(t, device);
      bytes += bytesOf(t);
      return cpuAlias(t);
    }
    // a cpu tensor (a scalar): the closure needs its own copy
    return t.clone();
  };
  for (size_t i = begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    const auto& arg = schema.arguments()[i - begin];
    if (v.isTensor()) {
      checkNotHost(op, arg, v.toTensor(), device);
      args.emplace_back(alias_of(v.toTensor()));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      list.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorVector()) {
        checkNotHost(op, arg, t, device);
        list.push_back(alias_of(t));
      }
      args.emplace_back(std::move(list));
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& t : v.toOptionalTensorVector()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>(alias_of(*t)) : std::nullopt);
      }
      args.emplace_back(std::move(list));
    } else if (isGeneratorValue(v, arg)) {
      args.emplace_back(engineOf(v, device));
    } else {
      args.push_back(v);
    }
  }

  // The results are the written arguments themselves.
  std::vector<c10::IValue> originals(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  torch::jit::drop(*stack, n);
  for (const auto& ret : schema.returns()) {
    for (size_t i = 0; i < n; ++i) {
      const auto* a = schema.arguments()[i].alias_info();
      if (a != nullptr && ret.alias_info() != nullptr && *a == *ret.alias_info()) {
        stack->push_back(originals[i]);
        break;
      }
    }
  }
  launch(device.index(), op.operator_name().name.c_str(),
         [op, args = std::move(args)]() mutable { op.redispatchBoxed(kCPUKeys, &args); }, bytes);
}

void NativeKernel::runOnHost(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  HostExecution exec(deviceOf(*stack, begin));
  const c10::Device device = exec.device();

  std::vector<at::Tensor> written;  // out= and in-place arguments, to sync back
  for (size_t i = begin; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    const auto& arg = schema.arguments()[i - begin];
    const bool writes = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      checkNotHost(op, arg, t, device);
      if (writes) written.push_back(t);
      v = exec.alias(t);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) {
        checkNotHost(op, arg, t, device);
        if (writes) written.push_back(t);
        list.push_back(exec.alias(t));
      }
      v = std::move(list);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& t : v.toOptionalTensorVector()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>(exec.alias(*t)) : std::nullopt);
      }
      v = std::move(list);
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      v = c10::Device(c10::kCPU);
    } else if (isGeneratorValue(v, arg)) {
      v = engineOf(v, device);
    }
  }

  op.redispatchBoxed(kCPUKeys, stack);

  for (const auto& t : written) exec.syncBack(t);
  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = exec.toNpu(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(exec.toNpu(t));
      v = std::move(list);
    }
  }
}

}  // namespace npu::ops
