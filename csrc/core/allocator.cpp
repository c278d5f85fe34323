#include "allocator.h"

#include <algorithm>
#include <array>
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

#include "device.h"
#include "stream.h"

namespace npu {

namespace {

constexpr std::size_t kMinBlockSize = 512;        // every size is rounded up to this
constexpr std::size_t kSmallSize = 1 << 20;       // requests up to 1 MiB use the small pool
constexpr std::size_t kSmallSegment = 2 << 20;    // small pool grows by 2 MiB segments
constexpr std::size_t kLargeSegment = 20 << 20;   // requests under 10 MiB share 20 MiB segments
constexpr std::size_t kMinLargeAlloc = 10 << 20;
constexpr std::size_t kLargeRounding = 2 << 20;   // larger requests get their own, rounded

std::size_t roundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Statistics are c10's (CachingDeviceAllocator::DeviceStats): torch.npu.memory_stats()
// and torch.accelerator.memory_stats() read the same numbers.
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatArray;
constexpr int kAllPools = static_cast<int>(c10::CachingAllocator::StatType::AGGREGATE);
constexpr int kSmallPool = static_cast<int>(c10::CachingAllocator::StatType::SMALL_POOL);
constexpr int kLargePool = static_cast<int>(c10::CachingAllocator::StatType::LARGE_POOL);

void updateStat(StatArray& stat, bool small, int64_t delta) {
  for (int index : {kAllPools, small ? kSmallPool : kLargePool}) {
    if (delta > 0) stat[index].increase(static_cast<std::size_t>(delta));
    else stat[index].decrease(static_cast<std::size_t>(-delta));
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

struct Block {
  char* ptr;
  std::size_t size;
  std::size_t requested = 0;
  int64_t stream;  // the stream whose work may use the block without waiting
  bool small;
  bool allocated = false;
  int pending_events = 0;  // record_stream uses still running
  uint64_t free_position = 0;  // its stream's launch count when it was freed
  Block* prev = nullptr;   // neighbours inside the same segment
  Block* next = nullptr;
  std::vector<int64_t> stream_uses;

  Block(char* p, std::size_t s, int64_t st, bool sm) : ptr(p), size(s), stream(st), small(sm) {}
  bool isSplit() const { return prev != nullptr || next != nullptr; }
  bool isFree() const { return !allocated && pending_events == 0; }
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
  }
};
using Pool = std::set<Block*, BlockOrder>;

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device), stats_(freshStats()) {}

  // nullptr when the device is out of memory even after freeing the cache.
  // `for_host`: the memory is written at once by host code holding the
  // stream, so only blocks whose earlier work on the stream completed will do.
  Block* allocate(std::size_t requested, int64_t stream, bool for_host, std::unique_lock<std::mutex>& lock) {
    processPendingEvents();
    const std::size_t size = roundUp(std::max(requested, std::size_t(1)), kMinBlockSize);
    const bool small = size <= kSmallSize;
    Pool& pool = small ? small_ : large_;

    Block* block = takeBestFit(pool, size, stream, for_host);
    if (block == nullptr) {
      const std::size_t segment_size =
          small ? kSmallSegment : (size < kMinLargeAlloc ? kLargeSegment : roundUp(size, kLargeRounding));
      void* memory = rt().allocate(segment_size);
      if (memory == nullptr) {
        // Out of device memory: give the cache back (once its work is done), retry.
        stats_.num_alloc_retries++;
        releaseCachedSegments(lock);
        block = takeBestFit(pool, size, stream, for_host);
        if (block == nullptr) memory = rt().allocate(segment_size);
      }
      if (block == nullptr) {
        if (memory == nullptr) {
          stats_.num_ooms++;
          return nullptr;
        }
        block = new Block(static_cast<char*>(memory), segment_size, stream, small);
        stats_.num_device_alloc++;
        updateStat(stats_.segment, small, 1);
        updateStat(stats_.reserved_bytes, small, static_cast<int64_t>(segment_size));
      }
    }
    splitIfWorthIt(block, size);
    block->allocated = true;
    block->requested = requested;
    updateStat(stats_.allocation, small, 1);
    updateStat(stats_.allocated_bytes, small, static_cast<int64_t>(block->size));
    updateStat(stats_.requested_bytes, small, static_cast<int64_t>(requested));
    updateStat(stats_.active, small, 1);
    updateStat(stats_.active_bytes, small, static_cast<int64_t>(block->size));
    return block;
  }

  void free(Block* block) {
    block->allocated = false;
    block->free_position = runtimeStream(block->stream).position();
    updateStat(stats_.allocation, block->small, -1);
    updateStat(stats_.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
    updateStat(stats_.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
    if (block->stream_uses.empty()) {
      returnToPool(block);
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
  }

  // Gives every whole cached segment back to the device, once the work that
  // used it has completed. Unlocks `lock` while it waits for the streams.
  void releaseCachedSegments(std::unique_lock<std::mutex>& lock) {
    processPendingEvents();
    std::vector<Block*> segments;
    for (Pool* pool : {&small_, &large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        if ((*it)->isSplit()) {
          ++it;  // part of a segment still in use
          continue;
        }
        segments.push_back(*it);
        it = pool->erase(it);  // out of reach of other threads while we wait
      }
    }
    stats_.num_sync_all_streams++;
    lock.unlock();
    rt().drain();  // kernel errors stay pending for their own synchronisation point
    lock.lock();
    for (Block* block : segments) {
      if (!runtimeStream(block->stream).passed(block->free_position)) {
        insertIntoPool(block);  // queued behind a hold of this thread: still in use
        continue;
      }
      rt().free(block->ptr);
      stats_.num_device_free++;
      updateStat(stats_.segment, block->small, -1);
      updateStat(stats_.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
      delete block;
    }
    processPendingEvents();
  }

  void recordStream(Block* block, int64_t stream) {
    if (stream == block->stream) return;
    auto& uses = block->stream_uses;
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

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

  Block* takeBestFit(Pool& pool, std::size_t size, int64_t stream, bool for_host) {
    Block key(nullptr, size, stream, false);
    for (auto it = pool.lower_bound(&key); it != pool.end() && (*it)->stream == stream; ++it) {
      Block* block = *it;
      if (for_host && !runtimeStream(stream).passed(block->free_position)) continue;
      removeFromPool(block);
      return block;
    }
    return nullptr;
  }

  void splitIfWorthIt(Block* block, std::size_t size) {
    const std::size_t remaining = block->size - size;
    const bool worth = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!worth) return;
    auto* rest = new Block(block->ptr + size, remaining, block->stream, block->small);
    rest->free_position = block->free_position;  // its memory's last use is the whole block's
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insertIntoPool(rest);
  }

  Pool& poolOf(Block* block) { return block->small ? small_ : large_; }

  void insertIntoPool(Block* block) {
    poolOf(block).insert(block);
    if (block->isSplit()) {
      updateStat(stats_.inactive_split, block->small, 1);
      updateStat(stats_.inactive_split_bytes, block->small, static_cast<int64_t>(block->size));
    }
  }

  void removeFromPool(Block* block) {
    poolOf(block).erase(block);
    if (block->isSplit()) {
      updateStat(stats_.inactive_split, block->small, -1);
      updateStat(stats_.inactive_split_bytes, block->small, -static_cast<int64_t>(block->size));
    }
  }

  void returnToPool(Block* block) {
    updateStat(stats_.active, block->small, -1);
    updateStat(stats_.active_bytes, block->small, -static_cast<int64_t>(block->size));
    mergeNeighbour(block, block->prev);
    mergeNeighbour(block, block->next);
    insertIntoPool(block);
  }

  void mergeNeighbour(Block* block, Block* neighbour) {
    if (neighbour == nullptr || !neighbour->isFree()) return;
    removeFromPool(neighbour);
    if (neighbour == block->prev) {
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    block->free_position = std::max(block->free_position, neighbour->free_position);
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

  const c10::DeviceIndex device_;
  Pool small_;
  Pool large_;
  DeviceStats stats_;
  std::vector<std::pair<std::unique_ptr<runtime::Event>, Block*>> pending_;
  std::vector<runtime::Stream*> streams_;  // by stream id, looked up once
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
  out["max_split_size"] = stats.max_split_size;
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
    const bool for_host = holdingStream(device, stream);
    std::unique_lock<std::mutex> lock(mutex_);
    auto& cache = deviceCache(device);
    Block* block = cache.allocate(n, stream, for_host, lock);
    if (block == nullptr) {
      const std::string summary = summaryLocked(device);
      std::size_t free_bytes = 0, total_bytes = 0;
      runtime::hal().device(device).memoryInfo(&free_bytes, &total_bytes);
      const auto& stats = cache.stats();
      lock.unlock();
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory on npu:", static_cast<int>(device),
                       ". Tried to allocate ", formatBytes(static_cast<int64_t>(n)), "; the device has ",
                       formatBytes(static_cast<int64_t>(total_bytes)), " in all, ",
                       formatBytes(static_cast<int64_t>(free_bytes)), " free, ",
                       formatBytes(stats.allocated_bytes[kAllPools].current), " allocated by tensors and ",
                       formatBytes(stats.reserved_bytes[kAllPools].current -
                                   stats.allocated_bytes[kAllPools].current),
                       " cached. Free tensors you no longer need (del x), call torch.npu.empty_cache(), "
                       "use smaller batches, or give the emulator more memory with NPU_EMU_MEMORY.\n",
                       summary);
    }
    allocated_.emplace(block->ptr, std::make_pair(block, device));
    reportToProfiler(block->ptr, static_cast<int64_t>(block->size), device);
    return c10::DataPtr(block->ptr, block->ptr, &deleteBlock, c10::Device(kNPU, device));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteBlock; }

  void copy_data(void* dst, const void* src, std::size_t count) const override {
    auto& stream = currentRuntimeStream(currentDevice());
    stream.copy(dst, src, count, runtime::CopyKind::DeviceToDevice);
  }

  void free(void* ptr) {
    if (inBadFork()) return;  // a forked child: the parent's memory is not ours to reuse
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != allocated_.end(), "npu allocator: free of an unknown pointer");
    auto [block, device] = it->second;
    allocated_.erase(it);
    const auto size = static_cast<int64_t>(block->size);
    deviceCache(device).free(block);
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
      deviceCache(d).releaseCachedSegments(lock);
    }
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
    TORCH_CHECK(pool == c10::MempoolId_t(0, 0), "npu empty_cache: memory pools are not supported yet (got pool id (",
                pool.first, ", ", pool.second, ")); call it without a pool");
    releaseCachedMemory();
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

 private:
  static void deleteBlock(void* ptr);

  DeviceCache& deviceCache(c10::DeviceIndex device) {
    checkDevice(device);
    while (static_cast<int>(devices_.size()) <= device) {
      devices_.push_back(std::make_unique<DeviceCache>(static_cast<c10::DeviceIndex>(devices_.size())));
    }
    return *devices_[device];
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
  std::unordered_map<void*, std::pair<Block*, c10::DeviceIndex>> allocated_;
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
std::map<std::string, int64_t> memoryStats(c10::DeviceIndex device) {
  return g_allocator->stats(resolveDevice(device));
}
void resetPeakStats(c10::DeviceIndex device) { g_allocator->resetPeak(resolveDevice(device)); }
void resetAccumulatedStats(c10::DeviceIndex device) { g_allocator->resetAccumulated(resolveDevice(device)); }
std::string memorySummary(c10::DeviceIndex device) { return g_allocator->summary(resolveDevice(device)); }
void recordStream(const c10::DataPtr& ptr, c10::Stream stream) { g_allocator->recordStream(ptr, stream); }
c10::DeviceIndex deviceOf(const void* ptr) { return g_allocator->deviceOf(ptr); }
std::size_t blockSize(const void* ptr) { return g_allocator->blockSize(ptr); }
}  // namespace allocator

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, g_allocator);

}  // namespace npu
