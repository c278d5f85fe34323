// Which implementation serves an aten op on the npu, read from the dispatcher
// (c10::Dispatcher), not from a hand-kept list.
#pragma once

#include <optional>

#include "../core/profile.h"
#include <string>
#include <vector>

namespace npu::dispatch {

// Priorities of the built-in implementations; custom ops choose their own.
constexpr int kNativePriority = 100;
constexpr int kCompositePriority = 50;
constexpr int kCpuFallbackPriority = 0;

struct OpResolution {
  std::string name;      // "aten::add.Tensor"
  std::string backend;   // "npu", "composite", "cpu" or "none"
  int priority = 0;
  std::vector<std::string> backends;  // every implementation that exists: "npu", "composite", "cpu"
};

// `name` as accepted by canonicalOpName(); without an overload, the op's
// primary overload ("", "Tensor", "default", "input", "self", else the first).
// As the device of `chip` serves it (the active profile's by default): an op
// outside a chip's native set decomposes or takes the CPU fallback there.
std::optional<OpResolution> resolveOp(const std::string& name, const profile::DeviceProfile& chip = profile::active());
// Every aten op (each overload), with how the npu serves it.
std::vector<OpResolution> allOps(const profile::DeviceProfile& chip = profile::active());
// Number of operators (overloads) with a native npu kernel.
int64_t numNativeKernels();

}  // namespace npu::dispatch
