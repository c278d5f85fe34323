// Helpers shared by the runtime tests (the conformance suite and the
// emulator's own tests). Nothing here knows an implementation of the HAL.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "hal.h"
#include "tracing.h"

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

// Keeps `stream` busy with a kernel that blocks until release(). It is
// launched from a thread of its own: a HAL that runs a kernel on the caller's
// thread (the emulator does on an idle stream) blocks that thread, not the
// test. The constructor returns once the kernel runs, so work launched after
// it is queued behind it on any HAL. `correlation` (if not 0) is current on
// the launching thread.
class Blocker {
 public:
  explicit Blocker(Stream& stream, const char* name = "blocker", uint64_t correlation = 0)
      : state_(std::make_shared<State>()) {
    launcher_ = std::thread([&stream, name, correlation, state = state_] {
      if (correlation != 0) tracing::pushCorrelation(correlation);
      stream.launch(name, [state] {
        state->started.open();
        state->release.wait();
      }, 0);
      if (correlation != 0) tracing::popCorrelation();
    });
    started_ = state_->started.wait();
  }
  ~Blocker() { release(); }
  Blocker(const Blocker&) = delete;
  Blocker& operator=(const Blocker&) = delete;

  bool started() const { return started_; }  // false: the kernel never ran (a bug)
  // Lets the kernel finish. Call from one thread at a time.
  void release() {
    state_->release.open();
    if (launcher_.joinable()) launcher_.join();
  }

 private:
  struct State {
    Gate started;
    Gate release;
  };
  std::shared_ptr<State> state_;  // the kernel holds it too: it may outlive the Blocker
  std::thread launcher_;
  bool started_ = false;
};

// Sets (or, with nullptr, unsets) an environment variable for its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace npu::runtime::testing
