#include "hal.h"

#include <atomic>
#include <mutex>

#include "emu/device.h"

namespace npu::runtime {

namespace {
std::mutex g_hal_mutex;
// Never destroyed: stream workers may outlive static destruction at exit.
std::atomic<Hal*> g_hal{nullptr};
}  // namespace

Hal& hal() {
  if (Hal* h = g_hal.load(std::memory_order_acquire)) return *h;
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() == nullptr) g_hal.store(new emu::EmuHal(), std::memory_order_release);
  return *g_hal.load();
}

void setHal(std::unique_ptr<Hal> replacement) {
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() != nullptr) {
    throw std::logic_error("setHal() must be called before the npu runtime is first used");
  }
  g_hal.store(replacement.release(), std::memory_order_release);
}

}  // namespace npu::runtime
