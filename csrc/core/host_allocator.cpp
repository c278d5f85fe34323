#include "host_allocator.h"

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

#include "device.h"

namespace npu {
namespace {

struct PinnedBlock {
  std::size_t size = 0;
  std::vector<std::unique_ptr<runtime::Event>> uses;  // copies that may still run
};

class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    void* ptr = runtime::hal().hostAllocate(n);
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "pin_memory: could not allocate ", n,
                     " bytes of page-locked host memory");
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[static_cast<const char*>(ptr)].size = n;
    return c10::DataPtr(ptr, ptr, &release, c10::Device(c10::kCPU));
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
    const char* p = static_cast<const char*>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return;
    --it;
    auto event = runtime::hal().device(stream.device()).createEvent(false);
    event->record(stream);
    it->second.uses.push_back(std::move(event));
  }

 private:
  static void release(void* ptr);

  void free(void* ptr) {
    std::vector<std::unique_ptr<runtime::Event>> uses;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(static_cast<const char*>(ptr));
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "pinned host allocator: unknown pointer");
      uses = std::move(it->second.uses);
      blocks_.erase(it);
    }
    // A queued copy may still use the memory: let it finish before giving it back.
    // (query, not synchronize: a failed copy's error stays for the stream to report)
    for (auto& use : uses) {
      while (!use->query()) std::this_thread::yield();
    }
    runtime::hal().hostFree(ptr);
  }

  std::mutex mutex_;
  std::map<const char*, PinnedBlock> blocks_;
};

PinnedHostAllocator* g_pinned = new PinnedHostAllocator();
void PinnedHostAllocator::release(void* ptr) { g_pinned->free(ptr); }

}  // namespace

c10::Allocator* pinnedHostAllocator() { return g_pinned; }
bool isPinned(const void* ptr) { return ptr != nullptr && g_pinned->contains(ptr); }
void recordPinnedUse(const void* ptr, runtime::Stream& stream) { g_pinned->recordUse(ptr, stream); }

}  // namespace npu
