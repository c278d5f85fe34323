// The CPU fallback's controls: the mode (auto, warn, error), per-op policies,
// statistics, the logger that tells Python of each fallback, and the
// environment variables that set them. torch_npu's Python only exposes them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

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

// "no_kernel", "dtype", "policy", "kernel_error" -> the reason; throws
// std::invalid_argument for anything else.
FallbackReason parseFallbackReason(const std::string& name);
// "auto", "warn", "error" in any case, with spaces around: the one parser of
// NPU_FALLBACK_MODE and set_fallback_mode(). Throws std::invalid_argument.
FallbackMode parseFallbackMode(const std::string& text);
const char* fallbackModeName(FallbackMode mode);

}  // namespace npu::dispatch
