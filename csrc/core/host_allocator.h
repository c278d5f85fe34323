// Page-locked ("pinned") host memory for asynchronous copies, as
// tensor.pin_memory() and DataLoader(pin_memory=True) use it. Freed blocks are
// cached by power-of-two size and reused once their recorded copies completed,
// as by CUDA's CachingHostAllocator.
#pragma once

// Its alignas(hardware_destructive_interference_size) warns under GCC: the value
// may differ between compilers, which does not matter to an allocator built once.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winterference-size"
#endif
#include <ATen/core/CachingHostAllocator.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "../runtime/hal.h"

namespace npu {

// PyTorch's host allocator of the npu (get_stats, reset_*_stats, empty_cache).
at::HostAllocator* pinnedHostAllocator();
bool isPinned(const void* ptr);
// A stream-ordered copy reads or writes `ptr`: its block is not reused before
// the work now on `stream` has run.
void recordPinnedUse(const void* ptr, runtime::Stream& stream);
// How many recorded copies the allocator still tracks (bounded: completed ones are dropped).
std::size_t pinnedPendingUses();

}  // namespace npu
