// Random sampling in place on npu tensors. Draws come from the npu generator's
// engine, in stream order, so torch.manual_seed(s) makes them reproducible.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../core/generator.h"
#include "../core/launch.h"

namespace npu::ops {
namespace {

// Runs `draw(alias, engine)` on the stream (ATen's CPU kernels lock the engine).
template <typename Draw>
at::Tensor& sample(at::Tensor& self, const std::optional<at::Generator>& generator, const char* name, Draw draw) {
  if (self.numel() == 0) return self;
  at::Generator engine = engineFor(generator, self.device().index());
  auto alias = cpuAlias(self);
  launch(self.device().index(), name,
         [alias, engine, draw]() mutable { draw(alias, engine); },
         bytesOf(self));
  return self;
}

at::Tensor& normal(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::normal_", [mean, std](at::Tensor& t, at::Generator& g) { t.normal_(mean, std, g); });
}

at::Tensor& uniform(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::uniform_", [from, to](at::Tensor& t, at::Generator& g) { t.uniform_(from, to, g); });
}

at::Tensor& randomFromTo(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::random_", [from, to](at::Tensor& t, at::Generator& g) { t.random_(from, to, g); });
}

at::Tensor& randomTo(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::random_", [to](at::Tensor& t, at::Generator& g) { t.random_(to, g); });
}

at::Tensor& random(at::Tensor& self, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::random_", [](at::Tensor& t, at::Generator& g) { t.random_(g); });
}

at::Tensor& bernoulliFloat(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::bernoulli_", [p](at::Tensor& t, at::Generator& g) { t.bernoulli_(p, g); });
}

at::Tensor& exponential(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  return sample(self, gen, "aten::exponential_", [lambd](at::Tensor& t, at::Generator& g) { t.exponential_(lambd, g); });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("normal_", TORCH_FN(normal));
  m.impl("uniform_", TORCH_FN(uniform));
  m.impl("random_.from", TORCH_FN(randomFromTo));
  m.impl("random_.to", TORCH_FN(randomTo));
  m.impl("random_", TORCH_FN(random));
  m.impl("bernoulli_.float", TORCH_FN(bernoulliFloat));
  m.impl("exponential_", TORCH_FN(exponential));
}

}  // namespace npu::ops
