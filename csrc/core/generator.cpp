#include "generator.h"

#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <c10/util/CallOnce.h>

#include <array>
#include <cstring>
#include <deque>
#include <mutex>

#include "device.h"

namespace npu {

namespace {
constexpr int64_t kStateBytes = 16;

// splitmix64: spreads (seed, offset) pairs over the engine's seed space.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device)
    : c10::GeneratorImpl(c10::Device(kNPU, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(c10::default_rng_seed_val) {}

// Callers (torch.Generator's methods, ATen) hold mutex_ around these, as for
// every c10::GeneratorImpl; draw() takes it itself.
void NPUGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
uint64_t NPUGeneratorImpl::current_seed() const { return seed_; }
uint64_t NPUGeneratorImpl::seed() {
  set_current_seed(c10::detail::getNonDeterministicRandom());
  return seed_;
}
void NPUGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t NPUGeneratorImpl::get_offset() const { return offset_; }

void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK_TYPE(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.device().is_cpu(),
                   "the npu generator's state is a cpu uint8 tensor (from get_state()), got ",
                   new_state.dtype(), " on ", new_state.device());
  TORCH_CHECK_VALUE(new_state.numel() == kStateBytes, "the npu generator's state has ", kStateBytes,
                    " bytes (seed and offset, as get_state() returns it), got ", new_state.numel());
  TORCH_CHECK_VALUE(new_state.is_contiguous(), "the npu generator's state must be contiguous");
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  std::memcpy(&seed_, bytes, 8);
  std::memcpy(&offset_, bytes + 8, 8);
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  at::Tensor state = at::detail::empty_cpu({kStateBytes}, c10::kByte, std::nullopt, std::nullopt, std::nullopt,
                                           std::nullopt);
  auto* bytes = static_cast<uint8_t*>(state.data_ptr());
  std::memcpy(bytes, &seed_, 8);
  std::memcpy(bytes + 8, &offset_, 8);
  return state.getIntrusivePtr();
}

at::Generator NPUGeneratorImpl::draw() {
  uint64_t seed = 0;
  uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    seed = seed_;
    offset = offset_++;
  }
  return at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(offset)));
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* copy = new NPUGeneratorImpl(device().index());
  copy->seed_ = seed_;
  copy->offset_ = offset_;
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

namespace {
thread_local std::vector<at::Generator> t_prepared;
}  // namespace

PreparedDraw::PreparedDraw(at::Generator draw) { t_prepared.push_back(std::move(draw)); }
PreparedDraw::~PreparedDraw() { t_prepared.pop_back(); }

at::Generator drawFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device) {
  if (!t_prepared.empty() && !(generator.has_value() && generator->defined())) return t_prepared.back();
  const at::Generator& gen =
      generator.has_value() && generator->defined() ? *generator : defaultGenerator(device);
  TORCH_CHECK(gen.device().type() == kNPU, "expected an npu generator for an npu tensor, got a ",
              gen.device(), " generator; create one with torch.Generator(device='npu')");
  return gen.get<NPUGeneratorImpl>()->draw();
}

bool isGeneratorArgument(const c10::Argument& arg) {
  const auto& type = arg.type();
  return (type->kind() == c10::TypeKind::OptionalType &&
          type->containedType(0)->kind() == c10::TypeKind::GeneratorType) ||
         type->kind() == c10::TypeKind::GeneratorType;
}

}  // namespace npu
