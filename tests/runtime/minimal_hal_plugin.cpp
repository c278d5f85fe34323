// The suite's minimal HAL (minimal_hal.h) built as a HAL library, the way a
// vendor ships one (hal_plugin.h): libnpu_hal_minimal_plugin.so. The
// conformance suite loads it (conformance_hals.cpp) and so do the Python tests
// (tests/device/test_hal_library.py, NPU_HAL=<its path>).
//   NPU_MINIMAL_HAL_DEVICES  devices (default 2)
//   NPU_MINIMAL_HAL_BASIC=1  without the optional capabilities (and op queries)
#include <cstdlib>
#include <string>

#include "hal_plugin.h"
#include "minimal_hal.h"

namespace {
std::unique_ptr<npu::runtime::Hal> makeFromEnvironment() {
  const char* devices = std::getenv("NPU_MINIMAL_HAL_DEVICES");
  const char* basic = std::getenv("NPU_MINIMAL_HAL_BASIC");
  const int count = devices != nullptr && *devices != '\0' ? std::atoi(devices) : 2;
  if (count < 1 || count > 16) {
    throw std::invalid_argument("NPU_MINIMAL_HAL_DEVICES must be 1 to 16, got '" + std::string(devices) + "'");
  }
  return npu::runtime::minimal::makeMinimalHal(count, std::size_t(64) << 20,
                                               !(basic != nullptr && std::string(basic) == "1"));
}
}  // namespace

NPU_HAL_PLUGIN("minimal_plugin", makeFromEnvironment())
