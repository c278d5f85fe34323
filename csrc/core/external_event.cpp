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

void launchOffThread(runtime::Stream& stream, const char* name, runtime::Kernel kernel, std::size_t bytes) {
  auto submitted = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::once_flag>();
  auto signal = [submitted, once] { std::call_once(*once, [&] { submitted->set_value(); }); };
  std::future<void> done = submitted->get_future();
  runtime::Stream* rt = &stream;
  std::thread([rt, name, kernel = std::move(kernel), signal, bytes]() mutable {
    try {
      rt->launch(name, [kernel = std::move(kernel), signal] { signal(); kernel(); }, bytes);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the stream keeps a kernel's error; a refused launch has none
    }
    signal();
  }).detach();
  done.wait();
}

ExternalEvent::ExternalEvent() : state_(std::make_shared<State>()) {}

int64_t ExternalEvent::pending() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->available;
}

void ExternalEvent::record(const c10::Stream& stream) {
  const auto device = stream.device_index();
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
  if (captured) {
    // A node of the graph: its record comes at replay, from outside the graph (the
    // replay never runs it on the replaying thread, graph.cpp).
    onStream(stream, [&] { launch(device, "ExternalEvent.wait", waitKernel(state), 0); });
    return;
  }
  // Eager: the record may come later from this thread (after a reset, or once
  // replays consumed the records), so the wait never runs here. Another thread
  // submits it; this one goes on once it is in the stream (queued behind the
  // stream's work, or running), so that later work queues behind it.
  capture::refuseIfJoined(device, "torch.npu.ExternalEvent.wait");
  if (C10_UNLIKELY(anyDeviceStopped())) checkNotStopped(device, "torch.npu.ExternalEvent.wait");
  launchOffThread(runtimeStream(stream), "ExternalEvent.wait",
                  [kernel = waitKernel(state), device] {
                    if (C10_UNLIKELY(anyDeviceStopped()) && deviceStopped(device)) return;  // stop_device: skipped
                    kernel();
                  },
                  0);
}

}  // namespace npu
