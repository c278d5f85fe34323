// Tests of device activity tracing (tracing.h): what a profiler session gets
// from the runtime, on the caller's thread and on stream workers.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "emu/stream.h"
#include "tracing.h"
#include "test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuEvent;
using emu::EmuStream;
using tracing::ActivityKind;
using namespace std::chrono_literals;

void busyFor(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(Tracing, NothingIsRecordedWhenOff) {
  tracing::stop();
  EmuStream stream(0, 1, 0, testing::inlineConfig());
  stream.launch("k", [] {}, 0);
  tracing::start();
  EXPECT_TRUE(tracing::stop().empty());
}

TEST(Tracing, InlineKernelsAreTimedWithTheLaunchersCorrelation) {
  EmuStream stream(0, 3, 0, testing::inlineConfig());
  tracing::start();
  const int64_t before = tracing::nowNs();
  tracing::pushCorrelation(41);
  stream.launch("first", [] { busyFor(200us); }, 64);
  tracing::pushCorrelation(42);  // nested op: the innermost id wins
  stream.launch("second", [] {}, 0);
  tracing::popCorrelation();
  tracing::popCorrelation();
  stream.launch("outside", [] {}, 0);
  const int64_t after = tracing::nowNs();
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 3u);
  EXPECT_STREQ(activities[0].name, "first");
  EXPECT_EQ(activities[0].correlation, 41u);
  EXPECT_EQ(activities[0].stream, 3);
  EXPECT_EQ(activities[0].bytes, 64u);
  EXPECT_GE(activities[0].end_ns - activities[0].start_ns, 200000);
  EXPECT_EQ(activities[1].correlation, 42u);
  EXPECT_EQ(activities[2].correlation, 0u);
  for (const auto& a : activities) {
    EXPECT_EQ(a.kind, ActivityKind::Kernel);
    EXPECT_LE(before, a.start_ns);
    EXPECT_LE(a.start_ns, a.end_ns);
    EXPECT_LE(a.end_ns, after);
  }
}

TEST(Tracing, QueuedKernelsKeepTheCorrelationStampedAtLaunchAndTheWaitIsRecorded) {
  EmuStream stream(0, 5, 0, testing::asyncConfig());
  testing::Gate gate;
  tracing::start();
  tracing::pushCorrelation(7);
  const int64_t launched = tracing::nowNs();
  stream.launch("blocked", [&] { gate.wait(); }, 0);
  tracing::popCorrelation();
  tracing::pushCorrelation(8);
  stream.launch("later", [] {}, 0);
  std::thread opener([&] {
    std::this_thread::sleep_for(5ms);
    gate.open();
  });
  stream.synchronize();  // the host waits for the worker: a Synchronize activity
  tracing::popCorrelation();
  opener.join();
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 3u);
  EXPECT_STREQ(activities[0].name, "blocked");
  EXPECT_EQ(activities[0].correlation, 7u);
  EXPECT_GE(activities[0].end_ns - launched, 5000000);
  EXPECT_STREQ(activities[1].name, "later");
  EXPECT_EQ(activities[1].correlation, 8u);
  EXPECT_GE(activities[1].start_ns, activities[0].end_ns);  // stream order
  EXPECT_EQ(activities[2].kind, ActivityKind::Synchronize);
  EXPECT_EQ(activities[2].correlation, 8u);
  EXPECT_GE(activities[2].end_ns, activities[1].end_ns);
}

TEST(Tracing, CopiesAreMemcpyActivitiesAndEventMarkersAreNotTraced) {
  EmuStream stream(0, 2, 0, testing::inlineConfig());
  std::vector<char> a(1000, 'x'), b(1000);
  EmuEvent event(0, true);
  tracing::start();
  stream.copy(b.data(), a.data(), a.size(), CopyKind::HostToDevice);
  event.record(stream);
  event.synchronize();
  const int64_t start = tracing::nowNs();
  {
    tracing::Scope scope(ActivityKind::Kernel, "host_work", 0, 2);
  }
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 2u);
  EXPECT_EQ(activities[0].kind, ActivityKind::Memcpy);
  EXPECT_STREQ(activities[0].name, "Memcpy HtoD");
  EXPECT_EQ(activities[0].bytes, 1000u);
  EXPECT_EQ(activities[0].copy_kind, CopyKind::HostToDevice);
  EXPECT_STREQ(activities[1].name, "host_work");
  EXPECT_GE(activities[1].start_ns, start);
  EXPECT_EQ(b[999], 'x');
}

}  // namespace
}  // namespace npu::runtime
