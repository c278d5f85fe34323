// The HALs this test binary adds to the registry, so that the conformance
// suite runs on them as well as on the built-in emulator ("emu"):
//   "minimal"     the suite's own second implementation (minimal_hal.h),
//   "minimal_basic" the same without the optional capabilities (one stream per
//                 device, events that cannot time): the suite's skips run,
//   "emu_queued"  the emulator with every kernel queued to its stream's worker
//                 (NPU_EMU_ALWAYS_ENQUEUE=1), so the suite covers both of its
//                 launch policies,
//   "emu_protected" the emulator whose memory the host cannot touch outside
//                 device work (NPU_EMU_PROTECT=1): a host access faults,
//   "minimal_plugin" the minimal HAL loaded from its shared library
//                 (minimal_hal_plugin.cpp, hal_plugin.h): the contract, its
//                 profiling duty included, holds across the library boundary.
// A registrar object: this file is linked into the executable itself, so it
// runs (the same object inside a static library would be dropped).
#include <cstdlib>
#include <memory>

#include "conformance.h"
#include "emu/config.h"
#include "emu/device.h"
#include "minimal_hal.h"

namespace npu::runtime::testing {

namespace {
const bool kRegistered = [] {
  // The emulator's conformance runs get two devices of 64 MiB unless the
  // environment says otherwise (the multi-device tests need two).
  ::setenv("NPU_EMU_DEVICES", "2", /*overwrite=*/0);
  ::setenv("NPU_EMU_MEMORY", "64MiB", /*overwrite=*/0);
  registerHal("minimal", kHalApiVersion, [] { return minimal::makeMinimalHal(); });
  registerHal("minimal_basic", kHalApiVersion, [] { return minimal::makeMinimalHal(2, std::size_t(32) << 20, false); });
  auto emulator = [](auto adjust) {
    return [adjust] {
      emu::LaunchConfig config = emu::LaunchConfig::fromEnvironment();
      adjust(config);
      return std::make_unique<emu::EmuHal>(static_cast<int>(emu::envInt("NPU_EMU_DEVICES", 1, 0, 64)),
                                           emu::envBytes("NPU_EMU_MEMORY", std::size_t(4) << 30), config);
    };
  };
  registerHal("emu_queued", kHalApiVersion, emulator([](emu::LaunchConfig& c) { c.always_enqueue = true; }));
  registerHal("emu_protected", kHalApiVersion, emulator([](emu::LaunchConfig& c) { c.protect = true; }));
  loadHalLibrary(NPU_HAL_MINIMAL_PLUGIN);
  return true;
}();
}  // namespace

std::vector<std::string> conformanceTargets() { return registeredHals(); }

}  // namespace npu::runtime::testing
