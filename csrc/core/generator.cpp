#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/CallOnce.h>

#include <array>
#include <deque>
#include <mutex>

#include "device.h"

namespace npu {

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device)
    : c10::GeneratorImpl(c10::Device(kNPU, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      engine_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

void NPUGeneratorImpl::set_current_seed(uint64_t seed) { engine_.set_current_seed(seed); }
uint64_t NPUGeneratorImpl::current_seed() const { return engine_.current_seed(); }
uint64_t NPUGeneratorImpl::seed() { return engine_.seed(); }

void NPUGeneratorImpl::set_offset(uint64_t /*offset*/) {
  TORCH_CHECK(false, "the npu generator has no offset (it is a Mersenne Twister, not Philox); "
                     "use get_state()/set_state() to save and restore it");
}
uint64_t NPUGeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "the npu generator has no offset; use get_state()/set_state()");
}

void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) { engine_.unsafeGetGeneratorImpl()->set_state(new_state); }
c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  return engine_.unsafeGetGeneratorImpl()->get_state();
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* copy = new NPUGeneratorImpl(device().index());
  copy->engine_ = engine_.clone();
  return copy;
}

namespace {
std::once_flag g_generators_once;
std::deque<at::Generator> g_default_generators;
}  // namespace

const at::Generator& defaultGenerator(c10::DeviceIndex device) {
  std::call_once(g_generators_once, [] {
    for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
      g_default_generators.push_back(at::make_generator<NPUGeneratorImpl>(i));
    }
  });
  device = resolveDevice(device);
  checkDevice(device);
  return g_default_generators[device];
}

at::Generator newGenerator(c10::DeviceIndex device) {
  device = resolveDevice(device);
  checkDevice(device);
  return at::make_generator<NPUGeneratorImpl>(device);
}

at::Generator engineFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device) {
  const at::Generator& gen =
      generator.has_value() && generator->defined() ? *generator : defaultGenerator(device);
  TORCH_CHECK(gen.device().type() == kNPU, "expected an npu generator for an npu tensor, got a ",
              gen.device(), " generator; create one with torch.Generator(device='npu')");
  return gen.get<NPUGeneratorImpl>()->engine();
}

}  // namespace npu
