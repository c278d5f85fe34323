// The positional and sampling ops of torch_npu.ops.position (npu_apply_rotary_pos_emb,
// npu_mrope, npu_interleave_rope, npu_top_k_top_p, npu_scaled_masked_softmax,
// npu_transpose_batchmatmul): what their definitions (position.cpp: checks,
// meta kernels, registration) and their host kernels
// (ops/host/fused/position_kernels.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "../host/dtypes.h"

namespace npu::ops::position {

// ---- checks and result shapes (position.cpp) ------------------------------------------

void checkDtype(const char* op, const at::Tensor& t, const char* name, DtypeSet allowed, const char* remedy = "");
void checkSameDtype(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like,
                    const char* like_name);
at::Tensor emptyLike(const at::Tensor& t);

enum class RotaryMode { Half, Interleave };
RotaryMode parseRotaryMode(const char* op, std::string_view mode);

void checkApplyRotary(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
                      std::string_view layout, std::string_view rotary_mode);
void checkInterleaveRope(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

enum class CacheMode { Default, Interleave };
struct MropeConfig {
  int64_t head_size = 0, rotary_dim = 0, tokens = 0;
  std::vector<int64_t> sections;  // empty: plain rope (positions 1-D)
  RotaryMode mode = RotaryMode::Half;
  CacheMode cache = CacheMode::Default;
};
MropeConfig checkMrope(const char* op, const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                       const at::Tensor& cache, int64_t head_size, at::OptionalIntArrayRef mrope_section,
                       std::optional<c10::string_view> rotary_mode, std::optional<c10::string_view> cache_mode);

constexpr int64_t kMaxTopK = 1024;  // the Ascend op's largest k
void checkTopKTopP(const at::Tensor& logits, const std::optional<at::Tensor>& p, const std::optional<at::Tensor>& k);

void checkScaledMaskedSoftmax(const char* op, const at::Tensor& x, const at::Tensor& mask, bool fixed_triu_mask);
void checkScaledMaskedSoftmaxBackward(const at::Tensor& y_grad, const at::Tensor& y, const at::Tensor& mask,
                                      bool fixed_triu_mask);

struct TransposeBmm {
  bool x1_transposed = false;  // input is [M, B, K] (perm_x1 [1, 0, 2]) rather than [B, M, K]
  bool x2_transposed = false;  // weight is [B, N, K] (perm_x2 [0, 2, 1]) rather than [B, K, N]
  int64_t batch = 0, m = 0, k = 0, n = 0, split = 1;
  std::vector<int64_t> out_shape;
};
TransposeBmm checkTransposeBmm(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& scale, at::OptionalIntArrayRef perm_x1,
                               at::OptionalIntArrayRef perm_x2, at::OptionalIntArrayRef perm_y,
                               std::optional<int64_t> batch_split_factor);

// ---- host kernels (ops/host/fused/position_kernels.cpp) -------------------------------
// The npu and cpu kernels, with the ops' signatures; each checks its arguments first.

// Rotates the rows of `query` and `key` in place.
void applyRotaryInPlace(const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
                        c10::string_view layout, c10::string_view rotary_mode);
std::tuple<at::Tensor, at::Tensor> mrope(const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& cache, int64_t head_size,
                                         at::OptionalIntArrayRef mrope_section,
                                         std::optional<c10::string_view> rotary_mode,
                                         std::optional<c10::string_view> cache_mode);
std::tuple<at::Tensor, at::Tensor> mropeBackward(const at::Tensor& positions, const at::Tensor& grad_query,
                                                 const at::Tensor& grad_key, const at::Tensor& cache,
                                                 int64_t head_size, at::OptionalIntArrayRef mrope_section,
                                                 std::optional<c10::string_view> rotary_mode,
                                                 std::optional<c10::string_view> cache_mode);
at::Tensor interleaveRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor interleaveRopeBackward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor topKTopP(const at::Tensor& logits, const std::optional<at::Tensor>& p, const std::optional<at::Tensor>& k);
at::Tensor scaledMaskedSoftmax(const at::Tensor& x, const at::Tensor& mask, const at::Scalar& scale,
                               bool fixed_triu_mask);
at::Tensor scaledMaskedSoftmaxBackward(const at::Tensor& y_grad, const at::Tensor& y, const at::Tensor& mask,
                                       const at::Scalar& scale, bool fixed_triu_mask);
// npu_transpose_batchmatmul_core: positional tensors, the permutations resolved.
at::Tensor transposeBatchMatmulCore(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& scale, at::IntArrayRef perm_x1,
                                    at::IntArrayRef perm_x2, int64_t batch_split_factor);

}  // namespace npu::ops::position
