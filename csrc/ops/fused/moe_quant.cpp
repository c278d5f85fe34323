// The mixture-of-experts and int8 quantization ops of torch_npu.ops.moe_quant,
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
// Here: their schemas, argument checks and result shapes, meta kernels (same
// checks, shapes fixed by the arguments, never by the data) that let
// torch.compile trace them, and the registration of the host kernels
// (ops/host/fused/moe_quant_kernels.cpp) for npu and cpu tensors. Autograd is
// registered from Python (torch_npu/ops/moe_quant.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "custom_dtype.h"
#include "moe_quant.h"

namespace npu::ops::moe_quant {
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
    case at::kQUInt4x2: return "quint4x2";
    default: return c10::toString(t);
  }
}

bool isFloat16Or32(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Ascend passes dtypes as ints (a torch.dtype converts, or one of torch_npu's codes, ACL's + 256):
// validate and convert (custom_dtype.h; a code without a torch dtype is refused by name).
at::ScalarType dtypeFromInt(const char* op, c10::Device device, int64_t value, const char* name) {
  return custom_dtype::scalarTypeArg(op, device, value, name);
}

std::vector<Tensor> listOf(const OptTensorList& l) {
  return l.has_value() ? std::vector<Tensor>(l->begin(), l->end()) : std::vector<Tensor>();
}

}  // namespace

std::string givenDtypes(std::initializer_list<std::pair<const char*, std::optional<int64_t>>> args) {
  std::string given;
  for (const auto& [name, value] : args) {
    if (!value.has_value()) continue;
    given += (given.empty() ? "" : ", ") + std::string(name) + "=" + custom_dtype::describe(*value);
  }
  return given;
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

void checkGatingBackward(const char* op, const Tensor& grad, const Tensor& x, int64_t k) {
  checkGating(op, x, Tensor(), k);
  NPU_OP_CHECK(grad.sizes() == c10::IntArrayRef(withLast(x.sizes(), k)) && grad.scalar_type() == x.scalar_type(), op,
               x.device(), "grad_y must be x's shape with k last and x's dtype, got ", grad.sizes(), " ",
               dtypeName(grad.scalar_type()));
}

// ---- npu_moe_init_routing_v2 -----------------------------------------------------------

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

// ---- npu_grouped_matmul ----------------------------------------------------------------

void Gmm::check() {
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

void Gmm::checkDtypes() {
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

void Gmm::checkPerExpert(const std::vector<Tensor>& l, const char* name, bool allow_one) const {
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

void Gmm::checkShapes() {
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

void Gmm::checkGroupList(int64_t groups) const {
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

std::vector<std::vector<int64_t>> Gmm::outputShapes() const {
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

std::vector<Tensor> Gmm::emptyOutputs(const at::TensorOptions& options) const {
  std::vector<Tensor> out;
  for (const auto& s : outputShapes()) out.push_back(at::empty(s, options.dtype(out_dtype)));
  return out;
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

int64_t checkUnpermuteGrad(const Tensor& permuted, const Tensor& grad, const Tensor& sorted_indices,
                           const Tensor& probs, bool padded_mode) {
  constexpr const char* op = "npu_moe_token_unpermute_grad";
  const int64_t topk = checkUnpermute(op, permuted, sorted_indices, probs, padded_mode);
  const auto dev = permuted.device();
  NPU_OP_CHECK(grad.dim() == 2 && grad.size(0) * topk == sorted_indices.numel() && grad.size(1) == permuted.size(1) &&
                   grad.scalar_type() == permuted.scalar_type(),
               op, dev, "grad_unpermuted_tokens must be [", sorted_indices.numel() / topk, ", ", permuted.size(1),
               "] of permuted_tokens' dtype, got ", grad.sizes(), " ", dtypeName(grad.scalar_type()));
  return topk;
}

// ---- npu_dynamic_quant ------------------------------------------------------------------

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

// ---- npu_quant_matmul -------------------------------------------------------------------

QmmArgs checkQuantMatmul(const Tensor& x1, const Tensor& x2, const Tensor& scale, const Tensor& offset,
                         const Tensor& pertoken, const Tensor& bias, std::optional<int64_t> output_dtype,
                         const std::string& extra_dtypes, at::OptionalIntArrayRef group_sizes,
                         const Tensor& y_scale) {
  constexpr const char* op = "npu_quant_matmul";
  const auto dev = x1.device();
  QmmArgs a;
  NPU_OP_CHECK(extra_dtypes.empty(), op, dev, extra_dtypes, ": x1_dtype, x2_dtype, pertoken_scale_dtype and scale_dtype "
               "reinterpret the data as float8/float4/hifloat8 (MX quantization on Ascend 950), which this npu's kernels "
               "do not take; leave them None");
  NPU_OP_CHECK(!y_scale.defined(), op, dev, "y_scale is for float8/float4/hifloat8 results, which this npu's kernels do "
               "not produce; leave it None");
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

namespace {

// ---- npu_grouped_matmul's two overloads: parsed, then checked and run -------------------

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

// The Tensor overload's arguments.
Gmm gmmOfTensors(at::TensorList x, at::TensorList weight, const OptTensorList& bias, const OptTensorList& scale,
                 const OptTensorList& offset, const OptTensorList& antiquant_scale,
                 const OptTensorList& antiquant_offset, const OptTensorList& per_token_scale,
                 const OptTensor& group_list, const OptTensorList& activation_input,
                 const OptTensorList& activation_quant_scale, const OptTensorList& activation_quant_offset,
                 std::optional<int64_t> split_item, std::optional<int64_t> group_type,
                 std::optional<int64_t> group_list_type, std::optional<int64_t> act_type,
                 at::OptionalIntArrayRef tuning_config, std::optional<int64_t> output_dtype,
                 std::optional<int64_t> x_dtype, std::optional<int64_t> weight_dtype,
                 std::optional<int64_t> scale_dtype, std::optional<int64_t> per_token_scale_dtype) {
  const c10::Device device = x.empty() ? c10::Device(at::kCPU) : x[0].device();
  const std::string given = givenDtypes({{"x_dtype", x_dtype}, {"weight_dtype", weight_dtype},
                                        {"scale_dtype", scale_dtype}, {"per_token_scale_dtype", per_token_scale_dtype}});
  NPU_OP_CHECK(given.empty(), Gmm::op, device, given, ": x_dtype, weight_dtype, scale_dtype and per_token_scale_dtype "
               "reinterpret the data as hifloat8/float4/float8_e8m0fnu (Ascend 950), which this npu's kernels do not "
               "take; leave them None");
  std::optional<at::ScalarType> out;
  if (output_dtype.has_value()) out = dtypeFromInt(Gmm::op, device, *output_dtype, "output_dtype");
  Gmm g = parseGmm(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
                   activation_quant_scale, activation_quant_offset, split_item, group_type, group_list_type, act_type,
                   out);
  g.group_tensor = valueOr(group_list);
  resolveGroupType(g, group_type);
  (void)tuning_config;  // a tiling hint for the chip
  return g;
}

// The List overload's (group_list as ints).
Gmm gmmOfList(at::TensorList x, at::TensorList weight, const OptTensorList& bias, const OptTensorList& scale,
              const OptTensorList& offset, const OptTensorList& antiquant_scale, const OptTensorList& antiquant_offset,
              const OptTensorList& per_token_scale, at::OptionalIntArrayRef group_list,
              const OptTensorList& activation_input, const OptTensorList& activation_quant_scale,
              const OptTensorList& activation_quant_offset, std::optional<int64_t> split_item,
              std::optional<int64_t> group_type, std::optional<int64_t> group_list_type,
              std::optional<int64_t> act_type, std::optional<at::ScalarType> output_dtype) {
  Gmm g = parseGmm(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, activation_input,
                   activation_quant_scale, activation_quant_offset, split_item, group_type, group_list_type, act_type,
                   output_dtype);
  if (group_list.has_value()) g.group_ints = group_list->vec();
  NPU_OP_CHECK(!group_type.has_value() || *group_type == 0 || *group_type == -1, Gmm::op, g.device,
               "with group_list as ints group_type must be None");
  resolveGroupType(g, group_type);
  return g;
}

// Meta: the checks and the results' shapes; else the host kernel (it checks first).
template <bool Meta>
std::vector<Tensor> groupedMatmulOf(Gmm& g) {
  if (Meta) {
    g.check();
    return g.emptyOutputs(g.x[0].options());
  }
  return groupedMatmul(g);
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
  Gmm g = gmmOfTensors(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, group_list,
                       activation_input, activation_quant_scale, activation_quant_offset, split_item, group_type,
                       group_list_type, act_type, tuning_config, output_dtype, x_dtype, weight_dtype, scale_dtype,
                       per_token_scale_dtype);
  return groupedMatmulOf<Meta>(g);
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
  Gmm g = gmmOfList(x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale, group_list,
                    activation_input, activation_quant_scale, activation_quant_offset, split_item, group_type,
                    group_list_type, act_type, output_dtype);
  return groupedMatmulOf<Meta>(g);
}

// ---- meta kernels ---------------------------------------------------------------------------

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

std::tuple<Tensor, Tensor, Tensor, Tensor> initRoutingV2Meta(
    const Tensor& x, const Tensor& expert_idx, const OptTensor& scale, const OptTensor& offset, int64_t active_num,
    int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, int64_t tokens_num_type, bool tokens_num_flag,
    int64_t quant_mode, at::IntArrayRef active_expert_range, int64_t row_idx_type) {
  const RoutingArgs a = checkRouting("npu_moe_init_routing_v2", x, expert_idx, valueOr(scale), valueOr(offset),
                                     active_num, expert_capacity, expert_num, drop_pad_mode, tokens_num_type,
                                     tokens_num_flag, quant_mode, active_expert_range, row_idx_type);
  return emptyRouting(a, x, expert_num, tokens_num_type, tokens_num_flag);
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

std::tuple<Tensor, Tensor> dynamicQuantMeta(const Tensor& x, const OptTensor& smooth, const OptTensor& group_index,
                                            std::optional<int64_t> dst_type, c10::string_view quant_mode,
                                            double dst_type_max) {
  return emptyDynamicQuant(x, checkDynamicQuant(x, valueOr(smooth), valueOr(group_index), dst_type, quant_mode,
                                                dst_type_max));
}

Tensor quantMatmulMeta(const Tensor& x1, const Tensor& x2, const Tensor& scale, const OptTensor& offset,
                       const OptTensor& pertoken, const OptTensor& bias, std::optional<int64_t> output_dtype,
                       std::optional<int64_t> x1_dtype, std::optional<int64_t> x2_dtype,
                       std::optional<int64_t> pertoken_scale_dtype, std::optional<int64_t> scale_dtype,
                       at::OptionalIntArrayRef group_sizes, const OptTensor& y_scale) {
  const QmmArgs a = checkQuantMatmul(x1, x2, scale, valueOr(offset), valueOr(pertoken), valueOr(bias), output_dtype,
                                     givenDtypes({{"x1_dtype", x1_dtype}, {"x2_dtype", x2_dtype},
                                                  {"pertoken_scale_dtype", pertoken_scale_dtype},
                                                  {"scale_dtype", scale_dtype}}),
                                     group_sizes,
                                     valueOr(y_scale));
  return at::empty(a.shape, x1.options().dtype(a.out));
}

Tensor transQuantParamMeta(const Tensor& scale, const OptTensor& offset, std::optional<int64_t> round_mode) {
  return at::empty(checkTransQuantParam(scale, valueOr(offset), round_mode), scale.options().dtype(at::kLong));
}

Tensor convertWeightToInt4PackMeta(const Tensor& weight, int64_t inner_k_tiles) {
  checkInt4Pack(weight, inner_k_tiles);
  return emptyInt4Pack(weight);
}

}  // namespace

}  // namespace npu::ops::moe_quant

namespace npu::ops {

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
  m.impl("npu_moe_gating_top_k_softmax", TORCH_FN(moe_quant::gatingTopKSoftmax));
  m.impl("_npu_moe_gating_top_k_softmax_backward", TORCH_FN(moe_quant::gatingTopKSoftmaxBackward));
  m.impl("npu_moe_init_routing_v2", TORCH_FN(moe_quant::initRoutingV2));
  m.impl("npu_grouped_matmul", TORCH_FN(moe_quant::groupedMatmulEntry<false>));
  m.impl("npu_grouped_matmul.List", TORCH_FN(moe_quant::groupedMatmulListEntry<false>));
  m.impl("npu_moe_token_unpermute", TORCH_FN(moe_quant::tokenUnpermute));
  m.impl("npu_moe_token_unpermute_grad", TORCH_FN(moe_quant::tokenUnpermuteGrad));
  m.impl("npu_dynamic_quant", TORCH_FN(moe_quant::dynamicQuant));
  m.impl("npu_quant_matmul", TORCH_FN(moe_quant::quantMatmul));
  m.impl("npu_convert_weight_to_int4pack", TORCH_FN(moe_quant::convertWeightToInt4Pack));
  m.impl("npu_trans_quant_param", TORCH_FN(moe_quant::transQuantParam));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerMoeQuantKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_moe_gating_top_k_softmax", TORCH_FN(moe_quant::gatingTopKSoftmaxMeta));
  m.impl("_npu_moe_gating_top_k_softmax_backward", TORCH_FN(moe_quant::gatingTopKSoftmaxBackwardMeta));
  m.impl("npu_moe_init_routing_v2", TORCH_FN(moe_quant::initRoutingV2Meta));
  m.impl("npu_grouped_matmul", TORCH_FN(moe_quant::groupedMatmulEntry<true>));
  m.impl("npu_grouped_matmul.List", TORCH_FN(moe_quant::groupedMatmulListEntry<true>));
  m.impl("npu_moe_token_unpermute", TORCH_FN(moe_quant::tokenUnpermuteMeta));
  m.impl("npu_moe_token_unpermute_grad", TORCH_FN(moe_quant::tokenUnpermuteGradMeta));
  m.impl("npu_dynamic_quant", TORCH_FN(moe_quant::dynamicQuantMeta));
  m.impl("npu_quant_matmul", TORCH_FN(moe_quant::quantMatmulMeta));
  m.impl("npu_convert_weight_to_int4pack", TORCH_FN(moe_quant::convertWeightToInt4PackMeta));
  m.impl("npu_trans_quant_param", TORCH_FN(moe_quant::transQuantParamMeta));
}

}  // namespace npu::ops
