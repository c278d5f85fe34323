// Helpers shared by the runtime tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "emu/stream.h"

namespace npu::runtime::testing {

// Every wait in these tests is bounded so that a runtime bug fails a test
// instead of hanging the suite.
constexpr auto kTimeout = std::chrono::seconds(10);

// A one-shot gate: wait() blocks until open() (or kTimeout, returning false).
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, kTimeout, [this] { return open_; });
  }
  bool isOpen() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

inline emu::LaunchConfig asyncConfig() {
  emu::LaunchConfig config;
  config.blocking = false;
  config.always_enqueue = true;
  config.inline_bytes = std::size_t(1) << 62;
  return config;
}

inline emu::LaunchConfig inlineConfig(std::size_t inline_bytes = std::size_t(1) << 62) {
  emu::LaunchConfig config;
  config.blocking = false;
  config.always_enqueue = false;
  config.inline_bytes = inline_bytes;
  return config;
}

inline emu::LaunchConfig blockingConfig() {
  emu::LaunchConfig config;
  config.blocking = true;
  config.always_enqueue = false;
  config.inline_bytes = std::size_t(1) << 62;
  return config;
}

}  // namespace npu::runtime::testing
