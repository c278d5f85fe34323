// Tests of stream order for work that runs on the host thread (acquire/release),
// of runIfIdle, of waits as stream markers, of failures carried by events and
// waiting streams, and of the positions the allocator relies on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "emu/device.h"
#include "emu/stream.h"
#include "hal.h"
#include "test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuDevice;
using emu::EmuStream;
using testing::asyncConfig;
using testing::Gate;
using testing::inlineConfig;
using namespace std::chrono_literals;

constexpr std::size_t MiB = 1024 * 1024;

emu::LaunchConfig configFor(bool always_enqueue) { return always_enqueue ? asyncConfig() : inlineConfig(); }

class BothPolicies : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Launch, BothPolicies, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "AlwaysEnqueue" : "Inline"; });

// ---- holding a stream for host work --------------------------------------------

TEST_P(BothPolicies, AcquireWaitsForEarlierKernelsAndLaterOnesQueueBehindTheHold) {
  EmuStream stream(0, 1, 0, GetParam() ? asyncConfig() : inlineConfig(/*inline_bytes=*/100));
  Gate gate;
  std::atomic<int> value{0};
  stream.launch("slow", [&] {  // queued under both policies (its size)
    gate.wait();
    value = 1;
  }, 1000);
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    gate.open();
  });
  stream.acquire();  // returns only after "slow" ran
  EXPECT_EQ(value.load(), 1);
  EXPECT_TRUE(stream.heldByCaller());

  // Another thread launches while we hold: its kernel must not run until release.
  std::atomic<bool> launched{false};
  std::thread other([&] {
    stream.launch("later", [&] { value = 2; }, 0);
    launched = true;
  });
  other.join();  // launch() returned: the kernel was queued, not run inline
  EXPECT_TRUE(launched.load());
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(value.load(), 1) << "a kernel ran while the stream was held";
  stream.release();
  stream.synchronize();
  EXPECT_EQ(value.load(), 2);
  opener.join();
}

TEST_P(BothPolicies, HolderLaunchesRunAtOnceAndItsSynchronizeDoesNotDeadlock) {
  EmuStream stream(0, 1, 0, configFor(GetParam()));
  stream.acquire();
  stream.acquire();  // re-entrant
  bool ran = false;
  stream.launch("holder_kernel", [&] { ran = true; }, 0);
  EXPECT_TRUE(ran);
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_NO_THROW(stream.drain());
  EXPECT_TRUE(stream.query());
  stream.release();
  EXPECT_TRUE(stream.heldByCaller());
  stream.release();
  EXPECT_FALSE(stream.heldByCaller());
}

TEST(Hold, ManyThreadsMixingKernelsAndHoldsNeverOverlap) {
  for (bool always_enqueue : {false, true}) {
    EmuStream stream(0, 1, 0, configFor(always_enqueue));
    std::atomic<int> running{0};
    std::atomic<int> overlaps{0};
    auto section = [&] {
      if (running.fetch_add(1) != 0) overlaps++;
      std::this_thread::yield();
      running.fetch_sub(1);
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 300; ++i) {
          if ((i + t) % 3 == 0) {
            stream.acquire();
            section();
            stream.release();
          } else {
            stream.launch("k", section, 0);
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    stream.synchronize();
    EXPECT_EQ(overlaps.load(), 0) << "always_enqueue=" << always_enqueue;
  }
}

// ---- runIfIdle -------------------------------------------------------------------

TEST(RunIfIdle, RunsOnAnIdleInlineStreamAndPropagatesTheError) {
  EmuStream stream(0, 1, 0, inlineConfig());
  bool ran = false;
  EXPECT_TRUE(stream.runIfIdle("k", [&] { ran = true; }, 0));
  EXPECT_TRUE(ran);
  EXPECT_THROW(stream.runIfIdle("bad", [] { throw std::invalid_argument("shape"); }, 0), std::invalid_argument);
  EXPECT_FALSE(stream.hasPendingError());  // raised at the call, not kept
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_TRUE(stream.runIfIdle("after", [] {}, 0));  // the stream keeps working
}

TEST(RunIfIdle, RefusesWhenBusyOrAlwaysEnqueue) {
  EmuStream queued(0, 1, 0, asyncConfig());
  EXPECT_FALSE(queued.runIfIdle("k", [] {}, 0));
  EmuStream stream(0, 2, 0, inlineConfig(/*inline_bytes=*/100));
  EXPECT_FALSE(stream.runIfIdle("big", [] {}, 1000));
  Gate gate;
  stream.launch("slow", [&] { gate.wait(); }, 1000);  // queued: over the inline size
  bool ran = false;
  EXPECT_FALSE(stream.runIfIdle("k", [&] { ran = true; }, 0));
  EXPECT_FALSE(ran);
  gate.open();
  stream.synchronize();
}

// ---- waits are markers -----------------------------------------------------------

TEST_P(BothPolicies, WaitOnAPendingEventReturnsAtOnceAndOrdersLaterWork) {
  // Inline policy: the producer's kernel is queued because of its size.
  EmuDevice device(0, 1 * MiB, GetParam() ? asyncConfig() : inlineConfig(/*inline_bytes=*/100));
  Stream& producer = device.createStream(0);
  Stream& consumer = device.createStream(0);
  Gate gate;
  std::atomic<int> value{0};
  producer.launch("produce", [&] {
    gate.wait();
    value = 1;
  }, 1000);
  auto event = device.createEvent(false);
  event->record(producer);
  const auto t0 = std::chrono::steady_clock::now();
  consumer.wait(*event);
  std::atomic<int> seen{-1};
  consumer.launch("consume", [&] { seen = value.load(); }, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5ms) << "wait() blocked the host";
  EXPECT_FALSE(consumer.query());
  gate.open();
  consumer.synchronize();
  EXPECT_EQ(seen.load(), 1);
  producer.synchronize();
}

// ---- failures travel with events -------------------------------------------------

TEST_P(BothPolicies, AStreamWaitingOnAFailedStreamInheritsItsErrorOnce) {
  EmuDevice device(0, 1 * MiB, configFor(GetParam()));
  Stream& s1 = device.createStream(0);
  Stream& s0 = device.defaultStream();
  s1.launch("index_kernel", [] { throw std::out_of_range("index 7 is out of bounds"); }, 0);
  auto event = device.createEvent(false);
  event->record(s1);
  s0.wait(*event);
  try {
    s0.synchronize();
    FAIL() << "the waiting stream did not report the failure";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "index_kernel");
    EXPECT_EQ(e.failure().stream, s1.id());
    EXPECT_EQ(e.failure().launch_index, 1u);
    EXPECT_THROW(std::rethrow_exception(e.failure().cause), std::out_of_range);  // the type is kept
  }
  // Reported once: neither the failed stream nor the event raise it again.
  EXPECT_NO_THROW(s1.synchronize());
  EXPECT_NO_THROW(event->synchronize());
  EXPECT_NO_THROW(device.synchronize());
}

TEST_P(BothPolicies, EventsCarryOnlyFailuresBeforeThem) {
  EmuDevice device(0, 1 * MiB, configFor(GetParam()));
  Stream& s = device.createStream(0);
  auto before = device.createEvent(false);
  before->record(s);
  s.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
  auto after = device.createEvent(false);
  after->record(s);
  EXPECT_NO_THROW(before->synchronize());
  EXPECT_THROW(after->synchronize(), KernelError);
  EXPECT_NO_THROW(s.synchronize());  // reported through the event already
}

TEST(Drain, WaitsButLeavesTheErrorPending) {
  EmuStream stream(0, 1, 0, asyncConfig());
  stream.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
  stream.drain();
  EXPECT_TRUE(stream.query());
  EXPECT_TRUE(stream.hasPendingError());
  EXPECT_THROW(stream.synchronize(), KernelError);
}

// ---- positions -------------------------------------------------------------------

TEST_P(BothPolicies, PositionsPassInLaunchOrder) {
  EmuStream stream(0, 1, 0, GetParam() ? asyncConfig() : inlineConfig(/*inline_bytes=*/100));
  const uint64_t start = stream.position();
  EXPECT_TRUE(stream.passed(start));
  Gate gate;
  stream.launch("slow", [&] { gate.wait(); }, 1000);  // queued under both policies
  stream.launch("next", [] {}, 0);
  const uint64_t p = stream.position();
  EXPECT_EQ(p, start + 2);
  EXPECT_FALSE(stream.passed(p));
  EXPECT_TRUE(stream.passed(start));
  gate.open();
  stream.synchronize();
  EXPECT_TRUE(stream.passed(p));
}

}  // namespace
}  // namespace npu::runtime
