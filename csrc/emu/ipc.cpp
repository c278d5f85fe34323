#include "ipc.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace npu::runtime::emu {

namespace {

constexpr std::size_t kPage = 4096;
constexpr char kMagic[8] = {'n', 'p', 'u', 'e', 'm', 'u', '1', '\0'};
enum : uint32_t { kMemory = 1, kEvent = 2 };

// What a handle holds: which file (the owner's descriptor, checked by inode)
// and which range of it.
struct Wire {
  char magic[8];
  uint32_t kind;
  int32_t pid;
  int32_t fd;
  uint32_t reserved;
  uint64_t dev;
  uint64_t ino;
  uint64_t offset;
  uint64_t size;
};
static_assert(sizeof(Wire) <= 64, "handles are at most 64 bytes");

std::string errnoText() { return std::strerror(errno); }

std::string encode(uint32_t kind, int fd, uint64_t dev, uint64_t ino, uint64_t offset, uint64_t size) {
  Wire w{};
  std::memcpy(w.magic, kMagic, sizeof kMagic);
  w.kind = kind;
  w.pid = static_cast<int32_t>(getpid());
  w.fd = fd;
  w.dev = dev;
  w.ino = ino;
  w.offset = offset;
  w.size = size;
  return std::string(reinterpret_cast<const char*>(&w), sizeof w);
}

Wire decode(const std::string& handle, uint32_t kind) {
  Wire w{};
  if (handle.size() != sizeof w) {
    throw std::invalid_argument("not an interprocess handle of the emulated npu (" + std::to_string(handle.size()) +
                                " bytes, expected " + std::to_string(sizeof w) + ")");
  }
  std::memcpy(&w, handle.data(), sizeof w);
  if (std::memcmp(w.magic, kMagic, sizeof kMagic) != 0 || w.kind != kind) {
    throw std::invalid_argument(std::string("not an interprocess ") + (kind == kMemory ? "memory" : "event") +
                                " handle of the emulated npu");
  }
  return w;
}

int createFile(const std::string& name, std::size_t size, uint64_t* dev, uint64_t* ino) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error("npu emulator: memfd_create failed: " + errnoText());
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 || fstat(fd, &st) != 0) {
    const std::string message = "npu emulator: could not size " + name + " to " + std::to_string(size) +
                                " bytes: " + errnoText();
    close(fd);
    throw std::runtime_error(message);
  }
  *dev = static_cast<uint64_t>(st.st_dev);
  *ino = static_cast<uint64_t>(st.st_ino);
  return fd;
}

char* mapFile(int fd, std::size_t size, const char* what) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error(std::string("npu emulator: could not map ") + what + " (" + std::to_string(size) +
                             " bytes): " + errnoText());
  }
  return static_cast<char*>(p);
}

// Opens the file of another process's handle (or this one's), checking that
// the descriptor still names it. Returns the descriptor and the file's size.
int openPeerFile(const Wire& w, std::size_t* size, const char* what) {
  const std::string path = "/proc/" + std::to_string(w.pid) + "/fd/" + std::to_string(w.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(std::string("cannot open the npu ") + what + " shared by process " +
                             std::to_string(w.pid) + " (" + path + ": " + errnoText() +
                             "): that process exited or freed it; the producer must keep it alive until "
                             "every consumer has received it");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != w.dev ||
      static_cast<uint64_t>(st.st_ino) != w.ino) {
    close(fd);
    throw std::runtime_error(std::string("cannot open the npu ") + what + " shared by process " +
                             std::to_string(w.pid) + ": the handle is stale (the producer freed it)");
  }
  *size = static_cast<std::size_t>(st.st_size);
  if (w.offset > *size || w.size > *size - w.offset) {
    close(fd);
    throw std::invalid_argument(std::string("npu ") + what + " handle out of range of its file");
  }
  return fd;
}

// ---- opened memory (process-wide) ----

struct Mapping {
  char* base;
  std::size_t size;
  std::size_t opens;
};

struct OpenedMemory {
  std::mutex mutex;
  std::map<std::pair<uint64_t, uint64_t>, Mapping> by_file;  // (dev, ino)
};

OpenedMemory& opened() {
  static auto* instance = new OpenedMemory();  // never destroyed: frees may run at exit
  return *instance;
}

// ---- event cells (process-wide) ----

constexpr std::size_t kCellsPerPage = kPage * 16 / sizeof(EventCell);

struct EventPages {
  std::mutex mutex;
  int fd = -1;  // the page being filled
  uint64_t dev = 0, ino = 0;
  EventCell* cells = nullptr;
  std::size_t used = kCellsPerPage;
  std::map<std::pair<uint64_t, uint64_t>, EventCell*> opened;  // (dev, ino) of others' pages
};

EventPages& eventPages() {
  static auto* instance = new EventPages();
  return *instance;
}

}  // namespace

// ---- SharedArena ----

SharedArena::SharedArena(int device, std::size_t capacity)
    : capacity_((std::max<std::size_t>(capacity, kPage) + kPage - 1) / kPage * kPage) {
  owner_ = static_cast<int>(getpid());
  fd_ = createFile("npu-emu-device" + std::to_string(device), capacity_, &dev_, &ino_);
  try {
    base_ = mapFile(fd_, capacity_, "the device's memory");
  } catch (...) {
    close(fd_);
    throw;
  }
  free_.give(0, capacity_);
}

SharedArena::~SharedArena() {
  munmap(base_, capacity_);
  close(fd_);
}

void* SharedArena::allocate(std::size_t size) {
  if (getpid() != owner_) return nullptr;  // a forked child: the file is its parent's memory
  std::lock_guard<std::mutex> lock(mutex_);
  const auto offset = free_.take(size);
  return offset ? base_ + *offset : nullptr;
}

void SharedArena::free(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto [offset, merged] = free_.give(static_cast<std::size_t>(static_cast<char*>(ptr) - base_), size);
  if (getpid() != owner_) return;  // a forked child: the pages are its parent's
  // The whole pages of the free range go back to the system.
  const std::size_t first = (offset + kPage - 1) / kPage * kPage;
  const std::size_t last = (offset + merged) / kPage * kPage;
  if (last > first) fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
                              static_cast<off_t>(last - first));
}

std::string SharedArena::handle(const void* base, std::size_t size) const {
  const auto offset = static_cast<uint64_t>(static_cast<const char*>(base) - base_);
  return encode(kMemory, fd_, dev_, ino_, offset, size);
}

void* openSharedMemory(const std::string& handle) {
  const Wire w = decode(handle, kMemory);
  auto& o = opened();
  std::lock_guard<std::mutex> lock(o.mutex);
  auto it = o.by_file.find({w.dev, w.ino});
  if (it == o.by_file.end()) {
    std::size_t size = 0;
    const int fd = openPeerFile(w, &size, "memory");
    char* base = nullptr;
    try {
      base = mapFile(fd, size, "another process's npu memory");
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);  // the mapping keeps the file
    it = o.by_file.emplace(std::make_pair(w.dev, w.ino), Mapping{base, size, 0}).first;
  } else if (w.offset > it->second.size || w.size > it->second.size - w.offset) {
    throw std::invalid_argument("npu memory handle out of range of its file");
  }
  ++it->second.opens;
  return it->second.base + w.offset;
}

void closeSharedMemory(void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  auto& o = opened();
  std::lock_guard<std::mutex> lock(o.mutex);
  for (auto it = o.by_file.begin(); it != o.by_file.end(); ++it) {
    Mapping& m = it->second;
    if (p < m.base || p >= m.base + m.size) continue;
    if (--m.opens == 0) {
      munmap(m.base, m.size);
      o.by_file.erase(it);
    }
    return;
  }
  throw std::invalid_argument("closeMemory: the pointer is not npu memory opened from another process");
}

// ---- event cells ----

void SharedEventCell::completeUpTo(uint64_t count) const {
  uint64_t seen = cell->completed.load(std::memory_order_acquire);
  while (seen < count && !cell->completed.compare_exchange_weak(seen, count, std::memory_order_acq_rel)) {
  }
}

void SharedEventCell::waitFor(uint64_t count) const {
  auto pause = std::chrono::microseconds(2);
  while (cell->completed.load(std::memory_order_acquire) < count) {
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::microseconds(500)) pause *= 2;
  }
}

SharedEventCell newEventCell() {
  auto& pages = eventPages();
  std::lock_guard<std::mutex> lock(pages.mutex);
  if (pages.used == kCellsPerPage) {
    uint64_t dev = 0, ino = 0;
    const std::size_t bytes = kCellsPerPage * sizeof(EventCell);
    const int fd = createFile("npu-emu-events", bytes, &dev, &ino);
    char* base = nullptr;
    try {
      base = mapFile(fd, bytes, "interprocess events");
    } catch (...) {
      close(fd);
      throw;
    }
    // The page being replaced stays mapped (its cells live on) and open (handles name it).
    pages.fd = fd;
    pages.dev = dev;
    pages.ino = ino;
    pages.cells = reinterpret_cast<EventCell*>(base);  // zero-filled: counters at 0
    pages.used = 0;
  }
  const std::size_t index = pages.used++;
  SharedEventCell out;
  out.cell = pages.cells + index;
  out.handle = encode(kEvent, pages.fd, pages.dev, pages.ino, index * sizeof(EventCell), sizeof(EventCell));
  return out;
}

SharedEventCell openEventCell(const std::string& handle) {
  const Wire w = decode(handle, kEvent);
  auto& pages = eventPages();
  std::lock_guard<std::mutex> lock(pages.mutex);
  SharedEventCell out;
  out.handle = handle;
  if (w.pid == getpid() && w.dev == pages.dev && w.ino == pages.ino) {  // a cell of this process's page
    out.cell = reinterpret_cast<EventCell*>(reinterpret_cast<char*>(pages.cells) + w.offset);
    return out;
  }
  auto it = pages.opened.find({w.dev, w.ino});
  if (it == pages.opened.end()) {
    std::size_t size = 0;
    const int fd = openPeerFile(w, &size, "event");
    char* base = nullptr;
    try {
      base = mapFile(fd, size, "another process's npu events");
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    it = pages.opened.emplace(std::make_pair(w.dev, w.ino), reinterpret_cast<EventCell*>(base)).first;
  }
  if (w.offset % sizeof(EventCell) != 0 || w.offset >= kCellsPerPage * sizeof(EventCell)) {
    throw std::invalid_argument("npu event handle out of range");
  }
  out.cell = reinterpret_cast<EventCell*>(reinterpret_cast<char*>(it->second) + w.offset);
  return out;
}

}  // namespace npu::runtime::emu
