// The HAL SDK's link to the runtime: in a HAL library (hal_plugin.h), the
// trace primitives that tracing.cpp's helpers call forward to the runtime's
// table, handed to the entry point. Not part of the runtime library, which
// defines the primitives itself (tracing_state.cpp).
#include <atomic>

#include "hal_plugin.h"

namespace npu::runtime {

namespace {
const std::atomic<bool> g_never{false};
// Set once, by the entry point, before the runtime makes a HAL of this library.
const tracing::HostServices* g_host = nullptr;
}  // namespace

namespace tracing {
namespace detail {
const std::atomic<bool>* g_enabled = &g_never;
}

uint64_t currentCorrelation() { return g_host != nullptr ? g_host->current_correlation() : 0; }
Work takeNextWork() { return g_host != nullptr ? g_host->take_next_work() : Work{}; }
bool replaying() { return g_host != nullptr && g_host->replaying(); }
void record(const Activity& activity) {
  if (g_host != nullptr) g_host->record(activity);
}
const char* intern(const std::string& name) {
  // Without the runtime, nothing records: a name that lives as long as the library is enough.
  return g_host != nullptr ? g_host->intern(name) : "unconnected";
}
bool projecting() { return g_host != nullptr && g_host->projecting(); }
}  // namespace tracing

namespace plugin {
bool connect(const NpuHalHost* host) {
  if (host->tracing == nullptr || host->api_version < kMinimumHalApiVersion) return false;
  g_host = static_cast<const tracing::HostServices*>(host->tracing);
  tracing::detail::g_enabled = g_host->enabled;
  return true;
}
}  // namespace plugin

}  // namespace npu::runtime
