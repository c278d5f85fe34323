// The host kernels of the LLM-serving ops of inference.h. Like the other fused
// ops, they run on host views of npu memory in stream order (HostExecution) or
// directly on cpu tensors; they compute in float32 and round where the chip
// rounds (after each matmul and norm, to the inputs' dtype). Their checks, meta
// kernels and registration: ops/fused/inference.cpp.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "../../../core/profile.h"
#include "../../fused/common.h"
#include "../../fused/inference.h"
#include "on_host.h"
#include "quant_param.h"

namespace npu::ops::inference {
namespace {

// onHost (on_host.h) with the kernel's work estimated from its tensors, as the profile's estimate reads them.
template <class Compute>
auto onHostProjected(const char* op, const std::vector<Tensor>& tensors, Compute compute) {
  return onHost(op, tensors, compute, [&] {
    const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow((std::string("npu::") + op).c_str(), "");
    torch::jit::Stack stack;
    for (const Tensor& t : tensors)
      if (t.defined()) stack.emplace_back(t);
    return profile::workOf(handle, stack);
  });
}

// Eight int4 values per int32 (value j in bits 4j..4j+3, npu_convert_weight_to_int4pack's layout) as float32,
// the last dim eightfold.
Tensor unpackInt4(const Tensor& packed) {
  const Tensor p = packed.contiguous();
  std::vector<int64_t> shape = p.sizes().vec();
  shape.back() *= 8;
  Tensor out = at::empty(shape, p.options().dtype(at::kFloat));
  const int32_t* src = p.const_data_ptr<int32_t>();
  float* dst = out.mutable_data_ptr<float>();
  at::parallel_for(0, p.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto word = static_cast<uint32_t>(src[i]);
      for (int j = 0; j < 8; ++j) {
        const int v = static_cast<int>((word >> (4 * j)) & 0xF);
        dst[i * 8 + j] = static_cast<float>(v >= 8 ? v - 16 : v);
      }
    }
  });
  return out;
}

// float32 RMSNorm of the last dim times gamma.
Tensor rmsNorm(const Tensor& x, const Tensor& gamma, double eps) {
  return x * (x.pow(2).mean(-1, true) + eps).rsqrt() * gamma.to(at::kFloat);
}

// DeepSeek MLA's RoPE: the interleaved pairs (x0, x1, x2, x3, ...) regrouped as (x0, x2, ... | x1, x3, ...),
// then x * cos + rotate_half(x) * sin.
Tensor mlaRope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t d = x.size(-1);
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() = d / 2;
  pairs.push_back(2);
  const Tensor k = x.reshape(pairs).transpose(-1, -2).reshape(x.sizes());
  const Tensor rotated = at::cat({k.narrow(-1, d / 2, d / 2).neg(), k.narrow(-1, 0, d / 2)}, -1);
  return k * cos.to(at::kFloat) + rotated * sin.to(at::kFloat);
}

Tensor rounded(const Tensor& t, at::ScalarType dtype) { return t.to(dtype).to(at::kFloat); }

std::vector<int64_t> int64Values(const Tensor& t) {
  const Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
}

// ---- MX: the OCP microscaling formats ----------------------------------------------------------------

// float4 e2m1's magnitudes, by code (sign in bit 3).
constexpr float kFp4[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t fp4Code(float q, MxRound round) {
  const bool neg = std::signbit(q);
  const float a = std::min(std::fabs(q), 6.0f);
  int lo = 0;
  while (lo < 7 && kFp4[lo + 1] <= a) ++lo;
  const int hi = kFp4[lo] == a ? lo : std::min(lo + 1, 7);
  int code = lo;
  if (hi != lo) {
    switch (round) {
      case MxRound::Rint: {
        const float dl = a - kFp4[lo], dh = kFp4[hi] - a;
        code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);  // ties to the even mantissa
        break;
      }
      case MxRound::Round: code = (a - kFp4[lo]) < (kFp4[hi] - a) ? lo : hi; break;  // ties away from zero
      case MxRound::Floor: code = neg ? hi : lo; break;                            // toward -infinity
    }
  }
  return static_cast<uint8_t>((neg ? 8 : 0) | code);
}

}  // namespace

// ---- npu_weight_quant_batchmatmul ------------------------------------------------------------------

Tensor weightQuantBatchmatmul(const Tensor& x, const Tensor& weight, const Tensor& antiquant_scale,
                              const OptTensor& antiquant_offset, const OptTensor& quant_scale,
                              const OptTensor& quant_offset, const OptTensor& bias, int64_t antiquant_group_size,
                              int64_t inner_precise, std::optional<int64_t> weight_dtype) {
  constexpr const char* op = "npu_weight_quant_batchmatmul";
  const WqbmmArgs a = checkWeightQuantBatchmatmul(x, weight, antiquant_scale, valueOr(antiquant_offset),
                                                  valueOr(quant_scale), valueOr(quant_offset), valueOr(bias),
                                                  antiquant_group_size, inner_precise, weight_dtype);
  const std::vector<Tensor> tensors = {x, weight, antiquant_scale, valueOr(antiquant_offset), valueOr(quant_scale),
                                       valueOr(quant_offset), valueOr(bias)};
  return onHostProjected(op, tensors, [&](auto input, auto output) {
    const auto dt = x.scalar_type();
    Tensor w;
    if (!a.int4) {
      w = input(weight).to(at::kFloat);
    } else if (!a.int4_transposed) {
      w = unpackInt4(input(weight));
    } else {
      w = unpackInt4(input(weight.t())).t();
    }
    // a scale or offset as a (k, n)-broadcastable float tensor
    auto expand = [&](const Tensor& t) {
      Tensor f = packedScales(input(t));
      if (a.group > 0) return f.repeat_interleave(a.group, 0).narrow(0, 0, a.k);
      return f.numel() == 1 ? f.reshape({1, 1}) : f.reshape({1, a.n});
    };
    // an int64 antiquant_scale's offset field has no meaning for the weight: refused, not dropped
    NPU_OP_CHECK(!packedOffsets(input(antiquant_scale)).defined(), op, x.device(),
                 "antiquant_scale carries an offset in its int64 packing (bits 37..45), which applies to int8 "
                 "results only; pack it with npu_trans_quant_param(scale) and pass the offset as "
                 "antiquant_offset (int32)");
    if (antiquant_offset.has_value()) w = w + expand(*antiquant_offset).to(at::kFloat);
    w = w * expand(antiquant_scale);
    if (!a.int64_scale) w = rounded(w, dt);  // the chip dequantizes the weight in x's dtype
    Tensor y = at::mm(input(x).to(at::kFloat), w);
    if (bias.has_value()) y = y + input(*bias).to(at::kFloat).reshape({1, a.n});
    if (!quant_scale.has_value()) return output(y.to(dt));
    // requantized: round(y * quant_scale + quant_offset), saturated to int8
    const Tensor qs = packedScales(input(*quant_scale)).reshape({1, -1});
    y = rounded(y, dt) * qs;
    // the offset: quant_offset, else the one an int64 quant_scale packs (npu_trans_quant_param(scale, offset))
    const Tensor qo =
        quant_offset.has_value() ? input(*quant_offset).to(at::kFloat) : packedOffsets(input(*quant_scale));
    if (qo.defined()) y = y + qo.reshape({1, -1});
    return output(y.round().clamp(-128, 127).to(at::kChar));
  });
}

// ---- npu_dynamic_mx_quant -----------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> dynamicMxQuant(const Tensor& input_t, int64_t axis, c10::string_view round_mode,
                                          int64_t dst_type, int64_t block_size, std::optional<int64_t> scale_alg,
                                          double dst_type_max, double max_low_bound) {
  constexpr const char* op = "npu_dynamic_mx_quant";
  const MxArgs a = checkDynamicMxQuant(input_t, axis, round_mode, dst_type, block_size, scale_alg, dst_type_max,
                                       max_low_bound);
  return onHostProjected(op, {input_t}, [&](auto input, auto output) {
    const bool fp4 = a.dst == at::ScalarType::Float4_e2m1fn_x2;
    // rows along the axis: (outer..., k)
    const Tensor xf = input(input_t).to(at::kFloat).movedim(a.axis, -1).contiguous();
    const int64_t k = xf.size(-1), rows = k == 0 ? 0 : xf.numel() / k;
    const int64_t blocks = (k + a.block - 1) / a.block, pairs = (blocks + 1) / 2;
    Tensor scale = at::zeros({rows, pairs * 2}, xf.options().dtype(at::kByte));
    Tensor q = at::empty(xf.sizes(), xf.options().dtype(fp4 ? at::kByte : at::kFloat));
    const float* xp = xf.const_data_ptr<float>();
    uint8_t* sp = scale.mutable_data_ptr<uint8_t>();
    const float maxv = static_cast<float>(a.max_normal);
    uint8_t* codes_out = fp4 ? q.mutable_data_ptr<uint8_t>() : nullptr;
    float* values_out = fp4 ? nullptr : q.mutable_data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(k, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t lo = b * a.block, hi = std::min(k, lo + a.block);
          float amax = 0.0f;
          for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(xp[r * k + i]));
          // shared exponent floor(log2(amax)) - emax, in e8m0's range [-127, 127]; zero blocks: -127
          int shared = -127;
          if (amax > 0.0f && std::isfinite(amax)) {
            int e = 0;
            std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1)
            shared = std::clamp<int>(e - 1 - static_cast<int>(a.emax), -127, 127);
          }
          sp[r * pairs * 2 + b] = static_cast<uint8_t>(shared + 127);
          for (int64_t i = lo; i < hi; ++i) {
            const float v = std::ldexp(xp[r * k + i], -shared);
            if (fp4) {
              codes_out[r * k + i] = fp4Code(v, a.round);
            } else {
              values_out[r * k + i] = std::clamp(v, -maxv, maxv);
            }
          }
        }
      }
    });
    // back to the input's layout
    std::vector<int64_t> outer = xf.sizes().slice(0, xf.dim() - 1).vec();
    std::vector<int64_t> scale_shape = outer;
    scale_shape.push_back(pairs);
    scale_shape.push_back(2);
    const Tensor s = scale.reshape(scale_shape).movedim(-2, a.axis).contiguous().view(at::ScalarType::Float8_e8m0fnu);
    Tensor y;
    if (!fp4) {
      y = q.movedim(-1, a.axis).to(a.dst).contiguous();  // round to nearest even, in range
    } else {
      const Tensor codes = q.movedim(-1, a.axis).contiguous();  // pairs along the last dim: the first low
      Tensor packed = at::empty(a.y_shape, codes.options());
      const uint8_t* cp = codes.const_data_ptr<uint8_t>();
      uint8_t* pp = packed.mutable_data_ptr<uint8_t>();
      for (int64_t i = 0; i < codes.numel() / 2; ++i) pp[i] = static_cast<uint8_t>(cp[2 * i] | (cp[2 * i + 1] << 4));
      y = packed.view(at::ScalarType::Float4_e2m1fn_x2);
    }
    return std::make_tuple(output(y), output(s));
  });
}

// ---- npu_kv_rmsnorm_rope_cache --------------------------------------------------------------------------------

namespace {

// Writes `rows` (batch, heads, seq, d) to `cache` at the slots of `index` (-1: skipped).
void writeKvCache(const char* op, c10::Device dev, const Tensor& cache, const Tensor& rows, const Tensor& index,
                  KvCacheMode mode) {
  const int64_t B = rows.size(0), N = rows.size(1), S = rows.size(2), d = rows.size(3);
  const std::vector<int64_t> slots = int64Values(index);
  const Tensor src = rows.to(cache.scalar_type());
  const int64_t block = mode == KvCacheMode::PA ? cache.size(1) : cache.size(2);
  const int64_t capacity = mode == KvCacheMode::Norm ? cache.size(2) : cache.size(0) * block;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t slot = slots[b * S + s];
      if (slot == -1) continue;
      NPU_OP_CHECK(slot >= 0 && slot < capacity, op, dev, "index[", b * S + s, "] = ", slot, " is outside the cache (",
                   capacity, mode == KvCacheMode::Norm ? " positions)" : " slots)", "; -1 skips a token");
      const Tensor row = src.select(0, b).select(1, s);  // (N, d)
      switch (mode) {
        case KvCacheMode::Norm: cache.select(0, b).select(1, slot).copy_(row); break;
        case KvCacheMode::PA: cache.select(0, slot / block).select(0, slot % block).copy_(row); break;
        case KvCacheMode::PA_BNSD: cache.select(0, slot / block).select(1, slot % block).copy_(row); break;
        case KvCacheMode::PA_NZ:
          cache.select(0, slot / block).select(1, slot % block).copy_(row.reshape({N * d / cache.size(3), cache.size(3)}));
          break;
      }
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> kvRmsnormRopeCacheInplace(const Tensor& kv, const Tensor& gamma, const Tensor& cos,
                                                     const Tensor& sin, const Tensor& index, const Tensor& k_cache,
                                                     const Tensor& ckv_cache, const OptTensor& k_rope_scale,
                                                     const OptTensor& c_kv_scale, const OptTensor& k_rope_offset,
                                                     const OptTensor& c_kv_offset, const OptTensor& v,
                                                     double epsilon, c10::string_view cache_mode, bool is_output_kv) {
  constexpr const char* op = "npu_kv_rmsnorm_rope_cache";
  const KvRopeArgs a = checkKvRmsnormRopeCache(kv, gamma, cos, sin, index, k_cache, ckv_cache, valueOr(k_rope_scale),
                                               valueOr(c_kv_scale), valueOr(k_rope_offset), valueOr(c_kv_offset),
                                               valueOr(v), cache_mode);
  (void)is_output_kv;  // k_rope and c_kv are always given (Ascend allocates them either way)
  return onHost(op, {kv, gamma, cos, sin, index, k_cache, ckv_cache}, [&](auto input, auto inout, auto output) {
    const auto dt = kv.scalar_type();
    const Tensor x = input(kv).to(at::kFloat);
    const Tensor c_kv = rmsNorm(x.narrow(-1, 0, a.Dv), input(gamma), epsilon).to(dt);
    const Tensor k_rope = mlaRope(x.narrow(-1, a.Dv, a.Dk), input(cos), input(sin)).to(dt);
    const Tensor idx = input(index);
    writeKvCache(op, kv.device(), inout(k_cache), k_rope, idx, a.mode);
    writeKvCache(op, kv.device(), inout(ckv_cache), c_kv, idx, a.mode);
    return std::make_tuple(output(k_rope.contiguous()), output(c_kv.contiguous()));
  });
}

// ---- npu_scatter_nd_update(_) -------------------------------------------------------------------------------

namespace {

void scatterNd(const char* op, const Tensor& dst, const Tensor& indices, const Tensor& updates, int64_t depth) {
  const std::vector<int64_t> idx = int64Values(indices);
  const int64_t count = static_cast<int64_t>(idx.size()) / depth;
  std::vector<int64_t> rows_shape = {count};
  rows_shape.insert(rows_shape.end(), dst.sizes().begin() + depth, dst.sizes().end());
  const Tensor rows = updates.reshape(rows_shape);
  for (int64_t i = 0; i < count; ++i) {
    Tensor target = dst;
    for (int64_t j = 0; j < depth; ++j) {
      const int64_t v = idx[i * depth + j], size = dst.size(j);
      NPU_OP_CHECK(v >= 0 && v < size, op, dst.device(), "indices[", i, "][", j, "] = ", v,
                   " is outside self's dim ", j, " (size ", size, "); out-of-range indices are not supported");
      target = target.select(0, v);
    }
    target.copy_(rows.select(0, i));
  }
}

}  // namespace

Tensor scatterNdUpdate(const Tensor& self, const Tensor& indices, const Tensor& updates) {
  constexpr const char* op = "npu_scatter_nd_update";
  const int64_t depth = checkScatterNdUpdate(op, self, indices, updates);
  return onHost(op, {self, indices, updates}, [&](auto input, auto output) {
    Tensor out = input(self).clone();
    scatterNd(op, out, input(indices), input(updates), depth);
    return output(out);
  });
}

void scatterNdUpdateInplace(const Tensor& self, const Tensor& indices, const Tensor& updates) {
  constexpr const char* op = "npu_scatter_nd_update_";
  const int64_t depth = checkScatterNdUpdate(op, self, indices, updates);
  onHost(op, {self, indices, updates}, [&](auto input, auto inout, auto) {
    scatterNd(op, inout(self), input(indices), input(updates), depth);
    return 0;
  });
}

// ---- atb::_npu_paged_attention -----------------------------------------------------------------------------

void pagedAttention(const Tensor& query, const Tensor& key_cache, const Tensor& value_cache, int64_t num_kv_heads,
                    int64_t num_heads, double scale_value, const Tensor& block_table, const Tensor& context_lens,
                    const Tensor& out, const OptTensor& workspace) {
  constexpr const char* op = "_npu_paged_attention";
  const int64_t group = checkPagedAttention(op, query, key_cache, value_cache, num_kv_heads, num_heads, block_table,
                                            context_lens, out);
  (void)workspace;  // the host kernel needs none
  // context_lens is a host input on Ascend (a cpu tensor): read now; an npu one is read in stream order
  const bool host_lens = context_lens.device() != query.device();
  std::vector<int64_t> lens = host_lens ? int64Values(context_lens) : std::vector<int64_t>();
  const Tensor device_lens = host_lens ? Tensor() : context_lens;
  onHost(op, {query, key_cache, value_cache, block_table, device_lens, out}, [&](auto input, auto inout, auto) {
    if (!host_lens) lens = int64Values(input(device_lens));
    const Tensor q = input(query).to(at::kFloat);
    const Tensor kc = input(key_cache), vc = input(value_cache);
    const Tensor table = input(block_table).to(at::kLong).contiguous();  // read by raw pointer below
    const Tensor o = inout(out);
    const int64_t T = q.size(0), D = q.size(2), Dv = vc.size(3), bs = kc.size(1), blocks = kc.size(0);
    const int64_t* tp = table.const_data_ptr<int64_t>();
    const int64_t max_blocks = table.size(1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = lens[t];
      NPU_OP_CHECK(len >= 0 && len <= max_blocks * bs, op, query.device(), "context_lens[", t, "] = ", len,
                   " must be in [0, max_blocks * block_size = ", max_blocks * bs, "]");
      if (len == 0) {
        o.select(0, t).zero_();
        continue;
      }
      const int64_t nblk = (len + bs - 1) / bs;
      for (int64_t j = 0; j < nblk; ++j)
        NPU_OP_CHECK(tp[t * max_blocks + j] >= 0 && tp[t * max_blocks + j] < blocks, op, query.device(),
                     "block_table[", t, "][", j, "] = ", tp[t * max_blocks + j], " is not a block of the cache (",
                     blocks, " blocks)");
      const Tensor ids = table.select(0, t).narrow(0, 0, nblk);
      // (kv_heads, len, d)
      const Tensor k = kc.index_select(0, ids).reshape({nblk * bs, num_kv_heads, D}).narrow(0, 0, len).to(at::kFloat)
                           .permute({1, 0, 2});
      const Tensor v = vc.index_select(0, ids).reshape({nblk * bs, num_kv_heads, Dv}).narrow(0, 0, len)
                           .to(at::kFloat).permute({1, 0, 2});
      const Tensor qt = q.select(0, t).reshape({num_kv_heads, group, D});
      const Tensor p = at::softmax(at::bmm(qt, k.transpose(1, 2)) * scale_value, -1);
      o.select(0, t).copy_(at::bmm(p, v).reshape({num_heads, Dv}));
    }
    return 0;
  });
}

// ---- npu_attention_update --------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> attentionUpdate(at::TensorList lse, at::TensorList local_out, int64_t update_type) {
  constexpr const char* op = "npu_attention_update";
  checkAttentionUpdate(lse, local_out, update_type);
  std::vector<Tensor> tensors(lse.begin(), lse.end());
  tensors.insert(tensors.end(), local_out.begin(), local_out.end());
  return onHostProjected(op, tensors, [&](auto input, auto output) {
    std::vector<Tensor> l, o;
    for (const Tensor& t : lse) l.push_back(input(t));
    for (const Tensor& t : local_out) o.push_back(input(t).to(at::kFloat));
    const Tensor L = at::stack(l);  // (sp, rows)
    const Tensor O = at::stack(o);  // (sp, rows, d)
    Tensor mx = std::get<0>(L.max(0));
    mx = at::where(mx.isinf(), at::zeros_like(mx), mx);
    const Tensor lse_m = mx + (L - mx).exp().sum(0).log();
    Tensor w = (L - lse_m).exp();
    w = at::where(w.isnan(), at::zeros_like(w), w);
    const Tensor merged = (O * w.unsqueeze(-1)).sum(0).to(local_out[0].scalar_type());
    const Tensor lse_out = update_type == 1 ? lse_m : at::empty({0}, L.options());
    return std::make_tuple(output(merged), output(lse_out));
  });
}

// ---- npu_moe_finalize_routing ------------------------------------------------------------------------------

Tensor moeFinalizeRouting(const Tensor& expanded, const OptTensor& skip1, const OptTensor& skip2,
                          const OptTensor& bias, const OptTensor& scales, const Tensor& src_to_dst,
                          const OptTensor& export_for_source_row, std::optional<int64_t> drop_pad_mode,
                          std::optional<int64_t> k) {
  constexpr const char* op = "npu_moe_finalize_routing";
  const auto [rows, topk] = checkMoeFinalizeRouting(expanded, valueOr(skip1), valueOr(skip2), valueOr(bias),
                                                    valueOr(scales), src_to_dst, valueOr(export_for_source_row),
                                                    drop_pad_mode, k);
  const std::vector<Tensor> tensors = {expanded, valueOr(skip1), valueOr(skip2), valueOr(bias), valueOr(scales),
                                       src_to_dst, valueOr(export_for_source_row)};
  return onHostProjected(op, tensors, [&](auto input, auto output) {
    const Tensor E = input(expanded).to(at::kFloat);
    const int64_t H = E.size(1);
    const Tensor dst = input(src_to_dst).to(at::kLong).contiguous();  // pair (i, j) at j * rows + i
    const int64_t* dp = dst.const_data_ptr<int64_t>();
    for (const auto i : c10::irange(dst.numel()))
      NPU_OP_CHECK(dp[i] >= -1 && dp[i] < E.size(0), op, expanded.device(), "expanded_src_to_dst_row[", i, "] = ",
                   dp[i], " is not a row of expanded_permuted_rows (", E.size(0), " rows; -1: dropped)");
    const Tensor kept = dst.ge(0);
    Tensor g = E.index_select(0, dst.clamp_min(0)).view({topk, rows, H});
    if (bias.has_value()) {
      const Tensor experts = input(*export_for_source_row).to(at::kLong).t().reshape(-1);
      g = g + input(*bias).to(at::kFloat).index_select(0, experts).view({topk, rows, H});
    }
    Tensor w = kept.to(at::kFloat).view({topk, rows, 1});
    if (scales.has_value()) w = w * input(*scales).to(at::kFloat).t().reshape({topk, rows, 1});
    Tensor out = (g * w).sum(0);
    if (skip1.has_value()) out = out + input(*skip1).to(at::kFloat);
    if (skip2.has_value()) out = out + input(*skip2).to(at::kFloat);
    return output(out.to(expanded.scalar_type()));
  });
}

// ---- npu_mla_prolog_v3 ------------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> mlaProlog(const MlaArgs& a, const Tensor& token_x,
                                                             const Tensor& weight_dq, const Tensor& weight_uq_qr,
                                                             const Tensor& weight_uk, const Tensor& weight_dkv_kr,
                                                             const Tensor& gamma_cq, const Tensor& gamma_ckv,
                                                             const Tensor& rope_sin, const Tensor& rope_cos,
                                                             const Tensor& kv_cache, const Tensor& kr_cache,
                                                             const Tensor& cache_index, double eps_cq,
                                                             double eps_ckv) {
  const std::vector<Tensor> tensors = {token_x,  weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, gamma_cq,
                                       gamma_ckv, rope_sin, rope_cos,     kv_cache,  kr_cache,      cache_index};
  return onHost(a.op, tensors, [&](auto input, auto inout, auto output) {
    const auto dt = token_x.scalar_type();
    auto f = [&](const Tensor& t) { return input(t).to(at::kFloat); };
    const Tensor x = f(token_x).reshape({a.T, a.He});
    const Tensor cos = f(rope_cos).reshape({a.T, a.Dr}), sin = f(rope_sin).reshape({a.T, a.Dr});
    // queries: c_Q = RMSNorm(x W_DQ); (q_C | q_R) = c_Q W_UQ_QR per head; q_N = q_C W_UK per head
    const Tensor cq = rounded(rmsNorm(rounded(at::mm(x, f(weight_dq)), dt), input(gamma_cq), eps_cq), dt);
    const Tensor qcr = rounded(at::mm(cq, f(weight_uq_qr)), dt).view({a.T, a.N, a.D + a.Dr});
    const Tensor qn = at::bmm(qcr.narrow(-1, 0, a.D).transpose(0, 1), f(weight_uk)).transpose(0, 1);  // (T, N, Hckv)
    const Tensor qr = mlaRope(qcr.narrow(-1, a.D, a.Dr), cos.unsqueeze(1), sin.unsqueeze(1));
    // keys: k_C = RMSNorm(x W_DKV), k_R = RoPE(x W_KR), written to the caches
    const Tensor kvkr = rounded(at::mm(x, f(weight_dkv_kr)), dt);
    const Tensor kc = rmsNorm(kvkr.narrow(-1, 0, a.Hckv), input(gamma_ckv), eps_ckv).to(dt);
    const Tensor kr = mlaRope(kvkr.narrow(-1, a.Hckv, a.Dr), cos, sin).to(dt);
    if (cache_index.defined()) {
      const std::vector<int64_t> slots = int64Values(input(cache_index));
      const Tensor kvc = inout(kv_cache), krc = inout(kr_cache);
      const int64_t block = kvc.size(1), capacity = kvc.size(0) * block;
      for (int64_t t = 0; t < a.T; ++t) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        NPU_OP_CHECK(slot < capacity, a.op, token_x.device(), "cache_index[", t, "] = ", slot,
                     " is outside the caches (", capacity, " slots)");
        kvc.select(0, slot / block).select(0, slot % block).copy_(kc.select(0, t).unsqueeze(0).expand({kvc.size(2), a.Hckv}));
        krc.select(0, slot / block).select(0, slot % block).copy_(kr.select(0, t).unsqueeze(0).expand({krc.size(2), a.Dr}));
      }
    }
    auto shape = [&](std::initializer_list<int64_t> tail) {
      std::vector<int64_t> s = a.lead;
      s.insert(s.end(), tail);
      return s;
    };
    const auto fopt = token_x.options().dtype(at::kFloat).device(at::kCPU);
    const Tensor query_norm = a.query_norm ? cq.to(dt).reshape(shape({a.Hcq})).contiguous() : at::empty({0}, fopt.dtype(dt));
    return std::make_tuple(output(qn.to(rope_sin.scalar_type()).reshape(shape({a.N, a.Hckv})).contiguous()),
                           output(qr.to(dt).reshape(shape({a.N, a.Dr})).contiguous()), output(at::empty({0}, fopt)),
                           output(query_norm), output(at::empty({0}, fopt)));
  });
}

}  // namespace npu::ops::inference
