// torch.npu.ExternalEvent: an event whose wait may come before its record. A wait
// queued on a stream holds back that stream's later work until a record (on any
// stream, issued before or after the wait) has run; each wait consumes one record
// (the chip's "wait resets the event"), and reset() drops the records not yet
// consumed. Record, wait and reset are stream-ordered work: on a capturing stream
// they are recorded like kernels, so at each replay the graph's stream waits for a
// record issued outside the graph (by a task group's update stream, graph.h).
#pragma once

#include <c10/core/Stream.h>

#include <cstddef>
#include <memory>

#include "../runtime/hal.h"

namespace npu {

// Queues `kernel` on `stream` from another thread, so that it never runs on the
// calling thread even on an idle stream: for a kernel that may block until the
// caller does more (an ExternalEvent wait whose record comes later; a graph replay's
// batch holding one). Returns once the kernel is in the stream (queued, or
// running), so work launched after it queues behind it. A launch the stream refuses
// is dropped (the stream keeps a kernel's own error).
void launchOffThread(runtime::Stream& stream, const char* name, runtime::Kernel kernel, std::size_t bytes);

class ExternalEvent {
 public:
  ExternalEvent();
  void record(const c10::Stream& stream);
  void wait(const c10::Stream& stream);
  void reset(const c10::Stream& stream);
  // Records run so far, not yet consumed by a wait (for tests and repr).
  int64_t pending() const;
  // An identity for repr (the chip's event handle).
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(state_.get()); }

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace npu
