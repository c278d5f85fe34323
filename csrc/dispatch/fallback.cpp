#include "fallback.h"

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <ATen/NestedTensorImpl.h>
#include <ATen/core/enum_tag.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>

#include "../core/copy.h"
#include "../core/device.h"
#include "../core/generator.h"
#include "../core/stream.h"
#include "../runtime/tracing.h"

namespace npu::dispatch {

namespace {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\n");
  return s.substr(begin, end - begin + 1);
}

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

// ---- policy ------------------------------------------------------------------

FallbackPolicy& FallbackPolicy::instance() {
  static FallbackPolicy* policy = new FallbackPolicy();
  return *policy;
}

FallbackPolicy::FallbackPolicy() = default;

void FallbackPolicy::loadEnvironment() {
  if (const char* mode = std::getenv("NPU_FALLBACK_MODE"); mode != nullptr && !trim(mode).empty()) {
    try {
      setMode(parseFallbackMode(mode));
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument("NPU_FALLBACK_MODE='" + trim(mode) +
                                  "' is not a fallback mode; use auto, warn or error (any case)");
    }
  }
  if (const char* ops = std::getenv("NPU_FALLBACK_OPS")) {
    std::stringstream list(ops);
    std::string item;
    while (std::getline(list, item, ',')) {
      item = trim(item);
      if (item.empty()) continue;
      try {
        setOpPolicy(existingOpName(item), OpPolicy::Cpu);
      } catch (const c10::Error& e) {
        throw std::invalid_argument("NPU_FALLBACK_OPS='" + std::string(ops) + "': " + e.msg() +
                                    " (a comma-separated list of operators, e.g. NPU_FALLBACK_OPS=exp,isin)");
      }
    }
  }
  if (const char* retry = std::getenv("NPU_FALLBACK_ON_ERROR"); retry != nullptr) {
    std::string r = trim(retry);
    std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
    if (r == "1" || r == "true" || r == "yes" || r == "on") {
      setRetryOnKernelError(true);
    } else if (!(r.empty() || r == "0" || r == "false" || r == "no" || r == "off")) {
      throw std::invalid_argument("NPU_FALLBACK_ON_ERROR='" + std::string(retry) +
                                  "' is not a switch; use 1 (on) or 0 (off)");
    }
  }
}

FallbackMode parseFallbackMode(const std::string& text) {
  std::string m = trim(text);
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  if (m == "auto") return FallbackMode::Auto;
  if (m == "warn") return FallbackMode::Warn;
  if (m == "error") return FallbackMode::Error;
  throw std::invalid_argument("'" + text + "' is not a fallback mode; use 'auto', 'warn' or 'error'");
}

const char* fallbackModeName(FallbackMode mode) {
  switch (mode) {
    case FallbackMode::Auto: return "auto";
    case FallbackMode::Warn: return "warn";
    case FallbackMode::Error: return "error";
  }
  return "?";
}

void FallbackPolicy::setOpPolicy(const std::string& op, OpPolicy policy) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (policy == OpPolicy::Default) policies_.erase(op);
  else policies_[op] = policy;
  has_policies_ = !policies_.empty();
}

OpPolicy FallbackPolicy::opPolicy(const std::string& op) const {
  if (!hasOpPolicies()) return OpPolicy::Default;
  std::string base = op.substr(0, op.find('.'));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = policies_.find(base);
  if (it == policies_.end() && base.size() > 1 && base.back() == '_') {
    it = policies_.find(base.substr(0, base.size() - 1));  // exp_ follows exp
  }
  return it == policies_.end() ? OpPolicy::Default : it->second;
}

std::map<std::string, OpPolicy> FallbackPolicy::opPolicies() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {policies_.begin(), policies_.end()};
}

void FallbackPolicy::clearOpPolicies() {
  std::lock_guard<std::mutex> lock(mutex_);
  policies_.clear();
  has_policies_ = false;
}

void FallbackPolicy::record(const std::string& op, FallbackReason reason, int64_t ns, int64_t to_cpu,
                            int64_t to_npu) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = stats_[op];
  s.count++;
  if (reason == FallbackReason::KernelError) s.kernel_error_retries++;
  s.nanoseconds += ns;
  s.bytes_to_cpu += to_cpu;
  s.bytes_to_npu += to_npu;
}

std::map<std::string, OpFallbackStats> FallbackPolicy::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void FallbackPolicy::resetStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.clear();
}

void FallbackPolicy::setLogger(Logger logger) {
  std::lock_guard<std::mutex> lock(mutex_);
  logger_ = std::move(logger);
}

const char* fallbackReasonName(FallbackReason reason) {
  switch (reason) {
    case FallbackReason::NoKernel: return "no_kernel";
    case FallbackReason::Dtype: return "dtype";
    case FallbackReason::Policy: return "policy";
    case FallbackReason::KernelError: return "kernel_error";
  }
  return "unknown";
}

FallbackReason parseFallbackReason(const std::string& name) {
  for (auto reason : {FallbackReason::NoKernel, FallbackReason::Dtype, FallbackReason::Policy,
                      FallbackReason::KernelError}) {
    if (name == fallbackReasonName(reason)) return reason;
  }
  throw std::invalid_argument("'" + name + "' is not a fallback reason; use no_kernel, dtype, policy or kernel_error");
}

void FallbackPolicy::log(const std::string& op, FallbackReason reason, const std::string& line) const {
  Logger logger;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    logger = logger_;
  }
  if (logger) logger(op, reason, line);
}

bool FallbackPolicy::firstWarning(const std::string& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  return warned_.emplace(op, true).second;
}

void FallbackPolicy::resetWarnings() {
  std::lock_guard<std::mutex> lock(mutex_);
  warned_.clear();
}

// ---- names -------------------------------------------------------------------

std::pair<std::string, std::string> canonicalOpName(const std::string& raw) {
  std::string name = trim(raw);
  std::string ns = "aten";
  std::string overload;
  if (startsWith(name, "torch.ops.")) {
    // torch.ops.<ns>.<op>[.<overload>]
    std::vector<std::string> parts;
    std::stringstream in(name.substr(10));
    std::string part;
    while (std::getline(in, part, '.')) parts.push_back(part);
    TORCH_CHECK(parts.size() >= 2 && !parts[0].empty() && !parts[1].empty(), "'", raw,
                "' is not an operator name; expected e.g. torch.ops.aten.exp");
    ns = parts[0];
    name = parts[1];
    if (parts.size() >= 3 && parts[2] != "default") overload = parts[2];
    return {ns + "::" + name, overload};
  }
  for (const char* prefix : {"torch.Tensor.", "torch.nn.functional.", "torch.special.", "torch.linalg.",
                             "torch.", "Tensor.", "F."}) {
    if (startsWith(name, prefix)) {
      name = name.substr(std::string(prefix).size());
      break;
    }
  }
  const auto colons = name.find("::");
  if (colons != std::string::npos) {
    ns = name.substr(0, colons);
    name = name.substr(colons + 2);
  }
  const auto dot = name.find('.');
  if (dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
    if (overload == "default") overload.clear();
  }
  TORCH_CHECK(!name.empty() && !ns.empty(), "'", raw,
              "' is not an operator name; expected e.g. 'exp', 'torch.exp' or 'aten::exp'");
  return {ns + "::" + name, overload};
}

namespace {
std::size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string existingOpName(const std::string& raw) {
  const std::string name = canonicalOpName(raw).first;
  const auto ns_end = name.find("::");
  const std::string ns = name.substr(0, ns_end + 2);
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name == name) return name;
    if (op.name.rfind(ns, 0) != 0) continue;
    const std::string short_name = op.name.substr(ns.size());
    near.emplace_back(editDistance(name.substr(ns.size()), short_name), short_name);
  }
  std::sort(near.begin(), near.end());
  near.erase(std::unique(near.begin(), near.end()), near.end());
  std::string suggestions;
  for (std::size_t i = 0; i < near.size() && i < 3; ++i) suggestions += (i ? ", " : "") + near[i].second;
  TORCH_CHECK_VALUE(false, "'", raw, "' is not an operator (no ", name, " is registered)",
                    suggestions.empty() ? std::string() : "; did you mean " + suggestions + "?");
}

std::string displayName(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// ---- the fallback ------------------------------------------------------------

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
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      at::Tensor host = copies.host(t);
      if (writes && t.defined() && t.device().type() == kNPU) written.push_back({t, host});
      v = host;
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> hosts;
      for (const at::Tensor& t : v.toTensorVector()) {
        hosts.push_back(copies.host(t));
        if (writes && t.defined() && t.device().type() == kNPU) written.push_back({t, hosts.back()});
      }
      v = c10::List<at::Tensor>(hosts);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> hosts;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector()) {
        hosts.push_back(t.has_value() ? std::optional<at::Tensor>(copies.host(*t)) : std::nullopt);
      }
      v = hosts;
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

// ---- random ops without a Generator argument ------------------------------------

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
// (1 / (1 - p)), the same computation as ATen's (tests/test_contracts.py and
// tests/test_random.py compare them on the cpu). A nested input drops out its
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

namespace {
void fallbackForMissingKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  cpuFallback(op, stack, FallbackReason::NoKernel);
}
}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallbackForMissingKernel>());
}

}  // namespace npu::dispatch
