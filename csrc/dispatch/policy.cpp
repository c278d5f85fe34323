#include "policy.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "op_names.h"

namespace npu::dispatch {

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

}  // namespace npu::dispatch
