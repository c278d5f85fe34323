// Streams and events of the emulated NPU: a FIFO of kernels served by one worker
// thread per stream. A kernel launched on an idle stream runs on the caller's
// thread (same order, same error semantics): on a small host that is faster
// than a hand-off, see benchmarks/. NPU_EMU_ALWAYS_ENQUEUE=1 turns that off.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "../hal.h"

namespace npu::runtime::emu {

struct LaunchConfig {
  bool blocking = false;        // NPU_LAUNCH_BLOCKING: run and check every kernel at launch
  bool always_enqueue = false;  // NPU_EMU_ALWAYS_ENQUEUE: never run on the caller's thread
  std::size_t inline_bytes = 0; // kernels touching more than this are always queued
  static LaunchConfig fromEnvironment();
};

class EmuEvent;

class EmuStream final : public Stream {
 public:
  EmuStream(int device, int64_t id, int priority, const LaunchConfig& config);
  ~EmuStream() override;

  int device() const override { return device_; }
  int64_t id() const override { return id_; }
  int priority() const override { return priority_; }
  void launch(const char* name, Kernel kernel, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t n, CopyKind kind) override;
  void synchronize() override;
  bool query() override;
  void wait(Event& event) override;

  // The first error of a kernel not yet reported, cleared by reading it.
  void throwPendingError();
  bool hasPendingError();

 private:
  struct Task {
    const char* name;
    Kernel kernel;
  };
  void run(Task& task);  // executes one kernel, keeping its error
  void workerLoop();
  void startWorkerLocked();

  const int device_;
  const int64_t id_;
  const int priority_;
  const LaunchConfig config_;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable drained_;
  std::deque<Task> queue_;
  bool busy_ = false;      // a kernel is executing (worker or caller thread)
  bool stopping_ = false;
  bool worker_sleeping_ = false;
  std::atomic<std::size_t> queued_{0};  // lets the worker spin without the lock
  std::thread worker_;

  std::mutex error_mutex_;
  std::string error_kernel_;
  std::string error_message_;
};

class EmuEvent final : public Event {
 public:
  EmuEvent(int device, bool timing) : device_(device), timing_(timing) {}
  void record(Stream& stream) override;
  bool query() override;
  void synchronize() override;
  bool recorded() const override;
  int device() const override { return device_; }
  double elapsedMs(Event& end) override;

  // One record() of the event: completed by a marker kernel on its stream.
  struct Mark {
    EmuStream* stream = nullptr;
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::chrono::steady_clock::time_point when;
    void complete();
    void waitDone();
  };
  std::shared_ptr<Mark> currentMark() const;

 private:
  const int device_;
  const bool timing_;
  mutable std::mutex mutex_;
  std::shared_ptr<Mark> mark_;
};

}  // namespace npu::runtime::emu
