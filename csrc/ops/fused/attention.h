// The attention ops of torch_npu.ops.attention (npu_prompt_flash_attention,
// npu_incre_flash_attention, npu_fused_infer_attention_score (+ _v2),
// npu_fusion_attention_grad, npu_scatter_pa_kv_cache / npu_gather_pa_kv_cache):
// what their definitions (attention.cpp: argument parsing and checks, shapes,
// meta kernels, registration) and their host kernels
// (ops/host/fused/attention_kernels.cpp) share: the parsed request, its shapes,
// and the kernels' entry points.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace npu::ops::attention {

constexpr int64_t kNoBand = 2147483647;

enum class Layout { BSH, SBH, BSND, BNSD, TND };

// Everything an attention call asks, as the ops' arguments give it.
struct Request {
  const char* op = "";
  at::Tensor q, k, v;             // k, v: the cache blocks when `block_table` is given
  Layout in = Layout::BSH, out = Layout::BSH;
  int64_t heads = 1, kvHeads = 0;  // kvHeads 0: as many as query heads
  bool headsFromShape = false;     // FA: 4-D layouts take the head counts from the shapes
  double scale = 1.0;
  int64_t pre = kNoBand, next = kNoBand, sparse = 0;
  bool bandWithoutMask = false;    // FA: sparse mode 0 bands even without atten_mask
  bool decodeMaskShapes = false;   // IFA/FIA with one query: atten_mask may be (B, KV_S)
  at::Tensor mask, pse;
  std::optional<std::vector<int64_t>> qLens, kvLens;  // actual lengths (TND: cumulative ends)
  int64_t qLensCount = -1, kvLensCount = -1;          // their lengths (meta kernels too)
  at::Tensor blockTable;
  int64_t blockSize = 0;
  bool wantLse = false;
  at::Tensor sink;  // learnable_sink: one logit per query head, in every row's softmax
};

// The shapes of a request (no data is read: meta kernels use it too).
struct Geometry {
  int64_t B = 0, N = 0, KVN = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  bool paged = false, headMajorCache = false;  // cache [blocks, KVN, block_size, D] (else [blocks, block_size, H])
  std::vector<int64_t> outShape, lseShape;
};

// Checks a request's shapes and gives its geometry (attention.cpp); FA's 4-D layouts
// set r.heads from the shapes.
Geometry describe(Request& r);

enum class CacheMode { Norm, Nz };

// The cache layouts: Norm [blocks, block_size, heads, head_size]; PA_NZ [blocks,
// heads * head_size / last, block_size, last] (the token's row cut into `last`-wide pieces).
struct CacheShape {
  CacheMode mode;
  int64_t blocks = 0, blockSize = 0, width = 0, last = 0;  // width: heads * head_size of one token
};

// ---- host kernels (ops/host/fused/attention_kernels.cpp) ------------------------------
// Called with checked arguments; they check what only the data shows (actual lengths,
// block tables, slots, the broadcast of pse).

// The forward: out (zero where a row sees no key) and lse [B, N, Sq] / [T, N] (-inf there).
std::tuple<at::Tensor, at::Tensor> attentionForward(Request& r);
// npu_fusion_attention_grad: (dq, dk, dv, dpse, an empty dsink); softmax_max, softmax_sum
// and attention_in may be undefined (then recomputed).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusionAttentionGrad(
    const Request& r, const Geometry& g, const at::Tensor& dy, const at::Tensor& maxIn, const at::Tensor& sumIn,
    const at::Tensor& outIn);
// Writes each token's key and value to its slot of the caches (negative slots: padding).
void scatterPaKvCache(const char* name, const at::Tensor& key, const at::Tensor& value, const at::Tensor& keyCache,
                      const at::Tensor& valueCache, const at::Tensor& slots, const CacheShape& kc,
                      const CacheShape& vc);
// Reads the sequences of block_tables back into key and value, one after another.
void gatherPaKvCache(const char* name, const at::Tensor& keyCache, const at::Tensor& valueCache,
                     const at::Tensor& tables, const at::Tensor& seqLens, const at::Tensor& key,
                     const at::Tensor& value, const at::Tensor& seqOffset, bool cumsum, const CacheShape& kc,
                     const CacheShape& vc);

}  // namespace npu::ops::attention
