#include "capture.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace npu::capture {

namespace {
std::atomic<const Hooks*> g_hooks{nullptr};
}  // namespace

void install(const Hooks* hooks) { g_hooks.store(hooks, std::memory_order_release); }
const Hooks* installed() { return g_hooks.load(std::memory_order_acquire); }

void refuse(c10::DeviceIndex device, int64_t stream_id, const std::string& what, const std::string& why) {
  const Hooks* h = installed();
  if (h != nullptr) h->refuse(device, stream_id, what, why);
  // Not reached when graph capture is installed (it raises); without it nothing captures.
  TORCH_CHECK(false, what, " cannot be captured: ", why);
}

}  // namespace npu::capture
