#include "external_event.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "capture.h"
#include "device.h"
#include "launch.h"
#include "stream.h"

namespace npu {

// How long a wait waits for a record before it fails (the chip waits forever; an
// emulated stream that never gets its record would hang the process instead).
constexpr std::chrono::seconds kWaitLimit{300};

struct ExternalEvent::State {
  std::mutex mutex;
  std::condition_variable recorded;
  int64_t available = 0;      // records run, not yet consumed (device side)
  int64_t host_records = 0;   // records issued eagerly, minus the eager waits issued
};

namespace {

// Runs `launch_it` with `stream` current on its device (the stream work goes to, or
// the capture that records it), then restores the previous current stream.
template <class Fn>
void onStream(const c10::Stream& stream, Fn&& launch_it) {
  const c10::Stream previous = exchangeStream(stream);
  try {
    launch_it();
  } catch (...) {
    exchangeStream(previous);
    throw;
  }
  exchangeStream(previous);
}

runtime::Kernel waitKernel(std::shared_ptr<ExternalEvent::State> state) {
  return [state] {
    std::unique_lock<std::mutex> lock(state->mutex);
    if (!state->recorded.wait_for(lock, kWaitLimit, [&] { return state->available > 0; })) {
      throw std::runtime_error(
          "torch.npu.ExternalEvent.wait: no record of the event ran within " + std::to_string(kWaitLimit.count()) +
          " s, so the waiting stream stopped waiting (the chip would wait forever): record the event "
          "(event.record(stream)) on another stream after each wait, e.g. after a task group's update");
    }
    --state->available;
  };
}

}  // namespace

ExternalEvent::ExternalEvent() : state_(std::make_shared<State>()) {}

int64_t ExternalEvent::pending() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->available;
}

void ExternalEvent::record(const c10::Stream& stream) {
  const auto device = stream.device_index();
  const bool captured = capture::anyCapture() && [&] {
    bool capturing = false;
    onStream(stream, [&] { capturing = capture::currentStreamCapturing(device); });
    return capturing;
  }();
  if (!captured) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->host_records;
  }
  auto state = state_;
  onStream(stream, [&] {
    launch(device, "ExternalEvent.record", [state] {
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        ++state->available;
      }
      state->recorded.notify_all();
    }, 0);
  });
}

void ExternalEvent::reset(const c10::Stream& stream) {
  auto state = state_;
  onStream(stream, [&] {
    launch(stream.device_index(), "ExternalEvent.reset", [state] {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->available = 0;
    }, 0);
  });
}

void ExternalEvent::wait(const c10::Stream& stream) {
  const auto device = stream.device_index();
  bool captured = false;
  onStream(stream, [&] { captured = capture::currentStreamCapturing(device); });
  auto state = state_;
  bool recorded_before = true;
  if (!captured) {
    std::lock_guard<std::mutex> lock(state->mutex);
    recorded_before = state->host_records > 0;
    if (recorded_before) --state->host_records;
  }
  if (captured || recorded_before) {
    // Its record is queued already (or comes at replay from outside the graph): the
    // stream may run the wait at once, even on this thread.
    onStream(stream, [&] { launch(device, "ExternalEvent.wait", waitKernel(state), 0); });
    return;
  }
  // Wait before record: the record comes later from this thread, so the wait must not
  // run here. Another thread submits it; this one goes on once it is in the stream
  // (queued behind the stream's work, or running, so that later work queues behind it).
  capture::refuseIfJoined(device, "torch.npu.ExternalEvent.wait");
  runtime::Stream* rt = &runtimeStream(stream);
  auto submitted = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::once_flag>();
  auto signal = [submitted, once] { std::call_once(*once, [&] { submitted->set_value(); }); };
  std::future<void> done = submitted->get_future();
  runtime::Kernel kernel = waitKernel(state);
  std::thread([rt, kernel, signal]() mutable {
    try {
      rt->launch("ExternalEvent.wait", [kernel, signal] { signal(); kernel(); }, 0);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the stream keeps a kernel's error; a refused launch has none
    }
    signal();
  }).detach();
  done.wait();
}

}  // namespace npu
