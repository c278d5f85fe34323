#include "stream.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "config.h"
#include "parallel_copy.h"
#include "protection.h"
#include "spin.h"

namespace npu::runtime::emu {

namespace {
// How long an idle worker polls for new work before it parks: long enough to
// catch a burst of launches, short enough to leave the core to ATen's threads.
constexpr auto kWorkerSpin = std::chrono::microseconds(20);
// Launches beyond this many queued kernels wait for room: a host thread that
// launches faster than the stream runs cannot grow the queue without bound.
constexpr std::size_t kMaxQueuedKernels = 1024;
// Deferred execution (stream.h): how long queued work waits for the host's next wait.
constexpr auto kMaxDefer = std::chrono::milliseconds(100);

std::atomic<uint64_t> g_release_epoch{0};
// The live streams, for releaseDeferred() to wake their workers. A waker never holds
// a stream's mutex while it takes this one's, nor this one's while it takes a stream's.
std::mutex& g_streams_mutex = *new std::mutex;
std::vector<EmuStream*>& g_streams = *new std::vector<EmuStream*>;

}  // namespace

LaunchConfig LaunchConfig::fromEnvironment() {
  LaunchConfig config;
  config.blocking = envFlag("NPU_LAUNCH_BLOCKING");
  config.always_enqueue = envFlag("NPU_EMU_ALWAYS_ENQUEUE");
  config.inline_bytes = envBytes("NPU_EMU_INLINE_BYTES", std::size_t(1) << 62);
  config.protect = envFlag("NPU_EMU_PROTECT");
  return config;
}

void releaseDeferred() {
  if (!tracing::projecting()) return;
  g_release_epoch.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  for (EmuStream* s : g_streams) s->work_ready_.notify_all();
}

EmuStream::EmuStream(int device, int64_t id, int priority, const LaunchConfig& config)
    : device_(device), id_(id), priority_(priority), config_(config) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  g_streams.push_back(this);
}

EmuStream::~EmuStream() {
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    g_streams.erase(std::remove(g_streams.begin(), g_streams.end(), this), g_streams.end());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void EmuStream::recordFailure(const char* name, uint64_t index, std::exception_ptr error) {
  auto failure = std::make_shared<KernelFailure>();
  failure->kernel = name;
  failure->device = device_;
  failure->stream = id_;
  failure->launch_index = index;
  failure->cause = error;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    failure->message = e.what();
  } catch (...) {
    failure->message = "unknown exception";
  }
  std::lock_guard<std::mutex> lock(error_mutex_);
  // The first failure not yet reported is the one the stream keeps.
  if (!failure_ || failure_->reported.load()) failure_ = std::move(failure);
}

void EmuStream::run(Task& task) {
  // Device memory is open while the device works on it (NPU_EMU_PROTECT); opening
  // it is the emulator's cost, not the kernel's, so it is not in the kernel's time.
  std::optional<DeviceWork> work;
  try {
    work.emplace(config_.protect && !task.marker);
  } catch (...) {
    recordFailure(task.name, task.index, std::current_exception());
    task.kernel = nullptr;
    return;
  }
  const bool traced = task.stamp.traced && tracing::enabled();
  const int64_t start_ns = traced ? tracing::nowNs() : 0;
  try {
    task.kernel();
  } catch (...) {
    recordFailure(task.name, task.index, std::current_exception());
  }
  task.kernel = nullptr;  // release what the kernel captured on this thread
  // Timed where it executed: on the caller's thread or on the worker.
  if (traced) {
    tracing::recordExecution(task.stamp, task.kind, task.name, device_, id_, start_ns, tracing::nowNs(), task.bytes,
                             task.copy_kind);
  }
}

bool EmuStream::heldByCallerLocked() const {
  return hold_depth_ > 0 && holder_ == std::this_thread::get_id();
}

bool EmuStream::heldByCaller() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heldByCallerLocked();
}

void EmuStream::waitForSpaceLocked(std::unique_lock<std::mutex>& lock) {
  // While a hold keeps the stream, the queue may grow past the bound: the
  // holder may need the launching thread (a compiled kernel needs the GIL the
  // launcher holds), and the hold ends by itself.
  if (queue_.size() < kMaxQueuedKernels || hold_depth_ > 0) return;
  releaseDeferred();
  ++space_waiters_;
  space_.wait(lock, [this] { return queue_.size() < kMaxQueuedKernels || stopping_; });
  --space_waiters_;
}

void EmuStream::enqueueLocked(Task task, bool numbered) {
  if (tracing::projecting()) {
    task.release_epoch = g_release_epoch.load(std::memory_order_acquire);
    task.queued_at = std::chrono::steady_clock::now();
  }
  // One step: the position and kQueued, so no claim slips in between with a later position.
  uint64_t state = state_.load(std::memory_order_relaxed);
  while (!state_.compare_exchange_weak(state, (state + (numbered ? kLaunch : 0)) | kQueued,
                                       std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  if (numbered) task.index = state / kLaunch + 1;
  queue_.push_back(std::move(task));
  queued_.fetch_add(1, std::memory_order_release);
  if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
  if (worker_sleeping_) work_ready_.notify_one();
}

uint64_t EmuStream::tryClaimIdle() {
  uint64_t state = state_.load(std::memory_order_relaxed);
  if ((state & (kBusy | kQueued)) != 0) return 0;
  if (!state_.compare_exchange_strong(state, state + kLaunch + kBusy, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
    return 0;  // another thread claimed it, or queued work: the caller's slow path decides
  }
  return state / kLaunch + 1;
}

void EmuStream::finishInline() {
  // Only the thread holding kBusy writes completed_; it is counted before kBusy
  // clears, so whoever sees the stream idle sees the count too.
  completed_.store(completed_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  const uint64_t before = state_.fetch_and(~kBusy, std::memory_order_acq_rel);
  if ((before & (kQueued | kWaiter)) == 0) return;  // no one to wake (see state_)
  std::lock_guard<std::mutex> lock(mutex_);
  if (queue_.empty()) {
    drained_.notify_all();
  } else {
    work_ready_.notify_one();
  }
}

void EmuStream::waitIdleLocked(std::unique_lock<std::mutex>& lock) {
  if (idle()) return;
  if (idle_waiters_++ == 0) state_.fetch_or(kWaiter, std::memory_order_acq_rel);  // before the test below
  drained_.wait(lock, [this] { return idle(); });
  if (--idle_waiters_ == 0) state_.fetch_and(~kWaiter, std::memory_order_acq_rel);
}

void EmuStream::launch(const char* name, Kernel kernel, std::size_t bytes) {
  Task task{name, std::move(kernel)};
  task.stamp = tracing::LaunchStamp::now();
  // A traced name outlives the op that named it (an op registered from Python may go).
  if (task.stamp.traced) task.name = tracing::intern(name);
  task.bytes = bytes;
  submit(std::move(task), bytes);
}

void EmuStream::launchMarker(const char* name, Kernel kernel) {
  Task task{name, std::move(kernel)};
  task.marker = true;
  submit(std::move(task), 0);
}

// NPU_LAUNCH_BLOCKING: the work completes, and its error raises, before the
// call returns. The stream is busy meanwhile, so another thread's hold or
// kernel comes after it, as after any kernel.
void EmuStream::runBlocking(Task& task) {
  task.index = startBlocking();
  if (task.index == 0) {  // the caller holds the stream: its own work, unnumbered
    run(task);
    throwPendingError();
    return;
  }
  run(task);
  finishInline();
  throwPendingError();
}

uint64_t EmuStream::startBlocking() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (heldByCallerLocked()) return 0;
  for (;;) {
    waitIdleLocked(lock);
    throwPendingError();  // an earlier kernel's error first, before anything more runs
    if (const uint64_t position = tryClaimIdle()) return position;
  }
}

void EmuStream::submit(Task task, std::size_t bytes) {
  if (config_.blocking) {
    runBlocking(task);
    return;
  }
  // Idle stream: running here keeps stream order and saves the hand-off.
  const bool may_inline = !config_.always_enqueue && bytes <= config_.inline_bytes && !tracing::projecting();
  if (may_inline) {
    if (const uint64_t position = tryClaimIdle()) {
      task.index = position;
      run(task);
      finishInline();
      return;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (heldByCallerLocked()) {
    // The holder's own work (host code in stream order): runs now, unnumbered,
    // so positions of the kernels queued behind the hold stay in order.
    lock.unlock();
    task.stamp.host_synchronous = true;
    run(task);
    return;
  }
  waitForSpaceLocked(lock);  // a full queue makes the host wait, as a device's launch queue does
  if (may_inline) {
    if (const uint64_t position = tryClaimIdle()) {  // became idle meanwhile
      lock.unlock();
      task.index = position;
      run(task);
      finishInline();
      return;
    }
  }
  enqueueLocked(std::move(task), true);
}

bool EmuStream::runIfIdle(const char* name, KernelRef kernel, std::size_t bytes) {
  if (config_.blocking) {
    const bool numbered = startBlocking() != 0;
    try {
      DeviceWork work(config_.protect);
      tracing::Scope traced(tracing::ActivityKind::Kernel, name, device_, id_, bytes);
      kernel();
    } catch (...) {
      if (numbered) finishInline();
      throw;
    }
    if (numbered) finishInline();
    return true;
  }
  if (!config_.always_enqueue && bytes <= config_.inline_bytes && !tracing::projecting() && tryClaimIdle() != 0) {
    try {
      DeviceWork work(config_.protect);
      tracing::Scope traced(tracing::ActivityKind::Kernel, name, device_, id_, bytes);
      kernel();
    } catch (...) {
      finishInline();
      throw;
    }
    finishInline();
    return true;
  }
  // A hold keeps the stream busy: an idle-looking stream is not the caller's.
  if ((state_.load(std::memory_order_acquire) & kBusy) == 0) return false;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!heldByCallerLocked()) return false;
  lock.unlock();
  tracing::Scope traced(tracing::ActivityKind::Kernel, name, device_, id_, bytes);
  kernel();  // (the hold keeps device memory open)
  return true;
}

void EmuStream::acquire() {
  releaseDeferred();
  std::unique_lock<std::mutex> lock(mutex_);
  const auto me = std::this_thread::get_id();
  if (heldByCallerLocked()) {
    ++hold_depth_;
    return;
  }
  uint64_t state = state_.load(std::memory_order_relaxed);
  if ((state & (kBusy | kQueued)) == 0 &&
      state_.compare_exchange_strong(state, state | kBusy, std::memory_order_acq_rel, std::memory_order_relaxed)) {
    holder_ = me;
    hold_depth_ = 1;
    if (config_.protect) {
      try {
        DeviceWork::begin();  // host code in stream order works as the device
      } catch (...) {
        endHoldLocked(false);  // give the stream back, then report
        throw;
      }
    }
    return;
  }
  // Behind the work already queued: the worker hands the stream over when it
  // reaches this marker; what others launch meanwhile queues behind it.
  Task hold;
  hold.name = "host_execution";
  hold.hold = true;
  hold.holder = me;
  enqueueLocked(std::move(hold), false);
  const int64_t start = tracing::enabled() ? tracing::nowNs() : 0;
  drained_.wait(lock, [&] { return hold_depth_ > 0 && holder_ == me; });
  if (config_.protect) {
    try {
      DeviceWork::begin();
    } catch (...) {
      endHoldLocked(false);  // give the stream back, then report (begin() counted nothing)
      throw;
    }
  }
  lock.unlock();
  // The host waited for the device: host code that needs the stream's results.
  tracing::recordHostWait(tracing::kStreamWait, device_, id_, start);
}

void EmuStream::release() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!heldByCallerLocked()) return;
  if (--hold_depth_ > 0) return;
  endHoldLocked(config_.protect);
}

void EmuStream::endHoldLocked(bool end_device_work) {
  if (end_device_work) DeviceWork::end();
  hold_depth_ = 0;
  holder_ = std::thread::id();
  state_.fetch_and(~kBusy, std::memory_order_acq_rel);  // under the mutex: its waiters need no kWaiter
  if (queue_.empty()) {
    drained_.notify_all();
  } else {
    work_ready_.notify_one();
  }
}

bool EmuStream::releasedLocked(const Task& task, std::chrono::steady_clock::duration* wait) const {
  // Queued while not deferring, or a hold: a host thread waits for it.
  if (task.queued_at == std::chrono::steady_clock::time_point() || task.hold) return true;
  if (!tracing::projecting() || stopping_ || g_release_epoch.load(std::memory_order_acquire) > task.release_epoch) {
    return true;
  }
  const auto waited = std::chrono::steady_clock::now() - task.queued_at;
  if (waited >= kMaxDefer) return true;
  *wait = std::min<std::chrono::steady_clock::duration>(kMaxDefer - waited, std::chrono::milliseconds(1));
  return false;
}

void EmuStream::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::chrono::steady_clock::duration deferred{};
    const bool busy = (state_.load(std::memory_order_acquire) & kBusy) != 0;
    if (!queue_.empty() && !busy && !releasedLocked(queue_.front(), &deferred)) {
      work_ready_.wait_for(lock, deferred);   // releaseDeferred() wakes it sooner
      continue;
    }
    if (!queue_.empty() && !busy) {
      // kQueued is set, so no claim races: kBusy first, then kQueued off if this was the last.
      state_.fetch_or(kBusy, std::memory_order_acq_rel);
      Task task = std::move(queue_.front());
      queue_.pop_front();
      if (queue_.empty()) state_.fetch_and(~kQueued, std::memory_order_acq_rel);
      queued_.fetch_sub(1, std::memory_order_relaxed);
      if (space_waiters_ > 0) space_.notify_all();
      if (task.hold) {
        holder_ = task.holder;
        hold_depth_ = 1;
        drained_.notify_all();  // wakes the thread waiting in acquire()
        continue;
      }
      lock.unlock();
      run(task);
      lock.lock();
      completed_.store(completed_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      state_.fetch_and(~kBusy, std::memory_order_acq_rel);
      if (queue_.empty()) drained_.notify_all();
      continue;
    }
    if (stopping_ && queue_.empty()) return;
    lock.unlock();
    const auto until = std::chrono::steady_clock::now() + kWorkerSpin;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < until) {
      cpuRelax();
    }
    lock.lock();
    // Work queued behind an inline kernel: its end wakes this wait (kQueued, see state_).
    if (!queue_.empty() && (state_.load(std::memory_order_acquire) & kBusy) == 0) continue;
    if (stopping_ && queue_.empty()) return;
    worker_sleeping_ = true;
    work_ready_.wait(lock);
    worker_sleeping_ = false;
  }
}

void EmuStream::copy(void* dst, const void* src, std::size_t n, CopyKind kind) {
  // Every kind is a memcpy: the emulated device memory is host memory. A large
  // one is shared with idle cores (parallel_copy.h), as many as the launching
  // thread's intra-op thread count allows.
  if (n == 0) return;
  const int threads = n >= parallelCopyMinBytes() ? copyThreads() : 1;
  Task task{tracing::copyName(kind), [dst, src, n, threads] { parallelCopy(dst, src, n, threads); }};
  task.stamp = tracing::LaunchStamp::now();
  task.kind = tracing::ActivityKind::Memcpy;
  task.bytes = n;
  task.copy_kind = kind;
  submit(std::move(task), n);
}

void EmuStream::drain() {
  releaseDeferred();
  std::unique_lock<std::mutex> lock(mutex_);
  if (heldByCallerLocked()) return;  // everything launched before the hold has run
  // Traced even when nothing is queued here: on a chip the work would still be running.
  const int64_t start = tracing::enabled() ? tracing::nowNs() : 0;
  waitIdleLocked(lock);
  lock.unlock();
  tracing::recordHostWait(tracing::kStreamSynchronize, device_, id_, start);
}

void EmuStream::synchronize() {
  drain();
  throwPendingError();
}

bool EmuStream::query() {
  releaseDeferred();
  if (idle()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.empty() && ((state_.load(std::memory_order_acquire) & kBusy) == 0 || heldByCallerLocked());
}

void EmuStream::wait(Event& event) {
  if (const SharedEventCell* cell = static_cast<EmuEvent&>(event).interprocess()) {
    // The latest record in any process: its count now; the marker polls the shared cell.
    const uint64_t target = cell->cell->recorded.load(std::memory_order_acquire);
    if (cell->cell->completed.load(std::memory_order_acquire) >= target) return;
    Kernel waiter = [cell = *cell, target] { cell.waitFor(target); };
    std::unique_lock<std::mutex> lock(mutex_);
    if (heldByCallerLocked() || config_.blocking) {
      lock.unlock();
      waiter();
      return;
    }
    waitForSpaceLocked(lock);
    enqueueLocked(Task{"event_wait", std::move(waiter)}, true);
    return;
  }
  auto mark = static_cast<EmuEvent&>(event).currentMark();
  if (!mark || mark->stream == this) return;  // same stream: already ordered
  std::shared_ptr<KernelFailure> failure;
  if (mark->isDone(&failure)) {
    adoptFailure(failure);
    return;
  }
  Kernel marker = [this, mark] {
    mark->waitDone();
    std::shared_ptr<KernelFailure> carried;
    mark->isDone(&carried);
    adoptFailure(carried);
  };
  std::unique_lock<std::mutex> lock(mutex_);
  if (heldByCallerLocked() || config_.blocking) {
    // Host code in stream order waits here, as it would on the device; a
    // blocking stream (NPU_LAUNCH_BLOCKING) completes the wait before returning.
    lock.unlock();
    marker();
    return;
  }
  // A marker for the worker: the caller never blocks on it.
  waitForSpaceLocked(lock);
  enqueueLocked(Task{"event_wait", std::move(marker)}, true);  // not traced
}

std::shared_ptr<KernelFailure> EmuStream::pendingFailure() {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (failure_ && failure_->reported.load()) failure_.reset();
  return failure_;
}

void EmuStream::adoptFailure(const std::shared_ptr<KernelFailure>& failure) {
  if (!failure || failure->reported.load()) return;
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (!failure_ || failure_->reported.load()) failure_ = failure;
}

bool EmuStream::hasPendingError() { return pendingFailure() != nullptr; }

void EmuStream::throwPendingError() {
  std::shared_ptr<KernelFailure> failure;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    failure.swap(failure_);
  }
  // Reported elsewhere already (through an event or a waiting stream): done.
  if (failure && failure->claim()) throw KernelError(std::move(failure));
}

// ---- events ---------------------------------------------------------------

void EmuEvent::Mark::complete(std::shared_ptr<KernelFailure> carried) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    when = std::chrono::steady_clock::now();
    failure = std::move(carried);
    done = true;
  }
  done_cv.notify_all();
}

bool EmuEvent::Mark::isDone(std::shared_ptr<KernelFailure>* failure_out) {
  std::lock_guard<std::mutex> lock(mutex);
  if (done && failure_out != nullptr) *failure_out = failure;
  return done;
}

void EmuEvent::Mark::waitDone() {
  releaseDeferred();
  std::unique_lock<std::mutex> lock(mutex);
  done_cv.wait(lock, [this] { return done; });
}

std::shared_ptr<EmuEvent::Mark> EmuEvent::currentMark() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mark_;
}

void EmuEvent::record(Stream& stream) {
  auto mark = std::make_shared<Mark>();
  mark->stream = static_cast<EmuStream*>(&stream);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mark_ = mark;
  }
  EmuStream* recorder = mark->stream;
  if (ipc_) {
    const uint64_t count = ipc_->cell->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
    recorder->launchMarker("event_record", [mark, recorder, cell = *ipc_, count] {
      mark->complete(recorder->pendingFailure());
      cell.completeUpTo(count);
    });
    return;
  }
  recorder->launchMarker("event_record", [mark, recorder] { mark->complete(recorder->pendingFailure()); });
}

std::string EmuEvent::ipcHandle() {
  if (!ipc_) {
    throw std::logic_error("this npu event is not interprocess: create it with torch.npu.Event(interprocess=True)");
  }
  return ipc_->handle;
}

bool EmuEvent::recorded() const {
  if (ipc_) return ipc_->cell->recorded.load(std::memory_order_acquire) > 0;
  return currentMark() != nullptr;
}

bool EmuEvent::query() {
  releaseDeferred();
  if (ipc_) return ipc_->complete();
  auto mark = currentMark();
  return !mark || mark->isDone(nullptr);
}

void EmuEvent::synchronize() {
  releaseDeferred();
  if (ipc_) ipc_->waitFor(ipc_->cell->recorded.load(std::memory_order_acquire));
  auto mark = currentMark();
  if (!mark) return;
  const int64_t start = tracing::enabled() ? tracing::nowNs() : 0;
  mark->waitDone();
  tracing::recordHostWait(tracing::kStreamSynchronize, device_, mark->stream->id(), start);
  std::shared_ptr<KernelFailure> failure;
  mark->isDone(&failure);
  if (failure && failure->claim()) throw KernelError(std::move(failure));
}

double EmuEvent::elapsedMs(Event& end_event) {
  auto& end = static_cast<EmuEvent&>(end_event);
  if (!timing_ || !end.timing_) {
    throw std::logic_error("elapsed time needs both events created with enable_timing=True");
  }
  auto start_mark = currentMark();
  auto end_mark = end.currentMark();
  if (!start_mark || !end_mark) {
    throw std::logic_error("elapsed time needs both events recorded first");
  }
  std::chrono::steady_clock::time_point start_time;
  std::chrono::steady_clock::time_point end_time;
  {
    std::lock_guard<std::mutex> lock(start_mark->mutex);
    if (!start_mark->done) throw std::logic_error("the start event has not completed yet; synchronize it first");
    start_time = start_mark->when;
  }
  {
    std::lock_guard<std::mutex> lock(end_mark->mutex);
    if (!end_mark->done) throw std::logic_error("the end event has not completed yet; synchronize it first");
    end_time = end_mark->when;
  }
  return std::chrono::duration<double, std::milli>(end_time - start_time).count();
}

}  // namespace npu::runtime::emu
