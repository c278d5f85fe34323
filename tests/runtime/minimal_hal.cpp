#include "minimal_hal.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tracing.h"

namespace npu::runtime::minimal {

namespace {

constexpr std::size_t kDeviceAlignment = 256;
constexpr std::size_t kHostAlignment = 64;

// ---- device memory -------------------------------------------------------------------

// A device's memory: first-fit blocks in [0, capacity). The addresses handed
// out are base_ + offset inside a PROT_NONE reservation, so host code that
// touches them faults; the bytes are storage_[offset], reached only by copies.
class Arena {
 public:
  explicit Arena(std::size_t capacity) : capacity_(capacity), storage_(new char[capacity]) {
    void* reserved = ::mmap(nullptr, capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) throw std::runtime_error("minimal HAL: cannot reserve device address space");
    base_ = static_cast<char*>(reserved);
    free_.emplace(0, capacity);
  }
  ~Arena() { ::munmap(base_, capacity_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::size_t capacity() const { return capacity_; }

  void* allocate(std::size_t n) {
    if (n > capacity_) return nullptr;  // also keeps the rounding below from wrapping
    const std::size_t size = (std::max<std::size_t>(n, 1) + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const std::size_t offset = it->first;
      const std::size_t left = it->second - size;
      free_.erase(it);
      if (left > 0) free_.emplace(offset + size, left);
      used_.emplace(offset, size);
      in_use_ += size;
      return base_ + offset;
    }
    return nullptr;
  }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = inRange(ptr) ? used_.find(offsetOf(ptr)) : used_.end();
    if (it == used_.end()) throw std::invalid_argument("minimal HAL: free of a pointer this device did not allocate");
    std::size_t offset = it->first;
    std::size_t size = it->second;
    used_.erase(it);
    in_use_ -= size;
    // Merge with the free neighbours.
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + size) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += size;
        return;
      }
    }
    free_.emplace(offset, size);
  }

  bool owns(const void* ptr) const {
    if (!inRange(ptr)) return false;
    const std::size_t offset = offsetOf(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = used_.upper_bound(offset);
    if (it == used_.begin()) return false;
    --it;
    return offset < it->first + it->second;
  }

  std::size_t inUse() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_;
  }

  // The bytes behind [ptr, ptr + n), which must lie inside one live block.
  char* bytes(const void* ptr, std::size_t n) const {
    if (!inRange(ptr)) throw std::invalid_argument("minimal HAL: a copy names host memory where device memory belongs");
    const std::size_t offset = offsetOf(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = used_.upper_bound(offset);
    if (it == used_.begin() || offset + n > std::prev(it)->first + std::prev(it)->second) {
      throw std::invalid_argument("minimal HAL: a copy runs past the device block it starts in");
    }
    return storage_.get() + offset;
  }

 private:
  bool inRange(const void* ptr) const {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    const auto b = reinterpret_cast<std::uintptr_t>(base_);
    return p >= b && p < b + capacity_;
  }
  std::size_t offsetOf(const void* ptr) const {
    return reinterpret_cast<std::uintptr_t>(ptr) - reinterpret_cast<std::uintptr_t>(base_);
  }

  const std::size_t capacity_;
  std::unique_ptr<char[]> storage_;  // not value-initialised: untouched pages cost nothing
  char* base_ = nullptr;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_;  // offset -> size
  std::map<std::size_t, std::size_t> used_;  // offset -> size
  std::size_t in_use_ = 0;
};

// ---- events' marks -------------------------------------------------------------------

class MinimalStream;

// One record() of an event, completed by a marker on its stream.
struct Mark {
  const MinimalStream* stream = nullptr;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::chrono::steady_clock::time_point when;
  std::shared_ptr<KernelFailure> failure;  // of a kernel before the marker

  void complete(std::shared_ptr<KernelFailure> carried) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      when = std::chrono::steady_clock::now();
      failure = std::move(carried);
      done = true;
    }
    cv.notify_all();
  }
  bool isDone(std::shared_ptr<KernelFailure>* failure_out) {
    std::lock_guard<std::mutex> lock(mutex);
    if (done && failure_out != nullptr) *failure_out = failure;
    return done;
  }
  void waitDone() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return done; });
  }
};

class MinimalEvent;

// ---- streams -------------------------------------------------------------------------

class MinimalStream final : public Stream {
 public:
  MinimalStream(int device, int64_t id, int priority, Arena& arena, bool blocking)
      : device_(device), id_(id), priority_(priority), arena_(arena), blocking_(blocking) {}

  ~MinimalStream() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();  // after the queued work ran
  }

  int device() const override { return device_; }
  int64_t id() const override { return id_; }
  int priority() const override { return priority_; }

  void launch(const char* name, Kernel kernel, std::size_t bytes) override {
    Work work;
    work.name = name;
    work.fn = std::move(kernel);
    work.stamp = tracing::LaunchStamp::now();
    work.bytes = bytes;
    submit(std::move(work), /*blocking_applies=*/true);
  }

  void copy(void* dst, const void* src, std::size_t n, CopyKind kind) override {
    if (n == 0) return;
    char* to = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    if (kind != CopyKind::HostToDevice) from = arena_.bytes(src, n);
    if (kind != CopyKind::DeviceToHost) to = arena_.bytes(dst, n);
    Work work;
    work.name = tracing::copyName(kind);
    work.fn = [to, from, n] { std::memcpy(to, from, n); };
    work.stamp = tracing::LaunchStamp::now();
    work.kind = tracing::ActivityKind::Memcpy;
    work.bytes = n;
    work.copy_kind = kind;
    submit(std::move(work), /*blocking_applies=*/true);
  }

  void acquire() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto me = std::this_thread::get_id();
    if (heldByCallerLocked()) {
      ++hold_depth_;
      return;
    }
    if (queue_.empty() && !running_) {
      running_ = true;
      holder_ = me;
      hold_depth_ = 1;
      return;
    }
    Work hold;
    hold.name = "hold";
    hold.hold = true;
    hold.holder = me;
    enqueueLocked(std::move(hold));
    const int64_t start = tracing::enabled() ? tracing::nowNs() : 0;
    idle_cv_.wait(lock, [&] { return hold_depth_ > 0 && holder_ == me; });
    lock.unlock();
    tracing::recordHostWait(tracing::kStreamWait, device_, id_, start);
  }

  void release() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!heldByCallerLocked() || --hold_depth_ > 0) return;
    holder_ = std::thread::id();
    running_ = false;
    work_cv_.notify_all();
    if (queue_.empty()) idle_cv_.notify_all();
  }

  void synchronize() override {
    drain();
    throwPendingError();
  }

  void drain() override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (heldByCallerLocked() || (queue_.empty() && !running_)) return;
    const int64_t start = tracing::enabled() ? tracing::nowNs() : 0;
    idle_cv_.wait(lock, [this] { return queue_.empty() && !running_; });
    lock.unlock();
    tracing::recordHostWait(tracing::kStreamSynchronize, device_, id_, start);
  }

  bool query() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.empty() && (!running_ || heldByCallerLocked());
  }

  void wait(Event& event) override;

  uint64_t position() const override { return submitted_.load(std::memory_order_acquire); }
  bool passed(uint64_t position) const override { return completed_.load(std::memory_order_acquire) >= position; }

  // An event's marker: stream-ordered, counted, never traced.
  void submitMarker(const char* name, Kernel marker) {
    Work work;
    work.name = name;
    work.fn = std::move(marker);
    submit(std::move(work), /*blocking_applies=*/false);
  }

  // The first failure not yet reported (what a marker here carries), or null.
  std::shared_ptr<KernelFailure> pendingFailure() {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_ && failure_->reported.load()) failure_.reset();
    return failure_;
  }

  void adoptFailure(const std::shared_ptr<KernelFailure>& failure) {
    if (!failure || failure->reported.load()) return;
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_ || failure_->reported.load()) failure_ = failure;
  }

 private:
  struct Work {
    const char* name = "";
    Kernel fn;
    uint64_t index = 0;  // position (0: the holder's, uncounted)
    bool hold = false;   // not work: hands the stream to `holder`
    std::thread::id holder;
    tracing::LaunchStamp stamp;  // markers are never stamped, so never traced
    tracing::ActivityKind kind = tracing::ActivityKind::Kernel;
    std::size_t bytes = 0;
    CopyKind copy_kind = CopyKind::DeviceToDevice;
  };

  bool heldByCallerLocked() const { return hold_depth_ > 0 && holder_ == std::this_thread::get_id(); }

  void submit(Work work, bool blocking_applies) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (heldByCallerLocked()) {
      lock.unlock();
      execute(work);  // the holder's work: at once, on its thread
    } else {
      work.index = submitted_.fetch_add(1, std::memory_order_acq_rel) + 1;
      enqueueLocked(std::move(work));
      lock.unlock();
      if (!(blocking_ && blocking_applies)) return;
      drain();
    }
    if (blocking_ && blocking_applies) throwPendingError();
  }

  void enqueueLocked(Work work) {
    queue_.push_back(std::move(work));
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    work_cv_.notify_one();
  }

  void workerLoop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [this] { return (!queue_.empty() && !running_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;  // stopping
      Work work = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      if (work.hold) {
        holder_ = work.holder;
        hold_depth_ = 1;
        idle_cv_.notify_all();  // wakes the thread in acquire(); release() lets the queue go on
        continue;
      }
      lock.unlock();
      execute(work);
      lock.lock();
      completed_.fetch_add(1, std::memory_order_acq_rel);
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  void execute(Work& work) {
    const bool traced = work.stamp.traced && tracing::enabled();
    const int64_t start = traced ? tracing::nowNs() : 0;
    try {
      work.fn();
    } catch (...) {
      recordFailure(work.name, work.index, std::current_exception());
    }
    work.fn = nullptr;  // what it captured is released here, on this thread
    if (traced) {
      tracing::recordExecution(work.stamp, work.kind, work.name, device_, id_, start, tracing::nowNs(), work.bytes,
                               work.copy_kind);
    }
  }

  void recordFailure(const char* name, uint64_t index, std::exception_ptr error) {
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
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_ || failure_->reported.load()) failure_ = std::move(failure);
  }

  void throwPendingError() {
    std::shared_ptr<KernelFailure> failure;
    {
      std::lock_guard<std::mutex> lock(failure_mutex_);
      failure.swap(failure_);
    }
    if (failure && failure->claim()) throw KernelError(std::move(failure));
  }

  const int device_;
  const int64_t id_;
  const int priority_;
  Arena& arena_;
  const bool blocking_;

  std::mutex mutex_;
  std::condition_variable work_cv_;  // work to do, a hold released, or stopping
  std::condition_variable idle_cv_;  // the stream went idle, or a hold was granted
  std::deque<Work> queue_;
  bool running_ = false;  // the worker runs work, or a thread holds the stream
  std::thread::id holder_;
  int hold_depth_ = 0;
  bool stopping_ = false;
  std::thread worker_;
  std::atomic<uint64_t> submitted_{0};
  std::atomic<uint64_t> completed_{0};

  std::mutex failure_mutex_;
  std::shared_ptr<KernelFailure> failure_;
};

// ---- events --------------------------------------------------------------------------

class MinimalEvent final : public Event {
 public:
  MinimalEvent(int device, bool timing, bool timing_supported)
      : device_(device), timing_(timing), timing_supported_(timing_supported) {}

  void record(Stream& stream) override {
    auto* recorder = dynamic_cast<MinimalStream*>(&stream);
    if (recorder == nullptr || recorder->device() != device_) {
      throw std::invalid_argument("minimal HAL: an event is recorded on a stream of its own device");
    }
    auto mark = std::make_shared<Mark>();
    mark->stream = recorder;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mark_ = mark;
    }
    recorder->submitMarker("event_record", [mark, recorder] { mark->complete(recorder->pendingFailure()); });
  }

  bool query() override {
    auto mark = currentMark();
    return !mark || mark->isDone(nullptr);
  }

  void synchronize() override {
    auto mark = currentMark();
    if (!mark) return;
    mark->waitDone();
    std::shared_ptr<KernelFailure> failure;
    mark->isDone(&failure);
    if (failure && failure->claim()) throw KernelError(std::move(failure));
  }

  bool recorded() const override { return currentMark() != nullptr; }
  int device() const override { return device_; }

  double elapsedMs(Event& end_event) override {
    if (!timing_supported_) return Event::elapsedMs(end_event);  // the HAL's default: not supported
    auto* end = dynamic_cast<MinimalEvent*>(&end_event);
    if (end == nullptr) throw std::invalid_argument("minimal HAL: elapsed time between events of two HALs");
    if (!timing_ || !end->timing_) throw std::logic_error("elapsed time needs two events created with timing");
    auto start_mark = currentMark();
    auto end_mark = end->currentMark();
    if (!start_mark || !end_mark) throw std::logic_error("elapsed time needs both events recorded");
    if (!start_mark->isDone(nullptr) || !end_mark->isDone(nullptr)) {
      throw std::logic_error("elapsed time needs both events completed; synchronize them first");
    }
    std::chrono::steady_clock::time_point from, to;
    {
      std::lock_guard<std::mutex> lock(start_mark->mutex);
      from = start_mark->when;
    }
    {
      std::lock_guard<std::mutex> lock(end_mark->mutex);
      to = end_mark->when;
    }
    return std::chrono::duration<double, std::milli>(to - from).count();
  }

  std::shared_ptr<Mark> currentMark() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return mark_;
  }

 private:
  const int device_;
  const bool timing_;
  const bool timing_supported_;  // the timing_events capability
  mutable std::mutex mutex_;
  std::shared_ptr<Mark> mark_;
};

void MinimalStream::wait(Event& event) {
  auto* other = dynamic_cast<MinimalEvent*>(&event);
  if (other == nullptr) throw std::invalid_argument("minimal HAL: a stream waits on an event of another HAL");
  auto mark = other->currentMark();
  if (!mark || mark->stream == this) return;  // nothing to wait for, or already in order
  std::shared_ptr<KernelFailure> failure;
  if (mark->isDone(&failure)) {
    adoptFailure(failure);
    return;
  }
  submitMarker("event_wait", [this, mark] {
    mark->waitDone();
    std::shared_ptr<KernelFailure> carried;
    mark->isDone(&carried);
    adoptFailure(carried);
  });
}

// ---- devices and the HAL --------------------------------------------------------------

class MinimalDevice final : public Device {
 public:
  MinimalDevice(int index, std::size_t capacity, bool blocking, bool optional_methods)
      : index_(index), blocking_(blocking), optional_methods_(optional_methods), arena_(capacity) {
    properties_.name = "Minimal NPU (tests/runtime/minimal_hal)";
    properties_.total_memory = capacity;
    properties_.compute_units = 1;
    streams_.push_back(std::make_unique<MinimalStream>(index, 0, 0, arena_, blocking_));
    default_stream_ = streams_.front().get();
  }

  int index() const override { return index_; }
  const DeviceProperties& properties() const override { return properties_; }
  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_addressable = false;
    caps.async_streams = !blocking_;
    caps.multiple_streams = optional_methods_;
    caps.timing_events = optional_methods_;
    caps.stream_priorities = false;
    caps.op_queries = optional_methods_;
    return caps;
  }

  // It has no kernels: it answers that it serves no op, so every op takes the
  // CPU fallback, whose copies it serves (Capabilities::op_queries).
  OpSupport supportsOp(const std::string& /*op*/, const std::vector<std::string>& /*dtypes*/) const override {
    return optional_methods_ ? OpSupport::Unsupported : OpSupport::Unknown;
  }

  void* allocate(std::size_t n) override { return arena_.allocate(n); }
  void free(void* ptr) override {
    if (ptr != nullptr) arena_.free(ptr);
  }
  bool owns(const void* ptr) const override { return arena_.owns(ptr); }
  void memoryInfo(std::size_t* free, std::size_t* total) const override {
    *total = arena_.capacity();
    *free = arena_.capacity() - arena_.inUse();
  }

  Stream& defaultStream() override { return *default_stream_; }
  Stream& createStream(int priority) override {
    if (!optional_methods_) return Device::createStream(priority);  // the HAL's default: not supported
    std::lock_guard<std::mutex> lock(streams_mutex_);
    const auto id = static_cast<int64_t>(streams_.size());
    streams_.push_back(std::make_unique<MinimalStream>(index_, id, priority, arena_, blocking_));
    return *streams_.back();
  }
  Stream& stream(int64_t id) override {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    if (id < 0 || id >= static_cast<int64_t>(streams_.size())) {
      throw std::out_of_range("minimal HAL: device " + std::to_string(index_) + " has no stream " + std::to_string(id));
    }
    return *streams_[static_cast<std::size_t>(id)];
  }
  std::unique_ptr<Event> createEvent(bool timing) override {
    return std::make_unique<MinimalEvent>(index_, timing, optional_methods_);
  }

  void synchronize() override {
    std::exception_ptr first;
    for (auto* s : allStreams()) {
      try {
        s->synchronize();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  void drain() override {
    for (auto* s : allStreams()) s->drain();
  }

 private:
  std::vector<MinimalStream*> allStreams() {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    std::vector<MinimalStream*> out;
    for (auto& s : streams_) out.push_back(s.get());
    return out;  // in id order
  }

  const int index_;
  const bool blocking_;
  const bool optional_methods_;
  DeviceProperties properties_;
  Arena arena_;  // before streams_: destroyed after them (their workers copy into it)
  std::mutex streams_mutex_;
  std::vector<std::unique_ptr<MinimalStream>> streams_;  // index == id
  MinimalStream* default_stream_ = nullptr;
};

class MinimalHal final : public Hal {
 public:
  MinimalHal(int devices, std::size_t capacity, bool optional_methods) {
    const char* blocking = std::getenv("NPU_LAUNCH_BLOCKING");
    const bool block = blocking != nullptr && std::string(blocking) == "1";
    for (int i = 0; i < devices; ++i) {
      devices_.push_back(std::make_unique<MinimalDevice>(i, capacity, block, optional_methods));
    }
  }
  std::string name() const override { return "minimal"; }
  int deviceCount() const override { return static_cast<int>(devices_.size()); }
  Device& device(int index) override {
    if (index < 0 || index >= deviceCount()) {
      throw std::out_of_range("minimal HAL: there is no device " + std::to_string(index));
    }
    return *devices_[static_cast<std::size_t>(index)];
  }
  void* hostAllocate(std::size_t n) override {
    if (n > (std::size_t(1) << 40)) return nullptr;  // more than any test asks: no attempt (sanitizers abort on it)
    return std::aligned_alloc(kHostAlignment, (std::max<std::size_t>(n, 1) + kHostAlignment - 1) / kHostAlignment *
                                                  kHostAlignment);
  }
  void hostFree(void* ptr) override { std::free(ptr); }

 private:
  std::vector<std::unique_ptr<MinimalDevice>> devices_;
};

}  // namespace

std::unique_ptr<Hal> makeMinimalHal(int devices, std::size_t capacity, bool optional_methods) {
  return std::make_unique<MinimalHal>(devices, capacity, optional_methods);
}

}  // namespace npu::runtime::minimal
