// The host kernels of the attention ops of attention.h, on the request their
// definitions (ops/fused/attention.cpp) parsed and checked.
//
// One attention core serves them all. The work is tiles: query rows of one batch
// for the group of query heads of one kv head (GQA: consecutive query heads share
// a kv head), each over only the keys its rows can see (the sparse mode's
// geometry, the band, the actual lengths). A tile takes one float32 matmul for
// its scores, one pass per row for the maximum and one for exp and the sum
// (atten_mask applied there), and one matmul by V: the full score matrix never
// exists. Where a row of a tensor lies is an affine
// function of (batch, head, position) for each layout (Rows), or the block
// table's mapping for a paged cache, so no layout is ever transposed in memory.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "../../../core/profile.h"
#include "../../../runtime/tracing.h"
#include "../../fused/attention.h"
#include "fast_exp.h"
#include "on_host.h"

namespace npu::ops::attention {
namespace {

// At most this many query rows per tile: causal tiles then skip about half the keys.
constexpr int64_t kTileRows = 64;

// ---- layouts -----------------------------------------------------------------------

// Where row (b, n, i) (batch, head, position) of a [rows, D] view of a tensor lies.
struct Rows {
  std::vector<int64_t> base;  // per batch
  int64_t head = 0, seq = 0;
  int64_t at(int64_t b, int64_t n, int64_t i) const { return base[b] + n * head + i * seq; }
};

// `starts`: the first position of each batch in T (TND) ; s: the padded length (else).
Rows rowsOf(Layout l, int64_t batches, int64_t heads, int64_t s, const std::vector<int64_t>& starts) {
  Rows r;
  r.base.resize(batches);
  for (int64_t b = 0; b < batches; ++b) {
    switch (l) {
      case Layout::BSH:
      case Layout::BSND: r.base[b] = b * s * heads; break;
      case Layout::BNSD: r.base[b] = b * heads * s; break;
      case Layout::SBH: r.base[b] = b * heads; break;
      case Layout::TND: r.base[b] = starts[b] * heads; break;
    }
  }
  switch (l) {
    case Layout::BSH:
    case Layout::BSND:
    case Layout::TND: r.head = 1; r.seq = heads; break;
    case Layout::BNSD: r.head = s; r.seq = 1; break;
    case Layout::SBH: r.head = 1; r.seq = batches * heads; break;
  }
  return r;
}

// ---- the attention problem ---------------------------------------------------------

// Per batch: the query and key/value lengths, and (TND) where each starts.
struct Lengths {
  std::vector<int64_t> sq, skv, qStart, kvStart;
};

std::vector<int64_t> perBatch(const char* op, const char* what, const std::optional<std::vector<int64_t>>& given,
                              int64_t batches, int64_t padded) {
  std::vector<int64_t> out(batches, padded);
  if (!given) return out;
  TORCH_CHECK(given->size() == 1 || static_cast<int64_t>(given->size()) >= batches, "npu::", op, ": ", what,
              " must have 1 or at least batch (", batches, ") entries, got ", given->size());
  for (int64_t b = 0; b < batches; ++b) {
    out[b] = (*given)[given->size() == 1 ? 0 : b];
    TORCH_CHECK(out[b] >= 0 && out[b] <= padded, "npu::", op, ": ", what, "[", b, "] = ", out[b],
                " must be in [0, ", padded, "]");
  }
  return out;
}

void cumulative(const char* op, const char* what, const std::vector<int64_t>& ends, int64_t total,
                std::vector<int64_t>& lens, std::vector<int64_t>& starts) {
  int64_t previous = 0;
  for (int64_t end : ends) {
    TORCH_CHECK(end >= previous && end <= total, "npu::", op, ": ", what, " are cumulative sequence ends in layout "
                "TND: non-decreasing, at most ", total, ", got ", c10::IntArrayRef(ends));
    starts.push_back(previous);
    lens.push_back(end - previous);
    previous = end;
  }
}

Lengths lengthsOf(const Request& r, const Geometry& g) {
  Lengths l;
  if (r.in == Layout::TND) {
    cumulative(r.op, "the actual query lengths", *r.qLens, g.Sq, l.sq, l.qStart);
    if (r.blockTable.defined()) {  // paged: each sequence's own key/value length
      l.skv = perBatch(r.op, "actual key/value length", r.kvLens, g.B, g.Skv);
      l.kvStart.assign(g.B, 0);
    } else {
      cumulative(r.op, "the actual key/value lengths", *r.kvLens, r.k.size(0), l.skv, l.kvStart);
    }
  } else {
    l.sq = perBatch(r.op, "actual query length", r.qLens, g.B, g.Sq);
    l.skv = perBatch(r.op, "actual key/value length", r.kvLens, g.B, g.Skv);
    l.qStart.assign(g.B, 0);
    l.kvStart.assign(g.B, 0);
  }
  return l;
}

// Which scores a query row keeps: atten_mask (nonzero = masked out), the sparse
// mode's geometry, the band of pre/next tokens.
struct Masking {
  at::Tensor bytes;  // atten_mask as uint8, 4-D [B or 1, N or 1, >= Sq, >= Skv], or undefined
  int64_t sb = 0, sn = 0, si = 0;
  int64_t mode = 0, pre = kNoBand, next = kNoBand;
  bool band = false;
};

// The sparse mode's geometry and band, without atten_mask's content.
Masking geometryOf(const Request& r) {
  Masking m;
  m.mode = r.sparse;
  m.pre = r.pre;
  m.next = r.next;
  m.band = r.sparse == 4 ||
           (r.sparse == 0 && (r.mask.defined() || r.bandWithoutMask) && (r.pre < kNoBand || r.next < kNoBand));
  return m;
}

Masking maskingOf(const Request& r, const Geometry& g, const Lengths& l) {
  Masking m = geometryOf(r);
  // modes 2-4: geometry only; the compressed mask's content is the pattern itself
  if (r.sparse >= 2 || !r.mask.defined()) return m;
  at::Tensor mask = r.mask.to(at::kByte);
  const int64_t maxSkv = *std::max_element(l.skv.begin(), l.skv.end());
  if (mask.dim() == 2) {
    mask = r.decodeMaskShapes ? mask.view({mask.size(0), 1, 1, mask.size(1)})    // (B, KV_S)
                              : mask.view({1, 1, mask.size(0), mask.size(1)});  // (Q_S, KV_S)
  } else if (mask.dim() == 3) {
    mask = mask.unsqueeze(1);
  }
  TORCH_CHECK((mask.size(0) == 1 || mask.size(0) == g.B) && (mask.size(1) == 1 || mask.size(1) == g.N) &&
                  mask.size(2) >= g.Sq && mask.size(3) >= maxSkv,
              "npu::", r.op, ": atten_mask of shape ", r.mask.sizes(), " does not cover batch ", g.B, ", heads ", g.N,
              ", ", g.Sq, " queries and ", maxSkv, " keys; use (Q_S, KV_S), (B, Q_S, KV_S), (B, 1, Q_S, KV_S)",
              r.decodeMaskShapes ? " or (B, KV_S)" : "");
  m.bytes = mask.contiguous();
  m.sb = mask.size(0) == 1 ? 0 : m.bytes.stride(0);
  m.sn = mask.size(1) == 1 ? 0 : m.bytes.stride(1);
  m.si = m.bytes.stride(2);  // (the last dimension is contiguous)
  return m;
}

// The keys query row i of a sequence may see by the sparse mode's geometry and the
// band: [lo, hi] (before atten_mask). Both bounds grow with i.
void keptRange(const Masking& m, int64_t i, int64_t sq, int64_t skv, int64_t* lo, int64_t* hi) {
  const int64_t shift = skv - sq;  // bottom-right alignment
  *lo = 0;
  *hi = skv - 1;
  if (m.mode == 2) *hi = i;
  if (m.mode == 3) *hi = i + shift;
  if (m.band && m.mode == 0) {
    *lo = std::max<int64_t>(*lo, i - m.pre);
    *hi = std::min<int64_t>(*hi, i + m.next);
  }
  if (m.band && m.mode == 4) {
    *lo = std::max<int64_t>(*lo, i + shift - m.pre);
    *hi = std::min<int64_t>(*hi, i + shift + m.next);
  }
  *lo = std::max<int64_t>(*lo, 0);
  *hi = std::min<int64_t>(*hi, skv - 1);
}

// ---- vector loops (NPU_VECTOR_CLONES: on_host.h) -------------------------------------
// Row max over the kept keys [lo, hi] where mask (optional, 1 = masked) is 0.
NPU_VECTOR_CLONES float keptMax(const float* s, int64_t lo, int64_t hi, const uint8_t* mask) {
  float m = -std::numeric_limits<float>::infinity();
  if (mask == nullptr) {
#pragma omp simd reduction(max : m)
    for (int64_t j = lo; j <= hi; ++j) m = std::max(m, s[j]);
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = lo; j <= hi; ++j) m = std::max(m, mask[j] ? -std::numeric_limits<float>::infinity() : s[j]);
  }
  return m;
}

// s[j] = exp(s[j] - m) * scale for the kept keys, 0 for the others (n columns); returns
// the sum of the exps (before `scale`).
NPU_VECTOR_CLONES float expRow(float* s, int64_t n, int64_t lo, int64_t hi, const uint8_t* mask, float m,
                                   float scale) {
  float sum = 0;
  for (int64_t j = 0; j < lo; ++j) s[j] = 0;
  if (mask == nullptr) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = lo; j <= hi; ++j) {
      const float e = expOfNonPositive(s[j] - m);
      sum += e;
      s[j] = e * scale;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = lo; j <= hi; ++j) {
      const float e = mask[j] ? 0.0f : expOfNonPositive(s[j] - m);
      sum += e;
      s[j] = e * scale;
    }
  }
  for (int64_t j = std::max<int64_t>(hi + 1, lo); j < n; ++j) s[j] = 0;
  return sum;
}

// The rows of a tile: query rows i0.. of batch b, for the group of query heads of one kv
// head, against keys [begin, end) of the sequence.
struct Tile {
  int64_t b = 0, kvHead = 0, n0 = 0, i0 = 0, rows = 0, begin = 0, end = 0;
};

// A float32 view (or copy) of rows of a [rows, D] view: sizes (..., D), steps in rows.
at::Tensor strided(const at::Tensor& flat, int64_t first, std::vector<int64_t> sizes, std::vector<int64_t> steps) {
  const int64_t d = flat.size(1);
  for (auto& s : steps) s *= d;
  sizes.push_back(d);
  steps.push_back(1);
  return flat.as_strided(sizes, steps, flat.storage_offset() + first * d);
}

// The host tensors and indexing of one attention call.
struct Problem {
  Geometry g;
  Lengths len;
  Masking masking;
  at::Tensor qFlat, kFlat, vFlat;  // [rows, D]
  Rows qRows, kvRows;
  const int32_t* table = nullptr;
  int64_t tableCols = 0, blockSize = 0;
  at::Tensor pse;   // float32, 4-D, broadcast to [B, N, Sq, Skv] by strides
  at::Tensor sink;  // float32 [N], or undefined
  double scale = 1.0;
  int64_t group() const { return g.N / g.KVN; }

  // Keys [begin, end) of batch b, kv head h (or values, from vFlat), as float32 [end - begin, D].
  at::Tensor keys(const at::Tensor& flat, int64_t b, int64_t h, int64_t begin, int64_t end) const {
    const int64_t count = end - begin;
    if (table == nullptr) {
      return strided(flat, kvRows.at(b, h, len.kvStart[b] + begin), {count}, {kvRows.seq}).to(at::kFloat);
    }
    at::Tensor index = at::empty({count}, at::TensorOptions().dtype(at::kLong));
    int64_t* ip = index.mutable_data_ptr<int64_t>();
    for (int64_t j = begin; j < end; ++j) {
      const int64_t block = table[b * tableCols + j / blockSize], offset = j % blockSize;
      ip[j - begin] = g.headMajorCache ? (block * g.KVN + h) * blockSize + offset
                                       : (block * blockSize + offset) * g.KVN + h;
    }
    return flat.index_select(0, index).to(at::kFloat);
  }
  // Rows of a query-shaped tensor for a tile: [G, rows, D] (a view where it can be).
  at::Tensor queries(const at::Tensor& flat, const Tile& t) const {
    return strided(flat, qRows.at(t.b, t.n0, t.i0 + len.qStart[t.b]), {group(), t.rows}, {qRows.head, qRows.seq});
  }
  // The tiles of batch b and kv head h: their rows keep about 1 MB of scores, and each
  // covers only the keys its rows can see.
  void tiles(int64_t b, int64_t h, std::vector<Tile>& out) const {
    const int64_t sq = len.sq[b], skv = len.skv[b];
    if (sq == 0 || skv == 0) return;
    const int64_t step = std::clamp<int64_t>((int64_t{1} << 18) / std::max<int64_t>(1, group() * skv), 1, kTileRows);
    for (int64_t i0 = 0; i0 < sq; i0 += step) {
      Tile t{b, h, h * group(), i0, std::min(step, sq - i0), 0, 0};
      int64_t lo, hi, lastLo, lastHi;
      keptRange(masking, i0, sq, skv, &lo, &hi);
      keptRange(masking, i0 + t.rows - 1, sq, skv, &lastLo, &lastHi);
      t.begin = lo;
      t.end = lastHi + 1;
      if (t.end > t.begin) out.push_back(t);
    }
  }
  // The atten_mask row of query row i, head n (keys from `begin`), or null.
  const uint8_t* maskRow(int64_t b, int64_t n, int64_t i, int64_t begin) const {
    if (!masking.bytes.defined()) return nullptr;
    return masking.bytes.const_data_ptr<uint8_t>() + b * masking.sb + n * masking.sn + i * masking.si + begin;
  }
  // The scores of a tile, scaled and biased: float32 [G * rows, end - begin]; `qs` is the
  // tile's queries times the scale, [G * rows, D].
  at::Tensor scores(const Tile& t, const at::Tensor& qs, const at::Tensor& k) const {
    at::Tensor s = at::mm(qs, k.t());
    if (pse.defined()) {
      const int64_t G = group();
      at::Tensor bias = pse.select(0, pse.size(0) == 1 ? 0 : t.b)
                            .narrow(0, pse.size(1) == 1 ? 0 : t.n0, pse.size(1) == 1 ? 1 : G)
                            .narrow(1, pse.size(2) == 1 ? 0 : t.i0, pse.size(2) == 1 ? 1 : t.rows)
                            .narrow(2, pse.size(3) == 1 ? 0 : t.begin, pse.size(3) == 1 ? 1 : t.end - t.begin);
      s.view({G, t.rows, t.end - t.begin}).add_(bias);
    }
    return s;
  }
  // Runs `row(r, n, i, lo, hi, mask)` for each row r of a tile's scores: head n, query i,
  // kept keys [lo, hi] relative to the tile's first key.
  template <class Row>
  void eachRow(const Tile& t, Row row) const {
    const int64_t sq = len.sq[t.b], skv = len.skv[t.b];
    for (int64_t h = 0; h < group(); ++h) {
      for (int64_t r = 0; r < t.rows; ++r) {
        const int64_t i = t.i0 + r;
        int64_t lo, hi;
        keptRange(masking, i, sq, skv, &lo, &hi);
        lo = std::max(lo, t.begin) - t.begin;
        hi = std::min(hi, t.end - 1) - t.begin;
        row(h * t.rows + r, t.n0 + h, i, lo, hi, maskRow(t.b, t.n0 + h, i, t.begin));
      }
    }
  }
};

// Runs work(i) for i in [0, count) on the intra-op threads, each taking the next item
// when it is free: items of unequal cost (causal tiles) and a core busy with other
// work still balance (at::parallel_for splits the range evenly up front).
template <class Work>
void eachInParallel(int64_t count, bool parallel, Work work) {
  std::atomic<int64_t> next{0};
  const int64_t workers = parallel ? std::min<int64_t>(count, at::get_num_threads()) : 1;
  at::parallel_for(0, std::max<int64_t>(workers, 1), 1, [&](int64_t, int64_t) {
    for (int64_t i = next++; i < count; i = next++) work(i);
  });
}

// The host-side setup shared by the forward and backward kernels.
void prepare(Problem& p, const Request& r, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& table, const at::Tensor& pse) {
  const Geometry& g = p.g;
  p.len = lengthsOf(r, g);
  p.masking = maskingOf(r, g, p.len);
  p.scale = r.scale;
  p.qFlat = q.reshape({-1, g.D});
  p.kFlat = k.reshape({-1, g.D});
  p.vFlat = v.reshape({-1, g.Dv});
  p.qRows = rowsOf(r.in, g.B, g.N, g.Sq, std::vector<int64_t>(g.B, 0));
  if (table.defined()) {
    p.table = table.const_data_ptr<int32_t>();
    p.tableCols = table.size(1);
    p.blockSize = r.blockSize;
    const int64_t blocks = k.size(0);
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t j = 0; j < p.len.skv[b]; j += r.blockSize) {
        const int32_t block = p.table[b * p.tableCols + j / r.blockSize];
        TORCH_CHECK(block >= 0 && block < blocks, "npu::", r.op, ": block_table[", b, "][", j / r.blockSize, "] = ",
                    block, " is not a block of the cache (", blocks, " blocks); sequence ", b, " has ", p.len.skv[b],
                    " keys");
      }
    }
  } else {
    p.kvRows = rowsOf(r.in, g.B, g.KVN, g.Skv, std::vector<int64_t>(g.B, 0));
  }
  if (pse.defined()) {
    at::Tensor bias = pse.to(at::kFloat);
    while (bias.dim() < 4) bias = bias.unsqueeze(0);
    const int64_t maxSkv = *std::max_element(p.len.skv.begin(), p.len.skv.end());
    TORCH_CHECK((bias.size(0) == 1 || bias.size(0) == g.B) && (bias.size(1) == 1 || bias.size(1) == g.N) &&
                    (bias.size(2) == 1 || bias.size(2) >= g.Sq) && (bias.size(3) == 1 || bias.size(3) >= maxSkv),
                "npu::", r.op, ": pse of shape ", pse.sizes(), " does not broadcast to (", g.B, ", ", g.N, ", ", g.Sq,
                ", ", maxSkv, ")");
    p.pse = bias;
  }
}

// ---- projected times ------------------------------------------------------------
// While a profiler runs under a chip profile, each kernel's time on that chip: the
// attention's matmuls on the cube unit (only the key ranges the tiles see), the cache
// copies' traffic on the vector unit.

double tensorBytes(std::initializer_list<std::reference_wrapper<const at::Tensor>> tensors) {
  double bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) bytes += static_cast<double>(t.numel()) * static_cast<double>(t.itemsize());
  }
  return bytes;
}

runtime::tracing::Work workOf(double flops, bool cube, c10::ScalarType dtype, double bytes) {
  if (!profile::describingWork()) return {};
  return profile::describe(profile::KernelWork{flops, cube, dtype, bytes});
}

// The work of `matmuls` products over the tiles of a request (the key lengths from
// the arguments; a paged cache's blocks are not read).
runtime::tracing::Work attentionWork(const Request& r, const Geometry& g, double matmuls) {
  if (!profile::describingWork()) return {};
  Problem p;
  p.g = g;
  p.len = lengthsOf(r, g);
  p.masking = geometryOf(r);
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < g.B; ++b) {
    for (int64_t h = 0; h < g.KVN; ++h) p.tiles(b, h, tiles);
  }
  double flops = 0;
  for (const Tile& t : tiles) {
    // one [G * rows, D] x [D, keys] product (the ones with Dv alike)
    const double perMatmul = 2.0 * p.group() * t.rows * (t.end - t.begin) * (g.D + g.Dv) / 2;
    flops += perMatmul * matmuls;
  }
  return workOf(flops, true, r.q.scalar_type(), tensorBytes({r.q, r.k, r.v}) * 2);
}

// ---- the paged KV cache ------------------------------------------------------------

std::vector<int64_t> toLongs(const at::Tensor& t) {
  const at::Tensor l = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(l.const_data_ptr<int64_t>(), l.const_data_ptr<int64_t>() + l.numel());
}

// Where the elements of cache slot `slot` lie: `pieces` runs of `run` elements,
// `stride` elements apart, from the returned offset.
struct SlotRuns {
  int64_t first, pieces, run, stride;
};
SlotRuns slotRuns(const CacheShape& c, int64_t slot) {
  const int64_t block = slot / c.blockSize, offset = slot % c.blockSize;
  if (c.mode == CacheMode::Norm) return {(block * c.blockSize + offset) * c.width, 1, c.width, 0};
  const int64_t pieces = c.width / c.last;
  return {(block * pieces * c.blockSize + offset) * c.last, pieces, c.last, c.blockSize * c.last};
}

void writeSlot(const CacheShape& c, uint8_t* cache, const uint8_t* token, int64_t slot, size_t item) {
  const SlotRuns r = slotRuns(c, slot);
  for (int64_t k = 0; k < r.pieces; ++k) {
    std::memcpy(cache + (r.first + k * r.stride) * item, token + k * r.run * item, r.run * item);
  }
}

void readSlot(const CacheShape& c, const uint8_t* cache, uint8_t* token, int64_t slot, size_t item) {
  const SlotRuns r = slotRuns(c, slot);
  for (int64_t k = 0; k < r.pieces; ++k) {
    std::memcpy(token + k * r.run * item, cache + (r.first + k * r.stride) * item, r.run * item);
  }
}

}  // namespace

// ---- the kernels (attention.h) -----------------------------------------------------

// The forward: out (zero where a row sees no key) and lse [B, N, Sq] / [T, N] (-inf there).
std::tuple<at::Tensor, at::Tensor> attentionForward(Request& r) {
  Geometry g = describe(r);
  runtime::tracing::WorkHint work(attentionWork(r, g, 2));
  return onHost(r.op, {r.q, r.k, r.v, r.mask, r.pse, r.blockTable, r.sink}, [&](auto input, auto output) {
    Problem p;
    p.g = g;
    const at::Tensor q = input(r.q), k = input(r.k), v = input(r.v);
    const at::Tensor table = input(r.blockTable);
    Request host = r;
    host.mask = input(r.mask);
    prepare(p, host, q, k, v, table, input(r.pse));
    if (r.sink.defined()) p.sink = input(r.sink).to(at::kFloat).contiguous();
    at::Tensor out = at::zeros(g.outShape, q.options());
    at::Tensor outFlat = out.view({-1, g.Dv});
    const Rows outRows = rowsOf(r.out, g.B, g.N, g.Sq, std::vector<int64_t>(g.B, 0));
    at::Tensor lse = at::full({(r.in == Layout::TND ? 1 : g.B) * g.N * g.Sq}, -std::numeric_limits<float>::infinity(),
                              q.options().dtype(at::kFloat));
    float* lsePtr = lse.mutable_data_ptr<float>();
    const Rows lseRows = rowsOf(r.in == Layout::TND ? Layout::TND : Layout::BNSD, g.B, g.N, g.Sq,
                                std::vector<int64_t>(g.B, 0));
    const float* sinkPtr = p.sink.defined() ? p.sink.const_data_ptr<float>() : nullptr;
    std::vector<Tile> work;
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t h = 0; h < g.KVN; ++h) p.tiles(b, h, work);
    }
    // the costliest tiles first, so the last ones to finish are short
    std::stable_sort(work.begin(), work.end(), [](const Tile& x, const Tile& y) {
      return x.rows * (x.end - x.begin) > y.rows * (y.end - y.begin);
    });
    const int64_t G = p.group();
    eachInParallel(static_cast<int64_t>(work.size()), true, [&](int64_t w) {
      const Tile& t = work[w];
      const int64_t width = t.end - t.begin;
      const at::Tensor keys = p.keys(p.kFlat, t.b, t.kvHead, t.begin, t.end);
      const at::Tensor values = p.keys(p.vFlat, t.b, t.kvHead, t.begin, t.end);
      const at::Tensor qs = p.queries(p.qFlat, t).to(at::kFloat).mul(p.scale).reshape({G * t.rows, g.D});
      at::Tensor s = p.scores(t, qs, keys);
      float* sp = s.mutable_data_ptr<float>();
      p.eachRow(t, [&](int64_t row, int64_t n, int64_t i, int64_t lo, int64_t hi, const uint8_t* mask) {
        float* sr = sp + row * width;
        float m = keptMax(sr, lo, hi, mask);
        if (sinkPtr) m = std::max(m, sinkPtr[n]);  // the sink is one more logit of the row
        if (m == -std::numeric_limits<float>::infinity()) {  // the row sees no key
          std::fill(sr, sr + width, 0.0f);
          return;
        }
        // exps first, then the row divided by their sum (the sink's exp included)
        float sum = expRow(sr, width, lo, hi, mask, m, 1.0f);
        if (sinkPtr) sum += std::exp(sinkPtr[n] - m);
        const float inv = 1.0f / sum;
        for (int64_t j = lo; j <= hi; ++j) sr[j] *= inv;
        lsePtr[lseRows.at(t.b, n, i + p.len.qStart[t.b])] = m + std::log(sum);
      });
      const at::Tensor o = at::mm(s, values);  // [G * rows, Dv]
      strided(outFlat, outRows.at(t.b, t.n0, t.i0 + p.len.qStart[t.b]), {G, t.rows}, {outRows.head, outRows.seq})
          .copy_(o.view({G, t.rows, g.Dv}));
    });
    at::Tensor lseOut = r.wantLse ? lse.view(g.lseShape) : at::zeros({1}, q.options().dtype(at::kFloat));
    return std::make_tuple(output(out), output(lseOut));
  });
}

// npu_fusion_attention_grad: dq, dk, dv (and dpse) of out = softmax(scale * (q k^T + pse),
// masked) v, as npu_fusion_attention computes it: per tile, P from the forward's
// statistics (exp(s - softmax_max) / softmax_sum) or recomputed, then dV = P^T dO,
// dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusionAttentionGrad(
    const Request& r, const Geometry& g, const at::Tensor& dy, const at::Tensor& maxIn, const at::Tensor& sumIn,
    const at::Tensor& outIn) {
  const at::Tensor& pse = r.pse;
  // five matmuls: the scores again, dV, dP, dQ and dK
  runtime::tracing::WorkHint work(attentionWork(r, g, 5));
  return onHost(r.op, {r.q, r.k, r.v, dy, r.mask, pse, maxIn, sumIn, outIn}, [&](auto input, auto output) {
    Problem p;
    p.g = g;
    const at::Tensor q = input(r.q), k = input(r.k), v = input(r.v), dO = input(dy);
    Request host = r;
    host.mask = input(r.mask);
    // npu_fusion_attention's scores are scale * (q k^T + pse): the core adds a bias to the
    // scaled scores, so it is given scale * pse (and dpse = scale * dbias).
    prepare(p, host, q, k, v, at::Tensor(), pse.defined() ? input(pse).to(at::kFloat).mul(r.scale) : at::Tensor());
    const at::Tensor doFlat = dO.reshape({-1, g.D});
    const at::Tensor outFlat = outIn.defined() ? input(outIn).reshape({-1, g.D}) : at::Tensor();
    const Rows statRows = rowsOf(r.in == Layout::TND ? Layout::TND : Layout::BNSD, g.B, g.N, g.Sq,
                                 std::vector<int64_t>(g.B, 0));
    at::Tensor maxes, sums;  // the forward's statistics, one per query row
    if (maxIn.defined()) {
      const int64_t width = maxIn.size(-1);
      maxes = input(maxIn).to(at::kFloat).reshape({-1, width}).select(1, 0).contiguous();
      sums = input(sumIn).to(at::kFloat).reshape({-1, width}).select(1, 0).contiguous();
    }
    at::Tensor dq = at::zeros(q.sizes(), q.options()), dk = at::zeros(k.sizes(), k.options()),
               dv = at::zeros(v.sizes(), v.options());
    at::Tensor dqFlat = dq.view({-1, g.D}), dkFlat = dk.view({-1, g.D}), dvFlat = dv.view({-1, g.Dv});
    at::Tensor dbias = p.pse.defined() ? at::zeros(p.pse.sizes(), p.pse.options()) : at::Tensor();
    const int64_t G = p.group();
    // Tiles run in parallel, each giving its own dk and dv rows (float32, over its key
    // range); each (batch, kv head) then adds its tiles' parts in tile order, so the
    // result does not depend on the thread schedule. dpse sums over what pse is broadcast
    // over (batches, heads, query rows): then the tiles run one at a time.
    const bool sharedBias = dbias.defined() && ((dbias.size(0) == 1 && g.B > 1) || dbias.size(1) != g.N ||
                                                dbias.size(2) == 1);
    std::vector<Tile> work;
    std::vector<int64_t> firstTile(g.B * g.KVN + 1, 0);  // the tiles of task (b, h): [first[t], first[t + 1])
    for (int64_t task = 0; task < g.B * g.KVN; ++task) {
      p.tiles(task / g.KVN, task % g.KVN, work);
      firstTile[task + 1] = static_cast<int64_t>(work.size());
    }
    std::vector<at::Tensor> partK(work.size()), partV(work.size());
    const float* mp = maxes.defined() ? maxes.const_data_ptr<float>() : nullptr;
    const float* sp = sums.defined() ? sums.const_data_ptr<float>() : nullptr;
    eachInParallel(static_cast<int64_t>(work.size()), !sharedBias, [&](int64_t w) {
      const Tile& t = work[w];
      const int64_t b = t.b, width = t.end - t.begin, rows = G * t.rows;
      const at::Tensor k = p.keys(p.kFlat, b, t.kvHead, t.begin, t.end);
      const at::Tensor vv = p.keys(p.vFlat, b, t.kvHead, t.begin, t.end);
      // The queries times the scale: the scores are qs k^T, and dk = dS^T qs.
      const at::Tensor qs = p.queries(p.qFlat, t).to(at::kFloat).mul(p.scale).reshape({rows, g.D});
      const at::Tensor dof = p.queries(doFlat, t).to(at::kFloat).reshape({rows, g.Dv});
      at::Tensor probs = p.scores(t, qs, k);
      float* pp = probs.mutable_data_ptr<float>();
      p.eachRow(t, [&](int64_t row, int64_t n, int64_t i, int64_t lo, int64_t hi, const uint8_t* mask) {
        float* pr = pp + row * width;
        if (mp != nullptr) {  // P = exp(s - softmax_max) / softmax_sum, from the forward
          const int64_t at = statRows.at(b, n, i + p.len.qStart[b]);
          if (mp[at] == -std::numeric_limits<float>::infinity()) {
            std::fill(pr, pr + width, 0.0f);
          } else {
            expRow(pr, width, lo, hi, mask, mp[at], 1.0f / sp[at]);
          }
          return;
        }
        const float m = keptMax(pr, lo, hi, mask);
        if (m == -std::numeric_limits<float>::infinity()) {
          std::fill(pr, pr + width, 0.0f);
          return;
        }
        const float inv = 1.0f / expRow(pr, width, lo, hi, mask, m, 1.0f);
        for (int64_t j = lo; j <= hi; ++j) pr[j] *= inv;
      });
      const at::Tensor o = outFlat.defined() ? p.queries(outFlat, t).to(at::kFloat).reshape({rows, g.Dv})
                                             : at::mm(probs, vv);
      partV[w] = at::mm(probs.t(), dof);
      // dS = P * (dO v^T - rowsum(dO * O)): the gradient of the scaled scores
      at::Tensor ds = at::mm(dof, vv.t()).sub_(dof.mul(o).sum(-1, true)).mul_(probs);
      if (dbias.defined()) {
        at::Tensor target = dbias.select(0, dbias.size(0) == 1 ? 0 : b);
        at::Tensor part = ds.view({G, t.rows, width});
        if (target.size(0) == 1) part = part.sum(0, true); else target = target.narrow(0, t.n0, G);
        if (target.size(1) == 1) part = part.sum(1, true); else target = target.narrow(1, t.i0, t.rows);
        if (target.size(2) == 1) part = part.sum(2, true); else target = target.narrow(2, t.begin, width);
        target.add_(part);
      }
      strided(dqFlat, p.qRows.at(b, t.n0, t.i0 + p.len.qStart[b]), {G, t.rows}, {p.qRows.head, p.qRows.seq})
          .copy_(at::mm(ds, k).mul_(p.scale).view({G, t.rows, g.D}));
      partK[w] = at::mm(ds.t(), qs);
    });
    eachInParallel(g.B * g.KVN, true, [&](int64_t task) {
      if (firstTile[task] == firstTile[task + 1]) return;
      const int64_t b = task / g.KVN, h = task % g.KVN, skv = p.len.skv[b];
      at::Tensor dK = at::zeros({skv, g.D}, at::TensorOptions().dtype(at::kFloat));
      at::Tensor dV = at::zeros({skv, g.Dv}, at::TensorOptions().dtype(at::kFloat));
      for (int64_t w = firstTile[task]; w < firstTile[task + 1]; ++w) {
        dK.narrow(0, work[w].begin, partK[w].size(0)).add_(partK[w]);
        dV.narrow(0, work[w].begin, partV[w].size(0)).add_(partV[w]);
      }
      const int64_t first = p.kvRows.at(b, h, p.len.kvStart[b]);
      strided(dkFlat, first, {skv}, {p.kvRows.seq}).copy_(dK);
      strided(dvFlat, first, {skv}, {p.kvRows.seq}).copy_(dV);
    });
    at::Tensor dpseOut;
    if (dbias.defined()) dpseOut = output(dbias.mul(r.scale).reshape(pse.sizes()).to(pse.scalar_type()));
    return std::make_tuple(output(dq), output(dk), output(dv), dpseOut,
                           output(at::empty({0}, q.options().dtype(at::kFloat))));
  });
}

void scatterPaKvCache(const char* name, const at::Tensor& key, const at::Tensor& value, const at::Tensor& keyCache,
                      const at::Tensor& valueCache, const at::Tensor& slots, const CacheShape& kc,
                      const CacheShape& vc) {
  // the tokens read and their slots written
  runtime::tracing::WorkHint work(workOf(static_cast<double>(key.numel() + value.numel()), false,
                                                     key.scalar_type(), 2 * tensorBytes({key, value})));
  onHost(name, {key, value, keyCache, valueCache, slots}, [&](auto input, auto) {
    const at::Tensor k = input(key), v = input(value), kcache = input(keyCache), vcache = input(valueCache);
    const std::vector<int64_t> slot = toLongs(input(slots));
    const int64_t capacity = kc.blocks * kc.blockSize;
    for (size_t t = 0; t < slot.size(); ++t) {
      TORCH_CHECK(slot[t] < capacity, "npu::", name, ": slot_mapping[", t, "] = ", slot[t], " is past the cache (",
                  kc.blocks, " blocks of ", kc.blockSize, ")");
    }
    const size_t item = k.element_size();
    const auto* kp = static_cast<const uint8_t*>(k.const_data_ptr());
    const auto* vp = static_cast<const uint8_t*>(v.const_data_ptr());
    auto* kcp = static_cast<uint8_t*>(kcache.mutable_data_ptr());
    auto* vcp = static_cast<uint8_t*>(vcache.mutable_data_ptr());
    at::parallel_for(0, static_cast<int64_t>(slot.size()), 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (slot[t] < 0) continue;  // padding tokens
        writeSlot(kc, kcp, kp + t * kc.width * item, slot[t], item);
        writeSlot(vc, vcp, vp + t * vc.width * item, slot[t], item);
      }
    });
    return 0;
  });
}

// Key/value [tokens, heads, head_size] (Norm layout; see the Python wrapper for PA_NZ).
void gatherPaKvCache(const char* name, const at::Tensor& keyCache, const at::Tensor& valueCache,
                     const at::Tensor& tables, const at::Tensor& seqLens, const at::Tensor& key,
                     const at::Tensor& value, const at::Tensor& seqOffset, bool cumsum, const CacheShape& kc,
                     const CacheShape& vc) {
  const int64_t batches = tables.size(0);
  runtime::tracing::WorkHint work(workOf(static_cast<double>(key.numel() + value.numel()), false,
                                                     key.scalar_type(), 2 * tensorBytes({key, value})));
  onHost(name, {keyCache, valueCache, tables, seqLens, key, value, seqOffset}, [&](auto input, auto) {
    const at::Tensor kcache = input(keyCache), vcache = input(valueCache), k = input(key), v = input(value);
    const std::vector<int64_t> table = toLongs(input(tables));
    std::vector<int64_t> lens = toLongs(input(seqLens));
    if (cumsum) {
      for (int64_t b = 0; b < batches; ++b) lens[b] = lens[b + 1] - lens[b];
      lens.resize(batches);
    }
    const std::vector<int64_t> offsets =
        seqOffset.defined() ? toLongs(input(seqOffset)) : std::vector<int64_t>(batches, 0);
    const int64_t cols = tables.size(1), tokens = k.size(0);
    const size_t item = k.element_size();
    const auto* kcp = static_cast<const uint8_t*>(kcache.const_data_ptr());
    const auto* vcp = static_cast<const uint8_t*>(vcache.const_data_ptr());
    auto* kp = static_cast<uint8_t*>(k.mutable_data_ptr());
    auto* vp = static_cast<uint8_t*>(v.mutable_data_ptr());
    int64_t row = 0;
    for (int64_t b = 0; b < batches && row < tokens; ++b) {
      TORCH_CHECK(lens[b] >= 0, "npu::", name, ": seq_lens[", b, "] = ", lens[b], " is negative");
      const int64_t first = offsets[b] / kc.blockSize;  // the sequence starts at a block
      for (int64_t j = 0; j < lens[b] && row < tokens; ++j, ++row) {
        const int64_t column = first + j / kc.blockSize;
        const int64_t block = column < cols ? table[b * cols + column] : -1;
        if (block < 0 || block >= kc.blocks) {  // no such block: zeros, as Ascend's kernel
          std::memset(kp + row * kc.width * item, 0, kc.width * item);
          std::memset(vp + row * vc.width * item, 0, vc.width * item);
          continue;
        }
        const int64_t slot = block * kc.blockSize + j % kc.blockSize;
        readSlot(kc, kcp, kp + row * kc.width * item, slot, item);
        readSlot(vc, vcp, vp + row * vc.width * item, slot, item);
      }
    }
    return 0;
  });
}

}  // namespace npu::ops::attention
