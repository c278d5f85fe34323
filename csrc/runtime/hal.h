// The hardware abstraction layer (HAL): the only interface between torch_npu and
// a device, and the contract a vendor implements to drive real silicon. Plain
// C++17, no ATen. The emulated NPU (csrc/emu) implements it; nothing above
// this file changes when another implementation replaces it (docs/design/01-hal.md).
//
// ---- The contract ---------------------------------------------------------------
//
// An implementation provides the four classes below (Hal, Device, Stream, Event),
// states the API version it was written against and registers a factory under a
// name (registerHal), or ships as a shared library with a C entry point
// (hal_plugin.h). NPU_HAL names the one the process uses, by its name or by the
// library's path; "emu" by default.
//
// * Required and optional methods. Required methods are pure virtual. An
//   optional method has a body that behaves as a device without the feature
//   would: Stream::runIfIdle() runs nothing and returns false; the others throw
//   Unsupported, "<what> is not supported by this HAL (<implementation>)", as
//   c10's DeviceGuardImplInterface does. A vendor HAL compiles with the required
//   methods alone. Device::capabilities() says, as data, which optional
//   features a device has; the layers above read it, they never try and catch.
// * Threads. Every method may be called from any thread, concurrently, unless
//   its comment says otherwise. Devices, streams and events are used through
//   references that stay valid: a Device and its Streams live as long as the
//   Hal, and the process-wide Hal is never destroyed (stream workers may
//   outlive static destruction at exit).
// * Kernels. A Kernel is a host closure that the HAL runs in stream order: it
//   starts after everything launched before it on the stream has completed, and
//   work launched after it starts after it has returned. Which host thread runs
//   it (the caller's, a worker's, a driver callback's) is the HAL's choice. The
//   op library's kernels (csrc/ops: the host kernel backend) compute on host
//   memory aliases of device memory (cpuAlias) and refuse, naming the op and the
//   HAL, on a device with neither Capabilities::host_addressable nor
//   host_kernels; such a device supplies its own kernels behind the same
//   registrations, or answers Device::supportsOp so ops it lacks fall back.
// * Errors (docs/design/03-core.md). A kernel that throws does not make launch() throw: the
//   stream keeps the failure (KernelFailure, the first one not yet reported) and
//   the next synchronisation point that depends on it raises it as a
//   KernelError, once: Stream::synchronize, Device::synchronize, the
//   synchronize of an event recorded after it, or of a stream that waited on
//   such an event. query() and drain() neither raise nor consume it. With
//   NPU_LAUNCH_BLOCKING=1 in the environment when the HAL is created, every
//   launch instead completes before it returns and raises its (or an earlier)
//   failure there.
// * The profiling duty (docs/design/10-profiler.md). While tracing::enabled(), a HAL reports
//   to runtime/tracing.h what it executes, so that every HAL gives a device
//   timeline: one Kernel activity per kernel and one Memcpy activity per copy
//   (named by tracing::copyName), timed where it ran, on the profiler's clock
//   (tracing::nowNs(); a device converts its own timestamps), carrying the
//   correlation id, thread and time of its launch, stamped at launch() or copy()
//   on the launching thread (tracing::LaunchStamp::now()); and one Synchronize
//   activity per host wait for a stream that blocked (synchronize and drain:
//   tracing::kStreamSynchronize; acquire: tracing::kStreamWait), on the waiting
//   thread. Event markers and waits between streams are not reported.
//   tracing::recordExecution() and tracing::recordHostWait() do the bookkeeping.
//
// ---- Mechanisms that serve the layers above ----------------------------------
//
// The emulator's mechanisms that the layers above rely on are part of the
// contract; each comment below says who needs it and what a vendor guarantees:
// holding a stream for host work (Stream::acquire/release, required), running
// on the caller's thread when idle (Stream::runIfIdle, optional), stream
// positions (Stream::position/passed, required), and waiting without consuming
// an error (Stream::drain, Device::drain, required). What the emulator alone
// needs stays in csrc/emu: its launch policy (NPU_EMU_ALWAYS_ENQUEUE,
// NPU_EMU_INLINE_BYTES), its worker threads, and EmuStream::heldByCaller(),
// which no layer above asks (csrc/core tracks its own holds).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace npu::runtime {

// ---- Versioning -------------------------------------------------------------------

// The version of this contract. An implementation passes the value it was
// compiled against to registerHal(), which refuses any other. Bumped by every
// change an implementation has to follow: a method added, removed or changed in
// meaning, a Capabilities field added.
//   1: the unversioned HAL (a hostAddressable() predicate, setHal() only).
//   2: Capabilities, optional methods, the registry, the profiling duty stated.
//   3: Capabilities::interprocess and its optional methods (exportMemory,
//      openMemory, closeMemory, createInterprocessEvent, openEvent, ipcHandle).
//   4: Capabilities::virtual_memory and its optional methods
//      (virtualMemoryGranularity, reserveAddress, mapMemory, unmapMemory,
//      releaseAddress).
//   5: Capabilities::op_queries and Device::supportsOp; HALs as shared
//      libraries (hal_plugin.h), Capabilities::host_kernels. A version-4 HAL
//      registers unchanged and nothing calls its missing supportsOp; one that is
//      not host_addressable has host_kernels false, so the host kernel backend
//      refuses its ops by name instead of reaching memory it cannot.
constexpr int kHalApiVersion = 5;
// The oldest version registerHal() and the plugin loader still accept.
constexpr int kMinimumHalApiVersion = 4;

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
  std::size_t total_memory = 0;  // the capacity: memoryInfo()'s total
  int compute_units = 0;         // cores that execute kernels
  int major = 1;
  int minor = 0;
};

// What a device can do, as data. Each flag names the optional methods it
// stands for; a flag that is false means those methods throw Unsupported (or
// keep their default body).
struct Capabilities {
  // Host code may read and write the device's memory in place (unified or
  // host-mapped memory), in stream order: once the stream's work on it is
  // done. The collectives then hand Gloo the memory itself instead of a staged
  // copy (csrc/distributed, docs/design/11-distributed.md), and the op library's kernels, which
  // compute on cpuAlias()es of device memory, need it. False: data reaches the
  // host only through Stream::copy.
  bool host_addressable = false;
  // launch(), copy() and wait() may return before the work ran, so the host
  // overlaps the device. False: each has completed when the call returns (a
  // synchronous device, or NPU_LAUNCH_BLOCKING=1).
  bool async_streams = false;
  // Device::createStream(): streams besides the default one (torch.npu.Stream,
  // the stream pool of csrc/core). False: only stream 0 exists.
  bool multiple_streams = false;
  // Event::elapsedMs() for events created with timing enabled
  // (torch.npu.Event(enable_timing=True), the legacy profiler's op timing).
  bool timing_events = false;
  // A stream's priority changes how the device schedules it. False: the
  // priority is kept (Stream::priority) but does not schedule, as on the
  // emulator. Informational: nothing above depends on it.
  bool stream_priorities = false;
  // Another process may map this device's memory and open its events
  // (Device::exportMemory, openMemory, closeMemory, createInterprocessEvent,
  // openEvent; Event::ipcHandle), as CUDA's IPC handles allow: what
  // torch.multiprocessing needs to send an npu tensor to another process on
  // the same memory. False: those methods throw Unsupported, and sending an
  // npu tensor to another process raises, naming the HAL.
  bool interprocess = false;
  // Address space can be reserved without memory, and device memory committed
  // to and taken back from parts of it (Device::virtualMemoryGranularity,
  // reserveAddress, mapMemory, unmapMemory, releaseAddress), as CUDA's virtual
  // memory management (cuMemAddressReserve, cuMemMap) allows: what the caching
  // allocator's expandable segments need to grow a segment in place. False:
  // those methods throw Unsupported, and expandable_segments:True warns once
  // and allocates as with False.
  bool virtual_memory = false;
  // (version 5) Host code that runs as a kernel, in stream order, may read and
  // write the device's memory in place, even where host code outside kernels
  // may not (the emulator under NPU_EMU_PROTECT opens its memory to its own
  // workers only). The host kernel backend (the op library of csrc/ops) computes there and
  // needs this or host_addressable; without both every op it serves refuses,
  // naming the op and the HAL.
  bool host_kernels = false;
  // (version 5) Device::supportsOp answers whether the device's kernels serve
  // an op with given dtypes. The dispatch layer asks it before the chip
  // profile (csrc/core/profile.h): an op the HAL refuses takes the CPU
  // fallback. False: nothing asks, and the chip profile alone decides.
  bool op_queries = false;
};

// The answer of Device::supportsOp.
enum class OpSupport {
  Unknown,      // no opinion: the chip profile decides
  Supported,    // the device runs the op (with these dtypes) natively
  Unsupported,  // it does not: the op takes the CPU fallback
};

// Thrown by an optional method that an implementation does not override.
class Unsupported : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws Unsupported: "<what> is not supported by this HAL (<implementation>)",
// where <implementation> is the class that did not override the method
// (typeid(*this) in the default bodies).
[[noreturn]] void throwUnsupported(const char* what, const std::type_info& implementation);

// A kernel that failed: kept by its stream (and by events recorded after it, and
// by streams that waited on those) until one synchronisation point reports it.
// `cause` is the kernel's own exception, so the layer above can keep its type.
struct KernelFailure {
  std::string kernel;
  int device = 0;
  int64_t stream = 0;
  uint64_t launch_index = 0;  // the kernel's position among its stream's launches (from 1)
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
  virtual int priority() const = 0;  // as given to createStream (lower is more urgent)

  // Queues `kernel` after all work already on this stream and returns; it may
  // also run it at once on the caller's thread when that keeps the same order.
  // `name` has static storage (an op name or a literal): traces keep the
  // pointer. `bytes` is a hint of how much memory the kernel touches. A
  // kernel's error is kept and raised by the next synchronisation point (see
  // KernelFailure). The stream drops the closure (what it captured) once it has
  // run, on the thread that ran it. A HAL may bound its queue: a launch onto a
  // full queue waits for room, as a device's launch queue makes the host wait.
  virtual void launch(const char* name, Kernel kernel, std::size_t bytes = 0) = 0;

  // Optional (default: runs nothing, returns false). When the stream would run
  // `kernel` on the caller's thread now, in stream order (nothing queued or
  // running), runs it there and returns true; its exception, if any,
  // propagates to the caller instead of being kept. Otherwise runs nothing and
  // returns false, and the caller checks what it can, then launch()es.
  // Who needs it: in-place ops on an idle stream raise every error, data-
  // dependent ones included, at the call, and skip the hand-off (docs/design/02-emulated-npu.md).
  // Returning false is always correct; a HAL whose kernels cannot run on the
  // host keeps the default.
  virtual bool runIfIdle(const char* name, KernelRef kernel, std::size_t bytes = 0);

  // Stream-ordered copy of `n` bytes between host and device memory of this
  // stream's device, or within it; n == 0 does nothing. Host memory may be
  // pageable or from Hal::hostAllocate; the caller keeps it alive until the
  // copy has completed (csrc/core records the pinned block's use).
  virtual void copy(void* dst, const void* src, std::size_t n, CopyKind kind) = 0;

  // Holding the stream for host work (required). acquire() returns once every
  // kernel launched before it has run; until release() the calling thread
  // holds the stream:
  //   - work other threads launch meanwhile queues behind the hold;
  //   - work the holder launches (launch, copy, record, wait) runs at once, on
  //     the holder's thread, in stream order, so it never waits for itself;
  //   - the holder's synchronize() and drain() return at once (synchronize
  //     still raises a kept failure), and query() is true for it;
  //   - acquire() is re-entrant on the holding thread (one release() each).
  // acquire() blocks: callers release the GIL. Who needs it: host code in
  // stream order (csrc/core's StreamHold): ops whose output shapes depend on the
  // data, synchronous copies (.cpu(), .item()), the CPU fallback (docs/design/03-core.md).
  // A vendor can implement it as the emulator does: a marker queued behind the
  // stream's work that, when the device reaches it, hands the stream to the
  // waiting thread and blocks the queue until release() (a host callback that
  // waits, on hardware). A hold is not a launch: it takes no position.
  virtual void acquire() = 0;
  virtual void release() = 0;

  // Blocks until every kernel on the stream ran; throws the first KernelError.
  virtual void synchronize() = 0;
  // Blocks like synchronize() but leaves a kernel's error for a later one
  // (required). Who needs it: the caching allocator before it gives memory
  // back to the device and the profiler before it stops wait for the device,
  // and an error found there belongs to the user's next synchronisation point
  // (docs/design/03-core.md), which still raises it.
  virtual void drain() = 0;
  // True when every queued kernel has finished. Never raises nor consumes a
  // kept failure.
  virtual bool query() = 0;
  // Work launched after this call starts only once `event` has completed. A
  // marker in the stream: never blocks the caller (the holder excepted). A
  // failure the event carries becomes this stream's. An event never recorded,
  // or recorded on this stream, needs no wait.
  virtual void wait(Event& event) = 0;

  // Stream positions (required). position() counts the work submitted to the
  // stream so far: every launch, copy and event marker adds at least one, in
  // submission order (what the holder runs at once may add none); passed(p) is
  // true once everything counted up to `p` has completed, and stays true.
  // Who needs them: the caching allocator stamps a freed block with its
  // stream's position, one load per free instead of an event, and hands the
  // block to host code, or gives its segment back to the device, only once
  // passed(); a device implements them with a counter it bumps at submission
  // and one it bumps, in order, at completion (a timeline fence).
  virtual uint64_t position() const = 0;
  virtual bool passed(uint64_t position) const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Marks the point in `stream` (of this event's device and HAL) reached by the
  // work queued so far; recording again moves the mark.
  virtual void record(Stream& stream) = 0;
  virtual bool query() = 0;        // recorded work done (true if never recorded)
  virtual void synchronize() = 0;  // waits for it; throws a KernelError it carries
  virtual bool recorded() const = 0;
  virtual int device() const = 0;
  // Optional (Capabilities::timing_events). Milliseconds between this event
  // and `end`; both must have been created with timing enabled, recorded and
  // completed, or it throws std::logic_error saying which is missing.
  virtual double elapsedMs(Event& end);
  // Optional (Capabilities::interprocess). A handle another process passes
  // to Device::openEvent for an event made by createInterprocessEvent (any
  // other event throws std::logic_error). Opaque bytes of at most 64.
  virtual std::string ipcHandle();
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual const DeviceProperties& properties() const = 0;
  // What this device can do; the same value for the device's lifetime.
  virtual Capabilities capabilities() const = 0;

  // Device memory. Returns nullptr when the device has no room left (the caller,
  // the caching allocator, frees its cache and retries before reporting an OOM),
  // including for sizes no device could hold.
  virtual void* allocate(std::size_t n) = 0;
  // Frees a pointer allocate() returned; nullptr does nothing. Any other
  // pointer (another device's, an interior one, a double free) throws
  // std::invalid_argument and changes nothing.
  virtual void free(void* ptr) = 0;
  // Whether `ptr` lies inside a live allocation of this device (interior
  // pointers too): tells which device a data pointer belongs to.
  virtual bool owns(const void* ptr) const = 0;
  // Free bytes and the capacity (properties().total_memory).
  virtual void memoryInfo(std::size_t* free, std::size_t* total) const = 0;

  // Sharing memory between processes: optional (Capabilities::interprocess).
  // Who needs it: torch.multiprocessing sends an npu tensor as the handle of
  // the allocation holding it (csrc/core/ipc.cpp, docs/design/03-core.md).
  //   exportMemory(ptr, &offset): a handle (opaque bytes, at most 64) of the
  //     live allocation of this device holding `ptr` (interior pointers too),
  //     and ptr's offset in it; std::invalid_argument for a pointer it does
  //     not own. Valid while the allocation lives and its process runs.
  //   openMemory(handle), in any process (this one too): the allocation's
  //     base, mapped so that writes on either side are visible to the other
  //     once the writer's stream work completed (ordering across processes is
  //     the events' job). Opening a handle again before closing it may return
  //     the same base; each open needs one closeMemory. A handle whose
  //     process exited or whose memory is gone throws std::runtime_error.
  //   closeMemory(base): unmaps what openMemory returned (once its users'
  //     stream work completed: the caller's duty); the exporting process may
  //     free the allocation only once every opener closed it (the layer above
  //     counts references, as CUDA's do).
  virtual std::string exportMemory(const void* ptr, std::size_t* offset);
  virtual void* openMemory(const std::string& handle);
  virtual void closeMemory(void* base);
  // An event without timing whose ipcHandle() another process opens with
  // openEvent(): the opened event tracks the same event. record() in either
  // process moves the mark; query(), synchronize() and Stream::wait() see the
  // latest record made before the call in any process. Failures (KernelFailure)
  // do not cross processes: the opener sees the mark complete.
  virtual std::unique_ptr<Event> createInterprocessEvent();
  virtual std::unique_ptr<Event> openEvent(const std::string& handle);

  // Virtual memory: optional (Capabilities::virtual_memory). Who needs it: the
  // caching allocator's expandable segments (docs/design/04-memory.md), one reservation per
  // stream that grows in place by committing pages at its end.
  //   virtualMemoryGranularity(): the page size; reservations, and the
  //     offsets and sizes of maps and unmaps, are multiples of it.
  //   reserveAddress(size): `size` bytes of address space (a multiple of the
  //     granularity, non-zero), none of it committed (counted by neither
  //     memoryInfo nor owns); nullptr when no address space is left.
  //   mapMemory(ptr, size): commits device memory to [ptr, ptr + size), which
  //     lies in one reservation and has no page committed yet; it counts
  //     against the capacity as allocate() does: false, committing nothing,
  //     when the device has no room (the allocator frees its cache and
  //     retries). Committed memory is device memory like allocate()'s (owns()
  //     is true for it, kernels and copies use it); its contents are
  //     unspecified. A range outside a reservation, misaligned, or with a page
  //     already committed throws std::invalid_argument and changes nothing.
  //   unmapMemory(ptr, size): gives the committed pages of [ptr, ptr + size)
  //     back to the device (memoryInfo's free grows; their contents are lost),
  //     once their users' stream work completed (the caller's duty); every
  //     page must be committed, else std::invalid_argument, nothing changed.
  //   releaseAddress(base): gives back a reservation reserveAddress returned,
  //     committed pages too; any other pointer throws std::invalid_argument.
  // Committed pages of a reservation need not be exportable (exportMemory may
  // throw std::invalid_argument saying so): the emulator's are not.
  virtual std::size_t virtualMemoryGranularity() const;
  virtual void* reserveAddress(std::size_t size);
  virtual bool mapMemory(void* ptr, std::size_t size);
  virtual void unmapMemory(void* ptr, std::size_t size);
  virtual void releaseAddress(void* base);

  // Optional (Capabilities::op_queries, version 5; default: Unknown). Whether
  // this device's kernels serve the aten operator `op` ("aten::add.Tensor",
  // overload included; "aten::add" when no overload) computing in `dtypes`
  // (c10's names: "Float", "BFloat16", ...; empty: whatever dtypes). Called
  // from dispatch, rarely: the answer is cached per (op, dtypes), so it must
  // not change for the device's lifetime. Must not throw.
  virtual OpSupport supportsOp(const std::string& op, const std::vector<std::string>& dtypes) const;

  virtual Stream& defaultStream() = 0;
  // Optional (Capabilities::multiple_streams). A new stream, alive as long as
  // the device.
  virtual Stream& createStream(int priority);
  virtual Stream& stream(int64_t id) = 0;  // throws std::out_of_range
  virtual std::unique_ptr<Event> createEvent(bool timing) = 0;
  // Every stream of the device; after waiting for all of them, throws the
  // failure of the lowest stream id that has one (the others are consumed).
  virtual void synchronize() = 0;
  virtual void drain() = 0;  // the same, leaving kernel errors pending
};

class Hal {
 public:
  virtual ~Hal() = default;
  // A name for people (messages, torch_npu._C._hal_name()).
  virtual std::string name() const = 0;
  virtual int deviceCount() const = 0;
  virtual Device& device(int index) = 0;  // throws std::out_of_range
  // Host memory for asynchronous copies (pin_memory()): page-locked where the
  // device needs that; nullptr when it cannot allocate.
  virtual void* hostAllocate(std::size_t n) = 0;
  virtual void hostFree(void* ptr) = 0;
};

// ---- The registry -----------------------------------------------------------------

using HalFactory = std::function<std::unique_ptr<Hal>()>;

// The HAL a process uses when NPU_HAL is unset or empty: the emulated NPU.
constexpr const char* kDefaultHal = "emu";

// Registers `factory` under `name` (letters, digits and '_'). Throws
// std::invalid_argument for a malformed or taken name, and for an
// `api_version` outside [kMinimumHalApiVersion, kHalApiVersion] (pass
// kHalApiVersion as your implementation sees it): methods added after that
// version are never called on its HALs. A factory reads its own settings (environment
// variables) each time it runs and throws std::invalid_argument naming a bad
// one.
//
// Registering. The HALs compiled into the runtime library (the emulator) are
// registered by registerBuiltinHals() in builtin_hals.cpp, which the registry
// calls itself before its first lookup: an explicit call, because the linker
// drops the object files of a static library that nothing references, and a
// registrar object in them would never run. A vendor adds a line there, or
// calls registerHal() before the npu is first used, from code that is linked
// for certain (an object file linked directly into the program, as the test
// suite's tests/runtime/conformance_hals.cpp is, or the extension's init), or
// ships a shared library that NPU_HAL names (hal_plugin.h).
void registerHal(const std::string& name, int api_version, HalFactory factory);
// The version `name` was registered with; 0 for an unknown name.
int registeredApiVersion(const std::string& name);
// The registered names, sorted.
std::vector<std::string> registeredHals();
// A new HAL made by the factory registered under `name`; an unknown name throws
// std::invalid_argument listing the registered ones. Not the process-wide HAL:
// the conformance suite makes one per test.
std::unique_ptr<Hal> createHal(const std::string& name);
// NPU_HAL selects a HAL by name or by path:
//   - a registered name ("emu", or one a vendor registered);
//   - a path to a shared library (it contains '/' or ends in ".so"), loaded
//     with loadHalLibrary();
//   - another name <n> loads libnpu_hal_<n>.so from the library search path
//     (LD_LIBRARY_PATH, ...), when there is one.
// createHalFromEnvironment() makes createHal(NPU_HAL, or kDefaultHal when unset
// or empty); a name that is neither registered nor a loadable library throws
// std::invalid_argument naming NPU_HAL, the registered names and why loading
// failed.
std::unique_ptr<Hal> createHalFromEnvironment();
// Loads the HAL library at `path` (dlopen), calls its entry point
// (NPU_HAL_PLUGIN_ENTRY, hal_plugin.h) and registers the HAL it describes;
// returns its name. Loading the same path again returns the same name.
// Throws std::invalid_argument saying what is wrong: no such file, no entry
// point, an API version outside the accepted range, a name already taken.
std::string loadHalLibrary(const std::string& path);
// The API version of the process-wide HAL (hal()) as registered.
int halApiVersion();

// The process-wide HAL: the one setHal() installed, or else
// createHalFromEnvironment()'s, made on first use. An error there (a bad
// NPU_HAL, or a bad setting of that HAL) propagates, and the next call tries
// again; torch_npu reports it at import (_C._runtime_environment_error()).
Hal& hal();
// Installs `hal` as the process-wide HAL, for a vendor that builds its HAL
// itself instead of registering a factory; NPU_HAL is then not read. Throws
// std::logic_error once the process-wide HAL exists.
void setHal(std::unique_ptr<Hal> hal, int api_version = kHalApiVersion);

// Device::supportsOp, asked only of a HAL whose version has it (5 and later)
// and whose device says Capabilities::op_queries; Unknown otherwise.
OpSupport askSupportsOp(const Device& device, const std::string& op, const std::vector<std::string>& dtypes);

}  // namespace npu::runtime
