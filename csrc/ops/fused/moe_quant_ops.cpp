// The mixture-of-experts and int8 quantization ops of LLM serving and training,
// in the npu namespace with the Ascend adapter's signatures, defaults and
// result tuples (what vllm-ascend and MindSpeed call):
//   npu_moe_gating_top_k_softmax   softmax over the experts, then top-k
//   npu_moe_init_routing_v2        tokens sorted by expert (dropless, active
//                                  or drop/pad), optionally int8-quantized
//   npu_grouped_matmul (.List)     one matmul per expert group, float or int8
//   npu_moe_token_unpermute (_grad) the weighted sum back to token order
//   npu_dynamic_quant              per-token symmetric int8 (or int4) quantization
//   npu_quant_matmul               int8 x int8 (or packed int4) with dequantization
//   npu_convert_weight_to_int4pack eight int4 values to an int32
// Like fused_ops.cpp, the kernels run on host views of npu memory in stream
// order (HostExecution) or directly on cpu tensors; their meta kernels (same
// checks, shapes fixed by the arguments, never by the data) let torch.compile
// trace them; autograd is registered from Python (torch_npu/_llm_moe.py).
//
// Integer matmuls are exact: int8 (or int4) operands are multiplied as float32
// in blocks of K short enough that every partial sum is an integer below 2^24,
// then summed in int32 like the chip's accumulators.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../core/device.h"
#include "../../core/profile.h"
#include "../../runtime/tracing.h"
#include "../host/dtypes.h"
#include "../host/host_execution.h"
#include "../host/fused/fast_exp.h"
#include "common.h"
#include "../host/fused/on_host.h"

namespace npu::ops {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using OptTensorList = std::optional<at::TensorList>;

Tensor valueOr(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

const char* dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kQUInt4x2: return "quint4x2";
    default: return c10::toString(t);
  }
}

bool isFloat16Or32(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Ascend passes dtypes as ints (torch.dtype converts): validate and convert.
at::ScalarType dtypeFromInt(const char* op, c10::Device device, int64_t value, const char* name) {
  NPU_OP_CHECK(value >= 0 && value < static_cast<int64_t>(at::ScalarType::NumOptions), op, device, name,
               " must be a torch.dtype, got the integer ", value);
  return static_cast<at::ScalarType>(value);
}

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

// int64 scales (npu_trans_quant_param's form) keep the float32 scale's bits (cut to FP19) in
// their low 32 bits and an int8 result's offset in bits 37..45 (9 bits, signed).
std::vector<float> scaleValues(const Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kLong) return floatValues(t);
  const Tensor c = t.contiguous();
  std::vector<float> out(c.numel());
  const int64_t* p = c.const_data_ptr<int64_t>();
  for (const auto i : c10::irange(c.numel())) {
    const auto bits = static_cast<uint32_t>(static_cast<uint64_t>(p[i]) & 0xFFFFFFFFu);
    std::memcpy(&out[i], &bits, sizeof(float));
  }
  return out;
}

std::vector<float> embeddedOffsets(const Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kLong) return {};
  const Tensor c = t.contiguous();
  std::vector<float> out(c.numel());
  bool any = false;
  const int64_t* p = c.const_data_ptr<int64_t>();
  for (const auto i : c10::irange(c.numel())) {
    const int64_t field = (static_cast<uint64_t>(p[i]) >> 37) & 0x1FF;
    out[i] = static_cast<float>(field >= 256 ? field - 512 : field);
    any |= field != 0;
  }
  return any ? out : std::vector<float>();
}

// round half to even (the conversion of the chip and of numpy's round), saturated to [lo, hi].
inline float roundClamp(float v, float lo, float hi) { return std::min(hi, std::max(lo, std::nearbyint(v))); }

// ---- vector loops (NPU_VECTOR_CLONES: common.h) ----------------------------------------
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

void checkGating(const char* op, const Tensor& x, const Tensor& finished, int64_t k) {
  const auto dev = x.device();
  NPU_OP_CHECK(x.dim() == 2 || x.dim() == 3, op, dev, "x must be 2-d [tokens, experts] or 3-d, got ", x.dim(),
               "-d ", x.sizes());
  NPU_OP_CHECK(isFloat16Or32(x.scalar_type()), op, dev, "x must be float16, bfloat16 or float32, got ",
               dtypeName(x.scalar_type()), "; cast the router logits with .float()");
  const int64_t experts = x.size(-1);
  NPU_OP_CHECK(k >= 1 && k <= experts && k <= 1024, op, dev, "k must be in [1, min(experts, 1024)] = [1, ",
               std::min<int64_t>(experts, 1024), "], got ", k);
  if (finished.defined()) {
    NPU_OP_CHECK(finished.scalar_type() == at::kBool, op, dev, "finished must be bool, got ",
                 dtypeName(finished.scalar_type()), "; pass a mask such as (lengths == 0)");
    NPU_OP_CHECK(finished.sizes() == x.sizes().slice(0, x.dim() - 1), op, dev, "finished must have shape x.shape[:-1] = ",
                 x.sizes().slice(0, x.dim() - 1), ", got ", finished.sizes());
  }
}

std::vector<int64_t> withLast(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end());
  shape.back() = last;
  return shape;
}

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

void checkGatingBackward(const char* op, const Tensor& grad, const Tensor& x, int64_t k) {
  checkGating(op, x, Tensor(), k);
  NPU_OP_CHECK(grad.sizes() == c10::IntArrayRef(withLast(x.sizes(), k)) && grad.scalar_type() == x.scalar_type(), op,
               x.device(), "grad_y must be x's shape with k last and x's dtype, got ", grad.sizes(), " ",
               dtypeName(grad.scalar_type()));
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

Tensor gatingTopKSoftmaxBackwardMeta(const Tensor& grad, const Tensor& x, int64_t k) {
  checkGatingBackward("_npu_moe_gating_top_k_softmax_backward", grad, x, k);
  return at::empty(x.sizes(), x.options());
}

std::tuple<Tensor, Tensor, Tensor> gatingTopKSoftmaxMeta(const Tensor& x, const OptTensor& finished, int64_t k) {
  checkGating("npu_moe_gating_top_k_softmax", x, valueOr(finished), k);
  const auto shape = withLast(x.sizes(), k);
  return {at::empty(shape, x.options()), at::empty(shape, x.options().dtype(at::kInt)),
          at::empty(shape, x.options().dtype(at::kInt))};
}

// ---- npu_moe_init_routing_v2 -----------------------------------------------------------

struct RoutingArgs {
  int64_t rows, k, hidden;
  int64_t start, end;    // the active experts [start, end)
  int64_t rows_out;      // expanded_x's rows: an upper bound fixed by the arguments
  bool drop_pad;
  int64_t capacity;
  int64_t quant_mode;
};

RoutingArgs checkRouting(const char* op, const Tensor& x, const Tensor& expert_idx, const Tensor& scale,
                         const Tensor& offset, int64_t active_num, int64_t expert_capacity, int64_t expert_num,
                         int64_t drop_pad_mode, int64_t tokens_num_type, bool tokens_num_flag, int64_t quant_mode,
                         at::IntArrayRef active_expert_range, int64_t row_idx_type) {
  const auto dev = x.device();
  NPU_OP_CHECK(x.dim() == 2, op, dev, "x must be 2-d [tokens, hidden], got ", x.sizes());
  NPU_OP_CHECK(expert_idx.dim() == 2 && expert_idx.size(0) == x.size(0), op, dev,
               "expert_idx must be 2-d [tokens, k] with x's tokens (", x.size(0), "), got ", expert_idx.sizes());
  NPU_OP_CHECK(expert_idx.scalar_type() == at::kInt, op, dev, "expert_idx must be int32, got ",
               dtypeName(expert_idx.scalar_type()), "; npu_moe_gating_top_k_softmax gives int32, or use .int()");
  const bool float_x = isFloat16Or32(x.scalar_type());
  NPU_OP_CHECK(float_x || x.scalar_type() == at::kChar, op, dev, "x must be float16, bfloat16, float32 or int8, got ",
               dtypeName(x.scalar_type()));
  NPU_OP_CHECK(quant_mode == -1 || quant_mode == 0 || quant_mode == 1, op, dev, "quant_mode ", quant_mode,
               " (float8, hifloat8, mxfp or int4 results) is not supported on this npu, which has no such dtypes; "
               "use -1 (none), 0 (static int8) or 1 (dynamic int8)");
  NPU_OP_CHECK(quant_mode == -1 || float_x, op, dev, "quantization (quant_mode ", quant_mode,
               ") needs a float16, bfloat16 or float32 x, got int8");
  NPU_OP_CHECK(drop_pad_mode == 0 || drop_pad_mode == 1, op, dev, "drop_pad_mode must be 0 (dropless) or 1 (drop/pad), got ",
               drop_pad_mode);
  NPU_OP_CHECK(tokens_num_type >= 0 && tokens_num_type <= 2, op, dev,
               "expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key_value), got ", tokens_num_type);
  NPU_OP_CHECK(row_idx_type == 0 || row_idx_type == 1, op, dev, "row_idx_type must be 0 (gather) or 1 (scatter), got ",
               row_idx_type);
  RoutingArgs a{x.size(0), expert_idx.size(1), x.size(1), 0, 0, 0, drop_pad_mode == 1, expert_capacity, quant_mode};
  if (!active_expert_range.empty()) {
    NPU_OP_CHECK(active_expert_range.size() == 2 && active_expert_range[0] >= 0 &&
                     active_expert_range[1] > active_expert_range[0] && active_expert_range[1] <= 10240,
                 op, dev, "active_expert_range must be [start, end) with 0 <= start < end <= 10240, got ",
              active_expert_range);
    NPU_OP_CHECK(expert_num < 0 || active_expert_range[1] <= expert_num, op, dev, "active_expert_range's end (",
                 active_expert_range[1], ") must not pass expert_num (", expert_num, ")");
    a.start = active_expert_range[0];
    a.end = active_expert_range[1];
  } else {
    const bool needs_num = tokens_num_flag || a.drop_pad;
    NPU_OP_CHECK(expert_num > 0 || !needs_num, op, dev,
                 "expert_num must be given (> 0) for the per-expert counts or drop/pad mode, got ", expert_num);
    a.start = 0;
    a.end = expert_num > 0 ? expert_num : std::numeric_limits<int32_t>::max();
  }
  NPU_OP_CHECK(expert_num <= 10240, op, dev, "expert_num must be at most 10240, got ", expert_num);
  NPU_OP_CHECK(!(tokens_num_flag && tokens_num_type == 2) || expert_num <= 5120, op, dev,
               "expert_num must be at most 5120 in key_value mode (expert_tokens_num_type=2), got ", expert_num);
  if (a.drop_pad) {
    NPU_OP_CHECK(expert_capacity > 0 && expert_capacity <= a.rows, op, dev,
                 "drop/pad mode needs 0 < expert_capacity <= tokens (", a.rows, "), got ", expert_capacity);
    NPU_OP_CHECK(a.start == 0 && a.end == expert_num, op, dev,
                 "drop/pad mode routes every expert: active_expert_range must be empty or [0, expert_num]");
    NPU_OP_CHECK(row_idx_type == 0, op, dev, "drop/pad mode gives gather indices: row_idx_type must be 0");
    NPU_OP_CHECK(!tokens_num_flag || tokens_num_type == 1, op, dev,
                 "drop/pad mode counts the tokens per expert: expert_tokens_num_type must be 1");
    a.rows_out = expert_num * expert_capacity;
  } else {
    a.rows_out = active_num <= 0 ? a.rows * a.k : std::min(active_num, a.rows * a.k);
  }
  const int64_t range = a.end - a.start;
  if (scale.defined()) {
    NPU_OP_CHECK(scale.scalar_type() == at::kFloat, op, dev, "scale must be float32, got ", dtypeName(scale.scalar_type()));
    if (quant_mode == -1) {
      NPU_OP_CHECK(scale.dim() == 1 && scale.size(0) == a.rows, op, dev,
                   "without quantization scale is one float per token, shape [", a.rows, "], got ", scale.sizes());
    } else if (quant_mode == 0) {
      NPU_OP_CHECK(scale.dim() == 1 && scale.size(0) == 1, op, dev, "static quantization takes scale of shape [1], got ",
                   scale.sizes());
    } else {
      NPU_OP_CHECK(scale.dim() == 2 && scale.size(1) == a.hidden && (scale.size(0) == 1 || scale.size(0) == range), op,
                   dev, "dynamic quantization takes smooth scales of shape [1, ", a.hidden, "] or [experts in range (",
                   range, "), ", a.hidden, "], got ", scale.sizes());
    }
  }
  if (quant_mode == 0) {
    NPU_OP_CHECK(scale.defined() && offset.defined(), op, dev,
                 "static quantization (quant_mode=0, the default, as on Ascend) needs scale and offset, each of "
                 "shape [1]; pass quant_mode=-1 to route without quantization or 1 for dynamic int8");
    NPU_OP_CHECK(offset.dim() == 1 && offset.size(0) == 1 && offset.scalar_type() == at::kFloat, op, dev,
                 "offset must be float32 of shape [1], got ", dtypeName(offset.scalar_type()), " ", offset.sizes());
  } else {
    NPU_OP_CHECK(!offset.defined(), op, dev, "offset is only for static quantization (quant_mode=0)");
  }
  return a;
}

// The results' shapes and dtypes, for the kernel and its meta kernel alike.
std::tuple<Tensor, Tensor, Tensor, Tensor> emptyRouting(const RoutingArgs& a, const Tensor& x, int64_t expert_num,
                                                        int64_t tokens_num_type, bool tokens_num_flag) {
  const auto x_dtype = a.quant_mode == -1 ? x.scalar_type() : at::kChar;
  std::vector<int64_t> x_shape = a.drop_pad ? std::vector<int64_t>{expert_num, a.capacity, a.hidden}
                                            : std::vector<int64_t>{a.rows_out, a.hidden};
  std::vector<int64_t> count_shape;  // a 0-d placeholder without the flag, as on Ascend
  if (tokens_num_flag) count_shape = tokens_num_type == 2 ? std::vector<int64_t>{expert_num, 2}
                                                           : std::vector<int64_t>{a.end - a.start};
  std::vector<int64_t> scale_shape;  // 0-d for static quantization
  if (a.quant_mode != 0) scale_shape = {a.rows_out};
  return {at::empty(x_shape, x.options().dtype(x_dtype)), at::empty({a.rows * a.k}, x.options().dtype(at::kInt)),
          at::empty(count_shape, x.options().dtype(at::kLong)), at::empty(scale_shape, x.options().dtype(at::kFloat))};
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

std::tuple<Tensor, Tensor, Tensor, Tensor> initRoutingV2Meta(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale, const OptTensor& offset, int64_t active_num,
    int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t tokens_num_type, bool tokens_num_flag,
    int64_t quant_mode, at::IntArrayRef active_expert_range, int64_t row_idx_type) {
  const RoutingArgs a = checkRouting("npu_moe_init_routing_v2", x, expert_idx, valueOr(scale), valueOr(offset),
                                     active_num, expert_capacity, expert_num, drop_pad_mode, tokens_num_type,
                                     tokens_num_flag, quant_mode, active_expert_range, row_idx_type);
  return emptyRouting(a, x, expert_num, tokens_num_type, tokens_num_flag);
}

// ---- npu_grouped_matmul ----------------------------------------------------------------

std::vector<Tensor> listOf(const OptTensorList& l) {
  return l.has_value() ? std::vector<Tensor>(l->begin(), l->end()) : std::vector<Tensor>();
}

enum class GmmKind { Float, Int8, WeightOnly };

// The arguments of both overloads, checked, and the results' shapes.
struct Gmm {
  static constexpr const char* op = "npu_grouped_matmul";
  c10::Device device = at::kCPU;
  std::vector<Tensor> x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale;
  Tensor group_tensor;                         // the Tensor overload's group_list
  std::optional<std::vector<int64_t>> group_ints;  // the List overload's
  int64_t split_item = 0, group_type = -1, group_list_type = 0, act_type = 0;
  at::ScalarType out_dtype = at::kFloat;
  GmmKind kind = GmmKind::Float;
  bool single_weight = false;  // one 3-d weight [experts, k, n]
  int64_t experts = 0;

  bool hasGroups() const { return group_tensor.defined() || group_ints.has_value(); }
  Tensor weightOf(int64_t e) const { return single_weight ? weight[0].select(0, e) : weight[e]; }
  int64_t n() const { return single_weight ? weight[0].size(2) : weight[0].size(1); }
  bool singleOutput() const { return split_item == 2 || split_item == 3; }

  void check() {
    NPU_OP_CHECK(!x.empty() && !weight.empty() && x.size() <= 128 && weight.size() <= 128, op, device,
                 "x and weight must be lists of 1 to 128 tensors, got ", x.size(), " and ", weight.size());
    NPU_OP_CHECK(split_item >= 0 && split_item <= 3, op, device,
                 "split_item must be 0 or 1 (one output per group) or 2 or 3 (one output), got ", split_item);
    NPU_OP_CHECK(group_type == -1 || group_type == 0 || group_type == 2, op, device,
                 "group_type must be -1 (none), 0 (m axis) or 2 (k axis), got ", group_type);
    NPU_OP_CHECK(act_type >= 0 && act_type <= 5 && act_type != 3, op, device,
                 "act_type must be 0 (none), 1 (relu), 2 (gelu_tanh), 4 (fast_gelu) or 5 (silu), got ", act_type);
    const auto xt = x[0].scalar_type(), wt = weight[0].scalar_type();
    for (const Tensor& t : x) NPU_OP_CHECK(t.scalar_type() == xt, op, device, "every x must have one dtype");
    for (const Tensor& t : weight) NPU_OP_CHECK(t.scalar_type() == wt, op, device, "every weight must have one dtype");
    NPU_OP_CHECK(xt != at::kInt && wt != at::kInt, op, device,
                 "int4 operands (int32-packed) are not supported by this npu's grouped matmul; unpack them to int8 "
                 "(values in [-8, 7]) and pass int8 x and weight");
    if (isFloat16Or32(xt) && wt == xt) {
      kind = GmmKind::Float;
    } else if (xt == at::kChar && wt == at::kChar) {
      kind = GmmKind::Int8;
    } else if ((xt == at::kHalf || xt == at::kBFloat16) && wt == at::kChar) {
      kind = GmmKind::WeightOnly;
    } else {
      NPU_OP_CHECK(false, op, device, "x and weight must both be float16, bfloat16 or float32 (the same), both int8, or "
                   "float16/bfloat16 x with int8 weight (antiquant), got ", dtypeName(xt), " and ", dtypeName(wt));
    }
    single_weight = weight.size() == 1 && weight[0].dim() == 3;
    for (const Tensor& w : weight)
      NPU_OP_CHECK(w.dim() == (single_weight ? 3 : 2), op, device, "weight must be 2-d tensors [k, n] or one 3-d "
                   "tensor [experts, k, n], got ", w.sizes());
    experts = single_weight ? weight[0].size(0) : static_cast<int64_t>(weight.size());
    checkDtypes();
    checkShapes();
  }

  void checkDtypes() {
    const auto xt = x[0].scalar_type();
    auto lengthOk = [&](const std::vector<Tensor>& l, const char* name) {
      NPU_OP_CHECK(l.empty() || static_cast<int64_t>(l.size()) == static_cast<int64_t>(weight.size()), op, device, name,
                   " must have one tensor per weight (", weight.size(), "), got ", l.size());
    };
    lengthOk(bias, "bias");
    lengthOk(scale, "scale");
    lengthOk(antiquant_scale, "antiquant_scale");
    lengthOk(antiquant_offset, "antiquant_offset");
    NPU_OP_CHECK(offset.empty(), op, device, "offset is reserved on Ascend (only None is supported)");
    if (kind == GmmKind::Float) {
      NPU_OP_CHECK(out_dtype == xt, op, device, "output_dtype must be None or x's dtype (", dtypeName(xt),
                   ") without quantization, got ", dtypeName(out_dtype));
      const auto bias_dtype = xt == at::kHalf ? at::kHalf : at::kFloat;
      for (const Tensor& b : bias)
        NPU_OP_CHECK(b.scalar_type() == bias_dtype, op, device, "bias must be ", dtypeName(bias_dtype), " for ",
                     dtypeName(xt), " x, got ", dtypeName(b.scalar_type()), "; cast it with .to(torch.",
                     dtypeName(bias_dtype), ")");
      NPU_OP_CHECK(scale.empty() && per_token_scale.empty() && antiquant_scale.empty() && antiquant_offset.empty(), op,
                   device, "scale, per_token_scale and antiquant scales are for int8 weights; float weights take none");
      NPU_OP_CHECK(act_type == 0, op, device, "act_type is only supported with per-token int8 quantization on Ascend");
    } else if (kind == GmmKind::Int8) {
      NPU_OP_CHECK(out_dtype == at::kChar || out_dtype == at::kHalf || out_dtype == at::kBFloat16 || out_dtype == at::kInt,
                   op, device, "int8 x and weight give int8, float16, bfloat16 or int32 results, output_dtype ",
                   dtypeName(out_dtype), " is not one");
      NPU_OP_CHECK(out_dtype == at::kInt || !scale.empty(), op, device,
                   "int8 x and weight need scale (one per weight) unless output_dtype is torch.int32");
      for (const Tensor& s : scale)
        NPU_OP_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kBFloat16 || s.scalar_type() == at::kLong, op,
                     device, "scale must be float32, bfloat16 or int64, got ", dtypeName(s.scalar_type()));
      for (const Tensor& t : per_token_scale)
        NPU_OP_CHECK(t.scalar_type() == at::kFloat, op, device, "per_token_scale must be float32, got ",
                     dtypeName(t.scalar_type()));
      NPU_OP_CHECK(per_token_scale.empty() || out_dtype == at::kHalf || out_dtype == at::kBFloat16, op, device,
                   "per_token_scale needs a float16 or bfloat16 output_dtype");
      NPU_OP_CHECK(per_token_scale.empty() || per_token_scale.size() == x.size(), op, device,
                   "per_token_scale must have one tensor per x (", x.size(), ")");
      for (const Tensor& b : bias)
        NPU_OP_CHECK(b.scalar_type() == at::kInt || ((out_dtype == at::kHalf || out_dtype == at::kBFloat16) &&
                                                      isFloat16Or32(b.scalar_type())),
                     op, device, "bias must be int32 (or float for float16/bfloat16 results) with int8 x, got ",
                     dtypeName(b.scalar_type()));
      NPU_OP_CHECK(act_type == 0 || !per_token_scale.empty(), op, device,
                   "act_type is only supported with per-token quantization (per_token_scale) on Ascend");
      NPU_OP_CHECK(antiquant_scale.empty() && antiquant_offset.empty(), op, device,
                   "antiquant scales are for float x with int8 weight");
    } else {
      NPU_OP_CHECK(out_dtype == xt, op, device, "output_dtype must be None or x's dtype with an int8 weight");
      NPU_OP_CHECK(!antiquant_scale.empty(), op, device, "float x with int8 weight needs antiquant_scale (and optionally "
                   "antiquant_offset), one per weight");
      for (const auto* l : {&antiquant_scale, &antiquant_offset})
        for (const Tensor& t : *l)
          NPU_OP_CHECK(t.scalar_type() == xt, op, device, "antiquant_scale and antiquant_offset must have x's dtype ",
                       dtypeName(xt), ", got ", dtypeName(t.scalar_type()));
      NPU_OP_CHECK(scale.empty() && per_token_scale.empty() && act_type == 0, op, device,
                   "scale, per_token_scale and act_type are for int8 x; float x with int8 weight takes antiquant scales");
      const auto bias_dtype = xt == at::kHalf ? at::kHalf : at::kFloat;
      for (const Tensor& b : bias)
        NPU_OP_CHECK(b.scalar_type() == bias_dtype, op, device, "bias must be ", dtypeName(bias_dtype), " for ",
                     dtypeName(xt), " x");
    }
  }

  // Per-weight parameter of n values: one tensor per weight of shape [n] (or [1] for
  // a per-tensor scale), or for a single 3-d weight one tensor [experts, n] / [experts, 1] / [experts].
  void checkPerExpert(const std::vector<Tensor>& l, const char* name, bool allow_one = true) const {
    for (size_t i = 0; i < l.size(); ++i) {
      const Tensor& t = l[i];
      const int64_t ni = single_weight ? n() : weight[i].size(1);
      const bool ok = single_weight ? (t.dim() == 2 && t.size(0) == experts && (t.size(1) == ni || (allow_one && t.size(1) == 1))) ||
                                          (t.dim() == 1 && (t.size(0) == experts * ni || (allow_one && t.size(0) == experts)))
                                    : t.dim() == 1 && (t.size(0) == ni || (allow_one && t.size(0) == 1));
      NPU_OP_CHECK(ok, op, device, name, " must be ", single_weight ? "[experts, n]" : "[n] per weight",
                   " for the weight's n (", ni, "), got ", t.sizes());
    }
  }

  void checkShapes() {
    checkPerExpert(bias, "bias", false);
    checkPerExpert(scale, "scale");
    checkPerExpert(antiquant_scale, "antiquant_scale");
    checkPerExpert(antiquant_offset, "antiquant_offset");
    if (group_type == -1) {
      NPU_OP_CHECK(!hasGroups(), op, device, "group_type -1 (no grouping) takes no group_list");
      NPU_OP_CHECK(!singleOutput(), op, device, "group_type -1 gives one output per x: split_item must be 0 or 1");
      NPU_OP_CHECK(!single_weight && x.size() == weight.size(), op, device,
                   "group_type -1 multiplies x[i] by weight[i]: give as many 2-d weights as x tensors (", x.size(), ")");
      for (size_t i = 0; i < x.size(); ++i)
        NPU_OP_CHECK(x[i].dim() >= 2 && x[i].dim() <= 6 && x[i].size(-1) == weight[i].size(0), op, device, "x[", i,
                     "] must be 2-d to 6-d with last dimension weight[", i, "].size(0) = ", weight[i].size(0), ", got ",
                     x[i].sizes());
      return;
    }
    for (const Tensor& t : x) NPU_OP_CHECK(t.dim() == 2, op, device, "grouped x must be 2-d, got ", t.sizes());
    if (group_type == 2) {
      NPU_OP_CHECK(x.size() == 1 && weight.size() == 1 && !single_weight && singleOutput(), op, device,
                   "k-axis grouping (group_type 2) takes one x [m, k], one weight [k, n] and split_item 2 or 3");
      NPU_OP_CHECK(group_tensor.defined(), op, device, "k-axis grouping needs group_list as a Tensor");
      NPU_OP_CHECK(x[0].size(1) == weight[0].size(0), op, device, "x's k (", x[0].size(1), ") must match weight's (",
                   weight[0].size(0), ")");
      NPU_OP_CHECK(bias.empty() && kind == GmmKind::Float, op, device, "k-axis grouping takes float operands, no bias");
      checkGroupList(-1);
      return;
    }
    // m-axis grouping
    const int64_t n0 = n();
    for (int64_t e = 0; e < experts; ++e) {
      const Tensor w = weightOf(e);
      NPU_OP_CHECK(w.size(0) == x[0].size(1), op, device, "weight ", e, "'s k (", w.size(0), ") must match x's (",
                   x[0].size(1), ")");
      NPU_OP_CHECK(!singleOutput() || w.size(1) == n0, op, device, "one output needs every weight's n equal (", n0, ")");
    }
    if (x.size() == 1) {
      NPU_OP_CHECK(hasGroups(), op, device, "one x grouped along m needs group_list (the rows of each group)");
      NPU_OP_CHECK(singleOutput() || group_ints.has_value(), op, device, "with group_list as a Tensor the group sizes "
                   "are data: split_item must be 2 or 3 (one output); pass group_list as a list of ints for one output "
                   "per group");
      checkGroupList(experts);
    } else {
      NPU_OP_CHECK(static_cast<int64_t>(x.size()) == experts, op, device, "several x need one weight each (", x.size(),
                   " x, ", experts, " weights)");
      if (group_ints.has_value()) checkGroupList(experts);
      else NPU_OP_CHECK(!group_tensor.defined(), op, device, "several x carry their groups; pass group_list as ints or None");
    }
    for (size_t i = 0; i < per_token_scale.size(); ++i)
      NPU_OP_CHECK(per_token_scale[i].dim() == 1 && per_token_scale[i].size(0) == x[i].size(0), op, device,
                   "per_token_scale[", i, "] must be [m] = [", x[i].size(0), "], got ", per_token_scale[i].sizes());
  }

  void checkGroupList(int64_t groups) const {
    if (group_ints.has_value()) {
      NPU_OP_CHECK(group_type != 2, op, device, "k-axis grouping needs group_list as a Tensor");
      NPU_OP_CHECK(static_cast<int64_t>(group_ints->size()) == groups, op, device, "group_list must have one entry per "
                   "weight (", groups, "), got ", group_ints->size());
      int64_t previous = 0;
      for (int64_t v : *group_ints) {
        NPU_OP_CHECK(v >= previous, op, device, "group_list as ints is the cumulative rows (non-decreasing), got ",
                     c10::IntArrayRef(*group_ints));
        previous = v;
      }
      if (x.size() > 1) {
        int64_t start = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          NPU_OP_CHECK((*group_ints)[i] - start == x[i].size(0), op, device, "group_list's differences must equal "
                       "each x's rows");
          start = (*group_ints)[i];
        }
      }
      return;
    }
    const Tensor& g = group_tensor;
    NPU_OP_CHECK(g.scalar_type() == at::kLong, op, device, "group_list must be int64, got ", dtypeName(g.scalar_type()),
                 "; convert it with .long()");
    NPU_OP_CHECK(group_list_type >= 0 && group_list_type <= 2, op, device,
                 "group_list_type must be 0 (cumsum), 1 (counts) or 2 ([group, count] pairs), got ", group_list_type);
    if (group_list_type == 2) {
      NPU_OP_CHECK(kind == GmmKind::Int8 && group_type == 0, op, device,
                   "group_list_type 2 is only supported with int8 x and weight grouped along m on Ascend");
      NPU_OP_CHECK(g.dim() == 2 && g.size(1) == 2, op, device, "group_list_type 2 takes group_list [groups, 2], got ",
                   g.sizes());
    } else {
      NPU_OP_CHECK(g.dim() == 1 && (groups < 0 || g.size(0) == groups), op, device, "group_list must be 1-d with one "
                   "entry per weight (", groups, "), got ", g.sizes());
    }
    NPU_OP_CHECK(g.size(0) <= 1024, op, device, "group_list takes at most 1024 groups, got ", g.size(0));
  }

  std::vector<std::vector<int64_t>> outputShapes() const {
    std::vector<std::vector<int64_t>> shapes;
    if (group_type == 2) {
      shapes.push_back({group_tensor.size(0), x[0].size(0), weight[0].size(1)});
    } else if (singleOutput()) {
      int64_t m = 0;
      for (const Tensor& t : x) m += t.size(0);
      shapes.push_back({m, n()});
    } else if (x.size() == 1 && group_type == 0) {  // one x split into the groups of group_ints
      int64_t start = 0;
      for (int64_t e = 0; e < experts; ++e) {
        shapes.push_back({(*group_ints)[e] - start, weightOf(e).size(1)});
        start = (*group_ints)[e];
      }
    } else {
      for (size_t i = 0; i < x.size(); ++i) {
        std::vector<int64_t> s(x[i].sizes().begin(), x[i].sizes().end());
        s.back() = single_weight ? n() : weight[i].size(1);
        shapes.push_back(s);
      }
    }
    return shapes;
  }

  std::vector<Tensor> emptyOutputs(const at::TensorOptions& options) const {
    std::vector<Tensor> out;
    for (const auto& s : outputShapes()) out.push_back(at::empty(s, options.dtype(out_dtype)));
    return out;
  }
};

Gmm parseGmm(at::TensorList x, at::TensorList weight, const OptTensorList& bias, const OptTensorList& scale,
             const OptTensorList& offset, const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
             const OptTensorList& per_token_scale, const OptTensorList& activation_input,
             const OptTensorList& activation_quant_scale, const OptTensorList& activation_quant_offset,
             std::optional<int64_t> split_item, std::optional<int64_t> group_type,
             std::optional<int64_t> group_list_type, std::optional<int64_t> act_type,
             std::optional<at::ScalarType> output_dtype) {
  Gmm g;
  g.device = x.empty() ? c10::Device(at::kCPU) : x[0].device();
  g.x.assign(x.begin(), x.end());
  g.weight.assign(weight.begin(), weight.end());
  g.bias = listOf(bias);
  g.scale = listOf(scale);
  g.offset = listOf(offset);
  g.antiquant_scale = listOf(antiquant_scale);
  g.antiquant_offset = listOf(antiquant_offset);
  g.per_token_scale = listOf(per_token_scale);
  NPU_OP_CHECK(listOf(activation_input).empty() && listOf(activation_quant_scale).empty() &&
                   listOf(activation_quant_offset).empty(),
               Gmm::op, g.device, "activation_input, activation_quant_scale and activation_quant_offset are reserved on "
               "Ascend (only None is supported)");
  g.split_item = split_item.value_or(0);
  g.group_list_type = group_list_type.value_or(0);
  g.act_type = act_type.value_or(0);
  if (!x.empty() && !weight.empty()) {
    const bool int8 = x[0].scalar_type() == at::kChar && weight[0].scalar_type() == at::kChar;
    g.out_dtype = output_dtype.value_or(int8 ? at::kChar : x[0].scalar_type());
  }
  return g;
}

void resolveGroupType(Gmm& g, std::optional<int64_t> group_type) {
  // None: along m where there are groups, else none (the List overload's only form).
  g.group_type = group_type.has_value() ? *group_type : (g.hasGroups() ? 0 : -1);
}

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

std::vector<Tensor> groupedMatmulImpl(Gmm& g) {
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

std::vector<Tensor> groupedMatmul(at::TensorList x, at::TensorList weight, const OptTensorList& bias,
                                  const OptTensorList& scale, const OptTensorList& offset,
                                  const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
                                  const OptTensorList& per_token_scale, const OptTensor& group_list,
                                  const OptTensorList& activation_input, const OptTensorList& activation_quant_scale,
                                  const OptTensorList& activation_quant_offset, std::optional<int64_t> split_item,
                                  std::optional<int64_t> group_type, std::optional<int64_t> group_list_type,
                                  std::optional<int64_t> act_type, at::OptionalIntArrayRef tuning_config,
                                  std::optional<int64_t> output_dtype, std::optional<int64_t> x_dtype,
                                  std::optional<int64_t> weight_dtype, std::optional<int64_t> scale_dtype,
                                  std::optional<int64_t> per_token_scale_dtype, bool meta) {
  const c10::Device device = x.empty() ? c10::Device(at::kCPU) : x[0].device();
  NPU_OP_CHECK(!x_dtype && !weight_dtype && !scale_dtype && !per_token_scale_dtype, Gmm::op, device,
               "x_dtype, weight_dtype, scale_dtype and per_token_scale_dtype name hifloat8/float4/float8_e8m0 data, which "
               "this npu does not have; leave them None");
  std::optional<at::ScalarType> out;
  if (output_dtype.has_value()) out = dtypeFromInt(Gmm::op, device, *output_dtype, "output_dtype");
  Gmm g = parseGmm(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
                   activation_quant_scale, activation_quant_offset, split_item, group_type, group_list_type, act_type,
                   out);
  g.group_tensor = valueOr(group_list);
  resolveGroupType(g, group_type);
  (void)tuning_config;  // a tiling hint for the chip
  if (meta) {
    g.check();
    return g.emptyOutputs(x[0].options());
  }
  return groupedMatmulImpl(g);
}

std::vector<Tensor> groupedMatmulList(at::TensorList x, at::TensorList weight, const OptTensorList& bias,
                                      const OptTensorList& scale, const OptTensorList& offset,
                                      const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
                                      const OptTensorList& per_token_scale, at::OptionalIntArrayRef group_list,
                                      const OptTensorList& activation_input,
                                      const OptTensorList& activation_quant_scale,
                                      const OptTensorList& activation_quant_offset, std::optional<int64_t> split_item,
                                      std::optional<int64_t> group_type, std::optional<int64_t> group_list_type,
                                      std::optional<int64_t> act_type, std::optional<at::ScalarType> output_dtype,
                                      bool meta) {
  Gmm g = parseGmm(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
                   activation_quant_scale, activation_quant_offset, split_item, group_type, group_list_type, act_type,
                   output_dtype);
  if (group_list.has_value()) g.group_ints = group_list->vec();
  NPU_OP_CHECK(!group_type.has_value() || *group_type == 0 || *group_type == -1, Gmm::op, g.device,
               "with group_list as ints group_type must be None");
  resolveGroupType(g, group_type);
  if (meta) {
    g.check();
    return g.emptyOutputs(x[0].options());
  }
  return groupedMatmulImpl(g);
}

template <bool Meta>
std::vector<Tensor> groupedMatmulEntry(at::TensorList x, at::TensorList weight, const OptTensorList& bias,
                                       const OptTensorList& scale, const OptTensorList& offset,
                                       const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
                                       const OptTensorList& per_token_scale, const OptTensor& group_list,
                                       const OptTensorList& activation_input,
                                       const OptTensorList& activation_quant_scale,
                                       const OptTensorList& activation_quant_offset, std::optional<int64_t> split_item,
                                       std::optional<int64_t> group_type, std::optional<int64_t> group_list_type,
                                       std::optional<int64_t> act_type, at::OptionalIntArrayRef tuning_config,
                                       std::optional<int64_t> output_dtype, std::optional<int64_t> x_dtype,
                                       std::optional<int64_t> weight_dtype, std::optional<int64_t> scale_dtype,
                                       std::optional<int64_t> per_token_scale_dtype) {
  return groupedMatmul(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, group_list,
                       activation_input, activation_quant_scale, activation_quant_offset, split_item, group_type,
                       group_list_type, act_type, tuning_config, output_dtype, x_dtype, weight_dtype, scale_dtype,
                       per_token_scale_dtype, Meta);
}

template <bool Meta>
std::vector<Tensor> groupedMatmulListEntry(at::TensorList x, at::TensorList weight, const OptTensorList& bias,
                                           const OptTensorList& scale, const OptTensorList& offset,
                                           const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
                                           const OptTensorList& per_token_scale, at::OptionalIntArrayRef group_list,
                                           const OptTensorList& activation_input,
                                           const OptTensorList& activation_quant_scale,
                                           const OptTensorList& activation_quant_offset,
                                           std::optional<int64_t> split_item, std::optional<int64_t> group_type,
                                           std::optional<int64_t> group_list_type, std::optional<int64_t> act_type,
                                           std::optional<at::ScalarType> output_dtype) {
  return groupedMatmulList(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                           group_list, activation_input, activation_quant_scale, activation_quant_offset, split_item,
                           group_type, group_list_type, act_type, output_dtype, Meta);
}

// ---- npu_moe_token_unpermute -----------------------------------------------------------

int64_t checkUnpermute(const char* op, const Tensor& permuted, const Tensor& sorted_indices, const Tensor& probs,
                       bool padded_mode) {
  const auto dev = permuted.device();
  NPU_OP_CHECK(!padded_mode, op, dev, "padded_mode=True is not supported by Ascend's kernel; pass padded_mode=False "
               "(tokens routed without capacity padding)");
  NPU_OP_CHECK(permuted.dim() == 2, op, dev, "permuted_tokens must be 2-d [tokens * topk, hidden], got ",
               permuted.sizes());
  NPU_OP_CHECK(isFloat16Or32(permuted.scalar_type()), op, dev, "permuted_tokens must be bfloat16, float16 or float32, got ",
               dtypeName(permuted.scalar_type()));
  NPU_OP_CHECK(sorted_indices.dim() == 1 && sorted_indices.scalar_type() == at::kInt, op, dev,
               "sorted_indices must be 1-d int32, got ", dtypeName(sorted_indices.scalar_type()), " ",
               sorted_indices.sizes(), "; convert with .int()");
  int64_t topk = 1;
  if (probs.defined()) {
    NPU_OP_CHECK(probs.dim() == 2 && probs.numel() == sorted_indices.numel(), op, dev,
                 "probs must be 2-d [tokens, topk] with tokens * topk = sorted_indices' length (",
                 sorted_indices.numel(), "), got ", probs.sizes());
    NPU_OP_CHECK(probs.scalar_type() == permuted.scalar_type(), op, dev, "probs must have permuted_tokens' dtype ",
                 dtypeName(permuted.scalar_type()), ", got ", dtypeName(probs.scalar_type()), "; cast with .to()");
    topk = probs.size(1);
    NPU_OP_CHECK(topk >= 1 && topk <= 512, op, dev, "topk (probs.size(1)) must be in [1, 512], got ", topk);
  }
  return topk;
}

void checkIndices(const char* op, c10::Device dev, const int32_t* s, int64_t count, int64_t rows) {
  for (int64_t i = 0; i < count; ++i)
    NPU_OP_CHECK(s[i] >= 0 && s[i] < rows, op, dev, "sorted_indices[", i, "] = ", s[i],
                 " is not a row of permuted_tokens (", rows, " rows)");
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
  const int64_t topk = checkUnpermute(op, permuted, sorted_indices, probs, padded_mode);
  const auto dev = permuted.device();
  NPU_OP_CHECK(grad.dim() == 2 && grad.size(0) * topk == sorted_indices.numel() && grad.size(1) == permuted.size(1) &&
                   grad.scalar_type() == permuted.scalar_type(),
               op, dev, "grad_unpermuted_tokens must be [", sorted_indices.numel() / topk, ", ", permuted.size(1),
               "] of permuted_tokens' dtype, got ", grad.sizes(), " ", dtypeName(grad.scalar_type()));
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

Tensor tokenUnpermuteMeta(const Tensor& permuted, const Tensor& sorted_indices, const OptTensor& probs,
                          bool padded_mode, at::OptionalIntArrayRef) {
  const int64_t topk = checkUnpermute("npu_moe_token_unpermute", permuted, sorted_indices, valueOr(probs), padded_mode);
  return at::empty({sorted_indices.size(0) / topk, permuted.size(1)}, permuted.options());
}

std::tuple<Tensor, Tensor> tokenUnpermuteGradMeta(const Tensor& permuted, const Tensor& grad,
                                                  const Tensor& sorted_indices, const OptTensor& probs,
                                                  bool padded_mode, at::OptionalIntArrayRef) {
  checkUnpermute("npu_moe_token_unpermute_grad", permuted, sorted_indices, valueOr(probs), padded_mode);
  (void)grad;
  return {at::empty(permuted.sizes(), permuted.options()),
          probs.has_value() ? at::empty(probs->sizes(), probs->options()) : Tensor()};
}

// ---- npu_dynamic_quant ------------------------------------------------------------------

struct QuantArgs {
  at::ScalarType dst = at::kChar;  // int8, or quint4x2 (int4 packed in int32)
  bool per_tensor = false;
};

QuantArgs checkDynamicQuant(const Tensor& x, const Tensor& smooth, const Tensor& group_index,
                            std::optional<int64_t> dst_type, c10::string_view quant_mode, double dst_type_max) {
  constexpr const char* op = "npu_dynamic_quant";
  const auto dev = x.device();
  QuantArgs q;
  NPU_OP_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, op, dev,
               "x must be float16 or bfloat16 (Ascend's kernel takes no float32), got ", dtypeName(x.scalar_type()),
               "; cast it with .half() or .bfloat16()");
  NPU_OP_CHECK(x.dim() >= 2, op, dev, "x must have at least 2 dimensions [..., tokens, hidden], got ", x.sizes());
  if (dst_type.has_value()) q.dst = dtypeFromInt(op, dev, *dst_type, "dst_type");
  NPU_OP_CHECK(q.dst == at::kChar || q.dst == at::kQUInt4x2, op, dev, "dst_type must be torch.int8 or torch.quint4x2 "
               "(int4, eight to an int32), got ", dtypeName(q.dst));
  NPU_OP_CHECK(q.dst != at::kQUInt4x2 || x.size(-1) % 8 == 0, op, dev,
               "int4 output needs the last dimension a multiple of 8, got ", x.size(-1));
  NPU_OP_CHECK(quant_mode == "pertoken" || quant_mode == "pertensor", op, dev,
               "quant_mode must be 'pertoken' or 'pertensor', got '", std::string(quant_mode), "'");
  q.per_tensor = quant_mode == "pertensor";
  NPU_OP_CHECK(dst_type_max == 0.0, op, dev, "dst_type_max is for float8/hifloat8 outputs, which this npu lacks; leave "
               "it 0");
  const int64_t h = x.size(-1);
  if (smooth.defined()) {
    NPU_OP_CHECK(smooth.scalar_type() == at::kHalf || smooth.scalar_type() == at::kBFloat16, op, dev,
                 "smooth_scales must be float16 or bfloat16, got ", dtypeName(smooth.scalar_type()));
    if (group_index.defined()) {
      NPU_OP_CHECK(smooth.dim() == 2 && smooth.size(1) == h, op, dev,
                   "with group_index smooth_scales must be [groups, ", h, "], got ", smooth.sizes());
    } else {
      NPU_OP_CHECK(smooth.dim() == 1 && smooth.size(0) == h, op, dev, "smooth_scales must be [", h, "], got ",
                   smooth.sizes());
    }
  }
  if (group_index.defined()) {
    NPU_OP_CHECK(smooth.defined(), op, dev, "group_index selects rows of smooth_scales: pass smooth_scales too");
    NPU_OP_CHECK(group_index.scalar_type() == at::kInt && group_index.dim() == 1 && group_index.size(0) == smooth.size(0),
                 op, dev, "group_index must be 1-d int32 with one entry per smooth_scales row (", smooth.size(0),
                 "), got ", dtypeName(group_index.scalar_type()), " ", group_index.sizes());
    NPU_OP_CHECK(!q.per_tensor, op, dev, "group_index is for per-token quantization");
  }
  return q;
}

std::tuple<Tensor, Tensor> emptyDynamicQuant(const Tensor& x, const QuantArgs& q) {
  std::vector<int64_t> y_shape(x.sizes().begin(), x.sizes().end());
  if (q.dst == at::kQUInt4x2) y_shape.back() /= 8;
  std::vector<int64_t> scale_shape(x.sizes().begin(), x.sizes().end() - 1);
  if (q.per_tensor) scale_shape = {1};
  return {at::empty(y_shape, x.options().dtype(q.dst == at::kChar ? at::kChar : at::kInt)),
          at::empty(scale_shape, x.options().dtype(at::kFloat))};
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

std::tuple<Tensor, Tensor> dynamicQuantMeta(const Tensor& x, const OptTensor& smooth, const OptTensor& group_index,
                                            std::optional<int64_t> dst_type, c10::string_view quant_mode,
                                            double dst_type_max) {
  return emptyDynamicQuant(x, checkDynamicQuant(x, valueOr(smooth), valueOr(group_index), dst_type, quant_mode,
                                                dst_type_max));
}

// ---- npu_quant_matmul -------------------------------------------------------------------

struct QmmArgs {
  bool int4 = false;
  bool x2_transposed = false;  // int4: x2 given as the (k/8, n) transpose of an (n, k/8) tensor
  at::ScalarType out = at::kChar;
  std::vector<int64_t> shape;  // the result's
};

QmmArgs checkQuantMatmul(const Tensor& x1, const Tensor& x2, const Tensor& scale, const Tensor& offset,
                         const Tensor& pertoken, const Tensor& bias, std::optional<int64_t> output_dtype,
                         bool extra_dtypes, at::OptionalIntArrayRef group_sizes, const Tensor& y_scale) {
  constexpr const char* op = "npu_quant_matmul";
  const auto dev = x1.device();
  QmmArgs a;
  NPU_OP_CHECK(!extra_dtypes && !y_scale.defined(), op, dev, "x1_dtype, x2_dtype, pertoken_scale_dtype, scale_dtype and "
               "y_scale are for float8/float4/hifloat8 data, which this npu lacks; leave them None");
  if (group_sizes.has_value()) {
    for (int64_t g : *group_sizes)
      NPU_OP_CHECK(g == 0, op, dev, "group_sizes (block-wise quantization) is not supported on this npu; pass None");
  }
  const auto t1 = x1.scalar_type(), t2 = x2.scalar_type();
  NPU_OP_CHECK((t1 == at::kChar && t2 == at::kChar) || (t1 == at::kInt && t2 == at::kInt), op, dev,
               "x1 and x2 must both be int8, or both int32 (int4 packed eight to an int32), got ", dtypeName(t1), " and ",
               dtypeName(t2), "; quantize with npu_dynamic_quant or pack with npu_convert_weight_to_int4pack");
  a.int4 = t1 == at::kInt;
  NPU_OP_CHECK(x1.dim() >= 2 && x1.dim() <= 6 && x2.dim() >= 2 && x2.dim() <= 6, op, dev,
               "x1 and x2 must have 2 to 6 dimensions, got ", x1.sizes(), " and ", x2.sizes());
  if (output_dtype.has_value()) a.out = dtypeFromInt(op, dev, *output_dtype, "output_dtype");
  NPU_OP_CHECK(a.out == at::kChar || a.out == at::kHalf || a.out == at::kBFloat16 || a.out == at::kInt, op, dev,
               "output_dtype must be torch.int8 (the default), float16, bfloat16 or int32, got ", dtypeName(a.out));
  int64_t k = x1.size(-1), n = x2.size(-1);
  if (a.int4) {
    NPU_OP_CHECK(x1.dim() == 2 && x2.dim() == 2, op, dev, "int4 matmul takes 2-d x1 and x2");
    k = x1.size(1) * 8;
    a.x2_transposed = x2.size(0) == x1.size(1);
    n = a.x2_transposed ? x2.size(1) : x2.size(1) * 8;
    NPU_OP_CHECK(a.x2_transposed || x2.size(0) == k, op, dev, "int4 x2 must be (k, n/8) = (", k, ", n/8) or the "
                 "transpose of an (n, k/8) tensor, got ", x2.sizes());
    NPU_OP_CHECK(x1.is_contiguous(), op, dev, "int4 x1 must be contiguous");
    NPU_OP_CHECK(a.out == at::kHalf || a.out == at::kBFloat16, op, dev, "int4 matmul gives float16 or bfloat16 results");
  } else {
    NPU_OP_CHECK(x2.size(-2) == k, op, dev, "x1's last dimension (", k, ") must match x2's second to last (",
                 x2.size(-2), ")");
  }
  NPU_OP_CHECK(k <= 65535 && x2.size(-1) <= 65535, op, dev, "the last dimensions of x1 and x2 must not pass 65535");
  // batch dimensions broadcast
  const int64_t batch_dims = std::max(x1.dim(), x2.dim()) - 2;
  for (int64_t i = 0; i < batch_dims; ++i) {
    const int64_t d1 = i - (batch_dims - (x1.dim() - 2)), d2 = i - (batch_dims - (x2.dim() - 2));
    const int64_t s1 = d1 >= 0 ? x1.size(d1) : 1, s2 = d2 >= 0 ? x2.size(d2) : 1;
    NPU_OP_CHECK(s1 == s2 || s1 == 1 || s2 == 1, op, dev, "the batch dimensions of x1 ", x1.sizes(), " and x2 ",
                 x2.sizes(), " do not broadcast");
    a.shape.push_back(std::max(s1, s2));
  }
  const int64_t batch = std::accumulate(a.shape.begin(), a.shape.end(), int64_t(1), std::multiplies<>());
  a.shape.push_back(x1.size(-2));
  a.shape.push_back(n);
  const auto st = scale.scalar_type();
  NPU_OP_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kLong, op, dev,
               "scale must be float32, bfloat16 or int64 (npu_trans_quant_param's form), got ", dtypeName(st));
  NPU_OP_CHECK(scale.dim() == 1 && (scale.size(0) == 1 || scale.size(0) == n), op, dev, "scale must be [1] or [n] = [",
               n, "], got ", scale.sizes());
  if (offset.defined()) {
    NPU_OP_CHECK(a.out == at::kChar, op, dev, "offset is only for int8 results (output_dtype None or torch.int8)");
    NPU_OP_CHECK(offset.scalar_type() == at::kFloat && offset.dim() == 1 && (offset.size(0) == 1 || offset.size(0) == n),
                 op, dev, "offset must be float32 [1] or [n], got ", dtypeName(offset.scalar_type()), " ", offset.sizes());
  }
  if (pertoken.defined()) {
    NPU_OP_CHECK(a.out == at::kHalf || a.out == at::kBFloat16, op, dev,
                 "pertoken_scale needs a float16 or bfloat16 output_dtype");
    NPU_OP_CHECK(a.out == at::kBFloat16 || st == at::kFloat, op, dev, "pertoken_scale with float16 results needs a float32 scale");
    NPU_OP_CHECK(pertoken.scalar_type() == at::kFloat && pertoken.dim() == 1 && pertoken.size(0) == x1.size(-2), op, dev,
                 "pertoken_scale must be float32 [m] = [", x1.size(-2), "], got ", dtypeName(pertoken.scalar_type()), " ",
                 pertoken.sizes());
  } else {
    NPU_OP_CHECK(!(a.out == at::kHalf && st == at::kBFloat16), op, dev, "float16 results need a float32 or int64 scale");
  }
  if (bias.defined()) {
    const auto bt = bias.scalar_type();
    NPU_OP_CHECK(bt == at::kInt || ((a.out == at::kBFloat16 || a.out == at::kHalf) && isFloat16Or32(bt)), op, dev,
                 "bias must be int32 (or bfloat16/float16/float32 for float results), got ", dtypeName(bt));
    NPU_OP_CHECK((bias.dim() == 1 && bias.size(0) == n) ||
                     (bias.dim() == 3 && a.shape.size() == 3 && bias.size(0) == batch && bias.size(1) == 1 &&
                      bias.size(2) == n),
                 op, dev, "bias must be [n] = [", n, "] (or [batch, 1, n] for 3-d results), got ", bias.sizes());
  }
  return a;
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
                                     x1_dtype || x2_dtype || pertoken_scale_dtype || scale_dtype, group_sizes,
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

Tensor quantMatmulMeta(const Tensor& x1, const Tensor& x2, const Tensor& scale, const OptTensor& offset,
                       const OptTensor& pertoken, const OptTensor& bias, std::optional<int64_t> output_dtype,
                       std::optional<int64_t> x1_dtype, std::optional<int64_t> x2_dtype,
                       std::optional<int64_t> pertoken_scale_dtype, std::optional<int64_t> scale_dtype,
                       at::OptionalIntArrayRef group_sizes, const OptTensor& y_scale) {
  const QmmArgs a = checkQuantMatmul(x1, x2, scale, valueOr(offset), valueOr(pertoken), valueOr(bias), output_dtype,
                                     x1_dtype || x2_dtype || pertoken_scale_dtype || scale_dtype, group_sizes,
                                     valueOr(y_scale));
  return at::empty(a.shape, x1.options().dtype(a.out));
}

// ---- npu_trans_quant_param ----------------------------------------------------------------

std::vector<int64_t> checkTransQuantParam(const Tensor& scale, const Tensor& offset, std::optional<int64_t> mode) {
  const int64_t round_mode = mode.value_or(0);
  constexpr const char* op = "npu_trans_quant_param";
  const auto dev = scale.device();
  NPU_OP_CHECK(scale.scalar_type() == at::kFloat && (scale.dim() == 1 || scale.dim() == 2) && scale.numel() > 0, op, dev,
               "scale must be a non-empty 1-d or 2-d float32 tensor, got ", dtypeName(scale.scalar_type()), " ",
               scale.sizes());
  NPU_OP_CHECK(round_mode == 0, op, dev, "round_mode ", round_mode, " (R_INT rounding to FP19) is not supported on this "
               "npu; use 0 (the scale's bits cut to FP19)");
  std::vector<int64_t> shape(scale.sizes().begin(), scale.sizes().end());
  if (offset.defined()) {
    NPU_OP_CHECK(offset.scalar_type() == at::kFloat && offset.dim() == scale.dim() && offset.numel() > 0, op, dev,
                 "offset must be float32 with scale's number of dimensions, got ", dtypeName(offset.scalar_type()), " ",
                 offset.sizes());
    const int64_t n = std::max(scale.size(-1), offset.size(-1));
    NPU_OP_CHECK((scale.size(-1) == n || scale.size(-1) == 1) && (offset.size(-1) == n || offset.size(-1) == 1) &&
                     (scale.dim() == 1 || (scale.size(0) == 1 && offset.size(0) == 1)),
                 op, dev, "scale and offset must be (1,) or (n,), or (1, n), got ", scale.sizes(), " and ",
                 offset.sizes());
    if (scale.dim() == 1) shape = {n};
  }
  return shape;
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

Tensor transQuantParamMeta(const Tensor& scale, const OptTensor& offset, std::optional<int64_t> round_mode) {
  return at::empty(checkTransQuantParam(scale, valueOr(offset), round_mode), scale.options().dtype(at::kLong));
}

// ---- npu_convert_weight_to_int4pack -----------------------------------------------------

void checkInt4Pack(const Tensor& weight, int64_t inner_k_tiles) {
  constexpr const char* op = "npu_convert_weight_to_int4pack";
  const auto dev = weight.device();
  NPU_OP_CHECK(weight.scalar_type() == at::kInt, op, dev, "weight must be int32 holding int4 values in [-8, 7], got ",
               dtypeName(weight.scalar_type()), "; convert with .int()");
  NPU_OP_CHECK(weight.dim() == 2 || weight.dim() == 3, op, dev, "weight must be 2-d (k, n) or 3-d, got ", weight.sizes());
  NPU_OP_CHECK(weight.is_contiguous(), op, dev, "weight must be contiguous; call .contiguous() first");
  NPU_OP_CHECK(weight.size(-1) % 8 == 0, op, dev, "the last dimension (", weight.size(-1), ") must be a multiple of 8");
  NPU_OP_CHECK(inner_k_tiles == 0, op, dev, "inner_k_tiles is reserved on Ascend; leave it 0");
}

Tensor emptyInt4Pack(const Tensor& weight) { return at::empty(withLast(weight.sizes(), weight.size(-1) / 8), weight.options()); }

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

Tensor convertWeightToInt4PackMeta(const Tensor& weight, int64_t inner_k_tiles) {
  checkInt4Pack(weight, inner_k_tiles);
  return emptyInt4Pack(weight);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_moe_gating_top_k_softmax(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)");
  // its gradient (Ascend registers none; training code that routes with it needs one)
  m.def("_npu_moe_gating_top_k_softmax_backward(Tensor grad_y, Tensor x, int k) -> Tensor");
  m.def("npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, "
        "int active_num=-1, int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, "
        "int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int quant_mode=0, "
        "int[2] active_expert_range=[], int row_idx_type=0) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, "
        "Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, "
        "Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? activation_input=None, "
        "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, "
        "int? group_type=None, int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, "
        "int? output_dtype=None, int? x_dtype=None, int? weight_dtype=None, int? scale_dtype=None, "
        "int? per_token_scale_dtype=None) -> Tensor[]");
  m.def("npu_grouped_matmul.List(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, "
        "Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, "
        "Tensor[]? per_token_scale=None, int[]? group_list=None, Tensor[]? activation_input=None, "
        "Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, "
        "int? group_type=None, int? group_list_type=0, int? act_type=0, ScalarType? output_dtype=None) -> Tensor[]");
  m.def("npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, "
        "bool padded_mode=False, int[]? restore_shape=None) -> Tensor");
  m.def("npu_moe_token_unpermute_grad(Tensor permuted_tokens, Tensor grad_unpermuted_tokens, Tensor sorted_indices, "
        "Tensor? probs=None, bool padded_mode=False, int[]? restore_shape=None) -> (Tensor, Tensor)");
  m.def("npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
        "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)");
  m.def("npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None, "
        "Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, int? x2_dtype=None, "
        "int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, Tensor? y_scale=None) "
        "-> Tensor");
  m.def("npu_convert_weight_to_int4pack(Tensor weight, int inner_k_tiles=0) -> Tensor");
  m.def("npu_trans_quant_param(Tensor scale, Tensor? offset=None, int? round_mode=0) -> Tensor");
}

void registerMoeQuantKernels(torch::Library& m) {
  m.impl("npu_moe_gating_top_k_softmax", TORCH_FN(gatingTopKSoftmax));
  m.impl("_npu_moe_gating_top_k_softmax_backward", TORCH_FN(gatingTopKSoftmaxBackward));
  m.impl("npu_moe_init_routing_v2", TORCH_FN(initRoutingV2));
  m.impl("npu_grouped_matmul", TORCH_FN(groupedMatmulEntry<false>));
  m.impl("npu_grouped_matmul.List", TORCH_FN(groupedMatmulListEntry<false>));
  m.impl("npu_moe_token_unpermute", TORCH_FN(tokenUnpermute));
  m.impl("npu_moe_token_unpermute_grad", TORCH_FN(tokenUnpermuteGrad));
  m.impl("npu_dynamic_quant", TORCH_FN(dynamicQuant));
  m.impl("npu_quant_matmul", TORCH_FN(quantMatmul));
  m.impl("npu_convert_weight_to_int4pack", TORCH_FN(convertWeightToInt4Pack));
  m.impl("npu_trans_quant_param", TORCH_FN(transQuantParam));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerMoeQuantKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_moe_gating_top_k_softmax", TORCH_FN(gatingTopKSoftmaxMeta));
  m.impl("_npu_moe_gating_top_k_softmax_backward", TORCH_FN(gatingTopKSoftmaxBackwardMeta));
  m.impl("npu_moe_init_routing_v2", TORCH_FN(initRoutingV2Meta));
  m.impl("npu_grouped_matmul", TORCH_FN(groupedMatmulEntry<true>));
  m.impl("npu_grouped_matmul.List", TORCH_FN(groupedMatmulListEntry<true>));
  m.impl("npu_moe_token_unpermute", TORCH_FN(tokenUnpermuteMeta));
  m.impl("npu_moe_token_unpermute_grad", TORCH_FN(tokenUnpermuteGradMeta));
  m.impl("npu_dynamic_quant", TORCH_FN(dynamicQuantMeta));
  m.impl("npu_quant_matmul", TORCH_FN(quantMatmulMeta));
  m.impl("npu_convert_weight_to_int4pack", TORCH_FN(convertWeightToInt4PackMeta));
  m.impl("npu_trans_quant_param", TORCH_FN(transQuantParamMeta));
}

}  // namespace npu::ops
