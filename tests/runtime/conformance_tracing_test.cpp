// The HAL conformance suite (conformance.h), part 4: the profiling duty. What
// a HAL reports to runtime/tracing.h while a profiler runs: kernels and copies
// with their launch's correlation id, thread and time, timed where they ran;
// host waits for a stream; nothing for event markers.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"
#include "tracing.h"

namespace npu::runtime {
namespace {

using testing::Blocker;
using testing::HalContract;
using tracing::Activity;
using tracing::ActivityKind;
using namespace std::chrono_literals;

void busyFor(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

std::vector<Activity> ofKind(const std::vector<Activity>& activities, ActivityKind kind) {
  std::vector<Activity> out;
  std::copy_if(activities.begin(), activities.end(), std::back_inserter(out),
               [kind](const Activity& a) { return a.kind == kind; });
  return out;
}

std::vector<Activity> deviceWork(const std::vector<Activity>& activities) {
  std::vector<Activity> out;
  std::copy_if(activities.begin(), activities.end(), std::back_inserter(out), [](const Activity& a) {
    return a.kind == ActivityKind::Kernel || a.kind == ActivityKind::Memcpy;
  });
  return out;
}

class TracingContract : public HalContract {
 protected:
  void TearDown() override {
    tracing::stop();  // a failed test must not leave tracing on for the next
    HalContract::TearDown();
  }
};
NPU_HAL_CONFORMANCE(TracingContract);

TEST_P(TracingContract, NothingIsRecordedWhenOff) {
  tracing::stop();
  Stream& stream = dev().defaultStream();
  stream.launch("k", [] {}, 0);
  stream.synchronize();
  tracing::start();
  EXPECT_TRUE(tracing::stop().empty());
}

TEST_P(TracingContract, KernelsCarryTheirLaunchersCorrelationAndAreTimedWhereTheyRan) {
  Stream& stream = dev().defaultStream();
  tracing::start();
  const int64_t before = tracing::nowNs();
  tracing::pushCorrelation(41);
  stream.launch("first", [] { busyFor(200us); }, 64);
  tracing::pushCorrelation(42);  // nested op: the innermost id wins
  stream.launch("second", [] {}, 0);
  tracing::popCorrelation();
  tracing::popCorrelation();
  stream.launch("outside", [] {}, 0);
  stream.synchronize();
  const int64_t after = tracing::nowNs();
  auto kernels = deviceWork(tracing::stop());
  ASSERT_EQ(kernels.size(), 3u);
  EXPECT_STREQ(kernels[0].name, "first");
  EXPECT_STREQ(kernels[1].name, "second");
  EXPECT_STREQ(kernels[2].name, "outside");
  EXPECT_EQ(kernels[0].correlation, 41u);
  EXPECT_EQ(kernels[1].correlation, 42u);
  EXPECT_EQ(kernels[2].correlation, 0u);
  EXPECT_EQ(kernels[0].bytes, 64u);
  EXPECT_GE(kernels[0].end_ns - kernels[0].start_ns, 200000);
  for (const auto& a : kernels) {
    EXPECT_EQ(a.kind, ActivityKind::Kernel);
    EXPECT_EQ(a.device, dev().index());
    EXPECT_EQ(a.stream, stream.id());
    EXPECT_EQ(a.host_thread, tracing::currentThreadId());  // the launching thread
    EXPECT_LE(before, a.launch_ns);
    EXPECT_LE(a.launch_ns, a.start_ns);
    EXPECT_LE(a.start_ns, a.end_ns);
    EXPECT_LE(a.end_ns, after);
  }
  EXPECT_LE(kernels[0].end_ns, kernels[1].start_ns);  // stream order
  EXPECT_LE(kernels[1].end_ns, kernels[2].start_ns);
}

TEST_P(TracingContract, QueuedWorkKeepsItsLaunchStampAndABlockingSynchronizeIsAHostWait) {
  Stream& stream = dev().defaultStream();
  tracing::start();
  Blocker blocker(stream, "blocked", /*correlation=*/7);
  tracing::pushCorrelation(8);
  const int64_t launched = tracing::nowNs();
  stream.launch("later", [] {}, 0);
  std::thread opener([&] {
    std::this_thread::sleep_for(5ms);
    blocker.release();
  });
  stream.synchronize();  // the host waits for the device
  tracing::popCorrelation();
  opener.join();
  auto activities = tracing::stop();
  auto kernels = deviceWork(activities);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_STREQ(kernels[0].name, "blocked");
  EXPECT_EQ(kernels[0].correlation, 7u);  // its launching thread's
  EXPECT_NE(kernels[0].host_thread, tracing::currentThreadId());
  EXPECT_STREQ(kernels[1].name, "later");
  EXPECT_EQ(kernels[1].correlation, 8u);
  EXPECT_EQ(kernels[1].host_thread, tracing::currentThreadId());
  EXPECT_GE(kernels[1].launch_ns, launched);
  EXPECT_GE(kernels[1].start_ns, kernels[0].end_ns);  // stream order
  EXPECT_GE(kernels[1].start_ns - kernels[1].launch_ns, 4000000) << "it ran behind the blocker";
  auto waits = ofKind(activities, ActivityKind::Synchronize);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_STREQ(waits[0].name, tracing::kStreamSynchronize);
  EXPECT_EQ(waits[0].correlation, 8u);
  EXPECT_EQ(waits[0].host_thread, tracing::currentThreadId());
  EXPECT_EQ(waits[0].stream, stream.id());
  EXPECT_GE(waits[0].end_ns, kernels[1].end_ns);
}

TEST_P(TracingContract, AHoldBehindQueuedWorkIsAHostWait) {
  Stream& stream = dev().defaultStream();
  tracing::start();
  Blocker blocker(stream);
  std::thread opener([&] {
    std::this_thread::sleep_for(5ms);
    blocker.release();
  });
  stream.acquire();
  stream.release();
  opener.join();
  auto waits = ofKind(tracing::stop(), ActivityKind::Synchronize);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_STREQ(waits[0].name, tracing::kStreamWait);
  EXPECT_EQ(waits[0].stream, stream.id());
  EXPECT_GE(waits[0].end_ns - waits[0].start_ns, 1000000);
}

TEST_P(TracingContract, CopiesAreMemcpyActivitiesAndEventMarkersAreNotReported) {
  Device& device = dev();
  Stream& stream = device.defaultStream();
  std::vector<char> a(1000, 'x'), b(1000);
  auto* block = device.allocate(1000);
  ASSERT_NE(block, nullptr);
  auto event = device.createEvent(true);
  tracing::start();
  tracing::pushCorrelation(3);
  stream.copy(block, a.data(), a.size(), CopyKind::HostToDevice);
  event->record(stream);
  stream.copy(b.data(), block, b.size(), CopyKind::DeviceToHost);
  tracing::popCorrelation();
  event->synchronize();
  stream.synchronize();
  auto work = deviceWork(tracing::stop());
  ASSERT_EQ(work.size(), 2u);
  for (const auto& w : work) {
    EXPECT_EQ(w.kind, ActivityKind::Memcpy);
    EXPECT_EQ(w.bytes, 1000u);
    EXPECT_EQ(w.correlation, 3u);
  }
  EXPECT_STREQ(work[0].name, "Memcpy HtoD");
  EXPECT_EQ(work[0].copy_kind, CopyKind::HostToDevice);
  EXPECT_STREQ(work[1].name, "Memcpy DtoH");
  EXPECT_EQ(work[1].copy_kind, CopyKind::DeviceToHost);
  EXPECT_EQ(b[999], 'x');
  device.free(block);
}

}  // namespace
}  // namespace npu::runtime
