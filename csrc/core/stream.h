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

}  // namespace npu
