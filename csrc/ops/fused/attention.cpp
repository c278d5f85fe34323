// The attention operators of LLM serving, with the Ascend adapter's signatures:
// npu_prompt_flash_attention (prefill), npu_incre_flash_attention (decode),
// npu_fused_infer_attention_score (+ _v2: either), npu_scatter_pa_kv_cache /
// npu_gather_pa_kv_cache (the paged KV cache) and npu_fusion_attention_grad (the
// backward of npu_fusion_attention, torch_npu/ops/attention.py). Here: their
// schemas, the parsing and checks of their arguments into a Request, its
// shapes (Geometry), the meta kernels (the same checks and shapes) that let
// torch.compile trace them, and the npu and cpu kernels, which run the host
// kernels (ops/host/fused/attention_kernels.cpp) on the checked request.
//
// The kernels are boxed: these operators have up to 45 arguments, most of them
// quantization options the npu refuses; the kernels read arguments by name and
// every unsupported option is refused by name. The four inference operators
// share one parser (Spelling names their arguments).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_unique.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/where.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention.h"
#include "common.h"

namespace npu::ops::attention {
namespace {

// ---- boxed arguments ---------------------------------------------------------------

// The arguments of a boxed call, by name (the schema's defaults are filled in).
class Args {
 public:
  Args(const c10::OperatorHandle& op, torch::jit::Stack* stack)
      : schema_(op.schema()), stack_(stack), count_(schema_.arguments().size()) {}

  const c10::IValue& operator[](const char* name) const {
    const auto index = schema_.argumentIndexWithName(name);
    TORCH_INTERNAL_ASSERT(index.has_value(), "no argument ", name, " in ", schema_.name());
    return (*stack_)[stack_->size() - count_ + *index];
  }
  at::Tensor tensor(const char* name) const {
    const c10::IValue& v = (*this)[name];
    return v.isNone() ? at::Tensor() : v.toTensor();
  }
  int64_t integer(const char* name) const { return (*this)[name].toInt(); }
  double real(const char* name) const { return (*this)[name].toDouble(); }
  bool flag(const char* name) const { return (*this)[name].toBool(); }
  std::string str(const char* name) const {
    const c10::IValue& v = (*this)[name];
    return v.isNone() ? std::string() : std::string(v.toStringRef());
  }
  bool given(const char* name) const { return !(*this)[name].isNone(); }
  // An int[] or SymInt[] argument (concrete values: the kernels, not the meta kernels, read them).
  std::optional<std::vector<int64_t>> ints(const char* name) const {
    const c10::IValue& v = (*this)[name];
    if (v.isNone()) return std::nullopt;
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(e.isInt() ? e.toInt() : e.toSymInt().guard_int(__FILE__, __LINE__));
    }
    return out;
  }
  // How many elements a list argument has, or -1 for None (readable on symbolic values too).
  int64_t length(const char* name) const {
    const c10::IValue& v = (*this)[name];
    return v.isNone() ? -1 : static_cast<int64_t>(v.toListRef().size());
  }
  // Options the npu does not implement: each one given is refused by name.
  void refuse(const char* op, std::initializer_list<const char*> names, const char* why) const {
    for (const char* name : names) {
      TORCH_CHECK(!given(name), "npu::", op, ": ", name, " is not supported on the npu device (", why,
                  "); pass None");
    }
  }
  template <class... Results>
  void finish(Results&&... results) {
    torch::jit::drop(*stack_, count_);
    (torch::jit::push(*stack_, std::forward<Results>(results)), ...);
  }

 private:
  const c10::FunctionSchema& schema_;
  torch::jit::Stack* stack_;
  size_t count_;
};

// ---- layouts -----------------------------------------------------------------------

const char* layoutName(Layout l) {
  switch (l) {
    case Layout::BSH: return "BSH";
    case Layout::SBH: return "SBH";
    case Layout::BSND: return "BSND";
    case Layout::BNSD: return "BNSD";
    case Layout::TND: return "TND";
  }
  return "?";
}

// The batch, heads, sequence length and head size of a tensor in a layout; for
// BSH/SBH the heads are given (H = heads * D). TND: batch is unknown (0).
struct Dims {
  int64_t B = 0, N = 0, S = 0, D = 0;
};

Dims dimsOf(const char* op, const char* name, const at::Tensor& t, Layout l, int64_t heads) {
  const int64_t want = (l == Layout::BSH || l == Layout::SBH || l == Layout::TND) ? 3 : 4;
  TORCH_CHECK(t.dim() == want, "npu::", op, ": ", name, " must be ", want, "-dimensional in layout ",
              layoutName(l), ", got shape ", t.sizes());
  Dims d;
  switch (l) {
    case Layout::BSH:
    case Layout::SBH: {
      const int64_t h = t.size(2);
      TORCH_CHECK(heads > 0 && h % heads == 0, "npu::", op, ": ", name, "'s hidden size ", h,
                  " is not a multiple of its head count ", heads, " (layout ", layoutName(l),
                  "); check num_heads / num_key_value_heads");
      d.B = l == Layout::BSH ? t.size(0) : t.size(1);
      d.S = l == Layout::BSH ? t.size(1) : t.size(0);
      d.N = heads;
      d.D = h / heads;
      break;
    }
    case Layout::BSND: d = {t.size(0), t.size(2), t.size(1), t.size(3)}; break;
    case Layout::BNSD: d = {t.size(0), t.size(1), t.size(2), t.size(3)}; break;
    case Layout::TND: d = {0, t.size(1), t.size(0), t.size(2)}; break;
  }
  return d;
}

// ---- the attention problem ---------------------------------------------------------

void checkMaskShape(const Request& r, const Geometry& g) {
  const at::Tensor& m = r.mask;
  TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == at::kChar || m.scalar_type() == at::kByte, "npu::",
              r.op, ": atten_mask must be bool, int8 or uint8 (1 = masked out), got ", m.scalar_type());
  if (r.sparse >= 2 && r.sparse <= 4) return;  // the compressed 2048x2048 pattern, checked by the caller
  TORCH_CHECK(r.in != Layout::TND, "npu::", r.op, ": layout TND takes atten_mask only with sparse_mode 2, 3 or 4 "
              "on the npu device; pass the causal pattern with sparse_mode=3, or use layout BSND");
  TORCH_CHECK(m.dim() >= 2 && m.dim() <= 4, "npu::", r.op, ": atten_mask must have 2 to 4 dimensions, got ", m.sizes());
}

}  // namespace

Geometry describe(Request& r) {
  const char* op = r.op;
  Geometry g;
  TORCH_CHECK(r.heads > 0 && r.kvHeads >= 0, "npu::", op, ": num_heads must be positive and num_key_value_heads "
              ">= 0, got ", r.heads, " and ", r.kvHeads);
  const Dims qd = dimsOf(op, "query", r.q, r.in, r.heads);
  g.N = qd.N;
  g.D = qd.D;
  g.Sq = qd.S;
  if (r.in == Layout::BSND || r.in == Layout::BNSD || r.in == Layout::TND) {
    if (r.headsFromShape) {
      r.heads = qd.N;
    } else {
      TORCH_CHECK(qd.N == r.heads, "npu::", op, ": num_heads (", r.heads, ") must equal query's head dimension (", qd.N,
                  ") in layout ", layoutName(r.in), "; pass num_heads=", qd.N);
    }
  }
  g.paged = r.blockTable.defined();
  if (r.in == Layout::TND) {
    TORCH_CHECK(r.qLensCount > 0 && r.kvLensCount > 0, "npu::", op, ": layout TND needs the actual query and key/value "
                "lengths (cumulative ends of each sequence, one per batch)");
    TORCH_CHECK(r.qLensCount == r.kvLensCount, "npu::", op, ": the actual query and key/value lengths must have one "
                "entry per batch each, got ", r.qLensCount, " and ", r.kvLensCount);
    g.B = r.qLensCount;
  } else {
    g.B = qd.B;
  }
  if (g.paged) {
    const at::Tensor& bt = r.blockTable;
    TORCH_CHECK(bt.dim() == 2 && bt.size(0) == g.B && bt.scalar_type() == at::kInt, "npu::", op,
                ": block_table must be int32 of shape [batch, max blocks per sequence] = [", g.B, ", ...], got ",
                bt.scalar_type(), " ", bt.sizes());
    // The Ascend limits: TND 16-aligned up to 1024; else 16-aligned up to 512, 128-aligned for prefill.
    const int64_t maxBlock = r.in == Layout::TND ? 1024 : 512;
    TORCH_CHECK(r.blockSize > 0 && r.blockSize <= maxBlock && r.blockSize % 16 == 0, "npu::", op, ": block_size must "
                "be a multiple of 16 up to ", maxBlock, " with a paged KV cache, got ", r.blockSize);
    TORCH_CHECK(g.Sq == 1 || r.in == Layout::TND || r.blockSize % 128 == 0, "npu::", op, ": with more than one query "
                "per sequence (prefill), a paged KV cache needs block_size a multiple of 128 (128 to 512), got ",
                r.blockSize, "; or use layout TND");
    TORCH_CHECK(r.kvLensCount >= 0, "npu::", op, ": a paged KV cache needs the actual key/value length of each "
                "sequence (actual_seq_lengths_kv; actual_seq_lengths for npu_incre_flash_attention)");
    const at::Tensor& k = r.k;
    const at::Tensor& v = r.v;
    TORCH_CHECK(k.dim() == v.dim() && k.size(0) == v.size(0), "npu::", op, ": the key and value caches must have "
                "the same number of blocks and dimensions, got ", k.sizes(), " and ", v.sizes());
    if (k.dim() == 3) {  // [blocks, block_size, KVN * D]
      g.KVN = r.kvHeads == 0 ? g.N : r.kvHeads;
      TORCH_CHECK(k.size(1) == r.blockSize && v.size(1) == r.blockSize && k.size(2) % g.KVN == 0 &&
                      v.size(2) % g.KVN == 0,
                  "npu::", op, ": the key/value caches [blocks, block_size, H] must have block_size ", r.blockSize,
                  " and H a multiple of the kv heads ", g.KVN, ", got ", k.sizes(), " and ", v.sizes());
      g.Dv = v.size(2) / g.KVN;
      TORCH_CHECK(k.size(2) / g.KVN == g.D, "npu::", op, ": the key cache's head size ", k.size(2) / g.KVN,
                  " differs from query's ", g.D);
    } else {
      TORCH_CHECK(k.dim() == 4 && (r.in == Layout::BNSD || r.in == Layout::TND), "npu::", op, ": a paged key/value "
                  "cache is [blocks, block_size, H], or [blocks, kv heads, block_size, D] with layout BNSD or TND; "
                  "got ",
                  k.sizes(),
                  " with layout ", layoutName(r.in));
      g.headMajorCache = true;
      g.KVN = k.size(1);
      TORCH_CHECK(k.size(2) == r.blockSize && v.size(2) == r.blockSize && v.size(1) == g.KVN && k.size(3) == g.D,
                  "npu::", op, ": the key/value caches [blocks, kv heads, block_size, D] must have block_size ",
                  r.blockSize, " and query's head size ", g.D, ", got ", k.sizes(), " and ", v.sizes());
      g.Dv = v.size(3);
    }
    g.Skv = r.blockTable.size(1) * r.blockSize;
  } else {
    const int64_t kvHeadsGiven = r.kvHeads == 0 ? g.N : r.kvHeads;
    const Dims kd = dimsOf(op, "key", r.k, r.in, kvHeadsGiven);
    const Dims vd = dimsOf(op, "value", r.v, r.in, kvHeadsGiven);
    g.KVN = kd.N;
    if (!r.headsFromShape && r.in != Layout::BSH && r.in != Layout::SBH) {
      TORCH_CHECK(kd.N == kvHeadsGiven, "npu::", op, ": num_key_value_heads (", r.kvHeads, ", 0 = num_heads) must "
                  "equal key's head dimension (", kd.N, ") in layout ", layoutName(r.in),
                  "; pass num_key_value_heads=", kd.N);
    }
    TORCH_CHECK(kd.B == vd.B && kd.S == vd.S && kd.N == vd.N && (r.in == Layout::TND || kd.B == g.B), "npu::", op,
                ": key and value must share batch, length and heads with each other (and batch with query), got ",
                r.k.sizes(), " and ", r.v.sizes(), " for query ", r.q.sizes());
    TORCH_CHECK(kd.D == g.D, "npu::", op, ": key's head size ", kd.D, " differs from query's ", g.D);
    g.Skv = kd.S;
    g.Dv = vd.D;
  }
  TORCH_CHECK(g.KVN > 0 && g.N % g.KVN == 0 && g.N / g.KVN <= 64, "npu::", op, ": the query heads (", g.N,
              ") must be a multiple of the key/value heads (", g.KVN, "), at most 64 times as many");
  TORCH_CHECK(g.N <= 256 && g.D <= 512 && g.Dv <= 512, "npu::", op, ": at most 256 heads of size at most 512 "
              "(the Ascend limits), got ", g.N, " heads of size ", g.D);
  // The result: query's shape with value's head size, in the output layout.
  switch (r.out) {
    case Layout::BSH: g.outShape = {g.B, g.Sq, g.N * g.Dv}; break;
    case Layout::SBH: g.outShape = {g.Sq, g.B, g.N * g.Dv}; break;
    case Layout::BSND: g.outShape = {g.B, g.Sq, g.N, g.Dv}; break;
    case Layout::BNSD: g.outShape = {g.B, g.N, g.Sq, g.Dv}; break;
    case Layout::TND: g.outShape = {g.Sq, g.N, g.Dv}; break;
  }
  if (!r.wantLse) {
    g.lseShape = {1};
  } else if (r.in == Layout::TND) {
    g.lseShape = {g.Sq, g.N, 1};
  } else {
    g.lseShape = {g.B, g.N, g.Sq, 1};
  }
  if (r.mask.defined()) checkMaskShape(r, g);
  if (r.pse.defined()) {
    TORCH_CHECK(r.in != Layout::TND, "npu::", op, ": pse with layout TND is not supported on the npu device");
    TORCH_CHECK(r.pse.dim() <= 4 && r.pse.dim() >= 1, "npu::", op, ": pse_shift must be (B or 1, N, Q_S, KV_S), got ",
                r.pse.sizes());
  }
  return g;
}

namespace {

bool symbolic(const at::Tensor& t) {
  return t.defined() && t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// A size that is static in a model (heads, head size): a symbolic one is specialised.
int64_t staticSize(const at::Tensor& t, int64_t dim) { return t.sym_size(dim).guard_int(__FILE__, __LINE__); }

// The result shapes when torch.compile traces with dynamic shapes (batch or tokens
// symbolic): query's shape with value's head size, from the symbolic sizes. The head
// counts and sizes are static in a model; the checks wait for the kernel.
std::tuple<at::Tensor, at::Tensor> attentionForwardSymbolic(const Request& r) {
  std::vector<c10::SymInt> q(r.q.sym_sizes().begin(), r.q.sym_sizes().end());
  const c10::SymInt heads = r.heads;
  const int64_t kvHeads = r.kvHeads == 0 ? r.heads : r.kvHeads;
  c10::SymInt dv;
  if (r.blockTable.defined()) {
    dv = r.v.dim() == 3 ? r.v.sym_size(2) / kvHeads : r.v.sym_size(3);
  } else {
    dv = r.in == Layout::BSH || r.in == Layout::SBH ? r.v.sym_size(2) / kvHeads : r.v.sym_size(-1);
  }
  std::vector<c10::SymInt> out = q, lse{1};
  switch (r.in) {
    case Layout::BSH:
    case Layout::SBH: out[2] = heads * dv; lse = {q[0], heads, q[1], 1}; break;
    case Layout::BSND: out[3] = dv; lse = {q[0], heads, q[1], 1}; break;
    case Layout::BNSD: out[3] = dv; lse = {q[0], heads, q[2], 1}; break;
    case Layout::TND: out[2] = dv; lse = {q[0], heads, 1}; break;
  }
  if (r.in == Layout::BNSD && r.out == Layout::BSND) out = {q[0], q[2], q[1], dv};
  if (!r.wantLse) lse = {1};
  return {at::empty_symint(out, r.q.options()), at::empty_symint(lse, r.q.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> attentionForwardMeta(Request& r) {
  if (symbolic(r.q) || symbolic(r.k) || symbolic(r.v)) return attentionForwardSymbolic(r);
  Geometry g = describe(r);
  return {at::empty(g.outShape, r.q.options()), at::empty(g.lseShape, r.q.options().dtype(at::kFloat))};
}

// ---- the inference operators -------------------------------------------------------

void checkInferenceDtypes(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "npu::", op, ": query must be float16 "
              "or bfloat16 (the dtypes the Ascend operator takes), got ", q.scalar_type(), " on ", q.device(),
              "; cast with .half() or .bfloat16()");
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->scalar_type() != at::kChar, "npu::", op, ": an int8 key and value (KV antiquant) need "
                "antiquant_scale (and optionally antiquant_offset), per channel, to be read in query's dtype ",
                q.scalar_type());
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "npu::", op, ": key and value must have query's dtype ",
                q.scalar_type(), ", got ", t->scalar_type(), " on ", t->device());
  }
}

// KV antiquant: an int8 cache with per-channel antiquant_scale and antiquant_offset
// ([0] the key's, [1] the value's) is read as (x + offset) * scale in query's dtype,
// as the chip dequantizes it on the fly (and as npu_grouped_matmul its int8 weights).
// Without an int8 cache both must be None. Runs after parseLayout (the scale's shape
// follows the layout).
void dequantizeKv(Request& r, const at::Tensor& scale, const at::Tensor& offset, bool shapes_only = false) {
  const bool int8k = r.k.scalar_type() == at::kChar, int8v = r.v.scalar_type() == at::kChar;
  if (!scale.defined() && !offset.defined()) return;  // an int8 cache is refused by checkInferenceDtypes
  TORCH_CHECK(int8k && int8v, "npu::", r.op, ": antiquant_scale and antiquant_offset are for an int8 key and "
              "value, got ", r.k.scalar_type(), " and ", r.v.scalar_type(), "; pass None");
  TORCH_CHECK(scale.defined(), "npu::", r.op, ": antiquant_offset needs antiquant_scale");
  // One scale per key/value channel, broadcast over the cache: [N, D] for BSND and TND,
  // [N, 1, D] for BNSD and head-major paged caches, [H] for BSH and [blocks, block_size, H].
  const at::Tensor& k = r.k;
  const bool paged = r.blockTable.defined();
  TORCH_CHECK(k.dim() == 3 || k.dim() == 4, "npu::", r.op, ": key must be 3-D or 4-D, got ", k.sizes());
  std::vector<int64_t> channel;
  if (k.dim() == 3 && r.in == Layout::TND && !paged) {
    channel = {k.size(1), k.size(2)};
  } else if (k.dim() == 3) {
    channel = {k.size(2)};
  } else if (r.in == Layout::BSND && !paged) {
    channel = {k.size(2), k.size(3)};
  } else {
    channel = {k.size(1), 1, k.size(3)};
  }
  std::vector<int64_t> expected{2};
  expected.insert(expected.end(), channel.begin(), channel.end());
  const int64_t channels = c10::multiply_integers(channel);
  for (const at::Tensor* t : {&scale, &offset}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->dim() >= 2 && t->size(0) == 2 && t->numel() == 2 * channels && t->scalar_type() == r.q.scalar_type(),
                "npu::", r.op, ": antiquant_scale and antiquant_offset are one value per key/value channel, ",
                c10::IntArrayRef(expected), " (or [2, ", channels, "]) of query's dtype ", r.q.scalar_type(),
                ", got ", t->sizes(), " ", t->scalar_type(), "; per-tensor and per-token antiquant are not "
                "supported on the npu device");
  }
  if (shapes_only) {  // the caller reads the geometry only: no data is converted
    r.k = at::empty_symint(r.k.sym_sizes(), r.q.options().device(at::kMeta));
    r.v = at::empty_symint(r.v.sym_sizes(), r.q.options().device(at::kMeta));
    return;
  }
  at::Tensor kq = r.k, vq = r.v;
  if (paged && !kq.is_meta()) {
    // Only the blocks the table names are read: dequantize those (not the whole pool) and
    // renumber the table to them.
    const at::Tensor table = r.blockTable;
    const at::Tensor used = std::get<0>(at::_unique(table.masked_select(table.ge(0)).to(at::kLong), true));
    kq = kq.index_select(0, used);
    vq = vq.index_select(0, used);
    const at::Tensor renumbered = at::searchsorted(used, table.to(at::kLong)).to(table.scalar_type());
    r.blockTable = at::where(table.ge(0), renumbered, table);
  }
  auto dequantize = [&](const at::Tensor& x, int64_t which) {
    at::Tensor y = x.to(r.q.scalar_type());
    if (offset.defined()) y = y.add(offset.select(0, which).reshape(channel));
    return y.mul(scale.select(0, which).reshape(channel));
  };
  r.k = dequantize(kq, 0);
  r.v = dequantize(vq, 1);
}

// input_layout of the inference operators: "X" or "X_Y" (input X, output Y).
void parseLayout(Request& r, const std::string& s, std::initializer_list<const char*> allowed) {
  bool ok = false;
  for (const char* a : allowed) ok = ok || s == a;
  std::string list;
  for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
  TORCH_CHECK(ok, "npu::", r.op, ": input_layout '", s, "' is not supported on the npu device; use one of ", list);
  auto one = [&](const std::string& name) {
    if (name == "BSH") return Layout::BSH;
    if (name == "SBH") return Layout::SBH;
    if (name == "BSND") return Layout::BSND;
    if (name == "BNSD") return Layout::BNSD;
    return Layout::TND;
  };
  const auto split = s.find('_');
  r.in = one(s.substr(0, split));
  r.out = split == std::string::npos ? r.in : one(s.substr(split + 1));
}

void checkSparse(Request& r, std::initializer_list<int64_t> allowed) {
  bool ok = false;
  for (int64_t a : allowed) ok = ok || r.sparse == a;
  TORCH_CHECK(ok, "npu::", r.op, ": sparse_mode ", r.sparse, " is not supported (0 atten_mask and pre/next tokens, "
              "1 full atten_mask, 2 causal top-left, 3 causal bottom-right, 4 band)");
  if (r.sparse >= 2 && r.sparse <= 4) {
    const at::Tensor& m = r.mask;
    const bool compressed = m.defined() && m.dim() >= 2 && m.sym_size(-1) == 2048 && m.sym_size(-2) == 2048 &&
                            m.sym_numel() == 2048 * 2048;
    TORCH_CHECK(compressed, "npu::", r.op, ": sparse_mode ", r.sparse, " needs atten_mask as the compressed "
                "lower-triangular pattern of shape (2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048)",
                m.defined() ? ", got " : "", m.defined() ? c10::str(m.sizes()) : std::string());
  }
}

// Decode (one query per sequence): the sparse mode does not apply; a compressed
// causal pattern means no mask (bottom-right causal: the one query sees every key).
void asDecode(Request& r, const Geometry& g) {
  if (g.Sq != 1 || r.in == Layout::TND) return;
  r.decodeMaskShapes = true;
  if (r.sparse >= 2) r.mask = at::Tensor();
  r.sparse = 0;
  r.pre = r.next = kNoBand;
}

// How an inference operator names the arguments the four share (nullptr: it has none).
struct Spelling {
  const char* op;
  const char* heads;   // the query heads
  const char* scale;
  const char* qLens;   // the actual query lengths
  const char* kvLens;  // the actual key/value lengths
  bool prefill;        // more than one query per sequence: pre/next tokens, sparse_mode, layouts TND and BNSD_BSND
  bool paged;          // block_table and block_size
  bool antiquant;      // antiquant_scale and antiquant_offset (an int8 cache)
  const char* lse;     // the flag asking for softmax_lse
  const char* sink;    // learnable_sink
};

constexpr Spelling kPrompt{"npu_prompt_flash_attention", "num_heads", "scale_value", "actual_seq_lengths",
                           "actual_seq_lengths_kv", true, false, false, nullptr, nullptr};
constexpr Spelling kIncre{"npu_incre_flash_attention", "num_heads", "scale_value", nullptr, "actual_seq_lengths",
                          false, true, true, nullptr, nullptr};
constexpr Spelling kFusedInfer{"npu_fused_infer_attention_score", "num_heads", "scale", "actual_seq_lengths",
                               "actual_seq_lengths_kv", true, true, true, "softmax_lse_flag", nullptr};
constexpr Spelling kFusedInferV2{"npu_fused_infer_attention_score_v2", "num_query_heads", "softmax_scale",
                                 "actual_seq_qlen", "actual_seq_kvlen", true, true, false, "return_softmax_lse",
                                 "learnable_sink"};

// The request of an inference operator, after its own refusals. `shapes_only`: for
// callers that read the geometry alone (the workspace query), an int8 cache is checked
// but not dequantized.
Request inferenceRequest(const Args& a, const Spelling& s, bool shapes_only = false) {
  Request r;
  r.op = s.op;
  r.q = a.tensor("query");
  r.k = a.tensor("key");
  r.v = a.tensor("value");
  if (s.paged) r.blockTable = a.tensor("block_table");
  // An int8 cache is dequantized before the dtypes are checked, and after the layout
  // (the shape of its scales follows the layout).
  if (!s.antiquant) checkInferenceDtypes(r.op, r.q, r.k, r.v);
  if (s.prefill) {
    parseLayout(r, a.str("input_layout"), {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"});
  } else {
    parseLayout(r, a.str("input_layout"), {"BSH", "BSND", "BNSD"});
  }
  if (s.antiquant) {
    dequantizeKv(r, a.tensor("antiquant_scale"), a.tensor("antiquant_offset"), shapes_only);
    checkInferenceDtypes(r.op, r.q, r.k, r.v);
  }
  r.heads = a.integer(s.heads);
  r.kvHeads = a.integer("num_key_value_heads");
  r.scale = a.real(s.scale);
  if (s.prefill) {
    r.pre = a.integer("pre_tokens");
    r.next = a.integer("next_tokens");
    r.sparse = a.integer("sparse_mode");
  }
  r.mask = a.tensor("atten_mask");
  r.pse = a.tensor("pse_shift");
  if (s.qLens) r.qLensCount = a.length(s.qLens);
  r.kvLensCount = a.length(s.kvLens);
  if (s.paged) r.blockSize = a.integer("block_size");
  if (s.lse) r.wantLse = a.flag(s.lse);
  if (s.sink) {
    r.sink = a.tensor(s.sink);
    if (r.sink.defined()) {
      TORCH_CHECK(r.in == Layout::TND && r.sink.scalar_type() == at::kBFloat16 && r.sink.dim() == 1 &&
                      r.sink.size(0) == r.heads,
                  "npu::", r.op, ": learnable_sink must be bfloat16 of shape (num_query_heads,) = (", r.heads,
                  ",) with layout TND (the Ascend limits), got ", r.sink.scalar_type(), " ", r.sink.sizes(), " with ",
                  a.str("input_layout"));
    }
  }
  if (s.prefill) {
    checkSparse(r, {0, 1, 2, 3, 4});
  } else {
    r.decodeMaskShapes = true;
  }
  return r;
}

Request promptRequest(const Args& a) {
  a.refuse(kPrompt.op, {"padding_mask", "deq_scale1", "quant_scale1", "deq_scale2", "quant_scale2", "quant_offset2"},
           "int8 quantization; padding_mask is reserved");
  return inferenceRequest(a, kPrompt);
}

Request increRequest(const Args& a) {
  a.refuse(kIncre.op, {"padding_mask", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2",
                       "quant_offset2", "kv_padding_size"},
           "int8 queries and results, and left padding; padding_mask is reserved");
  return inferenceRequest(a, kIncre);
}

Request fusedInferRequest(const Args& a, bool shapes_only = false) {
  const char* op = kFusedInfer.op;
  a.refuse(op, {"dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
                "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                "key_rope_antiquant_scale"},
           "int8 queries and results, and separate key and value antiquant; an int8 cache takes antiquant_scale "
           "and antiquant_offset");
  a.refuse(op, {"query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
                "actual_shared_prefix_len", "query_rope", "key_rope"},
           "left padding, shared prefixes and MLA's rope inputs");
  TORCH_CHECK(!a.given("antiquant_scale") || a.integer("antiquant_mode") == 0, "npu::", op, ": antiquant_mode ",
              a.integer("antiquant_mode"), " is not supported on the npu device; use 0 (per channel)");
  return inferenceRequest(a, kFusedInfer, shapes_only);
}

Request fusedInferV2Request(const Args& a) {
  const char* op = kFusedInferV2.op;
  a.refuse(op, {"dequant_scale_query", "dequant_scale_key", "dequant_offset_key", "dequant_scale_value",
                "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_out", "quant_offset_out",
                "quant_scale_p", "query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
                "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype",
                "dequant_scale_key_dtype", "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype"},
           "quantization and dtype overrides");
  a.refuse(op, {"query_rope", "key_rope"}, "MLA's rope inputs");
  return inferenceRequest(a, kFusedInferV2);
}

// Reads the actual lengths (concrete values: kernels only).
void readLengths(Request& r, const Args& a, const char* qName, const char* kvName) {
  if (qName) r.qLens = a.ints(qName);
  if (kvName) r.kvLens = a.ints(kvName);
}

template <bool Meta>
void promptKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  Request r = promptRequest(a);
  if (!Meta) readLengths(r, a, kPrompt.qLens, kPrompt.kvLens);
  a.finish(std::get<0>(Meta ? attentionForwardMeta(r) : attentionForward(r)));
}

template <bool Meta>
void increKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  Request r = increRequest(a);
  if (!Meta) readLengths(r, a, kIncre.qLens, kIncre.kvLens);
  if (!symbolic(r.q)) {
    const Geometry g = describe(r);
    TORCH_CHECK(g.Sq == 1, "npu::", r.op, ": decodes one query per sequence (query's S must be 1, got ", g.Sq,
                "); use npu_prompt_flash_attention or npu_fused_infer_attention_score for more");
  }
  a.finish(std::get<0>(Meta ? attentionForwardMeta(r) : attentionForward(r)));
}

template <bool Meta, bool V2>
std::tuple<at::Tensor, at::Tensor> fusedInfer(const Args& a) {
  Request r = V2 ? fusedInferV2Request(a) : fusedInferRequest(a);
  const Spelling& s = V2 ? kFusedInferV2 : kFusedInfer;
  if (!Meta) readLengths(r, a, s.qLens, s.kvLens);
  if (Meta && (symbolic(r.q) || symbolic(r.k) || symbolic(r.v))) return attentionForwardSymbolic(r);
  Request probe = r;
  asDecode(r, describe(probe));
  if (r.decodeMaskShapes && r.in != Layout::TND) r.qLens.reset();  // decode: the query lengths do not apply
  return Meta ? attentionForwardMeta(r) : attentionForward(r);
}

template <bool Meta, bool V2>
void fusedInferKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  auto [out, lse] = fusedInfer<Meta, V2>(a);
  a.finish(std::move(out), std::move(lse));
}

// The .out form (vllm-ascend's graph mode): the results copied into the given tensors.
template <bool Meta, bool V2>
void fusedInferOutKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  auto [out, lse] = fusedInfer<Meta, V2>(a);
  at::Tensor attentionOut = a.tensor("attention_out"), softmaxLse = a.tensor("softmax_lse");
  if (attentionOut.sizes() != out.sizes()) attentionOut.resize_(out.sizes());
  if (softmaxLse.sizes() != lse.sizes()) softmaxLse.resize_(lse.sizes());
  if (!Meta) {
    attentionOut.copy_(out);
    softmaxLse.copy_(lse);
  }
  a.finish(attentionOut, softmaxLse);
}

// The workspace the .out form takes: none is needed here; the call checks the arguments.
template <bool Meta, bool V2>
void fusedInferWorkspaceKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  Request r = V2 ? fusedInferV2Request(a) : fusedInferRequest(a, /*shapes_only=*/true);
  if (!symbolic(r.q) && !symbolic(r.k)) describe(r);
  a.finish(at::empty({0}, r.q.options().dtype(at::kByte)));
}

// ---- npu_fusion_attention_grad -----------------------------------------------------

// Its arguments, parsed and checked; then the host kernel (fusionAttentionGrad).
void fusionAttentionGradKernelImpl(Args& a, bool meta) {
  Request r;
  r.op = "npu_fusion_attention_grad";
  a.refuse(r.op, {"padding_mask", "prefix", "softmax_in"}, "reserved arguments");
  a.refuse(r.op, {"sink"}, "attention sinks");
  TORCH_CHECK(a.str("softmax_layout").empty() || a.str("softmax_layout") == "TND" ||
                  a.str("softmax_layout") == "same_as_input",
              "npu::", r.op, ": softmax_layout '", a.str("softmax_layout"), "' is not supported; pass \"\"");
  const double keepProb = a.real("keep_prob");
  TORCH_CHECK(keepProb == 1.0, "npu::", r.op, ": keep_prob ", keepProb, " < 1 needs the forward's dropout mask, which "
              "the npu device does not regenerate from seed/offset; differentiate torch_npu.npu_fusion_attention with "
              "autograd instead (it replays its own dropout)");
  r.q = a.tensor("query");
  r.k = a.tensor("key");
  r.v = a.tensor("value");
  const at::Tensor dy = a.tensor("dy");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&r.k, &r.v, &dy}) {
    TORCH_CHECK(t->scalar_type() == r.q.scalar_type(), "npu::", r.op, ": query, key, value and dy must share a dtype, "
                "got ", r.q.scalar_type(), " and ", t->scalar_type());
  }
  TORCH_CHECK(r.q.scalar_type() == at::kFloat || r.q.scalar_type() == at::kHalf || r.q.scalar_type() == at::kBFloat16,
              "npu::", r.op, ": query must be float32, float16 or bfloat16, got ", r.q.scalar_type(), " on ",
              r.q.device());
  std::string layout = a.str("input_layout");
  for (auto& c : layout) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  parseLayout(r, layout, {"BSH", "SBH", "BSND", "BNSD", "TND"});
  r.heads = a.integer("head_num");
  r.headsFromShape = true;
  r.scale = a.real("scale_value");
  r.pre = a.integer("pre_tockens");
  r.next = a.integer("next_tockens");
  r.sparse = a.integer("sparse_mode");
  TORCH_CHECK(r.sparse >= 0 && r.sparse <= 4, "npu::", r.op, ": sparse_mode ", r.sparse, " is not supported on the "
              "npu device (npu_fusion_attention has 0 to 4: 0 atten_mask and pre/next tokens, 1 full atten_mask, "
              "2 causal top-left, 3 causal bottom-right, 4 band bottom-right)");
  r.bandWithoutMask = true;
  r.mask = a.tensor("atten_mask");
  // Modes 2-4: atten_mask is the compressed pattern; the mode's geometry (and, for 4, the
  // band of pre/next tokens from the bottom-right corner) replaces it.
  if (r.sparse >= 2) r.mask = at::Tensor();
  r.pse = a.tensor("pse");
  r.qLensCount = a.length("actual_seq_qlen");
  r.kvLensCount = a.length("actual_seq_kvlen");
  if (r.in == Layout::TND) {
    TORCH_CHECK(!r.mask.defined(), "npu::", r.op, ": layout TND takes atten_mask only with sparse_mode 2, 3 or 4 "
                "(the compressed pattern) on the npu device; pass no mask, or use layout BSND");
  }
  if (!meta && r.in == Layout::TND) readLengths(r, a, "actual_seq_qlen", "actual_seq_kvlen");
  // For BSH/SBH the kv heads follow from the sizes.
  if (r.in == Layout::BSH || r.in == Layout::SBH) {
    TORCH_CHECK(r.q.dim() == 3 && r.k.dim() == 3, "npu::", r.op, ": query and key must be 3-dimensional in layout ",
                layoutName(r.in), ", got ", r.q.sizes(), " and ", r.k.sizes());
    const int64_t hidden = staticSize(r.q, 2);
    TORCH_CHECK(r.heads > 0 && hidden % r.heads == 0, "npu::", r.op, ": query's hidden size ", hidden,
                " is not a multiple of head_num ", r.heads);
    r.kvHeads = staticSize(r.k, 2) / (hidden / r.heads);
  } else {
    r.kvHeads = r.k.dim() >= 3 ? staticSize(r.k, r.in == Layout::BSND ? 2 : 1) : 0;
  }
  if (meta && (symbolic(r.q) || symbolic(r.k) || symbolic(r.v))) {  // dynamic shapes: the inputs' shapes
    const at::Tensor dpse = r.pse.defined() ? at::empty_symint(r.pse.sym_sizes(), r.pse.options()) : at::Tensor();
    a.finish(at::empty_symint(r.q.sym_sizes(), r.q.options()), at::empty_symint(r.k.sym_sizes(), r.k.options()),
             at::empty_symint(r.v.sym_sizes(), r.v.options()), dpse, at::empty({0}, r.k.options().dtype(at::kFloat)));
    return;
  }
  const Geometry g = describe(r);
  TORCH_CHECK(dy.sizes() == r.q.sizes() && g.Dv == g.D, "npu::", r.op, ": dy must have query's shape ", r.q.sizes(),
              ", got ", dy.sizes());
  const at::Tensor pse = r.pse;
  at::Tensor dpse;
  if (meta) {
    if (pse.defined()) dpse = at::empty(pse.sizes(), pse.options());
    a.finish(at::empty(r.q.sizes(), r.q.options()), at::empty(r.k.sizes(), r.k.options()),
             at::empty(r.v.sizes(), r.v.options()), dpse, at::empty({0}, r.k.options().dtype(at::kFloat)));
    return;
  }
  const at::Tensor maxIn = a.tensor("softmax_max"), sumIn = a.tensor("softmax_sum"), outIn = a.tensor("attention_in");
  TORCH_CHECK(maxIn.defined() == sumIn.defined(), "npu::", r.op, ": give softmax_max and softmax_sum together (or "
              "neither, to recompute them)");
  if (maxIn.defined()) {
    const int64_t rows = r.in == Layout::TND ? g.Sq * g.N : g.B * g.N * g.Sq;
    TORCH_CHECK(maxIn.numel() % std::max<int64_t>(rows, 1) == 0 && sumIn.numel() == maxIn.numel() &&
                    maxIn.size(-1) == maxIn.numel() / std::max<int64_t>(rows, 1),
                "npu::", r.op, ": softmax_max and softmax_sum must be npu_fusion_attention's [B, N, S, 8] ([T, N, 8] "
                "for TND), got ", maxIn.sizes());
  }
  if (outIn.defined()) {
    TORCH_CHECK(outIn.sizes() == r.q.sizes(), "npu::", r.op, ": attention_in must be the forward's output, shaped like "
                "query ", r.q.sizes(), ", got ", outIn.sizes());
  }
  auto [dq, dk, dv, dp, dsink] = fusionAttentionGrad(r, g, dy, maxIn, sumIn, outIn);
  a.finish(std::move(dq), std::move(dk), std::move(dv), std::move(dp), std::move(dsink));
}

template <bool Meta>
void fusionAttentionGradKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  fusionAttentionGradKernelImpl(a, Meta);
}

// ---- the paged KV cache ------------------------------------------------------------

// The dtypes a cache may hold (the copies move bytes).
void checkCacheDtype(const char* op, const at::Tensor& t, const char* name, const at::Tensor& like) {
  const auto d = t.scalar_type();
  const bool ok = d == at::kHalf || d == at::kFloat || d == at::kBFloat16 || d == at::kChar || d == at::kByte ||
                  d == at::kShort || d == at::kInt || d == at::kFloat8_e5m2 || d == at::kFloat8_e4m3fn;
  TORCH_CHECK(ok, "npu::", op, ": ", name, " has dtype ", d, ", not one the cache takes (float16, float32, bfloat16, "
              "int8, uint8, int16, int32, float8)");
  TORCH_CHECK(d == like.scalar_type(), "npu::", op, ": ", name, " must have key's dtype ", like.scalar_type(),
              ", got ", d);
  TORCH_CHECK(t.is_contiguous(), "npu::", op, ": ", name, " must be contiguous (on ", t.device(),
              "); call .contiguous()");
}

void checkIndexDtype(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "npu::", op, ": ", name,
              " must be int32 or int64, got ", t.scalar_type());
}

CacheShape cacheShapeOf(const char* op, const char* name, const at::Tensor& cache, const at::Tensor& tokens,
                        CacheMode mode) {
  TORCH_CHECK(cache.dim() == 4, "npu::", op, ": ", name, " must be 4-dimensional, got ", cache.sizes());
  TORCH_CHECK(tokens.dim() == 3, "npu::", op, ": the tokens for ", name, " must be [tokens, heads, head_size], got ",
              tokens.sizes());
  CacheShape c;
  c.mode = mode;
  c.blocks = cache.size(0);
  c.width = tokens.size(1) * tokens.size(2);
  if (mode == CacheMode::Norm) {
    c.blockSize = cache.size(1);
    TORCH_CHECK(cache.size(2) == tokens.size(1) && cache.size(3) == tokens.size(2), "npu::", op, ": ", name,
                " [blocks, block_size, heads, head_size] must match the tokens' heads and head size ",
                tokens.sizes().slice(1), ", got ", cache.sizes());
  } else {
    c.blockSize = cache.size(2);
    c.last = cache.size(3);
    TORCH_CHECK(c.last > 0 && cache.size(1) * c.last == c.width, "npu::", op, ": ", name, " in PA_NZ is [blocks, H / ",
                "last, block_size, last] with H = heads * head_size = ", c.width, ", got ", cache.sizes());
  }
  return c;
}

template <bool Meta>
void scatterKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  const char* name = "npu_scatter_pa_kv_cache";
  a.refuse(name, {"compress_lens", "compress_seq_offsets", "seq_lens"}, "the compressed cache (4-D key/value)");
  const at::Tensor key = a.tensor("key"), value = a.tensor("value"), keyCache = a.tensor("key_cache"),
                   valueCache = a.tensor("value_cache"), slots = a.tensor("slot_mapping");
  if (Meta && (symbolic(key) || symbolic(value) || symbolic(keyCache) || symbolic(valueCache) || symbolic(slots))) {
    a.finish();  // dynamic shapes: nothing to infer, the kernel checks
    return;
  }
  const std::string modeName = a.str("cache_mode");
  TORCH_CHECK(modeName.empty() || modeName == "Norm" || modeName == "PA_NZ", "npu::", name, ": cache_mode must be "
              "'PA_NZ' or 'Norm' (or None), got '", modeName, "'");
  const CacheMode mode = modeName == "PA_NZ" ? CacheMode::Nz : CacheMode::Norm;
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3, "npu::", name, ": key and value must be [tokens, heads, head_size] "
              "on the npu device (4-D, the compressed cache, is not supported), got ", key.sizes(), " and ",
              value.sizes());
  TORCH_CHECK(key.size(0) == value.size(0) && key.size(1) == value.size(1), "npu::", name, ": key and value must "
              "share the tokens and heads, got ", key.sizes(), " and ", value.sizes());
  checkCacheDtype(name, key, "key", key);
  checkCacheDtype(name, value, "value", key);
  checkCacheDtype(name, keyCache, "key_cache", key);
  checkCacheDtype(name, valueCache, "value_cache", key);
  checkIndexDtype(name, slots, "slot_mapping");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == key.size(0), "npu::", name, ": slot_mapping must be [tokens] = [",
              key.size(0), "], got ", slots.sizes());
  const CacheShape kc = cacheShapeOf(name, "key_cache", keyCache, key, mode);
  const CacheShape vc = cacheShapeOf(name, "value_cache", valueCache, value, mode);
  TORCH_CHECK(kc.blocks == vc.blocks && kc.blockSize == vc.blockSize, "npu::", name, ": key_cache and value_cache "
              "must have the same blocks and block size, got ", keyCache.sizes(), " and ", valueCache.sizes());
  if (!Meta) scatterPaKvCache(name, key, value, keyCache, valueCache, slots, kc, vc);
  a.finish();
}

// Reads the sequences of block_tables back into key/value [tokens, heads, head_size],
// one sequence after another (Norm layout; see the Python wrapper for PA_NZ).
void gatherInto(const char* name, const at::Tensor& keyCache, const at::Tensor& valueCache, const at::Tensor& tables,
                const at::Tensor& seqLens, const at::Tensor& key, const at::Tensor& value, const at::Tensor& seqOffset,
                bool cumsum, bool run) {
  checkCacheDtype(name, keyCache, "key_cache", keyCache);
  checkCacheDtype(name, valueCache, "value_cache", keyCache);
  checkCacheDtype(name, key, "key", keyCache);
  checkCacheDtype(name, value, "value", keyCache);
  checkIndexDtype(name, tables, "block_tables");
  checkIndexDtype(name, seqLens, "seq_lens");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key.size(0) == value.size(0), "npu::", name, ": key and value "
              "must be [tokens, heads, head_size] with the same tokens, got ", key.sizes(), " and ", value.sizes());
  const CacheShape kc = cacheShapeOf(name, "key_cache", keyCache, key, CacheMode::Norm);
  const CacheShape vc = cacheShapeOf(name, "value_cache", valueCache, value, CacheMode::Norm);
  TORCH_CHECK(kc.blocks == vc.blocks && kc.blockSize == vc.blockSize, "npu::", name, ": key_cache and value_cache "
              "must have the same blocks and block size, got ", keyCache.sizes(), " and ", valueCache.sizes());
  TORCH_CHECK(tables.dim() == 2, "npu::", name, ": block_tables must be [batch, max blocks], got ", tables.sizes());
  const int64_t batches = tables.size(0);
  TORCH_CHECK(seqLens.dim() == 1 && seqLens.size(0) == batches + (cumsum ? 1 : 0), "npu::", name, ": seq_lens must "
              "have ", cumsum ? "batch + 1 cumulative entries (from 0)" : "one entry per batch", " (batch ", batches,
              "), got ", seqLens.sizes());
  if (seqOffset.defined()) {
    checkIndexDtype(name, seqOffset, "seq_offset");
    TORCH_CHECK(seqOffset.dim() == 1 && seqOffset.size(0) == batches, "npu::", name, ": seq_offset must be [batch] = [",
                batches, "], got ", seqOffset.sizes());
  }
  if (!run) return;
  gatherPaKvCache(name, keyCache, valueCache, tables, seqLens, key, value, seqOffset, cumsum, kc, vc);
}

template <bool Meta, bool Functional>
void gatherKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Args a(op, stack);
  const char* name = Functional ? "npu_gather_pa_kv_cache_functional" : "npu_gather_pa_kv_cache";
  at::Tensor key = a.tensor("key"), value = a.tensor("value");
  if (Functional) {
    key = Meta ? at::empty_symint(key.sym_sizes(), key.options()) : key.clone();
    value = Meta ? at::empty_symint(value.sym_sizes(), value.options()) : value.clone();
  }
  if (Meta && (symbolic(key) || symbolic(a.tensor("key_cache")) || symbolic(a.tensor("block_tables")))) {
    if (Functional) a.finish(std::move(key), std::move(value)); else a.finish();  // dynamic shapes: the kernel checks
    return;
  }
  gatherInto(name, a.tensor("key_cache"), a.tensor("value_cache"), a.tensor("block_tables"), a.tensor("seq_lens"), key,
             value, a.tensor("seq_offset"), a.flag("is_seq_lens_cumsum"), !Meta);
  if (Functional) a.finish(std::move(key), std::move(value)); else a.finish();
}

template <bool Meta>
void scatterFunctionalKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // The functional form: the same checks and copies, on clones of the caches.
  Args a(op, stack);
  at::Tensor keyCache = a.tensor("key_cache"), valueCache = a.tensor("value_cache");
  keyCache = Meta ? at::empty_symint(keyCache.sym_sizes(), keyCache.options()) : keyCache.clone();
  valueCache = Meta ? at::empty_symint(valueCache.sym_sizes(), valueCache.options()) : valueCache.clone();
  static const c10::OperatorHandle inplace =
      c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_scatter_pa_kv_cache", "");
  torch::jit::Stack call{a.tensor("key"), a.tensor("value"), keyCache, valueCache, a.tensor("slot_mapping"),
                         a["compress_lens"], a["compress_seq_offsets"], a["seq_lens"], a["cache_mode"]};
  if (Meta) {
    scatterKernel<true>(inplace, &call);
  } else {
    scatterKernel<false>(inplace, &call);
  }
  a.finish(std::move(keyCache), std::move(valueCache));
}

}  // namespace

}  // namespace npu::ops::attention

namespace npu::ops {

TORCH_LIBRARY_FRAGMENT(npu, m) {
  m.def("npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
        "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? deq_scale1=None, "
        "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
        "int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, int next_tokens=0, "
        "str input_layout=\"BSH\", int num_key_value_heads=0, int[]? actual_seq_lengths_kv=None, "
        "int sparse_mode=0) -> Tensor");
  m.def("npu_incre_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
        "Tensor? atten_mask=None, Tensor? pse_shift=None, SymInt[]? actual_seq_lengths=None, "
        "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? block_table=None, "
        "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
        "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? kv_padding_size=None, int num_heads=1, "
        "float scale_value=1.0, str input_layout=\"BSH\", int num_key_value_heads=0, int block_size=0, "
        "int inner_precise=1) -> Tensor");
  // The fused infer ops, their .out forms (vllm-ascend's graph mode) and the workspace query.
  const std::string fia =
      "Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
      "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
      "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
      "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
      "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
      "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
      "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
      "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
      "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
      "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
      "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
      "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
      "bool softmax_lse_flag=False";
  const std::string v2 =
      "Tensor query, Tensor key, Tensor value, *, Tensor? query_rope=None, "
      "Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, "
      "SymInt[]? actual_seq_kvlen=None, Tensor? block_table=None, Tensor? dequant_scale_query=None, "
      "Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
      "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, Tensor? quant_scale_out=None, "
      "Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, "
      "int num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int pre_tokens=2147483647, "
      "int next_tokens=2147483647, str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, "
      "int query_quant_mode=0, int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "
      "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, int? value_dtype=None, "
      "int? query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "
      "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, "
      "int? dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, "
      "int? dequant_scale_key_rope_dtype=None, int? out_dtype=None";
  const std::string outs =
      ", Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))";
  m.def(("npu_fused_infer_attention_score(" + fia + ") -> (Tensor, Tensor)").c_str());
  m.def(("npu_fused_infer_attention_score.out(" + fia + outs).c_str());
  m.def(("_npu_fused_infer_attention_score_get_max_workspace(" + fia + ") -> Tensor").c_str());
  m.def(("npu_fused_infer_attention_score_v2(" + v2 + ") -> (Tensor, Tensor)").c_str());
  m.def(("npu_fused_infer_attention_score_v2.out(" + v2 + outs).c_str());
  m.def(("_npu_fused_infer_attention_score_v2_get_max_workspace(" + v2 + ") -> Tensor").c_str());
  m.def("npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
        "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
        "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, "
        "float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
        "int inner_precise=0, int seed=0, int offset=0, int numels=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
        "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> ()");
  m.def("npu_scatter_pa_kv_cache_functional(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
        "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> (Tensor, Tensor)");
  m.def("npu_gather_pa_kv_cache(Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor(a!) key, Tensor(b!) value, *, Tensor? seq_offset=None, bool is_seq_lens_cumsum=False) -> ()");
  m.def("npu_gather_pa_kv_cache_functional(Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor key, Tensor value, *, Tensor? seq_offset=None, "
        "bool is_seq_lens_cumsum=False) -> (Tensor, Tensor)");
}

// One list for the npu, cpu and Meta registrations (Meta: the shape-only kernels).
template <bool Meta>
void registerAttentionKernels(torch::Library& m) {
  m.impl("npu_prompt_flash_attention", torch::CppFunction::makeFromBoxedFunction<&attention::promptKernel<Meta>>());
  m.impl("npu_incre_flash_attention", torch::CppFunction::makeFromBoxedFunction<&attention::increKernel<Meta>>());
  m.impl("npu_fused_infer_attention_score",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferKernel<Meta, false>>());
  m.impl("npu_fused_infer_attention_score_v2",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferKernel<Meta, true>>());
  m.impl("npu_fused_infer_attention_score.out",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferOutKernel<Meta, false>>());
  m.impl("npu_fused_infer_attention_score_v2.out",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferOutKernel<Meta, true>>());
  m.impl("_npu_fused_infer_attention_score_get_max_workspace",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferWorkspaceKernel<Meta, false>>());
  m.impl("_npu_fused_infer_attention_score_v2_get_max_workspace",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusedInferWorkspaceKernel<Meta, true>>());
  m.impl("npu_fusion_attention_grad",
      torch::CppFunction::makeFromBoxedFunction<&attention::fusionAttentionGradKernel<Meta>>());
  m.impl("npu_scatter_pa_kv_cache", torch::CppFunction::makeFromBoxedFunction<&attention::scatterKernel<Meta>>());
  m.impl("npu_scatter_pa_kv_cache_functional",
      torch::CppFunction::makeFromBoxedFunction<&attention::scatterFunctionalKernel<Meta>>());
  m.impl("npu_gather_pa_kv_cache", torch::CppFunction::makeFromBoxedFunction<&attention::gatherKernel<Meta, false>>());
  m.impl("npu_gather_pa_kv_cache_functional",
      torch::CppFunction::makeFromBoxedFunction<&attention::gatherKernel<Meta, true>>());
}
NPU_FUSED_KERNELS_FOR_NPU_AND_CPU(registerAttentionKernels<false>)
TORCH_LIBRARY_IMPL(npu, Meta, m) { registerAttentionKernels<true>(m); }

}  // namespace npu::ops
