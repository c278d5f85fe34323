// What the primitives (device, streams, events, the allocator, copies) ask of
// graph capture and tell it, without depending on it. Graph capture (graph.*)
// sits above them: it installs its answers here when the module loads, and
// until then nothing captures and every question answers "no". Work itself
// reaches a capture only through the one submission point, launch.h.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace npu::capture {

struct Hooks {
  bool (*any_capture)();
  bool (*current_stream_capturing)(c10::DeviceIndex device);
  void (*check_not_capturing)(c10::DeviceIndex device, const char* what);
  void (*refuse_if_joined)(c10::DeviceIndex device, const char* what);
  void (*refuse)(c10::DeviceIndex device, int64_t stream_id, const std::string& what, const std::string& why);
  void (*event_recorded)(const void* event, c10::DeviceIndex device, int64_t stream_id);
  void (*event_waited)(const void* event, c10::DeviceIndex device, int64_t stream_id);
  void (*event_destroyed)(const void* event);
};

// Called once, by graph capture, at load.
void install(const Hooks* hooks);
const Hooks* installed();

// Whether any stream of any device captures (one atomic load when nothing is installed).
inline bool anyCapture() {
  const Hooks* h = installed();
  return h != nullptr && h->any_capture();
}
// Whether this thread's current stream of `device` captures.
inline bool currentStreamCapturing(c10::DeviceIndex device) {
  const Hooks* h = installed();
  return h != nullptr && h->current_stream_capturing(device);
}
// Raises when `what` (a wait for the device or a stream, a host read) would run
// while a capture forbids it (graph.h, checkNotCapturing).
inline void checkNotCapturing(c10::DeviceIndex device, const char* what) {
  if (const Hooks* h = installed()) h->check_not_capturing(device, what);
}
// Raises when this thread's current stream joined a capture's work (graph.h, refuseIfJoined).
inline void refuseIfJoined(c10::DeviceIndex device, const char* what) {
  if (const Hooks* h = installed()) h->refuse_if_joined(device, what);
}
// Invalidates the capture of that stream and raises: `what` cannot be captured, `why`.
[[noreturn]] void refuse(c10::DeviceIndex device, int64_t stream_id, const std::string& what, const std::string& why);
// Events recorded on, waited by and destroyed from streams: how a capture learns
// that another stream joined its work.
inline void eventRecorded(const void* event, c10::DeviceIndex device, int64_t stream_id) {
  if (const Hooks* h = installed()) h->event_recorded(event, device, stream_id);
}
inline void eventWaited(const void* event, c10::DeviceIndex device, int64_t stream_id) {
  if (const Hooks* h = installed()) h->event_waited(event, device, stream_id);
}
inline void eventDestroyed(const void* event) {
  if (const Hooks* h = installed()) h->event_destroyed(event);
}

}  // namespace npu::capture
