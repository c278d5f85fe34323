// The host kernels of the fused ops of fused.h (npu_rms_norm, npu_add_rms_norm,
// npu_swiglu, npu_rotary_mul and their backward ops). Each memory-bound kernel
// is one pass over its rows, parallel over rows with at::parallel_for,
// computing in float for the 16-bit types, with an inner loop over contiguous
// memory the compiler vectorises. On npu tensors the kernels run in stream
// order on host views of npu memory (HostExecution); cpu tensors run them
// directly. Their checks, meta kernels and registration: ops/fused/fused.cpp.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../../fused/fused.h"
#include "../dtypes.h"
#include "fast_exp.h"
#include "on_host.h"

namespace npu::ops::fused {
namespace {

// ---- vector loops (NPU_VECTOR_CLONES: on_host.h) -------------------------------------
NPU_VECTOR_CLONES float sumOfSquares(const float* x, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s;
}

NPU_VECTOR_CLONES void scaleRow(const float* x, const float* g, float inv, float* y, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * inv * g[j];
}

NPU_VECTOR_CLONES float dotOfThree(const float* a, const float* b, const float* c, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j] * c[j];
  return s;
}

NPU_VECTOR_CLONES void rmsBackwardRow(const float* dy, const float* x, const float* g, float r, float correction,
                                      float* dx, float* dgamma, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    dx[j] = r * dy[j] * g[j] - x[j] * correction;
    dgamma[j] += dy[j] * x[j] * r;
  }
}

NPU_VECTOR_CLONES void addRows(const float* a, const float* b, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
}

NPU_VECTOR_CLONES void swigluRow(const float* a, const float* b, float* y, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) y[k] = a[k] / (1.0f + vectorExp<false>(-a[k])) * b[k];
}

NPU_VECTOR_CLONES void swigluBackwardRow(const float* a, const float* b, const float* g, float* da, float* db,
                                         int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float sig = 1.0f / (1.0f + vectorExp<false>(-a[k]));
    da[k] = g[k] * b[k] * sig * (1.0f + a[k] * (1.0f - sig));
    db[k] = g[k] * a[k] * sig;
  }
}

// rotary_mode "half": y = x*c + cat(-x2, x1)*s, one row of d = 2h elements.
NPU_VECTOR_CLONES void rotaryHalfRow(const float* x, const float* c, const float* s, float* y, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) y[j] = x[j] * c[j] - x[j + h] * s[j];
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) y[j + h] = x[j + h] * c[j + h] + x[j] * s[j + h];
}

// dx for one row, and the row's terms of dr1 (g*x) and dr2 (g*rotate(x)) added
// into `dc` and `ds` (the r1/r2 rows this x row was multiplied with).
NPU_VECTOR_CLONES void rotaryHalfBackwardRow(const float* g, const float* x, const float* c, const float* s,
                                             float* dx, float* dc, float* ds, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    dx[j] = g[j] * c[j] + g[j + h] * s[j + h];
    dx[j + h] = g[j + h] * c[j + h] - g[j] * s[j];
    dc[j] += g[j] * x[j];
    dc[j + h] += g[j + h] * x[j + h];
    ds[j] -= g[j] * x[j + h];
    ds[j + h] += g[j + h] * x[j];
  }
}

// ---- RMSNorm -----------------------------------------------------------------------

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); with `residual`,
// x = self + residual first (and returned as x_sum).
std::tuple<at::Tensor, at::Tensor, at::Tensor> rmsNormImpl(const char* op, const at::Tensor& self,
                                                           const at::Tensor& residual, const at::Tensor& gamma,
                                                           double epsilon) {
  const int64_t n = checkRmsNorm(op, self, residual, gamma);
  return onHost(op, {self, residual, gamma}, [&](auto input, auto output) {
    const at::Tensor x = input(self);
    const at::Tensor r = input(residual);
    const at::Tensor g = input(gamma);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    at::Tensor y = emptyLike(x);
    at::Tensor rstd = emptyRstd(x, g);
    at::Tensor x_sum = r.defined() ? emptyLike(x) : at::Tensor();
    // Rows of no elements: the mean of nothing is NaN, as in the composition.
    if (n == 0) rstd.fill_(std::numeric_limits<float>::quiet_NaN());
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* rp = r.defined() ? r.const_data_ptr<scalar_t>() : nullptr;
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      scalar_t* sp = x_sum.defined() ? x_sum.mutable_data_ptr<scalar_t>() : nullptr;
      float* rstd_p = rstd.mutable_data_ptr<float>();
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        std::vector<acc_t> sum_row(rp != nullptr && !std::is_same_v<scalar_t, float> ? n : 0);
        for (int64_t row = begin; row < end; ++row) {
          const scalar_t* xr = xp + row * n;
          acc_t squares = 0;
          if (rp != nullptr && std::is_same_v<scalar_t, float>) {
            // (the casts only run for float; the branch is compiled for every type)
            auto* out_sum = reinterpret_cast<float*>(sp + row * n);
            addRows(reinterpret_cast<const float*>(xr), reinterpret_cast<const float*>(rp + row * n), out_sum, n);
            squares = sumOfSquares(out_sum, n);
          } else if (rp != nullptr) {
            const scalar_t* rr = rp + row * n;
            scalar_t* out_sum = sp + row * n;
            for (int64_t j = 0; j < n; ++j) {
              // x_sum is rounded to the dtype first, as the unfused x1 + x2 is.
              const scalar_t s = static_cast<scalar_t>(acc_t(xr[j]) + acc_t(rr[j]));
              out_sum[j] = s;
              sum_row[j] = acc_t(s);
              squares += sum_row[j] * sum_row[j];
            }
          } else if (std::is_same_v<scalar_t, float>) {
            squares = sumOfSquares(reinterpret_cast<const float*>(xr), n);
          } else {
            for (int64_t j = 0; j < n; ++j) squares += acc_t(xr[j]) * acc_t(xr[j]);
          }
          const acc_t inv = acc_t(1) / std::sqrt(squares / acc_t(n) + acc_t(epsilon));
          rstd_p[row] = static_cast<float>(inv);
          scalar_t* yr = yp + row * n;
          if (rp != nullptr && std::is_same_v<scalar_t, float>) {
            scaleRow(reinterpret_cast<const float*>(sp + row * n), reinterpret_cast<const float*>(gp), inv,
                     reinterpret_cast<float*>(yr), n);
          } else if (rp != nullptr) {
            for (int64_t j = 0; j < n; ++j) yr[j] = static_cast<scalar_t>(sum_row[j] * inv * acc_t(gp[j]));
          } else if (std::is_same_v<scalar_t, float>) {
            scaleRow(reinterpret_cast<const float*>(xr), reinterpret_cast<const float*>(gp), inv,
                     reinterpret_cast<float*>(yr), n);
          } else {
            for (int64_t j = 0; j < n; ++j) yr[j] = static_cast<scalar_t>(acc_t(xr[j]) * inv * acc_t(gp[j]));
          }
        }
      });
    });
    return std::make_tuple(output(y), output(rstd), output(x_sum));
  });
}

// ---- SwiGLU ------------------------------------------------------------------------

template <typename acc_t>
acc_t sigmoidOf(acc_t a) {
  return acc_t(1) / (acc_t(1) + std::exp(-a));
}

// ---- rotary embedding --------------------------------------------------------------

// Where each row of x (its last dimension) finds its row of r, r broadcast to x.
struct BroadcastRows {
  std::vector<int64_t> sizes;    // x's sizes without the last
  std::vector<int64_t> strides;  // r's expanded strides for them (0 where broadcast)
  BroadcastRows(const at::Tensor& x, const at::Tensor& r) {
    const auto expanded = r.expand(x.sizes());
    sizes.assign(x.sizes().begin(), x.sizes().end() - 1);
    strides.assign(expanded.strides().begin(), expanded.strides().end() - 1);
  }
  int64_t offset(int64_t row) const {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      off += (row % sizes[d]) * strides[d];
      row /= sizes[d];
    }
    return off;
  }
};

// The partner of element j in rotate(x) and its sign: rotate(x)[j] = sign * x[partner].
inline int64_t partner(RotaryMode mode, int64_t j, int64_t half, float* sign) {
  if (mode == RotaryMode::Half) {
    *sign = j < half ? -1.0f : 1.0f;
    return j < half ? j + half : j - half;
  }
  *sign = (j % 2 == 0) ? -1.0f : 1.0f;
  return (j % 2 == 0) ? j + 1 : j - 1;
}

}  // namespace

// ---- the kernels (fused.h) ---------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> rmsNorm(const at::Tensor& self, const at::Tensor& gamma, double epsilon) {
  auto [y, rstd, unused] = rmsNormImpl("npu_rms_norm", self, at::Tensor(), gamma, epsilon);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x1, const at::Tensor& x2,
                                                          const at::Tensor& gamma, double epsilon) {
  return rmsNormImpl("npu_add_rms_norm", x1, x2, gamma, epsilon);
}

// dx = rstd * (dy*gamma - x * rstd^2 * mean(dy*gamma*x)); dgamma = sum over rows of dy*x*rstd (float32).
std::tuple<at::Tensor, at::Tensor> rmsNormBackward(const at::Tensor& dy, const at::Tensor& self,
                                                   const at::Tensor& gamma, const at::Tensor& rstd) {
  constexpr const char* op = "npu_rms_norm_backward";
  const int64_t n = checkRmsNormBackward(op, dy, self, gamma, rstd);
  return onHost(op, {dy, self, gamma, rstd}, [&](auto input, auto output) {
    const at::Tensor g_out = input(dy);
    const at::Tensor x = input(self);
    const at::Tensor g = input(gamma);
    const at::Tensor inv = input(rstd);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    at::Tensor dx = emptyLike(x);
    at::Tensor dgamma = at::zeros(g.sizes(), x.options().dtype(at::kFloat));
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* dyp = g_out.const_data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const float* ip = inv.const_data_ptr<float>();
      scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
      float* dgp = dgamma.mutable_data_ptr<float>();
      // Each chunk's dgamma, summed in row order afterwards: the same result on every run.
      std::mutex merge;
      std::vector<std::pair<int64_t, std::vector<float>>> partials;
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> partial(n, 0.0f);
        for (int64_t row = begin; row < end; ++row) {
          const scalar_t* dyr = dyp + row * n;
          const scalar_t* xr = xp + row * n;
          const acc_t r = ip[row];
          scalar_t* dxr = dxp + row * n;
          if (std::is_same_v<scalar_t, float>) {
            // (the casts only run for float; the branch is compiled for every type)
            const auto* dyf = reinterpret_cast<const float*>(dyr);
            const auto* xf = reinterpret_cast<const float*>(xr);
            const auto* gf = reinterpret_cast<const float*>(gp);
            const float correction = r * r * r * dotOfThree(dyf, gf, xf, n) / float(n);
            rmsBackwardRow(dyf, xf, gf, r, correction, reinterpret_cast<float*>(dxr), partial.data(), n);
            continue;
          }
          acc_t dot = 0;
          for (int64_t j = 0; j < n; ++j) dot += acc_t(dyr[j]) * acc_t(gp[j]) * acc_t(xr[j]);
          const acc_t correction = r * r * r * dot / acc_t(n);
          for (int64_t j = 0; j < n; ++j) {
            dxr[j] = static_cast<scalar_t>(r * acc_t(dyr[j]) * acc_t(gp[j]) - acc_t(xr[j]) * correction);
            partial[j] += static_cast<float>(acc_t(dyr[j]) * acc_t(xr[j]) * r);
          }
        }
        std::lock_guard<std::mutex> lock(merge);
        partials.emplace_back(begin, std::move(partial));
      });
      std::sort(partials.begin(), partials.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [begin, partial] : partials) {
        for (int64_t j = 0; j < n; ++j) dgp[j] += partial[j];
      }
    });
    return std::make_tuple(output(dx), output(dgamma));
  });
}

at::Tensor swiglu(const at::Tensor& self, int64_t dim) {
  constexpr const char* op = "npu_swiglu";
  const GluShape s = gluShape(op, self, dim);
  return onHost(op, {self}, [&](auto input, auto output) {
    const at::Tensor x = input(self);
    at::Tensor out = emptySwiglu(x, dim, s);
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
      const int64_t block = s.half * s.inner;
      at::parallel_for(0, s.outer, 1, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const scalar_t* a = xp + o * 2 * block;
          const scalar_t* b = a + block;
          scalar_t* y = op_ + o * block;
          if (std::is_same_v<scalar_t, float>) {
            swigluRow(reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b),
                      reinterpret_cast<float*>(y), block);
            continue;
          }
          for (int64_t k = 0; k < block; ++k) {
            const acc_t av = a[k];
            y[k] = static_cast<scalar_t>(av * sigmoidOf(av) * acc_t(b[k]));
          }
        }
      });
    });
    return output(out);
  });
}

at::Tensor swigluBackward(const at::Tensor& grad, const at::Tensor& self, int64_t dim) {
  constexpr const char* op = "npu_swiglu_backward";
  const GluShape s = checkSwigluBackward(op, grad, self, dim);
  return onHost(op, {grad, self}, [&](auto input, auto output) {
    const at::Tensor g = input(grad);
    const at::Tensor x = input(self);
    at::Tensor dx = emptyLike(x);
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      scalar_t* dp = dx.mutable_data_ptr<scalar_t>();
      const int64_t block = s.half * s.inner;
      at::parallel_for(0, s.outer, 1, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const scalar_t* a = xp + o * 2 * block;
          const scalar_t* b = a + block;
          const scalar_t* gr = gp + o * block;
          scalar_t* da = dp + o * 2 * block;
          scalar_t* db = da + block;
          if (std::is_same_v<scalar_t, float>) {
            swigluBackwardRow(reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b),
                              reinterpret_cast<const float*>(gr), reinterpret_cast<float*>(da),
                              reinterpret_cast<float*>(db), block);
            continue;
          }
          for (int64_t k = 0; k < block; ++k) {
            const acc_t av = a[k];
            const acc_t sig = sigmoidOf(av);
            const acc_t gv = gr[k];
            da[k] = static_cast<scalar_t>(gv * acc_t(b[k]) * sig * (acc_t(1) + av * (acc_t(1) - sig)));
            db[k] = static_cast<scalar_t>(gv * av * sig);
          }
        }
      });
    });
    return output(dx);
  });
}

at::Tensor rotaryMul(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2, c10::string_view mode_name,
                     const std::optional<at::Tensor>& rotate) {
  constexpr const char* op = "npu_rotary_mul";
  if (rotate.has_value() && rotate->defined()) return rotaryMulComposed(self, r1, r2, *rotate);  // x @ rotate
  const RotaryMode mode = rotaryMode(std::string(mode_name));
  checkRotary(op, self, r1, r2);
  return onHost(op, {self, r1, r2}, [&](auto input, auto output) {
    const at::Tensor x = input(self);
    const at::Tensor c = input(r1);
    const at::Tensor s = input(r2);
    at::Tensor out = emptyLike(x);
    const int64_t d = x.size(-1);
    const int64_t rows = d == 0 ? 0 : x.numel() / d;
    const BroadcastRows c_rows(x, c), s_rows(x, s);
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* cp = c.const_data_ptr<scalar_t>();
      const scalar_t* sp = s.const_data_ptr<scalar_t>();
      scalar_t* yp = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const scalar_t* xr = xp + row * d;
          const scalar_t* cr = cp + c_rows.offset(row);
          const scalar_t* sr = sp + s_rows.offset(row);
          scalar_t* yr = yp + row * d;
          if (mode == RotaryMode::Half && std::is_same_v<scalar_t, float>) {
            rotaryHalfRow(reinterpret_cast<const float*>(xr), reinterpret_cast<const float*>(cr),
                          reinterpret_cast<const float*>(sr), reinterpret_cast<float*>(yr), d / 2);
            continue;
          }
          for (int64_t j = 0; j < d; ++j) {
            float sign;
            const int64_t k = partner(mode, j, d / 2, &sign);
            yr[j] = static_cast<scalar_t>(acc_t(xr[j]) * acc_t(cr[j]) + acc_t(sign) * acc_t(xr[k]) * acc_t(sr[j]));
          }
        }
      });
    });
    return output(out);
  });
}

// -> (dx, dr1, dr2): dx = g*r1 + rotate^T(g*r2); dr1 = sum_to(g*x), dr2 = sum_to(g*rotate(x)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> rotaryMulBackward(const at::Tensor& grad, const at::Tensor& self,
                                                                 const at::Tensor& r1, const at::Tensor& r2,
                                                                 c10::string_view mode_name) {
  constexpr const char* op = "npu_rotary_mul_backward";
  const RotaryMode mode = rotaryMode(std::string(mode_name));
  checkRotaryBackward(op, grad, self, r1, r2);
  return onHost(op, {grad, self, r1, r2}, [&](auto input, auto output) {
    const at::Tensor g = input(grad);
    const at::Tensor x = input(self);
    const at::Tensor c = input(r1);
    const at::Tensor s = input(r2);
    const int64_t d = x.size(-1);
    const int64_t rows = d == 0 ? 0 : x.numel() / d;
    at::Tensor dx = emptyLike(x);
    const BroadcastRows c_rows(x, c), s_rows(x, s);
    // dr1 and dr2 accumulate in float over the rows that share an r row: in
    // per-chunk partials (summed in chunk order afterwards, so every run gives
    // the same result), or straight into one buffer when no row is shared.
    const bool shared = c.numel() != x.numel() || s.numel() != x.numel();
    struct Partial {
      int64_t begin;
      std::vector<float> dc, ds;
    };
    std::mutex merge;
    std::vector<Partial> partials;
    std::vector<float> direct_c(shared ? 0 : c.numel(), 0.0f), direct_s(shared ? 0 : s.numel(), 0.0f);
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_fused_op", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* cp = c.const_data_ptr<scalar_t>();
      const scalar_t* sp = s.const_data_ptr<scalar_t>();
      scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        Partial partial{begin, std::vector<float>(shared ? c.numel() : 0, 0.0f),
                        std::vector<float>(shared ? s.numel() : 0, 0.0f)};
        float* dcp = shared ? partial.dc.data() : direct_c.data();
        float* dsp = shared ? partial.ds.data() : direct_s.data();
        for (int64_t row = begin; row < end; ++row) {
          const int64_t base = row * d;
          const int64_t c_off = c_rows.offset(row), s_off = s_rows.offset(row);
          if (mode == RotaryMode::Half && std::is_same_v<scalar_t, float>) {
            // (the casts only run for float; the branch is compiled for every type)
            rotaryHalfBackwardRow(reinterpret_cast<const float*>(gp + base), reinterpret_cast<const float*>(xp + base),
                                  reinterpret_cast<const float*>(cp + c_off), reinterpret_cast<const float*>(sp + s_off),
                                  reinterpret_cast<float*>(dxp + base), dcp + c_off, dsp + s_off, d / 2);
            continue;
          }
          for (int64_t j = 0; j < d; ++j) {
            float sign;
            const int64_t k = partner(mode, j, d / 2, &sign);
            const acc_t gj = gp[base + j];
            // rotate(x)[k] = -sign * x[j]: element j reaches output k through r2[k].
            dxp[base + j] = static_cast<scalar_t>(gj * acc_t(cp[c_off + j]) -
                                                  acc_t(sign) * acc_t(gp[base + k]) * acc_t(sp[s_off + k]));
            dcp[c_off + j] += static_cast<float>(gj * acc_t(xp[base + j]));
            dsp[s_off + j] += static_cast<float>(gj * acc_t(sign) * acc_t(xp[base + k]));
          }
        }
        if (shared) {
          std::lock_guard<std::mutex> lock(merge);
          partials.push_back(std::move(partial));
        }
      });
    });
    std::sort(partials.begin(), partials.end(), [](const Partial& a, const Partial& b) { return a.begin < b.begin; });
    auto gradient = [&](const at::Tensor& like, std::vector<float>& direct, std::vector<float> Partial::*part) {
      at::Tensor out = at::empty(like.sizes(), like.options().dtype(at::kFloat));
      float* op_ = out.mutable_data_ptr<float>();
      if (!shared) {
        std::copy(direct.begin(), direct.end(), op_);
      } else {
        std::fill(op_, op_ + out.numel(), 0.0f);
        for (const Partial& p : partials) {
          const std::vector<float>& values = p.*part;
          for (size_t i = 0; i < values.size(); ++i) op_[i] += values[i];
        }
      }
      return out.to(like.scalar_type());
    };
    return std::make_tuple(output(dx), output(gradient(c, direct_c, &Partial::dc)),
                           output(gradient(s, direct_s, &Partial::ds)));
  });
}

}  // namespace npu::ops::fused
