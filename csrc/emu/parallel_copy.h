// The emulated device's copy engine: a memcpy that uses idle cores for large
// copies, as ATen's cpu copy_ does, without ever waiting for a thread that has
// not started.
//
// The calling thread (the one running the stream's copy) claims chunks from a
// shared counter and copies them; helper threads of a small persistent pool are
// woken and claim chunks too, but only if they get to run while chunks are
// left. At the end the caller waits only for chunks a helper has claimed and is
// copying (one chunk each at most), never for a helper that has not started: on
// a loaded host the copy costs the caller's memcpy, on an idle one it is shared.
//
// Device memory (NPU_EMU_PROTECT): a helper touches it only while the caller,
// inside its DeviceWork, waits for the helper's chunk, so the gate (process-wide)
// is open for it as for the caller.
#pragma once

#include <cstddef>

namespace npu::runtime::emu {

// Copies `n` bytes; returns when every byte is copied. A copy of at least
// parallelCopyMinBytes() uses up to `threads` - 1 helpers.
void parallelCopy(void* dst, const void* src, std::size_t n, int threads);

// The threads a copy launched now may use, the caller's included: torch's
// intra-op thread count (at::get_num_threads()) when the process has ATen, else
// the host's cores. Read on the launching thread: torch.set_num_threads() sets
// it for the threads that launch, not for a stream's worker.
int copyThreads();

// The smallest copy that is split; smaller ones are one memcpy.
std::size_t parallelCopyMinBytes();

}  // namespace npu::runtime::emu
