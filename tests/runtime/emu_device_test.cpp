// Emulator-specific tests: the emulator's settings (NPU_EMU_* parsing), its
// memory accounting (64-byte blocks), its device count and its capabilities.
// What every HAL must do is tested by the conformance suite (conformance_*).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emu/config.h"
#include "emu/device.h"
#include "hal.h"
#include "emu_test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuDevice;
using emu::EmuHal;
using testing::asyncConfig;
using testing::Gate;
using testing::inlineConfig;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;
constexpr std::size_t GiB = 1024 * MiB;

// ---- configuration ---------------------------------------------------------

TEST(ParseBytes, UnitsAndPlainNumbers) {
  EXPECT_EQ(emu::parseBytes("4GiB", "X"), 4 * GiB);
  EXPECT_EQ(emu::parseBytes("512MiB", "X"), 512 * MiB);
  EXPECT_EQ(emu::parseBytes("64KB", "X"), 64 * KiB);
  EXPECT_EQ(emu::parseBytes("1g", "X"), GiB);
  EXPECT_EQ(emu::parseBytes("123", "X"), 123u);
  EXPECT_EQ(emu::parseBytes("0", "X"), 0u);
  EXPECT_EQ(emu::parseBytes("7b", "X"), 7u);
  EXPECT_EQ(emu::parseBytes("2 MiB", "X"), 2 * MiB);
  EXPECT_EQ(emu::parseBytes("1.5k", "X"), 1536u);
  EXPECT_EQ(emu::parseBytes("2T", "X"), 2048 * GiB);
  EXPECT_EQ(emu::parseBytes("3mb", "X"), 3 * MiB);
}

TEST(ParseBytes, InvalidStringsThrow) {
  for (const char* text : {"", "abc", "GiB", "12XB", "4GiBs", "1.2.3", "-1", "-4GiB", "1e", "k4",
                           "nan", "inf", "infGiB", "1e30", "1e20GiB"}) {
    EXPECT_THROW(emu::parseBytes(text, "NPU_EMU_MEMORY"), std::invalid_argument) << "'" << text << "'";
  }
}

TEST(ParseBytes, ErrorNamesTheSettingAndTheText) {
  try {
    emu::parseBytes("lots", "NPU_EMU_MEMORY");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("NPU_EMU_MEMORY"), std::string::npos) << what;
    EXPECT_NE(what.find("lots"), std::string::npos) << what;
  }
}

// The one test that reads the environment; it uses its own variable names.
TEST(Environment, EnvBytesFlagAndInt) {
  const char* bytes = "NPU_RUNTIME_TEST_BYTES";
  ::unsetenv(bytes);
  EXPECT_EQ(emu::envBytes(bytes, 77), 77u);
  ::setenv(bytes, "", 1);
  EXPECT_EQ(emu::envBytes(bytes, 77), 77u);
  ::setenv(bytes, "8MiB", 1);
  EXPECT_EQ(emu::envBytes(bytes, 77), 8 * MiB);
  ::setenv(bytes, "junk", 1);
  try {
    emu::envBytes(bytes, 77);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(bytes), std::string::npos) << e.what();
  }
  ::unsetenv(bytes);

  const char* flag = "NPU_RUNTIME_TEST_FLAG";
  ::unsetenv(flag);
  EXPECT_TRUE(emu::envFlag(flag, true));
  EXPECT_FALSE(emu::envFlag(flag, false));
  for (const char* yes : {"1", "true", "TRUE", "Yes", "on"}) {
    ::setenv(flag, yes, 1);
    EXPECT_TRUE(emu::envFlag(flag, false)) << yes;
  }
  for (const char* no : {"0", "false", "off", "no", "OFF"}) {
    ::setenv(flag, no, 1);
    EXPECT_FALSE(emu::envFlag(flag, true)) << no;
  }
  for (const char* bad : {"2", "maybe", "enable"}) {  // a typo is an error, never a silent "off"
    ::setenv(flag, bad, 1);
    EXPECT_THROW(emu::envFlag(flag, true), std::invalid_argument) << bad;
  }
  ::unsetenv(flag);

  const char* integer = "NPU_RUNTIME_TEST_INT";
  ::unsetenv(integer);
  EXPECT_EQ(emu::envInt(integer, 5, 0, 64), 5);
  ::setenv(integer, "12", 1);
  EXPECT_EQ(emu::envInt(integer, 5, 0, 64), 12);
  // Values a narrowing cast used to turn into other counts: 2^32 + 1 gave 1 device.
  for (const char* bad : {"12x", "4294967297", "99999999999999999999", "-1", "65"}) {
    ::setenv(integer, bad, 1);
    try {
      emu::envInt(integer, 5, 0, 64);
      FAIL() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(integer), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("0 to 64"), std::string::npos) << e.what();
    }
  }
  ::unsetenv(integer);
}

// ---- device memory ----------------------------------------------------------

TEST(EmuMemory, BlocksAreAlignedAndCountedIn64Bytes) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(total, 1 * MiB);
  EXPECT_EQ(free, 1 * MiB);
  EXPECT_EQ(device.properties().total_memory, 1 * MiB);

  void* a = device.allocate(100);  // rounded up to 128
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_TRUE(device.capabilities().host_addressable);  // the memset below is what the flag promises
  std::memset(a, 0xab, 100);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB - 128);
  EXPECT_EQ(total, 1 * MiB);

  void* b = device.allocate(0);  // a zero-byte block still takes 64 bytes
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  void* c = device.allocate(64);
  ASSERT_NE(c, nullptr);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB - 128 - 64 - 64);

  device.free(b);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB - 128 - 64);
  device.free(a);
  device.free(c);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);
}

TEST(EmuMemory, CapacityIsCountedInRoundedBlocks) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  EXPECT_EQ(device.allocate(1 * MiB + 1), nullptr);
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);  // a failed allocation takes nothing

  void* half = device.allocate(512 * KiB);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(device.allocate(512 * KiB + 1), nullptr);  // rounds to 512KiB + 64
  void* rest = device.allocate(512 * KiB - 63);        // rounds to exactly what is left
  ASSERT_NE(rest, nullptr);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 0u);
  EXPECT_EQ(device.allocate(1), nullptr);
  EXPECT_EQ(device.allocate(0), nullptr);

  device.free(half);  // free then allocate succeeds
  void* again = device.allocate(512 * KiB);
  EXPECT_NE(again, nullptr);
  device.free(again);
  device.free(rest);
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);
}

TEST(EmuMemory, OwnsTheRoundedBlockOnly) {
  EmuHal hal(2, 1 * MiB, asyncConfig());
  Device& device = hal.device(0);
  Device& other = hal.device(1);
  auto* p = static_cast<char*>(device.allocate(100));  // a 128-byte block
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(device.owns(p));
  EXPECT_TRUE(device.owns(p + 1));
  EXPECT_TRUE(device.owns(p + 99));
  EXPECT_TRUE(device.owns(p + 127));
  EXPECT_FALSE(device.owns(p + 128));  // one past the (only) block
  EXPECT_FALSE(device.owns(p - 1));
  EXPECT_FALSE(device.owns(nullptr));
  EXPECT_FALSE(other.owns(p));

  int on_stack = 0;
  EXPECT_FALSE(device.owns(&on_stack));
  std::unique_ptr<char[]> on_heap(new char[256]);
  EXPECT_FALSE(device.owns(on_heap.get()));
  EXPECT_FALSE(device.owns(on_heap.get() + 100));

  device.free(p);
  EXPECT_FALSE(device.owns(p));
  EXPECT_FALSE(device.owns(p + 10));
}

// ---- devices ----------------------------------------------------------------

TEST(EmuDevices, DeviceCountIsChecked) {
  EmuHal none(0, 1 * MiB, asyncConfig());
  EXPECT_EQ(none.deviceCount(), 0);
  EXPECT_THROW(none.device(0), std::out_of_range);
  EXPECT_THROW(EmuHal(-1, 1 * MiB, asyncConfig()), std::invalid_argument);
  EXPECT_THROW(EmuHal(65, 1 * MiB, asyncConfig()), std::invalid_argument);
  EmuHal hal(2, 1 * MiB, asyncConfig());
  EXPECT_EQ(hal.name(), "emulated");
  try {
    hal.device(2);
    FAIL() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("NPU_EMU_DEVICES"), std::string::npos) << e.what();
  }
}

TEST(EmuDevices, CapabilitiesFollowTheLaunchConfig) {
  for (const auto& config : {asyncConfig(), inlineConfig()}) {
    const Capabilities caps = EmuDevice(0, 1 * MiB, config).capabilities();
    EXPECT_TRUE(caps.host_addressable);  // device memory is host memory
    EXPECT_TRUE(caps.async_streams);
    EXPECT_TRUE(caps.multiple_streams);
    EXPECT_TRUE(caps.timing_events);
    EXPECT_FALSE(caps.stream_priorities);  // kept, not scheduled
  }
  // NPU_LAUNCH_BLOCKING: every launch completes before it returns.
  EXPECT_FALSE(EmuDevice(0, 1 * MiB, testing::blockingConfig()).capabilities().async_streams);
}

TEST(EmuDevices, StreamIdsCountUp) {
  EmuDevice device(1, 1 * MiB, asyncConfig());
  EXPECT_EQ(device.createStream(0).id(), 1);
  EXPECT_EQ(device.createStream(-1).id(), 2);
  EXPECT_EQ(device.createStream(5).id(), 3);
  EXPECT_THROW(device.stream(4), std::out_of_range);
}

TEST(EmuHalHostMemory, AlignedAndZeroSizedBlocks) {
  EmuHal hal(1, 1 * MiB, asyncConfig());
  void* p = hal.hostAllocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
  hal.hostFree(p);
  void* zero = hal.hostAllocate(0);
  EXPECT_NE(zero, nullptr);
  hal.hostFree(zero);
}

}  // namespace
}  // namespace npu::runtime
