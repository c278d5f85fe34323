#include "tracing.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_set>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace npu::runtime::tracing {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {
std::atomic<bool> g_projecting{false};
// NPU_EMU_DEFER=1: always, as while projecting (for the tests of the stream semantics).
const bool g_always_projecting = [] {
  const char* v = std::getenv("NPU_EMU_DEFER");
  return v != nullptr && std::string(v) == "1";
}();
}  // namespace

void setProjecting(bool on) { g_projecting.store(on, std::memory_order_relaxed); }
bool projecting() { return g_always_projecting || g_projecting.load(std::memory_order_relaxed); }

namespace {
// Leaked like g_activities: stream workers may record during static destruction.
std::mutex& g_mutex = *new std::mutex;
std::vector<Activity>* g_activities = new std::vector<Activity>();  // never destroyed: workers may outlive exit
thread_local std::vector<uint64_t> t_correlations;
thread_local Work t_next_work;
thread_local int t_replaying = 0;
}  // namespace

Work takeNextWork() {
  Work work = t_next_work;
  t_next_work = Work{};
  return work;
}

ReplayScope::ReplayScope() { ++t_replaying; }
ReplayScope::~ReplayScope() { --t_replaying; }

const char* intern(const std::string& name) {
  static std::mutex& mutex = *new std::mutex;
  static auto& names = *new std::unordered_set<std::string>;   // never destroyed: traces keep the pointers
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

void start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_activities->clear();
  detail::g_enabled.store(true, std::memory_order_release);
}

std::vector<Activity> stop() {
  std::lock_guard<std::mutex> lock(g_mutex);
  detail::g_enabled.store(false, std::memory_order_release);
  std::vector<Activity> out;
  out.swap(*g_activities);
  return out;
}

void record(const Activity& activity) {
  std::lock_guard<std::mutex> lock(g_mutex);
  // A kernel that finishes after stop() belongs to no session.
  if (detail::g_enabled.load(std::memory_order_relaxed)) g_activities->push_back(activity);
}

void pushCorrelation(uint64_t id) { t_correlations.push_back(id); }
void popCorrelation() {
  if (!t_correlations.empty()) t_correlations.pop_back();
}
void setNextWork(const Work& work) { t_next_work = work; }

uint64_t currentCorrelation() { return t_correlations.empty() ? 0 : t_correlations.back(); }

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
  in_graph = t_replaying > 0;
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
  activity_.in_graph = t_replaying > 0;
  activity_.host_synchronous = host_synchronous;
}

Scope::~Scope() {
  if (!active_) return;
  activity_.end_ns = nowNs();
  record(activity_);
}

}  // namespace npu::runtime::tracing
