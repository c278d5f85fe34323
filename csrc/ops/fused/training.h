// The training ops of torch_npu.ops.training (npu_geglu, npu_apply_adam_w,
// npu_apply_adam, npu_fast_gelu and fast_gelu, npu_group_norm_silu, npu_mish,
// npu_confusion_transpose, npu_layer_norm_eval, npu_linear, npu_sort_v2): what
// their definitions (training.cpp: checks, meta kernels, composite kernels,
// registration) and their host kernels (ops/host/fused/training_kernels.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "../host/dtypes.h"

namespace npu::ops::training {

// ---- checks and result shapes (training.cpp) ------------------------------------------

// "npu::op (device): name must be <allowed> ..., got <dtype><remedy>"
void checkDtype(const char* op, const at::Tensor& t, const char* name, DtypeSet allowed, const char* remedy = "");
// Refuses an npu tensor on a chip whose profile lacks the aclnn kernels (910A, 310P):
// Ascend implements `op` as an aclnn (op_api) kernel only.
void checkAclnnChip(const char* op, const at::Tensor& t);

// x split along `dim` into two halves; the shape of each.
struct GegluShape {
  int64_t dim = 0;
  std::vector<int64_t> half;
};
GegluShape checkGeglu(const char* op, const at::Tensor& self, int64_t dim, int64_t approximate);
GegluShape checkGegluGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& gelu, int64_t dim,
                          int64_t approximate);

void checkFastGelu(const char* op, const at::Tensor& self, const at::Tensor& grad = at::Tensor());
void checkMish(const char* op, const at::Tensor& self, const at::Tensor& grad = at::Tensor());

// -> (N, C, HxW)
std::tuple<int64_t, int64_t, int64_t> checkGroupNormSilu(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& bias, int64_t group);

// var, m, v and grad of one shape and dtype; max_grad_norm too with amsgrad.
void checkAdam(const char* op, const at::Tensor& grad, const at::Tensor& var, const at::Tensor& m, const at::Tensor& v,
               const std::optional<at::Tensor>& max_grad_norm, bool amsgrad);

// ---- host kernels (ops/host/fused/training_kernels.cpp) -------------------------------
// The npu and cpu kernels, with the ops' signatures; each checks its arguments first.

std::tuple<at::Tensor, at::Tensor> geglu(const at::Tensor& self, int64_t dim, int64_t approximate, bool activate_left);
at::Tensor gegluGrad(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& gelu, int64_t dim,
                     int64_t approximate, bool activate_left);
at::Tensor fastGelu(const at::Tensor& self);
at::Tensor fastGeluBackward(const at::Tensor& grad, const at::Tensor& self);
at::Tensor mish(const at::Tensor& self);
at::Tensor mishBackward(const at::Tensor& grad, const at::Tensor& self);
std::tuple<at::Tensor, at::Tensor, at::Tensor> groupNormSilu(const at::Tensor& input,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, int64_t group,
                                                             double eps);
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamWOut(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& weight_decay,
    const at::Scalar& beta1, const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad,
    const std::optional<at::Tensor>& max_grad_norm, std::optional<bool> amsgrad, std::optional<bool> maximize,
    at::Tensor& var, at::Tensor& m, at::Tensor& v);
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> applyAdamOut(
    const at::Scalar& beta1_power, const at::Scalar& beta2_power, const at::Scalar& lr, const at::Scalar& beta1,
    const at::Scalar& beta2, const at::Scalar& epsilon, const at::Tensor& grad, std::optional<bool> use_locking,
    std::optional<bool> use_nesterov, at::Tensor& var, at::Tensor& m, at::Tensor& v);

}  // namespace npu::ops::training
