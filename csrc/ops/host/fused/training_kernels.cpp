// The host kernels of the training ops of training.h: ATen's CPU math on host
// tensors, in float32 for the 16-bit types (each result rounded once to the
// input's dtype); on npu tensors they run in stream order on host views of npu
// memory (HostExecution), on cpu tensors directly. Their checks, meta kernels
// and registration: ops/fused/training.cpp.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mish.h>
#include <ATen/ops/mish_backward.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "../../../core/profile.h"
#include "../../fused/training.h"
#include "on_host.h"

namespace npu::ops::training {
namespace {

// onHost (on_host.h) with the kernel's work, while a profiler runs: the tensors'
// traffic plus a result the size of the largest, `flops_per_element` operations each.
template <class Compute>
auto onHostProjected(const char* op, c10::ArrayRef<at::Tensor> tensors, Compute compute, double flops_per_element) {
  return onHost(op, tensors, compute, [&] {
    profile::KernelWork work;
    double largest = 0;
    for (const at::Tensor& t : tensors) {
      if (!t.defined()) continue;
      work.bytes += static_cast<double>(t.numel()) * static_cast<double>(t.itemsize());
      largest = std::max(largest, static_cast<double>(t.numel()));
    }
    work.dtype = tensors[0].scalar_type();
    work.bytes += largest * static_cast<double>(tensors[0].itemsize());
    work.flops = largest * flops_per_element;
    return profile::describe(work);
  });
}

at::Tensor toFloat(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

// The result in `like`'s dtype, contiguous.
at::Tensor rounded(const at::Tensor& result, const at::Tensor& like) {
  return result.to(like.scalar_type()).contiguous();
}

c10::string_view geluMode(int64_t approximate) { return approximate == 1 ? "tanh" : "none"; }

constexpr double kFastGeluAlpha = 1.702;

}  // namespace

// ---- npu_geglu ------------------------------------------------------------------------------

// y = lin * gelu(gate): gate the second half (activate_left=False) or the first.
std::tuple<at::Tensor, at::Tensor> geglu(const at::Tensor& self, int64_t dim, int64_t approximate, bool activate_left) {
  constexpr const char* op = "npu_geglu";
  const GegluShape s = checkGeglu(op, self, dim, approximate);
  checkAclnnChip(op, self);
  return onHostProjected(op, {self}, [&](auto input, auto output) {
    const at::Tensor x = toFloat(input(self));
    const auto halves = x.chunk(2, s.dim);
    const at::Tensor& gate = activate_left ? halves[0] : halves[1];
    const at::Tensor& lin = activate_left ? halves[1] : halves[0];
    const at::Tensor gelu = at::gelu(gate, geluMode(approximate));
    return std::make_tuple(output(rounded(lin * gelu, self)), output(rounded(gelu, self)));
  }, 12);
}

// d lin = grad * gelu(gate), d gate = grad * lin * gelu'(gate), back in self's halves.
at::Tensor gegluGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& gelu, int64_t dim,
                     int64_t approximate, bool activate_left) {
  constexpr const char* op = "npu_geglu_grad";
  const GegluShape s = checkGegluGrad(grad, self, gelu, dim, approximate);
  checkAclnnChip(op, self);
  return onHostProjected(op, {self, grad, gelu}, [&](auto input, auto output) {
    const at::Tensor x = toFloat(input(self)), g = toFloat(input(grad));
    const auto halves = x.chunk(2, s.dim);
    const at::Tensor& gate = activate_left ? halves[0] : halves[1];
    const at::Tensor& lin = activate_left ? halves[1] : halves[0];
    // gelu(gate) recomputed in float, rather than the rounded result of a 16-bit forward.
    const at::Tensor d_lin = g * at::gelu(gate, geluMode(approximate));
    const at::Tensor d_gate = at::gelu_backward(g * lin, gate, geluMode(approximate));
    at::Tensor dx = at::empty(self.sizes(), self.options().device(at::kCPU));
    auto parts = dx.chunk(2, s.dim);
    parts[activate_left ? 0 : 1].copy_(d_gate);
    parts[activate_left ? 1 : 0].copy_(d_lin);
    return output(dx);
  }, 16);
}

// ---- npu_fast_gelu, npu_mish -----------------------------------------------------------------

// x * sigmoid(1.702 x) (Ascend's x / (1 + exp(-1.702 x)))
at::Tensor fastGelu(const at::Tensor& self) {
  constexpr const char* op = "npu_fast_gelu";
  checkFastGelu(op, self);
  return onHostProjected(op, {self}, [&](auto input, auto output) {
    const at::Tensor x = toFloat(input(self));
    return output(rounded(x * at::sigmoid(x * kFastGeluAlpha), self));
  }, 4);
}

// grad * (s + 1.702 x s (1 - s)), s = sigmoid(1.702 x)
at::Tensor fastGeluBackward(const at::Tensor& grad, const at::Tensor& self) {
  constexpr const char* op = "npu_fast_gelu_backward";
  checkFastGelu(op, self, grad);
  return onHostProjected(op, {self, grad}, [&](auto input, auto output) {
    const at::Tensor x = toFloat(input(self)), g = toFloat(input(grad));
    const at::Tensor s = at::sigmoid(x * kFastGeluAlpha);
    return output(rounded(g * (s + x * s * (1 - s) * kFastGeluAlpha), self));
  }, 8);
}

at::Tensor mish(const at::Tensor& self) {
  constexpr const char* op = "npu_mish";
  checkMish(op, self);
  return onHostProjected(op, {self}, [&](auto input, auto output) {
    return output(rounded(at::mish(toFloat(input(self))), self));
  }, 6);
}

at::Tensor mishBackward(const at::Tensor& grad, const at::Tensor& input_) {
  constexpr const char* op = "npu_mish_backward";
  checkMish(op, input_, grad);
  return onHostProjected(op, {input_, grad}, [&](auto input, auto output) {
    return output(rounded(at::mish_backward(toFloat(input(grad)), toFloat(input(input_))), input_));
  }, 10);
}

// ---- npu_group_norm_silu ------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor> groupNormSilu(const at::Tensor& input_,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, int64_t group,
                                                             double eps) {
  constexpr const char* op = "npu_group_norm_silu";
  const auto shape = checkGroupNormSilu(input_, weight, bias, group);
  const int64_t n = std::get<0>(shape), c = std::get<1>(shape), hw = std::get<2>(shape);
  checkAclnnChip(op, input_);
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor(), b = bias.has_value() ? *bias : at::Tensor();
  return onHostProjected(op, {input_, w, b}, [&](auto input, auto output) {
    const at::Tensor x = toFloat(input(input_));
    const std::optional<at::Tensor> wf = w.defined() ? std::optional(toFloat(input(w))) : std::nullopt;
    const std::optional<at::Tensor> bf = b.defined() ? std::optional(toFloat(input(b))) : std::nullopt;
    if (x.numel() == 0) {
      const at::Tensor stats = at::empty({n, group}, input_.options().device(at::kCPU));
      return std::make_tuple(output(rounded(x, input_)), output(stats), output(stats.clone()));
    }
    auto [y, mean, rstd] = at::native_group_norm(x, wf, bf, n, c, hw, group, eps);
    return std::make_tuple(output(rounded(at::silu(y), input_)), output(rounded(mean, input_)),
                           output(rounded(rstd, input_)));
  }, 12);
}

// ---- npu_apply_adam_w, npu_apply_adam ----------------------------------------------------------

namespace {

// The new values, computed in float, written into var, m and v (their host aliases).
void writeBack(const at::Tensor& var, const at::Tensor& m, const at::Tensor& v, const at::Tensor& var_new,
               const at::Tensor& m_new, const at::Tensor& v_new) {
  var.copy_(var_new);
  m.copy_(m_new);
  v.copy_(v_new);
}

}  // namespace

// With b1p = beta1_power * beta1, b2p = beta2_power * beta2 (callers pass beta^(step-1)):
// m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2 (g = -grad with maximize),
// var = var (1 - lr wd) - lr m / (1 - b1p) / (sqrt(v' / (1 - b2p)) + eps),
// v' = max(max_grad_norm, v) with amsgrad, else v.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamWOut(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& weight_decay,
    const at::Scalar& beta1, const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad,
    const std::optional<at::Tensor>& max_grad_norm, std::optional<bool> amsgrad, std::optional<bool> maximize,
    at::Tensor& var, at::Tensor& m, at::Tensor& v) {
  constexpr const char* op = "npu_apply_adam_w";
  const bool ams = amsgrad.value_or(false);
  checkAdam(op, grad, var, m, v, max_grad_norm, ams);
  const double b1 = beta1.toDouble(), b2 = beta2.toDouble(), eps = epsilon.toDouble(), rate = lr.toDouble();
  double b1p = beta1_power.toDouble() * b1, b2p = beta2_power.toDouble() * b2;
  // A bias correction of zero: the kernel moves the power by eps (msprobe's reference of it does the same).
  if (1 - b1p == 0) b1p -= eps;
  if (ams && 1 - b2p == 0) b2p -= eps;
  const at::Tensor mx = ams ? *max_grad_norm : at::Tensor();
  onHostProjected(op, {var, m, v, grad, mx}, [&](auto input, auto inout, auto) {
    const at::Tensor g0 = toFloat(input(grad));
    const at::Tensor g = maximize.value_or(false) ? -g0 : g0;
    const at::Tensor hv = inout(var), hm = inout(m), hs = inout(v);
    const at::Tensor m_new = toFloat(hm) * b1 + g * (1 - b1);
    const at::Tensor v_new = toFloat(hs) * b2 + g * g * (1 - b2);
    const at::Tensor second = ams ? at::maximum(toFloat(input(mx)), v_new) : v_new;
    const at::Tensor denom = at::sqrt(second / (1 - b2p)) + eps;
    const at::Tensor var_new = toFloat(hv) * (1 - rate * weight_decay.toDouble()) - m_new * (rate / (1 - b1p)) / denom;
    writeBack(hv, hm, hs, var_new, m_new, v_new);
    return 0;
  }, 14);
  return {var, m, v};
}

// TensorFlow's ApplyAdam (beta powers are beta^t): lr_t = lr sqrt(1 - b2p) / (1 - b1p),
// m += (1 - beta1)(g - m), v += (1 - beta2)(g^2 - v), var -= lr_t m / (sqrt(v) + eps);
// nesterov: var -= lr_t (beta1 m + (1 - beta1) g) / (sqrt(v) + eps).
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamOut(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& beta1,
    const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad, std::optional<bool> use_locking,
    std::optional<bool> use_nesterov, at::Tensor& var, at::Tensor& m, at::Tensor& v) {
  constexpr const char* op = "npu_apply_adam";
  (void)use_locking;  // TensorFlow's lock around the update: one stream orders the updates here
  checkAdam(op, grad, var, m, v, std::nullopt, false);
  const double b1 = beta1.toDouble(), b2 = beta2.toDouble(), eps = epsilon.toDouble();
  const double lr_t = lr.toDouble() * std::sqrt(1 - beta2_power.toDouble()) / (1 - beta1_power.toDouble());
  onHostProjected(op, {var, m, v, grad}, [&](auto input, auto inout, auto) {
    const at::Tensor g = toFloat(input(grad));
    const at::Tensor hv = inout(var), hm = inout(m), hs = inout(v);
    const at::Tensor m_f = toFloat(hm), v_f = toFloat(hs);
    const at::Tensor m_new = m_f + (g - m_f) * (1 - b1);
    const at::Tensor v_new = v_f + (g * g - v_f) * (1 - b2);
    const at::Tensor step = use_nesterov.value_or(false) ? m_new * b1 + g * (1 - b1) : m_new;
    const at::Tensor var_new = toFloat(hv) - step * lr_t / (at::sqrt(v_new) + eps);
    writeBack(hv, hm, hs, var_new, m_new, v_new);
    return 0;
  }, 12);
  return {var, m, v};
}

}  // namespace npu::ops::training
