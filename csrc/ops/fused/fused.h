// The fused ops of torch_npu.ops.fused (npu_rms_norm, npu_add_rms_norm,
// npu_swiglu, npu_rotary_mul and their backward ops): what their definitions
// (fused.cpp: checks, result shapes, meta kernels, registration) and their host
// kernels (ops/host/fused/fused_kernels.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace npu::ops::fused {

// ---- checks and result shapes (fused.cpp) ---------------------------------------------

// The results' shapes and dtypes (contiguous), for the kernels and their meta kernels alike.
at::Tensor emptyLike(const at::Tensor& t);
// rstd: float32, x's shape with the normalised dimensions kept as 1.
at::Tensor emptyRstd(const at::Tensor& x, const at::Tensor& gamma);
// -> the elements of a normalised row; `residual` (npu_add_rms_norm's x2) may be undefined.
int64_t checkRmsNorm(const char* op, const at::Tensor& self, const at::Tensor& residual, const at::Tensor& gamma);
int64_t checkRmsNormBackward(const char* op, const at::Tensor& dy, const at::Tensor& self, const at::Tensor& gamma,
                             const at::Tensor& rstd);

// x viewed as [outer, 2 * half, inner]: A = the first half along dim, B the second.
struct GluShape {
  int64_t outer = 1, half = 0, inner = 1;
};
GluShape gluShape(const char* op, const at::Tensor& x, int64_t dim);
// x with dimension `dim` halved.
at::Tensor emptySwiglu(const at::Tensor& x, int64_t dim, const GluShape& s);
GluShape checkSwigluBackward(const char* op, const at::Tensor& grad, const at::Tensor& self, int64_t dim);

enum class RotaryMode { Half, Interleave };
RotaryMode rotaryMode(const std::string& mode);
void checkRotary(const char* op, const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2);
void checkRotaryBackward(const char* op, const at::Tensor& grad, const at::Tensor& x, const at::Tensor& r1,
                         const at::Tensor& r2);
// npu_rotary_mul with an explicit rotation matrix: x * r1 + (x @ rotate) * r2, composed.
at::Tensor rotaryMulComposed(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2,
                             const at::Tensor& rotate);

// ---- host kernels (ops/host/fused/fused_kernels.cpp) ----------------------------------
// The npu and cpu kernels, with the ops' signatures; each checks its arguments first.

std::tuple<at::Tensor, at::Tensor> rmsNorm(const at::Tensor& self, const at::Tensor& gamma, double epsilon);
std::tuple<at::Tensor, at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x1, const at::Tensor& x2,
                                                          const at::Tensor& gamma, double epsilon);
std::tuple<at::Tensor, at::Tensor> rmsNormBackward(const at::Tensor& dy, const at::Tensor& self,
                                                   const at::Tensor& gamma, const at::Tensor& rstd);
at::Tensor swiglu(const at::Tensor& self, int64_t dim);
at::Tensor swigluBackward(const at::Tensor& grad, const at::Tensor& self, int64_t dim);
at::Tensor rotaryMul(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2, c10::string_view mode_name,
                     const std::optional<at::Tensor>& rotate);
std::tuple<at::Tensor, at::Tensor, at::Tensor> rotaryMulBackward(const at::Tensor& grad, const at::Tensor& self,
                                                                 const at::Tensor& r1, const at::Tensor& r2,
                                                                 c10::string_view mode_name);

}  // namespace npu::ops::fused
