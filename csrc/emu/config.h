// Reading the emulator's settings from the environment.
#pragma once

#include <cstddef>
#include <string>

namespace npu::runtime::emu {

// "1", "true", "yes", "on" (any case) are true, "0", "false", "no", "off"
// false; unset or empty is `fallback`; anything else throws std::invalid_argument.
bool envFlag(const char* name, bool fallback = false);
// An integer in [min, max]; unset or empty is `fallback`; a bad or
// out-of-range value throws std::invalid_argument naming the variable.
long envInt(const char* name, long fallback, long min, long max);
// Sizes such as "4GiB", "512MiB", "64KB", "1g" or a plain number of bytes.
std::size_t envBytes(const char* name, std::size_t fallback);
// Parses a size as envBytes does; throws std::invalid_argument naming `what`.
std::size_t parseBytes(const std::string& text, const char* what);

}  // namespace npu::runtime::emu
