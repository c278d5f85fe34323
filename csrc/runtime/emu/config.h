// Reading the emulator's settings from the environment.
#pragma once

#include <cstddef>
#include <string>

namespace npu::runtime::emu {

// "1", "true", "yes", "on" (any case) are true; unset or empty is `fallback`.
bool envFlag(const char* name, bool fallback = false);
long envInt(const char* name, long fallback);
// Sizes such as "4GiB", "512MiB", "64KB", "1g" or a plain number of bytes.
std::size_t envBytes(const char* name, std::size_t fallback);
// Parses a size as envBytes does; throws std::invalid_argument naming `what`.
std::size_t parseBytes(const std::string& text, const char* what);

}  // namespace npu::runtime::emu
