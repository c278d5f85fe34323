// c10's DeviceGuardImplInterface for the npu: what device guards, torch.Stream,
// torch.Event and autograd's stream handling call.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "allocator.h"
#include "capture.h"
#include "device.h"
#include "stream.h"

namespace npu {
namespace {

runtime::Event& asEvent(void* event) { return *static_cast<runtime::Event*>(event); }

struct NPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kNPU;

  c10::DeviceType type() const override { return kNPU; }

  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kNPU);
    const auto old = currentDevice();
    if (device.index() != old) npu::setDevice(device.index());
    return c10::Device(kNPU, old);
  }
  c10::Device getDevice() const override { return c10::Device(kNPU, currentDevice()); }
  void setDevice(c10::Device device) const override { npu::setDevice(device.index()); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      npu::setDevice(device.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device device) const override { return currentStream(device.index()); }
  c10::Stream getDefaultStream(c10::Device device) const override { return defaultStream(device.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override {
    return streamFromPool(device.index(), high_priority);
  }
  // torch.Stream() / torch.npu.Stream(): from the pool, as torch.cuda.Stream() does,
  // so creating streams in a loop does not create a worker thread each time.
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return streamFromPool(device.index(), priority < 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override { return npu::exchangeStream(stream); }
  c10::DeviceIndex deviceCount() const noexcept override { return npu::deviceCount(); }

  // torch.accelerator.get_device_capability(): the dtypes the op library's
  // kernels compute in (complex64 for torch.fft; float64 is not among them: it
  // takes the CPU fallback), as XPU leaves out float64 on devices without it.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    checkDevice(resolveDevice(device.index()));
    c10::DeviceCapability capability;
    capability.capability_data.capability_bits = 0;
#define NPU_NATIVE_DTYPE(_, name)                      \
  if (computesNatively(c10::ScalarType::name)) {       \
    capability.capability_data.capability_bits |= 1ULL << c10::kIndex_##name; \
  }
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(NPU_NATIVE_DTYPE)
#undef NPU_NATIVE_DTYPE
    return capability;
  }

  bool queryStream(const c10::Stream& stream) const override { return npu::queryStream(stream); }
  void synchronizeStream(const c10::Stream& stream) const override {
    npu::synchronizeStream(stream, "Stream.synchronize()");
  }
  void synchronizeDevice(c10::DeviceIndex device) const override { npu::synchronizeDevice(device); }
  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& stream) const override {
    allocator::recordStream(ptr, stream);
  }

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device,
              c10::EventFlag flag) const override {
    TORCH_CHECK(device == -1 || device == stream.device_index(), "Event device index ",
                static_cast<int>(device), " does not match the recording stream's device ",
                static_cast<int>(stream.device_index()));
    auto& rt_stream = runtimeStream(stream);
    if (*event == nullptr) {
      const bool timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = runtimeDevice(stream.device_index()).createEvent(timing).release();
    }
    auto& e = asEvent(*event);
    TORCH_CHECK(e.device() == stream.device_index(), "an event created on npu:", e.device(),
                " cannot be recorded on a stream of npu:", static_cast<int>(stream.device_index()));
    e.record(rt_stream);
    capture::eventRecorded(*event, stream.device_index(), stream.id());
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    runtimeStream(stream).wait(asEvent(event));
    capture::eventWaited(event, stream.device_index(), stream.id());
  }
  bool queryEvent(void* event) const override { return event == nullptr || asEvent(event).query(); }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    capture::checkNotCapturing(static_cast<c10::DeviceIndex>(asEvent(event).device()), "Event.synchronize()");
    translateRuntimeErrors("Event.synchronize()", [&] { asEvent(event).synchronize(); });
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex /*device*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "elapsed_time: both events must be recorded first (event.record())");
    checkTimingEvents(asEvent(start).device(), "Event.elapsed_time()");
    return translateRuntimeErrors("Event.elapsed_time()", [&] { return asEvent(start).elapsedMs(asEvent(end)); });
  }
  void destroyEvent(void* event, c10::DeviceIndex /*device*/) const noexcept override {
    try {
      capture::eventDestroyed(event);
    } catch (...) {  // NOLINT(bugprone-empty-catch): noexcept; the tag only matters while its capture lasts
    }
    delete static_cast<runtime::Event*>(event);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NPUGuardImpl);

}  // namespace npu
