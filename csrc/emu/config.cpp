#include "config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace npu::runtime::emu {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

bool envFlag(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string v = lower(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw std::invalid_argument(std::string(name) + "='" + value + "' is not a switch; use 1 (on) or 0 (off)");
}

long envInt(const char* name, long fallback, long min, long max) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value, &end, 10);
  if (end == value || *end != '\0') {
    throw std::invalid_argument(std::string(name) + "='" + value + "' is not an integer; use a number from " +
                                std::to_string(min) + " to " + std::to_string(max));
  }
  if (errno == ERANGE || parsed < min || parsed > max) {
    throw std::invalid_argument(std::string(name) + "='" + value + "' is out of range; use a number from " +
                                std::to_string(min) + " to " + std::to_string(max));
  }
  return parsed;
}

std::size_t parseBytes(const std::string& text, const char* what) {
  std::size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = lower(text.substr(pos));
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  // !(x >= 0) also rejects NaN; the bound rejects infinity and sizes past size_t.
  const double bytes = number * scale;
  if (pos == 0 || scale == 0 || !(number >= 0) ||
      !(bytes < static_cast<double>(std::numeric_limits<std::size_t>::max()))) {
    throw std::invalid_argument(std::string(what) + "='" + text +
                                "' is not a size; use e.g. 4GiB, 512MiB or a byte count");
  }
  return static_cast<std::size_t>(bytes);
}

std::size_t envBytes(const char* name, std::size_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return parseBytes(value, name);
}

}  // namespace npu::runtime::emu
