#include "stream.h"

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include <c10/util/Exception.h>

#include "capture.h"

namespace npu {

namespace {
constexpr int kMaxDevices = 64;
constexpr int kPoolSize = 8;  // streams per device and priority

// Stream id 0 (the default stream) until the thread picks another.
thread_local std::array<int64_t, kMaxDevices> t_current_stream_ids{};

struct StreamPool {
  std::once_flag created;
  std::array<int64_t, kPoolSize> normal{};
  std::array<int64_t, kPoolSize> high{};
  std::atomic<unsigned> next_normal{0};
  std::atomic<unsigned> next_high{0};
};
std::array<StreamPool, kMaxDevices> g_pools;

c10::Stream makeStream(c10::DeviceIndex device, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, device), id);
}
}  // namespace

c10::Stream currentStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  checkDevice(device);
  return makeStream(device, t_current_stream_ids[device]);
}

c10::Stream defaultStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  checkDevice(device);
  return makeStream(device, 0);
}

c10::Stream streamFromPool(c10::DeviceIndex device, bool high_priority) {
  device = resolveDevice(device);
  auto& rt = runtimeDevice(device);
  TORCH_CHECK(rt.capabilities().multiple_streams, "torch.npu.Stream(): npu:", static_cast<int>(device),
              " has only its default stream (its HAL, ", runtime::hal().name(), ", lacks the multiple_streams "
              "capability); use torch.npu.default_stream()");
  auto& pool = g_pools[device];
  std::call_once(pool.created, [&] {
    for (int i = 0; i < kPoolSize; ++i) {
      pool.normal[i] = rt.createStream(0).id();
      pool.high[i] = rt.createStream(-1).id();
    }
  });
  if (high_priority) return makeStream(device, pool.high[pool.next_high++ % kPoolSize]);
  return makeStream(device, pool.normal[pool.next_normal++ % kPoolSize]);
}

c10::Stream exchangeStream(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNPU, "expected an npu stream, got a ",
              c10::DeviceTypeName(stream.device_type()), " stream");
  runtimeStream(stream);  // validates the id
  const auto device = stream.device_index();
  auto previous = makeStream(device, t_current_stream_ids[device]);
  t_current_stream_ids[device] = stream.id();
  return previous;
}

runtime::Stream& runtimeStream(const c10::Stream& stream) {
  auto& rt = runtimeDevice(stream.device_index());
  return translateRuntimeErrors("stream lookup", [&]() -> runtime::Stream& {
    return rt.stream(stream.id());
  });
}

runtime::Stream& currentRuntimeStream(c10::DeviceIndex device) {
  device = resolveDevice(device);
  auto& rt = runtimeDevice(device);
  const int64_t id = t_current_stream_ids[device];
  return id == 0 ? rt.defaultStream() : rt.stream(id);
}

void synchronizeStream(const c10::Stream& stream, const char* where) {
  capture::checkNotCapturing(stream.device_index(), where);
  auto& rt = runtimeStream(stream);
  translateRuntimeErrors(where, [&] { rt.synchronize(); });
}

bool queryStream(const c10::Stream& stream) { return runtimeStream(stream).query(); }

namespace {
struct HeldStream {
  c10::DeviceIndex device;
  int64_t id;
};
thread_local std::vector<HeldStream> t_held;
}  // namespace

StreamHold::StreamHold(c10::DeviceIndex device, const char* where) : device_(resolveDevice(device)) {
  if (C10_UNLIKELY(anyDeviceStopped())) checkNotStopped(device_, where);
  capture::checkNotCapturing(device_, where);
  capture::refuseIfJoined(device_, where);
  stream_ = &currentRuntimeStream(device_);
  translateRuntimeErrors(where, [&] { stream_->acquire(); });
  t_held.push_back({device_, stream_->id()});
  try {
    translateRuntimeErrors(where, [&] { stream_->synchronize(); });  // the holder's: reports, never waits
  } catch (...) {
    t_held.pop_back();
    stream_->release();
    throw;
  }
}

StreamHold::~StreamHold() {
  t_held.pop_back();
  stream_->release();
}

namespace {
std::atomic<int> g_sync_debug_mode{0};
thread_local int t_sync_checked = 0;
}  // namespace

SyncChecked::SyncChecked() { ++t_sync_checked; }
SyncChecked::~SyncChecked() { --t_sync_checked; }

void setSyncDebugMode(int mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "torch.npu.set_sync_debug_mode: invalid value ", mode,
              ": expected 0 (\"default\"), 1 (\"warn\") or 2 (\"error\")");
  g_sync_debug_mode.store(mode, std::memory_order_relaxed);
}

int syncDebugMode() { return g_sync_debug_mode.load(std::memory_order_relaxed); }

void checkSync(const char* what) {
  const int mode = g_sync_debug_mode.load(std::memory_order_relaxed);
  if (C10_LIKELY(mode == 0) || t_sync_checked > 0) return;
  if (mode == 1) {
    TORCH_WARN("called a synchronizing npu operation: ", what,
               " waits for the npu's queued work (torch.npu.set_sync_debug_mode(\"warn\"))");
  } else {
    TORCH_CHECK(false, "called a synchronizing npu operation: ", what, " waits for the npu's queued work, and "
                "torch.npu.set_sync_debug_mode(\"error\") forbids it; keep the value on the npu, or set the mode "
                "back to \"default\"");
  }
}

bool holdingStream(c10::DeviceIndex device, int64_t stream_id) {
  for (const auto& held : t_held) {
    if (held.device == device && held.id == stream_id) return true;
  }
  return false;
}

}  // namespace npu
