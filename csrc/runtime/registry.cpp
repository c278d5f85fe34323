// The registry of HAL implementations, the process-wide HAL and the loader of
// HAL libraries (hal_plugin.h). No implementation is included here:
// builtin_hals.cpp registers the ones compiled into the runtime library.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "hal.h"
#include "hal_plugin.h"

namespace npu::runtime {

void registerBuiltinHals();  // builtin_hals.cpp

namespace {

struct Registration {
  int api_version = 0;
  HalFactory factory;
};

struct Registry {
  std::mutex mutex;
  // Held across a whole library load (dlopen, its entry point, registration), so that
  // two threads loading one path get one registration and the same name.
  std::mutex loading;
  std::map<std::string, Registration> factories;
  std::map<std::string, std::string> libraries;  // a loaded library's path -> the name it registered
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
  for (const auto& entry : r.factories) out += (out.empty() ? "" : ", ") + entry.first;
  return out.empty() ? "(none)" : out;
}

bool validName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string versionProblem(const std::string& name, int api_version) {
  if (api_version >= kMinimumHalApiVersion && api_version <= kHalApiVersion) return {};
  const std::string remedy =
      api_version > kHalApiVersion
          ? "rebuild it against this runtime's csrc/runtime/hal.h, or use a torch_npu whose runtime implements "
            "version " + std::to_string(api_version)
          : "update it to the contract of csrc/runtime/hal.h (kHalApiVersion) and rebuild it";
  return "HAL '" + name + "' was written against HAL API version " + std::to_string(api_version) +
         ", but this torch_npu runtime implements version " + std::to_string(kHalApiVersion) +
         " and accepts versions " + std::to_string(kMinimumHalApiVersion) + " to " + std::to_string(kHalApiVersion) +
         ": " + remedy;
}

std::mutex g_hal_mutex;
// Never destroyed: stream workers may outlive static destruction at exit.
std::atomic<Hal*> g_hal{nullptr};
std::atomic<int> g_hal_version{0};

}  // namespace

void registerHal(const std::string& name, int api_version, HalFactory factory) {
  if (!validName(name)) {
    throw std::invalid_argument("a HAL's name is letters, digits and '_'; got '" + name + "'");
  }
  if (auto problem = versionProblem(name, api_version); !problem.empty()) throw std::invalid_argument(problem);
  if (!factory) throw std::invalid_argument("HAL '" + name + "' was registered without a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, Registration{api_version, std::move(factory)}).second) {
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

int registeredApiVersion(const std::string& name) {
  ensureBuiltins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(name);
  return it == r.factories.end() ? 0 : it->second.api_version;
}

// ---- HAL libraries ------------------------------------------------------------------

std::string loadHalLibrary(const std::string& path) {
  ensureBuiltins();
  Registry& r = registry();
  std::lock_guard<std::mutex> loading(r.loading);
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (auto it = r.libraries.find(path); it != r.libraries.end()) return it->second;
  }
  // RTLD_LOCAL: the library's symbols stay its own; it reaches the runtime only
  // through the table its entry point receives.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw std::invalid_argument("cannot load the HAL library '" + path + "': " + (why ? why : "dlopen failed"));
  }
  auto entry = reinterpret_cast<NpuHalPluginEntry>(::dlsym(handle, NPU_HAL_PLUGIN_ENTRY_NAME));
  if (entry == nullptr) {
    ::dlclose(handle);
    throw std::invalid_argument("'" + path + "' is not a HAL library: it exports no " NPU_HAL_PLUGIN_ENTRY_NAME
                                "() (define it with NPU_HAL_PLUGIN, csrc/runtime/hal_plugin.h)");
  }
  const NpuHalHost host{kHalApiVersion, &tracing::hostServices()};
  NpuHalPlugin plugin{};
  if (entry(&host, &plugin) != 0 || plugin.name == nullptr || plugin.create == nullptr) {
    ::dlclose(handle);
    throw std::invalid_argument("the HAL library '" + path + "' refused this runtime (HAL API version " +
                                std::to_string(kHalApiVersion) + ") or described no HAL");
  }
  const std::string name = plugin.name;
  auto create = plugin.create;
  try {
    registerHal(name, plugin.api_version, [create, name]() {
      std::unique_ptr<Hal> made(static_cast<Hal*>(create()));
      if (!made) throw std::logic_error("the HAL library of '" + name + "' made no HAL");
      return made;
    });
  } catch (const std::invalid_argument& e) {
    ::dlclose(handle);
    throw std::invalid_argument("the HAL library '" + path + "': " + e.what());
  }
  // The library stays loaded for the process's life: its HALs are never destroyed.
  std::lock_guard<std::mutex> lock(r.mutex);
  r.libraries.emplace(path, name);
  return name;
}

namespace {

bool looksLikePath(const std::string& value) {
  return value.find('/') != std::string::npos ||
         (value.size() > 3 && value.compare(value.size() - 3, 3, ".so") == 0);
}

// The registered name for NPU_HAL's `value`: a registered name, a library's
// path, or libnpu_hal_<value>.so on the library search path; empty, with
// `problem` saying why, when none.
std::string resolveName(const std::string& value, std::string* problem) {
  if (looksLikePath(value)) {
    try {
      return loadHalLibrary(value);
    } catch (const std::invalid_argument& e) {
      *problem = e.what();
      return {};
    }
  }
  if (registeredApiVersion(value) != 0) return value;
  if (!validName(value)) return {};
  try {
    const std::string name = loadHalLibrary("libnpu_hal_" + value + ".so");
    if (name != value) {
      *problem = "libnpu_hal_" + value + ".so registers a HAL named '" + name + "', not '" + value + "'";
      return {};
    }
    return name;
  } catch (const std::invalid_argument& e) {
    *problem = e.what();
    return {};
  }
}

Registration findRegistration(const std::string& name, std::string* registered) {
  ensureBuiltins();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(name);
  if (it == r.factories.end()) {
    *registered = namesLocked(r);
    return {};
  }
  return it->second;  // a copy: the factory runs without the lock
}

std::unique_ptr<Hal> build(const std::string& name, const HalFactory& factory) {
  auto made = factory();
  if (!made) throw std::logic_error("the factory of HAL '" + name + "' returned no HAL");
  return made;
}

std::unique_ptr<Hal> createFromEnvironment(int* api_version) {
  const char* value = std::getenv("NPU_HAL");
  const bool given = value != nullptr && *value != '\0';
  const std::string wanted = given ? value : kDefaultHal;
  std::string problem;
  const std::string name = given ? resolveName(wanted, &problem) : wanted;
  std::string registered;
  Registration found = findRegistration(name.empty() ? wanted : name, &registered);
  if (!found.factory) {
    throw std::invalid_argument(
        given ? "NPU_HAL='" + wanted + "' is not a registered HAL; registered: " + registered +
                    (problem.empty() ? "" : "; nor a HAL library: " + problem)
              : "the default HAL '" + wanted + "' is not registered (set NPU_HAL); registered: " + registered);
  }
  *api_version = found.api_version;
  return build(name, found.factory);
}

}  // namespace

std::unique_ptr<Hal> createHal(const std::string& name) {
  std::string registered;
  Registration found = findRegistration(name, &registered);
  if (!found.factory) throw std::invalid_argument("no HAL named '" + name + "' is registered; registered: " + registered);
  return build(name, found.factory);
}

std::unique_ptr<Hal> createHalFromEnvironment() {
  int api_version = 0;
  return createFromEnvironment(&api_version);
}

Hal& hal() {
  if (Hal* h = g_hal.load(std::memory_order_acquire)) return *h;
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() == nullptr) {
    int api_version = 0;
    Hal* made = createFromEnvironment(&api_version).release();
    g_hal_version.store(api_version);
    g_hal.store(made, std::memory_order_release);
  }
  return *g_hal.load();
}

int halApiVersion() {
  hal();
  return g_hal_version.load();
}

void setHal(std::unique_ptr<Hal> replacement, int api_version) {
  if (!replacement) throw std::invalid_argument("setHal() needs a HAL");
  if (auto problem = versionProblem(replacement->name(), api_version); !problem.empty()) {
    throw std::invalid_argument(problem);
  }
  std::lock_guard<std::mutex> lock(g_hal_mutex);
  if (g_hal.load() != nullptr) {
    throw std::logic_error("setHal() must be called before the npu runtime is first used");
  }
  g_hal_version.store(api_version);
  g_hal.store(replacement.release(), std::memory_order_release);
}

OpSupport askSupportsOp(const Device& device, const std::string& op, const std::vector<std::string>& dtypes) {
  if (halApiVersion() < 5 || !device.capabilities().op_queries) return OpSupport::Unknown;
  return device.supportsOp(op, dtypes);
}

}  // namespace npu::runtime
