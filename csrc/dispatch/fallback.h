// The CPU fallback you control: every aten op without a native npu kernel (or
// with one that does not support the inputs' dtypes, or that a policy sends to
// the cpu) runs here: synchronise, copy inputs to the host, run the CPU kernel,
// copy results back, count it. The mode, per-op policies and statistics live
// here; torch_npu's Python only exposes them.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace npu::dispatch {

enum class FallbackMode { Auto, Warn, Error };
// Per op: Default follows the mode; Cpu forces the CPU path even when a native
// kernel exists; Npu forbids the fallback (error when there is no native kernel).
enum class OpPolicy { Default, Cpu, Npu };

// Why an op takes the fallback path.
enum class FallbackReason { NoKernel, Dtype, Policy, KernelError };
// "no_kernel", "dtype", "policy", "kernel_error": the names Python sees.
const char* fallbackReasonName(FallbackReason reason);

struct OpFallbackStats {
  int64_t count = 0;
  int64_t kernel_error_retries = 0;  // of count: native kernel raised, retried on cpu
  int64_t nanoseconds = 0;
  int64_t bytes_to_cpu = 0;
  int64_t bytes_to_npu = 0;
};

class FallbackPolicy {
 public:
  static FallbackPolicy& instance();

  FallbackMode mode() const { return mode_.load(std::memory_order_relaxed); }
  void setMode(FallbackMode mode) { mode_.store(mode, std::memory_order_relaxed); }
  bool retryOnKernelError() const { return retry_on_error_.load(std::memory_order_relaxed); }
  void setRetryOnKernelError(bool on) { retry_on_error_.store(on, std::memory_order_relaxed); }

  // `op` is a canonical name without overload ("aten::exp"); it also covers the
  // in-place variant ("aten::exp_").
  void setOpPolicy(const std::string& op, OpPolicy policy);
  OpPolicy opPolicy(const std::string& op_with_or_without_overload) const;
  std::map<std::string, OpPolicy> opPolicies() const;
  void clearOpPolicies();
  bool hasOpPolicies() const { return has_policies_.load(std::memory_order_relaxed); }

  void record(const std::string& op, FallbackReason reason, int64_t ns, int64_t to_cpu, int64_t to_npu);
  std::map<std::string, OpFallbackStats> stats() const;
  void resetStats();

  // Called for each fallback, before it runs, with the op ("aten::exp"), why it
  // falls back and a line for the log; Python's logging and torch_npu.doctor sit
  // behind it.
  using Logger = std::function<void(const std::string& op, FallbackReason reason, const std::string& line)>;
  void setLogger(Logger logger);
  void log(const std::string& op, FallbackReason reason, const std::string& line) const;

  // Reads NPU_FALLBACK_MODE, NPU_FALLBACK_OPS and NPU_FALLBACK_ON_ERROR (at
  // import, once every operator is registered): a bad value throws
  // std::invalid_argument naming the variable and the accepted forms.
  void loadEnvironment();

  // Warn mode: true the first time an op falls back (and until resetWarnings).
  bool firstWarning(const std::string& op);
  void resetWarnings();

 private:
  FallbackPolicy();
  std::atomic<FallbackMode> mode_{FallbackMode::Auto};
  std::atomic<bool> retry_on_error_{false};
  std::atomic<bool> has_policies_{false};
  mutable std::mutex mutex_;
  std::unordered_map<std::string, OpPolicy> policies_;
  std::map<std::string, OpFallbackStats> stats_;
  std::unordered_map<std::string, bool> warned_;
  Logger logger_;
};

// "exp", "torch.exp", "aten::exp", "aten::exp.out", "torch.ops.aten.exp.default",
// "Tensor.exp_" -> {"aten::exp", overload} (overload "" when not given).
// Throws c10::Error for text that is no operator name ("", "aten::", ".").
std::pair<std::string, std::string> canonicalOpName(const std::string& name);
// The canonical name of an operator that exists (any overload), for policies:
// raises for an unknown one, suggesting the closest known names.
std::string existingOpName(const std::string& name);

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
// "no_kernel", "dtype", "policy", "kernel_error" -> the reason; throws
// std::invalid_argument for anything else.
FallbackReason parseFallbackReason(const std::string& name);

// Runs the kernel of `op` for `cpu_keys` (CPU, SparseCPU, NestedTensorCPU) on
// the host tensors of the stack, as op.redispatchBoxed() does, with the random
// numbers of the npu. A Generator argument already holds the npu's draw (the
// callers take it at launch). The random ops whose schema has no Generator
// argument (native_dropout, randperm) would draw inside their CPU kernel from
// the cpu's default generator: they run their generator-taking form instead,
// with a draw of `device`'s default npu generator, taken here.
void redispatchToCpu(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack,
                     c10::DeviceIndex device);
// The random ops without a Generator argument that redispatchToCpu() gives the
// npu's draw ("aten::native_dropout", ...), for the test that every random op
// PyTorch has is covered.
std::vector<std::string> randomOpsGivenTheNpuDraw();
// Whether `op` is random (tagged nondeterministic_seeded) without a Generator
// argument: its CPU kernel must run through redispatchToCpu, at launch.
bool isRandomWithoutGeneratorArgument(const c10::OperatorHandle& op);

// The checks cpuFallback() makes before it runs `op` on the CPU: raises for
// mode "error" or an op policy "npu"; with `announce`, warns (mode "warn") and
// logs. For kernels that fall back by hand: convolution (no CPU kernel of its
// own name) and custom operators, whose cpu implementations run above autograd
// (they copy differentiably in Python, then record()); announce is false
// while they are traced on fake tensors.
void checkFallbackAllowed(const c10::OperatorHandle& op, const torch::jit::Stack& stack, FallbackReason reason,
                          const DtypeRefusal* refusal = nullptr, bool announce = true);

// "auto", "warn", "error" in any case, with spaces around: the one parser of
// NPU_FALLBACK_MODE and set_fallback_mode(). Throws std::invalid_argument.
FallbackMode parseFallbackMode(const std::string& text);
const char* fallbackModeName(FallbackMode mode);

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

// "aten::add.Tensor": the name error messages use.
std::string displayName(const c10::OperatorHandle& op);

}  // namespace npu::dispatch
