// The hardware abstraction layer (HAL): the only interface between torch_npu and
// a device. Plain C++17, no ATen. The emulated NPU (runtime/emu) implements it;
// a vendor implements it again to drive real silicon and nothing above changes.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace npu::runtime {

// A kernel is work executed in stream order. It may throw; the error is kept by
// the stream and raised at the next synchronisation point, naming the kernel.
using Kernel = std::function<void()>;

// A non-owning reference to a callable that runs before the call returns
// (Stream::runIfIdle): no allocation, unlike a Kernel.
class KernelRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, KernelRef>>>
  KernelRef(F&& f)  // NOLINT: implicit, like std::function's
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o) { (*static_cast<std::remove_reference_t<F>*>(o))(); }) {}
  void operator()() const { call_(object_); }

 private:
  void* object_;
  void (*call_)(void*);
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

struct DeviceProperties {
  std::string name;
  std::size_t total_memory = 0;
  int compute_units = 0;  // cores that execute kernels
  int major = 1;
  int minor = 0;
};

// A kernel that failed: kept by its stream (and by events recorded after it, and
// by streams that waited on those) until one synchronisation point reports it.
// `cause` is the kernel's own exception, so the layer above can keep its type.
struct KernelFailure {
  std::string kernel;
  int device = 0;
  int64_t stream = 0;
  uint64_t launch_index = 0;  // the kernel's position among its stream's launches
  std::string message;        // the cause's what()
  std::exception_ptr cause;
  // Set by whichever synchronisation point raises it first: one failure is
  // reported once, wherever it travelled.
  std::atomic<bool> reported{false};
  bool claim() { return !reported.exchange(true); }
};

// Raised at a synchronisation point for a kernel that failed earlier.
class KernelError : public std::runtime_error {
 public:
  explicit KernelError(std::shared_ptr<const KernelFailure> failure)
      : std::runtime_error("npu kernel '" + failure->kernel + "' failed: " + failure->message),
        failure_(std::move(failure)) {}
  const std::string& kernel() const { return failure_->kernel; }
  const KernelFailure& failure() const { return *failure_; }

 private:
  std::shared_ptr<const KernelFailure> failure_;
};

class Event;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual int device() const = 0;
  // 0 is the device's default stream; other ids are unique per device.
  virtual int64_t id() const = 0;
  virtual int priority() const = 0;

  // Queues `kernel` after all work already on this stream and returns; it may
  // also run it at once on the caller's thread when that keeps the same order.
  // `bytes` is a hint of how much memory the kernel touches. A kernel's error
  // is kept and raised by the next synchronisation point (see KernelFailure).
  virtual void launch(const char* name, Kernel kernel, std::size_t bytes = 0) = 0;
  // When the stream would run `kernel` on the caller's thread now (it is idle
  // and the launch policy allows it), runs it there and returns true; its
  // exception, if any, propagates to the caller. Otherwise runs nothing and
  // returns false (the caller checks what it can, then launch()es).
  virtual bool runIfIdle(const char* name, KernelRef kernel, std::size_t bytes = 0) = 0;
  // Stream-ordered copy between host and device memory (or device and device).
  virtual void copy(void* dst, const void* src, std::size_t n, CopyKind kind) = 0;

  // Work that runs on the host thread in stream order: acquire() returns once
  // every kernel launched before it ran, and until release() the calling
  // thread holds the stream: kernels launched by other threads queue behind,
  // kernels launched by the holder run at once, synchronize() from the holder
  // returns at once. Re-entrant on the holding thread. Blocks: release the GIL.
  virtual void acquire() = 0;
  virtual void release() = 0;
  virtual bool heldByCaller() const = 0;

  // Blocks until every kernel on the stream ran; throws the first KernelError.
  virtual void synchronize() = 0;
  // Blocks like synchronize() but leaves a kernel's error for a later one.
  virtual void drain() = 0;
  // True when every queued kernel has finished.
  virtual bool query() = 0;
  // Work launched after this call starts only once `event` has completed. A
  // marker in the stream: never blocks the caller. A failure the event carries
  // becomes this stream's.
  virtual void wait(Event& event) = 0;

  // How many kernels were launched on the stream so far, and whether those up
  // to `position` have all completed: lets the allocator tell whether the
  // work that used a freed block is done.
  virtual uint64_t position() const = 0;
  virtual bool passed(uint64_t position) const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Marks the point in `stream` reached by the work queued so far.
  virtual void record(Stream& stream) = 0;
  virtual bool query() = 0;        // recorded work done (true if never recorded)
  virtual void synchronize() = 0;  // waits for it; throws a KernelError it carries
  virtual bool recorded() const = 0;
  virtual int device() const = 0;
  // Milliseconds between this event and `end`; both must have completed and
  // have been created with timing enabled.
  virtual double elapsedMs(Event& end) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual const DeviceProperties& properties() const = 0;

  // Device memory. Returns nullptr when the device has no room left (the caller,
  // the caching allocator, frees its cache and retries before reporting an OOM).
  virtual void* allocate(std::size_t n) = 0;
  virtual void free(void* ptr) = 0;
  virtual bool owns(const void* ptr) const = 0;
  virtual void memoryInfo(std::size_t* free, std::size_t* total) const = 0;
  // Whether host code may read and write this device's memory directly (unified
  // or host-mapped memory), in stream order: once the stream's work is done.
  // Without it, data reaches the host only through copies.
  virtual bool hostAddressable() const { return false; }

  virtual Stream& defaultStream() = 0;
  virtual Stream& createStream(int priority) = 0;  // lives as long as the device
  virtual Stream& stream(int64_t id) = 0;          // throws std::out_of_range
  virtual std::unique_ptr<Event> createEvent(bool timing) = 0;
  virtual void synchronize() = 0;  // every stream of the device
  virtual void drain() = 0;        // the same, leaving kernel errors pending
};

class Hal {
 public:
  virtual ~Hal() = default;
  virtual std::string name() const = 0;
  virtual int deviceCount() const = 0;
  virtual Device& device(int index) = 0;  // throws std::out_of_range
  // Page-locked host memory for asynchronous copies.
  virtual void* hostAllocate(std::size_t n) = 0;
  virtual void hostFree(void* ptr) = 0;
};

// The process-wide HAL: the emulated NPU unless a vendor installed another one
// with setHal() before first use.
Hal& hal();
void setHal(std::unique_ptr<Hal> hal);

}  // namespace npu::runtime
