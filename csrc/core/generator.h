// The npu's random number generator. Like CUDA's Philox generator its state is
// a seed and an offset: each random kernel takes its draw (seed, offset) at
// launch, on the calling thread, and computes with a CPU engine of its own
// seeded from that draw. So torch.manual_seed(s) gives the same npu results
// every run, and a saved state replays, whichever thread runs the kernel.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/function_schema.h>
#include <c10/core/GeneratorImpl.h>

namespace npu {

class NPUGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NPUGeneratorImpl(c10::DeviceIndex device);
  void set_current_seed(uint64_t seed) override;  // also resets the offset
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  // 16 bytes: the seed and the offset (uint64 each), as torch.cuda's state.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // One kernel's draw: a CPU engine seeded from (seed, offset); the offset
  // advances. Thread-safe.
  at::Generator draw();

 private:
  NPUGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& defaultGenerator(c10::DeviceIndex device);
at::Generator newGenerator(c10::DeviceIndex device);
// The draw of one random kernel from `generator` (or from the device's default
// generator when it is undefined): a CPU engine for the kernel alone.
at::Generator drawFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device);
// While one lives on this thread, drawFor(no generator) returns `draw` (once per
// PreparedDraw) instead of drawing from the default generator: a graph replay
// draws on the host, at replay(), for kernels that draw inside (native_dropout).
class PreparedDraw {
 public:
  explicit PreparedDraw(at::Generator draw);
  ~PreparedDraw();
  PreparedDraw(const PreparedDraw&) = delete;
  PreparedDraw& operator=(const PreparedDraw&) = delete;
};
// Whether a schema argument is a `Generator?` (random ops).
bool isGeneratorArgument(const c10::Argument& arg);

}  // namespace npu
