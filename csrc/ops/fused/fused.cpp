// The fused ops of torch_npu.ops.fused, with the Ascend adapter's signatures:
// npu_rms_norm, npu_add_rms_norm, npu_swiglu, npu_rotary_mul (and their
// backward ops), npu_fused_add_matmul. Here: the npu library's schemas, the
// argument checks and result shapes, the meta kernels (the same checks and
// shapes, for fake tensors) and the registration of the host kernels
// (ops/host/fused/fused_kernels.cpp) for npu and cpu tensors. Autograd is
// registered from Python (torch_npu/ops/fused.py).
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../host/dtypes.h"
#include "common.h"
#include "fused.h"

namespace npu::ops::fused {
namespace {

void checkFloating(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(floatingTypes().contains(t.scalar_type()), "npu::", op, ": ", name, " must be ",
              floatingTypes().pythonNames(), ", got ", t.scalar_type());
}

// Rows of x over the last gamma.dim() dimensions.
int64_t normalizedSize(const char* op, const at::Tensor& x, const at::Tensor& gamma) {
  checkFloating(op, x, "self");
  TORCH_CHECK(gamma.scalar_type() == x.scalar_type(), "npu::", op, ": gamma must have self's dtype ",
              x.scalar_type(), ", got ", gamma.scalar_type());
  TORCH_CHECK(gamma.dim() >= 1 && gamma.dim() <= x.dim() &&
                  x.sizes().slice(x.dim() - gamma.dim()) == gamma.sizes(),
              "npu::", op, ": gamma's shape ", gamma.sizes(), " must match the last dimensions of self ", x.sizes());
  return gamma.numel();
}

}  // namespace

// ---- RMSNorm -----------------------------------------------------------------------

// rstd: float32, x's shape with the normalised dimensions kept as 1.
at::Tensor emptyRstd(const at::Tensor& x, const at::Tensor& gamma) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - gamma.dim());
  shape.insert(shape.end(), gamma.dim(), 1);
  return at::empty(shape, x.options().dtype(at::kFloat));
}

int64_t checkRmsNorm(const char* op, const at::Tensor& self, const at::Tensor& residual, const at::Tensor& gamma) {
  const int64_t n = normalizedSize(op, self, gamma);
  if (residual.defined()) {
    TORCH_CHECK(residual.sizes() == self.sizes() && residual.scalar_type() == self.scalar_type(), "npu::", op,
                ": x2 must have x1's shape and dtype, got ", residual.sizes(), " ", residual.scalar_type());
  }
  return n;
}

int64_t checkRmsNormBackward(const char* op, const at::Tensor& dy, const at::Tensor& self, const at::Tensor& gamma,
                             const at::Tensor& rstd) {
  const int64_t n = normalizedSize(op, self, gamma);
  TORCH_CHECK(dy.sizes() == self.sizes() && dy.scalar_type() == self.scalar_type(), "npu::", op,
              ": dy must have self's shape and dtype");
  TORCH_CHECK(rstd.scalar_type() == at::kFloat && rstd.numel() * n == self.numel(), "npu::", op,
              ": rstd must be the float32 result of npu_rms_norm");
  return n;
}

// The results' shapes and dtypes (contiguous), for the kernels and their meta kernels alike.
at::Tensor emptyLike(const at::Tensor& t) { return at::empty(t.sizes(), t.options()); }

// ---- SwiGLU ------------------------------------------------------------------------

GluShape gluShape(const char* op, const at::Tensor& x, int64_t dim) {
  checkFloating(op, x, "self");
  TORCH_CHECK(x.dim() > 0, "npu::", op, ": self must have at least one dimension");
  const int64_t d = c10::maybe_wrap_dim(dim, x.dim());
  TORCH_CHECK(x.size(d) % 2 == 0, "npu::", op, ": dimension ", dim, " of size ", x.size(d),
              " must be even (it is split into two halves)");
  GluShape s;
  for (int64_t i = 0; i < d; ++i) s.outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i) s.inner *= x.size(i);
  s.half = x.size(d) / 2;
  return s;
}

// x with dimension `dim` halved.
at::Tensor emptySwiglu(const at::Tensor& x, int64_t dim, const GluShape& s) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[c10::maybe_wrap_dim(dim, x.dim())] = s.half;
  return at::empty(shape, x.options());
}

GluShape checkSwigluBackward(const char* op, const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  const GluShape s = gluShape(op, self, dim);
  TORCH_CHECK(grad.numel() * 2 == self.numel() && grad.scalar_type() == self.scalar_type(), "npu::", op,
              ": grad_output must be shaped like npu_swiglu's result, with self's dtype");
  return s;
}

// ---- rotary embedding --------------------------------------------------------------

RotaryMode rotaryMode(const std::string& mode) {
  if (mode == "half") return RotaryMode::Half;
  if (mode == "interleave") return RotaryMode::Interleave;
  TORCH_CHECK_VALUE(false, "npu::npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got '", mode, "'");
}

void checkRotary(const char* op, const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2) {
  checkFloating(op, x, "self");
  for (const at::Tensor* r : {&r1, &r2}) {
    TORCH_CHECK(r->scalar_type() == x.scalar_type(), "npu::", op, ": r1 and r2 must have self's dtype ",
                x.scalar_type(), ", got ", r->scalar_type());
    TORCH_CHECK(r->dim() <= x.dim() && r->size(-1) == x.size(-1) && at::is_expandable_to(r->sizes(), x.sizes()),
                "npu::", op, ": r1 and r2 must broadcast to self's shape ", x.sizes(), " with the same last "
                "dimension, got ", r->sizes());
  }
  TORCH_CHECK(x.size(-1) % 2 == 0, "npu::", op, ": the last dimension (", x.size(-1), ") must be even");
}

void checkRotaryBackward(const char* op, const at::Tensor& grad, const at::Tensor& x, const at::Tensor& r1,
                         const at::Tensor& r2) {
  checkRotary(op, x, r1, r2);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(), "npu::", op,
              ": grad must have self's shape and dtype");
}

at::Tensor rotaryMulComposed(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2,
                             const at::Tensor& rotate) {
  return self.mul(r1).add_(at::matmul(self, rotate).mul_(r2));
}

namespace {

at::Tensor fusedAddMatmul(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 2 && w.size(0) == x.size(-1) && w.size(1) == x.size(-1),
              "npu::npu_fused_add_matmul: x @ w + x needs a square w of x's last dimension ", x.size(-1),
              ", got ", w.sizes());
  return at::matmul(x, w).add_(x);
}

// ---- meta kernels ------------------------------------------------------------------
// The host kernels' checks, shapes and dtypes, without computing: what fake
// tensors (torch.compile, torch.export) get. One definition of each rule.

std::tuple<at::Tensor, at::Tensor> rmsNormMeta(const at::Tensor& self, const at::Tensor& gamma, double) {
  checkRmsNorm("npu_rms_norm", self, at::Tensor(), gamma);
  return {emptyLike(self), emptyRstd(self, gamma)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> addRmsNormMeta(const at::Tensor& x1, const at::Tensor& x2,
                                                              const at::Tensor& gamma, double) {
  checkRmsNorm("npu_add_rms_norm", x1, x2, gamma);
  return {emptyLike(x1), emptyRstd(x1, gamma), emptyLike(x1)};
}

std::tuple<at::Tensor, at::Tensor> rmsNormBackwardMeta(const at::Tensor& dy, const at::Tensor& self,
                                                       const at::Tensor& gamma, const at::Tensor& rstd) {
  checkRmsNormBackward("npu_rms_norm_backward", dy, self, gamma, rstd);
  return {emptyLike(self), at::empty(gamma.sizes(), self.options().dtype(at::kFloat))};
}

at::Tensor swigluMeta(const at::Tensor& self, int64_t dim) {
  return emptySwiglu(self, dim, gluShape("npu_swiglu", self, dim));
}

at::Tensor swigluBackwardMeta(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  checkSwigluBackward("npu_swiglu_backward", grad, self, dim);
  return emptyLike(self);
}

at::Tensor rotaryMulMeta(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2,
                         c10::string_view mode_name, const std::optional<at::Tensor>& rotate) {
  if (rotate.has_value() && rotate->defined()) return rotaryMulComposed(self, r1, r2, *rotate);
  rotaryMode(std::string(mode_name));
  checkRotary("npu_rotary_mul", self, r1, r2);
  return emptyLike(self);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rotaryMulBackwardMeta(const at::Tensor& grad, const at::Tensor& self,
                                                                     const at::Tensor& r1, const at::Tensor& r2,
                                                                     c10::string_view mode_name) {
  rotaryMode(std::string(mode_name));
  checkRotaryBackward("npu_rotary_mul_backward", grad, self, r1, r2);
  return {emptyLike(self), emptyLike(r1), emptyLike(r2)};
}

}  // namespace

}  // namespace npu::ops::fused

namespace npu::ops {

TORCH_LIBRARY(npu, m) {
  m.def("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  m.def("npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)");
  m.def("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)");
  m.def("npu_swiglu(Tensor self, int dim=-1) -> Tensor");
  m.def("npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor");
  m.def("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor");
  m.def("npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> "
        "(Tensor, Tensor, Tensor)");
  m.def("npu_fused_add_matmul(Tensor x, Tensor w) -> Tensor");
  // The Ascend adapter's fused attention; composed in Python (torch_npu/_attention.py)
  // for CompositeImplicitAutograd: autograd and fake tensors go through the composition.
  m.def("npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
        "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
        "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)");
  // x @ w + x: one matmul and one in-place add; autograd differentiates through them.
  m.impl("npu_fused_add_matmul", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(fused::fusedAddMatmul));
}

void registerFusedKernels(torch::Library& m) {
  m.impl("npu_rms_norm", TORCH_FN(fused::rmsNorm));
  m.impl("npu_rms_norm_backward", TORCH_FN(fused::rmsNormBackward));
  m.impl("npu_add_rms_norm", TORCH_FN(fused::addRmsNorm));
  m.impl("npu_swiglu", TORCH_FN(fused::swiglu));
  m.impl("npu_swiglu_backward", TORCH_FN(fused::swigluBackward));
  m.impl("npu_rotary_mul", TORCH_FN(fused::rotaryMul));
  m.impl("npu_rotary_mul_backward", TORCH_FN(fused::rotaryMulBackward));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerFusedKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_rms_norm", TORCH_FN(fused::rmsNormMeta));
  m.impl("npu_rms_norm_backward", TORCH_FN(fused::rmsNormBackwardMeta));
  m.impl("npu_add_rms_norm", TORCH_FN(fused::addRmsNormMeta));
  m.impl("npu_swiglu", TORCH_FN(fused::swigluMeta));
  m.impl("npu_swiglu_backward", TORCH_FN(fused::swigluBackwardMeta));
  m.impl("npu_rotary_mul", TORCH_FN(fused::rotaryMulMeta));
  m.impl("npu_rotary_mul_backward", TORCH_FN(fused::rotaryMulBackwardMeta));
}

}  // namespace npu::ops
