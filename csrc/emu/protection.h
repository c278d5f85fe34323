// NPU_EMU_PROTECT=1: the emulated device's memory behaves as a discrete
// device's, which the host cannot touch. Each device's memory is one reserved
// range mapped without access rights. It is opened (read and write) only while
// the device itself works on it: a kernel or copy runs, or host code holds a
// stream (work in stream order done on the device's behalf: ops run on the
// host, synchronous copies, compiled kernels); when none does, it is closed
// again. A host access at any other time faults, and the fault handler names
// the address and the mode before the process ends (or the previous handler,
// Python's faulthandler for one, reports it). The gate is process-wide: while
// one thread's kernel runs, every device's memory is open to every thread, so
// a stray access races to be caught; single-threaded paths are caught every time.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "free_ranges.h"

namespace npu::runtime::emu {

// One device's memory: `capacity` bytes of address space, reserved without
// access and without committing memory; first-fit allocation within it.
class ProtectedArena {
 public:
  explicit ProtectedArena(std::size_t capacity);
  ~ProtectedArena();
  ProtectedArena(const ProtectedArena&) = delete;
  ProtectedArena& operator=(const ProtectedArena&) = delete;

  // `size` bytes (a multiple of the alignment the caller wants, at most 4096),
  // or nullptr when no free range is large enough.
  void* allocate(std::size_t size);
  // Gives back a range allocate() returned, of that size; its pages are
  // returned to the system (the next user reads zeros, as from fresh memory).
  void free(void* ptr, std::size_t size);

 private:
  char* base_;
  std::size_t capacity_;
  std::mutex mutex_;
  FreeRanges free_;
};

// Opens every protected arena while at least one DeviceWork is alive.
class DeviceWork {
 public:
  explicit DeviceWork(bool protected_memory);
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;

  // For holds, whose begin and end are separate calls.
  static void begin();
  static void end();

 private:
  bool active_;
};

}  // namespace npu::runtime::emu
