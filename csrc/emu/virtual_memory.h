// The emulator's virtual memory (Capabilities::virtual_memory): address space
// reserved with mmap(PROT_NONE, MAP_NORESERVE), which commits nothing; a map
// opens pages for reading and writing (the kernel supplies zeroed pages on
// first touch), an unmap drops them (madvise(MADV_DONTNEED)) and closes them
// again (PROT_NONE). These reservations are private anonymous memory, apart
// from the device's shared file (ipc.h): their pages cannot be exported to
// another process. Not thread-safe: the device calls it under its memory lock,
// and counts committed bytes against its capacity itself.
#pragma once

#include <cstddef>
#include <map>

namespace npu::runtime::emu {

class AddressReservations {
 public:
  AddressReservations() = default;
  ~AddressReservations();  // releases every reservation
  AddressReservations(const AddressReservations&) = delete;
  AddressReservations& operator=(const AddressReservations&) = delete;

  // `size` (a non-zero multiple of kPage) bytes of address space, or nullptr.
  void* reserve(std::size_t size);
  // Throws std::invalid_argument (naming `device`) unless [ptr, ptr + size) is
  // page-aligned, non-empty, inside one reservation and, for `committed`
  // true, wholly committed, for false, wholly uncommitted.
  void check(const void* ptr, std::size_t size, bool committed, const char* what, int device) const;
  // Commits / decommits a range check() accepted.
  void commit(void* ptr, std::size_t size);
  void decommit(void* ptr, std::size_t size);
  // Releases the reservation at `base`; returns its committed bytes. Throws
  // std::invalid_argument for any other pointer.
  std::size_t release(void* base, int device);
  // Whether `ptr` lies in a committed page / in a reservation at all.
  bool committed(const void* ptr) const;
  bool reserved(const void* ptr) const;

  static constexpr std::size_t kPage = 4096;

 private:
  struct Reservation {
    std::size_t size = 0;
    std::size_t committed_bytes = 0;
    std::map<std::size_t, std::size_t> committed;  // offset -> size, coalesced
  };
  // The reservation holding `ptr`, or nullptr (`base` gets its base).
  const Reservation* find(const void* ptr, char** base) const;
  Reservation* find(const void* ptr, char** base);
  std::map<char*, Reservation> reservations_;  // by base
};

}  // namespace npu::runtime::emu
