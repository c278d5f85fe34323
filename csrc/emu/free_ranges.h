// The free byte ranges of an arena of device memory: first fit on take, coalesced
// with their neighbours on give. Not thread-safe: the arena holds its own lock.
#pragma once

#include <cstddef>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

namespace npu::runtime::emu {

class FreeRanges {
 public:
  // The offset of `size` bytes taken from the first range that holds them.
  std::optional<std::size_t> take(std::size_t size) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const std::size_t offset = it->first;
      const std::size_t rest = it->second - size;
      free_.erase(it);
      if (rest > 0) free_.emplace(offset + size, rest);
      return offset;
    }
    return std::nullopt;
  }

  // Gives [offset, offset + size) back; returns the free range (offset, size) it is now part of.
  std::pair<std::size_t, std::size_t> give(std::size_t offset, std::size_t size) {
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && offset + size == next->first) {  // merge with the range after
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {  // and with the one before
        offset = before->first;
        size += before->second;
        free_.erase(before);
      }
    }
    free_.emplace(offset, size);
    return {offset, size};
  }

 private:
  std::map<std::size_t, std::size_t> free_;  // offset -> size
};

}  // namespace npu::runtime::emu
