// Page-locked ("pinned") host memory for asynchronous copies, as
// tensor.pin_memory() and DataLoader(pin_memory=True) use it.
#pragma once

#include <c10/core/Allocator.h>

#include "../runtime/hal.h"

namespace npu {

c10::Allocator* pinnedHostAllocator();
bool isPinned(const void* ptr);
// A stream-ordered copy reads or writes `ptr`: its memory is not released before
// the work now on `stream` has run.
void recordPinnedUse(const void* ptr, runtime::Stream& stream);
// How many recorded copies the allocator still tracks (bounded: completed ones are dropped).
std::size_t pinnedPendingUses();

}  // namespace npu
