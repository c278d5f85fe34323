// The LLM-serving ops of torch_npu.ops.inference (npu_weight_quant_batchmatmul,
// npu_dynamic_mx_quant, npu_kv_rmsnorm_rope_cache, npu_scatter_nd_update(_),
// atb::_npu_paged_attention (+ _get_workspace), npu_attention_update,
// npu_moe_finalize_routing, npu_mla_prolog_v2 / v3 (+ v3_functional)): what their
// definitions (inference.cpp: checks, result shapes, meta kernels, registration)
// and their host kernels (ops/host/fused/inference_kernels.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "common.h"  // valueOr

namespace npu::ops::inference {

using at::Tensor;
using OptTensor = std::optional<Tensor>;


// ---- checks and result shapes (inference.cpp) ---------------------------------------------

// npu_weight_quant_batchmatmul: y = x @ ((weight + antiquant_offset) * antiquant_scale) (+ bias),
// optionally requantized to int8 with quant_scale / quant_offset.
struct WqbmmArgs {
  int64_t m = 0, k = 0, n = 0;
  bool int4 = false;             // int32 weight holding eight int4 values per element
  bool int4_transposed = false;  // int4 weight given as the (k/8, n) transpose of an (n, k/8) packing
  int64_t group = 0;             // antiquant_group_size (0: per tensor or per channel)
  bool int64_scale = false;      // antiquant_scale from npu_trans_quant_param (float bits in int64)
  at::ScalarType out = at::kHalf;
};
WqbmmArgs checkWeightQuantBatchmatmul(const Tensor& x, const Tensor& weight, const Tensor& antiquant_scale,
                                      const Tensor& antiquant_offset, const Tensor& quant_scale,
                                      const Tensor& quant_offset, const Tensor& bias, int64_t antiquant_group_size,
                                      int64_t inner_precise, std::optional<int64_t> weight_dtype);

// npu_dynamic_mx_quant: the OCP microscaling formats.
enum class MxRound { Rint, Round, Floor };
struct MxArgs {
  int64_t axis = -1;          // non-negative
  at::ScalarType dst = at::ScalarType::Float4_e2m1fn_x2;
  int64_t emax = 2;           // the element format's largest exponent
  double max_normal = 6.0;    // its largest value
  int64_t block = 32;
  MxRound round = MxRound::Rint;
  std::vector<int64_t> y_shape, scale_shape;
};
MxArgs checkDynamicMxQuant(const Tensor& input, int64_t axis, c10::string_view round_mode, int64_t dst_type,
                           int64_t block_size, std::optional<int64_t> scale_alg, double dst_type_max,
                           double max_low_bound);

// npu_kv_rmsnorm_rope_cache: the cache layouts of cache_mode.
enum class KvCacheMode { Norm, PA, PA_BNSD, PA_NZ };
struct KvRopeArgs {
  KvCacheMode mode = KvCacheMode::Norm;
  int64_t B = 0, N = 0, S = 0, Dk = 0, Dv = 0;
};
KvRopeArgs checkKvRmsnormRopeCache(const Tensor& kv, const Tensor& gamma, const Tensor& cos, const Tensor& sin,
                                   const Tensor& index, const Tensor& k_cache, const Tensor& ckv_cache,
                                   const Tensor& k_rope_scale, const Tensor& c_kv_scale, const Tensor& k_rope_offset,
                                   const Tensor& c_kv_offset, const Tensor& v, c10::string_view cache_mode);

// npu_scatter_nd_update(_): -> the index depth (indices.size(-1)).
int64_t checkScatterNdUpdate(const char* op, const Tensor& self, const Tensor& indices, const Tensor& updates);

// atb::_npu_paged_attention: -> the query heads per kv head.
int64_t checkPagedAttention(const char* op, const Tensor& query, const Tensor& key_cache, const Tensor& value_cache,
                            int64_t num_kv_heads, int64_t num_heads, const Tensor& block_table,
                            const Tensor& context_lens, const Tensor& out);

void checkAttentionUpdate(at::TensorList lse, at::TensorList local_out, int64_t update_type);

// npu_moe_finalize_routing: -> (rows, k).
std::tuple<int64_t, int64_t> checkMoeFinalizeRouting(const Tensor& expanded, const Tensor& skip1, const Tensor& skip2,
                                                     const Tensor& bias, const Tensor& scales,
                                                     const Tensor& src_to_dst, const Tensor& export_for_source_row,
                                                     std::optional<int64_t> drop_pad_mode, std::optional<int64_t> k);

// npu_mla_prolog_v2 / v3: the float (unquantized) MLA preprocessing.
struct MlaArgs {
  const char* op = "npu_mla_prolog_v3";
  int64_t T = 0, He = 0, Hcq = 0, N = 0, D = 0, Dr = 0, Hckv = 0;
  std::vector<int64_t> lead;  // token_x's leading dims: (T) or (B, S)
  bool query_norm = false;
};
struct MlaOptions {  // the quantization and tuning arguments, all of which must be at their defaults
  std::vector<std::pair<const char*, bool>> given;  // (name, given)
  int64_t weight_quant_mode = 0, kv_cache_quant_mode = 0, query_quant_mode = 0, ckvkr_repo_mode = 0,
          quant_scale_repo_mode = 0;
  double qc_qr_scale = 1.0, kc_scale = 1.0;
};
MlaArgs checkMlaProlog(const char* op, const Tensor& token_x, const Tensor& weight_dq, const Tensor& weight_uq_qr,
                       const Tensor& weight_uk, const Tensor& weight_dkv_kr, const Tensor& gamma_cq,
                       const Tensor& gamma_ckv, const Tensor& rope_sin, const Tensor& rope_cos,
                       const Tensor& kv_cache, const Tensor& kr_cache, const Tensor& cache_index,
                       c10::string_view cache_mode, bool query_norm_flag, const MlaOptions& options);
// (query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm), empty.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> emptyMlaProlog(const MlaArgs& a, const Tensor& token_x,
                                                                  const Tensor& rope_sin);

// Whether the active chip profile has Ascend 950's MX formats; refuses by name otherwise.
void checkMxChip(const char* op, c10::Device device);

// ---- host kernels (ops/host/fused/inference_kernels.cpp) ----------------------------------
// Each checks its arguments first.

Tensor weightQuantBatchmatmul(const Tensor& x, const Tensor& weight, const Tensor& antiquant_scale,
                              const OptTensor& antiquant_offset, const OptTensor& quant_scale,
                              const OptTensor& quant_offset, const OptTensor& bias, int64_t antiquant_group_size,
                              int64_t inner_precise, std::optional<int64_t> weight_dtype);
std::tuple<Tensor, Tensor> dynamicMxQuant(const Tensor& input, int64_t axis, c10::string_view round_mode,
                                          int64_t dst_type, int64_t block_size, std::optional<int64_t> scale_alg,
                                          double dst_type_max, double max_low_bound);
// Writes the caches in place; -> (k_rope, c_kv).
std::tuple<Tensor, Tensor> kvRmsnormRopeCacheInplace(const Tensor& kv, const Tensor& gamma, const Tensor& cos,
                                                     const Tensor& sin, const Tensor& index, const Tensor& k_cache,
                                                     const Tensor& ckv_cache, const OptTensor& k_rope_scale,
                                                     const OptTensor& c_kv_scale, const OptTensor& k_rope_offset,
                                                     const OptTensor& c_kv_offset, const OptTensor& v,
                                                     double epsilon, c10::string_view cache_mode, bool is_output_kv);
Tensor scatterNdUpdate(const Tensor& self, const Tensor& indices, const Tensor& updates);
void scatterNdUpdateInplace(const Tensor& self, const Tensor& indices, const Tensor& updates);
void pagedAttention(const Tensor& query, const Tensor& key_cache, const Tensor& value_cache, int64_t num_kv_heads,
                    int64_t num_heads, double scale_value, const Tensor& block_table, const Tensor& context_lens,
                    const Tensor& out, const OptTensor& workspace);
std::tuple<Tensor, Tensor> attentionUpdate(at::TensorList lse, at::TensorList local_out, int64_t update_type);
Tensor moeFinalizeRouting(const Tensor& expanded, const OptTensor& skip1, const OptTensor& skip2,
                          const OptTensor& bias, const OptTensor& scales, const Tensor& src_to_dst,
                          const OptTensor& export_for_source_row, std::optional<int64_t> drop_pad_mode,
                          std::optional<int64_t> k);
// The MLA prolog with checked arguments: writes the caches (when cache_index is defined).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> mlaProlog(const MlaArgs& a, const Tensor& token_x,
                                                             const Tensor& weight_dq, const Tensor& weight_uq_qr,
                                                             const Tensor& weight_uk, const Tensor& weight_dkv_kr,
                                                             const Tensor& gamma_cq, const Tensor& gamma_ckv,
                                                             const Tensor& rope_sin, const Tensor& rope_cos,
                                                             const Tensor& kv_cache, const Tensor& kr_cache,
                                                             const Tensor& cache_index, double eps_cq,
                                                             double eps_ckv);

}  // namespace npu::ops::inference
