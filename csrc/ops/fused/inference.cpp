// The LLM-serving ops of torch_npu.ops.inference, with the Ascend adapter's
// schemas, defaults and result tuples (what vllm-ascend and MindSpeed call):
//   npu_weight_quant_batchmatmul   float x times an int8 or int4 weight (W8A16 / W4A16)
//   npu_dynamic_mx_quant           OCP microscaling: float8 / float4 blocks with
//                                  float8_e8m0 scales (Ascend 950 only on real chips)
//   npu_kv_rmsnorm_rope_cache      MLA's key prep: RMSNorm + RoPE, written to the caches
//   npu_scatter_nd_update(_)       TensorFlow's ScatterNdUpdate
//   atb::_npu_paged_attention      decode attention over a paged KV cache (the ATB op)
//   npu_attention_update           the merge of partial attention results by their lse
//   npu_moe_finalize_routing       the weighted sum of the experts' rows back to tokens
//   npu_mla_prolog_v2 / v3         MLA's query and key preprocessing (DeepSeek)
// Here: their schemas, argument checks and result shapes, meta kernels (same
// checks, shapes fixed by the arguments) that let torch.compile trace them, and the
// registration of the host kernels (ops/host/fused/inference_kernels.cpp) for npu
// and cpu tensors. Ops that update a cache in place without saying so in Ascend's
// schema (npu_kv_rmsnorm_rope_cache, npu_mla_prolog_v2) and npu_scatter_nd_update_
// are composites of a kernel whose schema marks the mutation, so functionalization
// (torch.compile, graph capture) sees it.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../core/profile.h"
#include "common.h"
#include "inference.h"

namespace npu::ops::inference {
namespace {

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
    default: return c10::toString(t);
  }
}

bool isFloating(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// A dtype argument as Ascend passes it: a torch.dtype (its ScalarType code) or one of
// torch_npu's codes (the ACL enum + 256). `name` is its Python name for messages.
struct DtypeCode {
  std::optional<at::ScalarType> type;  // none: a dtype torch has no tensor for
  std::string name;
};

DtypeCode dtypeOfCode(const char* op, c10::Device dev, int64_t code, const char* arg) {
  if (code >= 0 && code < static_cast<int64_t>(at::ScalarType::NumOptions)) {
    const auto t = static_cast<at::ScalarType>(code);
    return {t, std::string("torch.") + dtypeName(t)};
  }
  switch (code - 256) {  // aclDataType
    case 0: return {at::kFloat, "torch_npu.float32"};
    case 1: return {at::kHalf, "torch_npu.float16"};
    case 2: return {at::kChar, "torch_npu.int8"};
    case 3: return {at::kInt, "torch_npu.int32"};
    case 4: return {at::kByte, "torch_npu.uint8"};
    case 9: return {at::kLong, "torch_npu.int64"};
    case 27: return {at::kBFloat16, "torch_npu.bfloat16"};
    case 29: return {std::nullopt, "torch_npu.int4"};
    case 34: return {std::nullopt, "torch_npu.hifloat8"};
    case 35: return {at::ScalarType::Float8_e5m2, "torch_npu.float8_e5m2"};
    case 36: return {at::ScalarType::Float8_e4m3fn, "torch_npu.float8_e4m3fn"};
    case 37: return {at::ScalarType::Float8_e8m0fnu, "torch_npu.float8_e8m0fnu"};
    case 38: return {std::nullopt, "torch_npu.float6_e3m2"};
    case 39: return {std::nullopt, "torch_npu.float6_e2m3"};
    case 40: return {at::ScalarType::Float4_e2m1fn_x2, "torch_npu.float4_e2m1fn_x2"};
    case 41: return {std::nullopt, "torch_npu.float4_e1m2fn_x2"};
    default: break;
  }
  NPU_OP_CHECK(false, op, dev, arg, " must be a torch.dtype or a torch_npu dtype code (256 + the ACL enum), got the "
               "integer ", code);
  return {};
}

// Whether `t` is (n,) or (1, n).
bool isVector(const Tensor& t, int64_t n) { return (t.dim() == 1 && t.size(0) == n) || (t.dim() == 2 && t.size(0) == 1 && t.size(1) == n); }

}  // namespace

void checkMxChip(const char* op, c10::Device device) {
  if (device.is_cpu()) return;
  const auto& chip = profile::active();
  NPU_OP_CHECK(!chip.isChip() || *chip.soc_version >= 260, op, device, op, " is an Ascend 950 op (the MX formats "
               "float8_e8m0 / float4_e2m1 / float8 are 950PR/950DT only); the active profile ", chip.name, " (",
               chip.device_name, ") has no such kernel, as on the real chip. Use npu_dynamic_quant (int8) there, "
               "or run under the generic profile");
}

// ---- npu_weight_quant_batchmatmul -----------------------------------------------------------

WqbmmArgs checkWeightQuantBatchmatmul(const Tensor& x, const Tensor& weight, const Tensor& antiquant_scale,
                                      const Tensor& antiquant_offset, const Tensor& quant_scale,
                                      const Tensor& quant_offset, const Tensor& bias, int64_t antiquant_group_size,
                                      int64_t inner_precise, std::optional<int64_t> weight_dtype) {
  constexpr const char* op = "npu_weight_quant_batchmatmul";
  const auto dev = x.device();
  WqbmmArgs a;
  NPU_OP_CHECK(x.dim() == 2, op, dev, "x must be 2-d (m, k), got ", x.sizes(), "; flatten the leading dims first");
  NPU_OP_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, op, dev,
               "x must be float16 or bfloat16, got ", dtypeName(x.scalar_type()));
  NPU_OP_CHECK(weight.dim() == 2, op, dev, "weight must be 2-d (k, n), got ", weight.sizes());
  NPU_OP_CHECK(weight.scalar_type() == at::kChar || weight.scalar_type() == at::kInt, op, dev,
               "weight must be int8 (W8A16) or int32 holding eight int4 values (W4A16, from "
               "npu_convert_weight_to_int4pack), got ", dtypeName(weight.scalar_type()));
  a.int4 = weight.scalar_type() == at::kInt;
  if (weight_dtype.has_value()) {
    const DtypeCode c = dtypeOfCode(op, dev, *weight_dtype, "weight_dtype");
    const bool int4_code = c.name == "torch_npu.int4" || c.type == at::kQUInt4x2 || c.type == at::kInt;
    const bool int8_code = c.type == at::kChar;
    NPU_OP_CHECK(int4_code || int8_code, op, dev, "weight_dtype ", c.name, " (float8, hifloat8 or float4 weights) is "
                 "an Ascend 950 format this npu does not have; pass None, torch.int8 or an int4 code");
    NPU_OP_CHECK(int4_code == a.int4, op, dev, "weight_dtype ", c.name, " does not match the weight's dtype ",
                 dtypeName(weight.scalar_type()));
  }
  a.m = x.size(0);
  a.k = x.size(1);
  if (!a.int4) {
    NPU_OP_CHECK(weight.size(0) == a.k, op, dev, "weight must be (k, n) with x's k = ", a.k, ", got ", weight.sizes(),
                 "; pass weight.t() for an (n, k) weight");
    a.n = weight.size(1);
  } else if (weight.size(0) == a.k) {
    a.n = weight.size(1) * 8;
  } else {
    NPU_OP_CHECK(weight.size(0) * 8 == a.k && weight.stride(0) == 1, op, dev, "an int4 weight must be (k, n/8) = (",
                 a.k, ", n/8), or the transpose of an (n, k/8) packing, got ", weight.sizes());
    a.int4_transposed = true;
    a.n = weight.size(1);
  }
  NPU_OP_CHECK(a.m >= 1 && a.k >= 1 && a.k <= 65535 && a.n >= 1 && a.n <= 65535, op, dev,
               "m must be at least 1 and k, n in [1, 65535], got m ", a.m, ", k ", a.k, ", n ", a.n);
  NPU_OP_CHECK(inner_precise == 0 || inner_precise == 1, op, dev,
               "inner_precise must be 0 (high precision) or 1 (high performance), got ", inner_precise);
  // antiquant_scale: per tensor, per channel or per group
  NPU_OP_CHECK(antiquant_scale.defined(), op, dev, "antiquant_scale is required");
  a.int64_scale = antiquant_scale.scalar_type() == at::kLong;
  NPU_OP_CHECK(antiquant_scale.scalar_type() == x.scalar_type() || a.int64_scale, op, dev,
               "antiquant_scale must have x's dtype (", dtypeName(x.scalar_type()), ") or be int64 (from "
               "npu_trans_quant_param), got ", dtypeName(antiquant_scale.scalar_type()));
  NPU_OP_CHECK(antiquant_group_size == 0 ||
                   (antiquant_group_size % 32 == 0 && antiquant_group_size >= 32 && antiquant_group_size < a.k),
               op, dev, "antiquant_group_size must be 0 or a multiple of 32 in [32, k - 1] = [32, ", a.k - 1, "], got ",
               antiquant_group_size);
  a.group = antiquant_group_size;
  const auto& s = antiquant_scale;
  if (a.group > 0) {
    const int64_t groups = (a.k + a.group - 1) / a.group;
    NPU_OP_CHECK(s.dim() == 2 && s.size(0) == groups && s.size(1) == a.n, op, dev,
                 "with antiquant_group_size ", a.group, " antiquant_scale must be (ceil(k / group), n) = (", groups,
                 ", ", a.n, "), got ", s.sizes());
  } else {
    NPU_OP_CHECK((s.numel() == 1 && s.dim() <= 2) || isVector(s, a.n), op, dev,
                 "antiquant_scale must be per tensor (1,) / (1, 1) or per channel (n,) / (1, n) with n = ", a.n,
                 ", got ", s.sizes(), "; per group needs antiquant_group_size");
  }
  if (a.int64_scale) {
    NPU_OP_CHECK(x.scalar_type() == at::kHalf && !a.int4 && a.group == 0 && isVector(s, a.n), op, dev,
                 "an int64 antiquant_scale takes float16 x, an int8 weight and a per-channel scale (n,)");
  }
  if (antiquant_offset.defined()) {
    NPU_OP_CHECK(antiquant_offset.sizes() == s.sizes(), op, dev, "antiquant_offset must have antiquant_scale's shape ",
                 s.sizes(), ", got ", antiquant_offset.sizes());
    const auto want = a.int64_scale ? at::kInt : x.scalar_type();
    NPU_OP_CHECK(antiquant_offset.scalar_type() == want, op, dev, "antiquant_offset must be ", dtypeName(want),
                 " with this antiquant_scale, got ", dtypeName(antiquant_offset.scalar_type()));
  }
  a.out = x.scalar_type();
  if (quant_scale.defined()) {
    NPU_OP_CHECK(quant_scale.scalar_type() == at::kFloat || quant_scale.scalar_type() == at::kLong, op, dev,
                 "quant_scale must be float32 or int64 (npu_trans_quant_param), got ",
                 dtypeName(quant_scale.scalar_type()));
    NPU_OP_CHECK(quant_scale.numel() == 1 || isVector(quant_scale, a.n), op, dev,
                 "quant_scale must be (1,) or (n,) / (1, n) with n = ", a.n, ", got ", quant_scale.sizes());
    a.out = at::kChar;
  }
  if (quant_offset.defined()) {
    NPU_OP_CHECK(quant_scale.defined(), op, dev, "quant_offset needs quant_scale");
    NPU_OP_CHECK(quant_offset.scalar_type() == at::kFloat && quant_offset.sizes() == quant_scale.sizes(), op, dev,
                 "quant_offset must be float32 of quant_scale's shape ", quant_scale.sizes(), ", got ",
                 dtypeName(quant_offset.scalar_type()), " ", quant_offset.sizes());
  }
  if (bias.defined()) {
    const auto want = x.scalar_type() == at::kHalf ? at::kHalf : at::kFloat;
    NPU_OP_CHECK(bias.scalar_type() == want, op, dev, "bias must be ", dtypeName(want), " for ",
                 dtypeName(x.scalar_type()), " x, got ", dtypeName(bias.scalar_type()), "; cast it with .to(torch.",
                 dtypeName(want), ")");
    NPU_OP_CHECK(isVector(bias, a.n), op, dev, "bias must be (n,) or (1, n) with n = ", a.n, ", got ", bias.sizes());
  }
  return a;
}

// ---- npu_dynamic_mx_quant -------------------------------------------------------------------

MxArgs checkDynamicMxQuant(const Tensor& input, int64_t axis, c10::string_view round_mode, int64_t dst_type,
                           int64_t block_size, std::optional<int64_t> scale_alg, double dst_type_max,
                           double max_low_bound) {
  constexpr const char* op = "npu_dynamic_mx_quant";
  const auto dev = input.device();
  checkMxChip(op, dev);
  MxArgs a;
  NPU_OP_CHECK(isFloating(input.scalar_type()), op, dev, "input must be float16, bfloat16 or float32, got ",
               dtypeName(input.scalar_type()));
  const int64_t rank = input.dim();
  NPU_OP_CHECK(rank >= 1 && rank <= 7, op, dev, "input must have 1 to 7 dimensions, got ", input.sizes());
  NPU_OP_CHECK(axis >= -rank && axis < rank, op, dev, "axis must be in [", -rank, ", ", rank - 1, "], got ", axis);
  a.axis = axis < 0 ? axis + rank : axis;
  const DtypeCode c = dtypeOfCode(op, dev, dst_type, "dst_type");
  if (c.type == at::ScalarType::Float8_e4m3fn) {
    a.dst = *c.type, a.emax = 8, a.max_normal = 448.0;
  } else if (c.type == at::ScalarType::Float8_e5m2) {
    a.dst = *c.type, a.emax = 15, a.max_normal = 57344.0;
  } else if (c.type == at::ScalarType::Float4_e2m1fn_x2) {
    a.dst = *c.type, a.emax = 2, a.max_normal = 6.0;
  } else {
    NPU_OP_CHECK(c.name != "torch_npu.float4_e1m2fn_x2", op, dev, "dst_type torch_npu.float4_e1m2fn_x2 has no torch "
                 "dtype to hold the result on this npu; use torch_npu.float4_e2m1fn_x2 (296, the default)");
    NPU_OP_CHECK(false, op, dev, "dst_type must be torch.float8_e4m3fn, torch.float8_e5m2 or "
                 "torch_npu.float4_e2m1fn_x2 (296), got ", c.name);
  }
  NPU_OP_CHECK(block_size >= 32 && block_size <= 1024 && block_size % 32 == 0, op, dev,
               "block_size must be a multiple of 32 in [32, 1024], got ", block_size);
  a.block = block_size;
  NPU_OP_CHECK(!scale_alg.has_value() || *scale_alg == 0, op, dev, "scale_alg ", *scale_alg, " (Ascend's variants "
               "of the scale's computation) is not supported on this npu; use 0, the OCP MX scale 2^(floor(log2(amax)) "
               "- emax)");
  NPU_OP_CHECK(dst_type_max == 0.0 && max_low_bound == 0.0, op, dev, "dst_type_max and max_low_bound belong to "
               "scale_alg 2, which this npu does not support; leave them 0.0");
  const bool fp4 = a.dst == at::ScalarType::Float4_e2m1fn_x2;
  if (round_mode == "rint") {
    a.round = MxRound::Rint;
  } else if (fp4 && round_mode == "round") {
    a.round = MxRound::Round;
  } else if (fp4 && round_mode == "floor") {
    a.round = MxRound::Floor;
  } else {
    NPU_OP_CHECK(false, op, dev, "round_mode must be \"rint\"", fp4 ? ", \"round\" or \"floor\"" : " for float8 results",
                 ", got \"", std::string(round_mode), "\"");
  }
  a.y_shape = input.sizes().vec();
  if (fp4) {
    NPU_OP_CHECK(input.size(-1) % 2 == 0, op, dev, "float4 results pack two values per byte along the last dim, "
                 "which must be even, got ", input.sizes());
    a.y_shape.back() /= 2;
  }
  a.scale_shape = input.sizes().vec();
  const int64_t blocks = (input.size(a.axis) + a.block - 1) / a.block;
  a.scale_shape[a.axis] = (blocks + 1) / 2;
  a.scale_shape.push_back(2);
  return a;
}

// ---- npu_kv_rmsnorm_rope_cache ---------------------------------------------------------------

KvRopeArgs checkKvRmsnormRopeCache(const Tensor& kv, const Tensor& gamma, const Tensor& cos, const Tensor& sin,
                                   const Tensor& index, const Tensor& k_cache, const Tensor& ckv_cache,
                                   const Tensor& k_rope_scale, const Tensor& c_kv_scale, const Tensor& k_rope_offset,
                                   const Tensor& c_kv_offset, const Tensor& v, c10::string_view cache_mode) {
  constexpr const char* op = "npu_kv_rmsnorm_rope_cache";
  const auto dev = kv.device();
  KvRopeArgs a;
  if (cache_mode == "Norm") {
    a.mode = KvCacheMode::Norm;
  } else if (cache_mode == "PA" || cache_mode == "PA_BSND") {
    a.mode = KvCacheMode::PA;
  } else if (cache_mode == "PA_BNSD") {
    a.mode = KvCacheMode::PA_BNSD;
  } else if (cache_mode == "PA_NZ") {
    a.mode = KvCacheMode::PA_NZ;
  } else {
    NPU_OP_CHECK(cache_mode != "PA_BLK_BNSD" && cache_mode != "PA_BLK_NZ", op, dev, "cache_mode \"",
                 std::string(cache_mode), "\" (index as an offset per block) is not supported on this npu; use \"PA\", "
                 "\"PA_BNSD\" or \"PA_NZ\" with a global slot per token");
    NPU_OP_CHECK(false, op, dev, "cache_mode must be \"Norm\", \"PA\", \"PA_BNSD\" or \"PA_NZ\", got \"",
                 std::string(cache_mode), "\"");
  }
  NPU_OP_CHECK(!k_rope_scale.defined() && !c_kv_scale.defined() && !k_rope_offset.defined() && !c_kv_offset.defined(),
               op, dev, "k_rope_scale, c_kv_scale and the offsets (int8 caches) are not supported on this npu; keep "
               "the caches in kv's dtype and leave them None");
  NPU_OP_CHECK(!v.defined(), op, dev, "v (the separate-value variant of the op) is not supported on this npu; leave it "
               "None");
  NPU_OP_CHECK(kv.dim() == 4, op, dev, "kv must be 4-d (batch, heads, seq, dims), got ", kv.sizes());
  NPU_OP_CHECK(isFloating(kv.scalar_type()), op, dev, "kv must be float16, bfloat16 or float32, got ",
               dtypeName(kv.scalar_type()));
  a.B = kv.size(0), a.N = kv.size(1), a.S = kv.size(2);
  NPU_OP_CHECK(gamma.dim() == 1, op, dev, "gamma must be 1-d (the RMSNorm part's dims), got ", gamma.sizes());
  NPU_OP_CHECK(cos.dim() == 4 && cos.sizes() == sin.sizes(), op, dev,
               "cos and sin must be 4-d (batch, 1, seq, rope dims) of one shape, got ", cos.sizes(), " and ", sin.sizes());
  a.Dv = gamma.size(0), a.Dk = cos.size(-1);
  NPU_OP_CHECK(a.Dk % 2 == 0 && a.Dv + a.Dk == kv.size(3), op, dev, "kv's last dim (", kv.size(3),
               ") must be gamma's size (", a.Dv, ") plus the even rope size cos.size(-1) (", a.Dk, ")");
  NPU_OP_CHECK(cos.size(0) == a.B && cos.size(1) == 1 && cos.size(2) == a.S, op, dev, "cos and sin must be (", a.B,
               ", 1, ", a.S, ", ", a.Dk, "), got ", cos.sizes());
  for (const Tensor* t : {&gamma, &cos, &sin})
    NPU_OP_CHECK(t->scalar_type() == kv.scalar_type(), op, dev, "gamma, cos and sin must have kv's dtype ",
                 dtypeName(kv.scalar_type()), ", got ", dtypeName(t->scalar_type()));
  for (const Tensor* t : {&k_cache, &ckv_cache})
    NPU_OP_CHECK(t->scalar_type() == kv.scalar_type() && t->dim() == 4, op, dev, "k_cache and ckv_cache must be 4-d "
                 "with kv's dtype ", dtypeName(kv.scalar_type()), ", got ", dtypeName(t->scalar_type()), " ", t->sizes());
  NPU_OP_CHECK(index.scalar_type() == at::kLong, op, dev, "index must be int64, got ", dtypeName(index.scalar_type()),
               "; convert it with .to(torch.int64)");
  auto cacheOk = [&](const Tensor& c, int64_t d, const char* name) {
    bool ok = false;
    std::string want;
    switch (a.mode) {
      case KvCacheMode::Norm:
        ok = c.size(0) == a.B && c.size(1) == a.N && c.size(3) == d;
        want = "(batch, heads, cache_len, " + std::to_string(d) + ")";
        break;
      case KvCacheMode::PA:
        ok = c.size(2) == a.N && c.size(3) == d;
        want = "(blocks, block_size, heads, " + std::to_string(d) + ")";
        break;
      case KvCacheMode::PA_BNSD:
        ok = c.size(1) == a.N && c.size(3) == d;
        want = "(blocks, heads, block_size, " + std::to_string(d) + ")";
        break;
      case KvCacheMode::PA_NZ: {
        const int64_t last = 32 / static_cast<int64_t>(c10::elementSize(kv.scalar_type()));
        ok = c.size(3) == last && (a.N * d) % last == 0 && c.size(1) == a.N * d / last;
        want = "(blocks, heads * " + std::to_string(d) + " / " + std::to_string(last) + ", block_size, " +
               std::to_string(last) + ")";
        break;
      }
    }
    NPU_OP_CHECK(ok, op, dev, name, " must be ", want, " in cache_mode \"", std::string(cache_mode), "\", got ",
                 c.sizes());
  };
  cacheOk(k_cache, a.Dk, "k_cache");
  cacheOk(ckv_cache, a.Dv, "ckv_cache");
  if (a.mode == KvCacheMode::Norm) {
    NPU_OP_CHECK(index.dim() == 2 && index.size(0) == a.B && index.size(1) == a.S, op, dev,
                 "in cache_mode \"Norm\" index must be (batch, seq) = (", a.B, ", ", a.S, "), got ", index.sizes());
  } else {
    NPU_OP_CHECK(index.numel() == a.B * a.S && index.dim() <= 2, op, dev, "in the paged modes index must hold one "
                 "global slot per token (batch * seq = ", a.B * a.S, "), got ", index.sizes());
  }
  return a;
}

// ---- npu_scatter_nd_update ----------------------------------------------------------------------

int64_t checkScatterNdUpdate(const char* op, const Tensor& self, const Tensor& indices, const Tensor& updates) {
  const auto dev = self.device();
  NPU_OP_CHECK(self.dim() >= 1 && self.dim() <= 8, op, dev, "self must have 1 to 8 dimensions, got ", self.sizes());
  NPU_OP_CHECK(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong, op, dev,
               "indices must be int32 or int64, got ", dtypeName(indices.scalar_type()));
  NPU_OP_CHECK(indices.dim() >= 1, op, dev, "indices must have at least 1 dimension (..., index depth), got a scalar");
  const int64_t depth = indices.size(-1);
  NPU_OP_CHECK(depth >= 1 && depth <= self.dim(), op, dev, "indices.size(-1) (the index depth) must be in [1, ",
               self.dim(), "], got ", depth);
  std::vector<int64_t> want(indices.sizes().begin(), indices.sizes().end() - 1);
  want.insert(want.end(), self.sizes().begin() + depth, self.sizes().end());
  NPU_OP_CHECK(updates.sizes() == c10::IntArrayRef(want), op, dev, "updates must have shape indices.shape[:-1] + "
               "self.shape[", depth, ":] = ", c10::IntArrayRef(want), ", got ", updates.sizes());
  NPU_OP_CHECK(updates.scalar_type() == self.scalar_type(), op, dev, "updates must have self's dtype ",
               dtypeName(self.scalar_type()), ", got ", dtypeName(updates.scalar_type()));
  return depth;
}

// ---- atb::_npu_paged_attention --------------------------------------------------------------------

int64_t checkPagedAttention(const char* op, const Tensor& query, const Tensor& key_cache, const Tensor& value_cache,
                            int64_t num_kv_heads, int64_t num_heads, const Tensor& block_table,
                            const Tensor& context_lens, const Tensor& out) {
  const auto dev = query.device();
  NPU_OP_CHECK(query.dim() == 3, op, dev, "query must be 3-d (tokens, heads, head_size), got ", query.sizes());
  NPU_OP_CHECK(isFloating(query.scalar_type()), op, dev, "query must be float16, bfloat16 or float32, got ",
               dtypeName(query.scalar_type()));
  NPU_OP_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4, op, dev, "key_cache and value_cache must be 4-d "
               "(blocks, block_size, kv_heads, head_size), got ", key_cache.sizes(), " and ", value_cache.sizes(),
               " (the 310P's NZ caches are not supported)");
  NPU_OP_CHECK(key_cache.scalar_type() == query.scalar_type() && value_cache.scalar_type() == query.scalar_type(), op,
               dev, "key_cache and value_cache must have query's dtype ", dtypeName(query.scalar_type()),
               " (int8 caches are not supported), got ", dtypeName(key_cache.scalar_type()), " and ",
               dtypeName(value_cache.scalar_type()));
  const int64_t T = query.size(0), D = query.size(2);
  NPU_OP_CHECK(num_heads == query.size(1), op, dev, "num_heads (", num_heads, ") must be query.size(1) (",
               query.size(1), ")");
  NPU_OP_CHECK(num_kv_heads >= 1 && num_heads % num_kv_heads == 0, op, dev, "num_heads (", num_heads,
               ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  NPU_OP_CHECK(key_cache.size(2) == num_kv_heads && key_cache.size(3) == D, op, dev, "key_cache must be (blocks, "
               "block_size, num_kv_heads = ", num_kv_heads, ", head_size = ", D, "), got ", key_cache.sizes());
  NPU_OP_CHECK(value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1) &&
                   value_cache.size(2) == num_kv_heads,
               op, dev, "value_cache must be (", key_cache.size(0), ", ", key_cache.size(1), ", ", num_kv_heads,
               ", head_size_v), got ", value_cache.sizes());
  NPU_OP_CHECK(block_table.dim() == 2 && block_table.size(0) == T && block_table.scalar_type() == at::kInt, op, dev,
               "block_table must be int32 (tokens = ", T, ", max_blocks), got ", dtypeName(block_table.scalar_type()),
               " ", block_table.sizes());
  NPU_OP_CHECK(context_lens.dim() == 1 && context_lens.size(0) == T &&
                   (context_lens.scalar_type() == at::kInt || context_lens.scalar_type() == at::kLong),
               op, dev, "context_lens must be int32 of shape (", T, ",), got ", dtypeName(context_lens.scalar_type()),
               " ", context_lens.sizes());
  NPU_OP_CHECK(out.dim() == 3 && out.size(0) == T && out.size(1) == num_heads && out.size(2) == value_cache.size(3) &&
                   out.scalar_type() == query.scalar_type(),
               op, dev, "out must be ", dtypeName(query.scalar_type()), " (", T, ", ", num_heads, ", ",
               value_cache.size(3), "), got ", dtypeName(out.scalar_type()), " ", out.sizes());
  return num_heads / num_kv_heads;
}

// ---- npu_attention_update ----------------------------------------------------------------------------

void checkAttentionUpdate(at::TensorList lse, at::TensorList local_out, int64_t update_type) {
  constexpr const char* op = "npu_attention_update";
  const auto dev = local_out.empty() ? c10::Device(at::kCPU) : local_out[0].device();
  NPU_OP_CHECK(!lse.empty() && lse.size() == local_out.size() && lse.size() <= 16, op, dev,
               "lse and local_out must be lists of one length in [1, 16] (one entry per rank), got ", lse.size(),
               " and ", local_out.size());
  NPU_OP_CHECK(update_type == 0 || update_type == 1, op, dev,
               "update_type must be 0 (out only) or 1 (out and the merged lse), got ", update_type);
  const Tensor& o0 = local_out[0];
  NPU_OP_CHECK(o0.dim() == 2 && isFloating(o0.scalar_type()), op, dev, "local_out must be 2-d (b*s*n, head_dim) "
               "float32, float16 or bfloat16, got ", dtypeName(o0.scalar_type()), " ", o0.sizes());
  const int64_t rows = o0.size(0), d = o0.size(1);
  NPU_OP_CHECK(d % 8 == 0 && d >= 8 && d <= 512, op, dev, "head_dim must be a multiple of 8 in [8, 512], got ", d);
  for (const auto i : c10::irange(lse.size())) {
    NPU_OP_CHECK(local_out[i].sizes() == o0.sizes() && local_out[i].scalar_type() == o0.scalar_type(), op, dev,
                 "local_out[", i, "] must match local_out[0] (", dtypeName(o0.scalar_type()), " ", o0.sizes(), ")");
    NPU_OP_CHECK(lse[i].dim() == 1 && lse[i].size(0) == rows && lse[i].scalar_type() == at::kFloat, op, dev, "lse[", i,
                 "] must be float32 of shape (", rows, ",), got ", dtypeName(lse[i].scalar_type()), " ", lse[i].sizes());
  }
}

// ---- npu_moe_finalize_routing ------------------------------------------------------------------------

std::tuple<int64_t, int64_t> checkMoeFinalizeRouting(const Tensor& expanded, const Tensor& skip1, const Tensor& skip2,
                                                     const Tensor& bias, const Tensor& scales,
                                                     const Tensor& src_to_dst, const Tensor& export_for_source_row,
                                                     std::optional<int64_t> drop_pad_mode, std::optional<int64_t> k) {
  constexpr const char* op = "npu_moe_finalize_routing";
  const auto dev = expanded.device();
  NPU_OP_CHECK(!drop_pad_mode.has_value() || *drop_pad_mode == 0, op, dev, "drop_pad_mode ", *drop_pad_mode,
               " (expert-capacity layouts (experts, capacity, hidden)) is not supported on this npu; use 0 (dropless "
               "rows, as npu_moe_init_routing_v2 gives them)");
  NPU_OP_CHECK(expanded.dim() == 2 && isFloating(expanded.scalar_type()), op, dev, "expanded_permuted_rows must be 2-d "
               "(rows * k, hidden) float16, bfloat16 or float32, got ", dtypeName(expanded.scalar_type()), " ",
               expanded.sizes());
  const int64_t hidden = expanded.size(1);
  NPU_OP_CHECK(src_to_dst.dim() == 1 && src_to_dst.scalar_type() == at::kInt, op, dev,
               "expanded_src_to_dst_row must be 1-d int32, got ", dtypeName(src_to_dst.scalar_type()), " ",
               src_to_dst.sizes());
  int64_t topk = k.value_or(1);
  if (scales.defined()) {
    NPU_OP_CHECK(scales.dim() == 2, op, dev, "scales must be 2-d (rows, k), got ", scales.sizes());
    topk = scales.size(1);
    NPU_OP_CHECK(scales.scalar_type() == expanded.scalar_type() || scales.scalar_type() == at::kFloat, op, dev,
                 "scales must be float32 or expanded_permuted_rows' dtype, got ", dtypeName(scales.scalar_type()));
  }
  NPU_OP_CHECK(topk >= 1 && src_to_dst.size(0) % topk == 0, op, dev, "expanded_src_to_dst_row's length (",
               src_to_dst.size(0), ") must be rows * k with k = ", topk);
  const int64_t rows = src_to_dst.size(0) / topk;
  if (scales.defined())
    NPU_OP_CHECK(scales.size(0) == rows, op, dev, "scales must be (rows, k) = (", rows, ", ", topk, "), got ",
                 scales.sizes());
  for (const Tensor* t : {&skip1, &skip2}) {
    if (!t->defined()) continue;
    NPU_OP_CHECK(t->dim() == 2 && t->size(0) == rows && t->size(1) == hidden &&
                     t->scalar_type() == expanded.scalar_type(),
                 op, dev, "skip1 and skip2 must be (rows, hidden) = (", rows, ", ", hidden, ") of ",
                 dtypeName(expanded.scalar_type()), ", got ", dtypeName(t->scalar_type()), " ", t->sizes());
  }
  NPU_OP_CHECK(skip1.defined() || !skip2.defined(), op, dev, "skip2 needs skip1");
  if (bias.defined()) {
    NPU_OP_CHECK(export_for_source_row.defined(), op, dev, "bias needs export_for_source_row (each pair's expert)");
    NPU_OP_CHECK(bias.dim() == 2 && bias.size(1) == hidden && bias.scalar_type() == expanded.scalar_type(), op, dev,
                 "bias must be (experts, hidden = ", hidden, ") of ", dtypeName(expanded.scalar_type()), ", got ",
                 dtypeName(bias.scalar_type()), " ", bias.sizes());
  }
  if (export_for_source_row.defined()) {
    NPU_OP_CHECK(export_for_source_row.dim() == 2 && export_for_source_row.size(0) == rows &&
                     export_for_source_row.size(1) == topk && export_for_source_row.scalar_type() == at::kInt,
                 op, dev, "export_for_source_row must be int32 (rows, k) = (", rows, ", ", topk, "), got ",
                 dtypeName(export_for_source_row.scalar_type()), " ", export_for_source_row.sizes());
  }
  return {rows, topk};
}

// ---- npu_mla_prolog_v2 / v3 ------------------------------------------------------------------------

MlaArgs checkMlaProlog(const char* op, const Tensor& token_x, const Tensor& weight_dq, const Tensor& weight_uq_qr,
                       const Tensor& weight_uk, const Tensor& weight_dkv_kr, const Tensor& gamma_cq,
                       const Tensor& gamma_ckv, const Tensor& rope_sin, const Tensor& rope_cos,
                       const Tensor& kv_cache, const Tensor& kr_cache, const Tensor& cache_index,
                       c10::string_view cache_mode, bool query_norm_flag, const MlaOptions& options) {
  const auto dev = token_x.device();
  MlaArgs a;
  a.op = op;
  for (const auto& [name, given] : options.given)
    NPU_OP_CHECK(!given, op, dev, name, " belongs to the quantized MLA prolog (int8 or float8 token_x, weights or "
                 "caches), which this npu does not support; leave it None and pass float weights and caches");
  const std::pair<const char*, int64_t> modes[] = {
      {"weight_quant_mode", options.weight_quant_mode}, {"kv_cache_quant_mode", options.kv_cache_quant_mode},
      {"query_quant_mode", options.query_quant_mode}, {"ckvkr_repo_mode", options.ckvkr_repo_mode},
      {"quant_scale_repo_mode", options.quant_scale_repo_mode}};
  for (const auto& [name, value] : modes)
    NPU_OP_CHECK(value == 0, op, dev, name, " ", value, " (a quantized or repacked MLA prolog) is not supported on "
                 "this npu; leave it 0");
  NPU_OP_CHECK(options.qc_qr_scale == 1.0 && options.kc_scale == 1.0, op, dev, "qc_qr_scale and kc_scale (the "
               "quantized prolog's scales) must be 1.0 on this npu, got ", options.qc_qr_scale, " and ",
               options.kc_scale);
  NPU_OP_CHECK(cache_mode == "PA_BSND", op, dev, "cache_mode \"", std::string(cache_mode), "\" is not supported on "
               "this npu; use \"PA_BSND\" (caches (blocks, block_size, kv_heads, dims))");
  NPU_OP_CHECK(token_x.dim() == 2 || token_x.dim() == 3, op, dev, "token_x must be (tokens, hidden) or (batch, seq, "
               "hidden), got ", token_x.sizes());
  NPU_OP_CHECK(isFloating(token_x.scalar_type()), op, dev, "token_x must be bfloat16, float16 or float32 (int8 "
               "token_x is the quantized prolog, not supported on this npu), got ", dtypeName(token_x.scalar_type()));
  for (const Tensor* t : {&weight_dq, &weight_uq_qr, &weight_uk, &weight_dkv_kr, &gamma_cq, &gamma_ckv, &rope_sin,
                          &rope_cos, &kv_cache, &kr_cache})
    NPU_OP_CHECK(t->scalar_type() == token_x.scalar_type(), op, dev, "the weights, gammas, rope_sin/rope_cos and "
                 "caches must have token_x's dtype ", dtypeName(token_x.scalar_type()), " (quantized weights and caches "
                 "are not supported), got ", dtypeName(t->scalar_type()));
  a.lead = token_x.sizes().slice(0, token_x.dim() - 1).vec();
  a.T = token_x.numel() / std::max<int64_t>(1, token_x.size(-1));
  a.He = token_x.size(-1);
  NPU_OP_CHECK(weight_dq.dim() == 2 && weight_dq.size(0) == a.He, op, dev, "weight_dq must be (hidden = ", a.He,
               ", q_lora_rank), got ", weight_dq.sizes());
  a.Hcq = weight_dq.size(1);
  NPU_OP_CHECK(weight_uk.dim() == 3, op, dev, "weight_uk must be (heads, qk_nope_dim, kv_lora_rank), got ",
               weight_uk.sizes());
  a.N = weight_uk.size(0), a.D = weight_uk.size(1), a.Hckv = weight_uk.size(2);
  NPU_OP_CHECK(rope_sin.sizes() == rope_cos.sizes() && rope_sin.dim() == token_x.dim() &&
                   rope_sin.sizes().slice(0, rope_sin.dim() - 1) == c10::IntArrayRef(a.lead),
               op, dev, "rope_sin and rope_cos must be token_x's leading dims ", c10::IntArrayRef(a.lead),
               " + (rope_dim,), of one shape, got ", rope_sin.sizes(), " and ", rope_cos.sizes());
  a.Dr = rope_sin.size(-1);
  NPU_OP_CHECK(a.Dr % 2 == 0, op, dev, "the rope dim (rope_sin.size(-1)) must be even, got ", a.Dr);
  NPU_OP_CHECK(weight_uq_qr.dim() == 2 && weight_uq_qr.size(0) == a.Hcq && weight_uq_qr.size(1) == a.N * (a.D + a.Dr),
               op, dev, "weight_uq_qr must be (q_lora_rank, heads * (qk_nope_dim + rope_dim)) = (", a.Hcq, ", ",
               a.N * (a.D + a.Dr), "), got ", weight_uq_qr.sizes());
  NPU_OP_CHECK(weight_dkv_kr.dim() == 2 && weight_dkv_kr.size(0) == a.He && weight_dkv_kr.size(1) == a.Hckv + a.Dr,
               op, dev, "weight_dkv_kr must be (hidden, kv_lora_rank + rope_dim) = (", a.He, ", ", a.Hckv + a.Dr,
               "), got ", weight_dkv_kr.sizes());
  NPU_OP_CHECK(gamma_cq.dim() == 1 && gamma_cq.size(0) == a.Hcq && gamma_ckv.dim() == 1 && gamma_ckv.size(0) == a.Hckv,
               op, dev, "rmsnorm_gamma_cq must be (", a.Hcq, ",) and rmsnorm_gamma_ckv (", a.Hckv, ",), got ",
               gamma_cq.sizes(), " and ", gamma_ckv.sizes());
  NPU_OP_CHECK(kv_cache.dim() == 4 && kr_cache.dim() == 4 && kv_cache.size(3) == a.Hckv && kr_cache.size(3) == a.Dr &&
                   kv_cache.sizes().slice(0, 3) == kr_cache.sizes().slice(0, 3),
               op, dev, "kv_cache and kr_cache must be (blocks, block_size, kv_heads, ", a.Hckv, ") and (..., ", a.Dr,
               "), got ", kv_cache.sizes(), " and ", kr_cache.sizes());
  if (cache_index.defined()) {
    NPU_OP_CHECK(cache_index.scalar_type() == at::kLong && cache_index.numel() == a.T, op, dev,
                 "cache_index must be int64 with one slot per token (", a.T, "), got ",
                 dtypeName(cache_index.scalar_type()), " ", cache_index.sizes());
  }
  a.query_norm = query_norm_flag;
  return a;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> emptyMlaProlog(const MlaArgs& a, const Tensor& token_x,
                                                                  const Tensor& rope_sin) {
  auto shape = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s = a.lead;
    s.insert(s.end(), tail);
    return s;
  };
  const auto f = token_x.options().dtype(at::kFloat);
  return {at::empty(shape({a.N, a.Hckv}), token_x.options().dtype(rope_sin.scalar_type())),
          at::empty(shape({a.N, a.Dr}), token_x.options()), at::empty({0}, f),
          a.query_norm ? at::empty(shape({a.Hcq}), token_x.options()) : at::empty({0}, token_x.options()),
          at::empty({0}, f)};
}

namespace {

// ---- the v3 entry (kernel and meta) and the composites ----------------------------------------------

template <bool Meta>
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> mlaPrologV3Entry(
    const Tensor& token_x, const Tensor& weight_dq, const Tensor& weight_uq_qr, const Tensor& weight_uk,
    const Tensor& weight_dkv_kr, const Tensor& gamma_cq, const Tensor& gamma_ckv, const Tensor& rope_sin,
    const Tensor& rope_cos, const Tensor& kv_cache, const Tensor& kr_cache, const OptTensor& cache_index,
    const OptTensor& dequant_scale_x, const OptTensor& dequant_scale_w_dq, const OptTensor& dequant_scale_w_uq_qr,
    const OptTensor& dequant_scale_w_dkv_kr, const OptTensor& quant_scale_ckv, const OptTensor& quant_scale_ckr,
    const OptTensor& smooth_scales_cq, const OptTensor& actual_seq_len, const OptTensor& k_nope_clip_alpha,
    double eps_cq, double eps_ckv, c10::string_view cache_mode, bool query_norm_flag, int64_t weight_quant_mode,
    int64_t kv_cache_quant_mode, int64_t query_quant_mode, int64_t ckvkr_repo_mode, int64_t quant_scale_repo_mode,
    int64_t tile_size, double qc_qr_scale, double kc_scale, std::optional<int64_t> token_x_dtype,
    std::optional<int64_t> weight_dq_dtype, std::optional<int64_t> weight_uq_qr_dtype,
    std::optional<int64_t> weight_dkv_kr_dtype, std::optional<int64_t> kv_cache_dtype) {
  MlaOptions o;
  o.given = {{"dequant_scale_x", dequant_scale_x.has_value()},
             {"dequant_scale_w_dq", dequant_scale_w_dq.has_value()},
             {"dequant_scale_w_uq_qr", dequant_scale_w_uq_qr.has_value()},
             {"dequant_scale_w_dkv_kr", dequant_scale_w_dkv_kr.has_value()},
             {"quant_scale_ckv", quant_scale_ckv.has_value()},
             {"quant_scale_ckr", quant_scale_ckr.has_value()},
             {"smooth_scales_cq", smooth_scales_cq.has_value()},
             {"actual_seq_len", actual_seq_len.has_value()},
             {"k_nope_clip_alpha", k_nope_clip_alpha.has_value()},
             {"token_x_dtype", token_x_dtype.has_value()},
             {"weight_dq_dtype", weight_dq_dtype.has_value()},
             {"weight_uq_qr_dtype", weight_uq_qr_dtype.has_value()},
             {"weight_dkv_kr_dtype", weight_dkv_kr_dtype.has_value()},
             {"kv_cache_dtype", kv_cache_dtype.has_value()}};
  o.weight_quant_mode = weight_quant_mode, o.kv_cache_quant_mode = kv_cache_quant_mode;
  o.query_quant_mode = query_quant_mode, o.ckvkr_repo_mode = ckvkr_repo_mode;
  o.quant_scale_repo_mode = quant_scale_repo_mode, o.qc_qr_scale = qc_qr_scale, o.kc_scale = kc_scale;
  (void)tile_size;  // a tiling hint for the chip
  const MlaArgs a = checkMlaProlog("npu_mla_prolog_v3", token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr,
                                   gamma_cq, gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, valueOr(cache_index),
                                   cache_mode, query_norm_flag, o);
  if (Meta) return emptyMlaProlog(a, token_x, rope_sin);
  return mlaProlog(a, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, gamma_cq, gamma_ckv, rope_sin,
                   rope_cos, kv_cache, kr_cache, valueOr(cache_index), eps_cq, eps_ckv);
}

using MlaV3 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, double, double, c10::string_view, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
    double, double, std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
    std::optional<int64_t>);

const c10::TypedOperatorHandle<MlaV3>& mlaV3Op() {
  static const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_mla_prolog_v3", "").typed<MlaV3>();
  return handle;
}

// v2: the same prolog with cache_index required; its results name the caches (updated in place).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> mlaPrologV2(
    const Tensor& token_x, const Tensor& weight_dq, const Tensor& weight_uq_qr, const Tensor& weight_uk,
    const Tensor& weight_dkv_kr, const Tensor& gamma_cq, const Tensor& gamma_ckv, const Tensor& rope_sin,
    const Tensor& rope_cos, const Tensor& cache_index, const Tensor& kv_cache, const Tensor& kr_cache,
    const OptTensor& dequant_scale_x, const OptTensor& dequant_scale_w_dq, const OptTensor& dequant_scale_w_uq_qr,
    const OptTensor& dequant_scale_w_dkv_kr, const OptTensor& quant_scale_ckv, const OptTensor& quant_scale_ckr,
    const OptTensor& smooth_scales_cq, double eps_cq, double eps_ckv, c10::string_view cache_mode) {
  auto [query, query_rope, dq_nope, qn, dq_norm] = mlaV3Op().call(
      token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, gamma_cq, gamma_ckv, rope_sin, rope_cos, kv_cache,
      kr_cache, cache_index, dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr,
      quant_scale_ckv, quant_scale_ckr, smooth_scales_cq, std::nullopt, std::nullopt, eps_cq, eps_ckv, cache_mode,
      false, 0, 0, 0, 0, 0, 128, 1.0, 1.0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  (void)dq_nope, (void)qn, (void)dq_norm;
  // Ascend's v2 gives a one-element dequant_scale_q_nope without quantization
  return {query, query_rope, kv_cache, kr_cache, at::zeros({1}, token_x.options().dtype(at::kFloat))};
}

// v3_functional: v3 on copies of the caches, returned after v3's five results.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> mlaPrologV3Functional(
    const Tensor& token_x, const Tensor& weight_dq, const Tensor& weight_uq_qr, const Tensor& weight_uk,
    const Tensor& weight_dkv_kr, const Tensor& gamma_cq, const Tensor& gamma_ckv, const Tensor& rope_sin,
    const Tensor& rope_cos, const Tensor& kv_cache, const Tensor& kr_cache, const OptTensor& cache_index,
    const OptTensor& dequant_scale_x, const OptTensor& dequant_scale_w_dq, const OptTensor& dequant_scale_w_uq_qr,
    const OptTensor& dequant_scale_w_dkv_kr, const OptTensor& quant_scale_ckv, const OptTensor& quant_scale_ckr,
    const OptTensor& smooth_scales_cq, const OptTensor& actual_seq_len, const OptTensor& k_nope_clip_alpha,
    double eps_cq, double eps_ckv, c10::string_view cache_mode, bool query_norm_flag, int64_t weight_quant_mode,
    int64_t kv_cache_quant_mode, int64_t query_quant_mode, int64_t ckvkr_repo_mode, int64_t quant_scale_repo_mode,
    int64_t tile_size, double qc_qr_scale, double kc_scale, std::optional<int64_t> token_x_dtype,
    std::optional<int64_t> weight_dq_dtype, std::optional<int64_t> weight_uq_qr_dtype,
    std::optional<int64_t> weight_dkv_kr_dtype, std::optional<int64_t> kv_cache_dtype) {
  Tensor kv = kv_cache.clone(), kr = kr_cache.clone();
  auto [q, qr, dq_nope, qn, dq_norm] = mlaV3Op().call(
      token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, gamma_cq, gamma_ckv, rope_sin, rope_cos, kv, kr,
      cache_index, dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv,
      quant_scale_ckr, smooth_scales_cq, actual_seq_len, k_nope_clip_alpha, eps_cq, eps_ckv, cache_mode,
      query_norm_flag, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
      quant_scale_repo_mode, tile_size, qc_qr_scale, kc_scale, token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype,
      weight_dkv_kr_dtype, kv_cache_dtype);
  return {q, qr, dq_nope, qn, dq_norm, kv, kr};
}

// ---- npu_kv_rmsnorm_rope_cache: the public op over its in-place kernel --------------------------------

using KvRopeInplace = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                                 const OptTensor&, const OptTensor&, const OptTensor&,
                                                 const OptTensor&, double, c10::string_view, bool);

std::tuple<Tensor, Tensor, Tensor, Tensor> kvRmsnormRopeCache(
    const Tensor& kv, const Tensor& gamma, const Tensor& cos, const Tensor& sin, const Tensor& index,
    const Tensor& k_cache, const Tensor& ckv_cache, const OptTensor& k_rope_scale, const OptTensor& c_kv_scale,
    const OptTensor& k_rope_offset, const OptTensor& c_kv_offset, const OptTensor& v, double epsilon,
    c10::string_view cache_mode, bool is_output_kv) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("npu::_npu_kv_rmsnorm_rope_cache_inplace", "")
                                 .typed<KvRopeInplace>();
  auto [k_rope, c_kv] = handle.call(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                                    k_rope_offset, c_kv_offset, v, epsilon, cache_mode, is_output_kv);
  return {k_cache, ckv_cache, k_rope, c_kv};
}

std::tuple<Tensor, Tensor> kvRmsnormRopeCacheInplaceMeta(
    const Tensor& kv, const Tensor& gamma, const Tensor& cos, const Tensor& sin, const Tensor& index,
    const Tensor& k_cache, const Tensor& ckv_cache, const OptTensor& k_rope_scale, const OptTensor& c_kv_scale,
    const OptTensor& k_rope_offset, const OptTensor& c_kv_offset, const OptTensor& v, double, c10::string_view cache_mode,
    bool) {
  const KvRopeArgs a = checkKvRmsnormRopeCache(kv, gamma, cos, sin, index, k_cache, ckv_cache, valueOr(k_rope_scale),
                                               valueOr(c_kv_scale), valueOr(k_rope_offset), valueOr(c_kv_offset),
                                               valueOr(v), cache_mode);
  return {at::empty({a.B, a.N, a.S, a.Dk}, kv.options()), at::empty({a.B, a.N, a.S, a.Dv}, kv.options())};
}

// ---- npu_scatter_nd_update_ over its in-place kernel ---------------------------------------------------

Tensor& scatterNdUpdate_(Tensor& self, const Tensor& indices, const Tensor& updates) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("npu::_npu_scatter_nd_update_inplace", "")
                                 .typed<void(const Tensor&, const Tensor&, const Tensor&)>();
  handle.call(self, indices, updates);
  return self;
}

// ---- meta kernels ---------------------------------------------------------------------------------------

Tensor weightQuantBatchmatmulMeta(const Tensor& x, const Tensor& weight, const Tensor& antiquant_scale,
                                  const OptTensor& antiquant_offset, const OptTensor& quant_scale,
                                  const OptTensor& quant_offset, const OptTensor& bias, int64_t group,
                                  int64_t inner_precise, std::optional<int64_t> weight_dtype) {
  const WqbmmArgs a = checkWeightQuantBatchmatmul(x, weight, antiquant_scale, valueOr(antiquant_offset),
                                                  valueOr(quant_scale), valueOr(quant_offset), valueOr(bias), group,
                                                  inner_precise, weight_dtype);
  return at::empty({a.m, a.n}, x.options().dtype(a.out));
}

std::tuple<Tensor, Tensor> dynamicMxQuantMeta(const Tensor& input, int64_t axis, c10::string_view round_mode,
                                              int64_t dst_type, int64_t block_size, std::optional<int64_t> scale_alg,
                                              double dst_type_max, double max_low_bound) {
  const MxArgs a = checkDynamicMxQuant(input, axis, round_mode, dst_type, block_size, scale_alg, dst_type_max,
                                       max_low_bound);
  return {at::empty(a.y_shape, input.options().dtype(a.dst)),
          at::empty(a.scale_shape, input.options().dtype(at::ScalarType::Float8_e8m0fnu))};
}

Tensor scatterNdUpdateMeta(const Tensor& self, const Tensor& indices, const Tensor& updates) {
  checkScatterNdUpdate("npu_scatter_nd_update", self, indices, updates);
  return at::empty(self.sizes(), self.options());
}

void scatterNdUpdateInplaceMeta(const Tensor& self, const Tensor& indices, const Tensor& updates) {
  checkScatterNdUpdate("npu_scatter_nd_update_", self, indices, updates);
}

void pagedAttentionMeta(const Tensor& query, const Tensor& key_cache, const Tensor& value_cache, int64_t num_kv_heads,
                        int64_t num_heads, double, const Tensor& block_table, const Tensor& context_lens,
                        const Tensor& out, const OptTensor&) {
  checkPagedAttention("_npu_paged_attention", query, key_cache, value_cache, num_kv_heads, num_heads, block_table,
                      context_lens, out);
}

// The workspace ATB would need: none here (the host kernel allocates its own), so an empty uint8 tensor.
template <bool Meta>
Tensor pagedAttentionWorkspace(const Tensor& query, const Tensor& key_cache, const Tensor& value_cache,
                               int64_t num_kv_heads, int64_t num_heads, double, const Tensor& block_table,
                               const Tensor& context_lens, const Tensor& out) {
  checkPagedAttention("_npu_paged_attention_get_workspace", query, key_cache, value_cache, num_kv_heads, num_heads,
                      block_table, context_lens, out);
  return at::empty({0}, query.options().dtype(at::kByte));
}

std::tuple<Tensor, Tensor> attentionUpdateMeta(at::TensorList lse, at::TensorList local_out, int64_t update_type) {
  checkAttentionUpdate(lse, local_out, update_type);
  return {at::empty(local_out[0].sizes(), local_out[0].options()),
          at::empty(update_type == 1 ? lse[0].sizes() : c10::IntArrayRef{0}, lse[0].options())};
}

Tensor moeFinalizeRoutingMeta(const Tensor& expanded, const OptTensor& skip1, const OptTensor& skip2,
                              const OptTensor& bias, const OptTensor& scales, const Tensor& src_to_dst,
                              const OptTensor& export_for_source_row, std::optional<int64_t> drop_pad_mode,
                              std::optional<int64_t> k) {
  const auto [rows, topk] = checkMoeFinalizeRouting(expanded, valueOr(skip1), valueOr(skip2), valueOr(bias),
                                                    valueOr(scales), src_to_dst, valueOr(export_for_source_row),
                                                    drop_pad_mode, k);
  (void)topk;
  return at::empty({rows, expanded.size(1)}, expanded.options());
}

// Autograd for the kernels that write their inputs (schema `Tensor(a!)`): none has a backward (as
// on Ascend); they run below autograd and bump the version counters of what they wrote, as aten's
// in-place ops do, so a saved tensor they overwrote is caught.
void belowAutogradBumpingWrites(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  std::vector<Tensor> written;
  for (const auto i : c10::irange(n)) {
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite() && v.isTensor())
      written.push_back(v.toTensor());
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }
  for (const Tensor& t : written)
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace
}  // namespace npu::ops::inference

namespace npu::ops {

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, "
        "Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, int antiquant_group_size=0, "
        "int inner_precise=0, int? weight_dtype=None) -> Tensor");
  m.def("npu_dynamic_mx_quant(Tensor input, *, int axis=-1, str round_mode=\"rint\", int dst_type=296, "
        "int block_size=32, int? scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0) -> (Tensor, Tensor)");
  m.def("npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, Tensor k_cache, "
        "Tensor ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, "
        "Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-5, str cache_mode='Norm', "
        "bool is_output_kv=False) -> (Tensor, Tensor, Tensor, Tensor)");
  // Its kernel: the caches' update marked in the schema (Ascend's is not), so torch.compile sees it.
  m.def("_npu_kv_rmsnorm_rope_cache_inplace(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, "
        "Tensor(a!) k_cache, Tensor(b!) ckv_cache, Tensor? k_rope_scale, Tensor? c_kv_scale, Tensor? k_rope_offset, "
        "Tensor? c_kv_offset, Tensor? v, float epsilon, str cache_mode, bool is_output_kv) -> (Tensor, Tensor)");
  m.def("npu_scatter_nd_update(Tensor self, Tensor indices, Tensor updates) -> Tensor");
  m.def("npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, Tensor updates) -> Tensor(a!)");
  m.def("_npu_scatter_nd_update_inplace(Tensor(a!) self, Tensor indices, Tensor updates) -> ()");
  m.def("npu_attention_update(Tensor[] lse, Tensor[] local_out, int update_type) -> (Tensor, Tensor)");
  m.def("npu_moe_finalize_routing(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, "
        "Tensor? scales, Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0, "
        "int? k=1) -> Tensor");
  m.def("npu_mla_prolog_v2(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, Tensor rope_cos, "
        "Tensor cache_index, Tensor kv_cache, Tensor kr_cache, *, Tensor? dequant_scale_x=None, "
        "Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, "
        "Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode=\"PA_BSND\") "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  const char* v3_args =
      "Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, Tensor weight_dkv_kr, "
      "Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, Tensor rope_cos, ";
  const char* v3_kwargs =
      "*, Tensor? cache_index=None, Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, "
      "Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, "
      "Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, "
      "Tensor? k_nope_clip_alpha=None, float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, "
      "str cache_mode=\"PA_BSND\", bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, "
      "int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, "
      "float qc_qr_scale=1.0, float kc_scale=1.0, int? token_x_dtype=None, int? weight_dq_dtype=None, "
      "int? weight_uq_qr_dtype=None, int? weight_dkv_kr_dtype=None, int? kv_cache_dtype=None)";
  const std::string v3 = std::string("npu_mla_prolog_v3(") + v3_args + "Tensor(a!) kv_cache, Tensor(b!) kr_cache, " +
                         v3_kwargs + " -> (Tensor, Tensor, Tensor, Tensor, Tensor)";
  const std::string v3_functional = std::string("npu_mla_prolog_v3_functional(") + v3_args +
                                    "Tensor kv_cache, Tensor kr_cache, " + v3_kwargs +
                                    " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)";
  m.def(v3.c_str());
  m.def(v3_functional.c_str());

  m.impl("npu_kv_rmsnorm_rope_cache", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(inference::kvRmsnormRopeCache));
  m.impl("npu_scatter_nd_update_", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(inference::scatterNdUpdate_));
  m.impl("npu_mla_prolog_v2", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(inference::mlaPrologV2));
  m.impl("npu_mla_prolog_v3_functional", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(inference::mlaPrologV3Functional));
}

void registerInferenceKernels(torch::Library& m) {
  m.impl("npu_weight_quant_batchmatmul", TORCH_FN(inference::weightQuantBatchmatmul));
  m.impl("npu_dynamic_mx_quant", TORCH_FN(inference::dynamicMxQuant));
  m.impl("_npu_kv_rmsnorm_rope_cache_inplace", TORCH_FN(inference::kvRmsnormRopeCacheInplace));
  m.impl("npu_scatter_nd_update", TORCH_FN(inference::scatterNdUpdate));
  m.impl("_npu_scatter_nd_update_inplace", TORCH_FN(inference::scatterNdUpdateInplace));
  m.impl("npu_attention_update", TORCH_FN(inference::attentionUpdate));
  m.impl("npu_moe_finalize_routing", TORCH_FN(inference::moeFinalizeRouting));
  m.impl("npu_mla_prolog_v3", TORCH_FN(inference::mlaPrologV3Entry<false>));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerInferenceKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_weight_quant_batchmatmul", TORCH_FN(inference::weightQuantBatchmatmulMeta));
  m.impl("npu_dynamic_mx_quant", TORCH_FN(inference::dynamicMxQuantMeta));
  m.impl("_npu_kv_rmsnorm_rope_cache_inplace", TORCH_FN(inference::kvRmsnormRopeCacheInplaceMeta));
  m.impl("npu_scatter_nd_update", TORCH_FN(inference::scatterNdUpdateMeta));
  m.impl("_npu_scatter_nd_update_inplace", TORCH_FN(inference::scatterNdUpdateInplaceMeta));
  m.impl("npu_attention_update", TORCH_FN(inference::attentionUpdateMeta));
  m.impl("npu_moe_finalize_routing", TORCH_FN(inference::moeFinalizeRoutingMeta));
  m.impl("npu_mla_prolog_v3", TORCH_FN(inference::mlaPrologV3Entry<true>));
}

TORCH_LIBRARY_IMPL(npu, Autograd, m) {
  for (const char* name : {"_npu_kv_rmsnorm_rope_cache_inplace", "_npu_scatter_nd_update_inplace", "npu_mla_prolog_v3"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&inference::belowAutogradBumpingWrites>());
}

// The ATB ops (Ascend Transformer Boost), in their own namespace as on Ascend.
TORCH_LIBRARY_FRAGMENT(atb, m) {
  m.def("_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, int num_heads, "
        "float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out, *, Tensor? workspace=None) -> ()");
  m.def("_npu_paged_attention_get_workspace(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
        "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out) -> Tensor");
}

void registerAtbKernels(torch::Library& m) {
  m.impl("_npu_paged_attention", TORCH_FN(inference::pagedAttention));
  m.impl("_npu_paged_attention_get_workspace", TORCH_FN(inference::pagedAttentionWorkspace<false>));
}
TORCH_LIBRARY_IMPL(atb, PrivateUse1, m) { registerAtbKernels(m); }
TORCH_LIBRARY_IMPL(atb, CPU, m) { registerAtbKernels(m); }

TORCH_LIBRARY_IMPL(atb, Autograd, m) {
  m.impl("_npu_paged_attention", torch::CppFunction::makeFromBoxedFunction<&inference::belowAutogradBumpingWrites>());
}

TORCH_LIBRARY_IMPL(atb, Meta, m) {
  m.impl("_npu_paged_attention", TORCH_FN(inference::pagedAttentionMeta));
  m.impl("_npu_paged_attention_get_workspace", TORCH_FN(inference::pagedAttentionWorkspace<true>));
}

}  // namespace npu::ops
