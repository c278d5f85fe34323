// The ops that fuse a collective of a process group with computation, in the npu
// namespace with the Ascend adapter's schemas (what vllm-ascend and MindSpeed call):
//   npu_all_gather_base_mm      all_gather(x1) @ x2 (+ bias), and the gathered x1
//   npu_mm_reduce_scatter_base  reduce_scatter(x1 @ x2 (+ bias)) along rows
//   npu_moe_distribute_dispatch (_v2)  expert parallelism: each token's top-k
//                               copies sent to the ranks that own the experts
//   npu_moe_distribute_combine (_v2)   the way back: the experts' outputs
//                               returned to the token's rank and summed with
//                               the router's weights
// They name their group by its communicator name (`hcom`, `group_ep`): the
// string the "hccl" backend gives with get_hccl_comm_name(rank), which
// GlooBackend::resolve turns back into the backend. The kernels run the
// backend's collectives (Gloo on the host, complete when they return, after the
// work queued on the stream: the order of the stream) and the computation as
// ops on the tensors' device, so they serve any HAL, and cpu tensors through a
// group that serves the cpu. Meta kernels give the results' shapes from the
// arguments alone. No autograd: Ascend registers none (MindSpeed pairs the two
// matmul ops in its own autograd.Function).
//
// On the chip the fused kernels overlap the communication with the matmul (or
// the quantization); here the collective comes first, then the computation.
// The values of the bookkeeping results (expand_idx, assist_info_for_combine,
// ep_recv_counts) are this implementation's, as Ascend says they may differ per
// chip and version: pass them to combine unchanged.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../../distributed/gloo_backend.h"
#include "common.h"

namespace npu::ops::collective {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using npu::distributed::GlooBackend;

constexpr const char* kNameRemedy =
    "; pass the name the group's backend gives: group._get_backend(torch.device(\"npu\")).get_hccl_comm_name(rank), "
    "for a group made with backend \"hccl\" (init_process_group/new_group) and not yet destroyed";

// The backend of the "hccl" group named `name`, checked against the size (and rank) the caller states.
c10::intrusive_ptr<GlooBackend> groupNamed(const char* op, c10::Device dev, c10::string_view name, const char* arg,
                                           int64_t world_size, const char* size_arg, int64_t rank = -1,
                                           const char* rank_arg = nullptr) {
  NPU_OP_CHECK(!name.empty(), op, dev, arg, " is empty", kNameRemedy);
  auto backend = GlooBackend::resolve(std::string(name));
  if (!backend) {
    std::string known;
    for (const auto& n : GlooBackend::registeredNames()) known += (known.empty() ? "'" : ", '") + n + "'";
    NPU_OP_CHECK(false, op, dev, arg, "='", name, "' names no hccl group of this process (named so far: ",
                 known.empty() ? std::string("none") : known, ")", kNameRemedy);
  }
  NPU_OP_CHECK(backend->getSize() == world_size, op, dev, size_arg, "=", world_size, " but the group '", name,
               "' has ", backend->getSize(), " ranks; pass the group's size (dist.get_world_size(group))");
  if (rank_arg != nullptr) {
    NPU_OP_CHECK(backend->getRank() == rank, op, dev, rank_arg, "=", rank, " but this process is rank ",
                 backend->getRank(), " of the group '", name, "'; pass dist.get_rank(group)");
  }
  return backend;
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

bool floatType(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

void checkDevice(const char* op, const Tensor& ref, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const auto dev = ref.device();
  NPU_OP_CHECK(dev.type() == c10::DeviceType::PrivateUse1 || dev.is_cpu() || dev.is_meta(), op, dev,
               "takes npu tensors (or cpu tensors through a group that serves the cpu); move them with .npu()");
  for (const auto& [name, t] : ts) {
    if (t->defined()) {
      NPU_OP_CHECK(t->device() == dev, op, dev, name, " is on ", t->device(), ", not on ", dev,
                   "; move it with .to('", dev, "')");
    }
  }
}


// ---- the matmul ops ----------------------------------------------------------------------

void checkMatmulOperands(const char* op, const Tensor& x1, const Tensor& x2, const Tensor& bias,
                         const OptTensor& x1_scale, const OptTensor& x2_scale, int64_t world_size, int64_t comm_turn,
                         std::optional<at::ScalarType> output_dtype, const std::optional<c10::string_view>& comm_mode) {
  const auto dev = x1.device();
  checkDevice(op, x1, {{"x2", &x2}, {"bias", &bias}});
  NPU_OP_CHECK(x1.dim() == 2 && x2.dim() == 2, op, dev, "x1 and x2 must be 2-d (m, k) and (k, n), got ", x1.sizes(),
               " and ", x2.sizes());
  NPU_OP_CHECK(x1.size(1) == x2.size(0), op, dev, "x1 (m, k) and x2 (k, n) must share k, got ", x1.sizes(), " and ",
               x2.sizes());
  NPU_OP_CHECK(!x1_scale.has_value() && !x2_scale.has_value(), op, dev,
               "x1_scale/x2_scale (the int8 quantized form) are not supported by this npu; dequantize x1 and x2 "
               "to float16 or bfloat16 and pass no scales");
  NPU_OP_CHECK(floatType(x1.scalar_type()) && x2.scalar_type() == x1.scalar_type(), op, dev,
               "x1 and x2 must be float16, bfloat16 (or float32 on this npu) of one dtype, got ", x1.scalar_type(),
               " and ", x2.scalar_type());
  if (bias.defined()) {
    NPU_OP_CHECK(bias.dim() == 1 && bias.size(0) == x2.size(1) && bias.scalar_type() == x1.scalar_type(), op, dev,
                 "bias must be (n,) = (", x2.size(1), ",) of x1's dtype, got ", bias.sizes(), " ", bias.scalar_type());
  }
  NPU_OP_CHECK(world_size >= 1, op, dev, "world_size must be the group's size (>= 1), got ", world_size);
  NPU_OP_CHECK(comm_turn == 0, op, dev, "comm_turn must be 0 (the only value Ascend supports), got ", comm_turn);
  NPU_OP_CHECK(!output_dtype.has_value() || *output_dtype == x1.scalar_type(), op, dev,
               "output_dtype is for the quantized form; unquantized the result has x1's dtype (", x1.scalar_type(),
               "): pass None");
  if (comm_mode.has_value()) {
    NPU_OP_CHECK(*comm_mode == "ai_cpu" || *comm_mode == "aiv", op, dev,
                 "comm_mode must be None, 'ai_cpu' or 'aiv', got '", *comm_mode, "'");
  }
}

void checkAllGatherMm(const Tensor& x1, const Tensor& x2, const Tensor& bias, const OptTensor& x1_scale,
                      const OptTensor& x2_scale, int64_t world_size, int64_t gather_index, int64_t comm_turn,
                      std::optional<at::ScalarType> output_dtype, const std::optional<c10::string_view>& comm_mode) {
  constexpr const char* op = "npu_all_gather_base_mm";
  checkMatmulOperands(op, x1, x2, bias, x1_scale, x2_scale, world_size, comm_turn, output_dtype, comm_mode);
  NPU_OP_CHECK(gather_index == 0, op, x1.device(), "gather_index must be 0 (gather x1, the only value Ascend supports), "
               "got ", gather_index);
}

std::tuple<Tensor, Tensor> emptyAllGatherMm(const Tensor& x1, const Tensor& x2, int64_t world_size,
                                            bool gather_output) {
  return {at::empty({x1.size(0) * world_size, x2.size(1)}, x1.options()),
          gather_output ? at::empty({x1.size(0) * world_size, x1.size(1)}, x1.options()) : at::empty({0}, x1.options())};
}

std::tuple<Tensor, Tensor> allGatherBaseMm(const Tensor& self, const Tensor& x2, c10::string_view hcom,
                                           int64_t world_size, const OptTensor& bias, const OptTensor& x1_scale,
                                           const OptTensor& x2_scale, int64_t gather_index, bool gather_output,
                                           int64_t comm_turn, std::optional<at::ScalarType> output_dtype,
                                           std::optional<c10::string_view> comm_mode) {
  constexpr const char* op = "npu_all_gather_base_mm";
  checkAllGatherMm(self, x2, valueOr(bias), x1_scale, x2_scale, world_size, gather_index, comm_turn, output_dtype,
                   comm_mode);
  auto group = groupNamed(op, self.device(), hcom, "hcom", world_size, "world_size");
  Tensor gathered = at::empty({self.size(0) * world_size, self.size(1)}, self.options());
  Tensor input = self.contiguous();
  wait(group->_allgather_base(gathered, input, c10d::AllgatherOptions()));
  Tensor out = bias.has_value() ? at::addmm(*bias, gathered, x2) : at::mm(gathered, x2);
  return {out, gather_output ? gathered : at::empty({0}, self.options())};
}

std::tuple<Tensor, Tensor> allGatherBaseMmMeta(const Tensor& self, const Tensor& x2, c10::string_view /*hcom*/,
                                               int64_t world_size, const OptTensor& bias, const OptTensor& x1_scale,
                                               const OptTensor& x2_scale, int64_t gather_index, bool gather_output,
                                               int64_t comm_turn, std::optional<at::ScalarType> output_dtype,
                                               std::optional<c10::string_view> comm_mode) {
  checkAllGatherMm(self, x2, valueOr(bias), x1_scale, x2_scale, world_size, gather_index, comm_turn, output_dtype,
                   comm_mode);
  return emptyAllGatherMm(self, x2, world_size, gather_output);
}

void checkMmReduceScatter(const Tensor& x1, const Tensor& x2, c10::string_view reduce_op, const Tensor& bias,
                          const OptTensor& x1_scale, const OptTensor& x2_scale, int64_t world_size, int64_t comm_turn,
                          std::optional<at::ScalarType> output_dtype,
                          const std::optional<c10::string_view>& comm_mode) {
  constexpr const char* op = "npu_mm_reduce_scatter_base";
  checkMatmulOperands(op, x1, x2, bias, x1_scale, x2_scale, world_size, comm_turn, output_dtype, comm_mode);
  NPU_OP_CHECK(x1.size(0) % world_size == 0, op, x1.device(), "x1's rows (", x1.size(0),
               ") must divide by world_size (", world_size, "): each rank gets m / world_size rows of the sum");
  NPU_OP_CHECK(reduce_op == "sum", op, x1.device(), "reduce_op must be 'sum' (the only reduction Ascend supports), "
               "got '", reduce_op, "'");
}

Tensor mmReduceScatterBase(const Tensor& self, const Tensor& x2, c10::string_view hcom, int64_t world_size,
                           c10::string_view reduce_op, const OptTensor& bias, const OptTensor& x1_scale,
                           const OptTensor& x2_scale, int64_t comm_turn, std::optional<at::ScalarType> output_dtype,
                           std::optional<c10::string_view> comm_mode) {
  constexpr const char* op = "npu_mm_reduce_scatter_base";
  checkMmReduceScatter(self, x2, reduce_op, valueOr(bias), x1_scale, x2_scale, world_size, comm_turn, output_dtype,
                       comm_mode);
  auto group = groupNamed(op, self.device(), hcom, "hcom", world_size, "world_size");
  Tensor product = bias.has_value() ? at::addmm(*bias, self, x2) : at::mm(self, x2);
  Tensor out = at::empty({self.size(0) / world_size, x2.size(1)}, self.options());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  wait(group->_reduce_scatter_base(out, product, opts));
  return out;
}

Tensor mmReduceScatterBaseMeta(const Tensor& self, const Tensor& x2, c10::string_view /*hcom*/, int64_t world_size,
                               c10::string_view reduce_op, const OptTensor& bias, const OptTensor& x1_scale,
                               const OptTensor& x2_scale, int64_t comm_turn,
                               std::optional<at::ScalarType> output_dtype,
                               std::optional<c10::string_view> comm_mode) {
  checkMmReduceScatter(self, x2, reduce_op, valueOr(bias), x1_scale, x2_scale, world_size, comm_turn, output_dtype,
                       comm_mode);
  return at::empty({self.size(0) / world_size, x2.size(1)}, self.options());
}

// ---- expert parallelism: dispatch and combine ------------------------------------------------

// The arguments the dispatch and combine ops share, checked.
struct Ep {
  const char* op;
  c10::Device dev = at::kCPU;
  int64_t bs = 0, h = 0, k = 0;
  int64_t ep = 1, rank = 0, experts = 1, local = 1;  // local: experts per rank
  int64_t rows = 0;                                   // A: the rows of expand_x
};

Ep checkEpGroup(const char* op, const Tensor& ref, const Tensor& expert_ids, int64_t ep_world_size, int64_t ep_rank_id,
                int64_t moe_expert_num, c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id,
                int64_t expert_shard_type, int64_t shared_expert_num, int64_t shared_expert_rank_num,
                int64_t global_bs) {
  Ep a{op, ref.device()};
  const auto dev = a.dev;
  NPU_OP_CHECK(expert_ids.dim() == 2 && expert_ids.scalar_type() == at::kInt, op, dev,
               "expert_ids must be 2-d (BS, K) int32, got ", expert_ids.sizes(), " ", expert_ids.scalar_type(),
               "; npu_moe_gating_top_k_softmax gives int32, or use .int()");
  a.bs = expert_ids.size(0);
  a.k = expert_ids.size(1);
  NPU_OP_CHECK(ep_world_size >= 1, op, dev, "ep_world_size must be the EP group's size (>= 1), got ", ep_world_size);
  NPU_OP_CHECK(ep_rank_id >= 0 && ep_rank_id < ep_world_size, op, dev, "ep_rank_id must be in [0, ep_world_size=",
               ep_world_size, "), got ", ep_rank_id);
  NPU_OP_CHECK(shared_expert_rank_num == 0, op, dev, "shared_expert_rank_num=", shared_expert_rank_num,
               ": ranks dedicated to shared experts are not supported on this npu; pass 0, run the shared expert "
               "on every rank and give its output to combine as shared_expert_x");
  NPU_OP_CHECK(moe_expert_num >= 1 && moe_expert_num % ep_world_size == 0, op, dev, "moe_expert_num (",
               moe_expert_num, ") must be a positive multiple of ep_world_size (", ep_world_size,
               "): each rank owns moe_expert_num / ep_world_size experts");
  NPU_OP_CHECK(tp_world_size == 0 || tp_world_size == 1, op, dev, "tp_world_size=", tp_world_size,
               ": the TP domain's all-gather after the all-to-all (A3 only) is not supported on this npu; pass 0 "
               "(no TP domain) and group_tp=\"\"");
  NPU_OP_CHECK(tp_rank_id == 0, op, dev, "tp_rank_id must be 0 without a TP domain, got ", tp_rank_id);
  (void)group_tp;  // names the TP group, which has one rank here: nothing to send
  NPU_OP_CHECK(expert_shard_type == 0, op, dev, "expert_shard_type must be 0 (the only value Ascend supports), got ",
               expert_shard_type);
  NPU_OP_CHECK(shared_expert_num >= 0, op, dev, "shared_expert_num must be >= 0, got ", shared_expert_num);
  a.ep = ep_world_size;
  a.rank = ep_rank_id;
  a.experts = moe_expert_num;
  a.local = moe_expert_num / ep_world_size;
  NPU_OP_CHECK(a.k >= 1 && a.k <= moe_expert_num, op, dev, "expert_ids' K (", a.k, ") must be in [1, moe_expert_num=",
               moe_expert_num, "]");
  NPU_OP_CHECK(global_bs == 0 || (global_bs % ep_world_size == 0 && global_bs / ep_world_size >= a.bs), op, dev,
               "global_bs must be 0 (every rank has the same BS) or max_bs * ep_world_size with max_bs >= this "
               "rank's BS (", a.bs, "), got ", global_bs);
  a.rows = (global_bs == 0 ? a.bs * ep_world_size : global_bs) * std::min(a.local, a.k);
  return a;
}

struct DispatchArgs {
  Ep ep;
  bool quant = false;
  bool v2 = false;
};

DispatchArgs checkDispatch(const char* op, bool v2, const Tensor& x, const Tensor& expert_ids, int64_t ep_world_size,
                           int64_t ep_rank_id, int64_t moe_expert_num, const Tensor& scales, const Tensor& x_active_mask,
                           const Tensor& expert_scales, c10::string_view group_tp, int64_t tp_world_size,
                           int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                           int64_t shared_expert_rank_num, int64_t quant_mode, int64_t global_bs,
                           int64_t expert_token_nums_type) {
  checkDevice(op, x, {{"expert_ids", &expert_ids}, {"scales", &scales}, {"x_active_mask", &x_active_mask},
                      {"expert_scales", &expert_scales}});
  DispatchArgs d{checkEpGroup(op, x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size,
                              tp_rank_id, expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs)};
  d.v2 = v2;
  const auto dev = x.device();
  NPU_OP_CHECK(x.dim() == 2 && x.size(0) == d.ep.bs, op, dev, "x must be 2-d (BS, H) with expert_ids' BS (", d.ep.bs,
               "), got ", x.sizes());
  NPU_OP_CHECK(floatType(x.scalar_type()), op, dev, "x must be float16 or bfloat16 (or float32 on this npu), got ",
               x.scalar_type(), "; the int32-packed int4 form is not supported");
  d.ep.h = x.size(1);
  NPU_OP_CHECK(quant_mode == 0 || quant_mode == 2, op, dev, "quant_mode must be 0 (none) or 2 (dynamic per-token "
               "int8), got ", quant_mode, quant_mode == 4 ? " (MXFP8 needs an Ascend 950 and its float8 dtypes)" : "");
  d.quant = quant_mode == 2;
  if (scales.defined()) {
    NPU_OP_CHECK(d.quant, op, dev, "scales are the smoothing factors of dynamic quantization: pass quant_mode=2, "
                 "or no scales");
    NPU_OP_CHECK(scales.dim() == 2 && scales.size(0) == moe_expert_num && scales.size(1) == d.ep.h &&
                     scales.scalar_type() == at::kFloat,
                 op, dev, "scales must be float32 (moe_expert_num, H) = (", moe_expert_num, ", ", d.ep.h, "), got ",
                 scales.sizes(), " ", scales.scalar_type());
  }
  if (x_active_mask.defined()) {
    NPU_OP_CHECK(x_active_mask.dim() == 1 && x_active_mask.size(0) == d.ep.bs &&
                     x_active_mask.scalar_type() == at::kBool,
                 op, dev, "x_active_mask must be bool (BS,) = (", d.ep.bs, ",), got ", x_active_mask.sizes(), " ",
                 x_active_mask.scalar_type());
  }
  if (expert_scales.defined()) {
    NPU_OP_CHECK(expert_scales.sizes() == expert_ids.sizes() && expert_scales.scalar_type() == at::kFloat, op, dev,
                 "expert_scales must be float32 (BS, K) like expert_ids ", expert_ids.sizes(), ", got ",
                 expert_scales.sizes(), " ", expert_scales.scalar_type());
  }
  NPU_OP_CHECK(expert_token_nums_type == 0 || expert_token_nums_type == 1, op, dev,
               "expert_token_nums_type must be 0 (cumulative sums) or 1 (counts), got ", expert_token_nums_type);
  return d;
}

using DispatchResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// The results, allocated: expand_x (A, H), dynamic_scales (A,) (empty unquantized), expand_idx (BS*K,)
// or assist_info_for_combine (A*128,), expert_token_nums (local,), ep_recv_counts (ep*local,),
// tp_recv_counts (0,) (no TP domain), expand_scales (A,).
DispatchResult emptyDispatch(const DispatchArgs& d, const Tensor& x) {
  const Ep& a = d.ep;
  auto opts = x.options();
  return {at::zeros({a.rows, a.h}, opts.dtype(d.quant ? at::kChar : x.scalar_type())),
          at::zeros({d.quant ? a.rows : 0}, opts.dtype(at::kFloat)),
          at::full({d.v2 ? a.rows * 128 : a.bs * a.k}, -1, opts.dtype(at::kInt)),
          at::zeros({a.local}, opts.dtype(at::kLong)),
          at::zeros({a.ep * a.local}, opts.dtype(at::kInt)),
          at::zeros({0}, opts.dtype(at::kInt)),
          at::zeros({a.rows}, opts.dtype(at::kFloat))};
}

Tensor cpuIndex(const std::vector<int64_t>& v) { return at::tensor(v, at::TensorOptions(at::kLong)); }

// The all-to-all of the backend for rows of a tensor: `send` rows split by `send_splits`, into
// a new tensor of sum(recv_splits) rows.
Tensor allToAllRows(GlooBackend& group, const Tensor& send, std::vector<int64_t> send_splits,
                    std::vector<int64_t> recv_splits) {
  int64_t total = 0;
  for (auto n : recv_splits) total += n;
  std::vector<int64_t> shape(send.sizes().begin(), send.sizes().end());
  shape[0] = total;
  Tensor recv = at::empty(shape, send.options());
  Tensor input = send.contiguous();
  wait(group.alltoall_base(recv, input, recv_splits, send_splits, c10d::AllToAllOptions()));
  return recv;
}

DispatchResult dispatch(const char* op, bool v2, const Tensor& x, const Tensor& expert_ids, c10::string_view group_ep,
                        int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& scales,
                        const OptTensor& x_active_mask, const OptTensor& expert_scales, c10::string_view group_tp,
                        int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                        int64_t shared_expert_rank_num, int64_t quant_mode, int64_t global_bs,
                        int64_t expert_token_nums_type) {
  const DispatchArgs d = checkDispatch(op, v2, x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num,
                                       valueOr(scales), valueOr(x_active_mask), valueOr(expert_scales), group_tp,
                                       tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                       shared_expert_rank_num, quant_mode, global_bs, expert_token_nums_type);
  const Ep& a = d.ep;
  auto group = groupNamed(op, a.dev, group_ep, "group_ep", ep_world_size, "ep_world_size", ep_rank_id, "ep_rank_id");
  auto [expand_x, dynamic_scales, expand_idx, token_nums, ep_recv_counts, tp_recv_counts, expand_scales] =
      emptyDispatch(d, x);

  // On the host: which expert each (token, k) goes to, in the order it is sent (by expert,
  // then by token and k), and its place among the rows of its expert (expand_idx).
  Tensor ids = expert_ids.to(at::kCPU).contiguous();
  const int32_t* id = ids.data_ptr<int32_t>();
  std::vector<uint8_t> active(a.bs, 1);
  if (x_active_mask.has_value()) {
    Tensor mask = x_active_mask->to(at::kCPU).contiguous();
    std::copy(mask.data_ptr<bool>(), mask.data_ptr<bool>() + a.bs, active.begin());
  }
  std::vector<int64_t> per_expert(a.experts, 0);
  std::vector<int32_t> idx(a.bs * a.k, -1);
  // A rank's bad input must not raise on that rank alone: its peers would wait in the exchanges
  // below until the group's timeout. The error is kept, the counts exchange runs (with no rows
  // from this rank), and the ranks agree (a max all-reduce) before any rows move: every rank raises.
  std::string error;
  for (int64_t t = 0; t < a.bs && error.empty(); ++t) {
    for (int64_t j = 0; j < a.k && error.empty(); ++j) {
      const int32_t g = id[t * a.k + j];
      if (g < 0 || g >= a.experts) {
        error = c10::str("expert_ids[", t, ", ", j, "] = ", g,
                         " is not an expert: the values must be in [0, moe_expert_num=", a.experts, ")");
        break;
      }
      for (int64_t i = 0; i < j; ++i) {
        if (id[t * a.k + i] == g) {
          error = c10::str("expert_ids row ", t, " names expert ", g,
                           " twice: a token's K experts must differ (top-k gives distinct ones)");
          break;
        }
      }
      if (error.empty() && active[t]) idx[t * a.k + j] = static_cast<int32_t>(per_expert[g]++);
    }
  }
  if (!error.empty()) {
    std::fill(per_expert.begin(), per_expert.end(), 0);
    std::fill(idx.begin(), idx.end(), -1);
  }
  std::vector<int64_t> first(a.experts + 1, 0);  // where each expert's rows start in the send order
  for (int64_t g = 0; g < a.experts; ++g) first[g + 1] = first[g] + per_expert[g];
  const int64_t sent = first[a.experts];
  std::vector<int64_t> token_of(sent), pair_of(sent);
  for (int64_t i = 0; i < a.bs * a.k; ++i) {
    if (idx[i] < 0) continue;
    const int64_t row = first[id[i]] + idx[i];
    token_of[row] = i / a.k;
    pair_of[row] = i;
  }
  std::vector<int64_t> send_splits(a.ep);
  for (int64_t r = 0; r < a.ep; ++r) send_splits[r] = first[(r + 1) * a.local] - first[r * a.local];

  // The counts first: rank r learns how many rows of each of its experts come from each rank.
  Tensor counts = at::tensor(per_expert, at::TensorOptions(at::kLong));
  Tensor recv_counts = allToAllRows(*group, counts, std::vector<int64_t>(a.ep, a.local),
                                    std::vector<int64_t>(a.ep, a.local));  // [source rank][local expert]
  const int64_t* rc = recv_counts.data_ptr<int64_t>();
  std::vector<int64_t> recv_splits(a.ep, 0);
  int64_t received = 0;
  for (int64_t s = 0; s < a.ep; ++s) {
    for (int64_t e = 0; e < a.local; ++e) recv_splits[s] += rc[s * a.local + e];
    received += recv_splits[s];
  }
  if (error.empty() && received > a.rows) {
    error = c10::str("this rank receives ", received, " rows but expand_x has A = ", a.rows,
                     " (from global_bs and the ranks' BS); when the ranks have different BS pass global_bs = max_bs * "
                     "ep_world_size");
  }
  // The ranks agree before the rows move: a rank whose input failed raises with its reason, the others
  // with the news, and none is left waiting in the row exchange.
  std::vector<Tensor> flag = {at::full({1}, error.empty() ? 0 : 1, at::TensorOptions(at::kLong))};
  c10d::AllreduceOptions max_opts;
  max_opts.reduceOp = c10d::ReduceOp::MAX;
  wait(group->allreduce(flag, max_opts));
  NPU_OP_CHECK(error.empty(), op, a.dev, error, " (every rank of group_ep raises with this rank)");
  NPU_OP_CHECK(flag[0].item<int64_t>() == 0, op, a.dev,
               "another rank of group_ep rejected its input (its error names the cause); every rank raises so "
               "that none waits in the row exchange");

  // The rows, and beside them (float32) the router's weight and the quantization scale.
  const auto dev_opts = x.options();
  Tensor rows_tok = cpuIndex(token_of).to(a.dev);
  Tensor send_x = x.index_select(0, rows_tok);
  Tensor side = at::zeros({sent, 2}, dev_opts.dtype(at::kFloat));
  if (expert_scales.has_value()) {
    side.select(1, 0).copy_(expert_scales->reshape({-1}).index_select(0, cpuIndex(pair_of).to(a.dev)));
  }
  if (d.quant) {
    Tensor xs = send_x.to(at::kFloat);
    if (scales.has_value()) {
      std::vector<int64_t> expert_of(sent);
      for (int64_t r = 0; r < sent; ++r) expert_of[r] = id[pair_of[r]];
      xs = xs * scales->index_select(0, cpuIndex(expert_of).to(a.dev));
    }
    Tensor scale = xs.abs().amax({1}) / 127.0;  // dynamic_scales: the dequantization factor
    Tensor safe = at::where(scale > 0, scale, at::ones_like(scale));
    send_x = at::round(xs / safe.unsqueeze(1)).clamp(-127, 127).to(at::kChar);
    side.select(1, 1).copy_(scale);
  }
  Tensor recv_x = allToAllRows(*group, send_x, send_splits, recv_splits);
  Tensor recv_side = allToAllRows(*group, side, send_splits, recv_splits);

  // Received by source rank, then local expert; expand_x is by local expert, then source rank.
  std::vector<int64_t> order;
  order.reserve(received);
  std::vector<int32_t> cum(a.ep * a.local);
  std::vector<int64_t> expert_rows(a.local, 0);
  std::vector<int64_t> source_start(a.ep, 0);
  for (int64_t s = 1; s < a.ep; ++s) source_start[s] = source_start[s - 1] + recv_splits[s - 1];
  for (int64_t e = 0; e < a.local; ++e) {
    for (int64_t s = 0; s < a.ep; ++s) {
      int64_t start = source_start[s];
      for (int64_t f = 0; f < e; ++f) start += rc[s * a.local + f];
      for (int64_t n = 0; n < rc[s * a.local + e]; ++n) order.push_back(start + n);
      expert_rows[e] += rc[s * a.local + e];
      cum[e * a.ep + s] = static_cast<int32_t>(order.size());
    }
  }
  if (received > 0) {
    Tensor perm = cpuIndex(order).to(a.dev);
    expand_x.narrow(0, 0, received).copy_(recv_x.index_select(0, perm));
    Tensor side_sorted = recv_side.index_select(0, perm);
    expand_scales.narrow(0, 0, received).copy_(side_sorted.select(1, 0));
    if (d.quant) dynamic_scales.narrow(0, 0, received).copy_(side_sorted.select(1, 1));
  }
  ep_recv_counts.copy_(at::tensor(std::vector<int32_t>(cum.begin(), cum.end()), at::TensorOptions(at::kInt)));
  if (expert_token_nums_type == 0) {
    for (int64_t e = 1; e < a.local; ++e) expert_rows[e] += expert_rows[e - 1];
  }
  token_nums.copy_(at::tensor(expert_rows, at::TensorOptions(at::kLong)));
  expand_idx.narrow(0, 0, a.bs * a.k).copy_(at::tensor(std::vector<int32_t>(idx.begin(), idx.end()),
                                                       at::TensorOptions(at::kInt)));
  return {expand_x, dynamic_scales, expand_idx, token_nums, ep_recv_counts, tp_recv_counts, expand_scales};
}

DispatchResult dispatchV1(const Tensor& x, const Tensor& expert_ids, c10::string_view group_ep, int64_t ep_world_size,
                          int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& scales,
                          const OptTensor& x_active_mask, const OptTensor& expert_scales, c10::string_view group_tp,
                          int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type,
                          int64_t shared_expert_num, int64_t shared_expert_rank_num, int64_t quant_mode,
                          int64_t global_bs, int64_t expert_token_nums_type) {
  return dispatch("npu_moe_distribute_dispatch", false, x, expert_ids, group_ep, ep_world_size, ep_rank_id,
                  moe_expert_num, scales, x_active_mask, expert_scales, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, quant_mode, global_bs,
                  expert_token_nums_type);
}

DispatchResult dispatchV1Meta(const Tensor& x, const Tensor& expert_ids, c10::string_view /*group_ep*/,
                              int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                              const OptTensor& scales, const OptTensor& x_active_mask, const OptTensor& expert_scales,
                              c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id,
                              int64_t expert_shard_type, int64_t shared_expert_num, int64_t shared_expert_rank_num,
                              int64_t quant_mode, int64_t global_bs, int64_t expert_token_nums_type) {
  return emptyDispatch(checkDispatch("npu_moe_distribute_dispatch", false, x, expert_ids, ep_world_size, ep_rank_id,
                                     moe_expert_num, valueOr(scales), valueOr(x_active_mask), valueOr(expert_scales),
                                     group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                     shared_expert_rank_num, quant_mode, global_bs, expert_token_nums_type),
                       x);
}

// What v2 adds: the elastic (scaled-down) groups, the special experts and the float8 dtypes are
// refused; comm_alg chooses how the chip moves the data (the result is the same).
void checkV2Extras(const char* op, c10::Device dev, const OptTensor& elastic_info, c10::string_view comm_alg,
                   int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num) {
  NPU_OP_CHECK(!elastic_info.has_value(), op, dev, "elastic_info (a group scaled down after a failed card) is not "
               "supported on this npu: every rank of the group takes part; pass None");
  NPU_OP_CHECK(zero_expert_num == 0 && copy_expert_num == 0 && const_expert_num == 0, op, dev,
               "the special experts (zero_expert_num, copy_expert_num, const_expert_num) are not supported on this "
               "npu; pass 0 and compute them outside the dispatch");
  NPU_OP_CHECK(comm_alg.empty() || comm_alg == "fullmesh" || comm_alg == "fullmesh_v1" || comm_alg == "fullmesh_v2" ||
                   comm_alg == "hierarchy",
               op, dev, "comm_alg must be \"\", \"fullmesh\", \"fullmesh_v1\", \"fullmesh_v2\" or \"hierarchy\", got '",
               comm_alg, "'");
}

void checkV2Dtypes(const char* op, c10::Device dev, std::optional<int64_t> y_dtype, std::optional<int64_t> x_dtype,
                   std::optional<int64_t> scales_dtype) {
  NPU_OP_CHECK(!y_dtype.has_value() && !x_dtype.has_value() && !scales_dtype.has_value(), op, dev,
               "y_dtype/x_dtype/scales_dtype select float8, hifloat8 or MX forms (Ascend 950), which this npu does "
               "not have; pass None");
}

DispatchResult dispatchV2(const Tensor& x, const Tensor& expert_ids, c10::string_view group_ep, int64_t ep_world_size,
                          int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& scales,
                          const OptTensor& x_active_mask, const OptTensor& expert_scales,
                          const OptTensor& elastic_info, const OptTensor& performance_info, c10::string_view group_tp,
                          int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type,
                          int64_t shared_expert_num, int64_t shared_expert_rank_num, int64_t quant_mode,
                          int64_t global_bs, int64_t expert_token_nums_type, c10::string_view comm_alg,
                          int64_t zero_expert_num, int64_t copy_expert_num, int64_t const_expert_num,
                          std::optional<int64_t> y_dtype, std::optional<int64_t> x_dtype,
                          std::optional<int64_t> scales_dtype) {
  constexpr const char* op = "npu_moe_distribute_dispatch_v2";
  checkV2Extras(op, x.device(), elastic_info, comm_alg, zero_expert_num, copy_expert_num, const_expert_num);
  checkV2Dtypes(op, x.device(), y_dtype, x_dtype, scales_dtype);
  if (performance_info.has_value()) {
    TORCH_WARN_ONCE("npu::", op, ": performance_info (the chip's per-rank wait times) is left unchanged on this npu, "
                    "whose all-to-all runs on the host");
  }
  return dispatch(op, true, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales, x_active_mask,
                  expert_scales, group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                  shared_expert_rank_num, quant_mode, global_bs, expert_token_nums_type);
}

DispatchResult dispatchV2Meta(const Tensor& x, const Tensor& expert_ids, c10::string_view /*group_ep*/,
                              int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                              const OptTensor& scales, const OptTensor& x_active_mask, const OptTensor& expert_scales,
                              const OptTensor& elastic_info, const OptTensor& /*performance_info*/,
                              c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id,
                              int64_t expert_shard_type, int64_t shared_expert_num, int64_t shared_expert_rank_num,
                              int64_t quant_mode, int64_t global_bs, int64_t expert_token_nums_type,
                              c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                              int64_t const_expert_num, std::optional<int64_t> y_dtype, std::optional<int64_t> x_dtype,
                              std::optional<int64_t> scales_dtype) {
  constexpr const char* op = "npu_moe_distribute_dispatch_v2";
  checkV2Extras(op, x.device(), elastic_info, comm_alg, zero_expert_num, copy_expert_num, const_expert_num);
  checkV2Dtypes(op, x.device(), y_dtype, x_dtype, scales_dtype);
  return emptyDispatch(checkDispatch(op, true, x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num,
                                     valueOr(scales), valueOr(x_active_mask), valueOr(expert_scales), group_tp,
                                     tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                     shared_expert_rank_num, quant_mode, global_bs, expert_token_nums_type),
                       x);
}

struct CombineArgs {
  Ep ep;
  bool comm_quant = false;
};

CombineArgs checkCombine(const char* op, bool v2, const Tensor& expand_x, const Tensor& expert_ids,
                         const Tensor& expand_idx, const Tensor& ep_send_counts, const Tensor& expert_scales,
                         int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                         const Tensor& tp_send_counts, const Tensor& x_active_mask, const Tensor& expand_scales,
                         const Tensor& shared_expert_x, c10::string_view group_tp, int64_t tp_world_size,
                         int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                         int64_t shared_expert_rank_num, int64_t global_bs, int64_t comm_quant_mode) {
  const char* idx_name = v2 ? "assist_info_for_combine" : "expand_idx";
  checkDevice(op, expand_x, {{"expert_ids", &expert_ids}, {idx_name, &expand_idx}, {"ep_send_counts", &ep_send_counts},
                             {"expert_scales", &expert_scales}, {"tp_send_counts", &tp_send_counts},
                             {"x_active_mask", &x_active_mask}, {"expand_scales", &expand_scales},
                             {"shared_expert_x", &shared_expert_x}});
  CombineArgs c{checkEpGroup(op, expand_x, expert_ids, ep_world_size, ep_rank_id, moe_expert_num, group_tp,
                             tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num, shared_expert_rank_num,
                             global_bs)};
  const Ep& a = c.ep;
  const auto dev = a.dev;
  NPU_OP_CHECK(expand_x.dim() == 2 && floatType(expand_x.scalar_type()), op, dev,
               "expand_x must be the experts' outputs, 2-d (A, H) float16 or bfloat16 (or float32 on this npu), "
               "got ", expand_x.sizes(), " ", expand_x.scalar_type(), "; dequantize int8 results first");
  NPU_OP_CHECK(expand_x.size(0) >= a.rows, op, dev, "expand_x has ", expand_x.size(0),
               " rows, fewer than the A = ", a.rows, " rows dispatch gave (with the same global_bs)");
  NPU_OP_CHECK(expand_idx.dim() == 1 && expand_idx.scalar_type() == at::kInt && expand_idx.size(0) >= a.bs * a.k, op,
               dev, idx_name, " must be dispatch's int32 result of at least BS*K = ", a.bs * a.k, " values, got ",
               expand_idx.sizes(), " ", expand_idx.scalar_type());
  NPU_OP_CHECK(ep_send_counts.dim() == 1 && ep_send_counts.scalar_type() == at::kInt &&
                   ep_send_counts.size(0) >= a.ep * a.local,
               op, dev, "ep_send_counts must be dispatch's ep_recv_counts (int32, ", a.ep * a.local, " values), got ",
               ep_send_counts.sizes(), " ", ep_send_counts.scalar_type());
  NPU_OP_CHECK(expert_scales.sizes() == expert_ids.sizes() && expert_scales.scalar_type() == at::kFloat, op, dev,
               "expert_scales must be float32 (BS, K) like expert_ids ", expert_ids.sizes(), ", got ",
               expert_scales.sizes(), " ", expert_scales.scalar_type());
  if (x_active_mask.defined()) {
    NPU_OP_CHECK(x_active_mask.dim() == 1 && x_active_mask.size(0) == a.bs && x_active_mask.scalar_type() == at::kBool,
                 op, dev, "x_active_mask must be bool (BS,) = (", a.bs, ",), got ", x_active_mask.sizes());
  }
  if (shared_expert_x.defined()) {
    NPU_OP_CHECK(shared_expert_x.dim() == 2 && shared_expert_x.size(0) == a.bs &&
                     shared_expert_x.size(1) == expand_x.size(1) &&
                     shared_expert_x.scalar_type() == expand_x.scalar_type(),
                 op, dev, "shared_expert_x must be (BS, H) = (", a.bs, ", ", expand_x.size(1),
                 ") of expand_x's dtype, got ", shared_expert_x.sizes(), " ", shared_expert_x.scalar_type());
  }
  NPU_OP_CHECK(comm_quant_mode == 0 || comm_quant_mode == 2, op, dev,
               "comm_quant_mode must be 0 (none) or 2 (per-token int8 on the wire), got ", comm_quant_mode);
  c.comm_quant = comm_quant_mode == 2;
  return c;
}

Tensor combine(const char* op, bool v2, const Tensor& expand_x, const Tensor& expert_ids, const Tensor& expand_idx,
               const Tensor& ep_send_counts, const Tensor& expert_scales, c10::string_view group_ep,
               int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& tp_send_counts,
               const OptTensor& x_active_mask, const OptTensor& expand_scales, const OptTensor& shared_expert_x,
               c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type,
               int64_t shared_expert_num, int64_t shared_expert_rank_num, int64_t global_bs,
               int64_t comm_quant_mode) {
  const CombineArgs c = checkCombine(op, v2, expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales,
                                     ep_world_size, ep_rank_id, moe_expert_num, valueOr(tp_send_counts),
                                     valueOr(x_active_mask), valueOr(expand_scales), valueOr(shared_expert_x),
                                     group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                     shared_expert_rank_num, global_bs, comm_quant_mode);
  const Ep& a = c.ep;
  auto group = groupNamed(op, a.dev, group_ep, "group_ep", ep_world_size, "ep_world_size", ep_rank_id, "ep_rank_id");

  // The expert side: the rows of each (local expert, source rank) block go back to the source,
  // by source rank, then local expert (the order the source sent them in).
  Tensor cum_t = ep_send_counts.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* cum = cum_t.data_ptr<int64_t>();
  std::vector<int64_t> send_rows;
  std::vector<int64_t> send_splits(a.ep, 0);
  for (int64_t s = 0; s < a.ep; ++s) {
    for (int64_t e = 0; e < a.local; ++e) {
      const int64_t block = e * a.ep + s;
      const int64_t begin = block == 0 ? 0 : cum[block - 1], end = cum[block];
      NPU_OP_CHECK(begin <= end && end <= expand_x.size(0), op, a.dev, "ep_send_counts is not the ep_recv_counts "
                   "that dispatch gave for this expand_x (block ", block, ": rows ", begin, " to ", end, ")");
      for (int64_t r = begin; r < end; ++r) send_rows.push_back(r);
      send_splits[s] += end - begin;
    }
  }
  // The token side: where each (token, k) comes back: its expert's rows start after those of
  // the lower experts it sent rows to.
  Tensor ids_t = expert_ids.to(at::kCPU).contiguous();
  Tensor idx_t = expand_idx.narrow(0, 0, a.bs * a.k).to(at::kCPU).contiguous();
  const int32_t* id = ids_t.data_ptr<int32_t>();
  const int32_t* idx = idx_t.data_ptr<int32_t>();
  std::vector<uint8_t> active(a.bs, 1);
  if (x_active_mask.has_value()) {
    Tensor mask = x_active_mask->to(at::kCPU).contiguous();
    std::copy(mask.data_ptr<bool>(), mask.data_ptr<bool>() + a.bs, active.begin());
  }
  std::vector<int64_t> per_expert(a.experts, 0);
  for (int64_t i = 0; i < a.bs * a.k; ++i) {
    const int32_t g = id[i];
    NPU_OP_CHECK(g >= 0 && g < a.experts, op, a.dev, "expert_ids must be in [0, moe_expert_num=", a.experts,
                 "), got ", g);
    if (active[i / a.k] && idx[i] >= 0) ++per_expert[g];
  }
  std::vector<int64_t> first(a.experts + 1, 0);
  for (int64_t g = 0; g < a.experts; ++g) first[g + 1] = first[g] + per_expert[g];
  std::vector<int64_t> recv_splits(a.ep);
  for (int64_t r = 0; r < a.ep; ++r) recv_splits[r] = first[(r + 1) * a.local] - first[r * a.local];
  std::vector<int64_t> tokens, pairs, places;
  for (int64_t i = 0; i < a.bs * a.k; ++i) {
    if (!active[i / a.k] || idx[i] < 0) continue;
    NPU_OP_CHECK(idx[i] < per_expert[id[i]], op, a.dev, v2 ? "assist_info_for_combine" : "expand_idx",
                 " does not match expert_ids: pass dispatch's result and the expert_ids given to dispatch");
    tokens.push_back(i / a.k);
    pairs.push_back(i);
    places.push_back(first[id[i]] + idx[i]);
  }

  Tensor send = expand_x.index_select(0, cpuIndex(send_rows).to(a.dev));
  if (c.comm_quant) {  // the chip sends int8 rows and their scales: the same rounding
    Tensor f = send.to(at::kFloat);
    Tensor scale = f.abs().amax({1}, true) / 127.0;
    Tensor safe = at::where(scale > 0, scale, at::ones_like(scale));
    send = (at::round(f / safe).clamp(-127, 127) * scale).to(expand_x.scalar_type());
  }
  Tensor back = allToAllRows(*group, send, send_splits, recv_splits);

  Tensor out = at::zeros({a.bs, expand_x.size(1)}, expand_x.options().dtype(at::kFloat));
  if (!pairs.empty()) {
    Tensor weights = expert_scales.reshape({-1}).index_select(0, cpuIndex(pairs).to(a.dev));
    Tensor rows = back.index_select(0, cpuIndex(places).to(a.dev)).to(at::kFloat) * weights.unsqueeze(1);
    out.index_add_(0, cpuIndex(tokens).to(a.dev), rows);
  }
  if (shared_expert_x.has_value()) out.add_(shared_expert_x->to(at::kFloat));
  return out.to(expand_x.scalar_type());
}

void checkCombineUnsupported(const char* op, c10::Device dev, const OptTensor& activation_scale,
                             const OptTensor& weight_scale, const OptTensor& group_list, int64_t out_dtype,
                             int64_t group_list_type) {
  NPU_OP_CHECK(!activation_scale.has_value() && !weight_scale.has_value() && !group_list.has_value(), op, dev,
               "activation_scale, weight_scale and group_list (int32 expert outputs dequantized in the combine) are "
               "not supported on this npu; dequantize expand_x to float16/bfloat16 and pass None");
  NPU_OP_CHECK(out_dtype == 0 && group_list_type == 0, op, dev,
               "out_dtype and group_list_type are reserved by Ascend: pass 0");
}

Tensor combineV1(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& expand_idx,
                 const Tensor& ep_send_counts, const Tensor& expert_scales, c10::string_view group_ep,
                 int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& tp_send_counts,
                 const OptTensor& x_active_mask, const OptTensor& activation_scale, const OptTensor& weight_scale,
                 const OptTensor& group_list, const OptTensor& expand_scales, const OptTensor& shared_expert_x,
                 c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type,
                 int64_t shared_expert_num, int64_t shared_expert_rank_num, int64_t global_bs, int64_t out_dtype,
                 int64_t comm_quant_mode, int64_t group_list_type) {
  constexpr const char* op = "npu_moe_distribute_combine";
  checkCombineUnsupported(op, expand_x.device(), activation_scale, weight_scale, group_list, out_dtype,
                          group_list_type);
  return combine(op, false, expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep, ep_world_size,
                 ep_rank_id, moe_expert_num, tp_send_counts, x_active_mask, expand_scales, shared_expert_x, group_tp,
                 tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs,
                 comm_quant_mode);
}

Tensor combineV1Meta(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& expand_idx,
                     const Tensor& ep_send_counts, const Tensor& expert_scales, c10::string_view /*group_ep*/,
                     int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                     const OptTensor& tp_send_counts, const OptTensor& x_active_mask,
                     const OptTensor& activation_scale, const OptTensor& weight_scale, const OptTensor& group_list,
                     const OptTensor& expand_scales, const OptTensor& shared_expert_x, c10::string_view group_tp,
                     int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                     int64_t shared_expert_rank_num, int64_t global_bs, int64_t out_dtype, int64_t comm_quant_mode,
                     int64_t group_list_type) {
  constexpr const char* op = "npu_moe_distribute_combine";
  checkCombineUnsupported(op, expand_x.device(), activation_scale, weight_scale, group_list, out_dtype,
                          group_list_type);
  const CombineArgs c = checkCombine(op, false, expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales,
                                     ep_world_size, ep_rank_id, moe_expert_num, valueOr(tp_send_counts),
                                     valueOr(x_active_mask), valueOr(expand_scales), valueOr(shared_expert_x),
                                     group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                     shared_expert_rank_num, global_bs, comm_quant_mode);
  return at::empty({c.ep.bs, expand_x.size(1)}, expand_x.options());
}

void checkCombineV2Extras(const char* op, c10::Device dev, const OptTensor& elastic_info, const OptTensor& ori_x,
                          const OptTensor& alpha1, const OptTensor& alpha2, const OptTensor& v,
                          c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                          int64_t const_expert_num) {
  checkV2Extras(op, dev, elastic_info, comm_alg, zero_expert_num, copy_expert_num, const_expert_num);
  NPU_OP_CHECK(!ori_x.has_value() && !alpha1.has_value() && !alpha2.has_value() && !v.has_value(), op, dev,
               "ori_x and const_expert_alpha_1/_2/const_expert_v serve the special experts, which are not supported "
               "on this npu; pass None");
}

Tensor combineV2(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& assist_info_for_combine,
                 const Tensor& ep_send_counts, const Tensor& expert_scales, c10::string_view group_ep,
                 int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num, const OptTensor& tp_send_counts,
                 const OptTensor& x_active_mask, const OptTensor& expand_scales, const OptTensor& shared_expert_x,
                 const OptTensor& elastic_info, const OptTensor& ori_x, const OptTensor& const_expert_alpha_1,
                 const OptTensor& const_expert_alpha_2, const OptTensor& const_expert_v,
                 const OptTensor& performance_info, c10::string_view group_tp, int64_t tp_world_size,
                 int64_t tp_rank_id, int64_t expert_shard_type, int64_t shared_expert_num,
                 int64_t shared_expert_rank_num, int64_t global_bs, int64_t comm_quant_mode,
                 c10::string_view comm_alg, int64_t zero_expert_num, int64_t copy_expert_num,
                 int64_t const_expert_num) {
  constexpr const char* op = "npu_moe_distribute_combine_v2";
  checkCombineV2Extras(op, expand_x.device(), elastic_info, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                       const_expert_v, comm_alg, zero_expert_num, copy_expert_num, const_expert_num);
  if (performance_info.has_value()) {
    TORCH_WARN_ONCE("npu::", op, ": performance_info (the chip's per-rank wait times) is left unchanged on this npu, "
                    "whose all-to-all runs on the host");
  }
  return combine(op, true, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                 ep_world_size, ep_rank_id, moe_expert_num, tp_send_counts, x_active_mask, expand_scales,
                 shared_expert_x, group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                 shared_expert_rank_num, global_bs, comm_quant_mode);
}

Tensor combineV2Meta(const Tensor& expand_x, const Tensor& expert_ids, const Tensor& assist_info_for_combine,
                     const Tensor& ep_send_counts, const Tensor& expert_scales, c10::string_view /*group_ep*/,
                     int64_t ep_world_size, int64_t ep_rank_id, int64_t moe_expert_num,
                     const OptTensor& tp_send_counts, const OptTensor& x_active_mask, const OptTensor& expand_scales,
                     const OptTensor& shared_expert_x, const OptTensor& elastic_info, const OptTensor& ori_x,
                     const OptTensor& const_expert_alpha_1, const OptTensor& const_expert_alpha_2,
                     const OptTensor& const_expert_v, const OptTensor& /*performance_info*/,
                     c10::string_view group_tp, int64_t tp_world_size, int64_t tp_rank_id, int64_t expert_shard_type,
                     int64_t shared_expert_num, int64_t shared_expert_rank_num, int64_t global_bs,
                     int64_t comm_quant_mode, c10::string_view comm_alg, int64_t zero_expert_num,
                     int64_t copy_expert_num, int64_t const_expert_num) {
  constexpr const char* op = "npu_moe_distribute_combine_v2";
  checkCombineV2Extras(op, expand_x.device(), elastic_info, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                       const_expert_v, comm_alg, zero_expert_num, copy_expert_num, const_expert_num);
  const CombineArgs c = checkCombine(op, true, expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                                     expert_scales, ep_world_size, ep_rank_id, moe_expert_num, valueOr(tp_send_counts),
                                     valueOr(x_active_mask), valueOr(expand_scales), valueOr(shared_expert_x),
                                     group_tp, tp_world_size, tp_rank_id, expert_shard_type, shared_expert_num,
                                     shared_expert_rank_num, global_bs, comm_quant_mode);
  return at::empty({c.ep.bs, expand_x.size(1)}, expand_x.options());
}

}  // namespace
}  // namespace npu::ops::collective

namespace npu::ops {

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_all_gather_base_mm(Tensor self, Tensor x2, str hcom, int world_size, *, Tensor? bias=None, "
        "Tensor? x1_scale=None, Tensor? x2_scale=None, int gather_index=0, bool gather_output=True, int comm_turn=0, "
        "ScalarType? output_dtype=None, str? comm_mode=None) -> (Tensor, Tensor)");
  m.def("npu_mm_reduce_scatter_base(Tensor self, Tensor x2, str hcom, int world_size, *, str reduce_op='sum', "
        "Tensor? bias=None, Tensor? x1_scale=None, Tensor? x2_scale=None, int comm_turn=0, "
        "ScalarType? output_dtype=None, str? comm_mode=None) -> Tensor");
  m.def("npu_moe_distribute_dispatch(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, int ep_rank_id, "
        "int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, Tensor? expert_scales=None, "
        "str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, int expert_token_nums_type=1) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("npu_moe_distribute_dispatch_v2(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, "
        "int ep_rank_id, int moe_expert_num, *, Tensor? scales=None, Tensor? x_active_mask=None, "
        "Tensor? expert_scales=None, Tensor? elastic_info=None, Tensor? performance_info=None, str group_tp=\"\", "
        "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, int expert_token_nums_type=1, "
        "str comm_alg=\"\", int zero_expert_num=0, int copy_expert_num=0, int const_expert_num=0, "
        "int? y_dtype=None, int? x_dtype=None, int? scales_dtype=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("npu_moe_distribute_combine(Tensor expand_x, Tensor expert_ids, Tensor expand_idx, Tensor ep_send_counts, "
        "Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
        "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, Tensor? activation_scale=None, "
        "Tensor? weight_scale=None, Tensor? group_list=None, Tensor? expand_scales=None, "
        "Tensor? shared_expert_x=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
        "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
        "int out_dtype=0, int comm_quant_mode=0, int group_list_type=0) -> Tensor");
  m.def("npu_moe_distribute_combine_v2(Tensor expand_x, Tensor expert_ids, Tensor assist_info_for_combine, "
        "Tensor ep_send_counts, Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, "
        "int moe_expert_num, *, Tensor? tp_send_counts=None, Tensor? x_active_mask=None, "
        "Tensor? expand_scales=None, Tensor? shared_expert_x=None, Tensor? elastic_info=None, Tensor? ori_x=None, "
        "Tensor? const_expert_alpha_1=None, Tensor? const_expert_alpha_2=None, Tensor? const_expert_v=None, "
        "Tensor? performance_info=None, str group_tp=\"\", int tp_world_size=0, int tp_rank_id=0, "
        "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
        "int comm_quant_mode=0, str comm_alg=\"\", int zero_expert_num=0, int copy_expert_num=0, "
        "int const_expert_num=0) -> Tensor");
}

void registerCollectiveKernels(torch::Library& m) {
  m.impl("npu_all_gather_base_mm", TORCH_FN(collective::allGatherBaseMm));
  m.impl("npu_mm_reduce_scatter_base", TORCH_FN(collective::mmReduceScatterBase));
  m.impl("npu_moe_distribute_dispatch", TORCH_FN(collective::dispatchV1));
  m.impl("npu_moe_distribute_dispatch_v2", TORCH_FN(collective::dispatchV2));
  m.impl("npu_moe_distribute_combine", TORCH_FN(collective::combineV1));
  m.impl("npu_moe_distribute_combine_v2", TORCH_FN(collective::combineV2));
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerCollectiveKernels)

TORCH_LIBRARY_IMPL(npu, Meta, m) {
  m.impl("npu_all_gather_base_mm", TORCH_FN(collective::allGatherBaseMmMeta));
  m.impl("npu_mm_reduce_scatter_base", TORCH_FN(collective::mmReduceScatterBaseMeta));
  m.impl("npu_moe_distribute_dispatch", TORCH_FN(collective::dispatchV1Meta));
  m.impl("npu_moe_distribute_dispatch_v2", TORCH_FN(collective::dispatchV2Meta));
  m.impl("npu_moe_distribute_combine", TORCH_FN(collective::combineV1Meta));
  m.impl("npu_moe_distribute_combine_v2", TORCH_FN(collective::combineV2Meta));
}

}  // namespace npu::ops
