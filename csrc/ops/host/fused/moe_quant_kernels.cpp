// The host kernels of the mixture-of-experts and int8 quantization ops of
// moe_quant.h. Like the other fused ops, they run on host views of npu memory in
// stream order (HostExecution) or directly on cpu tensors. Their checks, meta
// kernels and registration: ops/fused/moe_quant.cpp.
//
// Integer matmuls are exact: int8 (or int4) operands are multiplied as float32
// in blocks of K short enough that every partial sum is an integer below 2^24,
// then summed in int32 like the chip's accumulators.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../../core/profile.h"
#include "../../fused/common.h"
#include "../../fused/moe_quant.h"
#include "../dtypes.h"
#include "fast_exp.h"
#include "on_host.h"
#include "quant_param.h"

namespace npu::ops::moe_quant {
namespace {

// onHost (on_host.h) with the kernel's work estimated from `work` (the op's
// arguments as the profile's estimate reads them; else `tensors`).
template <class Compute>
auto onHostProjected(const char* op, const std::vector<Tensor>& tensors, Compute compute,
                     const torch::jit::Stack* work = nullptr) {
  return onHost(op, tensors, compute, [&] {
    const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow((std::string("npu::") + op).c_str(), "");
    return profile::workOf(handle, work != nullptr ? *work : torch::jit::Stack(tensors.begin(), tensors.end()));
  });
}

// A float32 copy of a small host parameter tensor (scales, offsets), any float dtype.
std::vector<float> floatValues(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor f = t.to(at::kFloat).contiguous();
  return std::vector<float>(f.const_data_ptr<float>(), f.const_data_ptr<float>() + f.numel());
}

// A quantization parameter's float32 scales and embedded offsets (quant_param.h), as vectors.
std::vector<float> scaleValues(const Tensor& t) { return floatValues(packedScales(t)); }

std::vector<float> embeddedOffsets(const Tensor& t) { return floatValues(packedOffsets(t)); }

// round half to even (the conversion of the chip and of numpy's round), saturated to [lo, hi].
inline float roundClamp(float v, float lo, float hi) { return std::min(hi, std::max(lo, std::nearbyint(v))); }

// ---- vector loops (NPU_VECTOR_CLONES: on_host.h) -------------------------------------
NPU_VECTOR_CLONES float absMax(const float* v, int64_t n) {
  float m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, std::abs(v[j]));
  return m;
}

// out = saturate(round_half_even(v / s)) for int8: clamped first, then rounded by adding and
// taking away 1.5 * 2^23 (exact below 2^22, and vectorisable where nearbyint is a call).
NPU_VECTOR_CLONES void quantizeRow(const float* v, float s, int8_t* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    float q = v[j] / s;
    q = q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q);
    out[j] = static_cast<int8_t>(static_cast<int32_t>((q + 12582912.0f) - 12582912.0f));
  }
}

NPU_VECTOR_CLONES void scaleByRow(float* v, const float* scale, float factor, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) v[j] *= scale[j] * factor;
}

NPU_VECTOR_CLONES void addRow(float* v, const float* add, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) v[j] += add[j];
}

NPU_VECTOR_CLONES void axpyRow(float* acc, float w, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] += w * x[j];
}

template <class T>
void toFloatRow(const T* x, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(x[j]);
}

template <class T>
void fromFloatRow(const float* v, T* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(v[j]);
}

// float -> bfloat16 rounding to nearest even (NaN stays NaN), in bit operations that
// vectorise (c10::BFloat16's constructor branches).
NPU_VECTOR_CLONES void fromFloatRow(const float* v, c10::BFloat16* out, int64_t n) {
  auto* bits = reinterpret_cast<uint16_t*>(out);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = __builtin_bit_cast(uint32_t, v[j]);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    bits[j] = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
  }
}

// p[j] = exp(x[j] - top); returns their sum.
NPU_VECTOR_CLONES float expShifted(const float* x, float top, float* p, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = expOfNonPositive(x[j] - top));
  return sum;
}

// ---- exact integer matmul ------------------------------------------------------------

// The int4 values of an int32-packed tensor: element j of each int32 is bits 4j..4j+3
// (npu_convert_weight_to_int4pack's layout), the last dimension grows eightfold.
Tensor unpackInt4(const Tensor& packed) {
  const Tensor p = packed.contiguous();
  std::vector<int64_t> shape(p.sizes().begin(), p.sizes().end());
  shape.back() *= 8;
  Tensor out = at::empty(shape, p.options().dtype(at::kChar));
  const int32_t* src = p.const_data_ptr<int32_t>();
  int8_t* dst = out.mutable_data_ptr<int8_t>();
  at::parallel_for(0, p.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto word = static_cast<uint32_t>(src[i]);
      for (int j = 0; j < 8; ++j) {
        const int v = static_cast<int>((word >> (4 * j)) & 0xF);
        dst[i * 8 + j] = static_cast<int8_t>(v >= 8 ? v - 16 : v);
      }
    }
  });
  return out;
}

// a @ b for int8 (or unpacked int4) operands, broadcast over leading dimensions
// like torch.matmul, exact: float32 holding integers when one block of K suffices,
// else int32. `bound` is the largest |value| of an operand.
Tensor intMatmul(const Tensor& a, const Tensor& b, int64_t bound) {
  const int64_t k = a.size(-1);
  // partial sums stay integers below 2^24, where float32 is exact
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 24) / (bound * bound));
  if (k <= block) return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).contiguous();
  Tensor acc;
  for (int64_t k0 = 0; k0 < k; k0 += block) {
    const int64_t len = std::min(block, k - k0);
    Tensor part = at::matmul(a.narrow(-1, k0, len).to(at::kFloat), b.narrow(-2, k0, len).to(at::kFloat)).to(at::kInt);
    acc = acc.defined() ? acc.add_(part) : part;
  }
  return acc.contiguous();
}

// The dequantization of the integer accumulators (intMatmul's), one pass over rows of n:
//   v = (acc + bias_int) * scale[j] * pertoken[row % m] + offset[j] + bias_float[j]
// then rounded and saturated for int8, converted for float16/bfloat16, left for int32.
struct Dequant {
  std::vector<int32_t> bias_int;   // n or batch*n (per row / m), or empty
  std::vector<float> bias_float;   // the same, for float biases
  std::vector<float> scale;        // 1 or n (int32 output: unused)
  std::vector<float> offset;       // 1 or n, or empty
  std::vector<float> pertoken;     // m, or empty
  int64_t m = 1;                   // rows per batch (pertoken's and a 3-d bias's period)

  void run(const Tensor& acc, Tensor& out) const {
    if (acc.scalar_type() == at::kFloat) dispatch(acc.const_data_ptr<float>(), acc, out);
    else dispatch(acc.const_data_ptr<int32_t>(), acc, out);
  }

 private:
  template <class acc_t>
  void dispatch(const acc_t* ap, const Tensor& acc, Tensor& out) const {
    const int64_t n = acc.size(-1);
    const int64_t rows = n == 0 ? 0 : acc.numel() / n;
    AT_DISPATCH_SWITCH(out.scalar_type(), "npu_dequant",
        AT_DISPATCH_CASE(at::kChar, [&] { loop<acc_t, scalar_t>(ap, out.mutable_data_ptr<scalar_t>(), rows, n); })
        AT_DISPATCH_CASE(at::kHalf, [&] { loop<acc_t, scalar_t>(ap, out.mutable_data_ptr<scalar_t>(), rows, n); })
        AT_DISPATCH_CASE(at::kBFloat16, [&] { loop<acc_t, scalar_t>(ap, out.mutable_data_ptr<scalar_t>(), rows, n); })
        AT_DISPATCH_CASE(at::kFloat, [&] { loop<acc_t, scalar_t>(ap, out.mutable_data_ptr<scalar_t>(), rows, n); })
        AT_DISPATCH_CASE(at::kInt, [&] { loop<acc_t, scalar_t>(ap, out.mutable_data_ptr<scalar_t>(), rows, n); }));
  }

  template <class acc_t, class out_t>
  void loop(const acc_t* acc, out_t* out, int64_t rows, int64_t n) const {
    const int64_t bias_rows = std::max(bias_int.size(), bias_float.size()) / std::max<int64_t>(n, 1);
    const std::vector<float> ones(scale.size() == 1 ? n : 0, scale.empty() ? 1.0f : scale[0]);
    const float* scale_row = scale.size() == 1 ? ones.data() : scale.data();
    const std::vector<float> offsets(offset.size() == 1 ? n : 0, offset.empty() ? 0.0f : offset[0]);
    const float* offset_row = offset.size() == 1 ? offsets.data() : offset.data();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> v(n);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t bias_base = bias_rows > 1 ? (r / m) % bias_rows * n : 0;
        const acc_t* a = acc + r * n;
        out_t* o = out + r * n;
        if constexpr (std::is_same_v<out_t, int32_t>) {
          // int32 arithmetic (wrapping like the chip's accumulators); float accumulators hold integers
          for (int64_t j = 0; j < n; ++j)
            o[j] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(a[j])) +
                                        static_cast<uint32_t>(bias_int.empty() ? 0 : bias_int[bias_base + j]));
          continue;
        } else {
          if (!bias_int.empty()) {
            const int32_t* b = bias_int.data() + bias_base;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) v[j] = static_cast<float>(static_cast<int32_t>(a[j]) + b[j]);
          } else if constexpr (std::is_same_v<acc_t, float>) {
            std::copy(a, a + n, v.data());
          } else {
            toFloatRow(a, v.data(), n);
          }
          scaleByRow(v.data(), scale_row, pertoken.empty() ? 1.0f : pertoken[r % m], n);
          if (!offset.empty()) addRow(v.data(), offset_row, n);
          if (!bias_float.empty()) addRow(v.data(), bias_float.data() + bias_base, n);
          if constexpr (std::is_same_v<out_t, int8_t>) quantizeRow(v.data(), 1.0f, o, n);
          else fromFloatRow(v.data(), o, n);
        }
      }
    });
  }
};

void fillBias(Dequant& dq, const Tensor& bias) {
  if (!bias.defined()) return;
  if (bias.scalar_type() == at::kInt) {
    const Tensor b = bias.contiguous();
    dq.bias_int.assign(b.const_data_ptr<int32_t>(), b.const_data_ptr<int32_t>() + b.numel());
  } else {
    dq.bias_float = floatValues(bias);
  }
}


// ---- npu_moe_gating_top_k_softmax ------------------------------------------------------

// The k largest of a row, largest first (ties: the lower index first). Softmax keeps the
// order, so the top-k of the logits are the top-k of the probabilities.
void topKRow(const float* x, int64_t n, int64_t k, float* values, int32_t* index, std::vector<int32_t>& order) {
  if (k <= 16) {  // insertion into the k kept so far
    int64_t count = 0;
    for (int64_t e = 0; e < n; ++e) {
      const float v = x[e];
      if (count == k && !(v > values[k - 1])) continue;
      int64_t pos = count < k ? count++ : k - 1;
      for (; pos > 0 && v > values[pos - 1]; --pos) {
        values[pos] = values[pos - 1];
        index[pos] = index[pos - 1];
      }
      values[pos] = v;
      index[pos] = static_cast<int32_t>(e);
    }
    return;
  }
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int64_t j = 0; j < k; ++j) {
    index[j] = order[j];
    values[j] = x[order[j]];
  }
}

// One row of the gating: logits in `x` (float) -> the probabilities of all experts in `p`, the
// top-k experts in `index`; returns 1 / sum(exp).
float gatingRow(const float* x, int64_t n, int64_t k, float* p, float* values, int32_t* index,
                std::vector<int32_t>& order) {
  topKRow(x, n, k, values, index, order);
  return 1.0f / expShifted(x, values[0], p, n);
}

// ---- npu_grouped_matmul ----------------------------------------------------------------

// The group sizes (rows along m, or along k for group_type 2) and each group's weight
// index, read from group_list on the host.
std::vector<std::pair<int64_t, int64_t>> groupSizes(const Gmm& g, const Tensor& group_list_host) {
  std::vector<std::pair<int64_t, int64_t>> groups;  // (weight index, size)
  if (g.group_ints.has_value()) {
    int64_t start = 0;
    for (size_t e = 0; e < g.group_ints->size(); ++e) {
      groups.emplace_back(e, (*g.group_ints)[e] - start);
      start = (*g.group_ints)[e];
    }
    return groups;
  }
  const Tensor gl = group_list_host.contiguous();
  const int64_t* p = gl.const_data_ptr<int64_t>();
  int64_t previous = 0;
  for (int64_t i = 0; i < gl.size(0); ++i) {
    if (g.group_list_type == 2) {
      NPU_OP_CHECK(p[2 * i] >= 0 && p[2 * i] < g.experts && p[2 * i + 1] >= 0, Gmm::op, g.device,
                   "group_list pair ", i, " must be [weight index in [0, ", g.experts, "), count >= 0], got [", p[2 * i],
                ", ", p[2 * i + 1], "]");
      groups.emplace_back(p[2 * i], p[2 * i + 1]);
    } else if (g.group_list_type == 1) {
      NPU_OP_CHECK(p[i] >= 0, Gmm::op, g.device, "group_list counts must be non-negative, got ", p[i], " at ", i);
      groups.emplace_back(i, p[i]);
    } else {
      NPU_OP_CHECK(p[i] >= previous, Gmm::op, g.device, "group_list (cumsum, group_list_type 0) must be non-decreasing "
                   "and non-negative, got ", p[i], " after ", previous);
      groups.emplace_back(i, p[i] - previous);
      previous = p[i];
    }
  }
  return groups;
}

Tensor activation(Tensor y, int64_t act_type) {
  switch (act_type) {
    case 1: return y.relu_();
    case 2: return y.mul(0.5).mul_(y.mul(0.7978845608028654).mul_(y.mul(y).mul_(0.044715).add_(1)).tanh_().add_(1));
    case 4: return y.div(y.abs().mul(-1.702).exp_().add_(1)).mul_(y.sub(y.abs()).mul_(0.851).exp_());  // fast_gelu
    case 5: return y.mul(y.sigmoid());
    default: return y;
  }
}

// Host copies of the per-weight parameters (one tensor per weight, or one for a 3-d weight).
struct GmmHost {
  std::vector<Tensor> bias, scale, antiquant_scale, antiquant_offset, weight, per_token_scale;
};

// Expert e's slice of a per-weight parameter: [n] or [1].
Tensor paramOf(const Gmm& g, const std::vector<Tensor>& l, int64_t e) {
  if (l.empty()) return Tensor();
  if (!g.single_weight) return l[e];
  const Tensor& t = l[0];
  if (t.dim() == 2) return t.select(0, e);
  return t.numel() == g.experts ? t.narrow(0, e, 1) : t.view({g.experts, -1}).select(0, e);
}

// One group's result: x_g @ w_e (+ bias), dequantized for int8, activated; into `out` (host).
// `pts_rows` are the group's rows of per_token_scale[x_index], from `row0`.
void gmmGroup(const Gmm& g, const GmmHost& h, const Tensor& xg, int64_t e, int64_t x_index, int64_t row0,
              Tensor out) {
  const Tensor bias = paramOf(g, h.bias, e);
  const Tensor w = g.single_weight ? h.weight[0].select(0, e) : h.weight[e];
  if (g.kind == GmmKind::Int8) {
    const Tensor acc = intMatmul(xg, w, 128).contiguous();
    Dequant dq;
    fillBias(dq, bias);
    dq.scale = scaleValues(paramOf(g, h.scale, e));
    if (!h.per_token_scale.empty()) {
      dq.pertoken = floatValues(h.per_token_scale[x_index].narrow(0, row0, xg.size(0)));
      dq.m = xg.size(0);
    }
    if (g.act_type == 0) {
      dq.run(acc, out);
    } else {
      Tensor f = at::empty(out.sizes(), out.options().dtype(at::kFloat));
      dq.run(acc, f);
      out.copy_(activation(f, g.act_type));
    }
    return;
  }
  Tensor wd = w;
  if (g.kind == GmmKind::WeightOnly) {  // (w + offset) * scale, in x's dtype
    wd = w.to(xg.scalar_type());
    const Tensor aq_offset = paramOf(g, h.antiquant_offset, e);
    if (aq_offset.defined()) wd = wd.add(aq_offset);
    wd = wd.mul(paramOf(g, h.antiquant_scale, e));
  }
  if (!bias.defined()) {
    at::mm_out(out, xg, wd);
  } else {
    out.copy_(at::mm(xg, wd).to(bias.scalar_type()).add_(bias));
  }
}

// ---- npu_moe_token_unpermute -----------------------------------------------------------

void checkIndices(const char* op, c10::Device dev, const int32_t* s, int64_t count, int64_t rows) {
  for (int64_t i = 0; i < count; ++i)
    NPU_OP_CHECK(s[i] >= 0 && s[i] < rows, op, dev, "sorted_indices[", i, "] = ", s[i],
                 " is not a row of permuted_tokens (", rows, " rows)");
}

}  // namespace

// ---- the kernels (moe_quant.h) -----------------------------------------------------

// -> (y, expert_idx, row_idx): the k largest softmax probabilities of each row (ties: the lower
// expert first), their experts (int32; `experts` for a finished row), and row_idx[r][j] = j * rows + r.
std::tuple<Tensor, Tensor, Tensor> gatingTopKSoftmax(const Tensor& x, const OptTensor& finished_opt, int64_t k) {
  constexpr const char* op = "npu_moe_gating_top_k_softmax";
  const Tensor finished = valueOr(finished_opt);
  checkGating(op, x, finished, k);
  return onHostProjected(op, {x, finished}, [&](auto input, auto output) {
    const Tensor xs = input(x);
    const Tensor fs = input(finished);
    const int64_t experts = xs.size(-1);
    const int64_t rows = xs.numel() / experts;
    const auto shape = withLast(xs.sizes(), k);
    Tensor y = at::empty(shape, xs.options());
    Tensor idx = at::empty(shape, xs.options().dtype(at::kInt));
    Tensor row_idx = at::empty(shape, xs.options().dtype(at::kInt));
    const bool* fp = fs.defined() ? fs.const_data_ptr<bool>() : nullptr;
    int32_t* ip = idx.mutable_data_ptr<int32_t>();
    int32_t* rp = row_idx.mutable_data_ptr<int32_t>();
    NPU_DISPATCH_FLOATING_TYPES(xs.scalar_type(), op, [&] {
      const scalar_t* xp = xs.const_data_ptr<scalar_t>();
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        std::vector<float> row(experts), p(experts), values(k);
        std::vector<int32_t> order(experts), top(k);
        for (int64_t r = begin; r < end; ++r) {
          toFloatRow(xp + r * experts, row.data(), experts);
          const float inv = gatingRow(row.data(), experts, k, p.data(), values.data(), top.data(), order);
          const bool done = fp != nullptr && fp[r];
          for (int64_t j = 0; j < k; ++j) {
            yp[r * k + j] = static_cast<scalar_t>(p[top[j]] * inv);
            ip[r * k + j] = done ? static_cast<int32_t>(experts) : top[j];
            rp[r * k + j] = static_cast<int32_t>(j * rows + r);
          }
        }
      });
    });
    return std::make_tuple(output(y), output(idx), output(row_idx));
  });
}

// The gradient of y (the top-k softmax probabilities) to x: with the same top-k recomputed,
// dx = p * (g - <g, p_topk>) where g is grad_y at the top-k experts and 0 elsewhere.
Tensor gatingTopKSoftmaxBackward(const Tensor& grad, const Tensor& x, int64_t k) {
  constexpr const char* op = "_npu_moe_gating_top_k_softmax_backward";
  checkGatingBackward(op, grad, x, k);
  return onHostProjected(op, {grad, x}, [&](auto input, auto output) {
    const Tensor xs = input(x);
    const Tensor gs = input(grad);
    const int64_t experts = xs.size(-1);
    const int64_t rows = xs.numel() / experts;
    Tensor dx = at::empty(xs.sizes(), xs.options());
    NPU_DISPATCH_FLOATING_TYPES(xs.scalar_type(), op, [&] {
      const scalar_t* xp = xs.const_data_ptr<scalar_t>();
      const scalar_t* gp = gs.const_data_ptr<scalar_t>();
      scalar_t* dp = dx.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        std::vector<float> row(experts), p(experts), values(k);
        std::vector<int32_t> order(experts), top(k);
        for (int64_t r = begin; r < end; ++r) {
          toFloatRow(xp + r * experts, row.data(), experts);
          const float inv = gatingRow(row.data(), experts, k, p.data(), values.data(), top.data(), order);
          float dot = 0;
          for (int64_t j = 0; j < k; ++j) dot += static_cast<float>(gp[r * k + j]) * p[top[j]] * inv;
          for (int64_t e = 0; e < experts; ++e) row[e] = -dot;  // row becomes g - dot
          for (int64_t j = 0; j < k; ++j) row[top[j]] += static_cast<float>(gp[r * k + j]);
          scaleByRow(row.data(), p.data(), inv, experts);
          fromFloatRow(row.data(), dp + r * experts, experts);
        }
      });
    });
    return output(dx);
  });
}

// -> (expanded_x, expanded_row_idx, expert_token_cumsum_or_count, expanded_scale).
// Each (token, j) pair is ordered by its expert (pairs of inactive experts last, stable);
// expanded_x holds the tokens in that order (drop/pad: expert e's first `capacity` at
// rows e*capacity.., zeros elsewhere), expanded_row_idx maps pairs to rows (gather, -1
// where dropped) or rows to pairs (scatter). Rows past the routed ones are zeros.
std::tuple<Tensor, Tensor, Tensor, Tensor> initRoutingV2(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale_opt, const OptTensor& offset_opt,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t tokens_num_type,
    bool tokens_num_flag, int64_t quant_mode, at::IntArrayRef active_expert_range, int64_t row_idx_type) {
  constexpr const char* op = "npu_moe_init_routing_v2";
  const Tensor scale = valueOr(scale_opt), offset = valueOr(offset_opt);
  const RoutingArgs a = checkRouting(op, x, expert_idx, scale, offset, active_num, expert_capacity, expert_num,
                                     drop_pad_mode, tokens_num_type, tokens_num_flag, quant_mode, active_expert_range,
                                     row_idx_type);
  return onHostProjected(op, {x, expert_idx, scale, offset}, [&](auto input, auto output) {
    const Tensor xs = input(x);
    const Tensor ids = input(expert_idx);
    Tensor ex, eri, counts, escale;
    std::tie(ex, eri, counts, escale) = emptyRouting(a, xs, expert_num, tokens_num_type, tokens_num_flag);
    const int64_t pairs = a.rows * a.k;
    const int32_t* idp = ids.const_data_ptr<int32_t>();
    // Sort keys: the expert, inactive ones below the range after every other.
    auto key = [&](int64_t p) -> int64_t {
      const int64_t e = idp[p];
      return e < a.start ? std::numeric_limits<int64_t>::max() : e;
    };
    std::vector<int64_t> sorted(pairs);
    std::iota(sorted.begin(), sorted.end(), 0);
    std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t l, int64_t r) { return key(l) < key(r); });
    int64_t routed = 0;  // pairs whose expert is in [start, end)
    while (routed < pairs && idp[sorted[routed]] >= a.start && idp[sorted[routed]] < a.end) ++routed;

    std::vector<int64_t> source(a.rows_out, -1);  // the pair each expanded row holds
    int32_t* erp = eri.mutable_data_ptr<int32_t>();
    if (a.drop_pad) {
      std::fill(erp, erp + pairs, -1);
      int64_t rank = 0;
      for (int64_t i = 0; i < routed; ++i) {
        rank = (i > 0 && idp[sorted[i]] == idp[sorted[i - 1]]) ? rank + 1 : 0;
        if (rank >= a.capacity) continue;  // over the expert's capacity: dropped
        const int64_t slot = idp[sorted[i]] * a.capacity + rank;
        source[slot] = sorted[i];
        erp[sorted[i]] = static_cast<int32_t>(slot);
      }
    } else {
      const int64_t active = active_num <= 0 ? routed : std::min(active_num, routed);
      for (int64_t i = 0; i < active; ++i) source[i] = sorted[i];
      if (row_idx_type == 0) {
        std::fill(erp, erp + pairs, -1);
        for (int64_t i = 0; i < routed; ++i) erp[sorted[i]] = static_cast<int32_t>(i);
      } else {
        for (int64_t i = 0; i < pairs; ++i) erp[i] = static_cast<int32_t>(sorted[i]);
      }
    }

    if (tokens_num_flag) {
      std::vector<int64_t> per_expert(a.end - a.start, 0);
      for (int64_t i = 0; i < routed; ++i) ++per_expert[idp[sorted[i]] - a.start];
      int64_t* cp = counts.mutable_data_ptr<int64_t>();
      if (tokens_num_type == 2) {  // (expert, count) for the experts with tokens, then zeros
        std::fill(cp, cp + counts.numel(), 0);
        int64_t row = 0;
        for (size_t e = 0; e < per_expert.size() && row < counts.size(0); ++e) {
          if (per_expert[e] == 0) continue;
          cp[2 * row] = a.start + static_cast<int64_t>(e);
          cp[2 * row + 1] = per_expert[e];
          ++row;
        }
      } else {
        int64_t total = 0;
        for (size_t e = 0; e < per_expert.size(); ++e) cp[e] = tokens_num_type == 0 ? (total += per_expert[e]) : per_expert[e];
      }
    } else {
      counts.zero_();
    }

    // The rows: copied, or quantized with their (smooth) scales.
    const int64_t h = a.hidden;
    const std::vector<float> scales = floatValues(input(scale));
    const std::vector<float> offsets = floatValues(input(offset));
    float* sp = a.quant_mode == 0 ? nullptr : escale.mutable_data_ptr<float>();
    AT_DISPATCH_SWITCH(xs.scalar_type(), op,
        AT_DISPATCH_CASE(at::kChar, [&] {
          const int8_t* xp = xs.const_data_ptr<int8_t>();
          int8_t* op_ = ex.mutable_data_ptr<int8_t>();
          at::parallel_for(0, a.rows_out, 16, [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
              const int64_t pair = source[r];
              if (pair < 0) std::fill(op_ + r * h, op_ + (r + 1) * h, int8_t(0));
              else std::copy(xp + pair / a.k * h, xp + (pair / a.k + 1) * h, op_ + r * h);
              sp[r] = (pair >= 0 && !scales.empty()) ? scales[pair / a.k] : 0.0f;
            }
          });
        })
        AT_DISPATCH_CASE_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, [&] {
          const scalar_t* xp = xs.const_data_ptr<scalar_t>();
          at::parallel_for(0, a.rows_out, 16, [&](int64_t begin, int64_t end) {
            std::vector<float> row(h);
            for (int64_t r = begin; r < end; ++r) {
              const int64_t pair = source[r];
              const scalar_t* xr = pair < 0 ? nullptr : xp + pair / a.k * h;
              if (a.quant_mode == -1) {
                scalar_t* orow = ex.mutable_data_ptr<scalar_t>() + r * h;
                if (xr == nullptr) std::fill(orow, orow + h, scalar_t(0));
                else std::copy(xr, xr + h, orow);
                sp[r] = (xr != nullptr && !scales.empty()) ? scales[pair / a.k] : 0.0f;
                continue;
              }
              int8_t* orow = ex.mutable_data_ptr<int8_t>() + r * h;
              if (xr == nullptr) {
                std::fill(orow, orow + h, int8_t(0));
                if (sp != nullptr) sp[r] = 0.0f;
                continue;
              }
              if (a.quant_mode == 0) {
                for (int64_t j = 0; j < h; ++j)
                  orow[j] = static_cast<int8_t>(roundClamp(float(xr[j]) * scales[0] + offsets[0], -128.0f, 127.0f));
                continue;
              }
              // dynamic: smooth scale of the row's expert (or the shared one), then per-row absmax / 127
              const float* smooth = scales.empty() ? nullptr
                                    : scales.size() == static_cast<size_t>(h) ? scales.data()
                                    : scales.data() + (idp[pair] - a.start) * h;
              toFloatRow(xr, row.data(), h);
              if (smooth != nullptr) scaleByRow(row.data(), smooth, 1.0f, h);
              const float s = absMax(row.data(), h) / 127.0f;
              if (s == 0) std::fill(orow, orow + h, int8_t(0));
              else quantizeRow(row.data(), s, orow, h);
              sp[r] = s;
            }
          });
        }));
    return std::make_tuple(output(ex), output(eri), output(counts), output(escale));
  });
}

std::vector<Tensor> groupedMatmul(Gmm& g) {
  g.check();
  std::vector<Tensor> all(g.x);
  for (const auto* l : {&g.bias, &g.scale, &g.antiquant_scale, &g.antiquant_offset, &g.weight, &g.per_token_scale})
    all.insert(all.end(), l->begin(), l->end());
  all.push_back(g.group_tensor);
  const torch::jit::Stack work{c10::IValue(g.x), c10::IValue(g.weight)};  // the profile's estimate: x @ weight
  return onHostProjected(Gmm::op, all, [&](auto input, auto output) {
    std::vector<Tensor> xs;
    for (const Tensor& t : g.x) xs.push_back(input(t));
    GmmHost h;
    auto copy = [&](const std::vector<Tensor>& from, std::vector<Tensor>& to) {
      for (const Tensor& t : from) to.push_back(input(t));
    };
    copy(g.bias, h.bias);
    copy(g.scale, h.scale);
    copy(g.antiquant_scale, h.antiquant_scale);
    copy(g.antiquant_offset, h.antiquant_offset);
    copy(g.weight, h.weight);
    copy(g.per_token_scale, h.per_token_scale);
    const Tensor group_list = input(g.group_tensor);
    std::vector<Tensor> outs = g.emptyOutputs(xs[0].options());
    if (g.group_type == -1) {
      for (size_t i = 0; i < xs.size(); ++i) {
        const Tensor x2 = xs[i].reshape({-1, xs[i].size(-1)});
        gmmGroup(g, h, x2, static_cast<int64_t>(i), static_cast<int64_t>(i), 0, outs[i].view({-1, outs[i].size(-1)}));
      }
    } else if (g.group_type == 2) {  // y[e] = x[:, k0:k1] @ w[k0:k1]
      const auto groups = groupSizes(g, group_list);
      const int64_t k = xs[0].size(1);
      int64_t k0 = 0;
      for (size_t e = 0; e < groups.size(); ++e) {
        const int64_t len = groups[e].second;
        NPU_OP_CHECK(k0 + len <= k, Gmm::op, g.device, "group_list covers ", k0 + len, " of k, which is only ", k);
        Tensor o = outs[0].select(0, static_cast<int64_t>(e));
        if (len == 0) o.zero_();
        else at::mm_out(o, xs[0].narrow(1, k0, len), h.weight[0].narrow(0, k0, len));
        k0 += len;
      }
    } else if (xs.size() == 1) {  // rows of one x in groups, each with its weight
      const auto groups = groupSizes(g, group_list);
      const int64_t m = xs[0].size(0);
      int64_t row = 0;
      for (size_t i = 0; i < groups.size(); ++i) {
        const int64_t e = groups[i].first, len = groups[i].second;
        NPU_OP_CHECK(row + len <= m, Gmm::op, g.device, "group_list covers ", row + len, " rows of x, which has ", m);
        if (len > 0) gmmGroup(g, h, xs[0].narrow(0, row, len), e, 0, row,
                              g.singleOutput() ? outs[0].narrow(0, row, len) : outs[i]);
        row += len;
      }
      if (g.singleOutput() && row < m) outs[0].narrow(0, row, m - row).zero_();  // rows of no group
    } else {  // several x, one weight each, results stacked or apart
      int64_t row = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const int64_t len = xs[i].size(0);
        if (len > 0) gmmGroup(g, h, xs[i], static_cast<int64_t>(i), static_cast<int64_t>(i), 0,
                              g.singleOutput() ? outs[0].narrow(0, row, len) : outs[i]);
        row += len;
      }
    }
    std::vector<Tensor> results;
    for (const Tensor& o : outs) results.push_back(output(o));
    return results;
  }, &work);
}

// out[i] = sum_j probs[i, j] * permuted[sorted_indices[i * topk + j]] (probs 1 without them), in float.
Tensor tokenUnpermute(const Tensor& permuted, const Tensor& sorted_indices, const OptTensor& probs_opt,
                      bool padded_mode, at::OptionalIntArrayRef restore_shape) {
  constexpr const char* op = "npu_moe_token_unpermute";
  (void)restore_shape;  // padded mode only
  const Tensor probs = valueOr(probs_opt);
  const int64_t topk = checkUnpermute(op, permuted, sorted_indices, probs, padded_mode);
  return onHostProjected(op, {permuted, sorted_indices, probs}, [&](auto input, auto output) {
    const Tensor t = input(permuted);
    const Tensor s = input(sorted_indices);
    const Tensor p = input(probs);
    const int64_t tokens = s.numel() / topk, h = t.size(1);
    const int32_t* sp = s.const_data_ptr<int32_t>();
    checkIndices(op, permuted.device(), sp, s.numel(), t.size(0));
    Tensor out = at::empty({tokens, h}, t.options());
    NPU_DISPATCH_FLOATING_TYPES(t.scalar_type(), op, [&] {
      const scalar_t* tp = t.const_data_ptr<scalar_t>();
      const scalar_t* pp = p.defined() ? p.const_data_ptr<scalar_t>() : nullptr;
      scalar_t* outp = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> acc(h), row(h);
        for (int64_t i = begin; i < end; ++i) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < topk; ++j) {
            const scalar_t* src = tp + static_cast<int64_t>(sp[i * topk + j]) * h;
            const float w = pp ? static_cast<float>(pp[i * topk + j]) : 1.0f;
            if (std::is_same_v<scalar_t, float>) {  // (the cast only runs for float)
              axpyRow(acc.data(), w, reinterpret_cast<const float*>(src), h);
            } else {
              toFloatRow(src, row.data(), h);
              axpyRow(acc.data(), w, row.data(), h);
            }
          }
          fromFloatRow(acc.data(), outp + i * h, h);
        }
      });
    });
    return output(out);
  });
}

// -> (grad_permuted_tokens, grad_probs): grad_permuted[s[i*topk+j]] += grad[i] * probs[i, j]
// (rows no index names get zeros); grad_probs[i, j] = <grad[i], permuted[s[i*topk+j]]>.
std::tuple<Tensor, Tensor> tokenUnpermuteGrad(const Tensor& permuted, const Tensor& grad, const Tensor& sorted_indices,
                                              const OptTensor& probs_opt, bool padded_mode,
                                              at::OptionalIntArrayRef restore_shape) {
  constexpr const char* op = "npu_moe_token_unpermute_grad";
  (void)restore_shape;
  const Tensor probs = valueOr(probs_opt);
  const int64_t topk = checkUnpermuteGrad(permuted, grad, sorted_indices, probs, padded_mode);
  const auto dev = permuted.device();
  return onHostProjected(op, {permuted, grad, sorted_indices, probs}, [&](auto input, auto output) {
    const Tensor t = input(permuted);
    const Tensor g = input(grad);
    const Tensor s = input(sorted_indices);
    const Tensor p = input(probs);
    const int64_t tokens = g.size(0), h = t.size(1), rows = t.size(0);
    const int32_t* sp = s.const_data_ptr<int32_t>();
    checkIndices(op, dev, sp, s.numel(), rows);
    // Rows named once (a permutation) are written in parallel; repeats are summed in order.
    std::vector<int32_t> uses(rows, 0);
    bool repeated = false;
    for (int64_t i = 0; i < s.numel(); ++i) repeated |= ++uses[sp[i]] > 1;
    Tensor dt = at::empty({rows, h}, t.options());
    Tensor dp = p.defined() ? at::empty(p.sizes(), p.options()) : Tensor();
    NPU_DISPATCH_FLOATING_TYPES(t.scalar_type(), op, [&] {
      const scalar_t* tp = t.const_data_ptr<scalar_t>();
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* pp = p.defined() ? p.const_data_ptr<scalar_t>() : nullptr;
      scalar_t* dtp = dt.mutable_data_ptr<scalar_t>();
      scalar_t* dpp = dp.defined() ? dp.mutable_data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
          if (uses[r] != 1) std::fill(dtp + r * h, dtp + (r + 1) * h, scalar_t(0));
      });
      auto pair = [&](int64_t i, int64_t j, std::vector<float>* sum) {
        const int64_t row = sp[i * topk + j];
        const scalar_t* gr = gp + i * h;
        const scalar_t* tr = tp + row * h;
        const float w = pp ? static_cast<float>(pp[i * topk + j]) : 1.0f;
        scalar_t* dr = dtp + row * h;
        float dot = 0;
        for (int64_t c = 0; c < h; ++c) {
          const float gc = static_cast<float>(gr[c]);
          if (sum) (*sum)[row * h + c] += gc * w;
          else dr[c] = static_cast<scalar_t>(gc * w);
          if (dpp) dot += gc * static_cast<float>(tr[c]);
        }
        if (dpp) dpp[i * topk + j] = static_cast<scalar_t>(dot);
      };
      if (!repeated) {
        at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i)
            for (int64_t j = 0; j < topk; ++j) pair(i, j, nullptr);
        });
      } else {
        std::vector<float> sum(rows * h, 0.0f);
        for (int64_t i = 0; i < tokens; ++i)
          for (int64_t j = 0; j < topk; ++j) pair(i, j, &sum);
        for (int64_t r = 0; r < rows; ++r)
          if (uses[r] > 0)
            for (int64_t c = 0; c < h; ++c) dtp[r * h + c] = static_cast<scalar_t>(sum[r * h + c]);
      }
    });
    return std::make_tuple(output(dt), output(dp));
  });
}

// scale = absmax(x * smooth) / DTYPE_MAX per row (or over x), y = round(x * smooth / scale):
// int8 (max 127) or int4 (max 7) packed eight to an int32.
std::tuple<Tensor, Tensor> dynamicQuant(const Tensor& x, const OptTensor& smooth_opt, const OptTensor& group_opt,
                                        std::optional<int64_t> dst_type, c10::string_view quant_mode,
                                        double dst_type_max) {
  constexpr const char* op = "npu_dynamic_quant";
  const Tensor smooth = valueOr(smooth_opt), group_index = valueOr(group_opt);
  const QuantArgs q = checkDynamicQuant(x, smooth, group_index, dst_type, quant_mode, dst_type_max);
  return onHostProjected(op, {x, smooth, group_index}, [&](auto input, auto output) {
    const Tensor xs = input(x);
    const Tensor sm = input(smooth);
    const Tensor gi = input(group_index);
    Tensor y, scale;
    std::tie(y, scale) = emptyDynamicQuant(xs, q);
    const int64_t h = xs.size(-1);
    const int64_t rows = h == 0 ? 0 : xs.numel() / h;
    const float qmax = q.dst == at::kChar ? 127.0f : 7.0f;
    const float qmin = q.dst == at::kChar ? -128.0f : -8.0f;
    // the smooth row of each token row: group g covers rows [group_index[g-1], group_index[g])
    std::vector<int64_t> smooth_row;
    if (gi.defined()) {
      const int32_t* gp = gi.const_data_ptr<int32_t>();
      int64_t previous = 0;
      for (int64_t g = 0; g < gi.numel(); ++g) {
        NPU_OP_CHECK(gp[g] >= previous && gp[g] <= rows, op, x.device(), "group_index must be non-decreasing row counts "
                     "up to the rows of x (", rows, "), got ", gp[g], " at ", g);
        smooth_row.insert(smooth_row.end(), gp[g] - previous, g);
        previous = gp[g];
      }
      NPU_OP_CHECK(previous == rows, op, x.device(), "group_index's last entry (", previous,
                   ") must be the rows of x (", rows, ")");
    }
    // the smooth rows in float, once
    const std::vector<float> smooth_f = floatValues(sm);
    NPU_DISPATCH_FLOATING_TYPES(xs.scalar_type(), op, [&] {
      const scalar_t* xp = xs.const_data_ptr<scalar_t>();
      float* scp = scale.mutable_data_ptr<float>();
      // row r of x * smooth, in float
      auto load = [&](int64_t r, float* row) {
        toFloatRow(xp + r * h, row, h);
        if (!smooth_f.empty()) scaleByRow(row, smooth_f.data() + (smooth_row.empty() ? 0 : smooth_row[r]) * h, 1.0f, h);
      };
      float tensor_max = 0;
      if (q.per_tensor) {
        std::vector<float> row(h);
        for (int64_t r = 0; r < rows; ++r) {
          load(r, row.data());
          tensor_max = std::max(tensor_max, absMax(row.data(), h));
        }
        scp[0] = tensor_max / qmax;
      }
      at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        std::vector<float> row(h);
        for (int64_t r = begin; r < end; ++r) {
          load(r, row.data());
          const float s = (q.per_tensor ? tensor_max : absMax(row.data(), h)) / qmax;
          if (!q.per_tensor) scp[r] = s;
          if (q.dst == at::kChar) {
            int8_t* yr = y.mutable_data_ptr<int8_t>() + r * h;
            if (s == 0) std::fill(yr, yr + h, int8_t(0));
            else quantizeRow(row.data(), s, yr, h);
            continue;
          }
          int32_t* yr = y.mutable_data_ptr<int32_t>() + r * (h / 8);
          for (int64_t w = 0; w < h / 8; ++w) {
            uint32_t word = 0;
            for (int j = 0; j < 8; ++j) {
              const float level = s == 0 ? 0.0f : roundClamp(row[w * 8 + j] / s, qmin, qmax);
              word |= (static_cast<uint32_t>(static_cast<int32_t>(level)) & 0xFu) << (4 * j);
            }
            yr[w] = static_cast<int32_t>(word);
          }
        }
      });
    });
    return std::make_tuple(output(y), output(scale));
  });
}

// x1 @ x2 in int32, then (acc + bias) * scale * pertoken_scale + offset (+ float bias),
// rounded and saturated to int8 or converted to float16/bfloat16.
Tensor quantMatmul(const Tensor& x1, const Tensor& x2, const Tensor& scale, const OptTensor& offset_opt,
                   const OptTensor& pertoken_opt, const OptTensor& bias_opt, std::optional<int64_t> output_dtype,
                   std::optional<int64_t> x1_dtype, std::optional<int64_t> x2_dtype,
                   std::optional<int64_t> pertoken_scale_dtype, std::optional<int64_t> scale_dtype,
                   at::OptionalIntArrayRef group_sizes, const OptTensor& y_scale) {
  constexpr const char* op = "npu_quant_matmul";
  const Tensor offset = valueOr(offset_opt), pertoken = valueOr(pertoken_opt), bias = valueOr(bias_opt);
  const QmmArgs a = checkQuantMatmul(x1, x2, scale, offset, pertoken, bias, output_dtype,
                                     givenDtypes({{"x1_dtype", x1_dtype}, {"x2_dtype", x2_dtype},
                                                  {"pertoken_scale_dtype", pertoken_scale_dtype},
                                                  {"scale_dtype", scale_dtype}}),
                                     group_sizes,
                                     valueOr(y_scale));
  return onHostProjected(op, {x1, x2, scale, offset, pertoken, bias}, [&](auto input, auto output) {
    Tensor a1 = input(x1), a2;
    if (a.int4) {
      a1 = unpackInt4(a1);
      // the transpose of an (n, k/8) packing: unpack along k, then transpose back
      a2 = a.x2_transposed ? unpackInt4(input(x2.t())).t() : unpackInt4(input(x2));
    } else {
      a2 = input(x2);
    }
    const Tensor acc = intMatmul(a1, a2, a.int4 ? 8 : 128).contiguous();
    Dequant dq;
    fillBias(dq, input(bias));
    dq.scale = scaleValues(input(scale));
    dq.offset = offset.defined() ? floatValues(input(offset))
                                 : a.out == at::kChar ? embeddedOffsets(input(scale)) : std::vector<float>();
    dq.pertoken = floatValues(input(pertoken));
    dq.m = x1.size(-2);
    Tensor out = at::empty(a.shape, acc.options().dtype(a.out));
    dq.run(acc, out);
    return output(out);
  });
}

// int64 quantization parameters: the scale's float32 bits cut to FP19 (& 0xFFFFE000) in bits
// 0..31, bit 46 set, and round(offset) in [-256, 255] as 9 bits at 37..45.
Tensor transQuantParam(const Tensor& scale, const OptTensor& offset_opt, std::optional<int64_t> round_mode) {
  constexpr const char* op = "npu_trans_quant_param";
  const Tensor offset = valueOr(offset_opt);
  const auto shape = checkTransQuantParam(scale, offset, round_mode);
  return onHostProjected(op, {scale, offset}, [&](auto input, auto output) {
    const Tensor host_scale = input(scale);
    const std::vector<float> s = floatValues(host_scale), o = floatValues(input(offset));
    Tensor out = at::empty(shape, host_scale.options().dtype(at::kLong));
    int64_t* p = out.mutable_data_ptr<int64_t>();
    for (int64_t i = 0; i < out.numel(); ++i) {
      const uint32_t bits = __builtin_bit_cast(uint32_t, s[s.size() == 1 ? 0 : i]);
      uint64_t v = (static_cast<uint64_t>(bits) & 0xFFFFE000u) | (uint64_t(1) << 46);
      if (!o.empty()) {
        const float clamped = std::min(255.0f, std::max(-256.0f, std::nearbyint(o[o.size() == 1 ? 0 : i])));
        v = (v & 0x4000FFFFFFFFull) | ((static_cast<uint64_t>(static_cast<int64_t>(clamped)) & 0x1FF) << 37);
      }
      p[i] = static_cast<int64_t>(v);
    }
    return output(out);
  });
}

// Eight int4 values, consecutive along the last dimension, to one int32 (value j in bits 4j..4j+3).
Tensor convertWeightToInt4Pack(const Tensor& weight, int64_t inner_k_tiles) {
  constexpr const char* op = "npu_convert_weight_to_int4pack";
  checkInt4Pack(weight, inner_k_tiles);
  return onHostProjected(op, {weight}, [&](auto input, auto output) {
    const Tensor w = input(weight);
    Tensor out = emptyInt4Pack(w);
    const int32_t* wp = w.const_data_ptr<int32_t>();
    int32_t* op_ = out.mutable_data_ptr<int32_t>();
    for (int64_t i = 0; i < w.numel(); ++i)
      NPU_OP_CHECK(wp[i] >= -8 && wp[i] <= 7, op, weight.device(), "weight[", i, "] = ", wp[i],
                   " is outside int4's range [-8, 7]");
    at::parallel_for(0, out.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) word |= (static_cast<uint32_t>(wp[i * 8 + j]) & 0xFu) << (4 * j);
        op_[i] = static_cast<int32_t>(word);
      }
    });
    return output(out);
  });
}

}  // namespace npu::ops::moe_quant
