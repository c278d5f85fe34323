// Sharing npu storages between processes, as torch.multiprocessing shares CUDA
// storages (torch/csrc/CudaIPCTypes.cpp's contract, written afresh over the
// HAL's interprocess capability, docs/design/03-core.md, Processes).
//
// The producer sends the handle of the HAL allocation holding the storage, the
// storage's offset in it, an interprocess event recorded on its current stream
// (the consumer's stream waits for it before touching the memory) and a
// reference counter: one slot of a small shared file per send. The storage's
// DataPtr is wrapped on the first send; when the producer drops the storage,
// its block goes back to the caching allocator only once every slot was
// released (the consumer dropped its storage, or exited), else it waits in a
// limbo that ipc_collect() and every later send empty. So a shared block is
// never reused while a consumer holds it.
//
// The consumer maps the allocation (Device::openMemory), takes the slot (its
// pid) and wraps the memory in a storage that cannot be resized. When that
// storage dies, the release (slot back to 0, the mapping closed) happens after
// the work queued on the device's streams so far: at once on idle streams.
#pragma once

#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>
#include <string>

#include "../runtime/hal.h"

namespace npu::ipc {

struct SharedStorage {
  int device = 0;
  std::string handle;              // the HAL allocation's
  std::size_t storage_bytes = 0;
  std::size_t offset = 0;          // of the storage's data in the allocation
  std::string ref_counter_handle;  // the shared file of counter slots
  std::size_t ref_counter_slot = 0;
  std::string event_handle;        // recorded on the producer's current stream
  bool event_sync_required = true;
};

// Whether the device's HAL can share memory (Capabilities::interprocess).
bool supported(c10::DeviceIndex device);
// Producer: the handles of a storage of npu memory (raises, naming the HAL,
// when it cannot share; and for a storage received from another process).
SharedStorage shareStorage(const c10::Storage& storage);
// Consumer: a storage on the producer's memory; its release is counted.
c10::Storage openStorage(const SharedStorage& shared);
// Consumer: a slot for a storage it already has open (the producer counted a send).
void releaseCounter(const std::string& ref_counter_handle, std::size_t slot);
// Consumer: the current stream of `device` waits for the producer's event.
void waitEvent(c10::DeviceIndex device, const std::string& event_handle);
// Producer: frees the blocks of storages it dropped whose consumers all
// released them; returns how many sent blocks are still held by consumers.
std::size_t collect();
// torch.npu.Event(interprocess=True): a new interprocess event of `device`,
// and one opened from another process's handle (Event.from_ipc_handle).
std::shared_ptr<runtime::Event> newEvent(c10::DeviceIndex device);
std::shared_ptr<runtime::Event> openEvent(c10::DeviceIndex device, const std::string& handle);
// Producer: sent storages held (alive here, or in limbo) and blocks in limbo.
std::size_t limboCount();

}  // namespace npu::ipc
