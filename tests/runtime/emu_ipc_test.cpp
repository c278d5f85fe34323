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
// cannot use the npu, section 9) must never change the parent's memory through it.
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

}  // namespace
}  // namespace npu::runtime
