// The mixture-of-experts and int8 quantization ops of torch_npu.ops.moe_quant
// (npu_moe_gating_top_k_softmax, npu_moe_init_routing_v2, npu_grouped_matmul,
// npu_moe_token_unpermute, npu_dynamic_quant, npu_quant_matmul,
// npu_trans_quant_param, npu_convert_weight_to_int4pack): what their definitions
// (moe_quant.cpp: checks, result shapes, meta kernels, registration) and their
// host kernels (ops/host/fused/moe_quant_kernels.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "common.h"  // valueOr

namespace npu::ops::moe_quant {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using OptTensorList = std::optional<at::TensorList>;


// ---- checks and result shapes (moe_quant.cpp) -----------------------------------------

// `sizes` with the last dimension `last`.
std::vector<int64_t> withLast(at::IntArrayRef sizes, int64_t last);

void checkGating(const char* op, const Tensor& x, const Tensor& finished, int64_t k);
void checkGatingBackward(const char* op, const Tensor& grad, const Tensor& x, int64_t k);

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
                         at::IntArrayRef active_expert_range, int64_t row_idx_type);
// The results' shapes and dtypes, for the kernel and its meta kernel alike.
std::tuple<Tensor, Tensor, Tensor, Tensor> emptyRouting(const RoutingArgs& a, const Tensor& x, int64_t expert_num,
                                                        int64_t tokens_num_type, bool tokens_num_flag);

enum class GmmKind { Float, Int8, WeightOnly };

// The arguments of both npu_grouped_matmul overloads, checked, and the results' shapes.
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

  // Checks every argument and sets `kind`, `single_weight` and `experts`.
  void check();
  void checkDtypes();
  // Per-weight parameter of n values: one tensor per weight of shape [n] (or [1] for
  // a per-tensor scale), or for a single 3-d weight one tensor [experts, n] / [experts, 1] / [experts].
  void checkPerExpert(const std::vector<Tensor>& l, const char* name, bool allow_one = true) const;
  void checkShapes();
  void checkGroupList(int64_t groups) const;
  std::vector<std::vector<int64_t>> outputShapes() const;
  std::vector<Tensor> emptyOutputs(const at::TensorOptions& options) const;
};

int64_t checkUnpermute(const char* op, const Tensor& permuted, const Tensor& sorted_indices, const Tensor& probs,
                       bool padded_mode);
int64_t checkUnpermuteGrad(const Tensor& permuted, const Tensor& grad, const Tensor& sorted_indices,
                           const Tensor& probs, bool padded_mode);

struct QuantArgs {
  at::ScalarType dst = at::kChar;  // int8, or quint4x2 (int4 packed in int32)
  bool per_tensor = false;
};
QuantArgs checkDynamicQuant(const Tensor& x, const Tensor& smooth, const Tensor& group_index,
                            std::optional<int64_t> dst_type, c10::string_view quant_mode, double dst_type_max);
std::tuple<Tensor, Tensor> emptyDynamicQuant(const Tensor& x, const QuantArgs& q);

struct QmmArgs {
  bool int4 = false;
  bool x2_transposed = false;  // int4: x2 given as the (k/8, n) transpose of an (n, k/8) tensor
  at::ScalarType out = at::kChar;
  std::vector<int64_t> shape;  // the result's
};
QmmArgs checkQuantMatmul(const Tensor& x1, const Tensor& x2, const Tensor& scale, const Tensor& offset,
                         const Tensor& pertoken, const Tensor& bias, std::optional<int64_t> output_dtype,
                         const std::string& extra_dtypes, at::OptionalIntArrayRef group_sizes,
                         const Tensor& y_scale);
// "x1_dtype=torch_npu.hifloat8 (290), ..." for the arguments given ("" when none): what a refusal names.
std::string givenDtypes(std::initializer_list<std::pair<const char*, std::optional<int64_t>>> args);

// -> the result's shape.
std::vector<int64_t> checkTransQuantParam(const Tensor& scale, const Tensor& offset, std::optional<int64_t> mode);

void checkInt4Pack(const Tensor& weight, int64_t inner_k_tiles);
Tensor emptyInt4Pack(const Tensor& weight);

// ---- host kernels (ops/host/fused/moe_quant_kernels.cpp) ------------------------------
// The npu and cpu kernels, with the ops' signatures (npu_grouped_matmul: its checked
// arguments); each checks its arguments first.

std::tuple<Tensor, Tensor, Tensor> gatingTopKSoftmax(const Tensor& x, const OptTensor& finished_opt, int64_t k);
Tensor gatingTopKSoftmaxBackward(const Tensor& grad, const Tensor& x, int64_t k);
std::tuple<Tensor, Tensor, Tensor, Tensor> initRoutingV2(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale_opt, const OptTensor& offset_opt,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t tokens_num_type,
    bool tokens_num_flag, int64_t quant_mode, at::IntArrayRef active_expert_range, int64_t row_idx_type);
std::vector<Tensor> groupedMatmul(Gmm& g);
Tensor tokenUnpermute(const Tensor& permuted, const Tensor& sorted_indices, const OptTensor& probs_opt,
                      bool padded_mode, at::OptionalIntArrayRef restore_shape);
std::tuple<Tensor, Tensor> tokenUnpermuteGrad(const Tensor& permuted, const Tensor& grad, const Tensor& sorted_indices,
                                              const OptTensor& probs_opt, bool padded_mode,
                                              at::OptionalIntArrayRef restore_shape);
std::tuple<Tensor, Tensor> dynamicQuant(const Tensor& x, const OptTensor& smooth_opt, const OptTensor& group_opt,
                                        std::optional<int64_t> dst_type, c10::string_view quant_mode,
                                        double dst_type_max);
Tensor quantMatmul(const Tensor& x1, const Tensor& x2, const Tensor& scale, const OptTensor& offset_opt,
                   const OptTensor& pertoken_opt, const OptTensor& bias_opt, std::optional<int64_t> output_dtype,
                   std::optional<int64_t> x1_dtype, std::optional<int64_t> x2_dtype,
                   std::optional<int64_t> pertoken_scale_dtype, std::optional<int64_t> scale_dtype,
                   at::OptionalIntArrayRef group_sizes, const OptTensor& y_scale);
Tensor transQuantParam(const Tensor& scale, const OptTensor& offset_opt, std::optional<int64_t> round_mode);
Tensor convertWeightToInt4Pack(const Tensor& weight, int64_t inner_k_tiles);

}  // namespace npu::ops::moe_quant
