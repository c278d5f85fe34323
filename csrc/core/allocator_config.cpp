#include "allocator_config.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace npu::allocator_config {

namespace {

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\n");
  return text.substr(first, last - first + 1);
}

// "a:1,b:[2:3,>:4]" -> {("a", "1"), ("b", "[2:3,>:4]")}
std::vector<std::pair<std::string, std::string>> splitSettings(const std::string& config, const std::string& origin) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : config) {
    if (c == '[') depth++;
    if (c == ']') depth--;
    if (c == ',' && depth == 0) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  items.push_back(current);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& raw : items) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const auto colon = item.find(':');
    TORCH_CHECK_VALUE(colon != std::string::npos, origin, ": '", item, "' is not a key:value setting; write ",
                      "for example max_split_size_mb:128,garbage_collection_threshold:0.6");
    out.emplace_back(trim(item.substr(0, colon)), trim(item.substr(colon + 1)));
  }
  return out;
}

double parseNumber(const std::string& origin, const std::string& key, const std::string& value, const char* expected) {
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK_VALUE(used == value.size() && !value.empty() && std::isfinite(number), origin, ": ", key, ":", value,
                    " is not valid; ", key, " takes ", expected);
  return number;
}

std::size_t parseCount(const std::string& origin, const std::string& key, const std::string& value,
                       const char* expected) {
  const double number = parseNumber(origin, key, value, expected);
  TORCH_CHECK_VALUE(number >= 0 && number == std::floor(number), origin, ": ", key, ":", value, " is not valid; ",
                    key, " takes ", expected);
  return static_cast<std::size_t>(number);
}

bool parseBool(const std::string& origin, const std::string& key, const std::string& value) {
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0") return false;
  TORCH_CHECK_VALUE(false, origin, ": ", key, ":", value, " is not valid; ", key, " takes True or False");
  return false;
}

std::array<std::size_t, kRoundupIntervals> parseDivisions(const std::string& origin, const std::string& value) {
  const char* expected = "a power of two (or 0), or a list such as [256:1,512:2,1024:4,>:8] (sizes in MiB, "
                         "each a power of two, with the divisions of the sizes below it; '>' for the rest)";
  auto checkDivision = [&](const std::string& v) {
    const std::size_t d = parseCount(origin, "roundup_power2_divisions", v, expected);
    TORCH_CHECK_VALUE(d == 0 || isPowerOf2(d), origin, ": roundup_power2_divisions: ", v,
                      " divisions is not valid; the divisions must be a power of two (or 0 for none)");
    return d;
  };
  std::array<std::size_t, kRoundupIntervals> divisions{};
  if (value.empty() || value.front() != '[') {
    divisions.fill(checkDivision(value));
    return divisions;
  }
  TORCH_CHECK_VALUE(value.back() == ']', origin, ": roundup_power2_divisions:", value, " is not valid; it takes ",
                    expected);
  std::size_t next = 0;  // the first interval not yet given
  bool rest_given = false;
  for (const auto& [size_text, division_text] :
       splitSettings(value.substr(1, value.size() - 2), origin + " (roundup_power2_divisions)")) {
    const std::size_t d = checkDivision(division_text);
    TORCH_CHECK_VALUE(!rest_given, origin, ": roundup_power2_divisions: '>' must be the last entry");
    if (size_text == ">") {
      for (std::size_t i = next; i < divisions.size(); ++i) divisions[i] = d;
      next = divisions.size();
      rest_given = true;
      continue;
    }
    const std::size_t mib = parseCount(origin, "roundup_power2_divisions", size_text, expected);
    TORCH_CHECK_VALUE(isPowerOf2(mib), origin, ": roundup_power2_divisions: the size ", size_text,
                      " MiB is not a power of two");
    const auto end = std::min<std::size_t>(static_cast<std::size_t>(floorLog2(mib)), divisions.size());
    TORCH_CHECK_VALUE(end >= next && (end > next || next == 0), origin,
                      ": roundup_power2_divisions: the sizes must grow from one entry to the next");
    for (std::size_t i = next; i < end; ++i) divisions[i] = d;
    next = end;
  }
  return divisions;
}

}  // namespace

std::string settingsVariable() {
  for (const char* name : {"PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return name;
  }
  return "";
}


Settings parseSettings(const std::string& config, const std::string& origin, Settings base,
                       std::vector<std::string>* notes) {
  Settings next = std::move(base);
  std::size_t segment_size_mb = 0;
  bool base_addr_given = false;
  for (const auto& [key, value] : splitSettings(config, origin)) {
    if (key == "max_split_size_mb") {
      const std::size_t mb = parseCount(origin, key, value, "a whole number of MiB over 20");
      TORCH_CHECK_VALUE(mb > kLargeBuffer / kMiB, origin, ": max_split_size_mb:", value,
                        " is too small; it must be more than ", kLargeBuffer / kMiB, " (MiB)");
      next.max_split_size = mb * kMiB;
    } else if (key == "garbage_collection_threshold") {
      const double t = parseNumber(origin, key, value, "a fraction between 0 and 1, such as 0.6");
      TORCH_CHECK_VALUE(t > 0.0 && t < 1.0, origin, ": garbage_collection_threshold:", value,
                        " is out of range; it takes a fraction between 0 and 1 (exclusive), such as 0.6");
      next.gc_threshold = t;
    } else if (key == "roundup_power2_divisions") {
      next.divisions = parseDivisions(origin, value);
    } else if (key == "expandable_segments") {
      next.expandable_segments = parseBool(origin, key, value);
    } else if (key == "page_size") {
      TORCH_CHECK_VALUE(value == "1g" || value == "1G", origin, ": page_size:", value,
                        " is not valid; page_size takes 1g (1 GiB pages for the large pool)");
      next.large_page = kGiB;
    } else if (key == "segment_size_mb") {
      segment_size_mb = parseCount(origin, key, value, "a whole number of MiB from 20 to 512");
      TORCH_CHECK_VALUE(segment_size_mb >= 20 && segment_size_mb <= 512, origin, ": segment_size_mb:", value,
                        " is out of range; it takes 20 to 512 (MiB)");
    } else if (key == "base_addr_aligned_kb") {
      const std::size_t kb = parseCount(origin, key, value, "a whole number of KiB from 0 to 16");
      TORCH_CHECK_VALUE(kb <= 16, origin, ": base_addr_aligned_kb:", value, " is out of range; it takes 0 to 16");
      base_addr_given = true;
    } else if (key == "pinned_use_background_threads" || key == "pin_memory_expandable_segments" ||
               key == "pinned_mem_register") {
      if (parseBool(origin, key, value)) {
        notes->push_back(origin + ": " + key + ":True is accepted but has no effect: the npu's pinned host " +
                        "allocator has no such mode");
      }
    } else {
      TORCH_CHECK_VALUE(false, origin, ": unknown setting '", key, "'. The npu allocator takes max_split_size_mb, ",
                        "garbage_collection_threshold, roundup_power2_divisions, expandable_segments, page_size, ",
                        "segment_size_mb, base_addr_aligned_kb, pinned_use_background_threads, ",
                        "pin_memory_expandable_segments and pinned_mem_register");
    }
  }
  if (segment_size_mb != 0) next.expandable_page = segment_size_mb * kMiB;
  if (base_addr_given) {
    notes->push_back(origin + ": base_addr_aligned_kb is accepted but has no effect: an expandable segment's " +
                    "address is the HAL's reservation's");
  }
  next.origin = origin;
  next.text = config;
  return next;
}

std::map<std::string, std::string> describeSettings(const Settings& settings) {
  std::ostringstream divisions;
  divisions << "[";
  for (std::size_t i = 0; i < settings.divisions.size(); ++i) {
    divisions << (i ? "," : "") << settings.divisions[i];
  }
  divisions << "]";
  std::ostringstream gc;
  gc << settings.gc_threshold;
  return {{"PYTORCH_NPU_ALLOC_CONF", settings.text},
          {"origin", settings.origin},
          {"max_split_size",
           settings.max_split_size == kNoLimit ? "-1" : std::to_string(settings.max_split_size)},
          {"garbage_collection_threshold", gc.str()},
          {"expandable_segments", settings.expandable_segments ? "True" : "False"},
          {"roundup_power2_divisions", divisions.str()},
          {"page_size", settings.large_page == 0 ? "" : "1g"}};
}

}  // namespace npu::allocator_config
