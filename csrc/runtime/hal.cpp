// The HAL's default bodies of optional methods: compiled into the runtime
// library and into every HAL library (hal_plugin.h), whose classes inherit
// them. The registry is registry.cpp.
#include "hal.h"

#include <cstdlib>
#include <memory>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

namespace npu::runtime {

// ---- optional methods -----------------------------------------------------------

namespace {
std::string implementationName(const std::type_info& type) {
#if defined(__GNUG__)
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   std::free);
  if (status == 0 && demangled) return demangled.get();
#endif
  return type.name();
}
}  // namespace

void throwUnsupported(const char* what, const std::type_info& implementation) {
  throw Unsupported(std::string(what) + " is not supported by this HAL (" + implementationName(implementation) + ")");
}

bool Stream::runIfIdle(const char* /*name*/, KernelRef /*kernel*/, std::size_t /*bytes*/) { return false; }

double Event::elapsedMs(Event& /*end*/) {
  throwUnsupported("elapsed time between events (Capabilities::timing_events)", typeid(*this));
}

std::string Event::ipcHandle() {
  throwUnsupported("interprocess events (Capabilities::interprocess)", typeid(*this));
}

std::string Device::exportMemory(const void* /*ptr*/, std::size_t* /*offset*/) {
  throwUnsupported("sharing device memory with another process (Capabilities::interprocess)", typeid(*this));
}

void* Device::openMemory(const std::string& /*handle*/) {
  throwUnsupported("opening device memory of another process (Capabilities::interprocess)", typeid(*this));
}

void Device::closeMemory(void* /*base*/) {
  throwUnsupported("closing device memory of another process (Capabilities::interprocess)", typeid(*this));
}

std::unique_ptr<Event> Device::createInterprocessEvent() {
  throwUnsupported("interprocess events (Capabilities::interprocess)", typeid(*this));
}

std::unique_ptr<Event> Device::openEvent(const std::string& /*handle*/) {
  throwUnsupported("opening an event of another process (Capabilities::interprocess)", typeid(*this));
}

std::size_t Device::virtualMemoryGranularity() const {
  throwUnsupported("virtual memory (Capabilities::virtual_memory)", typeid(*this));
}

void* Device::reserveAddress(std::size_t /*size*/) {
  throwUnsupported("reserving address space (Capabilities::virtual_memory)", typeid(*this));
}

bool Device::mapMemory(void* /*ptr*/, std::size_t /*size*/) {
  throwUnsupported("mapping memory into reserved address space (Capabilities::virtual_memory)", typeid(*this));
}

void Device::unmapMemory(void* /*ptr*/, std::size_t /*size*/) {
  throwUnsupported("unmapping memory from reserved address space (Capabilities::virtual_memory)", typeid(*this));
}

void Device::releaseAddress(void* /*base*/) {
  throwUnsupported("releasing reserved address space (Capabilities::virtual_memory)", typeid(*this));
}

OpSupport Device::supportsOp(const std::string& /*op*/, const std::vector<std::string>& /*dtypes*/) const {
  return OpSupport::Unknown;
}

Stream& Device::createStream(int /*priority*/) {
  throwUnsupported("creating streams besides the default stream (Capabilities::multiple_streams)", typeid(*this));
}

}  // namespace npu::runtime
