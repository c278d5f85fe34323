#include "fallback.h"

#include "../core/profile.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "../core/copy.h"
#include "../core/device.h"
#include "../core/generator.h"
#include "../core/stream.h"
#include "../runtime/tracing.h"
#include "arguments.h"
#include "cpu_kernel.h"
#include "op_names.h"

namespace npu::dispatch {

namespace {

bool startsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "aten::exp" -> "npu_exp", the name users of NPU adapters grep logs for.
std::string kernelName(const std::string& base) {
  const auto pos = base.find("::");
  return "npu_" + (pos == std::string::npos ? base : base.substr(pos + 2));
}

std::string describeTensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream out;
  out << "Tensor[" << t.scalar_type() << ", " << t.device() << ", " << t.sizes() << "]";
  return out.str();
}

// "self: Tensor[Double, npu:0, [3]], other: Tensor[...]" and the dtypes the op
// computes in: its tensors' (not a wrapped Python number's) and a dtype= argument.
std::string describeArguments(const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                              std::vector<std::string>* dtypes) {
  const auto& args = schema.arguments();
  const size_t begin = stack.size() - args.size();
  std::ostringstream out;
  bool first = true;
  auto note = [&](const std::string& name) {
    if (std::find(dtypes->begin(), dtypes->end(), name) == dtypes->end()) dtypes->push_back(name);
  };
  auto note_dtype = [&](const at::Tensor& t) {
    if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
    note(c10::toString(t.scalar_type()));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& v = stack[begin + i];
    std::string text;
    if (v.isTensor()) {
      text = describeTensor(v.toTensor());
      note_dtype(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorVector();
      text = "[" + std::to_string(list.size()) + " tensors" +
             (list.empty() ? std::string() : ", first " + describeTensor(list[0])) + "]";
      for (const auto& t : list) note_dtype(t);
    } else if (v.isInt() && isScalarTypeArgument(args[i])) {
      text = c10::toString(static_cast<c10::ScalarType>(v.toInt()));
      note(text);
    } else if (v.isScalar() || v.isDevice() || v.isInt() || v.isDouble() || v.isBool()) {
      std::ostringstream s;
      s << v;
      text = s.str();
    } else {
      continue;
    }
    out << (first ? "" : ", ") << args[i].name() << ": " << text;
    first = false;
  }
  return out.str();
}

[[noreturn]] void raiseNotSupported(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                    FallbackReason reason, OpPolicy policy, const DtypeRefusal* refusal) {
  const auto& schema = op.schema();
  std::vector<std::string> dtypes;
  const std::string inputs = describeArguments(schema, stack, &dtypes);
  std::string dtype_list;
  if (refusal != nullptr) {
    dtype_list = refusal->refused;  // the dtype that made it fall back
  } else {
    for (const auto& d : dtypes) dtype_list += (dtype_list.empty() ? "" : ", ") + d;
  }
  const std::string base = schema.name();
  std::ostringstream why;
  if (reason == FallbackReason::Dtype) {
    why << "the npu kernel does not support dtype " << dtype_list;
    if (refusal != nullptr) why << "; it supports " << refusal->supported;
    if (startsWith(base, "aten::")) {
      why << " (the npu has no float64 kernels, and complex ones only for torch.fft; cast with .float() to stay on "
             "the npu)";
    }
  } else if (const auto& chip = profile::active(); !profile::runsNatively(chip, op)) {
    why << chip.device_name << " (device profile '" << chip.name << "') has no native kernel for it, as the "
        << "real chip has none (torch_npu._ops_registry.get(op) answers per chip)";
  } else {
    why << "no npu kernel is registered for it";
  }
  std::ostringstream remedy;
  if (policy == OpPolicy::Npu) {
    remedy << "The op policy for '" << base << "' is 'npu' (fallback forbidden). Allow the CPU fallback with "
           << "NPUFallbackMode.set_op_fallback('" << base << "', 'cpu') or remove the policy with "
           << "set_op_fallback('" << base << "', 'default').";
  } else {
    remedy << "The fallback mode is '" << fallbackModeName(FallbackPolicy::instance().mode())
           << "'. To run it on the CPU instead: torch_npu.set_fallback_mode('auto') (or 'warn'), the "
           << "environment variable NPU_FALLBACK_MODE=auto, or for this op only "
           << "NPUFallbackMode.set_op_fallback('" << base << "', 'cpu').";
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "Operator '", displayName(op), "' is not yet supported on npu",
                              dtype_list.empty() ? std::string() : " (dtype " + dtype_list + ")", ": ", why.str(),
                              ". Inputs: ", inputs.empty() ? std::string("none") : inputs, ". ", remedy.str());
}

// Host copies of an op's npu arguments. Arguments that share npu memory (a
// tensor and its view: a.add_(a[0])) get views of one host copy of that
// memory, so the CPU kernel sees the same overlap (and raises the same
// internal-overlap error) as it would on cpu tensors.
class HostCopies {
 public:
  explicit HostCopies(int64_t* bytes) : bytes_(bytes) {}

  // Call for every tensor first, then host() for each.
  void note(const at::Tensor& t) {
    if (!isNpu(t) || t.numel() == 0) return;
    auto& span = spans_[storageOf(t)];
    const auto [first, last] = byteRange(t);
    span.first = std::min(span.first, first);
    span.last = std::max(span.last, last);
    span.users++;
  }

  at::Tensor host(const at::Tensor& t) {
    if (!isNpu(t)) return t;
    auto it = t.numel() == 0 ? spans_.end() : spans_.find(storageOf(t));
    const int64_t item = static_cast<int64_t>(t.itemsize());
    if (it == spans_.end() || it->second.users < 2 || (byteRange(t).first - it->second.first) % item != 0) {
      *bytes_ += static_cast<int64_t>(t.numel()) * item;
      return t.cpu();
    }
    Span& span = it->second;
    if (!span.host.defined()) {
      // The shared bytes, as one uint8 tensor over the npu storage, copied once.
      at::Tensor bytes_view = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(t.storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<uint8_t>());
      const int64_t size = span.last - span.first;
      const int64_t stride = 1;
      bytes_view.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(&size, 1), c10::IntArrayRef(&stride, 1),
                                                              span.first);
      span.host = bytes_view.cpu();
      *bytes_ += span.last - span.first;
    }
    at::Tensor view = at::empty({0}, t.options().device(c10::kCPU));
    view.set_(span.host.storage(), (byteRange(t).first - span.first) / item, t.sizes(), t.strides());
    view.unsafeGetTensorImpl()->_set_conj(t.is_conj());  // z * z.conj() shares memory, lazily conjugated
    view.unsafeGetTensorImpl()->_set_neg(t.is_neg());
    return view;
  }

 private:
  struct Span {
    int64_t first = std::numeric_limits<int64_t>::max();
    int64_t last = 0;
    int users = 0;
    at::Tensor host;
  };
  static bool isNpu(const at::Tensor& t) { return t.defined() && t.device().type() == kNPU; }
  static const c10::StorageImpl* storageOf(const at::Tensor& t) {
    return t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  }
  // [first, last) bytes of the storage the (non-empty) tensor touches.
  static std::pair<int64_t, int64_t> byteRange(const at::Tensor& t) {
    int64_t low = t.storage_offset();
    int64_t high = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? low : high) += reach;
    }
    const int64_t item = static_cast<int64_t>(t.itemsize());
    return {low * item, (high + 1) * item};
  }
  int64_t* bytes_;
  std::unordered_map<const c10::StorageImpl*, Span> spans_;
};

// Arguments some ops write without saying so in their schema: native_batch_norm
// updates running_mean/running_var in training.
bool writesUnannotated(const std::string& op, const c10::Argument& arg) {
  return op == "aten::native_batch_norm" && (arg.name() == "running_mean" || arg.name() == "running_var");
}

template <typename T>
bool sameAlias(const T* a, const T* b) {
  return a != nullptr && b != nullptr && (a == b || *a == *b);
}

}  // namespace

void checkFallbackAllowed(const c10::OperatorHandle& op, const torch::jit::Stack& stack, FallbackReason reason,
                          const DtypeRefusal* refusal, bool announce) {
  auto& policy = FallbackPolicy::instance();
  const auto& schema = op.schema();
  const std::string& base = schema.name();
  const OpPolicy op_policy = policy.opPolicy(base);
  const bool allowed = op_policy == OpPolicy::Cpu || reason == FallbackReason::KernelError ||
                       (op_policy != OpPolicy::Npu && policy.mode() != FallbackMode::Error);
  if (!allowed) raiseNotSupported(op, stack, reason, op_policy, refusal);

  for (const auto& ret : schema.returns()) {
    TORCH_CHECK(ret.alias_info() == nullptr || ret.alias_info()->isWrite(), "Operator '", displayName(op),
                "' is a view op: it cannot run through the CPU fallback, because a view shares its input's "
                "storage and that cannot cross devices. Call .cpu() on its input first, or remove the op's "
                "'cpu' policy (NPUFallbackMode.set_op_fallback(op, 'default')).");
  }
  if (!announce) return;
  if (policy.mode() == FallbackMode::Warn && policy.firstWarning(base)) {
    TORCH_WARN("Operator '", displayName(op), "' is not supported on npu",
               reason == FallbackReason::Dtype ? " for these dtypes" : "", " and runs on the CPU (a slow round trip; "
               "see torch_npu.NPUFallbackMode.get_fallback_stats()). This warning is shown once per op.");
  }
  const char* why = "";
  switch (reason) {
    case FallbackReason::NoKernel: why = " not registered, fallback to CPU"; break;
    case FallbackReason::Dtype: why = " does not support these dtypes, fallback to CPU"; break;
    case FallbackReason::Policy: why = " forced to CPU by op policy, fallback to CPU"; break;
    case FallbackReason::KernelError: why = " raised an error, retrying on CPU"; break;
  }
  policy.log(displayName(op), reason, kernelName(base) + why);
}

void cpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, FallbackReason reason,
                 const DtypeRefusal* refusal) {
  auto& policy = FallbackPolicy::instance();
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t begin = stack->size() - args.size();
  // Devices first: a mismatch is the caller's error whatever the mode.
  const c10::Device target = deviceOfArguments(op, *stack, begin);
  checkFallbackAllowed(op, *stack, reason, refusal);

  const auto start = std::chrono::steady_clock::now();
  int64_t to_cpu = 0;
  int64_t to_npu = 0;
  c10::DeviceGuard device_guard(target);
  // The whole round trip is one step of the stream: no kernel of another
  // thread runs between reading the inputs and writing the results.
  StreamHold hold(target.index(), displayName(op).c_str());
  // In the profiler: a host scope around the round trip, and a fallback
  // activity on the stream it held, with the bytes copied both ways.
  RECORD_USER_SCOPE("npu::cpu_fallback");
  runtime::tracing::Scope traced(runtime::tracing::ActivityKind::Fallback, op.operator_name().name.c_str(),
                                 target.index(), currentStream(target.index()).id());

  HostCopies copies(&to_cpu);
  for (size_t i = begin; i < stack->size(); ++i) {
    forEachTensor((*stack)[i], [&](const at::Tensor& t, bool) { copies.note(t); });
  }

  // Inputs to the host; remember those the op writes to (in-place, out=).
  struct Written {
    at::Tensor npu_tensor;
    at::Tensor host_tensor;
  };
  std::vector<Written> written;
  std::vector<c10::IValue> originals(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[begin + i];
    const bool writes = (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) ||
                        writesUnannotated(schema.name(), args[i]);
    originals[i] = v;
    if (v.isTensor() || v.isTensorList() || v.isOptionalTensorList()) {
      v = mapTensors(v, [&](const at::Tensor& t, bool in_optional_list) {
        at::Tensor host = copies.host(t);
        if (writes && !in_optional_list && t.defined() && t.device().type() == kNPU) written.push_back({t, host});
        return host;
      });
    } else if (v.isDevice() && v.toDevice().type() == kNPU) {
      v = c10::Device(c10::kCPU);
    } else if (v.isGenerator() && v.toGenerator().device().type() == kNPU) {
      v = drawFor(v.toGenerator(), v.toGenerator().device().index());
    } else if (v.isNone() && isGeneratorArgument(args[i])) {
      v = drawFor(std::nullopt, target.index());  // the npu's default generator, not the cpu's
    }
  }

  redispatchToCpu(op, c10::DispatchKeySet(c10::DispatchKey::CPU), stack, target.index());

  for (auto& w : written) {
    if (w.npu_tensor.sizes() != w.host_tensor.sizes()) w.npu_tensor.resize_(w.host_tensor.sizes());
    copyTensor(w.npu_tensor, w.host_tensor, false);
    to_npu += static_cast<int64_t>(w.host_tensor.numel() * w.host_tensor.itemsize());
  }

  // Outputs: a written argument goes back as the original npu tensor; anything
  // new moves to the npu device of the inputs.
  const auto& returns = schema.returns();
  const size_t returns_begin = stack->size() - returns.size();
  auto to_device = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() == kNPU) return t;
    to_npu += static_cast<int64_t>(t.numel() * t.itemsize());
    return t.to(target);
  };
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& v = (*stack)[returns_begin + r];
    const auto* alias = returns[r].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i) {
        if (sameAlias(alias, args[i].alias_info())) {
          v = originals[i];
          break;
        }
      }
    } else if (v.isTensor()) {
      v = to_device(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> moved;
      for (const at::Tensor& t : v.toTensorVector()) moved.push_back(to_device(t));
      v = c10::List<at::Tensor>(moved);
    }
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  policy.record(displayName(op), reason, ns, to_cpu, to_npu);
  traced.setBytes(static_cast<std::size_t>(to_cpu + to_npu));
}

namespace {
void fallbackForMissingKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  cpuFallback(op, stack, FallbackReason::NoKernel);
}
}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallbackForMissingKernel>());
}

}  // namespace npu::dispatch
