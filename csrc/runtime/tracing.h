// Device activity tracing: the runtime's half of the profiler (what CUPTI is
// to a GPU). While tracing is on, every kernel and copy a stream executes is
// recorded with the time it started and ended where it executed, its stream,
// and the correlation id that was current on the thread that launched it (the
// profiler pushes the id of each op it records). Plain C++17, no ATen; the
// emulated NPU stamps activities with the host clock, a vendor's runtime with
// its device's timestamps converted to the same clock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hal.h"

namespace npu::runtime::tracing {

enum class ActivityKind {
  Kernel,       // device work: a kernel on a stream, or host code in stream order
  Memcpy,       // a copy between host and device memory, or within the device
  Synchronize,  // a host thread waiting for a stream (a hidden or explicit sync)
  Fallback,     // an op the device ran on the host CPU, holding the stream (bytes: copied both ways)
};

// What a piece of device work does, for a projection of its time on a real chip
// (the layer above the HAL describes it at launch, core/profile.h projects it).
// A HAL need not know of it: LaunchStamp::now() carries it.
struct Work {
  double flops = 0;      // arithmetic operations
  double bytes = 0;      // device memory read and written
  bool matrix = false;   // runs on the matrix (cube) unit
  uint8_t bits = 32;     // operand precision: 32, 16 (float16, bfloat16) or 8 (int8, int4)
  bool known = false;    // false: nothing described it (projected from its bytes alone)
};

struct Activity {
  ActivityKind kind = ActivityKind::Kernel;
  const char* name = "";  // static storage: literals, or intern()ed names
  int device = 0;
  int64_t stream = 0;
  uint64_t correlation = 0;  // 0: launched outside any profiled op
  int64_t start_ns = 0;      // nanoseconds since the epoch (system clock)
  int64_t end_ns = 0;
  std::size_t bytes = 0;
  CopyKind copy_kind = CopyKind::DeviceToDevice;  // for Memcpy
  // The host thread (the OS's id) that launched the work, or waited; and when
  // it launched it (start_ns for work that ran at once).
  int32_t host_thread = 0;
  int64_t launch_ns = 0;
  // What the work does (setNextWork()), and whether a graph replay launched it
  // (ReplayScope): a chip runs a replayed graph's kernels with less overhead.
  Work work;
  bool in_graph = false;
  // The launching thread waited for it: work it did itself while holding the
  // stream (a copy from pageable memory), not work queued for the device.
  bool host_synchronous = false;
};

namespace detail {
// The runtime's flag; in a HAL library (hal_plugin.h), the runtime's flag once
// the library is connected.
extern const std::atomic<bool>* g_enabled;
}

// Cheap enough to test on every launch.
inline bool enabled() { return detail::g_enabled->load(std::memory_order_relaxed); }

// Starts recording (dropping what an earlier session left); stop() ends it and
// returns the activities in the order they were recorded.
void start();
std::vector<Activity> stop();
void record(const Activity& activity);

// The calling thread's correlation ids, innermost last.
void pushCorrelation(uint64_t id);
void popCorrelation();
uint64_t currentCorrelation();

// What the next work the calling thread launches does (Activity::work): taken
// by the next LaunchStamp or Scope on this thread (or a graph capture's record,
// takeNextWork()), then cleared.
void setNextWork(const Work& work);
Work takeNextWork();
// setNextWork(work) for its lifetime: what no launch took is cleared at the end.
class WorkHint {
 public:
  explicit WorkHint(const Work& work) { setNextWork(work); }
  ~WorkHint() { setNextWork(Work{}); }
  WorkHint(const WorkHint&) = delete;
  WorkHint& operator=(const WorkHint&) = delete;
};

// Whether a ReplayScope lives on the calling thread.
bool replaying();
// While one lives on a thread, the work it launches is a graph replay's (Activity::in_graph).
class ReplayScope {
 public:
  ReplayScope();
  ~ReplayScope();
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;
};

// A name that lives as long as the process, for an activity whose name is not
// a literal (a generated kernel's, an op registered from Python that may go).
const char* intern(const std::string& name);

// While a profiler projects its trace onto a real chip (core/profile.h), the
// host's own time between launches is part of the projection. A HAL that runs
// device work on the host's cores (the emulator) keeps that work off the host's
// threads, and out of its caches, until the host waits for it. One relaxed load.
// NPU_EMU_DEFER=1 makes it always so (the tests of stream semantics run that way too).
void setProjecting(bool on);
bool projecting();

// The profiler's clock: nanoseconds since the epoch.
int64_t nowNs();
// The calling thread's id as the OS (and the profiler's trace) numbers it.
int32_t currentThreadId();

// ---- For HAL implementations: the profiling duty of hal.h ----------------------

// The names of host waits that the trace and torch_npu.profiler.analyse know.
constexpr const char* kStreamSynchronize = "npuStreamSynchronize";  // Stream::synchronize() / drain() that blocked
constexpr const char* kStreamWait = "npuStreamWait";                // Stream::acquire() behind queued work
// The name of a copy's Memcpy activity: "Memcpy HtoD", "Memcpy DtoH" or "Memcpy DtoD".
const char* copyName(CopyKind kind);

// The launching thread's half of an activity, stamped by launch() and copy() on
// that thread and kept with the queued work until it runs.
struct LaunchStamp {
  bool traced = false;       // tracing was on at the launch
  uint64_t correlation = 0;  // the launching thread's current correlation id
  int32_t host_thread = 0;
  int64_t launch_ns = 0;
  Work work;
  bool in_graph = false;
  bool host_synchronous = false;  // the launching thread does it itself, holding the stream
  // One relaxed load when tracing is off.
  static LaunchStamp now() {
    LaunchStamp stamp;
    if (enabled()) stamp.stampNow();
    return stamp;
  }

 private:
  void stampNow();
};

// Records work a HAL executed from `start_ns` to `end_ns` (its Kernel or
// Memcpy activity), launched as `stamp` says; nothing when the launch was not
// traced or tracing has stopped since.
void recordExecution(const LaunchStamp& stamp, ActivityKind kind, const char* name, int device, int64_t stream,
                     int64_t start_ns, int64_t end_ns, std::size_t bytes = 0,
                     CopyKind copy_kind = CopyKind::DeviceToDevice);
// Records a host wait of the calling thread for `stream` (a Synchronize
// activity) that began at `start_ns` and ends now; nothing when tracing is off.
// A HAL reads nowNs() before it blocks only when enabled() and passes 0
// otherwise: a start of 0 records nothing.
void recordHostWait(const char* name, int device, int64_t stream, int64_t start_ns);

// ---- For HALs built as shared libraries (hal_plugin.h) ----------------------------

// The part of the trace a HAL reaches, as a table of the runtime's own
// functions: a HAL library calls these (through the helpers above, compiled
// into it from tracing.cpp and hal_plugin_sdk.cpp), so its activities join the
// runtime's trace and its launches read the launching thread's state.
struct HostServices {
  const std::atomic<bool>* enabled;
  uint64_t (*current_correlation)();
  Work (*take_next_work)();
  bool (*replaying)();
  void (*record)(const Activity& activity);
  const char* (*intern)(const std::string& name);
  bool (*projecting)();
};
// The runtime's table (what the loader hands a HAL library).
const HostServices& hostServices();

// Records the span of a scope as one activity (when tracing is on at entry).
class Scope {
 public:
  Scope(ActivityKind kind, const char* name, int device, int64_t stream, std::size_t bytes = 0,
        CopyKind copy_kind = CopyKind::DeviceToDevice, bool host_synchronous = false);
  ~Scope();
  void setBytes(std::size_t bytes) { activity_.bytes = bytes; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Activity activity_;
  bool active_;
};

}  // namespace npu::runtime::tracing
