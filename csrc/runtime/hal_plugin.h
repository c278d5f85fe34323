// A HAL shipped as a shared library: what a vendor builds instead of editing
// builtin_hals.cpp. NPU_HAL=/path/libnpu_hal_mine.so (or NPU_HAL=mine, for a
// libnpu_hal_mine.so on the library search path) makes the runtime load it,
// call its entry point and register the HAL it describes (registry.cpp).
//
// The entry point is C and versioned: the runtime hands it its HAL API
// version and the table through which the library reaches the runtime's trace
// (tracing::HostServices, for the profiling duty of hal.h); the library
// answers with the version it was compiled against, its name and a factory.
// The objects the factory makes are the C++ classes of hal.h, so the library
// is built with the runtime's compiler ABI (g++ and libstdc++, the C++11 string
// ABI of the torch it runs in), as every torch extension is.
//
// Building one: compile the HAL's sources with this folder on the include path
// and link the HAL SDK, the library `npu_hal_sdk` of CMakeLists.txt (hal.cpp:
// the default bodies of optional methods; tracing.cpp: the profiling helpers;
// hal_plugin_sdk.cpp: their link to the runtime). Define the entry point once:
//
//   NPU_HAL_PLUGIN("mine", std::make_unique<MyHal>())
//
// tests/runtime/minimal_hal_plugin.cpp builds the test suite's minimal HAL this
// way, and the tests load it (tests/device/test_hal_library.py, registry_test.cpp).
#pragma once

#ifdef __cplusplus
#include <memory>

#include "hal.h"
#include "tracing.h"
extern "C" {
#endif

#define NPU_HAL_PLUGIN_ENTRY_NAME "npu_hal_plugin_init"

// What the runtime hands the library.
struct NpuHalHost {
  int api_version;      // the runtime's kHalApiVersion
  const void* tracing;  // const npu::runtime::tracing::HostServices*
};

// What the library describes.
struct NpuHalPlugin {
  int api_version;  // the kHalApiVersion it was compiled against
  const char* name;  // its registered name (letters, digits, '_'), static storage
  // A new HAL (an npu::runtime::Hal*, owned by the caller). It may throw
  // std::invalid_argument naming a bad setting, as a factory of hal.h does.
  void* (*create)(void);
};

// Fills *plugin and returns 0, or returns non-zero when it cannot serve this
// runtime. Exported by the library as NPU_HAL_PLUGIN_ENTRY_NAME.
typedef int (*NpuHalPluginEntry)(const struct NpuHalHost* host, struct NpuHalPlugin* plugin);

#ifdef __cplusplus
}  // extern "C"

namespace npu::runtime::plugin {
// Links the library's profiling helpers to the runtime's trace; false when the
// runtime hands no table (hal_plugin_sdk.cpp).
bool connect(const NpuHalHost* host);
}  // namespace npu::runtime::plugin

#define NPU_HAL_PLUGIN(NAME, MAKE_HAL)                                                                        \
  extern "C" __attribute__((visibility("default"))) int npu_hal_plugin_init(const NpuHalHost* host,         \
                                                                           NpuHalPlugin* plugin) {          \
    if (host == nullptr || plugin == nullptr || !::npu::runtime::plugin::connect(host)) return 1;           \
    plugin->api_version = ::npu::runtime::kHalApiVersion;                                                   \
    plugin->name = NAME;                                                                                    \
    plugin->create = []() -> void* {                                                                        \
      std::unique_ptr<::npu::runtime::Hal> made = MAKE_HAL;                                                 \
      return made.release();                                                                                \
    };                                                                                                      \
    return 0;                                                                                               \
  }
#endif
