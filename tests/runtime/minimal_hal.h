// A second, minimal implementation of the HAL (hal.h), written from the
// contract alone, so that the conformance suite shows it tests the contract
// and not the emulator. Unlike the emulator:
//   - device memory the host never touches (host_addressable = false): the
//     addresses it hands out lie in a reservation the host cannot access
//     (PROT_NONE, a fault on any load or store); the bytes live elsewhere and
//     only Stream::copy reaches them;
//   - one worker thread per stream, started by the stream's first work: every
//     kernel, copy and event marker runs there, never on the caller's thread
//     (the holder's own work excepted); runIfIdle() keeps the contract's
//     default (false);
//   - events with timing, holds, positions, errors and the profiling duty as
//     hal.h states them; NPU_LAUNCH_BLOCKING=1 is honoured;
//   - no kernels of its own: with its optional methods it answers op queries
//     (Device::supportsOp) with "unsupported", so every op takes the CPU
//     fallback; without them the host kernel backend refuses each op.
// It is registered as "minimal" by conformance_hals.cpp, and built as a HAL
// library, "minimal_plugin" (minimal_hal_plugin.cpp).
#pragma once

#include <cstddef>
#include <memory>

#include "hal.h"

namespace npu::runtime::minimal {

// `devices` devices of `capacity` bytes each; reads NPU_LAUNCH_BLOCKING.
// `optional_methods` false: without the optional capabilities (multiple_streams,
// timing_events, op_queries), whose methods then keep the HAL's "not supported" defaults.
std::unique_ptr<Hal> makeMinimalHal(int devices = 2, std::size_t capacity = std::size_t(32) << 20,
                                    bool optional_methods = true);

}  // namespace npu::runtime::minimal
