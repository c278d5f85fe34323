#include "native_kernel.h"

#include <ATen/Config.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/full.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <optional>
#include <set>
#include <sstream>

#include "../../core/device.h"
#include "../../core/generator.h"
#include "../../core/graph.h"
#include "../../core/launch.h"
#include "../../core/profile.h"
#include "../../core/stream.h"
#include "../../runtime/tracing.h"
#include "../../dispatch/fallback.h"
#include "../../dispatch/arguments.h"
#include "../../dispatch/cpu_kernel.h"
#include "chip.h"
#include "host_execution.h"

namespace npu::ops {

using dispatch::FallbackPolicy;
using dispatch::FallbackReason;
using dispatch::OpPolicy;

DtypeSet floatingTypes() { return {kFloatingTypes[0], kFloatingTypes[1], kFloatingTypes[2]}; }
DtypeSet integralTypes() {
  return {c10::kByte, c10::kChar, c10::kShort, c10::kInt, c10::kLong, c10::kBool,
          c10::kUInt16, c10::kUInt32, c10::kUInt64};
}

std::vector<c10::ScalarType> DtypeSet::types() const {
  std::vector<c10::ScalarType> out;
  for (auto type : kFloatingTypes) {
    if (contains(type)) out.push_back(type);
  }
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (contains(type) && std::find(kFloatingTypes.begin(), kFloatingTypes.end(), type) == kFloatingTypes.end()) {
      out.push_back(type);
    }
  }
  return out;
}

std::string DtypeSet::pythonNames() const {
  const auto members = types();
  std::string out;
  for (size_t i = 0; i < members.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == members.size() ? " or " : ", ") + std::string(c10::getDtypeNames(members[i]).first);
  }
  return out;
}

std::string DtypeSet::toString() const {
  std::ostringstream out;
  for (auto type : types()) out << (out.tellp() > 0 ? ", " : "") << type;
  return out.str();
}

namespace {

const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);

bool isNpu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }

bool isGeneratorValue(const c10::IValue& v, const c10::Argument& arg) {
  return v.isGenerator() || (v.isNone() && isGeneratorArgument(arg));
}

// The kernel's draw from a generator argument, taken now (at launch): from the
// given npu generator, or for None the device's default one (so
// torch.manual_seed governs npu sampling).
at::Generator drawOf(const c10::IValue& v, c10::Device device) {
  return drawFor(v.isGenerator() ? std::optional<at::Generator>(v.toGenerator()) : std::nullopt, device.index());
}

// A meta tensor with the geometry and dtype of the CPU alias `t`.
at::Tensor metaLike(const at::Tensor& t) {
  if (!t.defined() || (t.dim() == 0 && t.unsafeGetTensorImpl()->is_wrapped_number())) {
    return t;
  }
  return at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(), std::nullopt, std::nullopt,
                                        std::nullopt);
}

// Whether the op's Meta kernel accepts the arguments' metadata (shapes,
// dtypes, broadcasting). Random ops and ops without a Meta kernel pass.
bool metadataAccepted(const c10::OperatorHandle& op, const std::vector<c10::IValue>& cpu_args) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return true;
  torch::jit::Stack meta;
  meta.reserve(cpu_args.size());
  for (const auto& v : cpu_args) {
    if (v.isGenerator()) return true;  // a random op: nothing the meta kernel could tell
    meta.push_back(dispatch::mapTensors(v, [](const at::Tensor& t, bool) { return metaLike(t); }));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const c10::Error&) {
    return false;
  }
  return true;
}

// In-place elementwise ops compute in the inputs' promoted dtype and cast the
// result into self: PyTorch refuses a cast that loses the kind (float into an
// integer tensor). Their Meta kernels do not check it, so it is checked here.
bool castsResultIntoSelf(const std::string& name) {
  static const std::set<std::string> ops = {
      "aten::add_", "aten::sub_", "aten::mul_", "aten::div_", "aten::remainder_", "aten::fmod_", "aten::pow_",
      "aten::floor_divide_", "aten::atan2_", "aten::hypot_", "aten::copysign_", "aten::lerp_", "aten::addcmul_",
      "aten::addcdiv_", "aten::xlogy_", "aten::clamp_", "aten::clamp_min_", "aten::clamp_max_", "aten::maximum_",
      "aten::minimum_", "aten::fmax_", "aten::fmin_"};
  return ops.count(name) != 0;
}

void checkResultCastsIntoSelf(const c10::OperatorHandle& op, const std::vector<c10::IValue>& cpu_args) {
  if (cpu_args.empty() || !cpu_args[0].isTensor() || !castsResultIntoSelf(op.schema().name())) return;
  at::native::ResultTypeState state = {};
  for (const auto& v : cpu_args) {
    if (v.isTensor() && v.toTensor().defined()) {
      state = at::native::update_result_type_state(v.toTensor(), state);
    } else if (v.isScalar()) {
      state = at::native::update_result_type_state(v.toScalar(), state);
    }
  }
  const auto result = at::native::result_type(state);
  const auto self = cpu_args[0].toTensor().scalar_type();
  TORCH_CHECK(c10::canCast(result, self), "result type ", result, " can't be cast to the desired output type ",
              self);
}

// The out= overload of a functional op (gelu -> gelu.out, pow.Tensor_Scalar ->
// pow.Tensor_Scalar_out): the same arguments, then one out argument per result.
std::optional<c10::OperatorHandle> findOutVariant(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (op.hasTag(at::Tag::nondeterministic_seeded) || schema.returns().empty()) return std::nullopt;
  const std::string& overload = schema.overload_name();
  for (const std::string& candidate : {overload.empty() ? std::string("out") : overload + "_out", std::string("out")}) {
    auto out = c10::Dispatcher::singleton().findSchema({schema.name(), candidate});
    if (!out) continue;
    const auto& theirs = out->schema().arguments();
    const auto& ours = schema.arguments();
    if (theirs.size() != ours.size() + schema.returns().size()) continue;
    bool same = true;
    for (size_t i = 0; i < theirs.size() && same; ++i) {
      if (i < ours.size()) {
        same = theirs[i].name() == ours[i].name() && *theirs[i].type() == *ours[i].type();
      } else {
        same = theirs[i].is_out() && theirs[i].type()->kind() == c10::TypeKind::TensorType;
      }
    }
    if (same) return out;
  }
  return std::nullopt;
}

std::optional<c10::OperatorHandle> outVariant(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static std::unordered_map<c10::OperatorName, std::optional<c10::OperatorHandle>> found;   // once per op
  std::lock_guard<std::mutex> lock(mutex);
  auto it = found.find(op.operator_name());
  if (it == found.end()) it = found.emplace(op.operator_name(), findOutVariant(op)).first;
  return it->second;
}

// Records `op` on `args` (npu tensors as aliases) into the capture of the current
// stream: each replay runs it on its own copy of the stack. A random op's draws
// (its generator arguments, or for one that draws inside, the default generator)
// are taken at replay() and handed in. `targets`: the npu outputs a functional op
// fills, for each of its returns (undefined for a returned argument).
void recordCaptured(const c10::OperatorHandle& op, std::vector<c10::IValue> args,
                    const std::vector<std::pair<size_t, c10::IValue>>& generators, c10::DispatchKeySet cpu_keys,
                    c10::Device device, std::size_t bytes, std::vector<c10::IValue> targets) {
  const char* name = op.operator_name().name.c_str();
  auto copyResults = [targets](torch::jit::Stack& work) {
    if (targets.empty()) return;
    auto copy = [](const at::Tensor& target, const at::Tensor& result) {
      if (target.defined() && result.defined() && result.data_ptr() != target.data_ptr()) target.copy_(result);
    };
    for (size_t r = 0, i = work.size() - targets.size(); r < targets.size(); ++r, ++i) {
      if (targets[r].isTensor() && work[i].isTensor()) {
        copy(targets[r].toTensor(), work[i].toTensor());
      } else if (targets[r].isTensorList() && work[i].isTensorList()) {
        const auto to = targets[r].toTensorVector();
        const auto from = work[i].toTensorVector();
        for (size_t k = 0; k < to.size() && k < from.size(); ++k) copy(to[k], from[k]);
      }
    }
  };
  std::vector<c10::IValue> sources;
  std::vector<size_t> slots;
  for (const auto& [i, g] : generators) {
    slots.push_back(i);
    sources.push_back(g);
  }
  const bool draws_inside = dispatch::isRandomWithoutGeneratorArgument(op);
  if (draws_inside) sources.emplace_back();   // the default generator's draw, for the kernel to take
  if (sources.empty()) {
    launch(device.index(), name,
           [op, args = std::move(args), cpu_keys, device, copyResults] {
             auto work = args;
             runCpuKernel(op, cpu_keys, &work, device.index());
             copyResults(work);
           },
           bytes);
    return;
  }
  graph::recordRandomKernel(
      device.index(), name, std::move(sources),
      [op, args = std::move(args), slots, draws_inside, cpu_keys, device, copyResults](
          const std::vector<at::Generator>& draws) {
        auto work = args;
        for (size_t j = 0; j < slots.size(); ++j) work[slots[j]] = draws[j];
        std::optional<PreparedDraw> inside;
        if (draws_inside) inside.emplace(draws.back());
        runCpuKernel(op, cpu_keys, &work, device.index());
        copyResults(work);
      },
      bytes);
}

// The result dtypes of `op`'s CPU kernel for inputs of these dtypes, where its Meta
// kernel gives a floating result in a dtype no input has (they may disagree:
// native_layer_norm's mean and rstd of a float16 input are float32 from Meta,
// float16 from the CPU): found once, by the CPU kernel on zeros of the inputs'
// geometry; empty when the CPU kernel refuses zeros (Meta's dtypes then stand).
std::vector<std::optional<c10::ScalarType>> cpuResultTypes(const c10::OperatorHandle& op,
                                                           const std::vector<c10::IValue>& inputs,
                                                           c10::DispatchKeySet cpu_keys) {
  std::string key = op.schema().name() + "." + op.schema().overload_name();
  for (const auto& v : inputs) {
    dispatch::forEachTensor(v, [&](const at::Tensor& t, bool) {
      key += t.defined() ? std::string(":") + c10::toString(t.scalar_type()) + "/" + std::to_string(t.dim()) : ":-";
    });
  }
  static std::mutex mutex;
  static std::unordered_map<std::string, std::vector<std::optional<c10::ScalarType>>> known;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  std::vector<std::optional<c10::ScalarType>> types;
  torch::jit::Stack probe;
  for (const auto& v : inputs) {
    if (v.isDevice() && v.toDevice().type() == kNPU) {
      probe.emplace_back(c10::Device(c10::kCPU));
      continue;
    }
    probe.push_back(dispatch::mapTensors(v, [](const at::Tensor& t, bool) {
      return t.defined() ? at::zeros(t.sizes(), t.options().device(c10::kCPU)) : t;
    }));
  }
  try {
    op.redispatchBoxed(cpu_keys, &probe);
    for (const auto& v : probe) {
      types.push_back(v.isTensor() && v.toTensor().defined() ? std::optional(v.toTensor().scalar_type()) : std::nullopt);
    }
  } catch (const std::exception&) {
    types.clear();   // the CPU kernel refuses zeros (a factorisation)
  }
  std::lock_guard<std::mutex> lock(mutex);
  known.emplace(key, types);
  return types;
}

// An op the npu runs on the host thread, launched instead as a kernel: its outputs
// are allocated now from the Meta kernel's geometry and the kernel computes it and
// copies the results into them. Under a graph capture (the host cannot run it: its
// inputs are computed only at replay; its outputs come from the graph's pool) it is
// recorded, or refused with the reason. Otherwise (while a profiler projects onto a
// chip, tracing::projecting(): kept off the host's thread) false when it cannot be
// launched so, and the caller runs it on the host. Views run now: they read no data.
bool launchHostOp(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device,
                  c10::DispatchKeySet cpu_keys, bool capturing) {
  const auto& schema = op.schema();
  const std::string& name = schema.name();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const int64_t stream = currentStream(device.index()).id();
  auto refuse = [&](const std::string& why) {
    if (capturing) graph::refuseInCapture(device.index(), stream, name, why);
    return false;
  };
  const std::vector<c10::IValue> inputs(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return refuse("the npu runs it on the host and, without a Meta kernel, the shape of its result is known only "
                  "from the data; run it before or after the capture");
  }
  if (!capturing) {   // random ops draw at the call: they stay on the host
    if (dispatch::isRandomWithoutGeneratorArgument(op)) return false;
    for (size_t i = 0; i < n; ++i) {
      if (isGeneratorValue(inputs[i], schema.arguments()[i])) return false;
    }
  }
  torch::jit::Stack meta;
  for (const auto& v : inputs) {
    meta.push_back(dispatch::mapTensors(v, [](const at::Tensor& t, bool) { return metaLike(t); }));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    return refuse("the shape of its result depends on the data (" + why + "), which a replay cannot change; run it "
                  "before or after the capture, or use an op of fixed output shape (torch.where instead of boolean "
                  "indexing)");
  }
  // Meta's dtypes, unless the CPU kernel (which the launched kernel runs) gives others.
  std::set<c10::ScalarType> input_types;
  for (const auto& v : inputs) {
    dispatch::forEachTensor(v, [&](const at::Tensor& t, bool) {
      if (t.defined()) input_types.insert(t.scalar_type());
    });
  }
  bool foreign = false;
  for (const auto& v : meta) {
    dispatch::forEachTensor(v, [&](const at::Tensor& t, bool) {
      foreign = foreign || (t.defined() && c10::isFloatingType(t.scalar_type()) && !input_types.count(t.scalar_type()));
    });
  }
  if (foreign) {
    const auto types = cpuResultTypes(op, inputs, cpu_keys);
    for (size_t r = 0; r < meta.size() && r < types.size(); ++r) {
      if (meta[r].isTensor() && types[r] && meta[r].toTensor().scalar_type() != *types[r]) {
        meta[r] = metaLike(meta[r].toTensor()).to(*types[r]);
      }
    }
  }
  // The results: an argument the op writes (in place, out=) is returned as itself
  // (it must have its result's shape already: a capture cannot resize it); a new
  // tensor is allocated now, on the capturing stream, from the graph's pool.
  std::vector<c10::IValue> results;
  std::vector<c10::IValue> targets;   // per return: the aliases the kernel's results are copied into, or None
  bool all_fresh = true;
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    const auto* alias = schema.returns()[r].alias_info();
    std::optional<size_t> argument;
    if (alias != nullptr) {
      for (size_t a = 0; a < n; ++a) {
        const auto* arg_alias = schema.arguments()[a].alias_info();
        if (arg_alias != nullptr && *arg_alias == *alias) {
          argument = a;
          break;
        }
      }
    }
    const c10::IValue& shape = meta[r];
    if (argument) {
      all_fresh = false;
      const c10::IValue& given = inputs[*argument];
      if (given.isTensor() && shape.isTensor() && given.toTensor().sizes() != shape.toTensor().sizes()) {
        return refuse("its out= tensor must be resized to the result's shape, which a captured graph cannot do; "
                      "pass an out= tensor of the result's shape");
      }
      results.push_back(given);
      targets.emplace_back();
      continue;
    }
    if (!shape.isTensor() && !shape.isTensorList()) {
      return refuse(std::string("it returns ") + shape.tagKind() +
                    ", a value the host reads from the data; run it before or after the capture");
    }
    c10::IValue fresh = dispatch::mapTensors(shape, [&](const at::Tensor& m, bool) {
      return at::empty_strided(m.sizes(), m.strides(), m.options().device(device));
    });
    results.push_back(fresh);
    targets.push_back(dispatch::mapTensors(fresh, [](const at::Tensor& t, bool) { return cpuAlias(t); }));
  }
  std::vector<c10::IValue> args;
  std::vector<std::pair<size_t, c10::IValue>> generators;   // drawn at each replay: fresh numbers every time
  std::size_t bytes = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& v = inputs[i];
    if (isGeneratorValue(v, schema.arguments()[i])) {
      generators.emplace_back(i, v);
      args.push_back(v);
      continue;
    }
    if (v.isDevice() && v.toDevice().type() == kNPU) {   // a factory's: its CPU kernel makes host memory
      args.emplace_back(c10::Device(c10::kCPU));
      continue;
    }
    args.push_back(dispatch::mapTensors(v, [&](const at::Tensor& t, bool) -> at::Tensor {
      if (!isNpu(t)) return t.defined() ? t.clone() : t;
      bytes += bytesOf(t);
      return cpuAlias(t);
    }));
  }
  for (const auto& t : targets) {
    dispatch::mapTensors(t, [&](const at::Tensor& alias, bool) {
      bytes += bytesOf(alias);
      return alias;
    });
  }
  // Its out= overload writes the results in place: no host allocation and copy per replay.
  const auto out = generators.empty() && all_fresh ? outVariant(op) : std::nullopt;
  bool single_tensors = true;
  for (const auto& t : targets) single_tensors = single_tensors && t.isTensor();
  if (out && single_tensors) {
    for (const auto& t : targets) args.push_back(t);
    recordCaptured(*out, std::move(args), {}, cpu_keys, device, bytes, {});
  } else {
    recordCaptured(op, std::move(args), generators, cpu_keys, device, bytes, std::move(targets));
  }
  torch::jit::drop(*stack, n);
  for (auto& v : results) stack->push_back(std::move(v));
  return true;
}

// Ops whose output size depends on the data (boolean indexing among them): a real
// device's host waits for the values.
bool sizeDependsOnData(const std::string& name, const torch::jit::Stack& stack, size_t begin) {
  static const std::set<std::string> ops = {
      "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
      "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::bincount", "aten::repeat_interleave"};
  if (ops.count(name) != 0) return true;
  if (name != "aten::index" || stack.size() < begin + 2 || !stack[begin + 1].isList()) return false;
  for (const auto& index : stack[begin + 1].toListRef()) {
    if (index.isTensor() && (index.toTensor().scalar_type() == c10::kBool || index.toTensor().scalar_type() == c10::kByte)) {
      return true;
    }
  }
  return false;
}

bool returnsView(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns()) {
    if (r.alias_info() != nullptr && !r.alias_info()->isWrite()) return true;
  }
  return false;
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
    // A random op without a Generator argument is given its draw by
    // dispatch::redispatchToCpu at launch: it runs on the host, never queued.
    traits_.in_place = writes && !has_out && returns_only_written_args && !traits_.is_view && !may_resize_self &&
                       !dispatch::isRandomWithoutGeneratorArgument(op);
    // The profile is fixed from the device's start, before any npu op runs.
    traits_.on_chip = profile::runsNatively(profile::active(), op);
    traits_.off_chip_decomposes = !traits_.on_chip && profile::decomposesOffChip(op);
  });
  return traits_;
}

// Integer and bool tensors pass as indices, targets and masks (nll_loss's target,
// embedding's ids); the set decides which floating and complex types compute.
bool NativeKernel::accepts(c10::ScalarType type) const {
  return dtypes_.contains(type) || c10::isIntegralType(type, /*includeBool=*/true);
}

std::optional<c10::ScalarType> NativeKernel::refusedDtype(const c10::OperatorHandle& op,
                                                          const torch::jit::Stack& stack) const {
  // Every npu operand's dtype must be supported. A cpu operand (a 0-dim tensor
  // or a wrapped Python number) of another dtype is refused only when it
  // promotes the result: x * 2.5 and x * torch.tensor(2.0, dtype=float64)
  // stay float32, x * 1j is complex, int_x + torch.tensor(1.5, dtype=float64) float64.
  bool foreign_scalar = false;
  auto refuses = [&](const at::Tensor& t) {
    if (!t.defined() || accepts(t.scalar_type())) return false;
    if (t.device().type() == kNPU) return true;
    foreign_scalar = true;
    return false;
  };
  const auto& args = op.schema().arguments();
  const size_t begin = stack.size() - args.size();
  for (size_t i = begin; i < stack.size(); ++i) {
    const auto& v = stack[i];
    std::optional<c10::ScalarType> refused;
    dispatch::forEachTensor(v, [&](const at::Tensor& t, bool) {
      if (!refused && refuses(t)) refused = t.scalar_type();
    });
    if (refused) return refused;
    if (v.isInt() && dispatch::isScalarTypeArgument(args[i - begin])) {
      const auto type = static_cast<c10::ScalarType>(v.toInt());
      if (!accepts(type)) return type;
    } else if (v.isComplexDouble()) {
      return c10::kComplexDouble;
    }
  }
  if (foreign_scalar) {
    at::native::ResultTypeState state = {};
    for (size_t i = begin; i < stack.size(); ++i) {
      dispatch::forEachTensor(stack[i], [&](const at::Tensor& t, bool) {
        if (t.defined()) state = at::native::update_result_type_state(t, state);
      });
    }
    const auto result = at::native::result_type(state);
    if (!accepts(result)) return result;
  }
  return std::nullopt;
}

std::string NativeKernel::supportedDtypes() const {
  const std::string floating = (dtypes_ & floatingTypes()).toString();
  return floating.empty() ? "the integer and bool types only" : floating + " and the integer and bool types";
}

void NativeKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                              torch::jit::Stack* stack) {
  const Traits& t = traits(op);
  auto& policy = FallbackPolicy::instance();
  const size_t begin = stack->size() - op.schema().arguments().size();
  const c10::Device device = dispatch::deviceOfArguments(op, *stack, begin);
  if (policy.hasOpPolicies() && policy.opPolicy(op.schema().name()) == OpPolicy::Cpu) {
    dispatch::cpuFallback(op, stack, FallbackReason::Policy);
    return;
  }
  if (C10_UNLIKELY(!t.on_chip)) {
    // Not in the chip's native set: PyTorch's decomposition runs on the npu
    // where there is one, as it would on the chip; else the CPU fallback.
    if (t.off_chip_decomposes) {
      const auto key = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)
                           ? c10::DispatchKey::CompositeExplicitAutograd
                           : c10::DispatchKey::CompositeExplicitAutogradNonFunctional;
      op.callBoxedForDispatchKey(key, *stack);
    } else {
      dispatch::cpuFallback(op, stack, FallbackReason::NoKernel);
    }
    return;
  }
  checkChipDtypes(op, *stack);
  const HostOpName named(op.schema().name().c_str());  // what a refusal by cpuAlias names
  std::optional<runtime::tracing::WorkHint> work;  // for the profiler: what the kernel does
  if (C10_UNLIKELY(profile::describingWork())) work.emplace(profile::workOf(op, *stack));
  if (!t.is_view) {
    if (auto refused = refusedDtype(op, *stack)) {
      const dispatch::DtypeRefusal refusal{c10::toString(*refused), supportedDtypes()};
      dispatch::cpuFallback(op, stack, FallbackReason::Dtype, &refusal);
      return;
    }
  }
  if (policy.retryOnKernelError() && !t.is_view) {
    // Run now on the host thread so an error is seen here and can be retried.
    const std::vector<c10::IValue> arguments(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
    try {
      runOnHost(op, stack, device, kCPUKeys);
    } catch (const c10::Error&) {
      stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
      stack->insert(stack->end(), arguments.begin(), arguments.end());
      dispatch::cpuFallback(op, stack, FallbackReason::KernelError);
    }
    return;
  }
  if (t.in_place) {
    runQueued(op, stack, device);
  } else {
    runOnHost(op, stack, device, kCPUKeys);
  }
}

void NativeKernel::runQueued(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  c10::DeviceGuard guard(device);

  // The kernel gets aliases of the npu tensors; cpu tensors (scalars) are the
  // caller's until the kernel is queued, when they are copied (below).
  std::vector<c10::IValue> args;
  args.reserve(n);
  std::size_t bytes = 0;
  std::vector<const c10::TensorImpl*> cpu_tensors;
  auto alias_of = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (isNpu(t)) {
      bytes += bytesOf(t);
      return cpuAlias(t);
    }
    cpu_tensors.push_back(t.unsafeGetTensorImpl());
    return t;
  };
  std::vector<std::pair<size_t, c10::IValue>> generators;   // under capture: drawn at each replay
  const bool capturing = graph::currentStreamCapturing(device.index());
  for (size_t i = begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (isGeneratorValue(v, schema.arguments()[i - begin])) {
      if (capturing) generators.emplace_back(i - begin, v);
      args.emplace_back(drawOf(v, device));
    } else {
      args.push_back(dispatch::mapTensors(v, [&](const at::Tensor& t, bool) { return alias_of(t); }));
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
  const char* name = op.operator_name().name.c_str();
  // An idle stream runs it here and now: every error raises at the call.
  auto run_now = [&] { runCpuKernel(op, kCPUKeys, &args, device.index()); };
  if (runIfIdle(device.index(), name, run_now, bytes)) return;
  if (!cpu_tensors.empty()) {
    // The closure never owns a tensor Python has seen (core/launch.h): its own copies.
    auto is_callers = [&](const at::Tensor& t) {
      return std::find(cpu_tensors.begin(), cpu_tensors.end(), t.unsafeGetTensorImpl()) != cpu_tensors.end();
    };
    for (auto& v : args) {
      v = dispatch::mapTensors(v, [&](const at::Tensor& t, bool) { return t.defined() && is_callers(t) ? t.clone() : t; });
    }
  }
  // Queued behind other work: what metadata can show must still raise here.
  checkResultCastsIntoSelf(op, args);
  if (!metadataAccepted(op, args)) {
    // The meta kernel objects (or is not exact for this op): let the real
    // kernel decide, in stream order on this thread, raising at the call.
    torch::jit::drop(*stack, schema.returns().size());
    stack->insert(stack->end(), originals.begin(), originals.end());
    runOnHost(op, stack, device, kCPUKeys);
    return;
  }
  if (C10_UNLIKELY(capturing)) {
    recordCaptured(op, std::move(args), generators, kCPUKeys, device, bytes, {});
    return;
  }
  launch(device.index(), name,
         [op, args = std::move(args), index = device.index()]() mutable {
           runCpuKernel(op, kCPUKeys, &args, index);
         },
         bytes);
}

void NativeKernel::runOnHost(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device,
                             c10::DispatchKeySet cpu_keys) {
  const auto& schema = op.schema();
  std::optional<graph::HostWorkAllowed> view_in_capture;   // a view reads no data: it runs now
  if (C10_UNLIKELY(graph::currentStreamCapturing(device.index()))) {
    if (!returnsView(schema)) {
      launchHostOp(op, stack, device, cpu_keys, /*capturing=*/true);
      return;
    }
    view_in_capture.emplace();
  } else if (C10_UNLIKELY(runtime::tracing::projecting()) && !returnsView(schema) &&
             launchHostOp(op, stack, device, cpu_keys, /*capturing=*/false)) {
    return;
  }
  if (C10_UNLIKELY(syncDebugMode() != 0) &&
      sizeDependsOnData(schema.name(), *stack, stack->size() - schema.arguments().size())) {
    checkSync(schema.name().c_str());
  }
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  HostExecution exec(device, op.operator_name().name.c_str());

  std::vector<at::Tensor> written;  // out= and in-place arguments, to sync back
  for (size_t i = begin; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    const auto& arg = schema.arguments()[i - begin];
    const bool writes = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (v.isDevice() && v.toDevice().type() == kNPU) {
      v = c10::Device(c10::kCPU);
    } else if (isGeneratorValue(v, arg)) {
      v = drawOf(v, device);
    } else {
      v = dispatch::mapTensors(v, [&](const at::Tensor& t, bool in_optional_list) {
        if (writes && !in_optional_list) written.push_back(t);
        return exec.alias(t);
      });
    }
  }

  runCpuKernel(op, cpu_keys, stack, device.index());

  for (const auto& t : written) exec.syncBack(t);
  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = dispatch::mapTensors((*stack)[i], [&](const at::Tensor& t, bool) { return exec.toNpu(t); });
  }
}

const std::vector<std::string>& settleVectorMathDispatch() {
  // The unary ops whose float and double CPU kernels call MKL's vector math: those of
  // ATen/cpu/vml.h (IMPLEMENT_VML_MKL; a test checks the list against that header) and
  // logit, whose kernel calls MKL's vsLn/vdLn itself.
  static const std::vector<std::string> settled = [] {
    std::vector<std::string> names;
#if AT_MKL_ENABLED()
    static constexpr const char* kVectorMathOps[] = {"acos", "asin", "atan", "cos",   "erf",  "erfc",
                                                     "erfinv", "exp", "log", "log10", "log2", "sin",
                                                     "sqrt", "tan", "tanh", "trunc", "logit"};
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (const char* name : kVectorMathOps) {
      const auto op = c10::Dispatcher::singleton().findSchemaOrThrow((std::string("aten::") + name).c_str(), "");
      const auto& arguments = op.schema().arguments();
      for (const auto dtype : {c10::kFloat, c10::kDouble}) {
        torch::jit::Stack stack{at::full({1}, 0.5, at::TensorOptions().dtype(dtype))};  // one element: this thread
        for (std::size_t i = 1; i < arguments.size(); ++i) stack.push_back(*arguments[i].default_value());
        op.callBoxed(&stack);
      }
      names.emplace_back(std::string("aten::") + name);
    }
#endif
    return names;
  }();
  return settled;
}

// ---- the npu library's own ops in graph captures ----------------------------------------

namespace {
// The fused ops (npu::, ops/fused/) compute on the host, holding the stream: under a
// capture they are recorded instead, as an aten op the npu runs on the host is
// (launchHostOp: outputs from the Meta kernel, the CPU kernel at each replay on aliases
// of the npu memory). Registered at BackendSelect, the one key every dispatch passes
// (inference tensors included) just above the backends; elsewhere it hands the op on.
void fusedOpInCapture(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (C10_UNLIKELY(graph::anyCapture())) {
    const size_t n = op.schema().arguments().size();
    std::optional<c10::Device> device;
    for (size_t i = stack->size() - n; i < stack->size() && !device; ++i) {
      dispatch::forEachTensor((*stack)[i], [&](const at::Tensor& t, bool) {
        if (!device && t.defined() && t.device().type() == kNPU) device = t.device();
      });
    }
    if (device && graph::currentStreamCapturing(device->index())) {
      NativeKernel::runOnHost(op, stack, *device, c10::DispatchKeySet(c10::DispatchKey::CPU));
      return;
    }
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                     stack);
}
}  // namespace

void makeFusedOpsCapturable() {
  static torch::Library* library = nullptr;
  if (library != nullptr) return;
  library = new torch::Library(torch::Library::IMPL, "npu", c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("npu::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    // The fused families' ops: the same kernel for npu and cpu tensors, and a Meta kernel.
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) || !op->hasKernelForDispatchKey(c10::DispatchKey::Meta) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect) || returnsView(op->schema())) {
      continue;
    }
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    library->impl(qualified.substr(5).c_str(), torch::CppFunction::makeFromBoxedFunction<&fusedOpInCapture>());
  }
}

}  // namespace npu::ops
