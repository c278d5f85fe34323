// The npu's random number generator. Kernels of the emulated NPU draw from a
// CPU Philox/MT engine owned by this generator, so torch.manual_seed(s) gives
// the same npu results every run.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace npu {

class NPUGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NPUGeneratorImpl(c10::DeviceIndex device);
  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The engine kernels draw from (ATen's CPU kernels lock it while drawing).
  at::Generator& engine() { return engine_; }

 private:
  NPUGeneratorImpl* clone_impl() const override;
  at::Generator engine_;
};

const at::Generator& defaultGenerator(c10::DeviceIndex device);
at::Generator newGenerator(c10::DeviceIndex device);
// The CPU engine behind `generator` (or behind the device's default generator
// when it is undefined).
at::Generator engineFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device);

}  // namespace npu
