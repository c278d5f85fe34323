// The training ops of torch_npu.ops.training, with the Ascend adapter's
// signatures, defaults and results (MindSpeed's and diffusers' calls):
//   npu_geglu (and npu_geglu_grad): GELU-gated linear unit of two halves,
//   npu_fast_gelu (and its backward), fast_gelu: x * sigmoid(1.702 x),
//   npu_mish (and its backward): x * tanh(softplus(x)),
//   npu_group_norm_silu: GroupNorm then SiLU, with the mean and rstd,
//   npu_apply_adam_w.out, npu_apply_adam.out: one AdamW / Adam step in place,
//   npu_confusion_transpose (and its backward): permute and reshape,
//   npu_layer_norm_eval: F.layer_norm, npu_linear (and its backward): F.linear,
//   npu_sort_v2 (and .out): sorted values along the last dimension.
// Here: their schemas, argument checks, meta kernels, the composite kernels of
// those that are compositions of aten ops (they run as those ops run on the npu),
// the autograd kernel of the in-place optimizer ops and the registration of the
// host kernels (ops/host/fused/training_kernels.cpp). The other derivatives are
// registered from Python (torch_npu/ops/training.py).
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sort.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../../core/device.h"
#include "../../core/profile.h"
#include "../host/dtypes.h"
#include "common.h"
#include "training.h"

namespace npu::ops::training {

void checkDtype(const char* op, const at::Tensor& t, const char* name, DtypeSet allowed, const char* remedy) {
  NPU_OP_CHECK(allowed.contains(t.scalar_type()), op, t.device(), name, " must be ", allowed.pythonNames(), ", got ",
               t.scalar_type(), remedy);
}

void checkAclnnChip(const char* op, const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNPU) return;
  const auto& chip = profile::active();
  if (chip.kernel_families.empty() || chip.kernel_families.count("aclnn") != 0) return;
  TORCH_CHECK_NOT_IMPLEMENTED(false, "npu::", op, " (", t.device(), "): not available on ", chip.device_name,
                              " (device profile '", chip.name, "'): Ascend implements it only as an aclnn kernel, "
                              "which this chip lacks (an A2/A3 chip has it). Compose it from torch ops, or choose "
                              "an A2/A3 profile (NPU_EMU_PROFILE=ascend910b2)");
}

namespace {

void checkSameDtype(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like,
                    const char* like_name) {
  NPU_OP_CHECK(t.scalar_type() == like.scalar_type(), op, t.device(), name, " must have ", like_name, "'s dtype ",
               like.scalar_type(), ", got ", t.scalar_type(), " (cast it with .to(", like_name, ".dtype))");
}

void checkSameShape(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like,
                    const char* like_name) {
  NPU_OP_CHECK(t.sizes() == like.sizes(), op, t.device(), name, " must have ", like_name, "'s shape ", like.sizes(),
               ", got ", t.sizes());
}

void checkSameDevice(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like) {
  NPU_OP_CHECK(t.device() == like.device(), op, like.device(), name, " is on ", t.device(),
               "; move it with .to('", like.device(), "')");
}

}  // namespace

// ---- npu_geglu ----------------------------------------------------------------------------

GegluShape checkGeglu(const char* op, const at::Tensor& self, int64_t dim, int64_t approximate) {
  checkDtype(op, self, "self", floatingTypes());
  NPU_OP_CHECK(self.dim() >= 1 && self.dim() <= 8, op, self.device(), "self must have 1 to 8 dimensions, got shape ",
               self.sizes());
  NPU_OP_CHECK(dim >= -self.dim() && dim < self.dim(), op, self.device(), "dim ", dim, " is out of range for self ",
               self.sizes());
  TORCH_CHECK_VALUE(approximate == 0 || approximate == 1, "npu::", op, " (", self.device(),
                    "): approximate must be 0 (erf GELU) or 1 (tanh GELU), got ", approximate);
  GegluShape s;
  s.dim = c10::maybe_wrap_dim(dim, self.dim());
  NPU_OP_CHECK(self.size(s.dim) % 2 == 0, op, self.device(), "dimension ", dim, " of self ", self.sizes(),
               " must be even (it is split into two halves)");
  s.half.assign(self.sizes().begin(), self.sizes().end());
  s.half[s.dim] /= 2;
  return s;
}

GegluShape checkGegluGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& gelu, int64_t dim,
                          int64_t approximate) {
  constexpr const char* op = "npu_geglu_grad";
  GegluShape s = checkGeglu(op, self, dim, approximate);
  for (const auto& [t, name] : {std::pair{&grad, "grad_output"}, std::pair{&gelu, "gelu"}}) {
    checkSameDevice(op, *t, name, self);
    checkSameDtype(op, *t, name, self, "self");
    NPU_OP_CHECK(t->sizes() == at::IntArrayRef(s.half), op, self.device(), name, " must be npu_geglu's result shape ",
                 at::IntArrayRef(s.half), " (self halved along dim ", dim, "), got ", t->sizes());
  }
  return s;
}

// ---- npu_fast_gelu, npu_mish ------------------------------------------------------------------

void checkFastGelu(const char* op, const at::Tensor& self, const at::Tensor& grad) {
  checkDtype(op, self, "self", floatingTypes());
  NPU_OP_CHECK(self.dim() <= 8, op, self.device(), "self may have at most 8 dimensions, got shape ", self.sizes());
  if (grad.defined()) {
    checkSameDevice(op, grad, "grad", self);
    checkSameDtype(op, grad, "grad", self, "self");
    checkSameShape(op, grad, "grad", self, "self");
  }
}

void checkMish(const char* op, const at::Tensor& self, const at::Tensor& grad) {
  checkDtype(op, self, "self", DtypeSet{at::kFloat, at::kHalf},
             " (the Ascend kernel computes float16 and float32; cast it, or use torch.nn.functional.mish)");
  if (grad.defined()) {
    checkSameDevice(op, grad, "grad", self);
    checkSameDtype(op, grad, "grad", self, "input");
    checkSameShape(op, grad, "grad", self, "input");
  }
}

// ---- npu_group_norm_silu -----------------------------------------------------------------------

std::tuple<int64_t, int64_t, int64_t> checkGroupNormSilu(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& bias, int64_t group) {
  constexpr const char* op = "npu_group_norm_silu";
  checkDtype(op, input, "input", floatingTypes());
  NPU_OP_CHECK(input.dim() >= 2 && input.dim() <= 8, op, input.device(),
               "input must be [N, C, *] with 2 to 8 dimensions, got shape ", input.sizes());
  const int64_t n = input.size(0), c = input.size(1);
  TORCH_CHECK_VALUE(group > 0 && c % group == 0, "npu::", op, " (", input.device(), "): group (", group,
                    ") must be positive and divide the channels C = ", c);
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->has_value() || !(*t)->defined()) continue;
    checkSameDevice(op, **t, name, input);
    checkSameDtype(op, **t, name, input, "input");
    NPU_OP_CHECK((*t)->dim() == 1 && (*t)->size(0) == c, op, input.device(), name, " must be 1-D [C = ", c,
                 "], got ", (*t)->sizes());
  }
  return {n, c, n == 0 || c == 0 ? 0 : input.numel() / (n * c)};
}

// ---- npu_apply_adam_w, npu_apply_adam ---------------------------------------------------------

void checkAdam(const char* op, const at::Tensor& grad, const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
               const std::optional<at::Tensor>& max_grad_norm, bool amsgrad) {
  checkDtype(op, var, "var", floatingTypes());
  for (const auto& [t, name] : {std::pair{&m, "m"}, std::pair{&v, "v"}, std::pair{&grad, "grad"}}) {
    checkSameDevice(op, *t, name, var);
    checkSameDtype(op, *t, name, var, "var");
    checkSameShape(op, *t, name, var, "var");
  }
  const bool has_max = max_grad_norm.has_value() && max_grad_norm->defined();
  NPU_OP_CHECK(!amsgrad || has_max, op, var.device(), "amsgrad=True needs max_grad_norm (the running maximum of v, ",
               "var's shape)");
  if (has_max) {
    checkSameDevice(op, *max_grad_norm, "max_grad_norm", var);
    checkSameDtype(op, *max_grad_norm, "max_grad_norm", var, "var");
    checkSameShape(op, *max_grad_norm, "max_grad_norm", var, "var");
  }
}

namespace {

// ---- composite kernels: compositions of aten ops, run as those run -----------------------

std::vector<int64_t> checkPerm(const char* op, const at::Tensor& t, at::IntArrayRef perm, int64_t rank,
                               const char* of) {
  NPU_OP_CHECK(static_cast<int64_t>(perm.size()) == rank, op, t.device(), "perm ", perm, " must have one entry per ",
               "dimension of ", of, " (", rank, ")");
  std::vector<int64_t> inverse(rank, -1);
  for (const auto i : c10::irange(rank)) {
    const int64_t p = perm[i];
    NPU_OP_CHECK(p >= 0 && p < rank && inverse[p] == -1, op, t.device(), "perm ", perm,
                 " must be a permutation of 0..", rank - 1);
    inverse[p] = i;
  }
  return inverse;
}

void checkConfusionShape(const char* op, const at::Tensor& t, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (const int64_t s : shape) {
    NPU_OP_CHECK(s >= 0, op, t.device(), "shape ", shape, " must not have negative sizes");
    numel *= s;
  }
  NPU_OP_CHECK(numel == t.numel(), op, t.device(), "shape ", shape, " has ", numel, " elements, but the tensor ",
               t.sizes(), " has ", t.numel());
}

const DtypeSet kConfusionTypes{at::kFloat, at::kHalf,  at::kBFloat16, at::kChar,   at::kShort, at::kInt,
                               at::kLong,  at::kByte,  at::kUInt16,   at::kUInt32, at::kUInt64, at::kBool};

// transpose_first: x.permute(perm).reshape(shape); else x.reshape(shape).permute(perm); contiguous.
at::Tensor confusionTranspose(const at::Tensor& self, at::IntArrayRef perm, at::IntArrayRef shape,
                              bool transpose_first) {
  constexpr const char* op = "npu_confusion_transpose";
  checkDtype(op, self, "self", kConfusionTypes);
  checkConfusionShape(op, self, shape);
  if (transpose_first) {
    checkPerm(op, self, perm, self.dim(), "self");
    return self.permute(perm).reshape(shape).contiguous();
  }
  checkPerm(op, self, perm, static_cast<int64_t>(shape.size()), "shape");
  return self.reshape(shape).permute(perm).contiguous();
}

// The inverse: `shape` is the result's shape (the forward's input), `transpose_first`
// the opposite of the forward's (op-plugin's derivative passes !transpose_first).
at::Tensor confusionTransposeBackward(const at::Tensor& grad, at::IntArrayRef perm, c10::SymIntArrayRef sym_shape,
                                      bool transpose_first) {
  constexpr const char* op = "npu_confusion_transpose_backward";
  checkDtype(op, grad, "grad", kConfusionTypes);
  const std::vector<int64_t> shape = C10_AS_INTARRAYREF_SLOW(sym_shape).vec();
  checkConfusionShape(op, grad, shape);
  if (transpose_first) {
    const std::vector<int64_t> inverse = checkPerm(op, grad, perm, grad.dim(), "grad");
    return grad.permute(inverse).reshape(shape).contiguous();
  }
  const std::vector<int64_t> inverse = checkPerm(op, grad, perm, static_cast<int64_t>(shape.size()), "shape");
  std::vector<int64_t> permuted(shape.size());
  for (const auto i : c10::irange(shape.size())) permuted[i] = shape[perm[i]];
  return grad.reshape(permuted).permute(inverse).contiguous();
}

at::Tensor layerNormEval(const at::Tensor& input, at::IntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  constexpr const char* op = "npu_layer_norm_eval";
  checkDtype(op, input, "input", floatingTypes());
  const auto n = static_cast<int64_t>(normalized_shape.size());
  NPU_OP_CHECK(n >= 1 && n <= input.dim() && input.sizes().slice(input.dim() - n) == normalized_shape, op,
               input.device(), "normalized_shape ", normalized_shape, " must be the last dimensions of input ",
               input.sizes());
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->has_value() || !(*t)->defined()) continue;
    checkSameDevice(op, **t, name, input);
    NPU_OP_CHECK((*t)->sizes() == normalized_shape, op, input.device(), name, " must have normalized_shape ",
                 normalized_shape, ", got ", (*t)->sizes());
  }
  return at::layer_norm(input, normalized_shape, weight, bias, eps);
}

void checkLinear(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  checkDtype(op, input, "input", floatingTypes(),
             " (integer linear is not implemented on this npu: for int8 use torch_npu.npu_quant_matmul)");
  checkSameDevice(op, weight, "weight", input);
  checkSameDtype(op, weight, "weight", input, "input");
  NPU_OP_CHECK(input.dim() == 2 && weight.dim() == 2, op, input.device(),
               "input and weight must be 2-D ([M, K] and [N, K]), got ", input.sizes(), " and ", weight.sizes(),
               " (flatten the batch dimensions first)");
  NPU_OP_CHECK(input.size(1) == weight.size(1), op, input.device(), "input ", input.sizes(), " and weight ",
               weight.sizes(), " must share K (weight is [out_features, in_features])");
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "npu_linear";
  checkLinear(op, input, weight);
  if (bias.has_value() && bias->defined()) {
    checkSameDevice(op, *bias, "bias", input);
    checkSameDtype(op, *bias, "bias", input, "input");
    NPU_OP_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op, input.device(), "bias must be 1-D [N = ",
                 weight.size(0), "], got ", bias->sizes());
  }
  return at::linear(input, weight, bias);
}

std::tuple<at::Tensor, at::Tensor> linearBackward(const at::Tensor& grad, const at::Tensor& input,
                                                  const at::Tensor& weight) {
  constexpr const char* op = "npu_linear_backward";
  checkLinear(op, input, weight);
  checkSameDevice(op, grad, "grad", input);
  checkSameDtype(op, grad, "grad", input, "input");
  NPU_OP_CHECK(grad.dim() == 2 && grad.size(0) == input.size(0) && grad.size(1) == weight.size(0), op, input.device(),
               "grad must be npu_linear's result shape [", input.size(0), ", ", weight.size(0), "], got ",
               grad.sizes());
  return {at::matmul(grad, weight), at::matmul(grad.t(), input)};
}

void checkSortV2(const at::Tensor& self, int64_t dim) {
  constexpr const char* op = "npu_sort_v2";
  checkDtype(op, self, "self", floatingTypes(), " (torch.sort sorts the other dtypes)");
  const int64_t rank = std::max<int64_t>(self.dim(), 1);
  NPU_OP_CHECK(dim == -1 || dim == rank - 1, op, self.device(), "only the last dimension can be sorted (dim=-1, as ",
               "on Ascend), got dim=", dim, "; move the dimension last with .transpose(), or use torch.sort");
}

at::Tensor sortV2(const at::Tensor& self, int64_t dim, bool descending) {
  checkSortV2(self, dim);
  return std::get<0>(at::sort(self, -1, descending)).contiguous();
}

at::Tensor& sortV2Out(const at::Tensor& self, int64_t dim, bool descending, at::Tensor& out) {
  checkSortV2(self, dim);
  NPU_OP_CHECK(out.device() == self.device() && out.scalar_type() == self.scalar_type(), "npu_sort_v2.out",
               self.device(), "out must be a ", self.scalar_type(), " tensor on ", self.device(), ", got ",
               out.scalar_type(), " on ", out.device());
  const at::Tensor values = std::get<0>(at::sort(self, -1, descending));
  out.resize_(self.sizes());
  out.copy_(values);
  return out;
}

// The functional optimizer ops: Ascend's own raise, for they have no var, m, v to update.
template <const char* kOp>
std::tuple<at::Tensor, at::Tensor, at::Tensor> adamFunctional(const at::Tensor& grad) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "npu::", kOp, " (", grad.device(), "): only the out= form is implemented (as on ",
                              "Ascend, whose functional form raises): the op updates var, m and v in place; call ",
                              "torch_npu.", kOp, "(..., out=(var, m, v))");
}
constexpr char kAdamW[] = "npu_apply_adam_w";
constexpr char kAdam[] = "npu_apply_adam";

std::tuple<at::Tensor, at::Tensor, at::Tensor> adamWFunctional(const at::Scalar&, const at::Scalar&, const at::Scalar&,
                                                               const at::Scalar&, const at::Scalar&, const at::Scalar&,
                                                               const at::Scalar&, const at::Tensor& grad,
                                                               const std::optional<at::Tensor>&, std::optional<bool>,
                                                               std::optional<bool>) {
  return adamFunctional<kAdamW>(grad);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> adamFunctionalTf(const at::Scalar&, const at::Scalar&,
                                                                const at::Scalar&, const at::Scalar&,
                                                                const at::Scalar&, const at::Scalar&,
                                                                const at::Tensor& grad, std::optional<bool>,
                                                                std::optional<bool>) {
  return adamFunctional<kAdam>(grad);
}

// fast_gelu is npu_fast_gelu under its older name (differentiable through it).
at::Tensor fastGeluAlias(const at::Tensor& self) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("npu::npu_fast_gelu", "")
                                 .typed<at::Tensor(const at::Tensor&)>();
  return handle.call(self);
}

// ---- autograd of the in-place optimizer ops ------------------------------------------------

// An optimizer step: var, m and v are updated in place (no derivative, as on
// Ascend). Refuses tensors that require grad while grad mode is on (as aten's
// in-place ops refuse a leaf), runs below autograd, bumps the version counters.
template <const char* kOp>
void refuseGrad(std::initializer_list<const at::Tensor*> tensors) {
  if (!at::GradMode::is_enabled()) return;
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(!t->defined() || !t->requires_grad(), "npu::", kOp, " (", t->device(), "): updates var, m and v in ",
                "place and has no derivative (an optimizer step); got a tensor that requires grad. Call it under "
                "torch.no_grad(), as optimizers step");
  }
}

void bumpVersions(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) t->unsafeGetTensorImpl()->bump_version();
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamWOutAutograd(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& weight_decay,
    const at::Scalar& beta1, const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad,
    const std::optional<at::Tensor>& max_grad_norm, std::optional<bool> amsgrad, std::optional<bool> maximize,
    at::Tensor& var, at::Tensor& m, at::Tensor& v) {
  refuseGrad<kAdamW>({&var, &m, &v, &grad});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("npu::npu_apply_adam_w", "out")
                                   .typed<decltype(applyAdamWOut)>();
    handle.call(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad, max_grad_norm, amsgrad,
                maximize, var, m, v);
  }
  bumpVersions({&var, &m, &v});
  return {var, m, v};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamOutAutograd(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& beta1,
    const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad, std::optional<bool> use_locking,
    std::optional<bool> use_nesterov, at::Tensor& var, at::Tensor& m, at::Tensor& v) {
  refuseGrad<kAdam>({&var, &m, &v, &grad});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("npu::npu_apply_adam", "out")
                                   .typed<decltype(applyAdamOut)>();
    handle.call(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, use_locking, use_nesterov, var, m, v);
  }
  bumpVersions({&var, &m, &v});
  return {var, m, v};
}

// ---- meta kernels -------------------------------------------------------------------------

at::Tensor emptyLike(const at::Tensor& t) { return at::empty(t.sizes(), t.options()); }

std::tuple<at::Tensor, at::Tensor> gegluMeta(const at::Tensor& self, int64_t dim, int64_t approximate, bool) {
  const GegluShape s = checkGeglu("npu_geglu", self, dim, approximate);
  return {at::empty(s.half, self.options()), at::empty(s.half, self.options())};
}

at::Tensor gegluGradMeta(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& gelu, int64_t dim,
                         int64_t approximate, bool) {
  checkGegluGrad(grad, self, gelu, dim, approximate);
  return emptyLike(self);
}

at::Tensor fastGeluMeta(const at::Tensor& self) {
  checkFastGelu("npu_fast_gelu", self);
  return emptyLike(self);
}

at::Tensor fastGeluBackwardMeta(const at::Tensor& grad, const at::Tensor& self) {
  checkFastGelu("npu_fast_gelu_backward", self, grad);
  return emptyLike(self);
}

at::Tensor mishMeta(const at::Tensor& self) {
  checkMish("npu_mish", self);
  return emptyLike(self);
}

at::Tensor mishBackwardMeta(const at::Tensor& grad, const at::Tensor& input) {
  checkMish("npu_mish_backward", input, grad);
  return emptyLike(input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> groupNormSiluMeta(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, int64_t group,
                                                                 double) {
  const int64_t n = std::get<0>(checkGroupNormSilu(input, weight, bias, group));
  return {emptyLike(input), at::empty({n, group}, input.options()), at::empty({n, group}, input.options())};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamWOutMeta(
    const at::Scalar&, const at::Scalar&, const at::Scalar&, const at::Scalar&, const at::Scalar&, const at::Scalar&,
    const at::Scalar&, const at::Tensor& grad, const std::optional<at::Tensor>& max_grad_norm,
    std::optional<bool> amsgrad, std::optional<bool>, at::Tensor& var, at::Tensor& m, at::Tensor& v) {
  checkAdam("npu_apply_adam_w", grad, var, m, v, max_grad_norm, amsgrad.value_or(false));
  return {var, m, v};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamOutMeta(const at::Scalar&, const at::Scalar&,
                                                                   const at::Scalar&, const at::Scalar&,
                                                                   const at::Scalar&, const at::Scalar&,
                                                                   const at::Tensor& grad, std::optional<bool>,
                                                                   std::optional<bool>, at::Tensor& var,
                                                                   at::Tensor& m, at::Tensor& v) {
  checkAdam("npu_apply_adam", grad, var, m, v, std::nullopt, false);
  return {var, m, v};
}

}  // namespace

}  // namespace npu::ops::training

namespace npu::ops {

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_geglu(Tensor self, int dim=-1, int approximate=1, bool activate_left=False) -> (Tensor, Tensor)");
  m.def("npu_geglu_grad(Tensor grad_output, Tensor self, Tensor gelu, int dim=-1, int approximate=1, "
        "bool activate_left=False) -> Tensor");
  m.def("npu_apply_adam_w(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, Scalar beta1, "
        "Scalar beta2, Scalar epsilon, Tensor grad, Tensor? max_grad_norm, bool? amsgrad, bool? maximize) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("npu_apply_adam_w.out(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar weight_decay, Scalar beta1, "
        "Scalar beta2, Scalar epsilon, Tensor grad, Tensor? max_grad_norm, bool? amsgrad, bool? maximize, *, "
        "Tensor(a!) var, Tensor(b!) m, Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def("npu_apply_adam(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, "
        "Scalar epsilon, Tensor grad, bool? use_locking, bool? use_nesterov) -> (Tensor var, Tensor m, Tensor v)");
  m.def("npu_apply_adam.out(Scalar beta1_power, Scalar beta2_power, Scalar lr, Scalar beta1, Scalar beta2, "
        "Scalar epsilon, Tensor grad, bool? use_locking, bool? use_nesterov, *, Tensor(a!) var, Tensor(b!) m, "
        "Tensor(c!) v) -> (Tensor(a!), Tensor(b!), Tensor(c!))");
  m.def("npu_fast_gelu(Tensor self) -> Tensor");
  m.def("npu_fast_gelu_backward(Tensor grad, Tensor self) -> Tensor");
  m.def("fast_gelu(Tensor self) -> Tensor");
  m.def("npu_group_norm_silu(Tensor input, Tensor? weight, Tensor? bias, int group, float eps=0.00001) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("npu_confusion_transpose(Tensor self, int[] perm, int[] shape, bool transpose_first) -> Tensor");
  m.def("npu_confusion_transpose_backward(Tensor grad, int[] perm, SymInt[] shape, bool transpose_first) -> Tensor");
  m.def("npu_mish(Tensor self) -> Tensor");
  m.def("npu_mish_backward(Tensor grad, Tensor input) -> Tensor");
  m.def("npu_layer_norm_eval(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
        "float eps=1e-05) -> Tensor");
  m.def("npu_linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("npu_linear_backward(Tensor grad, Tensor input, Tensor weight) -> (Tensor, Tensor)");
  m.def("npu_sort_v2(Tensor self, int dim=-1, bool descending=False) -> Tensor");
  m.def("npu_sort_v2.out(Tensor self, int dim=-1, bool descending=False, *, Tensor(a!) out) -> Tensor(a!)");

  using c10::DispatchKey;
  m.impl("fast_gelu", DispatchKey::CompositeImplicitAutograd, TORCH_FN(training::fastGeluAlias));
  m.impl("npu_layer_norm_eval", DispatchKey::CompositeImplicitAutograd, TORCH_FN(training::layerNormEval));
  m.impl("npu_apply_adam_w", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::adamWFunctional));
  m.impl("npu_apply_adam", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::adamFunctionalTf));
  m.impl("npu_confusion_transpose", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::confusionTranspose));
  m.impl("npu_confusion_transpose_backward", DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(training::confusionTransposeBackward));
  m.impl("npu_linear", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::linear));
  m.impl("npu_linear_backward", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::linearBackward));
  m.impl("npu_sort_v2", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::sortV2));
  m.impl("npu_sort_v2.out", DispatchKey::CompositeExplicitAutograd, TORCH_FN(training::sortV2Out));
  m.impl("npu_apply_adam_w.out", DispatchKey::Autograd, TORCH_FN(training::applyAdamWOutAutograd));
  m.impl("npu_apply_adam.out", DispatchKey::Autograd, TORCH_FN(training::applyAdamOutAutograd));
}

void registerTrainingKernels(torch::Library& m) {
  m.impl("npu_geglu", TORCH_FN(training::geglu));
  m.impl("npu_geglu_grad", TORCH_FN(training::gegluGrad));
  m.impl("npu_fast_gelu", TORCH_FN(training::fastGelu));
  m.impl("npu_fast_gelu_backward", TORCH_FN(training::fastGeluBackward));
  m.impl("npu_mish", TORCH_FN(training::mish));
  m.impl("npu_mish_backward", TORCH_FN(training::mishBackward));
  m.impl("npu_group_norm_silu", TORCH_FN(training::groupNormSilu));
  m.impl("npu_apply_adam_w.out", TORCH_FN(training::applyAdamWOut));
  m.impl("npu_apply_adam.out", TORCH_FN(training::applyAdamOut));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerTrainingKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_geglu", TORCH_FN(training::gegluMeta));
  m.impl("npu_geglu_grad", TORCH_FN(training::gegluGradMeta));
  m.impl("npu_fast_gelu", TORCH_FN(training::fastGeluMeta));
  m.impl("npu_fast_gelu_backward", TORCH_FN(training::fastGeluBackwardMeta));
  m.impl("npu_mish", TORCH_FN(training::mishMeta));
  m.impl("npu_mish_backward", TORCH_FN(training::mishBackwardMeta));
  m.impl("npu_group_norm_silu", TORCH_FN(training::groupNormSiluMeta));
  m.impl("npu_apply_adam_w.out", TORCH_FN(training::applyAdamWOutMeta));
  m.impl("npu_apply_adam.out", TORCH_FN(training::applyAdamOutMeta));
}

}  // namespace npu::ops
