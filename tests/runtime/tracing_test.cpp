// Tests of runtime/tracing.h itself (Scope, the helpers a HAL reports with)
// and of what the emulator reports for work it runs on the caller's thread.
// What every HAL reports is tested by conformance_tracing_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "emu/stream.h"
#include "emu_test_util.h"
#include "tracing.h"

namespace npu::runtime {
namespace {

using emu::EmuStream;
using tracing::ActivityKind;

TEST(Tracing, ScopeRecordsItsSpanWithTheCurrentCorrelation) {
  tracing::stop();
  { tracing::Scope off(ActivityKind::Kernel, "off", 0, 2); }
  tracing::start();
  const int64_t start = tracing::nowNs();
  tracing::pushCorrelation(9);
  {
    tracing::Scope scope(ActivityKind::Fallback, "host_work", 1, 2, 10);
    scope.setBytes(20);
  }
  tracing::popCorrelation();
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 1u);
  EXPECT_STREQ(activities[0].name, "host_work");
  EXPECT_EQ(activities[0].kind, ActivityKind::Fallback);
  EXPECT_EQ(activities[0].device, 1);
  EXPECT_EQ(activities[0].stream, 2);
  EXPECT_EQ(activities[0].bytes, 20u);
  EXPECT_EQ(activities[0].correlation, 9u);
  EXPECT_EQ(activities[0].host_thread, tracing::currentThreadId());
  EXPECT_GE(activities[0].start_ns, start);
  EXPECT_LE(activities[0].start_ns, activities[0].end_ns);
}

TEST(Tracing, HalHelpersRecordOnlyWhatWasStampedWhileOn) {
  tracing::stop();
  const auto unstamped = tracing::LaunchStamp::now();
  EXPECT_FALSE(unstamped.traced);
  tracing::start();
  tracing::pushCorrelation(5);
  const auto stamped = tracing::LaunchStamp::now();
  tracing::popCorrelation();
  EXPECT_TRUE(stamped.traced);
  EXPECT_EQ(stamped.correlation, 5u);
  tracing::recordExecution(unstamped, ActivityKind::Kernel, "unstamped", 0, 0, 1, 2);
  tracing::recordExecution(stamped, ActivityKind::Memcpy, tracing::copyName(CopyKind::DeviceToHost), 0, 3, 10, 20,
                           8, CopyKind::DeviceToHost);
  tracing::recordHostWait(tracing::kStreamSynchronize, 0, 3, 0);  // no start: nothing
  tracing::recordHostWait(tracing::kStreamSynchronize, 0, 3, tracing::nowNs());
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 2u);
  EXPECT_STREQ(activities[0].name, "Memcpy DtoH");
  EXPECT_EQ(activities[0].correlation, 5u);
  EXPECT_EQ(activities[0].launch_ns, stamped.launch_ns);
  EXPECT_EQ(activities[0].start_ns, 10);
  EXPECT_EQ(activities[0].copy_kind, CopyKind::DeviceToHost);
  EXPECT_EQ(activities[1].kind, ActivityKind::Synchronize);
  EXPECT_STREQ(activities[1].name, "npuStreamSynchronize");
}

TEST(EmuTracing, KernelsRunOnTheCallersThreadAreTimedThere) {
  EmuStream stream(0, 3, 0, testing::inlineConfig());
  tracing::start();
  tracing::pushCorrelation(11);
  stream.launch("inline", [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); }, 0);
  EXPECT_TRUE(stream.runIfIdle("in_place", [] {}, 16));
  tracing::popCorrelation();
  auto activities = tracing::stop();
  ASSERT_EQ(activities.size(), 2u);
  for (const auto& a : activities) {
    EXPECT_EQ(a.kind, ActivityKind::Kernel);
    EXPECT_EQ(a.correlation, 11u);
    EXPECT_EQ(a.host_thread, tracing::currentThreadId());
    EXPECT_EQ(a.stream, 3);
  }
  EXPECT_STREQ(activities[0].name, "inline");
  EXPECT_GE(activities[0].end_ns - activities[0].start_ns, 200000);
  EXPECT_STREQ(activities[1].name, "in_place");
  EXPECT_EQ(activities[1].bytes, 16u);
}

}  // namespace
}  // namespace npu::runtime
