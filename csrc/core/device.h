// The npu devices as c10 sees them: count, the calling thread's current device,
// and translation of runtime errors into c10 errors that name the device.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <vector>

#include "../runtime/hal.h"

namespace npu {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

c10::DeviceIndex deviceCount() noexcept;
// Throws a c10::Error naming the valid range when `index` is not a device
// (or when this is a forked child of a process that used the npu).
void checkDevice(c10::DeviceIndex index);
// A device index from Python, validated as a full int before it is narrowed
// to c10's 8 bits: -1 (when `allow_current`) means the current device.
c10::DeviceIndex toDeviceIndex(int64_t index, bool allow_current = true);
// True in a child forked after the parent used the npu: its streams' threads
// did not survive the fork, so every npu use raises (as CUDA's does).
bool inBadFork() noexcept;
// True once this process used the npu runtime (memory, streams) or called
// initialize().
bool runtimeInitialized() noexcept;
// torch.npu.init(): starts the runtime of the current device now (as
// torch.cuda.init() creates the context), so that a fork from here on leaves a
// child that raises. Raises in such a child, or without a device.
void initialize();
c10::DeviceIndex currentDevice();
void setDevice(c10::DeviceIndex index);
// -1 means the current device; another negative index (a wrapped one) raises.
c10::DeviceIndex resolveDevice(c10::DeviceIndex index);
runtime::Device& runtimeDevice(c10::DeviceIndex index);
// Waits for every stream of the device; raises a failed kernel's error.
void synchronizeDevice(c10::DeviceIndex index);
// Whether host code may use the device's memory in place (its HAL's
// host_addressable capability); else data crosses only through stream copies.
bool hostAddressable(c10::DeviceIndex index);
// Whether host kernels (the op library's, computing on cpuAlias()es) may run on
// the device's memory: its HAL's host_addressable or host_kernels capability.
// One relaxed load after the first call per device.
bool hostKernelsAllowed(c10::DeviceIndex index);
// Raises for `op` on a device whose memory host kernels cannot reach, naming the
// op, the HAL and the remedy.
[[noreturn]] void refuseHostKernel(c10::DeviceIndex index, const std::string& op);
// Raises, naming `what`, when the device's events cannot time (timing_events).
void checkTimingEvents(c10::DeviceIndex index, const char* what);

// torch_npu.npu.stop_device / torch.npu.restart_device (high availability): while a
// device is stopped, work launched on it raises FORCE STOP (as on the chip), and
// kernels it had queued are skipped; restart lets work run again.
void stopDevice(c10::DeviceIndex index);
void restartDevice(c10::DeviceIndex index);
bool deviceStopped(c10::DeviceIndex index) noexcept;
// One relaxed load when no device is stopped.
bool anyDeviceStopped() noexcept;
// Raises FORCE STOP, naming `what`, when `index` is stopped.
void checkNotStopped(c10::DeviceIndex index, const char* what);

// The dtypes the device's kernels compute in (the op library declares them at
// registration; others take the CPU fallback): what
// torch.accelerator.get_device_capability() reports.
void setNativeDtypes(const std::vector<c10::ScalarType>& types);
bool computesNatively(c10::ScalarType type);

// Runs `fn`, turning runtime exceptions (a failed kernel, a bad stream) into a
// c10::Error that says where the error was seen and how to find its origin.
template <typename Fn>
decltype(auto) translateRuntimeErrors(const char* where, Fn&& fn);

[[noreturn]] void rethrowRuntimeError(const char* where);

template <typename Fn>
decltype(auto) translateRuntimeErrors(const char* where, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception&) {
    rethrowRuntimeError(where);
  }
}

}  // namespace npu
