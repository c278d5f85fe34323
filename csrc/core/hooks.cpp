// at::PrivateUse1HooksInterface: what ATen and torch.accelerator ask a backend
// (generators, pinned memory, the device behind a pointer, device selection).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include "allocator.h"
#include "device.h"
#include "generator.h"
#include "host_allocator.h"
#include "stream.h"

namespace npu {
namespace {

struct NPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return deviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device) const override { return device >= 0 && device < deviceCount(); }
  c10::DeviceIndex deviceCount() const override { return npu::deviceCount(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { npu::setDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = currentDevice();
    if (device != old) npu::setDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return defaultGenerator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return newGenerator(device); }

  at::Device getDeviceFromPtr(void* data) const override {
    for (c10::DeviceIndex i = 0; i < npu::deviceCount(); ++i) {
      if (runtime::hal().device(i).owns(data)) return c10::Device(kNPU, i);
    }
    TORCH_CHECK(false, "the pointer ", data, " is not in the memory of any npu device");
  }
  bool isPinnedPtr(const void* data) const override { return isPinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinnedHostAllocator(); }

  // UntypedStorage.resize_() on an npu storage: new memory, old bytes kept.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resizeStorageBytes(storage.unsafeGetStorageImpl(), new_bytes);
  }
};

}  // namespace

void registerHooks() {
  static NPUHooks* hooks = new NPUHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace npu
