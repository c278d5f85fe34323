// The runtime's side of the trace: the session's activities, each thread's
// correlation ids and work hints, and the flags. A HAL library has none of it:
// it reaches this state through hostServices() (hal_plugin.h).
#include "tracing.h"

#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_set>


namespace npu::runtime::tracing {

namespace {
std::atomic<bool> g_enabled_flag{false};
}
namespace detail {
const std::atomic<bool>* g_enabled = &g_enabled_flag;
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

bool replaying() { return t_replaying > 0; }
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
  g_enabled_flag.store(true, std::memory_order_release);
}

std::vector<Activity> stop() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_enabled_flag.store(false, std::memory_order_release);
  std::vector<Activity> out;
  out.swap(*g_activities);
  return out;
}

void record(const Activity& activity) {
  std::lock_guard<std::mutex> lock(g_mutex);
  // A kernel that finishes after stop() belongs to no session.
  if (g_enabled_flag.load(std::memory_order_relaxed)) g_activities->push_back(activity);
}

void pushCorrelation(uint64_t id) { t_correlations.push_back(id); }
void popCorrelation() {
  if (!t_correlations.empty()) t_correlations.pop_back();
}
void setNextWork(const Work& work) { t_next_work = work; }

uint64_t currentCorrelation() { return t_correlations.empty() ? 0 : t_correlations.back(); }

const HostServices& hostServices() {
  static const HostServices services{&g_enabled_flag, &currentCorrelation, &takeNextWork, &replaying,
                                     &record, &intern, &projecting};
  return services;
}

}  // namespace npu::runtime::tracing
