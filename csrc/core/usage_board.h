// The memory each process reserves on each npu, published for `npu-smi`
// (docs/design/04-memory.md, Published usage).
//
// A process that reserves npu memory keeps one small text file, named by its pid,
// in the usage directory (NPU_EMU_USAGE_DIR, else /dev/shm/torch_npu-<uid>, else
// /tmp/torch_npu-<uid>):
//
//   torch_npu usage 1
//   pid 4242
//   start 123456          (the process's start time, /proc/<pid>/stat field 22)
//   name python           (/proc/self/comm)
//   npu 0 20971520        (physical device id, reserved bytes; one line per device used)
//   end
//
// The caching allocator calls reservedChanged() wherever a device's reserved bytes
// change (a segment allocated or freed, pages mapped or unmapped), which is rare next to
// allocations, so the file is always current at one pwrite per change. The file is
// removed at exit; a reader ignores files whose pid is gone or whose start time differs
// (a killed process, a reused pid). Failing to publish never fails an allocation: the
// board is then off for the process.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>

namespace npu::usage_board {

// `device` (the process's index, before ASCEND_RT_VISIBLE_DEVICES' mask is undone) now
// reserves `reserved` bytes.
void reservedChanged(c10::DeviceIndex device, std::size_t reserved);

}  // namespace npu::usage_board
