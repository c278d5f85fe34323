#include "host_allocator.h"

#include <map>
#include <memory>
#include <mutex>
#include <algorithm>
#include <vector>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include "device.h"
#include "stream.h"

namespace npu {
namespace {

using Uses = std::vector<std::unique_ptr<runtime::Event>>;

struct PinnedBlock {
  std::size_t size = 0;
  Uses uses;  // stream-ordered copies that may still run
};

// Drops the uses whose copies completed (query, not synchronize: a failed
// copy's error stays for its stream to report).
void pruneCompleted(Uses& uses) {
  uses.erase(std::remove_if(uses.begin(), uses.end(), [](const auto& use) { return use->query(); }), uses.end());
}

// An at::HostAllocator, so torch.accelerator.empty_host_cache() and PyTorch's
// host-allocator calls reach it. It keeps no free blocks: a pinned block goes
// back to the HAL once its tensor is freed and its queued copies have run.
class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    releaseFinished();
    void* ptr = runtime::hal().hostAllocate(n);
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "pin_memory: could not allocate ", n,
                     " bytes of page-locked host memory");
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[static_cast<const char*>(ptr)].size = n;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(n);
    stats_.allocations.increase(1);
    stats_.allocated_bytes.increase(n);
    stats_.num_host_alloc++;
    return c10::DataPtr(ptr, ptr, &release, c10::Device(c10::kCPU));
  }

  // at::HostAllocator: a copy on `stream` reads or writes the block of `ptr`.
  bool record_event(void* ptr, void* /*ctx*/, c10::Stream stream) override {
    if (stream.device_type() != c10::DeviceType::PrivateUse1 || !contains(ptr)) return false;
    recordUse(ptr, npu::runtimeStream(stream));  // validates the device and the stream
    return true;
  }
  // Gives back the blocks whose tensors are gone and whose copies have run.
  void empty_cache() override { releaseFinished(); }
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      stat->reset_accumulated();
    }
    stats_.num_host_alloc = stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      stat->reset_peak();
    }
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    default_copy_data(dst, src, count);
  }

  bool contains(const void* ptr) {
    const char* p = static_cast<const char*>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return false;
    --it;
    return p < it->first + it->second.size;
  }

  void recordUse(const void* ptr, runtime::Stream& stream) {
    releaseFinished();
    const char* p = static_cast<const char*>(ptr);
    auto event = runtime::hal().device(stream.device()).createEvent(false);
    event->record(stream);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return;
    --it;
    pruneCompleted(it->second.uses);  // a buffer reused for many copies keeps only the pending ones
    it->second.uses.push_back(std::move(event));
  }

  // Pinned blocks kept for copies that are still queued (tests).
  std::size_t pendingUses() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (auto& [ptr, block] : blocks_) n += block.uses.size();
    for (auto& block : deferred_) n += block.uses.size();
    return n;
  }

 private:
  static void release(void* ptr);

  // A queued copy may still use the memory: the block is given back once its
  // copies ran, never waited for here (this runs in a tensor's deleter).
  void free(void* ptr) {
    releaseFinished();
    std::size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(static_cast<const char*>(ptr));
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "pinned host allocator: unknown pointer");
      size = it->second.size;
      Deferred block{ptr, size, std::move(it->second.uses)};
      stats_.active_requests.decrease(1);
      stats_.active_bytes.decrease(block.size);
      blocks_.erase(it);
      pruneCompleted(block.uses);
      if (!block.uses.empty()) {
        deferred_.push_back(std::move(block));
        return;
      }
    }
    hostFree(ptr, size);
  }

  void hostFree(void* ptr, std::size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(size);
      stats_.num_host_free++;
    }
    runtime::hal().hostFree(ptr);
  }

  void releaseFinished() {
    std::vector<Deferred> finished;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = deferred_.begin(); it != deferred_.end();) {
        pruneCompleted(it->uses);
        if (it->uses.empty()) {
          finished.push_back(std::move(*it));
          it = deferred_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& block : finished) hostFree(block.ptr, block.size);
  }

  std::mutex mutex_;
  std::map<const char*, PinnedBlock> blocks_;
  struct Deferred {
    void* ptr;
    std::size_t size;
    Uses uses;
  };
  std::vector<Deferred> deferred_;  // freed by their tensors, copies still queued
  at::HostStats stats_;
};

PinnedHostAllocator* g_pinned = new PinnedHostAllocator();
void PinnedHostAllocator::release(void* ptr) { g_pinned->free(ptr); }

REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, g_pinned)

}  // namespace

c10::Allocator* pinnedHostAllocator() { return g_pinned; }
bool isPinned(const void* ptr) { return ptr != nullptr && g_pinned->contains(ptr); }
void recordPinnedUse(const void* ptr, runtime::Stream& stream) { g_pinned->recordUse(ptr, stream); }
std::size_t pinnedPendingUses() { return g_pinned->pendingUses(); }

}  // namespace npu
