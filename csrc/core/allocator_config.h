// The caching allocator's settings: PYTORCH_NPU_ALLOC_CONF (or PYTORCH_ALLOC_CONF),
// CUDA's keys and the Ascend adapter's, parsed with errors that name the variable,
// the key and what it takes. Pure functions: allocator.cpp keeps the active
// settings and applies them under its lock.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace npu::allocator_config {

constexpr std::size_t kLargeBuffer = 20 << 20;    // an oversize request may waste at most this
constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kGiB = std::size_t(1) << 30;
constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();
constexpr int kRoundupIntervals = 16;             // roundup_power2_divisions: 1 MiB .. 32 GiB and above

inline bool isPowerOf2(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }
inline int floorLog2(std::size_t n) { return 63 - __builtin_clzll(static_cast<unsigned long long>(n)); }

struct Settings {
  std::size_t max_split_size = kNoLimit;
  double gc_threshold = 0.0;  // 0: off
  std::array<std::size_t, kRoundupIntervals> divisions{};  // 0 or 1: 512-byte rounding only
  bool expandable_segments = false;
  std::size_t large_page = 0;  // page_size:1g rounds large-pool segments to 1 GiB
  std::size_t expandable_page = 0;  // segment_size_mb: how much an expandable segment grows at least (0: 2 MiB)
  std::string origin;          // where the settings came from
  std::string text;            // as given
};

// `base` with the settings of `config` applied; `origin` names where they came
// from in errors (c10::ValueError) and in `notes` (keys accepted without effect).
Settings parseSettings(const std::string& config, const std::string& origin, Settings base,
                       std::vector<std::string>* notes);
// The variable that holds the settings: PYTORCH_NPU_ALLOC_CONF, else
// PYTORCH_ALLOC_CONF, when set and not empty; "" otherwise.
std::string settingsVariable();
// torch.npu.memory._get_allocator_settings(): the settings as strings.
std::map<std::string, std::string> describeSettings(const Settings& settings);

}  // namespace npu::allocator_config
