#include "host_allocator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/llvmMathExtras.h>

#include "device.h"
#include "stream.h"

namespace npu {
namespace {

using Uses = std::vector<std::unique_ptr<runtime::Event>>;
using Clock = std::chrono::steady_clock;

// A block of page-locked memory of a power-of-two size. It is in use (a
// tensor holds it), pending (its tensor is gone, copies recorded on it may
// still run) or cached (on the free list of its size, ready for the next pin).
struct PinnedBlock {
  void* ptr = nullptr;
  std::size_t size = 0;
  bool allocated = false;
  Uses uses;  // stream-ordered copies that may still run
};

// Drops the uses whose copies completed (query, not synchronize: a failed
// copy's error stays for its stream to report).
void pruneCompleted(Uses& uses) {
  uses.erase(std::remove_if(uses.begin(), uses.end(), [](const auto& use) { return use->query(); }), uses.end());
}

// Sizes round up to a power of two, as CUDA's CachingHostAllocator rounds them
// (its default pinned_max_round_threshold and pinned_max_cached_size: every
// size is rounded and cached), so a free list per power of two holds blocks of
// one size.
constexpr std::size_t kBuckets = 64;
std::size_t roundSize(std::size_t n) {
  return n > (std::size_t{1} << 63) ? n : static_cast<std::size_t>(c10::llvm::PowerOf2Ceil(n));
}
std::size_t bucketOf(std::size_t size) { return std::min<std::size_t>(c10::llvm::Log2_64_Ceil(size), kBuckets - 1); }

int64_t microsecondsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

// PyTorch's at::HostAllocator for the npu, with the contract of CUDA's
// CachingHostAllocator: a freed block is cached and handed to a later pin of
// the same rounded size once the copies recorded on it have completed;
// empty_cache() (torch.accelerator.empty_host_cache()) gives the cached blocks
// back. Statistics are at::HostStats, as torch.cuda.host_memory_stats() reads them.
class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    processPending();
    const std::size_t size = roundSize(n);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& list = free_[bucketOf(size)];
      // Blocks above 2^63 bytes are not rounded: the one bucket may hold several sizes.
      auto it = std::find_if(list.rbegin(), list.rend(), [size](const PinnedBlock* b) { return b->size == size; });
      if (it != list.rend()) {
        PinnedBlock* block = *it;
        list.erase(std::next(it).base());
        block->allocated = true;
        stats_.active_requests.increase(1);
        stats_.active_bytes.increase(size);
        return c10::DataPtr(block->ptr, block->ptr, &release, c10::Device(c10::kCPU));
      }
    }
    void* ptr = hostAllocate(size);
    if (ptr == nullptr) {  // the cached blocks of other sizes may make room
      empty_cache();
      ptr = hostAllocate(size);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "pin_memory: could not allocate ", n,
                     " bytes of page-locked host memory");
    std::lock_guard<std::mutex> lock(mutex_);
    auto block = std::make_unique<PinnedBlock>();
    block->ptr = ptr;
    block->size = size;
    block->allocated = true;
    blocks_.emplace(static_cast<const char*>(ptr), std::move(block));
    stats_.allocations.increase(1);
    stats_.allocated_bytes.increase(size);
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    stats_.bucket_allocation[bucketOf(size)]++;
    return c10::DataPtr(ptr, ptr, &release, c10::Device(c10::kCPU));
  }

  // at::HostAllocator: a copy on `stream` reads or writes the block of `ptr`.
  bool record_event(void* ptr, void* /*ctx*/, c10::Stream stream) override {
    if (stream.device_type() != c10::DeviceType::PrivateUse1 || !contains(ptr)) return false;
    recordUse(ptr, npu::runtimeStream(stream));  // validates the device and the stream
    return true;
  }

  // Gives back the cached blocks, and the pending ones whose copies have run.
  // Blocks in use, or whose copies are still queued, stay.
  void empty_cache() override {
    processPending();
    std::vector<std::unique_ptr<PinnedBlock>> released;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& list : free_) {
        for (PinnedBlock* block : list) {
          auto it = blocks_.find(static_cast<const char*>(block->ptr));
          released.push_back(std::move(it->second));
          blocks_.erase(it);
        }
        list.clear();
      }
    }
    for (const auto& block : released) {
      const auto start = Clock::now();
      runtime::hal().hostFree(block->ptr);
      const int64_t us = microsecondsSince(start);
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(block->size);
      stats_.host_free_time.increase(us);
    }
  }

  at::HostStats get_stats() override {
    processPending();  // a block whose copies completed counts as cached, not active
    std::lock_guard<std::mutex> lock(mutex_);
    at::HostStats stats = stats_;
    stats.num_host_alloc = stats.allocations.allocated;
    stats.num_host_free = stats.allocations.freed;
    return stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : counters()) stat->reset_accumulated();
    stats_.host_alloc_time.reset_accumulated();
    stats_.host_free_time.reset_accumulated();
    std::fill(stats_.bucket_allocation.begin(), stats_.bucket_allocation.end(), 0);
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : counters()) stat->reset_peak();
    stats_.host_alloc_time.reset_peak();
    stats_.host_free_time.reset_peak();
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    default_copy_data(dst, src, count);
  }

  // Whether `ptr` points into a block a tensor holds now.
  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return activeBlockOf(ptr) != nullptr;
  }

  void recordUse(const void* ptr, runtime::Stream& stream) {
    auto event = runtime::hal().device(stream.device()).createEvent(false);
    event->record(stream);
    std::lock_guard<std::mutex> lock(mutex_);
    PinnedBlock* block = activeBlockOf(ptr);
    if (block == nullptr) return;
    pruneCompleted(block->uses);  // a buffer reused for many copies keeps only the pending ones
    block->uses.push_back(std::move(event));
  }

  // Recorded copies the allocator still tracks (tests).
  std::size_t pendingUses() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (auto& [ptr, block] : blocks_) n += block->uses.size();
    return n;
  }

 private:
  static void release(void* ptr);

  std::array<c10::CachingAllocator::Stat*, 4> counters() {
    return {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes};
  }

  // Needs mutex_.
  PinnedBlock* activeBlockOf(const void* ptr) {
    const char* p = static_cast<const char*>(ptr);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return nullptr;
    --it;
    PinnedBlock* block = it->second.get();
    return block->allocated && p < it->first + block->size ? block : nullptr;
  }

  void* hostAllocate(std::size_t size) {
    const auto start = Clock::now();
    void* ptr = runtime::hal().hostAllocate(size);
    const int64_t us = microsecondsSince(start);
    if (ptr != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.host_alloc_time.increase(us);
    }
    return ptr;
  }

  // Needs mutex_. The block becomes reusable: it goes on its size's free list.
  void cache(PinnedBlock* block) {
    free_[bucketOf(block->size)].push_back(block);
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(block->size);
  }

  // The tensor is gone. A queued copy may still use the memory: the block is
  // cached once its copies ran, never waited for here (this runs in a tensor's deleter).
  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(static_cast<const char*>(ptr));
    TORCH_INTERNAL_ASSERT(it != blocks_.end() && it->second->allocated, "pinned host allocator: unknown pointer");
    PinnedBlock* block = it->second.get();
    block->allocated = false;
    pruneCompleted(block->uses);
    if (block->uses.empty()) {
      cache(block);
    } else {
      pending_.push_back(block);
    }
  }

  // Caches the pending blocks whose copies have completed.
  void processPending() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.empty()) return;
    auto done = std::stable_partition(pending_.begin(), pending_.end(), [](PinnedBlock* block) {
      pruneCompleted(block->uses);
      return !block->uses.empty();
    });
    for (auto it = done; it != pending_.end(); ++it) cache(*it);
    pending_.erase(done, pending_.end());
  }

  std::mutex mutex_;
  std::map<const char*, std::unique_ptr<PinnedBlock>> blocks_;  // every block, by address
  std::array<std::vector<PinnedBlock*>, kBuckets> free_;        // cached, by power of two
  std::vector<PinnedBlock*> pending_;                           // freed, copies still queued
  at::HostStats stats_;
};

PinnedHostAllocator* g_pinned = new PinnedHostAllocator();
void PinnedHostAllocator::release(void* ptr) { g_pinned->free(ptr); }

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, g_pinned)

}  // namespace

at::HostAllocator* pinnedHostAllocator() { return g_pinned; }
bool isPinned(const void* ptr) { return ptr != nullptr && g_pinned->contains(ptr); }
void recordPinnedUse(const void* ptr, runtime::Stream& stream) { g_pinned->recordUse(ptr, stream); }
std::size_t pinnedPendingUses() { return g_pinned->pendingUses(); }

}  // namespace npu
