// Emulator-specific tests of its interprocess memory (emu/ipc.h): what the
// conformance suite (conformance_ipc_test.cpp) cannot ask of every HAL.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "emu/device.h"
#include "emu_test_util.h"
#include "hal.h"

namespace npu::runtime {
namespace {

using emu::EmuDevice;
using testing::inlineConfig;

// The device's memory is a shared file: a child forked from its process (which
// cannot use the npu, docs/design/03-core.md) must never change the parent's memory through it.
TEST(EmuInterprocess, AForkedChildNeitherAllocatesNorFreesTheParentsMemory) {
  EmuDevice device(0, 1 << 20, inlineConfig());
  auto* p = static_cast<char*>(device.allocate(8192));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 8192);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool allocated = device.allocate(4096) != nullptr;
    device.free(p);  // in the child only: the parent's pages stay
    _exit(allocated ? 3 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child was handed the parent's memory";
  EXPECT_EQ(p[0], 7);
  EXPECT_EQ(p[8191], 7);
  device.free(p);
}

TEST(EmuInterprocess, FreedPagesComeBackZeroedAndTheCapacityIsExact) {
  EmuDevice device(0, 1 << 20, inlineConfig());
  EXPECT_TRUE(device.capabilities().interprocess);
  auto* whole = static_cast<char*>(device.allocate(1 << 20));
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(device.allocate(64), nullptr);
  std::memset(whole, 1, 1 << 20);
  device.free(whole);
  auto* again = static_cast<char*>(device.allocate(1 << 20));
  ASSERT_EQ(again, whole);
  EXPECT_EQ(again[4096], 0) << "freed pages go back to the system";
  device.free(again);
}

TEST(EmuInterprocess, TheProtectedModeHasNoInterprocessMemory) {
  auto config = inlineConfig();
  config.protect = true;
  EmuDevice device(0, 1 << 20, config);
  EXPECT_FALSE(device.capabilities().interprocess);
  void* p = device.allocate(4096);
  try {
    device.exportMemory(p, nullptr);
    ADD_FAILURE() << "exported protected memory";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("NPU_EMU_PROTECT=1"), std::string::npos) << e.what();
  }
  device.free(p);
}

// Expandable segments live in private reservations, apart from the shared file:
// exporting them is refused with a message that says what to do.
TEST(EmuInterprocess, ReservedMemoryIsNotExportedAndSaysWhy) {
  EmuDevice device(0, 1 << 20, inlineConfig());
  ASSERT_TRUE(device.capabilities().virtual_memory);
  const std::size_t page = device.virtualMemoryGranularity();
  auto* base = static_cast<char*>(device.reserveAddress(4 * page));
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(device.mapMemory(base, 2 * page));
  try {
    device.exportMemory(base + 100, nullptr);
    ADD_FAILURE() << "exported reserved memory";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expandable_segments:False"), std::string::npos) << e.what();
  }
  device.releaseAddress(base);
}

// Unmapped pages go back to the system: mapped again, they read zeros.
TEST(EmuVirtualMemory, RemappedPagesAreFresh) {
  EmuDevice device(0, 1 << 20, inlineConfig());
  const std::size_t page = device.virtualMemoryGranularity();
  auto* base = static_cast<char*>(device.reserveAddress(2 * page));
  ASSERT_TRUE(device.mapMemory(base, 2 * page));
  std::memset(base, 9, 2 * page);
  device.unmapMemory(base, page);
  ASSERT_TRUE(device.mapMemory(base, page));
  EXPECT_EQ(base[0], 0);
  EXPECT_EQ(base[page], 9);
  device.releaseAddress(base);
}

TEST(EmuVirtualMemory, TheProtectedModeHasNoVirtualMemory) {
  auto config = inlineConfig();
  config.protect = true;
  EmuDevice device(0, 1 << 20, config);
  EXPECT_FALSE(device.capabilities().virtual_memory);
  try {
    device.reserveAddress(1 << 16);
    ADD_FAILURE() << "reserved under NPU_EMU_PROTECT";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("NPU_EMU_PROTECT=1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace npu::runtime
