// The HAL's default bodies of optional methods, and the registry of HAL
// implementations. No implementation is included here: builtin_hals.cpp
// registers the ones compiled into the runtime library.
#include "hal.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

namespace npu::runtime {

void registerBuiltinHals();  // builtin_hals.cpp

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

Stream& Device::createStream(int /*priority*/) {
  throwUnsupported("creating streams besides the default stream (Capabilities::multiple_streams)", typeid(*this));
}

// ---- the registry -----------------------------------------------------------------

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, HalFactory> factories;
};

// Never destroyed: registrations may run during static initialisation, and
// lookups during static destruction.
Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
}

// The built-in HALs join at the first lookup (not at registerHal(), which they
// call themselves). std::call_once retries after an exception, so a clash with
// a vendor's name is reported by every lookup.
void ensureBuiltins() {
  static std::once_flag once;
  std::call_once(once, registerBuiltinHals);
}

std::string namesLocked(const Registry& r) {
  std::string out;
  for (const auto& [name, factory] : r.factories) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "(none)" : out;
}

bool validName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::mutex g_hal_mutex;
// Never destroyed: stream workers may outlive static destruction at exit.
std::atomic<Hal*> g_hal{nullptr};

}  // namespace

void registerHal(const std::string& name, int api_version, HalFactory factory) {
  if (!validName(name)) {
    throw std::invalid_argument("a HAL's name is letters, digits and '_'; got '" + name + "'");
  }
  if (api_version != kHalApiVersion) {
    throw std::invalid_argument("HAL '" + name + "' was written against HAL API version " +
                                std::to_string(api_version) + ", but this torch_npu runtime implements version " +
                                std::to_string(kHalApiVersion) +
                                " (kHalApiVersion, csrc/runtime/hal.h): update it to that contract and rebuild it");
  }
  if (!factory) throw std::invalid_argument("HAL '" + name + "' was registered without a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, std::move(factory)).second) {
    throw std::invalid_argument("a HAL named '" + name + "' is already registered");
  }
}

std::vector<std::string> registeredHals() {
  ensureBuiltins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.factories) names.push_back(entry.first);
  return names;
}

namespace {
// The factory for `name`, or null; `registered` gets the list for a message.
HalFactory findFactory(const std::string& name, std::string* registered) {
  ensureBuiltins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(name);
  if (it == r.factories.end()) {
    *registered = namesLocked(r);
    return nullptr;
  }
  return it->second;  // a copy: the factory runs without the lock
}

std::unique_ptr<Hal> build(const std::string& name, const HalFactory& factory) {
  auto made = factory();
  if (!made) throw std::logic_error("the factory of HAL '" + name + "' returned no HAL");
  return made;
}
}  // namespace

std::unique_ptr<Hal> createHal(const std::string& name) {
  std::string registered;
  HalFactory factory = findFactory(name, &registered);
  if (!factory) throw std::invalid_argument("no HAL named '" + name + "' is registered; registered: " + registered);
  return build(name, factory);
}

std::unique_ptr<Hal> createHalFromEnvironment() {
  const char* value = std::getenv("NPU_HAL");
  const std::string name = value != nullptr && *value != '\0' ? value : kDefaultHal;
  std::string registered;
  HalFactory factory = findFactory(name, &registered);
  if (!factory) {
    throw std::invalid_argument(value != nullptr && *value != '\0'
                                    ? "NPU_HAL='" + name + "' is not a registered HAL; registered: " + registered
                                    : "the default HAL '" + name + "' is not registered (set NPU_HAL); registered: " +
                                          registered);
  }
  return build(name, factory);
}

Hal& hal() {
  if (Hal* h = g_hal.load(std::memory_order_acquire)) return *h;
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() == nullptr) g_hal.store(createHalFromEnvironment().release(), std::memory_order_release);
  return *g_hal.load();
}

void setHal(std::unique_ptr<Hal> replacement) {
  if (!replacement) throw std::invalid_argument("setHal() needs a HAL");
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() != nullptr) {
    throw std::logic_error("setHal() must be called before the npu runtime is first used");
  }
  g_hal.store(replacement.release(), std::memory_order_release);
}

}  // namespace npu::runtime
