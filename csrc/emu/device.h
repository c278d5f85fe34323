// The emulated NPU: devices whose memory is a capacity-limited slice of host
// memory, with streams and events from stream.h.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "../runtime/hal.h"
#include "ipc.h"
#include "protection.h"
#include "stream.h"
#include "virtual_memory.h"

namespace npu::runtime::emu {

class EmuDevice final : public Device {
 public:
  EmuDevice(int index, std::size_t capacity, const LaunchConfig& config);
  int index() const override { return index_; }
  const DeviceProperties& properties() const override { return properties_; }

  void* allocate(std::size_t n) override;
  void free(void* ptr) override;
  bool owns(const void* ptr) const override;
  void memoryInfo(std::size_t* free, std::size_t* total) const override;
  // Capabilities::interprocess (ipc.h), except under NPU_EMU_PROTECT.
  std::string exportMemory(const void* ptr, std::size_t* offset) override;
  void* openMemory(const std::string& handle) override;
  void closeMemory(void* base) override;
  std::unique_ptr<Event> createInterprocessEvent() override;
  std::unique_ptr<Event> openEvent(const std::string& handle) override;
  // Capabilities::virtual_memory (virtual_memory.h), except under NPU_EMU_PROTECT.
  // Committed pages count against the capacity; they cannot be exported.
  std::size_t virtualMemoryGranularity() const override;
  void* reserveAddress(std::size_t size) override;
  bool mapMemory(void* ptr, std::size_t size) override;
  void unmapMemory(void* ptr, std::size_t size) override;
  void releaseAddress(void* base) override;
  // Host-addressable: the emulated device's memory is host memory. Priorities
  // are kept but do not schedule.
  Capabilities capabilities() const override;

  Stream& defaultStream() override;
  Stream& createStream(int priority) override;
  Stream& stream(int64_t id) override;
  std::unique_ptr<Event> createEvent(bool timing) override;
  void synchronize() override;
  void drain() override;

 private:
  std::vector<EmuStream*> allStreams() const;
  const int index_;
  const LaunchConfig config_;
  DeviceProperties properties_;

  mutable std::mutex memory_mutex_;
  std::map<const char*, std::size_t> allocations_;  // base -> size, ordered for owns()
  std::size_t used_ = 0;
  std::unique_ptr<ProtectedArena> arena_;  // NPU_EMU_PROTECT: the memory, closed to the host
  std::unique_ptr<SharedArena> shared_;    // otherwise: the memory, shareable with other processes
  AddressReservations reservations_;      // virtual memory, under memory_mutex_
  void checkInterprocess(const char* what) const;
  void checkVirtualMemory(const char* what) const;

  mutable std::mutex streams_mutex_;
  std::vector<std::unique_ptr<EmuStream>> streams_;  // index == stream id
  EmuStream* default_stream_ = nullptr;  // streams_[0], readable without streams_mutex_
};

class EmuHal final : public Hal {
 public:
  EmuHal();  // NPU_EMU_DEVICES, NPU_EMU_MEMORY, launch settings from the environment
  EmuHal(int devices, std::size_t capacity, const LaunchConfig& config);
  std::string name() const override { return "emulated"; }
  int deviceCount() const override { return static_cast<int>(devices_.size()); }
  Device& device(int index) override;
  void* hostAllocate(std::size_t n) override;
  void hostFree(void* ptr) override;

 private:
  std::vector<std::unique_ptr<EmuDevice>> devices_;
};

// Registers the emulator as "emu" (the default, kDefaultHal): EmuHal() from the environment.
// Called by registerBuiltinHals() (builtin_hals.cpp).
void registerEmulator();

}  // namespace npu::runtime::emu
