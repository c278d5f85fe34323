// The host kernels of the positional and sampling ops of position.h. The
// memory-bound kernels are one pass over rows, parallel with at::parallel_for,
// computing in float for the 16-bit types; on npu tensors they run in stream
// order on host views of npu memory (HostExecution), on cpu tensors directly.
// Their checks, meta kernels and registration: ops/fused/position.cpp.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/triu.h>
#include <c10/core/InferenceMode.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "../../../core/profile.h"
#include "../../fused/position.h"
#include "../dtypes.h"
#include "fast_exp.h"
#include "on_host.h"
#include "quant_param.h"

namespace npu::ops::position {
namespace {

// ---- running on the host -------------------------------------------------------------

// What the op does, for its projected time on a profile's chip while a
// profiler runs: the tensors' traffic plus an output the size of the largest,
// one operation per element, or `cube_flops` on the matrix unit.
profile::KernelWork kernelWork(c10::ArrayRef<at::Tensor> tensors, double cube_flops) {
  profile::KernelWork work;
  double largest = 0;
  bool dtype_set = false;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    work.bytes += static_cast<double>(t.numel()) * static_cast<double>(t.itemsize());
    largest = std::max(largest, static_cast<double>(t.numel()));
    if (!dtype_set && c10::isFloatingType(t.scalar_type())) {
      work.dtype = t.scalar_type();
      dtype_set = true;
    }
  }
  work.bytes += largest * static_cast<double>(c10::elementSize(work.dtype));
  work.cube = cube_flops > 0;
  work.flops = work.cube ? cube_flops : largest;
  return work;
}

// onHost (on_host.h) with the kernel's work estimated by kernelWork (`cube_flops`
// on the matrix unit, else one operation per element).
template <class Compute>
auto onHostProjected(const char* op, c10::ArrayRef<at::Tensor> tensors, Compute compute, double cube_flops = 0) {
  return onHost(op, tensors, compute, [&] { return profile::describe(kernelWork(tensors, cube_flops)); });
}

// Runs `kernel(contiguous)` so that its writes land in `target` (a host tensor):
// directly when it is contiguous, else through a contiguous copy written back.
template <class Kernel>
void updateInPlace(const at::Tensor& target, Kernel kernel) {
  if (target.is_contiguous()) {
    kernel(target);
    return;
  }
  at::Tensor dense = target.contiguous();
  kernel(dense);
  target.copy_(dense);
}

// Where each row of x (its last dimension) finds its row of r, r broadcast to x
// (r's last dimension is x's).
struct BroadcastRows {
  std::vector<int64_t> sizes;    // x's sizes without the last
  std::vector<int64_t> strides;  // r's expanded strides for them (0 where broadcast)
  BroadcastRows(at::IntArrayRef x_sizes, const at::Tensor& r) {
    const auto expanded = r.expand(x_sizes);
    sizes.assign(x_sizes.begin(), x_sizes.end() - 1);
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

NPU_VECTOR_CLONES float rowMax(const float* z, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = z[j] > m ? z[j] : m;
  return m;
}

// z <- exp(z - m), returning the sum.
NPU_VECTOR_CLONES float expShiftedInPlace(float* z, float m, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) {
    const float e = vectorExp<true>(z[j] - m);
    z[j] = e;
    s += e;
  }
  return s;
}

// z <- mask ? -10000 : x * scale (the masked value is the Ascend kernel's);
// the mask row is contiguous (mask_stride 1) or one value for the row (0).
NPU_VECTOR_CLONES void maskAndScale(const float* x, const uint8_t* mask, int64_t mask_stride, float scale, float* z,
                                      int64_t n) {
  if (mask_stride == 0 && *mask != 0) {
    std::fill(z, z + n, -10000.0f);
    return;
  }
  if (mask_stride == 0) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) z[j] = x[j] * scale;
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) z[j] = mask[j] != 0 ? -10000.0f : x[j] * scale;
}

NPU_VECTOR_CLONES void scaleRow(const float* z, float factor, float* y, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] = z[j] * factor;
}

// dx = mask ? 0 : scale * y * (g - dot) for one row (dot = sum(g * y)).
NPU_VECTOR_CLONES void softmaxGradRow(const float* g, const float* y, float dot, const uint8_t* mask,
                                        int64_t mask_stride, float scale, float* dx, int64_t n) {
  if (mask_stride == 0 && *mask != 0) {
    std::fill(dx, dx + n, 0.0f);
    return;
  }
  if (mask_stride == 0) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dx[j] = scale * y[j] * (g[j] - dot);
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dx[j] = mask[j] != 0 ? 0.0f : scale * y[j] * (g[j] - dot);
}

NPU_VECTOR_CLONES float dotFloat(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// ---- rows converted to and from float ---------------------------------------------------

NPU_VECTOR_CLONES void bf16ToFloat(const uint16_t* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = std::bit_cast<float>(static_cast<uint32_t>(in[j]) << 16);
}

// Rounded to nearest even, NaN to the quiet NaN: c10::BFloat16's rounding,
// with masks instead of branches so that it vectorises.
NPU_VECTOR_CLONES void floatToBf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = std::bit_cast<uint32_t>(in[j]);
    const uint32_t nan = -static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[j] = static_cast<uint16_t>((rounded & ~nan) | (0x7fc0u & nan));
  }
}

// float16 rows: the F16C instructions where the CPU has them (the same IEEE
// round-to-nearest-even as c10::Half), c10::Half's own conversion otherwise.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) void halfToFloatF16c(const uint16_t* in, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j))));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(c10::Half(in[j], c10::Half::from_bits()));
}

__attribute__((target("avx,f16c"))) void floatToHalfF16c(const float* in, uint16_t* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; j < n; ++j) out[j] = c10::Half(in[j]).x;
}

bool hasF16c() {
  static const bool has = [] {
    __builtin_cpu_init();  // idempotent; needed if this first runs from a static initialiser
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  }();
  return has;
}
#else
bool hasF16c() { return false; }
void halfToFloatF16c(const uint16_t*, float*, int64_t) {}
void floatToHalfF16c(const float*, uint16_t*, int64_t) {}
#endif

void loadRow(const float* x, float* out, int64_t n) { std::copy(x, x + n, out); }
void loadRow(const double* x, float* out, int64_t n) { std::copy(x, x + n, out); }
void loadRow(const c10::BFloat16* x, float* out, int64_t n) {
  bf16ToFloat(reinterpret_cast<const uint16_t*>(x), out, n);
}
void loadRow(const c10::Half* x, float* out, int64_t n) {
  if (hasF16c()) {
    halfToFloatF16c(reinterpret_cast<const uint16_t*>(x), out, n);
    return;
  }
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(x[j]);
}

void storeRow(const float* z, float* y, int64_t n) { std::copy(z, z + n, y); }
void storeRow(const float* z, double* y, int64_t n) { std::copy(z, z + n, y); }
void storeRow(const float* z, c10::BFloat16* y, int64_t n) { floatToBf16(z, reinterpret_cast<uint16_t*>(y), n); }
void storeRow(const float* z, c10::Half* y, int64_t n) {
  if (hasF16c()) {
    floatToHalfF16c(z, reinterpret_cast<uint16_t*>(y), n);
    return;
  }
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<c10::Half>(z[j]);
}

// A row to read in float: float rows as they are, others converted into buf.
template <typename scalar_t>
const float* floatRow(const scalar_t* x, float* buf, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return x;
  } else {
    loadRow(x, buf, n);
    return buf;
  }
}

// Where to write a row in float: float rows directly, others into buf (then flushRow).
template <typename scalar_t>
float* floatOut(scalar_t* y, float* buf) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return y;
  } else {
    return buf;
  }
}

template <typename scalar_t>
void flushRow(const float* buf, scalar_t* y, int64_t n) {
  if constexpr (!std::is_same_v<scalar_t, float>) storeRow(buf, y, n);
}

// ---- rotary rows ------------------------------------------------------------------------

// y = x*c + rotate(x)*s for one row of d elements with per-element cos/sin,
// where rotate pairs element j with j +- d/2 (half) or with its neighbour (pairs).
NPU_VECTOR_CLONES void rotateFull(const float* x, const float* c, const float* s, float* y, int64_t d, bool pairs) {
  const int64_t h = d / 2;
  if (!pairs) {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      y[j] = x[j] * c[j] - x[j + h] * s[j];
      y[j + h] = x[j + h] * c[j + h] + x[j] * s[j + h];
    }
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float a = x[2 * j], b = x[2 * j + 1];
    y[2 * j] = a * c[2 * j] - b * s[2 * j];
    y[2 * j + 1] = b * c[2 * j + 1] + a * s[2 * j + 1];
  }
}

// The first 2h elements of x rotated with h cos/sin values that each pair
// shares (the pair (j, j+h), or (2j, 2j+1) with `pairs`); sin_sign -1 applies
// the inverse rotation (the backward: a rotation's transpose).
NPU_VECTOR_CLONES void rotateShared(const float* x, const float* c, const float* s, float sin_sign, float* y,
                                      int64_t h, bool pairs) {
  if (!pairs) {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j) {
      const float a = x[j], b = x[j + h], sn = sin_sign * s[j];
      y[j] = a * c[j] - b * sn;
      y[j + h] = b * c[j] + a * sn;
    }
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float a = x[2 * j], b = x[2 * j + 1], sn = sin_sign * s[j];
    y[2 * j] = a * c[j] - b * sn;
    y[2 * j + 1] = b * c[j] + a * sn;
  }
}

// npu_interleave_rope's row: the pair (x[2j], x[2j+1]) rotated into (y[j], y[j+h]).
NPU_VECTOR_CLONES void deinterleaveRotate(const float* x, const float* c, const float* s, float* y, int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float a = x[2 * j], b = x[2 * j + 1];
    y[j] = a * c[j] - b * s[j];
    y[j + h] = b * c[j + h] + a * s[j + h];
  }
}

// Its transpose: dq = g*c + rotate_half^T(g*s), written back interleaved.
NPU_VECTOR_CLONES void deinterleaveRotateBackward(const float* g, const float* c, const float* s, float* dx,
                                                    int64_t h) {
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    const float g1 = g[j], g2 = g[j + h];
    dx[2 * j] = g1 * c[j] + g2 * s[j + h];
    dx[2 * j + 1] = g2 * c[j + h] - g1 * s[j];
  }
}

// The cos and sin rows of a rotary table in float, converted once for the
// consecutive rows (heads) that share them.
template <typename scalar_t>
struct TableRows {
  const scalar_t* cos;
  const scalar_t* sin;
  int64_t n;
  std::vector<float> cbuf, sbuf;
  int64_t cached = -1;
  const float* c = nullptr;
  const float* s = nullptr;
  TableRows(const scalar_t* cos_, const scalar_t* sin_, int64_t n_) : cos(cos_), sin(sin_), n(n_), cbuf(n_), sbuf(n_) {}
  void at(int64_t offset) {
    if (offset == cached) return;
    c = floatRow(cos + offset, cbuf.data(), n);
    s = floatRow(sin + offset, sbuf.data(), n);
    cached = offset;
  }
};

// ---- npu_mrope ---------------------------------------------------------------------------------

// Which row of positions gives half-dimension j its cos/sin, per cfg.
std::vector<int64_t> sectionOfEachDim(const MropeConfig& cfg) {
  const int64_t half = cfg.rotary_dim / 2;
  std::vector<int64_t> section(half, 0);
  if (cfg.sections.empty()) return section;
  if (cfg.cache == CacheMode::Default) {
    int64_t j = 0;
    for (size_t i = 0; i < cfg.sections.size(); ++i) {
      for (int64_t n = 0; n < cfg.sections[i]; ++n) section[j++] = static_cast<int64_t>(i);
    }
    return section;
  }
  // interleave: t, h, w, t, h, w, ... over the first 3 * section[1] dims, then t.
  for (int64_t j = 0; j < half; ++j) {
    if (j < 3 * cfg.sections[1] && j % 3 != 0) section[j] = j % 3;
  }
  return section;
}

// Rotates query and key by the positions' cos/sin (sin_sign -1: the inverse rotation).
std::tuple<at::Tensor, at::Tensor> mropeImpl(const char* op, const at::Tensor& positions, const at::Tensor& query,
                                             const at::Tensor& key, const at::Tensor& cache, int64_t head_size,
                                             at::OptionalIntArrayRef mrope_section,
                                             std::optional<c10::string_view> rotary_mode,
                                             std::optional<c10::string_view> cache_mode, float sin_sign) {
  const MropeConfig cfg =
      checkMrope(op, positions, query, key, cache, head_size, mrope_section, rotary_mode, cache_mode);
  return onHostProjected(op, {positions, query, key, cache}, [&](auto input, auto, auto output) {
    const at::Tensor pos = input(positions).to(at::kLong);
    const at::Tensor q = input(query), k = input(key), table = input(cache);
    at::Tensor q_out = emptyLike(q), k_out = emptyLike(k);
    const int64_t max_pos = table.size(0);
    const int64_t* pp = pos.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < pos.numel(); ++i) {
      TORCH_CHECK_INDEX(pp[i] >= 0 && pp[i] < max_pos, "npu::", op, ": positions must be in [0, ", max_pos,
                        ") (cos_sin_cache's rows) on ", query.device(), ", got ", pp[i]);
    }
    const std::vector<int64_t> section = sectionOfEachDim(cfg);
    const int64_t half = cfg.rotary_dim / 2, hs = cfg.head_size, tokens = cfg.tokens;
    const int64_t q_heads = q.size(1) / hs, k_heads = k.size(1) / hs;
    NPU_DISPATCH_FLOATING_TYPES(q.scalar_type(), "npu_position_op", [&] {
      const scalar_t* qp = q.const_data_ptr<scalar_t>();
      const scalar_t* kp = k.const_data_ptr<scalar_t>();
      const scalar_t* tp = table.const_data_ptr<scalar_t>();
      scalar_t* qo = q_out.mutable_data_ptr<scalar_t>();
      scalar_t* ko = k_out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, tokens, rowGrain(q.size(1) + k.size(1)), [&](int64_t begin, int64_t end) {
        std::vector<float> c(half), s(half), xbuf(hs), ybuf(hs);
        // One head: rotated, and the dimensions past rotary_dim copied.
        auto rotateHead = [&](const scalar_t* x, scalar_t* y) {
          const float* xr = floatRow(x, xbuf.data(), hs);
          float* yr = floatOut(y, ybuf.data());
          rotateShared(xr, c.data(), s.data(), sin_sign, yr, half, cfg.mode == RotaryMode::Interleave);
          std::copy(xr + 2 * half, xr + hs, yr + 2 * half);
          flushRow(yr, y, hs);
        };
        for (int64_t t = begin; t < end; ++t) {
          // This token's cos/sin: each half-dimension from its section's position.
          for (int64_t j = 0; j < half; ++j) {
            const scalar_t* row = tp + pp[section[j] * tokens + t] * cfg.rotary_dim;
            c[j] = float(row[j]);
            s[j] = float(row[half + j]);
          }
          for (int64_t n = 0; n < q_heads; ++n) rotateHead(qp + t * q.size(1) + n * hs, qo + t * q.size(1) + n * hs);
          for (int64_t n = 0; n < k_heads; ++n) rotateHead(kp + t * k.size(1) + n * hs, ko + t * k.size(1) + n * hs);
        }
      });
    });
    return std::make_tuple(output(q_out), output(k_out));
  });
}

// ---- npu_interleave_rope ---------------------------------------------------------------------

// The 64-wide rows of x, each with its cos and sin rows. Forward: y = q*c + rotate_half(q)*s
// with q the de-interleaved x (x[0::2] then x[1::2]). Backward (x is the gradient):
// dq = grad*c + rotate_half^T(grad*s), then interleaved back.
template <bool Backward>
at::Tensor interleaveRopeRows(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  checkInterleaveRope(op, x, cos, sin);
  return onHostProjected(op, {x, cos, sin}, [&](auto input, auto, auto output) {
    const at::Tensor xh = input(x), c = input(cos), s = input(sin);
    at::Tensor y = emptyLike(xh);
    constexpr int64_t d = 64, h = 32;
    const int64_t rows = xh.numel() / d;
    const BroadcastRows table(xh.sizes(), c);
    NPU_DISPATCH_FLOATING_TYPES(xh.scalar_type(), "npu_position_op", [&] {
      const scalar_t* xp = xh.const_data_ptr<scalar_t>();
      const scalar_t* cp = c.const_data_ptr<scalar_t>();
      const scalar_t* sp = s.const_data_ptr<scalar_t>();
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, rowGrain(d), [&](int64_t begin, int64_t end) {
        std::vector<float> xbuf(d), ybuf(d);
        TableRows<scalar_t> tables(cp, sp, d);
        for (int64_t row = begin; row < end; ++row) {
          tables.at(table.offset(row));
          float* yr = floatOut(yp + row * d, ybuf.data());
          const float* xr = floatRow(xp + row * d, xbuf.data(), d);
          if constexpr (Backward) {
            deinterleaveRotateBackward(xr, tables.c, tables.s, yr, h);
          } else {
            deinterleaveRotate(xr, tables.c, tables.s, yr, h);
          }
          flushRow(yr, yp + row * d, d);
        }
      });
    });
    return output(y);
  });
}

// ---- npu_scaled_masked_softmax --------------------------------------------------------------------

struct MaskRows {
  BroadcastRows rows;
  int64_t last_stride;  // 0 when the mask broadcasts along W
  MaskRows(const at::Tensor& x, const at::Tensor& mask)
      : rows(x.sizes(), mask), last_stride(mask.expand(x.sizes()).stride(-1)) {}
};

double scaleValue(const at::Scalar& scale) { return scale.toDouble(); }

// The mask the kernels read: the given one, or with fixed_triu_mask the causal upper
// triangle of x's (H, W) (w > h masked out; the given mask's content is not read).
at::Tensor softmaxMask(const at::Tensor& x, const at::Tensor& mask, bool fixed_triu_mask) {
  if (!fixed_triu_mask) return mask;
  return at::ones({x.size(2), x.size(3)}, mask.options().device(x.device())).triu(1);
}

// ---- npu_transpose_batchmatmul -------------------------------------------------------------------

// y[m, b, n] = sum_k x1[b, m, k] * x2[b, k, n] (after the permutations).
at::Tensor transposeBatchMatmul(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scale,
                                at::OptionalIntArrayRef perm_x1, at::OptionalIntArrayRef perm_x2,
                                at::OptionalIntArrayRef perm_y, std::optional<int64_t> batch_split_factor) {
  constexpr const char* op = "npu_transpose_batchmatmul";
  const TransposeBmm t =
      checkTransposeBmm(input, weight, bias, scale, perm_x1, perm_x2, perm_y, batch_split_factor);
  const bool quantized = scale.has_value() && scale->defined();
  const at::Tensor scale_or_none = quantized ? *scale : at::Tensor();
  const double matmul_flops = 2.0 * static_cast<double>(t.batch * t.m) * static_cast<double>(t.k * t.n);
  return onHostProjected(op, {input, weight, scale_or_none}, [&](auto, auto inout, auto output) {
    // Host views as they are (bmm takes strides): no copy of non-contiguous inputs.
    const at::Tensor x1 = t.x1_transposed ? inout(input).transpose(0, 1) : inout(input);
    const at::Tensor x2 = t.x2_transposed ? inout(weight).transpose(1, 2) : inout(weight);
    if (quantized) {
      // Accumulate in float, then y * scale rounded half to even and saturated to int8.
      const at::Tensor acc = at::bmm(x1.to(at::kFloat), x2.to(at::kFloat));  // [B, M, N]
      const at::Tensor packed = inout(*scale).contiguous();
      at::Tensor out = at::empty(t.out_shape, input.options().dtype(at::kChar).device(acc.device()));
      const float* ap = acc.const_data_ptr<float>();
      const int64_t* sp = reinterpret_cast<const int64_t*>(packed.const_data_ptr());
      int8_t* qp = out.mutable_data_ptr<int8_t>();
      const int64_t bn = t.batch * t.n;
      at::parallel_for(0, t.m, rowGrain(t.batch * t.n), [&](int64_t begin, int64_t end) {
        for (int64_t mi = begin; mi < end; ++mi) {
          for (int64_t b = 0; b < t.batch; ++b) {
            for (int64_t ni = 0; ni < t.n; ++ni) {
              const int64_t packed_j = sp[b * t.n + ni];  // scale and offset: quant_param.h
              const float v = std::nearbyint(ap[(b * t.m + mi) * t.n + ni] * packedScale(packed_j) +
                                             static_cast<float>(packedOffset(packed_j)));
              qp[mi * bn + b * t.n + ni] = static_cast<int8_t>(std::max(-128.0f, std::min(127.0f, v)));
            }
          }
        }
      });
      return output(out);
    }
    // The batched product into batch-major memory (its fastest form: BLAS
    // takes the strided operands, but a strided result costs more than the
    // copy), then laid out [M, B, N].
    at::Tensor y = at::bmm(x1, x2).transpose(0, 1).contiguous();
    if (t.split > 1) {
      // The B * N columns cut into `split` blocks, stacked first.
      y = y.view({t.m, t.split, t.batch * t.n / t.split}).transpose(0, 1).contiguous();
    }
    return output(y);
  }, matmul_flops);
}

}  // namespace

// ---- the kernels (position.h) ---------------------------------------------------------------------

void applyRotaryInPlace(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
                        c10::string_view layout, c10::string_view rotary_mode) {
  constexpr const char* op = "npu_apply_rotary_pos_emb";
  checkApplyRotary(query, key, cos, sin, layout, rotary_mode);
  const RotaryMode mode = parseRotaryMode(op, rotary_mode);
  // As aten's in-place ops (inference tensors have no autograd key, so the autograd kernel does not see them).
  for (const at::Tensor* t : {&query, &key}) {
    TORCH_CHECK(!t->is_inference() || c10::InferenceMode::is_enabled(), "npu::", op, ": an in-place update of an "
                "inference tensor outside InferenceMode is not allowed (", t->device(), "); call it under "
                "torch.inference_mode(), or pass query.clone() and key.clone()");
  }
  onHostProjected(op, {query, key, cos, sin}, [&](auto input, auto inout, auto) {
    const at::Tensor c = input(cos);
    const at::Tensor s = input(sin);
    const int64_t d = query.size(-1);
    updateInPlace(inout(query), [&](const at::Tensor& q) {
      updateInPlace(inout(key), [&](const at::Tensor& k) {
        const int64_t q_rows = q.numel() / d, k_rows = k.numel() / d;
        const BroadcastRows q_table(q.sizes(), c), k_table(k.sizes(), c);
        NPU_DISPATCH_FLOATING_TYPES(q.scalar_type(), "npu_position_op", [&] {
          scalar_t* qp = q.mutable_data_ptr<scalar_t>();
          scalar_t* kp = k.mutable_data_ptr<scalar_t>();
          const scalar_t* cp = c.const_data_ptr<scalar_t>();
          const scalar_t* sp = s.const_data_ptr<scalar_t>();
          // One range over the query rows, then the key rows.
          at::parallel_for(0, q_rows + k_rows, rowGrain(d), [&](int64_t begin, int64_t end) {
            std::vector<float> xbuf(d), ybuf(d);
            TableRows<scalar_t> table(cp, sp, d);
            for (int64_t row = begin; row < end; ++row) {
              const bool is_q = row < q_rows;
              const int64_t r = is_q ? row : row - q_rows;
              table.at((is_q ? q_table : k_table).offset(r));
              scalar_t* xr = (is_q ? qp : kp) + r * d;
              loadRow(xr, xbuf.data(), d);  // a copy even for float: the row is rewritten in place
              float* yr = floatOut(xr, ybuf.data());
              rotateFull(xbuf.data(), table.c, table.s, yr, d, mode == RotaryMode::Interleave);
              flushRow(yr, xr, d);
            }
          });
        });
      });
    });
    return 0;
  });
}

at::Tensor interleaveRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return interleaveRopeRows<false>("npu_interleave_rope", x, cos, sin);
}

at::Tensor interleaveRopeBackward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  return interleaveRopeRows<true>("npu_interleave_rope_backward", grad, cos, sin);
}

std::tuple<at::Tensor, at::Tensor> mrope(const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& cache, int64_t head_size,
                                         at::OptionalIntArrayRef mrope_section,
                                         std::optional<c10::string_view> rotary_mode,
                                         std::optional<c10::string_view> cache_mode) {
  return mropeImpl("npu_mrope", positions, query, key, cache, head_size, mrope_section, rotary_mode, cache_mode,
                   1.0f);
}

// The gradients of query and key: the rotation is orthogonal, so its transpose
// (the inverse rotation) maps the output gradients back.
std::tuple<at::Tensor, at::Tensor> mropeBackward(const at::Tensor& positions, const at::Tensor& grad_query,
                                                 const at::Tensor& grad_key, const at::Tensor& cache,
                                                 int64_t head_size, at::OptionalIntArrayRef mrope_section,
                                                 std::optional<c10::string_view> rotary_mode,
                                                 std::optional<c10::string_view> cache_mode) {
  return mropeImpl("npu_mrope_backward", positions, grad_query, grad_key, cache, head_size, mrope_section,
                   rotary_mode, cache_mode, -1.0f);
}

// Per row, as the Ascend op: sort ascending (stable); top-k keeps the values >=
// the k-th largest; top-p takes the softmax of what top-k kept, its cumulative
// sum from the smallest, and drops the values whose sum is <= 1 - p (never the
// largest). Dropped logits become -inf; the others keep their value.
at::Tensor topKTopP(const at::Tensor& logits, const std::optional<at::Tensor>& p,
                    const std::optional<at::Tensor>& k) {
  constexpr const char* op = "npu_top_k_top_p";
  checkTopKTopP(logits, p, k);
  const bool has_p = p.has_value() && p->defined(), has_k = k.has_value() && k->defined();
  const at::Tensor p_or_none = has_p ? *p : at::Tensor(), k_or_none = has_k ? *k : at::Tensor();
  return onHostProjected(op, {logits, p_or_none, k_or_none},
                [&](auto input, auto, auto output) {
    const at::Tensor x = input(logits);
    const at::Tensor pf = has_p ? input(*p).to(at::kFloat) : at::Tensor();
    const at::Tensor kh = has_k ? input(*k) : at::Tensor();
    const int64_t rows = x.size(0), vocab = x.size(1);
    if (has_k) {
      const int32_t* kp = kh.const_data_ptr<int32_t>();
      for (int64_t r = 0; r < rows; ++r) {
        TORCH_CHECK_VALUE(kp[r] >= 1 && kp[r] <= std::min(kMaxTopK, vocab), "npu::", op, ": k must be in [1, ",
                          std::min(kMaxTopK, vocab), "] (at most 1024 and the vocabulary size) on ", logits.device(),
                          ", got ", kp[r], " in row ", r);
      }
    }
    if (has_p) {
      const float* pp = pf.const_data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r) {
        TORCH_CHECK_VALUE(pp[r] >= 0.0f && pp[r] <= 1.0f, "npu::", op, ": p must be in [0, 1] on ",
                          logits.device(), ", got ", pp[r], " in row ", r);
      }
    }
    at::Tensor out = x.clone();
    if ((!has_p && !has_k) || vocab == 0) return output(out);
    NPU_DISPATCH_FLOATING_TYPES(x.scalar_type(), "npu_position_op", [&] {
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
      const float* pp = has_p ? pf.const_data_ptr<float>() : nullptr;
      const int32_t* kp = has_k ? kh.const_data_ptr<int32_t>() : nullptr;
      const scalar_t minus_inf = -std::numeric_limits<scalar_t>::infinity();
      at::parallel_for(0, rows, rowGrain(vocab), [&](int64_t begin, int64_t end) {
        std::vector<float> values(vocab);
        std::vector<int64_t> order;
        std::vector<double> probs;
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* xr = xp + r * vocab;
          scalar_t* yr = op_ + r * vocab;
          loadRow(xr, values.data(), vocab);
          // The candidates: every index, or those top-k keeps.
          order.clear();
          if (kp != nullptr) {
            std::vector<float> scratch(values);
            const int64_t kth = vocab - kp[r];
            std::nth_element(scratch.begin(), scratch.begin() + kth, scratch.end());
            const float threshold = scratch[kth];
            for (int64_t j = 0; j < vocab; ++j) {
              if (values[j] < threshold) {
                yr[j] = minus_inf;
              } else {
                order.push_back(j);
              }
            }
          } else {
            order.resize(vocab);
            std::iota(order.begin(), order.end(), int64_t(0));
          }
          if (pp == nullptr) continue;
          std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return values[a] < values[b]; });
          const float largest = values[order.back()];
          probs.resize(order.size());
          double total = 0;
          for (size_t i = 0; i < order.size(); ++i) {
            probs[i] = static_cast<float>(std::exp(values[order[i]] - largest));
            total += probs[i];
          }
          // The cumulative sum in double, each prefix rounded to float: as torch's cumsum on float32.
          const float limit = 1.0f - pp[r];
          double cumulative = 0;
          for (size_t i = 0; i + 1 < order.size(); ++i) {
            cumulative += static_cast<float>(probs[i] / total);
            if (static_cast<float>(cumulative) > limit) break;
            yr[order[i]] = minus_inf;
          }
        }
      });
    });
    return output(out);
  });
}

// y = softmax over W of (mask ? -10000 : x * scale), in float.
at::Tensor scaledMaskedSoftmax(const at::Tensor& x, const at::Tensor& mask, const at::Scalar& scale,
                               bool fixed_triu_mask) {
  constexpr const char* op = "npu_scaled_masked_softmax";
  checkScaledMaskedSoftmax(op, x, mask, fixed_triu_mask);
  const float sc = static_cast<float>(scaleValue(scale));
  return onHostProjected(op, {x, mask}, [&](auto input, auto, auto output) {
    const at::Tensor xh = input(x);
    const at::Tensor m = softmaxMask(xh, input(mask), fixed_triu_mask);
    at::Tensor y = emptyLike(xh);
    const int64_t w = xh.size(3), rows = xh.numel() / w;
    const MaskRows mrows(xh, m);
    NPU_DISPATCH_FLOATING_TYPES(xh.scalar_type(), "npu_position_op", [&] {
      const scalar_t* xp = xh.const_data_ptr<scalar_t>();
      const auto* mp = reinterpret_cast<const uint8_t*>(m.const_data_ptr<bool>());
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      constexpr bool kFloat = std::is_same_v<scalar_t, float>;
      at::parallel_for(0, rows, rowGrain(w), [&](int64_t begin, int64_t end) {
        std::vector<float> z(w);
        for (int64_t r = begin; r < end; ++r) {
          // float rows are read and written in place; 16-bit ones go through z.
          // (the casts only run for float; the branches are compiled for every type)
          if (!kFloat) loadRow(xp + r * w, z.data(), w);
          const float* xr = kFloat ? reinterpret_cast<const float*>(xp + r * w) : z.data();
          maskAndScale(xr, mp + mrows.rows.offset(r), mrows.last_stride, sc, z.data(), w);
          const float inv = 1.0f / expShiftedInPlace(z.data(), rowMax(z.data(), w), w);
          if (kFloat) {
            scaleRow(z.data(), inv, reinterpret_cast<float*>(yp + r * w), w);
          } else {
            scaleRow(z.data(), inv, z.data(), w);
            storeRow(z.data(), yp + r * w, w);
          }
        }
      });
    });
    return output(y);
  });
}

// dx = mask ? 0 : scale * y * (dy - sum(dy * y)).
at::Tensor scaledMaskedSoftmaxBackward(const at::Tensor& y_grad, const at::Tensor& y, const at::Tensor& mask,
                                       const at::Scalar& scale, bool fixed_triu_mask) {
  constexpr const char* op = "npu_scaled_masked_softmax_backward";
  checkScaledMaskedSoftmaxBackward(y_grad, y, mask, fixed_triu_mask);
  const float sc = static_cast<float>(scaleValue(scale));
  return onHostProjected(op, {y_grad, y, mask}, [&](auto input, auto, auto output) {
    const at::Tensor g = input(y_grad), yh = input(y), m = softmaxMask(yh, input(mask), fixed_triu_mask);
    at::Tensor dx = emptyLike(yh);
    const int64_t w = yh.size(3), rows = yh.numel() / w;
    const MaskRows mrows(yh, m);
    NPU_DISPATCH_FLOATING_TYPES(yh.scalar_type(), "npu_position_op", [&] {
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* yp = yh.const_data_ptr<scalar_t>();
      const auto* mp = reinterpret_cast<const uint8_t*>(m.const_data_ptr<bool>());
      scalar_t* dp = dx.mutable_data_ptr<scalar_t>();
      constexpr bool kFloat = std::is_same_v<scalar_t, float>;
      at::parallel_for(0, rows, rowGrain(w), [&](int64_t begin, int64_t end) {
        std::vector<float> gf(kFloat ? 0 : w), yf(kFloat ? 0 : w), out(kFloat ? 0 : w);
        for (int64_t r = begin; r < end; ++r) {
          // (the casts only run for float; the branches are compiled for every type)
          if (!kFloat) {
            loadRow(gp + r * w, gf.data(), w);
            loadRow(yp + r * w, yf.data(), w);
          }
          const float* gr = kFloat ? reinterpret_cast<const float*>(gp + r * w) : gf.data();
          const float* yr = kFloat ? reinterpret_cast<const float*>(yp + r * w) : yf.data();
          float* dr = kFloat ? reinterpret_cast<float*>(dp + r * w) : out.data();
          softmaxGradRow(gr, yr, dotFloat(gr, yr, w), mp + mrows.rows.offset(r), mrows.last_stride, sc, dr, w);
          if (!kFloat) storeRow(out.data(), dp + r * w, w);
        }
      });
    });
    return output(dx);
  });
}

// The kernel's op: positional tensors (what torch.library's autograd
// registration takes), the permutations resolved.
at::Tensor transposeBatchMatmulCore(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& scale, at::IntArrayRef perm_x1,
                                    at::IntArrayRef perm_x2, int64_t batch_split_factor) {
  const std::optional<at::Tensor> no_bias;
  return transposeBatchMatmul(input, weight, no_bias, scale, perm_x1, perm_x2, std::nullopt, batch_split_factor);
}

}  // namespace npu::ops::position
