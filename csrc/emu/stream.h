// Streams and events of the emulated NPU: a FIFO of kernels served by one worker
// thread per stream. A kernel launched on an idle stream runs on the caller's
// thread (same order, same error semantics): on a small host that is faster
// than a hand-off, see benchmarks/. NPU_EMU_ALWAYS_ENQUEUE=1 turns that off.
// The launch policy (LaunchConfig) and heldByCaller() are the emulator's own;
// everything else here implements the contract of hal.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "../runtime/hal.h"
#include "../runtime/tracing.h"
#include "ipc.h"

namespace npu::runtime::emu {

// Deferred execution, while a profiler projects onto a chip (tracing::projecting()):
// queued work runs once the host waits for the device (a synchronize, a query, a
// hold, an event) or after kMaxDefer, not while the host's own code runs, so the
// host's time between launches is measured as on a real system. Every way of
// waiting for the device releases what was queued before it.
void releaseDeferred();

struct LaunchConfig {
  bool blocking = false;        // NPU_LAUNCH_BLOCKING: run and check every kernel at launch
  bool always_enqueue = false;  // NPU_EMU_ALWAYS_ENQUEUE: never run on the caller's thread
  std::size_t inline_bytes = 0; // kernels touching more than this are always queued
  bool protect = false;         // NPU_EMU_PROTECT: device memory closed to the host (protection.h)
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
  bool runIfIdle(const char* name, KernelRef kernel, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t n, CopyKind kind) override;
  void acquire() override;
  void release() override;
  // Whether the calling thread holds the stream (acquire()); the emulator's
  // own: the layers above track their holds themselves.
  bool heldByCaller() const;
  void synchronize() override;
  void drain() override;
  bool query() override;
  void wait(Event& event) override;
  uint64_t position() const override { return state_.load(std::memory_order_acquire) / kLaunch; }
  bool passed(uint64_t position) const override { return completed_.load(std::memory_order_acquire) >= position; }

  // Queues an event's marker: stream-ordered like a kernel, never traced.
  void launchMarker(const char* name, Kernel kernel);

  // The first failure not yet reported, cleared by reading it.
  void throwPendingError();
  bool hasPendingError();
  // The failure a marker at this point of the stream carries (null if none).
  std::shared_ptr<KernelFailure> pendingFailure();
  // Makes `failure` (from an event this stream waited on) this stream's too.
  void adoptFailure(const std::shared_ptr<KernelFailure>& failure);

 private:
  struct Task {
    Task() = default;
    Task(const char* n, Kernel k, uint64_t i = 0) : name(n), kernel(std::move(k)), index(i) {}
    const char* name = nullptr;
    Kernel kernel;
    uint64_t index = 0;        // position among the stream's launches (0: none)
    bool hold = false;         // not a kernel: hands the stream to `holder`
    bool marker = false;       // an event's marker: touches no device memory
    std::thread::id holder;
    // For the activity trace (tracing.h): stamped at launch while tracing is
    // on; event markers are never stamped, so never traced.
    tracing::LaunchStamp stamp;
    tracing::ActivityKind kind = tracing::ActivityKind::Kernel;  // or Memcpy
    std::size_t bytes = 0;
    CopyKind copy_kind = CopyKind::DeviceToDevice;
    // Deferred execution: the releases before it was queued, and when (releaseDeferred()).
    uint64_t release_epoch = 0;
    std::chrono::steady_clock::time_point queued_at;
  };
  // Whether the worker may run `task` now; else how long it may wait at most.
  bool releasedLocked(const Task& task, std::chrono::steady_clock::duration* wait) const;
  friend void releaseDeferred();
  void run(Task& task);  // executes one kernel, keeping its error
  void runBlocking(Task& task);  // NPU_LAUNCH_BLOCKING's launch
  // NPU_LAUNCH_BLOCKING: waits until the stream is idle, raises an earlier
  // error, then marks the stream busy and counts the launch: its position. 0
  // (nothing done) when the caller holds the stream.
  uint64_t startBlocking();
  // launch() for kernels, copies and event markers alike.
  void submit(Task task, std::size_t bytes);
  void recordFailure(const char* name, uint64_t index, std::exception_ptr error);
  // Queues `task`, numbered (a position) unless it is a hold.
  void enqueueLocked(Task task, bool numbered);
  void waitForSpaceLocked(std::unique_lock<std::mutex>& lock);
  // The lock-free claim of an idle stream (the comment at state_): its
  // position, or 0 when the stream is busy or has queued work.
  uint64_t tryClaimIdle();
  // Ends an inline kernel's claim; takes the lock only when someone waits.
  void finishInline();
  // Waits until nothing runs or is queued (drained_).
  void waitIdleLocked(std::unique_lock<std::mutex>& lock);
  bool idle() const { return (state_.load(std::memory_order_acquire) & (kBusy | kQueued)) == 0; }
  bool heldByCallerLocked() const;
  // Gives the caller's hold back (hold_depth_ reached 0, or a failed acquire).
  void endHoldLocked(bool end_device_work);
  void workerLoop();

  const int device_;
  const int64_t id_;
  const int priority_;
  const LaunchConfig config_;

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable drained_;       // the stream became idle, or a hold was granted
  std::condition_variable space_;         // the queue has room again
  int space_waiters_ = 0;
  std::deque<Task> queue_;
  // The stream's state word. A launching thread claims an idle stream with one
  // compare-exchange (0 -> kBusy, plus one launch) and ends the claim with one
  // fetch_and, without the mutex. Everything else changes it under the mutex.
  //   kBusy: a kernel executes (worker or caller thread), or the stream is held.
  //   kQueued: queue_ is not empty (set and cleared under the mutex); no claim then.
  //   kWaiter: a thread waits on drained_ (waitIdleLocked): the end of an inline
  //     claim takes the mutex and notifies it.
  //   the rest, in units of kLaunch: the launches, so a position is taken in the
  //     same atomic step as the claim or the enqueue, and positions follow the order
  //     the kernels run in.
  // No lost wake-up: a sleeper (the worker on work_ready_ with kQueued set, a
  // waiter on drained_ with kWaiter set) sets its bit, or sees it set, before it
  // tests kBusy under the mutex. The fetch_and that clears kBusy comes after that
  // bit in the word's modification order or before the test: either it sees the
  // bit, then takes the mutex (so notifies after the sleeper waits), or the
  // sleeper's test sees kBusy clear and does not sleep.
  static constexpr uint64_t kBusy = 1;
  static constexpr uint64_t kQueued = 2;
  static constexpr uint64_t kWaiter = 4;
  static constexpr uint64_t kLaunch = 8;
  std::atomic<uint64_t> state_{0};
  int idle_waiters_ = 0;   // threads in waitIdleLocked (kWaiter while > 0)
  std::thread::id holder_;
  int hold_depth_ = 0;
  bool stopping_ = false;
  bool worker_sleeping_ = false;
  std::atomic<std::size_t> queued_{0};  // lets the worker spin without the lock
  std::atomic<uint64_t> completed_{0};  // written by the one thread that holds kBusy
  std::thread worker_;

  std::mutex error_mutex_;
  std::shared_ptr<KernelFailure> failure_;
};

class EmuEvent final : public Event {
 public:
  EmuEvent(int device, bool timing) : device_(device), timing_(timing) {}
  // An interprocess event (ipc.h): its state is the shared cell's.
  EmuEvent(int device, bool timing, SharedEventCell cell)
      : device_(device), timing_(timing), ipc_(std::make_unique<SharedEventCell>(std::move(cell))) {}
  void record(Stream& stream) override;
  std::string ipcHandle() override;
  // The shared cell of an interprocess event, else null.
  const SharedEventCell* interprocess() const { return ipc_.get(); }
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
    std::shared_ptr<KernelFailure> failure;  // of a kernel before the marker
    void complete(std::shared_ptr<KernelFailure> failure);
    void waitDone();
    // Whether the marker ran; if so, what failure it carries.
    bool isDone(std::shared_ptr<KernelFailure>* failure_out);
  };
  std::shared_ptr<Mark> currentMark() const;

 private:
  const int device_;
  const bool timing_;
  const std::unique_ptr<SharedEventCell> ipc_;
  mutable std::mutex mutex_;
  std::shared_ptr<Mark> mark_;
};

}  // namespace npu::runtime::emu
