// The emulator's protected mode (NPU_EMU_PROTECT=1, emu/protection.h): device
// memory is open to the host only while the device works on it (a kernel, a
// copy, a stream hold), and a host access at any other time faults with a
// message naming the mode.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "emu/device.h"
#include "emu_test_util.h"

namespace npu::runtime {
namespace {

constexpr std::size_t MiB = 1024 * 1024;

std::unique_ptr<emu::EmuHal> protectedHal(emu::LaunchConfig config) {
  config.protect = true;
  return std::make_unique<emu::EmuHal>(1, 64 * MiB, config);
}

TEST(EmuProtect, TheDeviceIsNotHostAddressable) {
  auto hal = protectedHal(testing::inlineConfig());
  EXPECT_FALSE(hal->device(0).capabilities().host_addressable);
  auto open = std::make_unique<emu::EmuHal>(1, 64 * MiB, testing::inlineConfig());
  EXPECT_TRUE(open->device(0).capabilities().host_addressable);
}

TEST(EmuProtect, KernelsCopiesAndHoldsReachTheMemory) {
  for (const auto& config : {testing::inlineConfig(), testing::asyncConfig()}) {
    auto hal = protectedHal(config);
    auto& device = hal->device(0);
    auto& stream = device.defaultStream();
    auto* memory = static_cast<int*>(device.allocate(4096));
    ASSERT_NE(memory, nullptr);
    stream.launch("fill", [memory] {
      for (int i = 0; i < 1024; ++i) memory[i] = i;
    });
    std::vector<int> host(1024, -1);
    stream.copy(host.data(), memory, 4096, CopyKind::DeviceToHost);
    stream.synchronize();
    EXPECT_EQ(host[7], 7);
    stream.acquire();  // host code in stream order works as the device
    memory[3] = 42;
    stream.release();
    stream.copy(host.data(), memory, 4096, CopyKind::DeviceToHost);
    stream.synchronize();
    EXPECT_EQ(host[3], 42);
    device.free(memory);
  }
}

TEST(EmuProtect, FreedMemoryReadsZeroWhenReused) {
  auto hal = protectedHal(testing::inlineConfig());
  auto& device = hal->device(0);
  auto& stream = device.defaultStream();
  auto* memory = static_cast<int*>(device.allocate(4096));
  stream.launch("fill", [memory] { std::memset(memory, 0xff, 4096); });
  stream.synchronize();
  device.free(memory);
  auto* again = static_cast<int*>(device.allocate(4096));
  int first = -1;
  stream.copy(&first, again, sizeof(int), CopyKind::DeviceToHost);
  stream.synchronize();
  EXPECT_EQ(first, 0);
  device.free(again);
}

TEST(EmuProtectDeathTest, AHostAccessOutsideDeviceWorkFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto hal = protectedHal(testing::inlineConfig());
  auto& device = hal->device(0);
  auto* memory = static_cast<volatile int*>(device.allocate(4096));
  device.defaultStream().launch("fill", [memory] { memory[0] = 1; });
  device.synchronize();
  EXPECT_DEATH({ (void)memory[0]; }, "the host touched npu memory at 0x[0-9a-f]+ outside a kernel");
  device.free(const_cast<int*>(memory));
}

// The gate closes again after every way device work ends: a hold the worker
// handed over (acquire on a busy stream), kernels on two streams, event markers.
TEST(EmuProtectDeathTest, TheMemoryClosesAfterHoldsAndWorkOnSeveralStreams) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto hal = protectedHal(testing::asyncConfig());
  auto& device = hal->device(0);
  auto& first = device.defaultStream();
  auto& second = device.createStream(0);
  auto* memory = static_cast<volatile int*>(device.allocate(4096));
  first.launch("sleep", [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  first.acquire();  // behind the sleep: handed over by the worker
  memory[0] = 7;
  first.release();
  auto event = device.createEvent(false);
  first.launch("write", [memory] { memory[1] = 8; });
  event->record(first);
  second.wait(*event);
  second.launch("read", [memory] { memory[2] = memory[1]; });
  device.synchronize();
  EXPECT_DEATH({ (void)memory[2]; }, "the host touched npu memory at 0x[0-9a-f]+ outside a kernel");
  device.free(const_cast<int*>(memory));
}

}  // namespace
}  // namespace npu::runtime
