// A busy-wait's pause: lets the core's other hyperthread (or the host's power
// management) know this thread is spinning. Used by the stream worker's poll
// and the copy engine's wait for its helpers' chunks.
#pragma once

namespace npu::runtime::emu {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace npu::runtime::emu
