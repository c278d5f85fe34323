// Emulator-specific tests of streams: its worker thread, its launch policies
// (running on the caller's thread when idle, NPU_EMU_INLINE_BYTES,
// NPU_EMU_ALWAYS_ENQUEUE), its blocking mode and its destructor. What every
// HAL's streams and events must do is tested by the conformance suite
// (conformance_stream_test.cpp, conformance_ordering_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emu/device.h"
#include "emu/stream.h"
#include "hal.h"
#include "emu_test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuDevice;
using emu::EmuHal;
using emu::EmuStream;
using testing::asyncConfig;
using testing::blockingConfig;
using testing::Gate;
using testing::inlineConfig;
using namespace std::chrono_literals;

constexpr std::size_t MiB = 1024 * 1024;

// ---- streams -----------------------------------------------------------------

TEST(EmuAsyncStream, QueuedKernelsRunOnOneWorkerThread) {
  EmuStream stream(0, 1, 0, asyncConfig());
  constexpr int kKernels = 1000;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  order.reserve(kKernels);
  threads.reserve(kKernels);
  for (int i = 0; i < kKernels; ++i) {
    stream.launch("append", [&order, &threads, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }, 0);
  }
  stream.synchronize();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kKernels));
  for (int i = 0; i < kKernels; ++i) ASSERT_EQ(order[i], i) << "at position " << i;
  for (const auto& id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
  EXPECT_TRUE(stream.query());
}

TEST(EmuAsyncStream, StreamPropertiesAreKept) {
  EmuStream stream(2, 7, -3, asyncConfig());
  EXPECT_EQ(stream.device(), 2);
  EXPECT_EQ(stream.id(), 7);
  EXPECT_EQ(stream.priority(), -3);
}

TEST(EmuAsyncStream, DestructorRunsQueuedWorkFirst) {
  std::atomic<int> done{0};
  {
    auto stream = std::make_unique<EmuStream>(0, 1, 0, asyncConfig());
    for (int i = 0; i < 50; ++i) {
      stream->launch("work", [&done] {
        std::this_thread::sleep_for(100us);
        ++done;
      }, 0);
    }
  }
  EXPECT_EQ(done.load(), 50);
}

TEST(EmuInlineStream, IdleStreamRunsTheKernelOnTheCallersThread) {
  EmuStream stream(0, 1, 0, inlineConfig());
  std::thread::id ran_on;
  bool done = false;
  stream.launch("here", [&] {
    ran_on = std::this_thread::get_id();
    done = true;
  }, 0);
  EXPECT_TRUE(done);  // already ran when launch() returned
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(stream.query());
  stream.synchronize();
}

TEST(EmuInlineStream, KernelsOverInlineBytesAreQueued) {
  EmuStream stream(0, 1, 0, inlineConfig(/*inline_bytes=*/1024));
  std::thread::id small_on, big_on;
  stream.launch("small", [&] { small_on = std::this_thread::get_id(); }, 1024);
  EXPECT_EQ(small_on, std::this_thread::get_id());
  stream.launch("big", [&] { big_on = std::this_thread::get_id(); }, 1025);
  stream.synchronize();
  EXPECT_NE(big_on, std::thread::id());
  EXPECT_NE(big_on, std::this_thread::get_id());
}

TEST(EmuInlineStream, BusyStreamQueuesLaterKernelsInOrder) {
  EmuStream stream(0, 1, 0, inlineConfig());
  Gate started;
  Gate release;
  std::vector<int> order;
  std::vector<std::thread::id> ran_on;
  std::thread::id blocker_thread;
  // Another thread makes the stream busy with a kernel that runs inline on it
  // and blocks until released.
  std::thread other([&] {
    blocker_thread = std::this_thread::get_id();
    stream.launch("blocker", [&] {
      order.push_back(0);
      started.open();
      release.wait();
    }, 0);
  });
  ASSERT_TRUE(started.wait());
  constexpr int kLater = 100;
  for (int i = 1; i <= kLater; ++i) {
    stream.launch("later", [&order, &ran_on, i] {
      order.push_back(i);
      ran_on.push_back(std::this_thread::get_id());
    }, 0);
  }
  // Every launch returned without running its kernel: the stream is busy.
  EXPECT_FALSE(stream.query());
  EXPECT_EQ(order.size(), 1u);
  release.open();
  other.join();
  stream.synchronize();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kLater + 1));
  for (int i = 0; i <= kLater; ++i) ASSERT_EQ(order[i], i) << "at position " << i;
  for (const auto& id : ran_on) EXPECT_NE(id, std::this_thread::get_id());

  // Drained, the stream is idle again and the next kernel runs inline.
  std::thread::id next_on;
  stream.launch("next", [&] { next_on = std::this_thread::get_id(); }, 0);
  EXPECT_EQ(next_on, std::this_thread::get_id());
}

TEST(EmuInlineStream, ErrorsOfInlineKernelsAreReportedAtSynchronize) {
  EmuStream stream(0, 1, 0, inlineConfig());
  EXPECT_NO_THROW(stream.launch("inline_bad", [] { throw std::runtime_error("boom"); }, 0));
  bool after = false;
  stream.launch("after", [&] { after = true; }, 0);
  EXPECT_TRUE(after);
  try {
    stream.synchronize();
    FAIL() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "inline_bad");
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(stream.synchronize());
}

TEST(EmuBlockingStream, FailingKernelThrowsAtLaunch) {
  EmuStream stream(0, 1, 0, blockingConfig());
  try {
    stream.launch("blocking_bad", [] { throw std::runtime_error("boom"); }, 0);
    FAIL() << "launch() did not throw";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "blocking_bad");
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(stream.synchronize());  // nothing left to report
}

TEST(EmuBlockingStream, KernelsCompleteBeforeLaunchReturnsEvenWithAlwaysEnqueue) {
  emu::LaunchConfig config = blockingConfig();
  config.always_enqueue = true;  // blocking wins over always_enqueue
  EmuStream stream(0, 1, 0, config);
  bool done = false;
  stream.launch("slow", [&] {
    std::this_thread::sleep_for(5ms);
    done = true;
  }, 0);
  EXPECT_TRUE(done);
  EXPECT_TRUE(stream.query());
}

TEST(EmuCopy, InlineCopyIsImmediateOnAnIdleStream) {
  EmuDevice device(0, 1 * MiB, inlineConfig());
  char src[16] = "hello, npu";
  char dst[16] = {};
  device.defaultStream().copy(dst, src, sizeof(src), CopyKind::HostToDevice);
  EXPECT_STREQ(dst, "hello, npu");
}

}  // namespace
}  // namespace npu::runtime
