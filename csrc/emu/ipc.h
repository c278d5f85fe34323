// The emulator's interprocess capability (Capabilities::interprocess): device
// memory that another process can map, and events another process can open.
//
// Each device's memory is one memfd (a file in memory, no name) of the
// device's capacity, mapped shared; allocations are first-fit ranges of it.
// A handle names the file by its owner's process id and descriptor, checked by
// inode: the opener opens /proc/<pid>/fd/<fd> (as one process of a user may
// read another's descriptors) and maps the whole file once per process, however
// many of its allocations it opens. The pages live while any process maps
// them, so an opener's memory stays valid even after the owner exits.
//
// An interprocess event is a cell of two counters in a shared page: record()
// adds one to `recorded` and its marker raises `completed` to that count; an
// event is complete when `completed` reached `recorded` (read at the call).
// Pages of cells are never unmapped nor reused in a process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "free_ranges.h"

namespace npu::runtime::emu {

class SharedArena {
 public:
  SharedArena(int device, std::size_t capacity);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // `size` bytes (a multiple of 64), or nullptr when no free range is large enough.
  // A child forked from the owner shares the file: it gets nothing (nullptr)
  // and its frees give no pages back, so it never changes the owner's memory.
  void* allocate(std::size_t size);
  // Gives back a range allocate() returned, of that size; whole free pages go
  // back to the system (a later user reads zeros).
  void free(void* ptr, std::size_t size);
  // The handle of the allocation [base, base + size).
  std::string handle(const void* base, std::size_t size) const;

 private:
  char* base_ = nullptr;
  std::size_t capacity_ = 0;
  int fd_ = -1;
  int owner_ = 0;  // the process that made the file
  uint64_t dev_ = 0;
  uint64_t ino_ = 0;
  std::mutex mutex_;
  FreeRanges free_;
};

// Maps the allocation a handle names (any process's, this one's too) and
// returns its base; each call needs one closeSharedMemory.
void* openSharedMemory(const std::string& handle);
// Throws std::invalid_argument for a pointer openSharedMemory did not return.
void closeSharedMemory(void* base);

struct EventCell {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");

struct SharedEventCell {
  EventCell* cell = nullptr;
  std::string handle;
  bool complete() const {
    return cell->completed.load(std::memory_order_acquire) >= cell->recorded.load(std::memory_order_acquire);
  }
  // Raises `completed` to `count` (never lowers it).
  void completeUpTo(uint64_t count) const;
  // Waits until `completed` reaches `count` (polling: the writer may be another process).
  void waitFor(uint64_t count) const;
};

// A fresh cell of this process's pages.
SharedEventCell newEventCell();
// The cell a handle names (SharedEventCell::handle, from any process).
SharedEventCell openEventCell(const std::string& handle);

}  // namespace npu::runtime::emu
