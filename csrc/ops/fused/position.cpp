// The positional and sampling ops of torch_npu.ops.position, with the Ascend
// adapter's signatures, defaults and results:
//   npu_apply_rotary_pos_emb (rotary embedding of query and key, in place),
//   npu_mrope (rotary / multimodal rotary embedding from a cos-sin cache),
//   npu_interleave_rope (rotary embedding of interleaved pairs),
//   npu_top_k_top_p (the top-k / top-p filter on logits),
//   npu_scaled_masked_softmax (and its backward),
//   npu_transpose_batchmatmul (a batched matmul between permutations).
// Here: their schemas, argument checks, meta kernels (the same checks and
// shapes, for fake tensors), the composite and autograd kernels, and the
// registration of the host kernels (ops/host/fused/position_kernels.cpp) for
// npu and cpu tensors. Autograd of the differentiable ones is registered from
// Python (torch_npu/ops/position.py).
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../host/dtypes.h"
#include "common.h"
#include "position.h"

namespace npu::ops::position {
namespace {

std::string names(DtypeSet set) { return set.pythonNames(); }

// The index of the heads dimension (N) in each layout.
int64_t headsDim(const char* op, std::string_view layout) {
  // "BSH" is the schema's default and, on Ascend, the same 4-D layout as "BSND".
  if (layout == "BSND" || layout == "BSH" || layout == "SBND") return 2;
  if (layout == "BNSD") return 1;
  if (layout == "TND") return 1;
  TORCH_CHECK_VALUE(false, "npu::", op, ": layout must be 'BSH' (= 'BSND'), 'BSND', 'SBND', 'BNSD' or 'TND', got '",
                    layout, "'");
}

bool isPerm(at::IntArrayRef perm, std::array<int64_t, 3> want) {
  return perm.size() == 3 && perm[0] == want[0] && perm[1] == want[1] && perm[2] == want[2];
}

}  // namespace

void checkDtype(const char* op, const at::Tensor& t, const char* name, DtypeSet allowed, const char* remedy) {
  TORCH_CHECK(allowed.contains(t.scalar_type()), "npu::", op, ": ", name, " must be ", names(allowed), " on ",
              t.device(), ", got ", t.scalar_type(), remedy);
}

void checkSameDtype(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like,
                    const char* like_name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "npu::", op, ": ", name, " must have ", like_name, "'s dtype ",
              like.scalar_type(), ", got ", t.scalar_type(), " (cast it with .to(", like_name, ".dtype))");
}

at::Tensor emptyLike(const at::Tensor& t) { return at::empty(t.sizes(), t.options()); }

RotaryMode parseRotaryMode(const char* op, std::string_view mode) {
  if (mode == "half") return RotaryMode::Half;
  if (mode == "interleave") return RotaryMode::Interleave;
  if (mode == "quarter") {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "npu::", op, ": rotary_mode 'quarter' (an Ascend 950 mode) is not "
                                "implemented on this npu; use 'half' or 'interleave'");
  }
  TORCH_CHECK_VALUE(false, "npu::", op, ": rotary_mode must be 'half' or 'interleave', got '", mode, "'");
}

// ---- npu_apply_rotary_pos_emb ---------------------------------------------------------------

void checkApplyRotary(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
                      std::string_view layout, std::string_view rotary_mode) {
  constexpr const char* op = "npu_apply_rotary_pos_emb";
  parseRotaryMode(op, rotary_mode);
  const int64_t n_dim = headsDim(op, layout);
  const int64_t rank = layout == "TND" ? 3 : 4;
  checkDtype(op, query, "query", floatingTypes());
  checkSameDtype(op, key, "key", query, "query");
  checkSameDtype(op, cos, "cos", query, "query");
  checkSameDtype(op, sin, "sin", query, "query");
  const std::initializer_list<std::pair<const at::Tensor*, const char*>> all = {
      {&query, "query"}, {&key, "key"}, {&cos, "cos"}, {&sin, "sin"}};
  for (const auto& [t, name] : all) {
    TORCH_CHECK(t->dim() == rank, "npu::", op, ": with layout '", layout, "' ", name, " must have ", rank,
                " dimensions, got shape ", t->sizes());
  }
  const int64_t d = query.size(-1);
  TORCH_CHECK(d > 0 && d % 2 == 0 && d <= 1024, "npu::", op, ": the head dimension D of query (", d,
              ") must be even and at most 1024");
  for (int64_t i = 0; i < rank; ++i) {
    if (i == n_dim) continue;
    TORCH_CHECK(key.size(i) == query.size(i), "npu::", op, ": key ", key.sizes(), " must match query ", query.sizes(),
                " in every dimension but N (dimension ", n_dim, " of layout '", layout, "')");
  }
  TORCH_CHECK(cos.sizes() == sin.sizes(), "npu::", op, ": cos ", cos.sizes(), " and sin ", sin.sizes(),
              " must have the same shape");
  // cos is query's shape with N = 1; the batch dimension may be 1 (broadcast).
  const int64_t b_dim = layout == "SBND" ? 1 : (layout == "TND" ? -1 : 0);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t want = i == n_dim ? 1 : query.size(i);
    const bool ok = cos.size(i) == want || (i == b_dim && cos.size(i) == 1);
    TORCH_CHECK(ok, "npu::", op, ": with layout '", layout, "' cos and sin must have query's shape ", query.sizes(),
                " with N = 1 (and B equal or 1), got ", cos.sizes());
  }
}

// ---- npu_interleave_rope ---------------------------------------------------------------------

void checkInterleaveRope(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  checkDtype(op, x, "x", DtypeSet{at::kHalf, at::kBFloat16},
             " (the Ascend op computes 16-bit types only; cast x, cos and sin with .half() or .bfloat16())");
  checkSameDtype(op, cos, "cos", x, "x");
  checkSameDtype(op, sin, "sin", x, "x");
  TORCH_CHECK(x.dim() == 4 && x.size(3) == 64, "npu::", op, ": x must be [B, N, S, D] with D = 64 (the Ascend ",
              "op's only head dimension), got ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes(), "npu::", op, ": cos ", cos.sizes(), " and sin ", sin.sizes(),
              " must have the same shape");
  TORCH_CHECK(cos.dim() == 4 && cos.size(0) == x.size(0) && cos.size(1) == 1 &&
                  (cos.size(2) == 1 || cos.size(2) == x.size(2)) && cos.size(3) == 64,
              "npu::", op, ": cos and sin must be [B, 1, S or 1, 64] for x ", x.sizes(), ", got ", cos.sizes());
}

// ---- npu_mrope ---------------------------------------------------------------------------------

MropeConfig checkMrope(const char* op, const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                       const at::Tensor& cache, int64_t head_size, at::OptionalIntArrayRef mrope_section,
                       std::optional<c10::string_view> rotary_mode, std::optional<c10::string_view> cache_mode) {
  MropeConfig cfg;
  cfg.mode = parseRotaryMode(op, rotary_mode.value_or("half"));
  const std::string cache_name(cache_mode.value_or("default"));
  TORCH_CHECK_VALUE(cache_name == "default" || cache_name == "interleave", "npu::", op,
                    ": cache_mode must be 'default' or 'interleave', got '", cache_name, "'");
  cfg.cache = cache_name == "interleave" ? CacheMode::Interleave : CacheMode::Default;
  checkDtype(op, query, "query", floatingTypes());
  checkSameDtype(op, key, "key", query, "query");
  checkSameDtype(op, cache, "cos_sin_cache", query, "query");
  checkDtype(op, positions, "positions", DtypeSet{at::kInt, at::kLong});
  TORCH_CHECK(query.dim() == 2 && key.dim() == 2 && query.size(0) == key.size(0), "npu::", op,
              ": query and key must be 2-D [num_tokens, heads * head_size] with the same num_tokens, got ",
              query.sizes(), " and ", key.sizes(), " (flatten the heads with .reshape(num_tokens, -1))");
  TORCH_CHECK(cache.dim() == 2, "npu::", op, ": cos_sin_cache must be 2-D [max_seq_len, rotary_dim], got ",
              cache.sizes());
  cfg.tokens = query.size(0);
  cfg.head_size = head_size;
  cfg.rotary_dim = cache.size(1);
  const int64_t align = query.scalar_type() == at::kFloat ? 16 : 32;
  TORCH_CHECK(head_size > 0 && head_size % align == 0, "npu::", op, ": head_size (", head_size,
              ") must be a positive multiple of ", align, " for ", query.scalar_type());
  TORCH_CHECK(cfg.rotary_dim > 0 && cfg.rotary_dim % align == 0 && cfg.rotary_dim <= head_size, "npu::", op,
              ": rotary_dim (cos_sin_cache's last dimension, ", cfg.rotary_dim, ") must be a multiple of ", align,
              " for ", query.scalar_type(), " and at most head_size ", head_size);
  TORCH_CHECK(query.size(1) % head_size == 0 && key.size(1) % head_size == 0, "npu::", op,
              ": the last dimension of query (", query.size(1), ") and key (", key.size(1),
              ") must be a multiple of head_size ", head_size);
  std::vector<int64_t> sections;
  if (mrope_section.has_value()) sections.assign(mrope_section->begin(), mrope_section->end());
  const bool rope = std::all_of(sections.begin(), sections.end(), [](int64_t s) { return s == 0; });
  if (rope) {
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == cfg.tokens, "npu::", op,
                ": without mrope_section (rope), positions must be 1-D [num_tokens = ", cfg.tokens, "], got ",
                positions.sizes(), " (multimodal rope needs mrope_section, e.g. [16, 24, 24])");
    TORCH_CHECK_VALUE(cfg.cache == CacheMode::Default, "npu::", op,
                      ": cache_mode 'interleave' needs mrope_section (multimodal rope)");
    return cfg;
  }
  TORCH_CHECK_VALUE(sections.size() == 3 || sections.size() == 4, "npu::", op,
                    ": mrope_section must have 3 or 4 entries, got ", sections.size());
  const int64_t total = std::accumulate(sections.begin(), sections.end(), int64_t(0));
  TORCH_CHECK_VALUE(std::all_of(sections.begin(), sections.end(), [](int64_t s) { return s >= 0; }) &&
                        total * 2 == cfg.rotary_dim,
                    "npu::", op, ": the entries of mrope_section must be non-negative and sum to rotary_dim / 2 = ",
                    cfg.rotary_dim / 2, ", got ", at::IntArrayRef(sections));
  TORCH_CHECK(positions.dim() == 2 && positions.size(0) == static_cast<int64_t>(sections.size()) &&
                  positions.size(1) == cfg.tokens,
              "npu::", op, ": with mrope_section of ", sections.size(), " entries positions must be [",
              sections.size(), ", num_tokens = ", cfg.tokens, "], got ", positions.sizes());
  if (cfg.cache == CacheMode::Interleave) {
    // The Ascend op interleaves both the height and the width sections with
    // section[1] (its documented formula), the same as section[2] only when equal.
    TORCH_CHECK_VALUE(sections.size() == 3 && sections[1] == sections[2], "npu::", op,
                      ": cache_mode 'interleave' needs 3 sections with section[1] == section[2] (as Qwen3-VL's "
                      "[24, 20, 20]), got ", at::IntArrayRef(sections));
  }
  cfg.sections = std::move(sections);
  return cfg;
}

// ---- npu_top_k_top_p -------------------------------------------------------------------------------

void checkTopKTopP(const at::Tensor& logits, const std::optional<at::Tensor>& p, const std::optional<at::Tensor>& k) {
  constexpr const char* op = "npu_top_k_top_p";
  checkDtype(op, logits, "logits", floatingTypes());
  TORCH_CHECK(logits.dim() == 2, "npu::", op, ": logits must be 2-D [batch, vocab], got ", logits.sizes());
  if (p.has_value() && p->defined()) {
    checkSameDtype(op, *p, "p", logits, "logits");
    TORCH_CHECK(p->dim() == 1 && p->size(0) == logits.size(0), "npu::", op, ": p must be 1-D [batch = ",
                logits.size(0), "], got ", p->sizes());
  }
  if (k.has_value() && k->defined()) {
    checkDtype(op, *k, "k", DtypeSet{at::kInt}, " (convert it with k.to(torch.int32))");
    TORCH_CHECK(k->dim() == 1 && k->size(0) == logits.size(0), "npu::", op, ": k must be 1-D [batch = ",
                logits.size(0), "], got ", k->sizes());
  }
}

// ---- npu_scaled_masked_softmax --------------------------------------------------------------------

void checkScaledMaskedSoftmax(const char* op, const at::Tensor& x, const at::Tensor& mask, bool fixed_triu_mask) {
  checkDtype(op, x, "x", floatingTypes());
  checkDtype(op, mask, "mask", DtypeSet{at::kBool}, " (make it with mask.bool(); True masks a position out)");
  TORCH_CHECK(x.dim() == 4, "npu::", op, ": x must be 4-D [N, C, H, W], got ", x.sizes());
  for (int64_t d : {2, 3}) {
    TORCH_CHECK(x.size(d) >= 32 && x.size(d) <= 4096 && x.size(d) % 32 == 0, "npu::", op, ": H and W of x ",
                x.sizes(), " must be multiples of 32 in [32, 4096] (the Ascend kernel's limit); pad them");
  }
  // fixed_triu_mask=True: the mask is the causal upper triangle of (H, W) (w > h masked, as
  // MindSpeed's ScaledUpperTriangMaskedSoftmax); the given mask is only checked, not read.
  TORCH_CHECK(mask.dim() <= 4 && at::is_expandable_to(mask.sizes(), x.sizes()), "npu::", op, ": mask ",
              mask.sizes(), " must broadcast to x's shape ", x.sizes());
}

void checkScaledMaskedSoftmaxBackward(const at::Tensor& y_grad, const at::Tensor& y, const at::Tensor& mask,
                                      bool fixed_triu_mask) {
  constexpr const char* op = "npu_scaled_masked_softmax_backward";
  checkScaledMaskedSoftmax(op, y, mask, fixed_triu_mask);
  checkSameDtype(op, y_grad, "y_grad", y, "y");
  TORCH_CHECK(y_grad.sizes() == y.sizes(), "npu::", op, ": y_grad ", y_grad.sizes(), " must have y's shape ",
              y.sizes());
}

// ---- npu_transpose_batchmatmul -------------------------------------------------------------------

TransposeBmm checkTransposeBmm(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& scale, at::OptionalIntArrayRef perm_x1,
                               at::OptionalIntArrayRef perm_x2, at::OptionalIntArrayRef perm_y,
                               std::optional<int64_t> batch_split_factor) {
  constexpr const char* op = "npu_transpose_batchmatmul";
  TransposeBmm t;
  checkDtype(op, input, "input", floatingTypes());
  checkSameDtype(op, weight, "weight", input, "input");
  TORCH_CHECK_NOT_IMPLEMENTED(!bias.has_value() || !bias->defined(), "npu::", op, ": bias is not supported (as on ",
                              "Ascend); add it to the result");
  static constexpr std::array<int64_t, 3> kIdentity = {0, 1, 2}, kSwapFirstTwo = {1, 0, 2};  // the defaults
  const at::IntArrayRef p1 = perm_x1.value_or(at::IntArrayRef(kIdentity));
  const at::IntArrayRef p2 = perm_x2.value_or(at::IntArrayRef(kIdentity));
  const at::IntArrayRef py = perm_y.value_or(at::IntArrayRef(kSwapFirstTwo));
  TORCH_CHECK_VALUE(isPerm(p1, {0, 1, 2}) || isPerm(p1, {1, 0, 2}), "npu::", op,
                    ": perm_x1 must be [0, 1, 2] or [1, 0, 2], got ", p1);
  TORCH_CHECK_VALUE(isPerm(p2, {0, 1, 2}) || isPerm(p2, {0, 2, 1}), "npu::", op,
                    ": perm_x2 must be [0, 1, 2] or [0, 2, 1], got ", p2);
  TORCH_CHECK_VALUE(isPerm(py, {1, 0, 2}), "npu::", op, ": perm_y must be [1, 0, 2], got ", py);
  t.x1_transposed = isPerm(p1, {1, 0, 2});
  t.x2_transposed = isPerm(p2, {0, 2, 1});
  TORCH_CHECK(input.dim() == 3 && weight.dim() == 3, "npu::", op, ": input and weight must be 3-D, got ",
              input.sizes(), " and ", weight.sizes());
  t.batch = input.size(t.x1_transposed ? 1 : 0);
  t.m = input.size(t.x1_transposed ? 0 : 1);
  t.k = input.size(2);
  const int64_t wk = weight.size(t.x2_transposed ? 2 : 1);
  t.n = weight.size(t.x2_transposed ? 1 : 2);
  TORCH_CHECK(weight.size(0) == t.batch && wk == t.k, "npu::", op, ": weight ", weight.sizes(), " must be [B = ",
              t.batch, ", K = ", t.k, ", N]", t.x2_transposed ? " transposed by perm_x2" : "", " for input ",
              input.sizes());
  TORCH_CHECK(t.k % 16 == 0 && t.n % 16 == 0 && t.k < 65536 && t.n < 65536 && t.batch >= 1 && t.batch < 65536,
              "npu::", op, ": K (", t.k, ") and N (", t.n, ") must be multiples of 16 below 65536 and B (", t.batch,
              ") in [1, 65536) (the Ascend kernel's limits)");
  TORCH_CHECK(!t.x1_transposed || t.k * t.batch < 65536, "npu::", op, ": with perm_x1 [1, 0, 2], K * B (",
              t.k * t.batch, ") must be below 65536 (the Ascend kernel's limit)");
  t.split = batch_split_factor.value_or(1);
  const bool quantized = scale.has_value() && scale->defined();
  if (quantized) {
    checkDtype(op, *scale, "scale", DtypeSet{at::kLong, at::kUInt64},
               " (pack float32 scales with torch_npu.npu_trans_quant_param)");
    TORCH_CHECK(scale->dim() == 1 && scale->size(0) == t.batch * t.n, "npu::", op, ": scale must be 1-D [B * N = ",
                t.batch * t.n, "], got ", scale->sizes());
    TORCH_CHECK_VALUE(t.split == 1, "npu::", op, ": batch_split_factor must be 1 with scale, got ", t.split);
    t.out_shape = {t.m, 1, t.batch * t.n};
  } else if (t.split > 1) {
    TORCH_CHECK_VALUE((t.batch * t.n) % t.split == 0, "npu::", op, ": batch_split_factor (", t.split,
                      ") must divide B * N = ", t.batch * t.n);
    t.out_shape = {t.split, t.m, t.batch * t.n / t.split};
  } else {
    TORCH_CHECK_VALUE(t.split == 1, "npu::", op, ": batch_split_factor must be >= 1, got ", t.split);
    t.out_shape = {t.m, t.batch, t.n};
  }
  return t;
}

namespace {

// ---- composite, autograd and meta kernels ----------------------------------------------

using InPlaceRotary = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           c10::string_view, c10::string_view);

const c10::TypedOperatorHandle<InPlaceRotary>& inPlaceRotaryOp() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("npu::npu_apply_rotary_pos_emb_inplace", "")
                                 .typed<InPlaceRotary>();
  return handle;
}

// The public op returns query and key themselves, updated: a composite of the
// in-place op, so functionalization (torch.compile) sees a mutation without aliased results.
std::tuple<at::Tensor, at::Tensor> applyRotaryPosEmb(const at::Tensor& query, const at::Tensor& key,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     c10::string_view layout, c10::string_view rotary_mode) {
  inPlaceRotaryOp().call(query, key, cos, sin, layout, rotary_mode);
  return {query, key};
}

// Autograd for the in-place op: the Ascend op has no backward, so tensors that
// require grad are refused (rather than their graph silently cut); otherwise
// it runs below autograd and bumps the version counters of what it updated.
void applyRotaryInPlaceAutograd(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                                const at::Tensor& sin, c10::string_view layout, c10::string_view rotary_mode) {
  if (at::GradMode::is_enabled()) {
    for (const at::Tensor* t : {&query, &key, &cos, &sin}) {
      TORCH_CHECK(!t->requires_grad(), "npu::npu_apply_rotary_pos_emb updates query and key in place and has no "
                  "backward (as on Ascend); got a tensor that requires grad on ", t->device(), ". For training use "
                  "torch_npu.npu_rotary_mul (differentiable), or call it under torch.no_grad()");
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;  // on to the kernel (or fake tensors, functionalization)
    inPlaceRotaryOp().call(query, key, cos, sin, layout, rotary_mode);
  }
  query.unsafeGetTensorImpl()->bump_version();
  key.unsafeGetTensorImpl()->bump_version();
}

void applyRotaryInPlaceMeta(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
                            const at::Tensor& sin, c10::string_view layout, c10::string_view rotary_mode) {
  checkApplyRotary(query, key, cos, sin, layout, rotary_mode);
}

at::Tensor interleaveRopeMeta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  checkInterleaveRope("npu_interleave_rope", x, cos, sin);
  return emptyLike(x);
}

at::Tensor interleaveRopeBackwardMeta(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin) {
  checkInterleaveRope("npu_interleave_rope_backward", grad, cos, sin);
  return emptyLike(grad);
}

template <const char* kOp>
std::tuple<at::Tensor, at::Tensor> mropeMeta(const at::Tensor& positions, const at::Tensor& query,
                                             const at::Tensor& key, const at::Tensor& cache, int64_t head_size,
                                             at::OptionalIntArrayRef mrope_section,
                                             std::optional<c10::string_view> rotary_mode,
                                             std::optional<c10::string_view> cache_mode) {
  checkMrope(kOp, positions, query, key, cache, head_size, mrope_section, rotary_mode, cache_mode);
  return {emptyLike(query), emptyLike(key)};
}
constexpr char kMropeName[] = "npu_mrope";
constexpr char kMropeBackwardName[] = "npu_mrope_backward";

at::Tensor topKTopPMeta(const at::Tensor& logits, const std::optional<at::Tensor>& p,
                        const std::optional<at::Tensor>& k) {
  checkTopKTopP(logits, p, k);
  return emptyLike(logits);
}

at::Tensor scaledMaskedSoftmaxMeta(const at::Tensor& x, const at::Tensor& mask, const at::Scalar&,
                                   bool fixed_triu_mask) {
  checkScaledMaskedSoftmax("npu_scaled_masked_softmax", x, mask, fixed_triu_mask);
  return emptyLike(x);
}

at::Tensor scaledMaskedSoftmaxBackwardMeta(const at::Tensor& y_grad, const at::Tensor& y, const at::Tensor& mask,
                                           const at::Scalar&, bool fixed_triu_mask) {
  checkScaledMaskedSoftmaxBackward(y_grad, y, mask, fixed_triu_mask);
  return emptyLike(y);
}

at::Tensor transposeBatchMatmulMeta(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scale,
                                    at::OptionalIntArrayRef perm_x1, at::OptionalIntArrayRef perm_x2,
                                    at::OptionalIntArrayRef perm_y, std::optional<int64_t> batch_split_factor) {
  const TransposeBmm t =
      checkTransposeBmm(input, weight, bias, scale, perm_x1, perm_x2, perm_y, batch_split_factor);
  const bool quantized = scale.has_value() && scale->defined();
  return at::empty(t.out_shape, input.options().dtype(quantized ? at::kChar : input.scalar_type()));
}

at::Tensor transposeBatchMatmulCoreMeta(const at::Tensor& input, const at::Tensor& weight,
                                        const std::optional<at::Tensor>& scale, at::IntArrayRef perm_x1,
                                        at::IntArrayRef perm_x2, int64_t batch_split_factor) {
  const std::optional<at::Tensor> no_bias;
  return transposeBatchMatmulMeta(input, weight, no_bias, scale, perm_x1, perm_x2, std::nullopt, batch_split_factor);
}

// The Ascend signature: checks what only it has (bias, perm_y), then the kernel's op.
at::Tensor transposeBatchMatmulPublic(const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scale,
                                      at::OptionalIntArrayRef perm_x1, at::OptionalIntArrayRef perm_x2,
                                      at::OptionalIntArrayRef perm_y, std::optional<int64_t> batch_split_factor) {
  const TransposeBmm t =
      checkTransposeBmm(input, weight, bias, scale, perm_x1, perm_x2, perm_y, batch_split_factor);
  static const auto core = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("npu::npu_transpose_batchmatmul_core", "")
                               .typed<decltype(transposeBatchMatmulCore)>();
  const std::array<int64_t, 3> p1 = t.x1_transposed ? std::array<int64_t, 3>{1, 0, 2} : std::array<int64_t, 3>{0, 1, 2};
  const std::array<int64_t, 3> p2 = t.x2_transposed ? std::array<int64_t, 3>{0, 2, 1} : std::array<int64_t, 3>{0, 1, 2};
  return core.call(input, weight, scale, p1, p2, t.split);
}

}  // namespace

}  // namespace npu::ops::position

namespace npu::ops {

TORCH_LIBRARY_FRAGMENT(npu, m) {
  // Updates query and key in place and returns them (the Ascend op's contract).
  m.def("npu_apply_rotary_pos_emb(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, str layout='BSH', "
        "str rotary_mode='half') -> (Tensor(a!), Tensor(b!))");
  // Its kernel: a mutation without results, which torch.compile functionalizes.
  m.def("npu_apply_rotary_pos_emb_inplace(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, str layout, "
        "str rotary_mode) -> ()");
  m.def("npu_mrope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, *, "
        "int[]? mrope_section=None, str? rotary_mode='half', str? cache_mode='default') -> (Tensor, Tensor)");
  m.def("npu_mrope_backward(Tensor positions, Tensor grad_query, Tensor grad_key, Tensor cos_sin_cache, "
        "int head_size, *, int[]? mrope_section=None, str? rotary_mode='half', str? cache_mode='default') -> "
        "(Tensor, Tensor)");
  m.def("npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("npu_interleave_rope_backward(Tensor grad, Tensor cos, Tensor sin) -> Tensor");
  m.def("npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor");
  m.def("npu_scaled_masked_softmax(Tensor x, Tensor mask, Scalar scale=1, bool fixed_triu_mask=False) -> Tensor");
  m.def("npu_scaled_masked_softmax_backward(Tensor y_grad, Tensor y, Tensor mask, Scalar scale, "
        "bool fixed_triu_mask) -> Tensor");
  m.def("npu_transpose_batchmatmul(Tensor input, Tensor weight, *, Tensor? bias=None, Tensor? scale=None, "
        "int[]? perm_x1=None, int[]? perm_x2=None, int[]? perm_y=None, int? batch_split_factor=1) -> Tensor");
  m.def("npu_transpose_batchmatmul_core(Tensor input, Tensor weight, Tensor? scale, int[] perm_x1, int[] perm_x2, "
        "int batch_split_factor) -> Tensor");
  m.impl("npu_apply_rotary_pos_emb", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(position::applyRotaryPosEmb));
  m.impl("npu_transpose_batchmatmul", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(position::transposeBatchMatmulPublic));
  m.impl("npu_apply_rotary_pos_emb_inplace", c10::DispatchKey::Autograd, TORCH_FN(position::applyRotaryInPlaceAutograd));
}

void registerPositionKernels(torch::Library& m) {
  m.impl("npu_apply_rotary_pos_emb_inplace", TORCH_FN(position::applyRotaryInPlace));
  m.impl("npu_mrope", TORCH_FN(position::mrope));
  m.impl("npu_mrope_backward", TORCH_FN(position::mropeBackward));
  m.impl("npu_interleave_rope", TORCH_FN(position::interleaveRope));
  m.impl("npu_interleave_rope_backward", TORCH_FN(position::interleaveRopeBackward));
  m.impl("npu_top_k_top_p", TORCH_FN(position::topKTopP));
  m.impl("npu_scaled_masked_softmax", TORCH_FN(position::scaledMaskedSoftmax));
  m.impl("npu_scaled_masked_softmax_backward", TORCH_FN(position::scaledMaskedSoftmaxBackward));
  m.impl("npu_transpose_batchmatmul_core", TORCH_FN(position::transposeBatchMatmulCore));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerPositionKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_apply_rotary_pos_emb_inplace", TORCH_FN(position::applyRotaryInPlaceMeta));
  m.impl("npu_mrope", TORCH_FN(position::mropeMeta<position::kMropeName>));
  m.impl("npu_mrope_backward", TORCH_FN(position::mropeMeta<position::kMropeBackwardName>));
  m.impl("npu_interleave_rope", TORCH_FN(position::interleaveRopeMeta));
  m.impl("npu_interleave_rope_backward", TORCH_FN(position::interleaveRopeBackwardMeta));
  m.impl("npu_top_k_top_p", TORCH_FN(position::topKTopPMeta));
  m.impl("npu_scaled_masked_softmax", TORCH_FN(position::scaledMaskedSoftmaxMeta));
  m.impl("npu_scaled_masked_softmax_backward", TORCH_FN(position::scaledMaskedSoftmaxBackwardMeta));
  m.impl("npu_transpose_batchmatmul_core", TORCH_FN(position::transposeBatchMatmulCoreMeta));
}

}  // namespace npu::ops
