// A stream-ordered caching allocator for npu memory, after the contract of
// c10/cuda/CUDACachingAllocator: blocks are cached in a small and a large pool,
// split to fit and merged back on free; a freed block is reused at once by later
// work on the stream it was allocated for, and by other streams only after
// record_stream's events completed. Statistics use torch.cuda's key names.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/Stream.h>

#include <map>
#include <string>

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

}  // namespace allocator
}  // namespace npu
