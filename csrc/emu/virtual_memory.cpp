#include "virtual_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>

namespace npu::runtime::emu {

namespace {
std::string prefix(int device, const char* what) { return "npu:" + std::to_string(device) + ": " + what + ": "; }
}  // namespace

AddressReservations::~AddressReservations() {
  for (auto& [base, r] : reservations_) ::munmap(base, r.size);
}

void* AddressReservations::reserve(std::size_t size) {
  if (size == 0 || size % kPage != 0) {
    throw std::invalid_argument("reserveAddress: " + std::to_string(size) +
                                " bytes is not a non-zero multiple of the granularity (" + std::to_string(kPage) +
                                ")");
  }
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  reservations_[static_cast<char*>(p)].size = size;
  return p;
}

const AddressReservations::Reservation* AddressReservations::find(const void* ptr, char** base) const {
  const char* p = static_cast<const char*>(ptr);
  auto it = reservations_.upper_bound(const_cast<char*>(p));
  if (it == reservations_.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size) return nullptr;
  if (base != nullptr) *base = it->first;
  return &it->second;
}

AddressReservations::Reservation* AddressReservations::find(const void* ptr, char** base) {
  return const_cast<Reservation*>(static_cast<const AddressReservations*>(this)->find(ptr, base));
}

void AddressReservations::check(const void* ptr, std::size_t size, bool committed, const char* what,
                                int device) const {
  char* base = nullptr;
  const Reservation* r = find(ptr, &base);
  if (r == nullptr) throw std::invalid_argument(prefix(device, what) + "the range is not in a reserved address range");
  const auto offset = static_cast<std::size_t>(static_cast<const char*>(ptr) - base);
  if (size == 0 || offset % kPage != 0 || size % kPage != 0) {
    throw std::invalid_argument(prefix(device, what) + "the offset and size must be non-zero multiples of " +
                                std::to_string(kPage) + " bytes (virtualMemoryGranularity)");
  }
  if (size > r->size - offset) throw std::invalid_argument(prefix(device, what) + "the range passes its reservation's end");
  // The committed ranges overlapping [offset, offset + size).
  std::size_t overlap = 0;
  auto it = r->committed.upper_bound(offset);
  if (it != r->committed.begin()) --it;
  for (; it != r->committed.end() && it->first < offset + size; ++it) {
    const std::size_t lo = std::max(it->first, offset);
    const std::size_t hi = std::min(it->first + it->second, offset + size);
    if (hi > lo) overlap += hi - lo;
  }
  if (committed && overlap != size) {
    throw std::invalid_argument(prefix(device, what) + "part of the range is not mapped");
  }
  if (!committed && overlap != 0) {
    throw std::invalid_argument(prefix(device, what) + "part of the range is mapped already");
  }
}

void AddressReservations::commit(void* ptr, std::size_t size) {
  char* base = nullptr;
  Reservation* r = find(ptr, &base);
  if (::mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0) {
    throw std::system_error(errno, std::generic_category(), "mapMemory: mprotect");
  }
  std::size_t offset = static_cast<std::size_t>(static_cast<char*>(ptr) - base);
  std::size_t length = size;
  auto next = r->committed.lower_bound(offset);
  if (next != r->committed.end() && next->first == offset + length) {  // merge with the range after
    length += next->second;
    next = r->committed.erase(next);
  }
  if (next != r->committed.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // and the one before
      prev->second += length;
      r->committed_bytes += size;
      return;
    }
  }
  r->committed.emplace(offset, length);
  r->committed_bytes += size;
}

void AddressReservations::decommit(void* ptr, std::size_t size) {
  char* base = nullptr;
  Reservation* r = find(ptr, &base);
  // The pages go back to the system at once; PROT_NONE makes a stray access fault.
  ::madvise(ptr, size, MADV_DONTNEED);
  ::mprotect(ptr, size, PROT_NONE);
  const auto offset = static_cast<std::size_t>(static_cast<char*>(ptr) - base);
  auto it = std::prev(r->committed.upper_bound(offset));  // check() found it committed
  const std::size_t start = it->first, end = it->first + it->second;
  r->committed.erase(it);
  if (start < offset) r->committed.emplace(start, offset - start);
  if (offset + size < end) r->committed.emplace(offset + size, end - offset - size);
  r->committed_bytes -= size;
}

std::size_t AddressReservations::release(void* base, int device) {
  auto it = reservations_.find(static_cast<char*>(base));
  if (it == reservations_.end()) {
    throw std::invalid_argument(prefix(device, "releaseAddress") +
                                "the pointer is not the base of a reservation of this device");
  }
  const std::size_t committed_bytes = it->second.committed_bytes;
  ::munmap(it->first, it->second.size);
  reservations_.erase(it);
  return committed_bytes;
}

bool AddressReservations::committed(const void* ptr) const {
  char* base = nullptr;
  const Reservation* r = find(ptr, &base);
  if (r == nullptr) return false;
  const auto offset = static_cast<std::size_t>(static_cast<const char*>(ptr) - base);
  auto it = r->committed.upper_bound(offset);
  if (it == r->committed.begin()) return false;
  --it;
  return offset < it->first + it->second;
}

bool AddressReservations::reserved(const void* ptr) const { return find(ptr, nullptr) != nullptr; }

}  // namespace npu::runtime::emu
