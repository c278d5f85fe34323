#include "ipc.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "allocator.h"
#include "device.h"
#include "stream.h"

namespace npu::ipc {

namespace {

// ---- reference counter files ----
//
// One slot (an int64 in a shared file) per send: the producer sets it to
// kInFlight, the consumer to its pid when it opens the storage and to 0 when it
// releases it. One writer at a time, so plain atomic stores suffice; a slot of
// a consumer that exited counts as released.

constexpr std::size_t kSlots = 4096;
constexpr int64_t kInFlight = -1;

struct CounterWire {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t dev;
  uint64_t ino;
};
constexpr char kCounterMagic[8] = {'n', 'p', 'u', 'r', 'e', 'f', '1', '\0'};

struct CounterFile {
  int fd = -1;
  uint64_t dev = 0, ino = 0;
  std::atomic<int64_t>* slots = nullptr;
  std::vector<std::size_t> free;  // producer: slots to hand out
  std::string handle;
};

bool processGone(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  // An exited child not yet waited for is a zombie: gone too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && (text[close + 2] == 'Z' || text[close + 2] == 'X');
}

bool slotReleased(std::atomic<int64_t>& slot) {
  const int64_t value = slot.load(std::memory_order_acquire);
  return value == 0 || (value > 0 && processGone(value));
}

std::atomic<int64_t>* mapSlots(int fd, const char* what) {
  void* p = mmap(nullptr, kSlots * sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TORCH_CHECK(p != MAP_FAILED, "npu ipc: could not map ", what, ": ", std::strerror(errno));
  return static_cast<std::atomic<int64_t>*>(p);
}

struct Slot {
  CounterFile* file = nullptr;
  std::size_t index = 0;
  std::atomic<int64_t>& value() const { return file->slots[index]; }
};

// ---- the producer's sent storages ----

struct SentData {
  c10::DataPtr original;  // the caching allocator's block
  int device = 0;
  struct Send {
    Slot slot;
    std::unique_ptr<runtime::Event> event;  // lives until the consumer released (CUDA keeps it as long)
  };
  std::vector<Send> sends;
};

void deleteSent(void* ctx);

struct Producer {
  std::mutex mutex;
  std::vector<std::unique_ptr<CounterFile>> files;  // never closed: handles name them
  std::vector<SentData*> limbo;                     // dropped by the producer, still held by a consumer
  std::size_t alive = 0;                            // SentData not deleted
};

Producer& producer() {
  static auto* instance = new Producer();  // never destroyed: deleters run at exit
  return *instance;
}

// Under the producer's mutex.
Slot takeSlot(Producer& p) {
  for (auto& f : p.files) {
    if (!f->free.empty()) {
      Slot s{f.get(), f->free.back()};
      f->free.pop_back();
      return s;
    }
  }
  auto file = std::make_unique<CounterFile>();
  file->fd = memfd_create("npu-ipc-refcounts", MFD_CLOEXEC);
  TORCH_CHECK(file->fd >= 0, "npu ipc: memfd_create failed: ", std::strerror(errno));
  struct stat st {};
  TORCH_CHECK(ftruncate(file->fd, kSlots * sizeof(int64_t)) == 0 && fstat(file->fd, &st) == 0,
              "npu ipc: could not size the reference counter file: ", std::strerror(errno));
  file->dev = static_cast<uint64_t>(st.st_dev);
  file->ino = static_cast<uint64_t>(st.st_ino);
  file->slots = mapSlots(file->fd, "the reference counter file");
  for (std::size_t i = kSlots; i-- > 1;) file->free.push_back(i);
  CounterWire w{};
  std::memcpy(w.magic, kCounterMagic, sizeof kCounterMagic);
  w.pid = static_cast<int32_t>(getpid());
  w.fd = file->fd;
  w.dev = file->dev;
  w.ino = file->ino;
  file->handle.assign(reinterpret_cast<const char*>(&w), sizeof w);
  p.files.push_back(std::move(file));
  return Slot{p.files.back().get(), 0};
}

// Under the producer's mutex: drops the sends whose consumer released them;
// true when none is left.
bool pruneSends(Producer& p, SentData* sent) {
  auto& sends = sent->sends;
  for (auto it = sends.begin(); it != sends.end();) {
    if (slotReleased(it->slot.value())) {
      it->slot.value().store(0, std::memory_order_release);
      it->slot.file->free.push_back(it->slot.index);
      it = sends.erase(it);
    } else {
      ++it;
    }
  }
  (void)p;
  return sends.empty();
}

// Under the producer's mutex: takes out of the limbo what no consumer holds any
// more, into `freed` (deleted by the caller, outside the mutex).
void collectLimbo(Producer& p, std::vector<SentData*>* freed) {
  for (auto it = p.limbo.begin(); it != p.limbo.end();) {
    if (pruneSends(p, *it)) {
      freed->push_back(*it);
      --p.alive;
      it = p.limbo.erase(it);
    } else {
      ++it;
    }
  }
}

void deleteSent(void* ctx) {
  auto* sent = static_cast<SentData*>(ctx);
  auto& p = producer();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (!pruneSends(p, sent)) {
      p.limbo.push_back(sent);  // a consumer still uses it: not back to the allocator yet
      return;
    }
    --p.alive;
  }
  delete sent;  // frees the block (the allocator's own lock), outside ours
}

// ---- the consumer's opened storages ----

struct Consumer {
  std::mutex mutex;
  std::map<std::pair<uint64_t, uint64_t>, std::atomic<int64_t>*> files;  // (dev, ino) -> mapped slots
};

Consumer& consumer() {
  static auto* instance = new Consumer();
  return *instance;
}

std::atomic<int64_t>& openSlot(const std::string& handle, std::size_t slot) {
  CounterWire w{};
  TORCH_CHECK(handle.size() == sizeof w, "npu ipc: not a reference counter handle");
  std::memcpy(&w, handle.data(), sizeof w);
  TORCH_CHECK(std::memcmp(w.magic, kCounterMagic, sizeof kCounterMagic) == 0 && slot < kSlots,
              "npu ipc: not a reference counter handle");
  auto& c = consumer();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.files.find({w.dev, w.ino});
  if (it == c.files.end()) {
    const std::string path = "/proc/" + std::to_string(w.pid) + "/fd/" + std::to_string(w.fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    TORCH_CHECK(fd >= 0, "npu ipc: cannot open the reference counters of process ", w.pid, " (", path, ": ",
                std::strerror(errno), "): the producer exited before this process received its tensor");
    struct stat st {};
    const bool same = fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == w.ino &&
                      static_cast<uint64_t>(st.st_dev) == w.dev;
    if (!same) close(fd);
    TORCH_CHECK(same, "npu ipc: stale reference counter handle of process ", w.pid);
    std::atomic<int64_t>* slots = nullptr;
    try {
      slots = mapSlots(fd, "another process's reference counters");
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    it = c.files.emplace(std::make_pair(w.dev, w.ino), slots).first;
  }
  return it->second[slot];
}

struct ReceivedData {
  int device = 0;
  void* base = nullptr;  // what openMemory returned
  std::atomic<int64_t>* slot = nullptr;
};

void finishRelease(ReceivedData* r) {
  try {
    runtimeDevice(static_cast<c10::DeviceIndex>(r->device)).closeMemory(r->base);
  } catch (...) {  // a deleter must not throw; the mapping then lives until exit
  }
  r->slot->store(0, std::memory_order_release);
  delete r;
}

void deleteReceived(void* ctx) {
  auto* r = static_cast<ReceivedData*>(ctx);
  // Released after the work queued on the device's streams so far (kernels
  // capture device memory, not the storage): at once when they are idle.
  std::vector<runtime::Stream*> busy;
  try {
    auto& device = runtime::hal().device(r->device);
    for (int64_t id = 0;; ++id) {
      runtime::Stream* s = nullptr;
      try {
        s = &device.stream(id);
      } catch (const std::out_of_range&) {
        break;
      }
      if (!s->query()) busy.push_back(s);
    }
  } catch (...) {
    busy.clear();
  }
  if (busy.empty()) {
    finishRelease(r);
    return;
  }
  auto pending = std::make_shared<std::atomic<std::size_t>>(busy.size());
  for (auto* s : busy) {
    s->launch("ipc_release", [r, pending] {
      if (pending->fetch_sub(1) == 1) finishRelease(r);
    });
  }
}

runtime::Device& checkedDevice(c10::DeviceIndex device, const char* what) {
  checkDevice(device);
  auto& d = runtimeDevice(device);
  TORCH_CHECK(d.capabilities().interprocess, what, ": npu:", static_cast<int>(device),
              " cannot share its memory with another process: interprocess memory (Capabilities::interprocess) is "
              "not supported by HAL '", runtime::hal().name(), "'", hostAddressable(device) ? "" : " (NPU_EMU_PROTECT=1 closes the emulator's memory to other processes)",
              ". Send tensor.cpu() and move it to the npu in the receiving process.");
  return d;
}

}  // namespace

bool supported(c10::DeviceIndex device) {
  checkDevice(device);
  return runtimeDevice(device).capabilities().interprocess;
}

SharedStorage shareStorage(const c10::Storage& storage) {
  const auto device = storage.device().index();
  auto& d = checkedDevice(device, "sending an npu tensor to another process");
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const c10::DataPtr& current = impl->data_ptr();
  TORCH_CHECK(current.get_deleter() != &deleteReceived,
              "sending an npu tensor to another process: this tensor's memory was received from another process and "
              "cannot be sent on; send it from the process that made it, or send a .clone()");
  TORCH_CHECK(!allocator::fromPluggableAllocator(current.get()),
              "sending an npu tensor to another process: this tensor's memory came from a pluggable allocator "
              "(torch.npu.memory.NPUPluggableAllocator, through change_current_allocator or a MemPool), whose memory "
              "the npu cannot share with another process; send tensor.cpu() and move it to the npu in the receiving "
              "process");
  SharedStorage out;
  out.device = device;
  out.storage_bytes = impl->nbytes();
  void* data = current.get();
  out.handle = translateRuntimeErrors("sending an npu tensor to another process",
                                      [&] { return d.exportMemory(data, &out.offset); });

  auto event = translateRuntimeErrors("sending an npu tensor to another process",
                                      [&] { return d.createInterprocessEvent(); });
  event->record(currentRuntimeStream(device));
  out.event_handle = event->ipcHandle();
  out.event_sync_required = true;

  auto& p = producer();
  std::vector<SentData*> freed;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    SentData* sent = nullptr;
    if (current.get_deleter() == &deleteSent) {
      sent = static_cast<SentData*>(current.get_context());
      pruneSends(p, sent);
    } else {
      sent = new SentData();
      sent->device = device;
      ++p.alive;
      c10::DataPtr wrapped(data, sent, &deleteSent, current.device());
      sent->original = impl->set_data_ptr(std::move(wrapped));
    }
    Slot slot = takeSlot(p);
    slot.value().store(kInFlight, std::memory_order_release);
    out.ref_counter_handle = slot.file->handle;
    out.ref_counter_slot = slot.index;
    sent->sends.push_back(SentData::Send{slot, std::move(event)});
    // Each send also empties the limbo (CUDA's producer collects as it sends).
    collectLimbo(p, &freed);
  }
  for (auto* f : freed) delete f;
  return out;
}

c10::Storage openStorage(const SharedStorage& shared) {
  const auto device = static_cast<c10::DeviceIndex>(shared.device);
  auto& d = checkedDevice(device, "receiving an npu tensor from another process");
  void* base = translateRuntimeErrors("receiving an npu tensor from another process",
                                      [&] { return d.openMemory(shared.handle); });
  auto* r = new ReceivedData();
  r->device = device;
  r->base = base;
  try {
    r->slot = &openSlot(shared.ref_counter_handle, shared.ref_counter_slot);
    if (shared.event_sync_required) waitEvent(device, shared.event_handle);
  } catch (...) {
    d.closeMemory(base);
    delete r;
    throw;
  }
  r->slot->store(getpid(), std::memory_order_release);
  c10::DataPtr data(static_cast<char*>(base) + shared.offset, r, &deleteReceived, c10::Device(kNPU, device));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            static_cast<int64_t>(shared.storage_bytes),
                                                            std::move(data), /*allocator=*/nullptr,
                                                            /*resizable=*/false));
}

void releaseCounter(const std::string& ref_counter_handle, std::size_t slot) {
  openSlot(ref_counter_handle, slot).store(0, std::memory_order_release);
}

void waitEvent(c10::DeviceIndex device, const std::string& event_handle) {
  auto& d = checkedDevice(device, "receiving an npu event from another process");
  translateRuntimeErrors("receiving an npu tensor from another process", [&] {
    auto event = d.openEvent(event_handle);
    currentRuntimeStream(device).wait(*event);
  });
}

std::size_t collect() {
  auto& p = producer();
  std::vector<SentData*> freed;
  std::size_t held = 0;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    collectLimbo(p, &freed);
    held = p.limbo.size();
  }
  for (auto* f : freed) delete f;
  return held;
}

std::shared_ptr<runtime::Event> newEvent(c10::DeviceIndex device) {
  auto& d = checkedDevice(device, "torch.npu.Event(interprocess=True)");
  return translateRuntimeErrors("torch.npu.Event(interprocess=True)",
                                [&] { return std::shared_ptr<runtime::Event>(d.createInterprocessEvent()); });
}

std::shared_ptr<runtime::Event> openEvent(c10::DeviceIndex device, const std::string& handle) {
  auto& d = checkedDevice(device, "torch.npu.Event.from_ipc_handle");
  return translateRuntimeErrors("torch.npu.Event.from_ipc_handle",
                                [&] { return std::shared_ptr<runtime::Event>(d.openEvent(handle)); });
}

std::size_t limboCount() {
  auto& p = producer();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.limbo.size();
}

}  // namespace npu::ipc
