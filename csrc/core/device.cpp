#include "device.h"

#include "capture.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>

namespace npu {

namespace {
thread_local c10::DeviceIndex t_current_device = 0;

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

void markBadForkInChild() {
  if (g_initialized.load()) g_bad_fork.store(true);
}

// The first real use of the runtime (memory, a stream): from now on a fork
// leaves the child without the streams' worker threads.
void markInitialized() {
  if (g_initialized.load(std::memory_order_relaxed)) return;
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, &markBadForkInChild); });
  g_initialized.store(true);
}

[[noreturn]] void raiseBadFork() {
  TORCH_CHECK(false, "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, you must "
              "use the 'spawn' start method (multiprocessing.set_start_method('spawn') or "
              "torch.multiprocessing.get_context('spawn')): the parent initialised the npu before fork(), and "
              "its streams do not survive a fork.");
}

// c10 keeps a device index in 8 bits: torch.device("npu:1000") arrives as -24.
std::string wrappedIndexNote(int64_t index) {
  if (index >= -1) return "";
  return ". An index of 128 or more wraps around to a negative one in torch.device, which keeps device "
         "indices in 8 bits";
}
}  // namespace

bool inBadFork() noexcept { return g_bad_fork.load(std::memory_order_relaxed); }
bool runtimeInitialized() noexcept { return g_initialized.load(std::memory_order_relaxed); }

c10::DeviceIndex deviceCount() noexcept {
  try {
    return static_cast<c10::DeviceIndex>(runtime::hal().deviceCount());
  } catch (...) {
    return 0;  // a bad NPU_EMU_* setting: no device (the error shows on first use)
  }
}

void checkDevice(c10::DeviceIndex index) {
  if (inBadFork()) raiseBadFork();
  const auto count = translateRuntimeErrors("npu init", [] { return runtime::hal().deviceCount(); });
  TORCH_CHECK(index >= 0 && index < count, "invalid device: npu:", static_cast<int>(index),
              " is not an npu device: there are ", count, " npu device(s); use an index in [0, ", count,
              ") (the emulator's count is set by NPU_EMU_DEVICES)", wrappedIndexNote(index));
}

void initialize() {
  if (inBadFork()) raiseBadFork();
  const auto count = translateRuntimeErrors("torch.npu.init()", [] { return runtime::hal().deviceCount(); });
  TORCH_CHECK(count > 0, "torch.npu.init(): no npu device (NPU_EMU_DEVICES=0)");
  runtimeDevice(currentDevice());
}

c10::DeviceIndex currentDevice() { return t_current_device; }

void setDevice(c10::DeviceIndex index) {
  checkDevice(index);
  t_current_device = index;
}

c10::DeviceIndex resolveDevice(c10::DeviceIndex index) {
  if (index == -1) return currentDevice();
  if (index < 0) checkDevice(index);  // raises: a wrapped index, never the current device
  return index;
}

c10::DeviceIndex toDeviceIndex(int64_t index, bool allow_current) {
  if (allow_current && index == -1) return currentDevice();
  const auto count = translateRuntimeErrors("npu init", [] { return runtime::hal().deviceCount(); });
  TORCH_CHECK(index >= 0 && index < count, "invalid device: npu:", index, " is not an npu device: there are ", count,
              " npu device(s); use an index in [0, ", count, ")",
              allow_current ? " or -1 for the current device" : "",
              " (the emulator's count is set by NPU_EMU_DEVICES)");
  return static_cast<c10::DeviceIndex>(index);
}

runtime::Device& runtimeDevice(c10::DeviceIndex index) {
  checkDevice(index);
  markInitialized();
  return runtime::hal().device(index);
}

bool hostAddressable(c10::DeviceIndex index) { return runtimeDevice(index).capabilities().host_addressable; }

namespace {
// Per device: 0 unknown, 1 allowed, 2 refused (a capability never changes).
constexpr int kCachedDevices = 64;
std::array<std::atomic<int8_t>, kCachedDevices> g_host_kernels{};
}  // namespace

bool hostKernelsAllowed(c10::DeviceIndex index) {
  if (index < 0 || index >= kCachedDevices) return true;  // not a device: checkDevice() reports it elsewhere
  int8_t known = g_host_kernels[index].load(std::memory_order_relaxed);
  if (C10_LIKELY(known != 0)) return known == 1;
  const auto caps = runtimeDevice(index).capabilities();
  known = caps.host_addressable || caps.host_kernels ? 1 : 2;
  g_host_kernels[index].store(known, std::memory_order_relaxed);
  return known == 1;
}

void refuseHostKernel(c10::DeviceIndex index, const std::string& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op, " on npu:", static_cast<int>(index), ": the device's HAL '",
                              runtime::hal().name(),
                              "' keeps its memory where host code cannot compute (neither host_addressable nor "
                              "host_kernels), and this op's kernel is a host kernel of the emulator's op library. "
                              "Remedy: the HAL supplies a kernel for this op, or answers Device::supportsOp so that "
                              "ops it lacks take the CPU fallback (csrc/runtime/hal.h); or move the tensor to the cpu");
}

void checkTimingEvents(c10::DeviceIndex index, const char* what) {
  TORCH_CHECK(runtimeDevice(index).capabilities().timing_events, what, ": the events of npu:",
              static_cast<int>(index), " cannot measure time (its HAL, ", runtime::hal().name(),
              ", lacks the timing_events capability)");
}

void synchronizeDevice(c10::DeviceIndex index) {
  capture::checkNotCapturing(resolveDevice(index), "torch.npu.synchronize()");
  auto& device = runtimeDevice(resolveDevice(index));
  translateRuntimeErrors("torch.npu.synchronize()", [&] { device.synchronize(); });
}

namespace {
std::atomic<uint64_t> g_stopped{0};  // bit i: device i is stopped
}  // namespace

void stopDevice(c10::DeviceIndex index) {
  index = resolveDevice(index);
  checkDevice(index);
  g_stopped.fetch_or(uint64_t(1) << index, std::memory_order_acq_rel);
  // What was queued is skipped (launch.cpp): waiting for it costs nothing.
  try {
    runtimeDevice(index).drain();
  } catch (...) {  // NOLINT(bugprone-empty-catch): errors stay with the streams
  }
}

void restartDevice(c10::DeviceIndex index) {
  index = resolveDevice(index);
  checkDevice(index);
  g_stopped.fetch_and(~(uint64_t(1) << index), std::memory_order_acq_rel);
}

bool anyDeviceStopped() noexcept { return g_stopped.load(std::memory_order_relaxed) != 0; }

bool deviceStopped(c10::DeviceIndex index) noexcept {
  return index >= 0 && index < 64 && (g_stopped.load(std::memory_order_acquire) >> index & 1) != 0;
}

void checkNotStopped(c10::DeviceIndex index, const char* what) {
  if (C10_LIKELY(!anyDeviceStopped())) return;
  index = resolveDevice(index);
  TORCH_CHECK(!deviceStopped(index), what, ": npu:", static_cast<int>(index), " FORCE STOP: the device was stopped "
              "by torch_npu.npu.stop_device(", static_cast<int>(index), "), so work on it fails until "
              "torch.npu.restart_device(", static_cast<int>(index), ") (as on the chip)");
}

namespace {
static_assert(static_cast<int>(c10::ScalarType::NumOptions) <= 64, "a ScalarType no longer fits a bit of uint64_t");
std::atomic<uint64_t> g_native_dtypes{0};  // bit i: ScalarType i
}  // namespace

void setNativeDtypes(const std::vector<c10::ScalarType>& types) {
  uint64_t bits = 0;
  for (auto type : types) bits |= uint64_t(1) << static_cast<int>(type);
  g_native_dtypes.store(bits);
}

bool computesNatively(c10::ScalarType type) {
  return (g_native_dtypes.load(std::memory_order_relaxed) >> static_cast<int>(type)) & 1;
}

namespace {

bool showCppStacktraces() {
  const char* value = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  return value != nullptr && (std::string(value) == "1" || std::string(value) == "true");
}

// The failed kernel's message, raised again with its own Python type
// (IndexError stays IndexError) and a short text: the op, where it ran, the
// advice; the C++ backtrace only with TORCH_SHOW_CPP_STACKTRACES=1.
[[noreturn]] void raiseKernelFailure(const runtime::KernelFailure& failure, const char* where) {
  const bool backtrace = showCppStacktraces();
  std::string cause = failure.message;
  try {
    if (failure.cause) std::rethrow_exception(failure.cause);
  } catch (const c10::Error& e) {
    cause = backtrace ? e.what() : e.msg();
  } catch (...) {
  }
  std::ostringstream text;
  text << "npu kernel '" << failure.kernel << "' failed on npu:" << failure.device << " (stream "
       << failure.stream << ", kernel #" << failure.launch_index << " launched on it): " << cause
       << "\nThe kernel ran asynchronously; its error is reported at " << where
       << ", the first synchronisation point after it. Set NPU_LAUNCH_BLOCKING=1 to raise it where it "
          "was launched.";
  const std::string message = text.str();
  try {
    if (failure.cause) std::rethrow_exception(failure.cause);
  } catch (const c10::IndexError&) {
    TORCH_CHECK_INDEX(false, message);
  } catch (const c10::ValueError&) {
    TORCH_CHECK_VALUE(false, message);
  } catch (const c10::TypeError&) {
    TORCH_CHECK_TYPE(false, message);
  } catch (const c10::NotImplementedError&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  } catch (const c10::LinAlgError&) {
    TORCH_CHECK_LINALG(false, message);
  } catch (const c10::OutOfMemoryError&) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  } catch (const std::out_of_range&) {
    TORCH_CHECK_INDEX(false, message);
  } catch (...) {
  }
  TORCH_CHECK(false, message);
}

}  // namespace

void rethrowRuntimeError(const char* where) {
  try {
    throw;
  } catch (const runtime::KernelError& e) {
    raiseKernelFailure(e.failure(), where);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "npu runtime error in ", where, ": ", e.what());
  }
}

}  // namespace npu
