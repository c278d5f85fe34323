#include "stream.h"

#include <cstring>

#include "config.h"

namespace npu::runtime::emu {

namespace {
// How long an idle worker polls for new work before it parks: long enough to
// catch a burst of launches, short enough to leave the core to ATen's threads.
constexpr auto kWorkerSpin = std::chrono::microseconds(20);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

LaunchConfig LaunchConfig::fromEnvironment() {
  LaunchConfig config;
  config.blocking = envFlag("NPU_LAUNCH_BLOCKING");
  config.always_enqueue = envFlag("NPU_EMU_ALWAYS_ENQUEUE");
  config.inline_bytes = envBytes("NPU_EMU_INLINE_BYTES", std::size_t(1) << 62);
  return config;
}

EmuStream::EmuStream(int device, int64_t id, int priority, const LaunchConfig& config)
    : device_(device), id_(id), priority_(priority), config_(config) {}

EmuStream::~EmuStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void EmuStream::run(Task& task) {
  try {
    task.kernel();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_kernel_.empty()) {
      error_kernel_ = task.name;
      error_message_ = e.what();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_kernel_.empty()) {
      error_kernel_ = task.name;
      error_message_ = "unknown exception";
    }
  }
  task.kernel = nullptr;  // release what the kernel captured on this thread
}

void EmuStream::startWorkerLocked() {
  worker_ = std::thread([this] { workerLoop(); });
}

void EmuStream::launch(const char* name, Kernel kernel, std::size_t bytes) {
  if (config_.blocking) {
    synchronize();
    try {
      kernel();
    } catch (const std::exception& e) {
      throw KernelError(name, e.what());
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!config_.always_enqueue && !busy_ && queue_.empty() && bytes <= config_.inline_bytes) {
    // Idle stream: running here keeps stream order and saves the hand-off.
    busy_ = true;
    lock.unlock();
    Task task{name, std::move(kernel)};
    run(task);
    lock.lock();
    busy_ = false;
    if (queue_.empty()) {
      drained_.notify_all();
    } else {
      work_ready_.notify_one();
    }
    return;
  }
  queue_.push_back(Task{name, std::move(kernel)});
  queued_.fetch_add(1, std::memory_order_release);
  if (!worker_.joinable()) startWorkerLocked();
  if (worker_sleeping_) work_ready_.notify_one();
}

void EmuStream::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (!queue_.empty() && !busy_) {
      Task task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      busy_ = true;
      lock.unlock();
      run(task);
      lock.lock();
      busy_ = false;
      if (queue_.empty()) drained_.notify_all();
      continue;
    }
    if (stopping_) return;
    lock.unlock();
    const auto until = std::chrono::steady_clock::now() + kWorkerSpin;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < until) {
      cpuRelax();
    }
    lock.lock();
    if (!queue_.empty() && !busy_) continue;
    if (stopping_) return;
    worker_sleeping_ = true;
    work_ready_.wait(lock);
    worker_sleeping_ = false;
  }
}

void EmuStream::copy(void* dst, const void* src, std::size_t n, CopyKind /*kind*/) {
  // Every kind is a memcpy: the emulated device memory is host memory.
  if (n == 0) return;
  launch("memcpy", [dst, src, n] { std::memcpy(dst, src, n); }, n);
}

void EmuStream::synchronize() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }
  throwPendingError();
}

bool EmuStream::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.empty() && !busy_;
}

void EmuStream::wait(Event& event) {
  auto mark = static_cast<EmuEvent&>(event).currentMark();
  if (!mark || mark->stream == this) return;  // same stream: already ordered
  launch("event_wait", [mark] { mark->waitDone(); }, 0);
}

bool EmuStream::hasPendingError() {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return !error_kernel_.empty();
}

void EmuStream::throwPendingError() {
  std::string kernel;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_kernel_.empty()) return;
    kernel.swap(error_kernel_);
    message.swap(error_message_);
  }
  throw KernelError(kernel, message);
}

// ---- events ---------------------------------------------------------------

void EmuEvent::Mark::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    when = std::chrono::steady_clock::now();
    done = true;
  }
  done_cv.notify_all();
}

void EmuEvent::Mark::waitDone() {
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
  stream.launch("event_record", [mark] { mark->complete(); }, 0);
}

bool EmuEvent::recorded() const { return currentMark() != nullptr; }

bool EmuEvent::query() {
  auto mark = currentMark();
  if (!mark) return true;
  std::lock_guard<std::mutex> lock(mark->mutex);
  return mark->done;
}

void EmuEvent::synchronize() {
  auto mark = currentMark();
  if (!mark) return;
  mark->waitDone();
  mark->stream->throwPendingError();
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
