#include "device.h"

#include <c10/util/Exception.h>

namespace npu {

namespace {
thread_local c10::DeviceIndex t_current_device = 0;
}

c10::DeviceIndex deviceCount() noexcept {
  try {
    return static_cast<c10::DeviceIndex>(runtime::hal().deviceCount());
  } catch (...) {
    return 0;  // a bad NPU_EMU_* setting: no device (the error shows on first use)
  }
}

void checkDevice(c10::DeviceIndex index) {
  const auto count = translateRuntimeErrors("npu init", [] { return runtime::hal().deviceCount(); });
  TORCH_CHECK(index >= 0 && index < count, "npu:", static_cast<int>(index),
              " is not a valid device: there are ", count,
              " npu device(s); use an index in [0, ", count,
              ") (the emulator's count is set by NPU_EMU_DEVICES)");
}

c10::DeviceIndex currentDevice() { return t_current_device; }

void setDevice(c10::DeviceIndex index) {
  checkDevice(index);
  t_current_device = index;
}

c10::DeviceIndex resolveDevice(c10::DeviceIndex index) {
  if (index < 0) return currentDevice();
  return index;
}

runtime::Device& runtimeDevice(c10::DeviceIndex index) {
  checkDevice(index);
  return runtime::hal().device(index);
}

void synchronizeDevice(c10::DeviceIndex index) {
  auto& device = runtimeDevice(resolveDevice(index));
  translateRuntimeErrors("torch.npu.synchronize()", [&] { device.synchronize(); });
}

void rethrowRuntimeError(const char* where) {
  try {
    throw;
  } catch (const runtime::KernelError& e) {
    TORCH_CHECK(false, e.what(), " (reported at ", where,
                ", the next synchronisation point after the launch; set NPU_LAUNCH_BLOCKING=1 "
                "to raise it where the kernel was launched)");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "npu runtime error in ", where, ": ", e.what());
  }
}

}  // namespace npu
