// Tests of the runtime's configuration parsing, device memory, devices and the
// HAL object of the emulated NPU. Streams and events: stream_test.cpp.
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
#include "test_util.h"

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

TEST(Memory, AllocateWithinCapacityIsAlignedAndCounted) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(total, 1 * MiB);
  EXPECT_EQ(free, 1 * MiB);
  EXPECT_EQ(device.properties().total_memory, 1 * MiB);

  void* a = device.allocate(100);  // rounded up to 128
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_TRUE(device.hostAddressable());  // the memset below is what the flag promises
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

TEST(Memory, AllocatePastCapacityReturnsNull) {
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

TEST(Memory, HugeRequestsReturnNullInsteadOfWrapping) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t n : {max, max - 1, max - 62, max - 63, max / 2}) {
    void* p = device.allocate(n);
    EXPECT_EQ(p, nullptr) << n;
    if (p != nullptr) device.free(p);
  }
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);
}

TEST(Memory, OwnsInteriorPointersOnly) {
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

TEST(Memory, FreeOfForeignPointersThrows) {
  EmuHal hal(2, 1 * MiB, asyncConfig());
  Device& device = hal.device(0);
  Device& other = hal.device(1);
  auto* p = static_cast<char*>(device.allocate(256));
  ASSERT_NE(p, nullptr);

  int on_stack = 0;
  EXPECT_THROW(device.free(&on_stack), std::invalid_argument);
  std::unique_ptr<char[]> on_heap(new char[64]);
  EXPECT_THROW(device.free(on_heap.get()), std::invalid_argument);
  EXPECT_THROW(device.free(p + 64), std::invalid_argument);  // interior, not a base
  EXPECT_THROW(other.free(p), std::invalid_argument);        // another device's block
  EXPECT_NO_THROW(device.free(nullptr));

  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB - 256);  // the failed frees changed nothing
  other.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);

  device.free(p);
  EXPECT_THROW(device.free(p), std::invalid_argument);  // double free
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);
}

TEST(Memory, ConcurrentAllocateAndFreeKeepExactAccounting) {
  EmuDevice device(0, 64 * MiB, asyncConfig());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&device, &failures, t] {
      std::vector<void*> blocks;
      for (int i = 0; i < 2000; ++i) {
        void* p = device.allocate(static_cast<std::size_t>((i * 37 + t) % 1000));
        if (p == nullptr) {
          ++failures;
          continue;
        }
        blocks.push_back(p);
        if (i % 3 == 0) {
          device.free(blocks.back());
          blocks.pop_back();
        }
      }
      for (void* p : blocks) device.free(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  EXPECT_EQ(free, 64 * MiB);
}

// ---- devices ----------------------------------------------------------------

TEST(Devices, IndependentCapacities) {
  EmuHal hal(2, 1 * MiB, asyncConfig());
  EXPECT_EQ(hal.name(), "emulated");
  ASSERT_EQ(hal.deviceCount(), 2);
  Device& d0 = hal.device(0);
  Device& d1 = hal.device(1);
  EXPECT_EQ(d0.index(), 0);
  EXPECT_EQ(d1.index(), 1);
  EXPECT_NE(&d0, &d1);
  EXPECT_EQ(&hal.device(1), &d1);

  void* all0 = d0.allocate(1 * MiB);
  ASSERT_NE(all0, nullptr);
  EXPECT_EQ(d0.allocate(1), nullptr);
  std::size_t free = 0, total = 0;
  d1.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);  // device 0 being full takes nothing from device 1
  void* all1 = d1.allocate(1 * MiB);
  ASSERT_NE(all1, nullptr);
  EXPECT_EQ(d1.allocate(1), nullptr);
  EXPECT_TRUE(d0.owns(all0));
  EXPECT_FALSE(d0.owns(all1));
  EXPECT_TRUE(d1.owns(all1));
  EXPECT_FALSE(d1.owns(all0));

  d0.free(all0);
  d0.memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);
  d1.memoryInfo(&free, &total);
  EXPECT_EQ(free, 0u);
  d1.free(all1);
}

TEST(Devices, UnknownDeviceIndexThrows) {
  EmuHal hal(2, 1 * MiB, asyncConfig());
  EXPECT_THROW(hal.device(5), std::out_of_range);
  EXPECT_THROW(hal.device(2), std::out_of_range);
  EXPECT_THROW(hal.device(-1), std::out_of_range);
  EXPECT_NO_THROW(hal.device(1));

  EmuHal none(0, 1 * MiB, asyncConfig());
  EXPECT_EQ(none.deviceCount(), 0);
  EXPECT_THROW(none.device(0), std::out_of_range);

  EXPECT_THROW(EmuHal(-1, 1 * MiB, asyncConfig()), std::invalid_argument);
  EXPECT_THROW(EmuHal(65, 1 * MiB, asyncConfig()), std::invalid_argument);
}

TEST(Devices, Properties) {
  EmuDevice device(3, 2 * MiB, asyncConfig());
  EXPECT_EQ(device.index(), 3);
  EXPECT_EQ(device.properties().total_memory, 2 * MiB);
  EXPECT_FALSE(device.properties().name.empty());
  EXPECT_GE(device.properties().compute_units, 1);
}

TEST(Devices, StreamIdsAndLookup) {
  EmuDevice device(1, 1 * MiB, asyncConfig());
  Stream& s0 = device.defaultStream();
  EXPECT_EQ(s0.id(), 0);
  EXPECT_EQ(s0.device(), 1);
  EXPECT_EQ(&device.stream(0), &s0);

  Stream& s1 = device.createStream(0);
  Stream& s2 = device.createStream(-1);
  Stream& s3 = device.createStream(5);
  EXPECT_EQ(s1.id(), 1);
  EXPECT_EQ(s2.id(), 2);
  EXPECT_EQ(s3.id(), 3);
  EXPECT_EQ(s1.priority(), 0);
  EXPECT_EQ(s2.priority(), -1);
  EXPECT_EQ(s3.priority(), 5);
  EXPECT_EQ(s2.device(), 1);
  EXPECT_EQ(&device.stream(1), &s1);
  EXPECT_EQ(&device.stream(2), &s2);
  EXPECT_EQ(&device.stream(3), &s3);
  EXPECT_EQ(&device.defaultStream(), &s0);  // unchanged by the new streams

  EXPECT_THROW(device.stream(4), std::out_of_range);
  EXPECT_THROW(device.stream(100), std::out_of_range);
  EXPECT_THROW(device.stream(-1), std::out_of_range);

  auto event = device.createEvent(false);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(event->device(), 1);
}

// Streams are created on one thread while another keeps using the default
// stream: the default stream must stay valid while the stream table grows.
TEST(Devices, DefaultStreamUsableWhileStreamsAreCreated) {
  EmuDevice device(0, 1 * MiB, inlineConfig());
  std::atomic<bool> stop{false};
  std::atomic<long> ran{0};
  std::thread user([&] {
    while (!stop.load()) device.defaultStream().launch("tick", [&ran] { ++ran; }, 0);
  });
  const auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (ran.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  constexpr int kStreams = 2000;
  std::set<int64_t> ids;
  for (int i = 0; i < kStreams; ++i) ids.insert(device.createStream(0).id());
  stop = true;
  user.join();
  device.synchronize();
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(kStreams));
  EXPECT_EQ(*ids.begin(), 1);
  EXPECT_EQ(*ids.rbegin(), kStreams);
  EXPECT_GT(ran.load(), 0);
}

TEST(Devices, SynchronizeWaitsForEveryStream) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  std::vector<Stream*> streams{&device.defaultStream(), &device.createStream(0), &device.createStream(0)};
  Gate gate;
  std::atomic<int> done{0};
  for (Stream* s : streams) {
    s->launch("slow", [&] {
      gate.wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ++done;
    }, 0);
  }
  for (Stream* s : streams) EXPECT_FALSE(s->query());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open();
  });
  device.synchronize();
  EXPECT_EQ(done.load(), 3);
  for (Stream* s : streams) EXPECT_TRUE(s->query());
  opener.join();
}

TEST(Devices, SynchronizeRethrowsTheFirstErrorAfterWaitingForAll) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& s0 = device.defaultStream();
  Stream& s1 = device.createStream(0);
  Stream& s2 = device.createStream(0);
  Stream& s3 = device.createStream(0);
  Gate gate;
  std::atomic<bool> slow_done{false};
  s1.launch("first_bad", [] { throw std::runtime_error("one"); }, 0);
  s2.launch("second_bad", [] { throw std::runtime_error("two"); }, 0);
  s3.launch("slow", [&] {
    gate.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    slow_done = true;
  }, 0);
  s0.launch("fine", [] {}, 0);
  gate.open();
  try {
    device.synchronize();
    FAIL() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "first_bad");  // streams are checked in id order
    EXPECT_NE(std::string(e.what()).find("one"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(slow_done.load());  // it waited for the slow stream before raising
  for (Stream* s : {&s0, &s1, &s2, &s3}) EXPECT_TRUE(s->query());
  // Both errors were consumed by that synchronisation.
  EXPECT_NO_THROW(device.synchronize());
  EXPECT_NO_THROW(s2.synchronize());
}

// ---- the process-wide HAL -----------------------------------------------------

// setHal() is once per process: under --gtest_repeat only the first run counts.
TEST(Hal, SetHalBeforeFirstUseThenRefusesAnother) {
  static bool ran_in_this_process = false;
  if (ran_in_this_process) GTEST_SKIP() << "the process-wide HAL is already installed";
  ran_in_this_process = true;
  auto mine = std::make_unique<EmuHal>(3, 1 * MiB, asyncConfig());
  Hal* expected = mine.get();
  setHal(std::move(mine));
  EXPECT_EQ(&hal(), expected);
  EXPECT_EQ(hal().deviceCount(), 3);
  EXPECT_THROW(setHal(std::make_unique<EmuHal>(1, 1 * MiB, asyncConfig())), std::logic_error);
  EXPECT_EQ(&hal(), expected);
}

TEST(Hal, HostMemory) {
  EmuHal hal(1, 1 * MiB, asyncConfig());
  void* p = hal.hostAllocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
  std::memset(p, 1, 1000);
  hal.hostFree(p);
  void* zero = hal.hostAllocate(0);
  EXPECT_NE(zero, nullptr);
  hal.hostFree(zero);
  EXPECT_EQ(hal.hostAllocate(std::numeric_limits<std::size_t>::max()), nullptr);
  EXPECT_EQ(hal.hostAllocate(std::numeric_limits<std::size_t>::max() - 10), nullptr);
  std::size_t free = 0, total = 0;
  hal.device(0).memoryInfo(&free, &total);
  EXPECT_EQ(free, 1 * MiB);  // host memory is not device memory
}

}  // namespace
}  // namespace npu::runtime
