// Launch configurations for the emulator-specific tests (emu_*_test.cpp).
#pragma once

#include <cstddef>

#include "emu/stream.h"
#include "test_util.h"

namespace npu::runtime::testing {

inline emu::LaunchConfig asyncConfig() {
  emu::LaunchConfig config;
  config.blocking = false;
  config.always_enqueue = true;
  config.inline_bytes = std::size_t(1) << 62;
  return config;
}

inline emu::LaunchConfig inlineConfig(std::size_t inline_bytes = std::size_t(1) << 62) {
  emu::LaunchConfig config;
  config.blocking = false;
  config.always_enqueue = false;
  config.inline_bytes = inline_bytes;
  return config;
}

inline emu::LaunchConfig blockingConfig() {
  emu::LaunchConfig config;
  config.blocking = true;
  config.always_enqueue = false;
  config.inline_bytes = std::size_t(1) << 62;
  return config;
}

}  // namespace npu::runtime::testing
