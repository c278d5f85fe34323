// The helpers a HAL uses for its profiling duty (hal.h), over the primitives of
// tracing.h (correlation, work hints, record, intern): compiled into the runtime
// library, which defines those primitives (tracing_state.cpp), and into every
// HAL library, where hal_plugin_sdk.cpp forwards them to the runtime.
#include "tracing.h"

#include <chrono>
#include <functional>
#include <thread>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace npu::runtime::tracing {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int32_t currentThreadId() {
#if defined(__linux__)
  thread_local const int32_t id = static_cast<int32_t>(::syscall(SYS_gettid));
#else
  thread_local const int32_t id = static_cast<int32_t>(std::hash<std::thread::id>()(std::this_thread::get_id()));
#endif
  return id;
}

const char* copyName(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice: return "Memcpy HtoD";
    case CopyKind::DeviceToHost: return "Memcpy DtoH";
    case CopyKind::DeviceToDevice: break;
  }
  return "Memcpy DtoD";
}

void LaunchStamp::stampNow() {
  traced = true;
  correlation = currentCorrelation();  // of the op launching it, on this thread
  host_thread = currentThreadId();
  launch_ns = nowNs();
  work = takeNextWork();
  in_graph = replaying();
}

void recordExecution(const LaunchStamp& stamp, ActivityKind kind, const char* name, int device, int64_t stream,
                     int64_t start_ns, int64_t end_ns, std::size_t bytes, CopyKind copy_kind) {
  if (!stamp.traced || !enabled()) return;
  Activity activity;
  activity.kind = kind;
  activity.name = name;
  activity.device = device;
  activity.stream = stream;
  activity.correlation = stamp.correlation;
  activity.host_thread = stamp.host_thread;
  activity.launch_ns = stamp.launch_ns;
  activity.work = stamp.work;
  activity.in_graph = stamp.in_graph;
  activity.host_synchronous = stamp.host_synchronous;
  activity.start_ns = start_ns;
  activity.end_ns = end_ns;
  activity.bytes = bytes;
  activity.copy_kind = copy_kind;
  record(activity);
}

void recordHostWait(const char* name, int device, int64_t stream, int64_t start_ns) {
  if (start_ns == 0 || !enabled()) return;
  Activity activity;
  activity.kind = ActivityKind::Synchronize;
  activity.name = name;
  activity.device = device;
  activity.stream = stream;
  activity.correlation = currentCorrelation();
  activity.host_thread = currentThreadId();
  activity.start_ns = start_ns;
  activity.end_ns = nowNs();
  record(activity);
}

Scope::Scope(ActivityKind kind, const char* name, int device, int64_t stream, std::size_t bytes, CopyKind copy_kind,
             bool host_synchronous)
    : active_(enabled()) {
  if (!active_) return;
  activity_.kind = kind;
  activity_.name = intern(name);   // outlives the op that named it (an op registered from Python may go)
  activity_.device = device;
  activity_.stream = stream;
  activity_.bytes = bytes;
  activity_.copy_kind = copy_kind;
  activity_.correlation = currentCorrelation();
  activity_.host_thread = currentThreadId();
  activity_.start_ns = nowNs();
  activity_.launch_ns = activity_.start_ns;
  activity_.work = takeNextWork();
  activity_.in_graph = replaying();
  activity_.host_synchronous = host_synchronous;
}

Scope::~Scope() {
  if (!active_) return;
  activity_.end_ns = nowNs();
  record(activity_);
}

}  // namespace npu::runtime::tracing
