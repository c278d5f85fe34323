#include "allocator.h"
#include "allocator_config.h"
#include "capture.h"
#include "launch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <iomanip>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include "device.h"
#include "stream.h"
#include "usage_board.h"

namespace npu {

namespace {

constexpr std::size_t kMinBlockSize = 512;        // every size is rounded up to this
constexpr std::size_t kSmallSize = 1 << 20;       // requests up to 1 MiB use the small pool
constexpr std::size_t kSmallSegment = 2 << 20;    // small pool grows by 2 MiB segments
constexpr std::size_t kLargeSegment = 20 << 20;   // requests under 10 MiB share 20 MiB segments
constexpr std::size_t kMinLargeAlloc = 10 << 20;
constexpr std::size_t kLargeRounding = 2 << 20;   // larger requests get their own, rounded
using namespace allocator_config;

std::size_t roundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// PYTORCH_NPU_ALLOC_CONF (allocator_config.h), read under the allocator's lock.
Settings g_settings;
// change_current_allocator's: segments of the general pools come from it (never reset).
std::atomic<const allocator::SegmentSource*> g_current_source{nullptr};
std::atomic<bool> g_allocated_once{false};
std::shared_ptr<const allocator::SegmentSource> g_current_source_owner;
std::shared_ptr<const allocator::SegmentSource> currentSourceShared() {
  return g_current_source.load(std::memory_order_acquire) != nullptr ? g_current_source_owner : nullptr;
}
// MemPool(allocator=...): the pools whose segments come from a pluggable allocator.
std::mutex g_pool_sources_mutex;
std::map<c10::MempoolId_t, std::shared_ptr<const allocator::SegmentSource>> g_pool_sources;
// torch.npu.caching_allocator_enable(False): no reuse of freed memory; each free
// goes back to the device once its stream's work passed it (cudaFree waits likewise).
std::atomic<bool> g_caching_enabled{true};

std::size_t divisionsFor(std::size_t size) {
  const int log_size = floorLog2(size);
  const int index = std::clamp(log_size - floorLog2(kMiB), 0, kRoundupIntervals - 1);
  return g_settings.divisions[static_cast<std::size_t>(index)];
}

// CUDA's round_size: 512-byte steps, or with roundup_power2_divisions the next of
// `divisions` equal steps between two powers of two.
std::size_t roundSize(std::size_t size) {
  if (size <= kMinBlockSize) return kMinBlockSize;
  const std::size_t divisions = divisionsFor(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    if (isPowerOf2(size)) return size;
    const std::size_t floor = std::size_t(1) << floorLog2(size);
    const std::size_t step = floor / divisions;
    if (step == 0) return floor << 1;
    const std::size_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
  }
  return roundUp(size, kMinBlockSize);
}

// Statistics are c10's (CachingDeviceAllocator::DeviceStats): torch.npu.memory_stats()
// and torch.accelerator.memory_stats() read the same numbers.
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using c10::CachingAllocator::StatArray;
constexpr int kAllPools = static_cast<int>(c10::CachingAllocator::StatType::AGGREGATE);
constexpr int kSmallPool = static_cast<int>(c10::CachingAllocator::StatType::SMALL_POOL);
constexpr int kLargePool = static_cast<int>(c10::CachingAllocator::StatType::LARGE_POOL);

// Every allocation and free updates several of these: kept inline and branch-light.
inline void updateStat(StatArray& stat, bool small, int64_t delta) {
  auto& all = stat[kAllPools];
  auto& pool = stat[small ? kSmallPool : kLargePool];
  if (delta > 0) {
    all.increase(static_cast<std::size_t>(delta));
    pool.increase(static_cast<std::size_t>(delta));
  } else {
    all.decrease(static_cast<std::size_t>(-delta));
    pool.decrease(static_cast<std::size_t>(-delta));
  }
}

// name -> array, in the order torch.cuda.memory_stats() lists them
std::vector<std::pair<const char*, StatArray*>> statArrays(DeviceStats& stats) {
  return {{"active", &stats.active},
          {"active_bytes", &stats.active_bytes},
          {"allocated_bytes", &stats.allocated_bytes},
          {"allocation", &stats.allocation},
          {"inactive_split", &stats.inactive_split},
          {"inactive_split_bytes", &stats.inactive_split_bytes},
          {"requested_bytes", &stats.requested_bytes},
          {"reserved_bytes", &stats.reserved_bytes},
          {"segment", &stats.segment}};
}

DeviceStats freshStats() {
  DeviceStats stats;
  stats.max_split_size = -1;  // every block may be split (CUDA's "no limit")
  return stats;
}

// _record_memory_history's state. The flags are read without the lock (to gather a
// context before taking it); the trace buffers live in each DeviceCache, under it.
struct History {
  std::atomic<bool> record_state{false};
  std::atomic<bool> record_history{false};
  std::atomic<int> context{0};  // RecordContext
  std::atomic<c10::CachingDeviceAllocator::CreateContextFn> gather{nullptr};
  std::size_t max_entries = 0;

  bool contextFor(RecordContext needed) const {
    return gather.load() != nullptr && context.load() >= static_cast<int>(needed);
  }
  // The context of an allocation: kept with the block (state) and the trace (alloc).
  std::shared_ptr<c10::GatheredContext> allocContext() const {
    const bool want = (record_state && contextFor(RecordContext::STATE)) ||
                      (record_history && contextFor(RecordContext::ALLOC));
    return want ? gather.load()() : nullptr;
  }
  std::shared_ptr<c10::GatheredContext> freeContext() const {
    return record_history && contextFor(RecordContext::ALL) ? gather.load()() : nullptr;
  }
};
History g_history;

int64_t nowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct PrivatePool;
struct Block;

// expandable_segments:True (CUDA's ExpandableSegment): the general large pool of a
// stream takes its blocks from one reservation of address space (Device::reserveAddress)
// in which device memory is mapped page by page where a request finds no free block,
// and unmapped where whole pages are free at emptyCache(). Its blocks, mapped or not,
// form one list in address order; unmapped ones are in no pool.
struct ExpandableSegment {
  char* base = nullptr;
  std::size_t reserved = 0;  // address space
  std::size_t page = 0;      // the unit of mapping: offsets and sizes of unmapped blocks are multiples
  std::size_t mapped = 0;    // bytes mapped, counted in reserved_bytes
  int64_t stream = 0;
  Block* head = nullptr;     // the block at `base`
};

struct Block {
  char* ptr;
  std::size_t size;
  std::size_t requested = 0;
  int64_t stream;  // the stream whose work may use the block without waiting
  bool small;
  PrivatePool* pool;  // nullptr: the general pools
  bool allocated = false;
  bool oversize = false;   // counted in oversize_allocations (at or over max_split_size when allocated)
  int pending_events = 0;  // record_stream uses still running
  uint64_t free_position = 0;  // its stream's launch count when it was freed
  uint64_t freed_at = 0;       // the allocator's allocation count when it was freed (age, for gc)
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  bool mapped = true;      // false: address space of an expandable segment without memory
  bool in_pool = false;    // in its pool's set (a free block out of it is held by a release)
  ExpandableSegment* expandable = nullptr;  // the expandable segment it lies in, if any
  std::vector<int64_t> stream_uses;
  std::shared_ptr<c10::GatheredContext> context;  // where it was allocated (when recorded)

  Block(char* p, std::size_t s, int64_t st, bool sm, PrivatePool* pl)
      : ptr(p), size(s), stream(st), small(sm), pool(pl) {}
  // Shares its segment's memory with another block (unmapped address space is not memory).
  bool isSplit() const { return (prev != nullptr && prev->mapped) || (next != nullptr && next->mapped); }
  bool isFree() const { return !allocated && pending_events == 0; }
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
  }
};
using Pool = std::set<Block*, BlockOrder>;

struct PrivatePool {
  explicit PrivatePool(c10::MempoolId_t pool_id) : id(pool_id), source(allocator::poolSource(pool_id)) {}
  c10::MempoolId_t id;
  std::shared_ptr<const allocator::SegmentSource> source;  // a pluggable allocator's, or the device
  Pool small;
  Pool large;
  int use_count = 0;
  int segments = 0;
  std::size_t reserved = 0;
};

struct SegmentRecord {
  std::shared_ptr<const allocator::SegmentSource> source;  // where it came from (null: the device)
  std::size_t size;
  int64_t stream;
  bool small;
  PrivatePool* pool;
  std::shared_ptr<c10::GatheredContext> context;
  bool oversize;  // counted in oversize_segments
};

std::string formatBytes(int64_t bytes);

std::string poolName(c10::MempoolId_t pool) {
  return "(" + std::to_string(pool.first) + ", " + std::to_string(pool.second) + ")";
}

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device), stats_(freshStats()) {}

  // Whether `block`'s segment came from a pluggable allocator.
  bool fromPluggableAllocator(const Block* block) const {
    while (block->prev != nullptr) block = block->prev;
    auto record = segments_.find(block->ptr);
    return record != segments_.end() && record->second.source != nullptr;
  }

  // nullptr when the device is out of memory even after freeing the cache.
  // `for_host`: the memory is written at once by host code holding the
  // stream, so only blocks whose earlier work on the stream completed will do.
  Block* allocate(std::size_t requested, int64_t stream, bool for_host, std::unique_lock<std::mutex>& lock,
                  std::shared_ptr<c10::GatheredContext> context) {
    if (parked_ != nullptr) {
      if (Block* block = takeParked(requested, stream, for_host)) {
        refused_by_fraction_ = false;
        return finishAllocation(block, requested, stream, std::move(context));
      }
      settle();
    }
    processPendingEvents();
    refused_by_fraction_ = false;
    const std::size_t size = roundSize(std::max(requested, std::size_t(1)));
    const bool small = size <= kSmallSize;
    PrivatePool* private_pool = activePool(stream);
    Pool& pool = poolFor(private_pool, small);

    // Graph and user pools keep caching while the caching allocator is off.
    const bool uncached = private_pool == nullptr && !cachingGeneralPools();
    if (C10_UNLIKELY(uncached)) releaseUncachedSegments();
    Block* block = uncached ? nullptr : takeBestFit(pool, size, stream, for_host);
    if (block == nullptr) {
      // Graph and user pools keep ordinary segments.
      const bool expand = !uncached && !small && private_pool == nullptr && expandableEnabled();
      // A segment of its own, from the pool's source (a pluggable allocator's or the device).
      auto fresh = [&](std::size_t segment_size) -> Block* {
        auto source = sourceFor(private_pool);
        void* memory = deviceAllocate(segment_size, source.get(), stream);
        if (memory == nullptr) return nullptr;
        return newSegment(static_cast<char*>(memory), segment_size, stream, small, private_pool, context,
                          std::move(source));
      };
      auto more = [&]() -> Block* {
        if (expand) return growExpandable(size, stream, for_host, context);
        return fresh(uncached ? size : segmentSize(size, small));
      };
      if (g_settings.gc_threshold > 0.0) collectGarbage();
      block = more();
      if (block == nullptr) {
        // Out of device memory: give the cache back (once its work is done), retry.
        stats_.num_alloc_retries++;
        releaseCachedSegments(lock, generalAndFreeablePools());
        if (!uncached) block = takeBestFit(pool, size, stream, for_host);
        if (block == nullptr) block = more();
      }
      if (block == nullptr && expand && !refused_by_fraction_) {
        // No run of the reservation is long enough (the device may still have room).
        block = fresh(segmentSize(size, small));
      }
      if (block == nullptr) {
        stats_.num_ooms++;
        std::size_t free_bytes = 0, total_bytes = 0;
        rt().memoryInfo(&free_bytes, &total_bytes);
        trace(TraceEntry::OOM, free_bytes, requested, stream, poolId(private_pool), context);
        return nullptr;
      }
    }
    splitIfWorthIt(block, size);
    return finishAllocation(block, requested, stream, std::move(context));
  }

  Block* finishAllocation(Block* block, std::size_t requested, int64_t stream,
                          std::shared_ptr<c10::GatheredContext> context) {
    const bool small = block->small;
    block->allocated = true;
    block->requested = requested;
    block->context = g_history.record_state ? context : nullptr;
    updateStat(stats_.allocation, small, 1);
    updateStat(stats_.allocated_bytes, small, static_cast<int64_t>(block->size));
    updateStat(stats_.requested_bytes, small, static_cast<int64_t>(requested));
    updateStat(stats_.active, small, 1);
    updateStat(stats_.active_bytes, small, static_cast<int64_t>(block->size));
    block->oversize = block->size >= g_settings.max_split_size;
    if (block->oversize) stats_.oversize_allocations.increase(1);
    allocations_++;
    trace(TraceEntry::ALLOC, reinterpret_cast<std::size_t>(block->ptr), block->size, stream,
          poolId(block->pool), std::move(context));
    return block;
  }

  void free(Block* block, std::shared_ptr<c10::GatheredContext> context) {
    settle();
    block->allocated = false;
    block->free_position = runtimeStream(block->stream).position();
    block->freed_at = allocations_;
    block->context = nullptr;
    updateStat(stats_.allocation, block->small, -1);
    updateStat(stats_.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
    updateStat(stats_.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
    if (block->oversize) stats_.oversize_allocations.decrease(1);
    block->oversize = false;
    trace(TraceEntry::FREE_REQUESTED, reinterpret_cast<std::size_t>(block->ptr), block->size, block->stream,
          poolId(block->pool), context);
    const bool uncached = block->pool == nullptr && !cachingGeneralPools();
    if (C10_UNLIKELY(uncached)) {
      // cudaFree waits for the whole device: the memory goes back once every stream's
      // work queued before the free has run, not only its own stream's.
      for (int64_t id = 0;; ++id) {
        runtime::Stream* other = nullptr;
        try {
          other = &rt().stream(id);
        } catch (const std::out_of_range&) {
          break;
        }
        if (!other->passed(other->position())) recordStream(block, id);  // an idle stream holds nothing
      }
    }
    if (block->stream_uses.empty()) {
      if (C10_LIKELY(parkable(block, uncached))) {
        parked_ = block;
        return;
      }
      returnToPool(block);
      if (C10_UNLIKELY(uncached)) releaseUncachedSegments();
      return;
    }
    // Other streams may still read it: reuse only after their work so far ran.
    for (int64_t stream_id : block->stream_uses) {
      auto event = rt().createEvent(false);
      event->record(rt().stream(stream_id));
      pending_.emplace_back(std::move(event), block);
      block->pending_events++;
    }
    block->stream_uses.clear();
    if (C10_UNLIKELY(uncached)) releaseUncachedSegments();  // idle streams' events have already passed
  }

  // ---- the fast path: the last free, parked ----
  // A tiny op frees a block and the next op asks for one of the same size: returning
  // the block to its pool (a merge with its free neighbour: set erase, insert, a Block
  // deleted) and taking it back (best fit, split: set erase, insert, a Block made) cost
  // more than the op's kernel. So the last free of a small block of the general pool
  // is parked: not yet returned. A request of its stream and rounded size takes it
  // back when the pools would have given exactly it (checked below); anything else
  // first settles it (returnToPool, as free would have done), so every other path,
  // statistics, snapshots, emptyCache and the out-of-memory retry see the pools as if
  // nothing was parked. Only the last free is parked: settling it is returnToPool in
  // the order of the frees, so the pools and the statistics are those of the slow path.
  void settle() {
    if (C10_LIKELY(parked_ == nullptr)) return;
    Block* block = parked_;
    parked_ = nullptr;
    returnToPool(block);
  }

 private:
  bool parkable(const Block* block, bool uncached) const {
    // Memory history records FREE_COMPLETED at returnToPool: keep its order there.
    return block->small && block->pool == nullptr && !uncached && block->expandable == nullptr &&
           !g_history.record_history.load(std::memory_order_relaxed);
  }

  // Free and in its pool: what returnToPool merges with.
  static bool mergeable(const Block* block) {
    return block != nullptr && block->mapped && block->isFree() && inPool(block);
  }

  // The parked block for a request, when returnToPool followed by the best fit and its
  // split would have given back the same block and left the same free blocks; else
  // nullptr (the caller settles it). Replays their statistics updates, so the counters,
  // peaks and totals are the slow path's.
  Block* takeParked(std::size_t requested, int64_t stream, bool for_host) {
    Block* block = parked_;
    if (block->stream != stream || !pending_.empty() || !active_pools_.empty() || !cachingGeneralPools()) {
      return nullptr;
    }
    const std::size_t size = roundSize(std::max(requested, std::size_t(1)));
    if (size != block->size) return nullptr;
    Block* next = block->next;
    // A free block before it would merge: the best fit would then start below it.
    if (mergeable(block->prev)) return nullptr;
    const bool merge_next = mergeable(next);
    const std::size_t merged = merge_next ? size + next->size : size;
    const uint64_t position = merge_next ? std::max(block->free_position, next->free_position) : block->free_position;
    if (for_host && !runtimeStream(stream).passed(position)) return nullptr;
    // takeBestFit: the pool's first block at or over `size` (in (stream, size, ptr) order)
    // that the host may use must not come before the merged block.
    Block key(nullptr, size, stream, false, nullptr);
    int skipped = 0;
    for (auto it = small_.lower_bound(&key); it != small_.end() && (*it)->stream == stream; ++it) {
      const Block* other = *it;
      if (other == next) continue;  // merged into the block
      if (other->size > merged || (other->size == merged && other->ptr > block->ptr)) break;
      if (for_host && !runtimeStream(stream).passed(other->free_position) && ++skipped < 4) continue;
      return nullptr;  // the pools would give this one
    }
    parked_ = nullptr;
    // returnToPool
    updateStat(stats_.active, true, -1);
    updateStat(stats_.active_bytes, true, -static_cast<int64_t>(size));
    if (merge_next) {
      // the merge takes `next` out and puts the merged block in; the best fit takes that
      // out, and its split puts `next`'s bytes back, with the merged block's stamps
      const bool merged_split = (block->prev != nullptr && block->prev->mapped) ||
                                (next->next != nullptr && next->next->mapped);
      splitStat(-1, next->size);
      if (merged_split) {
        splitStat(1, merged);
        splitStat(-1, merged);
      }
      splitStat(1, next->size);
      next->free_position = position;
      next->freed_at = std::max(block->freed_at, next->freed_at);
    } else if (block->isSplit()) {
      splitStat(1, size);  // into the pool, and out again with nothing to split off
      splitStat(-1, size);
    }
    return block;
  }

  // inactive_split of the small pool, as insertIntoPool and removeFromPool count it
  void splitStat(int64_t count, std::size_t bytes) {
    updateStat(stats_.inactive_split, true, count);
    updateStat(stats_.inactive_split_bytes, true, count * static_cast<int64_t>(bytes));
  }

 public:
  // The general pools and those of released private pools: what emptyCache() and
  // the retry after a failed device allocation give back.
  std::vector<Pool*> generalAndFreeablePools() {
    std::vector<Pool*> pools{&small_, &large_};
    for (auto& [id, pool] : private_pools_) {
      if (pool->use_count == 0) {
        pools.push_back(&pool->small);
        pools.push_back(&pool->large);
      }
    }
    return pools;
  }

  std::vector<Pool*> poolsOf(c10::MempoolId_t id) {
    auto it = private_pools_.find(id);
    if (it == private_pools_.end()) return {};
    return {&it->second->small, &it->second->large};
  }

  // Gives every whole cached segment of `pools` back to the device, once the work
  // that used it has completed. Unlocks `lock` while it waits for the streams.
  void releaseCachedSegments(std::unique_lock<std::mutex>& lock, const std::vector<Pool*>& pools) {
    processPendingEvents();
    std::vector<Block*> segments;
    std::vector<Block*> expandable;  // free blocks of expandable segments: their whole pages are unmapped
    for (Pool* pool : pools) {
      for (Block* block : *pool) {
        if (block->expandable != nullptr) expandable.push_back(block);
        else if (!block->isSplit()) segments.push_back(block);  // else part of a segment still in use
      }
    }
    // Out of reach of other threads while we wait.
    for (Block* block : segments) eraseFromSet(block);
    for (Block* block : expandable) removeFromPool(block);
    stats_.num_sync_all_streams++;
    lock.unlock();
    rt().drain();  // kernel errors stay pending for their own synchronisation point
    lock.lock();
    settle();  // a free by another thread meanwhile
    for (Block* block : segments) {
      if (!runtimeStream(block->stream).passed(block->free_position)) {
        insertIntoPool(block);  // queued behind a hold of this thread: still in use
        continue;
      }
      freeSegment(block);
    }
    for (Block* block : expandable) {
      if (!runtimeStream(block->stream).passed(block->free_position)) {
        insertIntoPool(block);
        continue;
      }
      unmapFreeBlock(block);
    }
    processPendingEvents();
    erasePoolsWithoutUse();
  }

  void recordStream(Block* block, int64_t stream) {
    if (stream == block->stream) return;
    auto& uses = block->stream_uses;
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

  // ---- private pools ----
  PrivatePool& retain(c10::MempoolId_t id) {
    TORCH_CHECK(id != c10::MempoolId_t(0, 0), "npu memory pool: (0, 0) is the general pool's id, not a private ",
                "pool's; make one with torch.npu.MemPool() or torch.npu.graph_pool_handle()");
    auto& pool = private_pools_[id];
    if (pool == nullptr) pool = std::make_unique<PrivatePool>(id);
    pool->use_count++;
    return *pool;
  }

  void beginAllocateToPool(c10::MempoolId_t id, std::function<bool(int64_t)> filter) {
    retain(id);
    active_pools_.insert(active_pools_.begin(), {id, std::move(filter)});
  }

  void endAllocateToPool(c10::MempoolId_t id) {
    auto it = std::find_if(active_pools_.begin(), active_pools_.end(),
                           [&](const auto& entry) { return entry.first == id; });
    TORCH_CHECK(it != active_pools_.end(), "npu endAllocateToPool: memory pool ", poolName(id),
                " is not being allocated to on npu:", static_cast<int>(device_),
                "; end only what beginAllocateToPool (use_mem_pool, a graph capture) began on this device");
    active_pools_.erase(it);
  }

  // Returns the pool's pools to empty when its use count reached 0, else nothing.
  std::vector<Pool*> release(c10::MempoolId_t id) {
    auto it = private_pools_.find(id);
    TORCH_CHECK(it != private_pools_.end() && it->second->use_count > 0, "npu releasePool: memory pool ",
                poolName(id), " is not in use on npu:", static_cast<int>(device_),
                " (released more often than retained, or made on another device)");
    PrivatePool& pool = *it->second;
    if (--pool.use_count > 0) return {};
    return {&pool.small, &pool.large};
  }

  PrivatePool* findPool(c10::MempoolId_t id) {
    auto it = private_pools_.find(id);
    return it == private_pools_.end() ? nullptr : it->second.get();
  }

  // ---- snapshots ----
  void setTraceLimit(std::size_t max_entries, bool clear) {
    if (clear) {
      trace_.clear();
      trace_next_ = 0;
    }
    // oldest first again, then the oldest dropped beyond the new limit
    std::rotate(trace_.begin(), trace_.begin() + static_cast<std::ptrdiff_t>(trace_next_), trace_.end());
    trace_next_ = 0;
    if (trace_.size() > max_entries) {
      trace_.erase(trace_.begin(), trace_.end() - static_cast<std::ptrdiff_t>(max_entries));
    }
  }

  std::vector<TraceEntry> traceInOrder() const {
    std::vector<TraceEntry> out;
    out.reserve(trace_.size());
    for (std::size_t i = 0; i < trace_.size(); ++i) out.push_back(trace_[(trace_next_ + i) % trace_.size()]);
    return out;
  }

  void recordSnapshotTaken() { trace(TraceEntry::SNAPSHOT, 0, 0, 0, {0, 0}, nullptr); }

  // Segments (all, or those of `only`), with their blocks in address order.
  void segments(const std::vector<Block*>& allocated, c10::MempoolId_t only,
                std::vector<c10::CachingDeviceAllocator::SegmentInfo>& out) {
    std::unordered_map<char*, Block*> blocks;
    for (Block* block : allocated) blocks[block->ptr] = block;
    for (Pool* pool : allPools()) {
      for (Block* block : *pool) blocks[block->ptr] = block;
    }
    for (auto& [event, block] : pending_) blocks[block->ptr] = block;
    for (auto& [base, record] : segments_) {
      const c10::MempoolId_t id = poolId(record.pool);
      if (only != c10::MempoolId_t(0, 0) && id != only) continue;
      c10::CachingDeviceAllocator::SegmentInfo info;
      info.device = device_;
      info.address = reinterpret_cast<std::size_t>(base);
      info.total_size = record.size;
      info.stream = reinterpret_cast<void*>(static_cast<intptr_t>(record.stream));
      info.is_large = !record.small;
      info.owner_private_pool_id = id;
      info.context_when_allocated = record.context;
      auto it = blocks.find(base);
      std::size_t covered = 0;
      for (Block* block = it == blocks.end() ? nullptr : it->second; block != nullptr; block = block->next) {
        covered += block->size;
        info.blocks.push_back(blockInfo(block, info));
      }
      if (covered < record.size) {  // being given back by another thread right now
        c10::CachingDeviceAllocator::BlockInfo rest;
        rest.size = record.size - covered;
        info.blocks.push_back(std::move(rest));
      }
      out.push_back(std::move(info));
    }
    if (only != c10::MempoolId_t(0, 0)) return;
    // An expandable segment shows each run of mapped memory as a segment, as CUDA's snapshot does.
    for (auto& [stream, segment] : expandable_) {
      bool open = false;
      for (Block* block = segment->head; block != nullptr; block = block->next) {
        if (!block->mapped) {
          open = false;
          continue;
        }
        if (!open) {
          c10::CachingDeviceAllocator::SegmentInfo info;
          info.device = device_;
          info.address = reinterpret_cast<std::size_t>(block->ptr);
          info.stream = reinterpret_cast<void*>(static_cast<intptr_t>(stream));
          info.is_large = true;
          info.is_expandable = true;
          info.owner_private_pool_id = {0, 0};
          out.push_back(std::move(info));
          open = true;
        }
        auto& info = out.back();
        info.total_size += block->size;
        info.blocks.push_back(blockInfo(block, info));
      }
    }
  }

  c10::CachingDeviceAllocator::BlockInfo blockInfo(Block* block, c10::CachingDeviceAllocator::SegmentInfo& info) {
    c10::CachingDeviceAllocator::BlockInfo b;
    b.size = block->size;
    b.requested_size = block->allocated ? block->requested : 0;
    b.allocated = block->allocated;
    b.active = block->allocated || block->pending_events > 0;
    b.gc_counter = static_cast<int32_t>(allocations_ - block->freed_at);
    b.context_when_allocated = block->allocated ? block->context : nullptr;
    if (b.allocated) info.allocated_size += b.size;
    if (b.active) info.active_size += b.size;
    info.requested_size += b.requested_size;
    return b;
  }

  void setFraction(double fraction) {
    std::size_t free_bytes = 0, total_bytes = 0;
    rt().memoryInfo(&free_bytes, &total_bytes);
    fraction_ = fraction;
    allowed_ = static_cast<std::size_t>(fraction * static_cast<double>(total_bytes));
  }
  double fraction() const { return fraction_; }
  std::size_t allowed() const { return allowed_; }
  bool refusedByFraction() const { return refused_by_fraction_; }

  DeviceStats& stats() { return stats_; }
  c10::DeviceIndex device() const { return device_; }

 private:
  runtime::Device& rt() { return runtime::hal().device(device_); }

  runtime::Stream& runtimeStream(int64_t id) {
    if (id >= static_cast<int64_t>(streams_.size())) streams_.resize(static_cast<std::size_t>(id) + 1, nullptr);
    auto& stream = streams_[static_cast<std::size_t>(id)];
    if (stream == nullptr) stream = &rt().stream(id);
    return *stream;
  }

  static c10::MempoolId_t poolId(const PrivatePool* pool) { return pool ? pool->id : c10::MempoolId_t(0, 0); }

  PrivatePool* activePool(int64_t stream) {
    for (auto& [id, filter] : active_pools_) {
      if (filter && filter(stream)) return private_pools_.at(id).get();
    }
    return nullptr;
  }

  Pool& poolFor(PrivatePool* pool, bool small) {
    if (pool != nullptr) return small ? pool->small : pool->large;
    return small ? small_ : large_;
  }

  std::vector<Pool*> allPools() {
    std::vector<Pool*> pools{&small_, &large_};
    for (auto& [id, pool] : private_pools_) {
      pools.push_back(&pool->small);
      pools.push_back(&pool->large);
    }
    return pools;
  }

  std::size_t segmentSize(std::size_t size, bool small) const {
    if (small) return kSmallSegment;
    if (g_settings.large_page != 0) return roundUp(size, g_settings.large_page);
    return size < kMinLargeAlloc ? kLargeSegment : roundUp(size, kLargeRounding);
  }

  // The device's memory, within the per-process fraction; nullptr when refused.
  void* deviceAllocate(std::size_t size, const allocator::SegmentSource* source, int64_t stream) {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
    if (allowed_ != kNoLimit && reserved + size > allowed_) {
      refused_by_fraction_ = true;
      return nullptr;
    }
    if (source != nullptr) return source->alloc(static_cast<ssize_t>(size), device_, &runtimeStream(stream));
    return rt().allocate(size);
  }

  // Read once per segment: the segment is freed to the source it came from.
  static std::shared_ptr<const allocator::SegmentSource> sourceFor(const PrivatePool* pool) {
    return pool != nullptr ? pool->source : currentSourceShared();
  }

  // The general pools cache unless the caching allocator is off or a pluggable allocator
  // replaced it (as on CUDA, where a pluggable allocator's memory is not cached).
  static bool cachingGeneralPools() {
    return g_caching_enabled.load(std::memory_order_relaxed) &&
           g_current_source.load(std::memory_order_relaxed) == nullptr;
  }

  Block* newSegment(char* memory, std::size_t size, int64_t stream, bool small, PrivatePool* pool,
                    const std::shared_ptr<c10::GatheredContext>& context,
                    std::shared_ptr<const allocator::SegmentSource> source = nullptr) {
    auto* block = new Block(memory, size, stream, small, pool);
    stats_.num_device_alloc++;
    updateStat(stats_.segment, small, 1);
    updateStat(stats_.reserved_bytes, small, static_cast<int64_t>(size));
    publishReserved();
    const bool oversize = size >= g_settings.max_split_size;
    if (oversize) stats_.oversize_segments.increase(1);
    if (pool != nullptr) {
      pool->segments++;
      pool->reserved += size;
    }
    segments_.emplace(memory, SegmentRecord{std::move(source), size, stream, small, pool,
                                            g_history.record_state ? context : nullptr, oversize});
    trace(TraceEntry::SEGMENT_ALLOC, reinterpret_cast<std::size_t>(memory), size, stream, poolId(pool), context);
    return block;
  }

  // A whole, free segment (out of its pool) goes back to the device.
  void freeSegment(Block* block) {
    auto record = segments_.find(block->ptr);
    if (record != segments_.end() && record->second.source != nullptr) {
      record->second.source->free(block->ptr, static_cast<ssize_t>(block->size), device_,
                                  &runtimeStream(block->stream));
    } else {
      rt().free(block->ptr);
    }
    stats_.num_device_free++;
    updateStat(stats_.segment, block->small, -1);
    updateStat(stats_.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
    publishReserved();
    if (record != segments_.end() && record->second.oversize) stats_.oversize_segments.decrease(1);
    if (block->pool != nullptr) {
      block->pool->segments--;
      block->pool->reserved -= block->size;
    }
    segments_.erase(block->ptr);
    trace(TraceEntry::SEGMENT_FREE, reinterpret_cast<std::size_t>(block->ptr), block->size, block->stream,
          poolId(block->pool), nullptr);
    delete block;
  }

  // A released pool without segments is forgotten.
  void erasePoolsWithoutUse() {
    for (auto it = private_pools_.begin(); it != private_pools_.end();) {
      const bool active = std::any_of(active_pools_.begin(), active_pools_.end(),
                                      [&](const auto& entry) { return entry.first == it->first; });
      if (it->second->use_count == 0 && it->second->segments == 0 && !active) it = private_pools_.erase(it);
      else ++it;
    }
  }

  // garbage_collection_threshold (CUDA's garbage_collect_cached_blocks): when the
  // reserved memory passes the fraction of what this process may use, whole cached
  // large segments of the general pool whose work completed are freed, the longest
  // unused first, until it is below.
  // With the caching allocator off: the free whole segments whose stream has run
  // past their free go back to the device (the others at a later call).
  void releaseUncachedSegments() {
    processPendingEvents();
    for (Pool* pool : {&small_, &large_}) {
      std::vector<Block*> done, expandable;
      for (Block* block : *pool) {
        if (!runtimeStream(block->stream).passed(block->free_position)) continue;
        if (block->expandable != nullptr) expandable.push_back(block);  // made while caching was on
        else if (!block->isSplit()) done.push_back(block);
      }
      for (Block* block : done) {
        eraseFromSet(block);
        freeSegment(block);
      }
      for (Block* block : expandable) removeFromPool(block);  // as releaseCachedSegments: out, then unmapped
      for (Block* block : expandable) unmapFreeBlock(block);
    }
  }

  void collectGarbage() {
    std::size_t free_bytes = 0, total_bytes = 0;
    rt().memoryInfo(&free_bytes, &total_bytes);
    const std::size_t limit = allowed_ != kNoLimit ? allowed_ : total_bytes;
    const auto threshold = static_cast<std::size_t>(g_settings.gc_threshold * static_cast<double>(limit));
    auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
    if (reserved <= threshold) return;
    std::vector<Block*> candidates;
    for (Block* block : large_) {
      if ((block->expandable != nullptr || !block->isSplit()) &&
          runtimeStream(block->stream).passed(block->free_position)) {
        candidates.push_back(block);
      }
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
    for (Block* block : candidates) {
      if (reserved <= threshold) break;
      if (block->expandable != nullptr) {  // its whole pages are unmapped
        removeFromPool(block);
        reserved -= unmapFreeBlock(block);
        continue;
      }
      reserved -= block->size;
      eraseFromSet(block);
      freeSegment(block);
    }
  }

  void trace(TraceEntry::Action action, std::size_t addr, std::size_t size, int64_t stream, c10::MempoolId_t pool,
             std::shared_ptr<c10::GatheredContext> context) {
    if (!g_history.record_history) return;
    TraceEntry entry(action, device_, addr, size, reinterpret_cast<void*>(static_cast<intptr_t>(stream)), pool, 0,
                     std::move(context));
    entry.time_.t_ = static_cast<time_t>(nowMicros());
    const std::size_t limit = g_history.max_entries;
    if (limit == 0) return;
    if (trace_.size() < limit) {
      trace_.push_back(std::move(entry));
    } else {
      trace_[trace_next_] = std::move(entry);
      trace_next_ = (trace_next_ + 1) % limit;
    }
  }

  Block* takeBestFit(Pool& pool, std::size_t size, int64_t stream, bool for_host) {
    Block key(nullptr, size, stream, false, nullptr);
    const std::size_t max_split = g_settings.max_split_size;
    for (auto it = pool.lower_bound(&key); it != pool.end() && (*it)->stream == stream; ++it) {
      Block* block = *it;
      // max_split_size_mb (CUDA's rules): blocks at or over it are not split, so a
      // smaller request does not take one, and a larger one wastes at most 20 MiB.
      if (max_split != kNoLimit) {
        if (size < max_split && block->size >= max_split) break;
        if (size >= max_split && block->size >= size + kLargeBuffer) break;
      }
      if (for_host && !runtimeStream(stream).passed(block->free_position)) continue;
      removeFromPool(block);
      return block;
    }
    return nullptr;
  }

  void splitIfWorthIt(Block* block, std::size_t size) {
    const std::size_t remaining = block->size - size;
    const bool worth = block->small ? remaining >= kMinBlockSize
                                    : size < g_settings.max_split_size && remaining > kSmallSize;
    if (!worth) return;
    auto* rest = new Block(block->ptr + size, remaining, block->stream, block->small, block->pool);
    rest->expandable = block->expandable;
    rest->free_position = block->free_position;  // its memory's last use is the whole block's
    rest->freed_at = block->freed_at;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insertIntoPool(rest);
  }

  Pool& poolOf(Block* block) { return poolFor(block->pool, block->small); }

  void eraseFromSet(Block* block) {
    poolOf(block).erase(block);
    block->in_pool = false;
  }

  void insertIntoPool(Block* block) {
    poolOf(block).insert(block);
    block->in_pool = true;
    if (block->isSplit()) {
      updateStat(stats_.inactive_split, block->small, 1);
      updateStat(stats_.inactive_split_bytes, block->small, static_cast<int64_t>(block->size));
    }
  }

  void removeFromPool(Block* block) {
    eraseFromSet(block);
    if (block->isSplit()) {
      updateStat(stats_.inactive_split, block->small, -1);
      updateStat(stats_.inactive_split_bytes, block->small, -static_cast<int64_t>(block->size));
    }
  }

  void returnToPool(Block* block) {
    trace(TraceEntry::FREE_COMPLETED, reinterpret_cast<std::size_t>(block->ptr), block->size, block->stream,
          poolId(block->pool), nullptr);
    updateStat(stats_.active, block->small, -1);
    updateStat(stats_.active_bytes, block->small, -static_cast<int64_t>(block->size));
    mergeNeighbour(block, block->prev);
    mergeNeighbour(block, block->next);
    insertIntoPool(block);
  }

  void mergeNeighbour(Block* block, Block* neighbour) {
    // A free neighbour out of its pool is held by a release that waits unlocked: not ours.
    if (neighbour == nullptr || !neighbour->mapped || !neighbour->isFree() || !inPool(neighbour)) return;
    removeFromPool(neighbour);
    if (neighbour == block->prev) {
      if (block->expandable != nullptr && block->expandable->head == neighbour) block->expandable->head = block;
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    block->free_position = std::max(block->free_position, neighbour->free_position);
    block->freed_at = std::max(block->freed_at, neighbour->freed_at);
    delete neighbour;
  }

  void processPendingEvents() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (!it->first->query()) {
        ++it;
        continue;
      }
      Block* block = it->second;
      it = pending_.erase(it);
      if (--block->pending_events == 0) returnToPool(block);
    }
  }

  // ---- expandable segments ----

  // expandable_segments:True and a HAL that can grow a segment (else a warning, once).
  bool expandableEnabled() {
    if (!g_settings.expandable_segments) return false;
    if (virtual_memory_ < 0) {
      virtual_memory_ = rt().capabilities().virtual_memory ? 1 : 0;
      if (virtual_memory_ == 1) granularity_ = rt().virtualMemoryGranularity();
    }
    if (virtual_memory_ == 0) {
      TORCH_WARN_ONCE("expandable_segments:True has no effect on npu:", static_cast<int>(device_), ": this HAL (",
                      runtime::hal().name(), ") cannot grow a segment in place (Capabilities::virtual_memory is "
                      "false, as under NPU_EMU_PROTECT=1); segments are allocated as with expandable_segments:False");
      return false;
    }
    return true;
  }

  // The stream's expandable segment, made at first use: address space for 1 1/8 of the
  // device's capacity (CUDA's choice: room to map pages at the end when holes are left
  // unmapped in the middle). nullptr when no address space is left.
  ExpandableSegment* expandableSegment(int64_t stream) {
    auto it = expandable_.find(stream);
    if (it != expandable_.end()) return it->second.get();
    std::size_t free_bytes = 0, total_bytes = 0;
    rt().memoryInfo(&free_bytes, &total_bytes);
    const std::size_t page =
        roundUp(g_settings.expandable_page != 0 ? g_settings.expandable_page : kLargeRounding, granularity_);
    const std::size_t size = roundUp(total_bytes + total_bytes / 8 + 1, page);
    void* base = rt().reserveAddress(size);
    if (base == nullptr) return nullptr;
    auto segment = std::make_unique<ExpandableSegment>();
    segment->base = static_cast<char*>(base);
    segment->reserved = size;
    segment->page = page;
    segment->stream = stream;
    auto* all = new Block(segment->base, size, stream, false, nullptr);
    all->mapped = false;
    all->expandable = segment.get();
    segment->head = all;
    return expandable_.emplace(stream, std::move(segment)).first->second.get();
  }

  static bool inPool(const Block* block) { return block->in_pool; }

  // Whether a block is mapped decides whether its neighbours count as split
  // (inactive_split): those in a pool leave it while that changes.
  std::vector<Block*> liftNeighbours(Block* block) {
    std::vector<Block*> lifted;
    for (Block* n : {block->prev, block->next}) {
      if (n != nullptr && n->mapped && !n->allocated && inPool(n)) {
        removeFromPool(n);
        lifted.push_back(n);
      }
    }
    return lifted;
  }
  void restoreNeighbours(const std::vector<Block*>& lifted) {
    for (Block* n : lifted) insertIntoPool(n);
  }

  // Maps the first `size` bytes of the unmapped block `u`: returns the mapped block
  // (free, in no pool), or nullptr when the device or the fraction refuses.
  Block* mapPart(ExpandableSegment* segment, Block* u, std::size_t size,
                 const std::shared_ptr<c10::GatheredContext>& context) {
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
    if (allowed_ != kNoLimit && reserved + size > allowed_) {
      refused_by_fraction_ = true;
      return nullptr;
    }
    if (!rt().mapMemory(u->ptr, size)) return nullptr;
    const auto lifted = liftNeighbours(u);
    Block* m = u;
    if (size < u->size) {
      m = new Block(u->ptr, size, u->stream, false, nullptr);
      m->expandable = segment;
      m->prev = u->prev;
      m->next = u;
      if (u->prev != nullptr) u->prev->next = m;
      else segment->head = m;
      u->prev = m;
      u->ptr += size;
      u->size -= size;
    }
    m->mapped = true;
    m->free_position = 0;  // fresh memory: no work used it
    m->freed_at = allocations_;
    restoreNeighbours(lifted);
    if (segment->mapped == 0) updateStat(stats_.segment, false, 1);
    segment->mapped += size;
    updateStat(stats_.reserved_bytes, false, static_cast<int64_t>(size));
    publishReserved();
    stats_.num_device_alloc++;
    trace(TraceEntry::SEGMENT_MAP, reinterpret_cast<std::size_t>(m->ptr), size, segment->stream, {0, 0}, context);
    return m;
  }

  // A free block of at least `size` bytes in the stream's expandable segment (in no
  // pool), made by mapping pages: the first unmapped range that, with the free blocks
  // around it, is long enough; so growth at the end merges with a free block before it.
  // nullptr when the device, the fraction or the address space refuses.
  Block* growExpandable(std::size_t size, int64_t stream, bool for_host,
                        const std::shared_ptr<c10::GatheredContext>& context) {
    ExpandableSegment* segment = expandableSegment(stream);
    if (segment == nullptr) return nullptr;
    auto usable = [&](Block* b) {
      return b != nullptr && b->mapped && b->isFree() && inPool(b) &&
             (!for_host || runtimeStream(stream).passed(b->free_position));
    };
    for (Block* u = segment->head; u != nullptr; u = u->next) {
      if (u->mapped) continue;
      Block* start = usable(u->prev) ? u->prev : u;
      std::size_t bytes = 0;
      for (Block* c = start; c != nullptr && bytes < size && (!c->mapped || usable(c)); c = c->next) bytes += c->size;
      if (bytes < size) continue;
      Block* whole = nullptr;
      for (Block* c = start; whole == nullptr || whole->size < size;) {
        Block* piece = c;
        if (c->mapped) {
          removeFromPool(c);
        } else {
          const std::size_t have = whole == nullptr ? 0 : whole->size;
          piece = mapPart(segment, c, std::min(c->size, roundUp(size - have, segment->page)), context);
          if (piece == nullptr) {
            if (whole != nullptr) insertIntoPool(whole);  // what was mapped stays cached
            return nullptr;
          }
        }
        c = piece->next;
        if (whole == nullptr) {
          whole = piece;
        } else {  // piece follows whole
          whole->size += piece->size;
          whole->next = piece->next;
          if (piece->next != nullptr) piece->next->prev = whole;
          whole->free_position = std::max(whole->free_position, piece->free_position);
          whole->freed_at = std::max(whole->freed_at, piece->freed_at);
          delete piece;
        }
      }
      return whole;
    }
    return nullptr;
  }

  // Unmaps the whole pages of a free block of an expandable segment (out of its pool,
  // its work completed); the rest of it, at either end, goes back to the pool. Returns
  // the bytes unmapped.
  std::size_t unmapFreeBlock(Block* block) {
    ExpandableSegment* segment = block->expandable;
    const auto offset = static_cast<std::size_t>(block->ptr - segment->base);
    char* lo = segment->base + roundUp(offset, segment->page);
    char* hi = segment->base + (offset + block->size) / segment->page * segment->page;
    if (hi <= lo) {
      insertIntoPool(block);
      return 0;
    }
    const auto size = static_cast<std::size_t>(hi - lo);
    rt().unmapMemory(lo, size);
    const auto lifted = liftNeighbours(block);
    Block* head = nullptr;
    Block* tail = nullptr;
    if (lo > block->ptr) {
      head = new Block(block->ptr, static_cast<std::size_t>(lo - block->ptr), block->stream, false, nullptr);
      head->expandable = segment;
      head->free_position = block->free_position;
      head->freed_at = block->freed_at;
      head->prev = block->prev;
      head->next = block;
      if (block->prev != nullptr) block->prev->next = head;
      else segment->head = head;
      block->prev = head;
    }
    if (block->ptr + block->size > hi) {
      tail = new Block(hi, static_cast<std::size_t>(block->ptr + block->size - hi), block->stream, false, nullptr);
      tail->expandable = segment;
      tail->free_position = block->free_position;
      tail->freed_at = block->freed_at;
      tail->next = block->next;
      tail->prev = block;
      if (block->next != nullptr) block->next->prev = tail;
      block->next = tail;
    }
    block->ptr = lo;
    block->size = size;
    block->mapped = false;
    // Unmapped neighbours become one block.
    if (Block* prev = block->prev; prev != nullptr && !prev->mapped) {
      block->ptr = prev->ptr;
      block->size += prev->size;
      block->prev = prev->prev;
      if (prev->prev != nullptr) prev->prev->next = block;
      else segment->head = block;
      delete prev;
    }
    if (Block* next = block->next; next != nullptr && !next->mapped) {
      block->size += next->size;
      block->next = next->next;
      if (next->next != nullptr) next->next->prev = block;
      delete next;
    }
    if (head != nullptr) insertIntoPool(head);
    if (tail != nullptr) insertIntoPool(tail);
    restoreNeighbours(lifted);
    segment->mapped -= size;
    if (segment->mapped == 0) updateStat(stats_.segment, false, -1);
    updateStat(stats_.reserved_bytes, false, -static_cast<int64_t>(size));
    publishReserved();
    stats_.num_device_free++;
    trace(TraceEntry::SEGMENT_UNMAP, reinterpret_cast<std::size_t>(lo), size, segment->stream, {0, 0}, nullptr);
    return size;
  }

  // npu-smi's view of this process (core/usage_board.h): after every change of reserved bytes.
  void publishReserved() {
    usage_board::reservedChanged(device_, static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current));
  }

  const c10::DeviceIndex device_;
  Pool small_;
  Pool large_;
  DeviceStats stats_;
  std::vector<std::pair<std::unique_ptr<runtime::Event>, Block*>> pending_;
  std::vector<runtime::Stream*> streams_;  // by stream id, looked up once
  std::map<c10::MempoolId_t, std::unique_ptr<PrivatePool>> private_pools_;
  // (pool, stream filter) of beginAllocateToPool, latest first
  std::vector<std::pair<c10::MempoolId_t, std::function<bool(int64_t)>>> active_pools_;
  std::map<char*, SegmentRecord> segments_;  // by base address
  std::vector<TraceEntry> trace_;            // a ring of g_history.max_entries
  std::size_t trace_next_ = 0;
  uint64_t allocations_ = 0;
  double fraction_ = 1.0;
  std::size_t allowed_ = kNoLimit;
  bool refused_by_fraction_ = false;
  Block* parked_ = nullptr;  // the last free, not yet returned to its pool (settle())
  std::map<int64_t, std::unique_ptr<ExpandableSegment>> expandable_;  // by stream: the general large pool's
  int virtual_memory_ = -1;  // Capabilities::virtual_memory, asked once: -1 not yet
  std::size_t granularity_ = 1;
};

// "allocated_bytes.all.current", "num_ooms", ...: the keys torch.cuda.memory_stats()
// and torch.accelerator.memory_stats() give these numbers.
std::map<std::string, int64_t> flatten(DeviceStats& stats) {
  std::map<std::string, int64_t> out;
  auto put = [&](const std::string& prefix, const c10::CachingAllocator::Stat& s) {
    out[prefix + ".current"] = s.current;
    out[prefix + ".peak"] = s.peak;
    out[prefix + ".allocated"] = s.allocated;
    out[prefix + ".freed"] = s.freed;
  };
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (auto& [name, array] : statArrays(stats)) {
    for (int p = 0; p < 3; ++p) put(std::string(name) + "." + pools[p], (*array)[p]);
  }
  put("oversize_allocations", stats.oversize_allocations);
  put("oversize_segments", stats.oversize_segments);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["max_split_size"] =
      g_settings.max_split_size == kNoLimit ? stats.max_split_size : static_cast<int64_t>(g_settings.max_split_size);
  return out;
}

std::string formatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream out;
  if (unit == 0) out << bytes << " B";
  else out << std::fixed << std::setprecision(2) << value << " " << units[unit];
  return out.str();
}

class NPUCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    const auto device = currentDevice();
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(kNPU, device));
    const int64_t stream = currentStream(device).id();
    runtimeDevice(device);  // the runtime is in use from here on (see inBadFork)
    g_allocated_once.store(true, std::memory_order_relaxed);
    const bool for_host = holdingStream(device, stream);
    auto context = g_history.allocContext();  // Python's stack: gathered before the lock
    std::unique_lock<std::mutex> lock(mutex_);
    auto& cache = deviceCache(device, /*settle=*/false);
    Block* block = cache.allocate(n, stream, for_host, lock, std::move(context));
    if (block == nullptr) {
      const std::string summary = summaryLocked(device);
      std::size_t free_bytes = 0, total_bytes = 0;
      runtime::hal().device(device).memoryInfo(&free_bytes, &total_bytes);
      const auto& stats = cache.stats();
      const auto reserved = stats.reserved_bytes[kAllPools].current;
      const auto allocated = stats.allocated_bytes[kAllPools].current;
      std::ostringstream limit;
      if (cache.refusedByFraction()) {
        limit << " This process may use " << formatBytes(static_cast<int64_t>(cache.allowed())) << " of it ("
              << cache.fraction() << " of the device, set by torch.npu.set_per_process_memory_fraction), "
              << "and the request would pass that: raise the fraction or use less memory.";
      }
      const auto observers = oom_observers_;
      lock.unlock();
      for (const auto& observer : observers) {
        observer(device, n, static_cast<std::size_t>(reserved), free_bytes);
      }
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory on npu:", static_cast<int>(device),
                       ". Tried to allocate ", formatBytes(static_cast<int64_t>(n)), "; the device has ",
                       formatBytes(static_cast<int64_t>(total_bytes)), " in all, ",
                       formatBytes(static_cast<int64_t>(free_bytes)), " free, ", formatBytes(allocated),
                       " allocated by tensors and ", formatBytes(reserved - allocated), " cached.", limit.str(),
                       " Free tensors you no longer need (del x), call torch.npu.empty_cache(), "
                       "use smaller batches, or give the emulator more memory with NPU_EMU_MEMORY.\n",
                       summary);
    }
    allocated_.emplace(block->ptr, std::make_pair(block, device));
    reportToProfiler(block->ptr, static_cast<int64_t>(block->size), device);
    return c10::DataPtr(block->ptr, block->ptr, &deleteBlock, c10::Device(kNPU, device));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteBlock; }

  void copy_data(void* dst, const void* src, std::size_t count) const override {
    launchCopy(currentDevice(), dst, src, count, runtime::CopyKind::DeviceToDevice);
  }

  void free(void* ptr) {
    if (inBadFork()) return;  // a forked child: the parent's memory is not ours to reuse
    auto context = g_history.freeContext();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != allocated_.end(), "npu allocator: free of an unknown pointer");
    auto [block, device] = it->second;
    allocated_.erase(it);
    const auto size = static_cast<int64_t>(block->size);
    deviceCache(device, /*settle=*/false).free(block, std::move(context));
    reportToProfiler(ptr, -size, device);
  }

  // profile_memory: each allocation and free, with the totals memory_stats()
  // reports (allocated_bytes and reserved_bytes of all pools). Under mutex_.
  void reportToProfiler(void* ptr, int64_t size, c10::DeviceIndex device) {
    if (C10_LIKELY(!c10::memoryProfilingEnabled())) return;
    const auto& stats = deviceCache(device).stats();
    c10::reportMemoryUsageToProfiler(ptr, size, static_cast<std::size_t>(stats.allocated_bytes[kAllPools].current),
                                     static_cast<std::size_t>(stats.reserved_bytes[kAllPools].current),
                                     c10::Device(kNPU, device));
  }

  // torch.npu.empty_cache(): every device's unused cached segments go back to it.
  void releaseCachedMemory() {
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      std::unique_lock<std::mutex> lock(mutex_);
      auto& cache = deviceCache(d);
      cache.releaseCachedSegments(lock, cache.generalAndFreeablePools());
    }
  }

  // emptyCache(pool): that pool's free segments, on every device.
  void releasePoolMemory(c10::MempoolId_t pool) {
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      std::unique_lock<std::mutex> lock(mutex_);
      auto& cache = deviceCache(d);
      auto pools = cache.poolsOf(pool);
      if (!pools.empty()) cache.releaseCachedSegments(lock, pools);
    }
  }

  // ---- private pools ----
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool, std::function<bool(int64_t)> filter) {
    std::lock_guard<std::mutex> lock(mutex_);
    deviceCache(device).beginAllocateToPool(pool, std::move(filter));
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    deviceCache(device).endAllocateToPool(pool);
  }
  void retainPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    deviceCache(device).retain(pool);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& cache = deviceCache(device);
    auto pools = cache.release(pool);
    if (!pools.empty()) cache.releaseCachedSegments(lock, pools);
  }
  std::size_t poolReserved(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* p = deviceCache(device).findPool(pool);
    return p == nullptr ? 0 : p->reserved;
  }
  int poolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* p = deviceCache(device).findPool(pool);
    return p == nullptr ? 0 : p->use_count;
  }

  // ---- raw allocations ----
  void* rawAlloc(std::size_t size) {
    c10::DataPtr data = allocate(size);
    void* ptr = data.get();
    if (ptr == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    raw_.emplace(ptr, std::move(data));
    return ptr;
  }
  void rawDelete(void* ptr) {
    c10::DataPtr data;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = raw_.find(ptr);
      TORCH_CHECK(it != raw_.end(), "caching_allocator_delete: ", ptr, " was not allocated by ",
                  "torch.npu.caching_allocator_alloc (or was already deleted)");
      data = std::move(it->second);
      raw_.erase(it);
    }
  }  // freed here, outside the lock

  // ---- fraction, settings, history ----
  void setFraction(double fraction, c10::DeviceIndex device) {
    TORCH_CHECK_VALUE(fraction >= 0.0 && fraction <= 1.0, "set_per_process_memory_fraction: ", fraction,
                      " is not a fraction of the device's memory; give a number in [0, 1]");
    runtimeDevice(device);
    std::lock_guard<std::mutex> lock(mutex_);
    deviceCache(device).setFraction(fraction);
  }
  double fraction(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return deviceCache(device).fraction();
  }
  std::mutex& mutex() { return mutex_; }

  void recordHistory(const allocator::HistoryOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    // a parked free completes before the history changes (no FREE_COMPLETED of it in a new trace)
    for (auto& cache : devices_) cache->settle();
    g_history.record_state = options.record_state;
    g_history.record_history = options.record_history;
    g_history.context = static_cast<int>(options.context);
    g_history.gather = options.gather;
    // Stopping keeps the history recorded so far (for a snapshot taken later).
    if (options.record_history) g_history.max_entries = options.max_entries;
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      deviceCache(d).setTraceLimit(g_history.max_entries, options.clear_history);
    }
  }

  allocator::Snapshot takeSnapshot(c10::MempoolId_t pool, bool include_traces) {
    std::lock_guard<std::mutex> lock(mutex_);
    allocator::Snapshot out;
    std::vector<std::vector<Block*>> allocated(static_cast<std::size_t>(deviceCount()));
    for (auto& [ptr, entry] : allocated_) allocated[static_cast<std::size_t>(entry.second)].push_back(entry.first);
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      auto& cache = deviceCache(d);
      cache.segments(allocated[static_cast<std::size_t>(d)], pool, out.segments);
      if (include_traces) {
        cache.recordSnapshotTaken();
        out.device_traces.push_back(cache.traceInOrder());
      } else {
        out.device_traces.emplace_back();
      }
    }
    return out;
  }

  void attachObserver(allocator::OutOfMemoryObserver observer) {
    std::lock_guard<std::mutex> lock(mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  std::map<std::string, int64_t> stats(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return statsLocked(device);
  }

  void resetPeak(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& stats = deviceCache(device).stats();
    for (auto& [name, array] : statArrays(stats)) {
      for (auto& s : *array) s.reset_peak();
    }
    stats.oversize_allocations.reset_peak();
    stats.oversize_segments.reset_peak();
  }

  void resetAccumulated(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& stats = deviceCache(device).stats();
    for (auto& [name, array] : statArrays(stats)) {
      for (auto& s : *array) s.reset_accumulated();
    }
    stats.oversize_allocations.reset_accumulated();
    stats.oversize_segments.reset_accumulated();
    stats.num_alloc_retries = stats.num_ooms = stats.num_device_alloc = stats.num_device_free = 0;
    stats.num_sync_all_streams = stats.num_oom_rejections = 0;
  }

  DeviceStats deviceStats(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return deviceCache(device).stats();
  }

  // c10::DeviceAllocator: what torch.accelerator's memory functions call.
  bool initialized() override { return runtimeInitialized(); }
  void emptyCache(c10::MempoolId_t pool) override {
    if (pool == c10::MempoolId_t(0, 0)) releaseCachedMemory();
    else releasePoolMemory(pool);
  }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override { return deviceStats(resolveDevice(device)); }
  void resetAccumulatedStats(c10::DeviceIndex device) override { resetAccumulated(resolveDevice(device)); }
  void resetPeakStats(c10::DeviceIndex device) override { resetPeak(resolveDevice(device)); }
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex device) override {
    std::size_t free_bytes = 0, total_bytes = 0;
    runtimeDevice(resolveDevice(device)).memoryInfo(&free_bytes, &total_bytes);
    return {free_bytes, total_bytes};
  }

  std::string summary(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return summaryLocked(device);
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get() == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr.get());
    TORCH_CHECK(it != allocated_.end(), "record_stream: the tensor's memory was not allocated by the npu ",
                "caching allocator (a view of foreign memory cannot be tracked)");
    TORCH_CHECK(stream.device_type() == kNPU && stream.device_index() == it->second.second,
                "record_stream: the tensor is on npu:", static_cast<int>(it->second.second), " but the stream is on ",
                stream.device(), "; a tensor can only be recorded on streams of its own device");
    npu::runtimeStream(stream);  // raises here for a stream that does not exist
    deviceCache(it->second.second).recordStream(it->second.first, stream.id());
  }

  c10::DeviceIndex deviceOf(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(const_cast<void*>(ptr));
    return it == allocated_.end() ? -1 : it->second.second;
  }

  std::size_t blockSize(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(const_cast<void*>(ptr));
    return it == allocated_.end() ? 0 : it->second.first->size;
  }

  bool fromPluggableAllocator(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(const_cast<void*>(ptr));
    return it != allocated_.end() && deviceCache(it->second.second).fromPluggableAllocator(it->second.first);
  }

 private:
  static void deleteBlock(void* ptr);

  // `settle`: the parked free goes back to its pool first (DeviceCache::settle), so that
  // whatever reads or changes the pools sees them as the slow path left them.
  // allocate and free (settle false) have checked the device (or a fork) already.
  DeviceCache& deviceCache(c10::DeviceIndex device, bool settle = true) {
    if (C10_LIKELY(!settle && device >= 0 && static_cast<std::size_t>(device) < devices_.size())) {
      return *devices_[static_cast<std::size_t>(device)];
    }
    checkDevice(device);
    while (static_cast<int>(devices_.size()) <= device) {
      devices_.push_back(std::make_unique<DeviceCache>(static_cast<c10::DeviceIndex>(devices_.size())));
    }
    auto& cache = *devices_[static_cast<std::size_t>(device)];
    if (settle) cache.settle();
    return cache;
  }

  std::map<std::string, int64_t> statsLocked(c10::DeviceIndex device) {
    return flatten(deviceCache(device).stats());
  }

  std::string summaryLocked(c10::DeviceIndex device) {
    auto stats = statsLocked(device);
    std::ostringstream out;
    const std::string rule(75, '=');
    const std::string thin(75, '-');
    auto row = [&](const std::string& label, const std::string& key, bool bytes) {
      for (const char* pool : {"all", "large_pool", "small_pool"}) {
        const std::string prefix = key + "." + pool + ".";
        const std::string name = std::string(pool) == "all" ? label
                                 : std::string(pool) == "large_pool" ? "      from large pool"
                                                                     : "      from small pool";
        out << "| " << std::left << std::setw(21) << name << " |";
        for (const char* field : {"current", "peak", "allocated", "freed"}) {
          const int64_t v = stats[prefix + field];
          out << " " << std::right << std::setw(10) << (bytes ? formatBytes(v) : std::to_string(v)) << " |";
        }
        out << "\n";
      }
      out << "|" << thin << "|\n";
    };
    out << "|" << rule << "|\n";
    std::ostringstream title;
    title << "PyTorch NPU memory summary, device ID " << static_cast<int>(device);
    const std::string t = title.str();
    out << "|" << std::string((75 - t.size()) / 2, ' ') << t
        << std::string(75 - t.size() - (75 - t.size()) / 2, ' ') << "|\n";
    out << "|" << thin << "|\n";
    std::ostringstream counts;
    counts << "  NPU OOMs: " << stats["num_ooms"] << "   |   allocation retries: " << stats["num_alloc_retries"];
    const std::string c = counts.str();
    out << "|" << c << std::string(75 - std::min<std::size_t>(75, c.size()), ' ') << "|\n";
    out << "|" << rule << "|\n";
    out << "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n";
    out << "|" << thin << "|\n";
    row("Allocated memory", "allocated_bytes", true);
    row("Active memory", "active_bytes", true);
    row("Requested memory", "requested_bytes", true);
    row("NPU reserved memory", "reserved_bytes", true);
    row("Non-releasable memory", "inactive_split_bytes", true);
    row("Allocations", "allocation", false);
    row("Active allocs", "active", false);
    row("NPU reserved segments", "segment", false);
    row("Non-releasable allocs", "inactive_split", false);
    out << "|" << rule << "|\n";
    return out.str();
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<DeviceCache>> devices_;
  // Open addressing: an allocation and a free touch no heap memory here.
  ska::flat_hash_map<void*, std::pair<Block*, c10::DeviceIndex>> allocated_;
  std::unordered_map<void*, c10::DataPtr> raw_;  // caching_allocator_alloc's
  std::vector<allocator::OutOfMemoryObserver> oom_observers_;
};

// Never destroyed: tensors may be freed during static destruction at exit.
NPUCachingAllocator* g_allocator = new NPUCachingAllocator();

void NPUCachingAllocator::deleteBlock(void* ptr) { g_allocator->free(ptr); }

}  // namespace

c10::Allocator* npuAllocator() { return g_allocator; }

void resizeStorageBytes(c10::StorageImpl* storage, std::size_t new_bytes) {
  TORCH_CHECK(storage->resizable(), "resize_: this npu storage is not resizable (it wraps memory the ",
              "npu allocator does not own); clone() the tensor first");
  const auto device = storage->device().index();
  c10::DeviceGuard guard(storage->device());
  if (C10_UNLIKELY(capture::currentStreamCapturing(device))) {
    capture::refuse(device, currentStream(device).id(), "growing an npu tensor's storage (resize_)",
                           "the copy of its old contents would run once, not at each replay; allocate it at its "
                           "final size before the capture");
  }
  const std::size_t old_bytes = storage->nbytes();
  c10::DataPtr fresh = g_allocator->allocate(new_bytes);
  if (old_bytes > 0 && new_bytes > 0) {
    currentRuntimeStream(device).copy(fresh.get(), storage->data(), std::min(old_bytes, new_bytes),
                                      runtime::CopyKind::DeviceToDevice);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_bytes);
}

namespace allocator {
void emptyCache() { g_allocator->releaseCachedMemory(); }
void setCachingEnabled(bool enabled) {
  g_caching_enabled.store(enabled);
  if (!enabled) g_allocator->releaseCachedMemory();  // what the cache holds goes back now
}
bool cachingEnabled() { return g_caching_enabled.load(); }

void setCurrentSource(std::shared_ptr<const SegmentSource> source) {
  static std::mutex changing;
  std::lock_guard<std::mutex> lock(changing);
  TORCH_CHECK(source != nullptr && source->alloc != nullptr && source->free != nullptr,
              "torch.npu.memory.change_current_allocator: the allocator has no alloc or free function");
  TORCH_CHECK(!g_allocated_once.load(), "torch.npu.memory.change_current_allocator: the npu allocator has already "
              "allocated memory in this process; change it before the first npu tensor is made (as on CUDA)");
  TORCH_CHECK(g_current_source.load() == nullptr, "torch.npu.memory.change_current_allocator: the current allocator "
              "was already changed once in this process");
  g_current_source_owner = std::move(source);
  g_current_source.store(g_current_source_owner.get(), std::memory_order_release);
}

bool usingPluggableAllocator() { return g_current_source.load() != nullptr; }

void setPoolSource(c10::MempoolId_t pool, std::shared_ptr<const SegmentSource> source) {
  std::lock_guard<std::mutex> lock(g_pool_sources_mutex);
  g_pool_sources[pool] = std::move(source);
}

std::shared_ptr<const SegmentSource> poolSource(c10::MempoolId_t pool) {
  std::lock_guard<std::mutex> lock(g_pool_sources_mutex);
  auto it = g_pool_sources.find(pool);
  return it == g_pool_sources.end() ? nullptr : it->second;
}
std::map<std::string, int64_t> memoryStats(c10::DeviceIndex device) {
  return g_allocator->stats(resolveDevice(device));
}
void resetPeakStats(c10::DeviceIndex device) { g_allocator->resetPeak(resolveDevice(device)); }
void resetAccumulatedStats(c10::DeviceIndex device) { g_allocator->resetAccumulated(resolveDevice(device)); }
std::string memorySummary(c10::DeviceIndex device) { return g_allocator->summary(resolveDevice(device)); }
void recordStream(const c10::DataPtr& ptr, c10::Stream stream) { g_allocator->recordStream(ptr, stream); }
c10::DeviceIndex deviceOf(const void* ptr) { return g_allocator->deviceOf(ptr); }
std::size_t blockSize(const void* ptr) { return g_allocator->blockSize(ptr); }
bool fromPluggableAllocator(const void* ptr) { return g_allocator->fromPluggableAllocator(ptr); }

c10::MempoolId_t newPoolId(bool user_created) {
  static std::atomic<c10::CaptureId_t> graph_ids{1};
  static std::atomic<c10::CaptureId_t> user_ids{1};
  if (user_created) return {0, user_ids++};
  return {graph_ids++, 0};
}
void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool, std::function<bool(int64_t)> filter) {
  g_allocator->beginAllocateToPool(resolveDevice(device), pool, std::move(filter));
}
void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  g_allocator->endAllocateToPool(resolveDevice(device), pool);
}
void retainPool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  g_allocator->retainPool(resolveDevice(device), pool);
}
void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  g_allocator->releasePool(resolveDevice(device), pool);
}
std::size_t poolReservedBytes(c10::DeviceIndex device, c10::MempoolId_t pool) {
  return g_allocator->poolReserved(resolveDevice(device), pool);
}
int poolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) {
  return g_allocator->poolUseCount(resolveDevice(device), pool);
}
void emptyCache(c10::MempoolId_t pool) { g_allocator->emptyCache(pool); }

void* rawAlloc(std::size_t size) { return g_allocator->rawAlloc(size); }
void rawDelete(void* ptr) { g_allocator->rawDelete(ptr); }

void setMemoryFraction(double fraction, c10::DeviceIndex device) {
  g_allocator->setFraction(fraction, resolveDevice(device));
}
double getMemoryFraction(c10::DeviceIndex device) { return g_allocator->fraction(resolveDevice(device)); }

std::vector<std::string> setAllocatorSettings(const std::string& config, const std::string& origin) {
  Settings base;
  {
    std::lock_guard<std::mutex> lock(g_allocator->mutex());
    base = g_settings;
  }
  std::vector<std::string> notes;
  Settings next = parseSettings(config, origin, std::move(base), &notes);
  std::lock_guard<std::mutex> lock(g_allocator->mutex());
  g_settings = std::move(next);
  return notes;
}

std::vector<std::string> loadAllocatorSettingsFromEnv() {
  static std::once_flag once;
  std::vector<std::string> notes;
  std::call_once(once, [&] {
    const std::string name = settingsVariable();
    if (!name.empty()) notes = setAllocatorSettings(std::getenv(name.c_str()), name);
  });
  return notes;
}

std::map<std::string, std::string> allocatorSettings() {
  std::lock_guard<std::mutex> lock(g_allocator->mutex());
  return describeSettings(g_settings);
}

void recordHistory(const HistoryOptions& options) { g_allocator->recordHistory(options); }
Snapshot snapshot(c10::MempoolId_t pool, bool include_traces) { return g_allocator->takeSnapshot(pool, include_traces); }
void attachOutOfMemoryObserver(OutOfMemoryObserver observer) { g_allocator->attachObserver(std::move(observer)); }
}  // namespace allocator

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, g_allocator);

}  // namespace npu
