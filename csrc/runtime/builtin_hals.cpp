// The HALs compiled into the runtime library. The registry calls
// registerBuiltinHals() itself, once, before its first lookup (hal.cpp): an
// explicit call from a known place, because the linker drops the object files
// of a static library that nothing references, so a registrar object inside
// them would never run. A vendor whose HAL is built into this library adds its
// registration here.
#include "../emu/device.h"

namespace npu::runtime {

void registerBuiltinHals() { emu::registerEmulator(); }

}  // namespace npu::runtime
