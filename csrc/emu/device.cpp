#include "device.h"

#include <cstdlib>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "config.h"

namespace npu::runtime::emu {

namespace {
constexpr std::size_t kAlignment = 64;  // a cache line; what vectorised kernels want
constexpr std::size_t kPage = 4096;
constexpr std::size_t kDefaultCapacity = std::size_t(4) << 30;

std::size_t roundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
}  // namespace

EmuDevice::EmuDevice(int index, std::size_t capacity, const LaunchConfig& config)
    : index_(index), config_(config) {
  properties_.name = "Emulated NPU";
  properties_.total_memory = capacity;
  properties_.compute_units = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (config_.protect) {
    arena_ = std::make_unique<ProtectedArena>(capacity);
  } else {
    shared_ = std::make_unique<SharedArena>(index, capacity);
  }
  streams_.push_back(std::make_unique<EmuStream>(index, 0, 0, config_));
  default_stream_ = streams_.front().get();
}

void* EmuDevice::allocate(std::size_t n) {
  // Past the capacity anyway; also keeps roundUp from wrapping to 0 near SIZE_MAX.
  if (n > properties_.total_memory || n > std::numeric_limits<std::size_t>::max() - kAlignment) return nullptr;
  // Protected memory is handed out (and opened, closed, released) in whole pages.
  const std::size_t size = roundUp(std::max<std::size_t>(n, 1), arena_ ? kPage : kAlignment);
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    if (size > properties_.total_memory - used_) return nullptr;
    used_ += size;
  }
  void* ptr = arena_ ? arena_->allocate(size) : shared_->allocate(size);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  if (ptr == nullptr) {
    used_ -= size;
    return nullptr;
  }
  allocations_.emplace(static_cast<const char*>(ptr), size);
  return ptr;
}

void EmuDevice::free(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto it = allocations_.find(static_cast<const char*>(ptr));
    if (it == allocations_.end()) {
      throw std::invalid_argument("npu:" + std::to_string(index_) +
                                  ": free of a pointer this device did not allocate");
    }
    used_ -= it->second;
    if (arena_) arena_->free(ptr, it->second);
    else shared_->free(ptr, it->second);
    allocations_.erase(it);
  }
}

bool EmuDevice::owns(const void* ptr) const {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin() && p < std::prev(it)->first + std::prev(it)->second) return true;
  return reservations_.committed(p);
}

Capabilities EmuDevice::capabilities() const {
  Capabilities caps;
  caps.host_addressable = !config_.protect;  // NPU_EMU_PROTECT: as a discrete device
  caps.host_kernels = true;                  // its memory opens to its own kernels, protected or not
  caps.async_streams = !config_.blocking;  // NPU_LAUNCH_BLOCKING completes every launch before it returns
  caps.multiple_streams = true;
  caps.timing_events = true;
  caps.stream_priorities = false;
  caps.interprocess = !config_.protect;  // protected memory is closed to the host, so to other processes too
  // Reservations live apart from the protected arena, whose gate would not cover them.
  caps.virtual_memory = !config_.protect;
  return caps;
}

void EmuDevice::checkInterprocess(const char* what) const {
  if (config_.protect) {
    throw Unsupported(std::string(what) + " is not supported by this HAL (the npu emulator with NPU_EMU_PROTECT=1, "
                      "whose memory is closed to the host and to other processes)");
  }
}

std::string EmuDevice::exportMemory(const void* ptr, std::size_t* offset) {
  checkInterprocess("sharing device memory with another process (Capabilities::interprocess)");
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    if (p < it->first + it->second) {
      if (offset != nullptr) *offset = static_cast<std::size_t>(p - it->first);
      return shared_->handle(it->first, it->second);
    }
  }
  if (reservations_.reserved(p)) {
    throw std::invalid_argument("npu:" + std::to_string(index_) + ": exportMemory: the memory is in an expandable "
                                "segment (reserved address space, Device::mapMemory), which the npu emulator cannot "
                                "share with another process; set expandable_segments:False in PYTORCH_NPU_ALLOC_CONF "
                                "in the sending process, or send a tensor allocated without it");
  }
  throw std::invalid_argument("npu:" + std::to_string(index_) +
                              ": exportMemory of a pointer outside this device's allocations");
}

void* EmuDevice::openMemory(const std::string& handle) {
  checkInterprocess("opening device memory of another process (Capabilities::interprocess)");
  return openSharedMemory(handle);
}

void EmuDevice::closeMemory(void* base) {
  checkInterprocess("closing device memory of another process (Capabilities::interprocess)");
  closeSharedMemory(base);
}

void EmuDevice::checkVirtualMemory(const char* what) const {
  if (config_.protect) {
    throw Unsupported(std::string(what) + " is not supported by this HAL (the npu emulator with NPU_EMU_PROTECT=1, "
                      "whose memory is one protected arena)");
  }
}

std::size_t EmuDevice::virtualMemoryGranularity() const {
  checkVirtualMemory("virtual memory (Capabilities::virtual_memory)");
  return AddressReservations::kPage;
}

void* EmuDevice::reserveAddress(std::size_t size) {
  checkVirtualMemory("reserving address space (Capabilities::virtual_memory)");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return reservations_.reserve(size);
}

bool EmuDevice::mapMemory(void* ptr, std::size_t size) {
  checkVirtualMemory("mapping memory into reserved address space (Capabilities::virtual_memory)");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  reservations_.check(ptr, size, false, "mapMemory", index_);
  if (size > properties_.total_memory - used_) return false;
  reservations_.commit(ptr, size);
  used_ += size;
  return true;
}

void EmuDevice::unmapMemory(void* ptr, std::size_t size) {
  checkVirtualMemory("unmapping memory from reserved address space (Capabilities::virtual_memory)");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  reservations_.check(ptr, size, true, "unmapMemory", index_);
  reservations_.decommit(ptr, size);
  used_ -= size;
}

void EmuDevice::releaseAddress(void* base) {
  checkVirtualMemory("releasing reserved address space (Capabilities::virtual_memory)");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  used_ -= reservations_.release(base, index_);
}

std::unique_ptr<Event> EmuDevice::createInterprocessEvent() {
  checkInterprocess("interprocess events (Capabilities::interprocess)");
  return std::make_unique<EmuEvent>(index_, false, newEventCell());
}

std::unique_ptr<Event> EmuDevice::openEvent(const std::string& handle) {
  checkInterprocess("opening an event of another process (Capabilities::interprocess)");
  return std::make_unique<EmuEvent>(index_, false, openEventCell(handle));
}

void EmuDevice::memoryInfo(std::size_t* free, std::size_t* total) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  *free = properties_.total_memory - used_;
  *total = properties_.total_memory;
}

// Not streams_[0]: createStream() may be reallocating streams_ on another thread.
Stream& EmuDevice::defaultStream() { return *default_stream_; }

Stream& EmuDevice::createStream(int priority) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  const auto id = static_cast<int64_t>(streams_.size());
  streams_.push_back(std::make_unique<EmuStream>(index_, id, priority, config_));
  return *streams_.back();
}

Stream& EmuDevice::stream(int64_t id) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  if (id < 0 || id >= static_cast<int64_t>(streams_.size())) {
    throw std::out_of_range("npu:" + std::to_string(index_) + " has no stream " + std::to_string(id));
  }
  return *streams_[static_cast<std::size_t>(id)];
}

std::unique_ptr<Event> EmuDevice::createEvent(bool timing) {
  return std::make_unique<EmuEvent>(index_, timing);
}

std::vector<EmuStream*> EmuDevice::allStreams() const {
  std::vector<EmuStream*> streams;
  std::lock_guard<std::mutex> lock(streams_mutex_);
  for (auto& s : streams_) streams.push_back(s.get());
  return streams;
}

void EmuDevice::drain() {
  for (auto* s : allStreams()) s->drain();
}

void EmuDevice::synchronize() {
  const auto streams = allStreams();
  // Wait for all of them before raising the first error, so none is left running.
  std::exception_ptr first_error;
  for (auto* s : streams) {
    try {
      s->synchronize();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

EmuHal::EmuHal()
    : EmuHal(static_cast<int>(envInt("NPU_EMU_DEVICES", 1, 0, 64)),
             envBytes("NPU_EMU_MEMORY", kDefaultCapacity), LaunchConfig::fromEnvironment()) {}

EmuHal::EmuHal(int devices, std::size_t capacity, const LaunchConfig& config) {
  if (devices < 0 || devices > 64) {
    throw std::invalid_argument("NPU_EMU_DEVICES=" + std::to_string(devices) +
                                " is out of range; use 0 to 64");
  }
  for (int i = 0; i < devices; ++i) {
    devices_.push_back(std::make_unique<EmuDevice>(i, capacity, config));
  }
}

Device& EmuHal::device(int index) {
  if (index < 0 || index >= deviceCount()) {
    throw std::out_of_range("npu:" + std::to_string(index) + " does not exist; there are " +
                            std::to_string(deviceCount()) + " npu device(s) (NPU_EMU_DEVICES)");
  }
  return *devices_[static_cast<std::size_t>(index)];
}

void* EmuHal::hostAllocate(std::size_t n) {
  if (n > std::numeric_limits<std::size_t>::max() - kAlignment) return nullptr;  // roundUp would wrap
  return std::aligned_alloc(kAlignment, roundUp(std::max<std::size_t>(n, 1), kAlignment));
}

void EmuHal::hostFree(void* ptr) { std::free(ptr); }

void registerEmulator() {
  registerHal("emu", kHalApiVersion, [] { return std::make_unique<EmuHal>(); });
}

}  // namespace npu::runtime::emu
