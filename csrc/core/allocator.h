// A stream-ordered caching allocator for npu memory, after the contract of
// c10/cuda/CUDACachingAllocator: blocks are cached in a small and a large pool,
// split to fit and merged back on free; a freed block is reused at once by later
// work on the stream it was allocated for, and by other streams only after
// record_stream's events completed. Statistics use torch.cuda's key names.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <sys/types.h>
#include <map>
#include <string>
#include <vector>

namespace npu {

// The c10::DeviceAllocator for npu tensors (also what empty() and resize_ use,
// and what torch.accelerator's memory functions ask).
c10::Allocator* npuAllocator();

// Gives an npu storage `new_bytes` of fresh memory, keeping its old contents
// (stream-ordered copy). Raises if the storage wraps memory it does not own.
void resizeStorageBytes(c10::StorageImpl* storage, std::size_t new_bytes);

namespace allocator {

// Frees every cached block that is not in use (torch.npu.empty_cache()).
void emptyCache();
// torch.npu.caching_allocator_enable: off, freed memory is not reused but goes back
// to the device once its stream's work is done (graph and user pools still cache).
void setCachingEnabled(bool enabled);
bool cachingEnabled();

// A pluggable allocator (torch.npu.memory.NPUPluggableAllocator): functions of a
// shared library that give and take back the memory of segments instead of the device.
// `stream` is the runtime stream the segment is first used on (Stream.npu_stream).
struct SegmentSource {
  using AllocFn = void* (*)(ssize_t size, int device, void* stream);
  using FreeFn = void (*)(void* ptr, ssize_t size, int device, void* stream);
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
};
// change_current_allocator: the general pools' segments come from `source`, uncached
// (each free goes back to it once its stream's work ran). Only before the first allocation.
void setCurrentSource(std::shared_ptr<const SegmentSource> source);
bool usingPluggableAllocator();
// MemPool(allocator=...): the pool's segments come from `source` (cached within the pool).
void setPoolSource(c10::MempoolId_t pool, std::shared_ptr<const SegmentSource> source);
std::shared_ptr<const SegmentSource> poolSource(c10::MempoolId_t pool);
// Flattened statistics: "allocated_bytes.all.current", "num_ooms", ...
std::map<std::string, int64_t> memoryStats(c10::DeviceIndex device);
void resetPeakStats(c10::DeviceIndex device);
void resetAccumulatedStats(c10::DeviceIndex device);
// A human-readable table of memoryStats (torch.npu.memory_summary()).
std::string memorySummary(c10::DeviceIndex device);
// Keeps the block of `ptr` from reuse until work queued so far on `stream` ran.
void recordStream(const c10::DataPtr& ptr, c10::Stream stream);
// The device whose pool holds `ptr`, or -1.
c10::DeviceIndex deviceOf(const void* ptr);
// The size of the caching allocator's block holding `ptr` (0 if not ours).
std::size_t blockSize(const void* ptr);
// Whether the block at `ptr` lies in a segment a pluggable allocator gave.
bool fromPluggableAllocator(const void* ptr);

// ---- private memory pools (CUDA's graph pools and torch.cuda.MemPool) ---------------------
// A pool owns its own segments: blocks allocated while it is active come from them,
// are cached in it only (never given to other allocations), and its segments stay
// reserved until the pool is released (use count 0) and they are free.

// A fresh, process-unique id: {id, 0} for graph pools, {0, id} for user pools.
c10::MempoolId_t newPoolId(bool user_created);
// Allocations on `device` whose stream (the current npu stream id at allocation time)
// passes `filter` go to `pool` until endAllocateToPool. Creates the pool or adds one to
// its use count (release it with releasePool after endAllocateToPool). Several pools may
// be active at once: the latest begun whose filter accepts the stream wins.
void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                         std::function<bool(int64_t stream_id)> filter);
// Ends the latest beginAllocateToPool of `pool` on `device` (raises if none is active).
void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool);
// Adds one to the pool's use count, creating it if needed.
void retainPool(c10::DeviceIndex device, c10::MempoolId_t pool);
// Takes one from the use count; at 0 the pool's free segments go back to the device
// (after their work completed) and segments still in use follow at the next
// emptyCache() or out-of-memory retry once freed. Raises for an unknown pool.
void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool);
// The bytes of the pool's segments on `device` (0 for an unknown pool).
std::size_t poolReservedBytes(c10::DeviceIndex device, c10::MempoolId_t pool);
// The pool's use count on `device` (0 for an unknown pool).
int poolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool);
// emptyCache({0, 0}) is emptyCache(); a pool id frees that pool's free segments only.
void emptyCache(c10::MempoolId_t pool);

// ---- raw allocations (torch.npu.caching_allocator_alloc/delete) -----------------------------
// Allocates on the current device and stream; freed by rawDelete.
void* rawAlloc(std::size_t size);
void rawDelete(void* ptr);

// ---- per-process memory fraction ------------------------------------------------------------
// Segments beyond fraction * the device's capacity are refused with an OutOfMemoryError.
void setMemoryFraction(double fraction, c10::DeviceIndex device);
double getMemoryFraction(c10::DeviceIndex device);

// ---- allocator settings (PYTORCH_NPU_ALLOC_CONF, else PYTORCH_ALLOC_CONF) ------------------
// Applies "key:value,..." (max_split_size_mb, garbage_collection_threshold,
// roundup_power2_divisions, expandable_segments, page_size, and the Ascend adapter's
// keys that have no effect here). Raises ValueError naming `origin` and the key for a
// bad key or value; returns the notes to warn about (settings accepted without effect).
std::vector<std::string> setAllocatorSettings(const std::string& config, const std::string& origin);
// Reads the environment variables once (later calls return no notes).
std::vector<std::string> loadAllocatorSettingsFromEnv();
// The settings in force, as the snapshot's "allocator_settings" lists them.
std::map<std::string, std::string> allocatorSettings();

// ---- memory history and snapshots (torch.cuda.memory._record_memory_history) --------------
struct HistoryOptions {
  bool record_state = false;    // keep each live block's context
  bool record_history = false;  // keep a trace of alloc/free/segment events
  c10::CachingDeviceAllocator::RecordContext context = c10::CachingDeviceAllocator::RecordContext::NEVER;
  std::size_t max_entries = 0;  // per device, oldest dropped first
  c10::CachingDeviceAllocator::CreateContextFn gather = nullptr;  // called without the allocator's lock
  bool clear_history = false;
};
void recordHistory(const HistoryOptions& options);

struct Snapshot {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;  // stream = the stream id
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> device_traces;
};
// Segments of every device (only those of `pool` unless it is {0, 0}), oldest trace first.
Snapshot snapshot(c10::MempoolId_t pool, bool include_traces);

// Called (without the allocator's lock) before an out-of-memory error is raised:
// device, bytes requested, bytes the allocator holds, bytes the device has free.
using OutOfMemoryObserver = std::function<void(int64_t device, std::size_t requested, std::size_t reserved,
                                               std::size_t device_free)>;
void attachOutOfMemoryObserver(OutOfMemoryObserver observer);

}  // namespace allocator
}  // namespace npu
