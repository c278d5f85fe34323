// The npu in PyTorch's profiler (npu_profiler.cpp): what it keeps besides the
// Kineto activities for torch_npu.profiler to read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../runtime/tracing.h"

namespace npu::profiler {

// One kernel, copy or CPU fallback as the device profile's chip would run it
// (core/profile.h's cost model), laid out per stream in the chip's order.
struct Projected {
  uint64_t correlation = 0;
  int device = 0;
  int64_t stream = 0;
  int64_t start_ns = 0;           // on the chip's timeline of its stream
  int64_t projected_ns = 0;       // its duration there
  const char* kind = "";          // "kernel", "memcpy" or "fallback"
  std::string name;               // as the trace names the activity
  int64_t measured_start_ns = 0;  // the activity's start as the emulator ran it (its Kineto event's)
  // What it does, so that it can be projected onto other chips too (profile::projectKernelNs).
  runtime::tracing::Work work;
  bool in_graph = false;          // launched by a graph replay
  bool crosses_link = false;      // a copy (or a fallback's copies) between host and device memory
  int64_t host_ns = 0;            // a fallback's host work, part of projected_ns
  bool host_synchronous = false;  // the launching thread waited for it (a copy from pageable memory)
};

// The last processed profiling session's projections, in the order they
// completed; empty under a profile without a cost model, and from the moment
// the next profiler is configured.
std::vector<Projected> lastProjections();

}  // namespace npu::profiler
