// c10::Stream for the npu: which runtime stream a c10 stream id names, the
// calling thread's current stream per device, and a small pool of streams.
#pragma once

#include <c10/core/Stream.h>

#include "device.h"

namespace npu {

c10::Stream currentStream(c10::DeviceIndex device = -1);
c10::Stream defaultStream(c10::DeviceIndex device = -1);
// Round-robin over a few streams per device and priority, like CUDA's pool.
c10::Stream streamFromPool(c10::DeviceIndex device, bool high_priority);
// Makes `stream` current for its device on this thread; returns the previous one.
c10::Stream exchangeStream(c10::Stream stream);

runtime::Stream& runtimeStream(const c10::Stream& stream);
// The runtime stream that current work on `device` goes to.
runtime::Stream& currentRuntimeStream(c10::DeviceIndex device);

void synchronizeStream(const c10::Stream& stream, const char* where = "stream synchronize");
bool queryStream(const c10::Stream& stream);

// Host code in stream order (ops that run on the calling thread, synchronous
// copies, .item()): holds the current stream of `device` for its scope, after
// the work launched before it ran; raises an earlier kernel's error. Kernels
// other threads launch meanwhile queue behind it (runtime::Stream::acquire).
class StreamHold {
 public:
  StreamHold(c10::DeviceIndex device, const char* where);
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

 private:
  runtime::Stream* stream_;
  c10::DeviceIndex device_;
};

// Whether this thread holds stream `stream_id` of `device` (a StreamHold):
// memory it allocates is written at once, by the host, so the allocator gives
// it only blocks whose earlier stream work has completed.
bool holdingStream(c10::DeviceIndex device, int64_t stream_id);

// torch.npu.set_sync_debug_mode, as CUDA's: 0 says nothing, 1 warns and 2 raises at
// each operation that makes the host wait for the device's results (a copy to
// host memory, .item(), an op whose output size depends on the data). `what`
// names the operation.
void setSyncDebugMode(int mode);
int syncDebugMode();
void checkSync(const char* what);
// While one lives on this thread, checkSync says nothing: the operation that
// contains the nested ones (.item() copying to the host) was checked already.
class SyncChecked {
 public:
  SyncChecked();
  ~SyncChecked();
  SyncChecked(const SyncChecked&) = delete;
  SyncChecked& operator=(const SyncChecked&) = delete;
};

}  // namespace npu
