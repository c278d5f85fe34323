// The HAL conformance suite (conformance.h), part 2: stream order and
// asynchrony, kernel errors, NPU_LAUNCH_BLOCKING, events, waits between
// streams, copies.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "conformance.h"

namespace npu::runtime {
namespace {

using testing::Blocker;
using testing::HalContract;
using testing::ScopedEnv;
using namespace std::chrono_literals;

// ---- stream order and asynchrony ---------------------------------------------------

class StreamContract : public HalContract {};
NPU_HAL_CONFORMANCE(StreamContract);

TEST_P(StreamContract, KernelsRunInLaunchOrder) {
  Stream& stream = dev().defaultStream();
  constexpr int kKernels = 1000;
  std::vector<int> order;
  order.reserve(kKernels);
  for (int i = 0; i < kKernels; ++i) stream.launch("append", [&order, i] { order.push_back(i); }, 0);
  stream.synchronize();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kKernels));
  for (int i = 0; i < kKernels; ++i) ASSERT_EQ(order[i], i) << "at position " << i;
  EXPECT_TRUE(stream.query());
}

TEST_P(StreamContract, LaunchReturnsBeforeQueuedWorkRuns) {
  NPU_REQUIRE_CAPABILITY(async_streams);
  Stream& stream = dev().defaultStream();
  EXPECT_TRUE(stream.query());  // nothing queued yet
  Blocker blocker(stream);
  ASSERT_TRUE(blocker.started());
  std::atomic<bool> ran{false};
  stream.launch("later", [&] { ran = true; }, 0);
  EXPECT_FALSE(ran.load());  // launch() returned with the kernel queued
  EXPECT_FALSE(stream.query());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran.load());
  EXPECT_FALSE(stream.query());
  blocker.release();
  stream.synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(stream.query());
}

TEST_P(StreamContract, SynchronizeWaitsForEveryKernel) {
  Stream& stream = dev().defaultStream();
  std::atomic<int> done{0};
  for (int i = 0; i < 10; ++i) {
    stream.launch("sleepy", [&done] {
      std::this_thread::sleep_for(2ms);
      ++done;
    }, 0);
  }
  stream.synchronize();
  EXPECT_EQ(done.load(), 10);
  EXPECT_TRUE(stream.query());
  // Synchronising an idle stream returns at once, repeatedly.
  stream.synchronize();
  stream.synchronize();
}

// The last kernel has left the queue but still runs: the stream is not idle.
TEST_P(StreamContract, ARunningKernelKeepsTheStreamBusy) {
  Stream& stream = dev().defaultStream();
  Blocker blocker(stream);
  ASSERT_TRUE(blocker.started());
  EXPECT_FALSE(stream.query());
  std::atomic<bool> synchronized{false};
  std::atomic<bool> drained{false};
  std::thread syncer([&] {
    stream.synchronize();
    synchronized = true;
  });
  std::thread drainer([&] {
    stream.drain();
    drained = true;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(synchronized.load());
  EXPECT_FALSE(drained.load());
  EXPECT_FALSE(stream.query());
  blocker.release();
  syncer.join();
  drainer.join();
  EXPECT_TRUE(synchronized.load());
  EXPECT_TRUE(drained.load());
  EXPECT_TRUE(stream.query());
}

TEST_P(StreamContract, KernelCapturesAreReleasedAfterTheyRun) {
  Stream& stream = dev().defaultStream();
  auto payload = std::make_shared<int>(42);
  std::weak_ptr<int> watch = payload;
  std::atomic<int> seen{0};
  stream.launch("capture", [payload, &seen] { seen = *payload; }, 0);
  payload.reset();
  stream.synchronize();
  EXPECT_EQ(seen.load(), 42);
  EXPECT_TRUE(watch.expired());
}

// Several threads launch onto one stream: each thread's kernels run in its
// order, and no two kernels of the stream ever run at the same time.
TEST_P(StreamContract, ManyLaunchingThreadsKeepPerThreadOrderAndNeverOverlap) {
  Stream& stream = dev().defaultStream();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1000;
  std::vector<std::vector<int>> seen(kThreads);
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        stream.launch("k", [&, t, i] {
          if (running.fetch_add(1) != 0) ++overlaps;
          seen[t].push_back(i);
          if (i % 64 == 0) std::this_thread::yield();
          running.fetch_sub(1);
        }, 0);
      }
    });
  }
  for (auto& th : threads) th.join();
  stream.synchronize();
  EXPECT_EQ(overlaps.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(seen[t].size(), static_cast<std::size_t>(kPerThread));
    for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(seen[t][i], i);
  }
}

// ---- kernel errors -------------------------------------------------------------------

TEST_P(StreamContract, AnErrorIsReportedOnceAtTheNextSynchronize) {
  Stream& stream = dev().defaultStream();
  std::atomic<bool> after{false};
  EXPECT_NO_THROW(stream.launch("exploding_kernel", [] { throw std::runtime_error("boom"); }, 0));
  EXPECT_NO_THROW(stream.launch("after", [&] { after = true; }, 0));
  try {
    stream.synchronize();
    ADD_FAILURE() << "synchronize() did not throw";
  } catch (const KernelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exploding_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("boom"), std::string::npos) << what;
    EXPECT_EQ(e.kernel(), "exploding_kernel");
    EXPECT_EQ(e.failure().device, dev().index());
    EXPECT_EQ(e.failure().stream, stream.id());
    EXPECT_EQ(e.failure().message, "boom");
    EXPECT_THROW(std::rethrow_exception(e.failure().cause), std::runtime_error);
  }
  EXPECT_TRUE(after.load());  // kernels after the failing one still ran
  EXPECT_NO_THROW(stream.synchronize());  // reported once

  // The stream keeps working, and a later failure is reported again.
  std::atomic<int> more{0};
  stream.launch("more", [&] { ++more; }, 0);
  stream.launch("again", [] { throw std::runtime_error("boom2"); }, 0);
  EXPECT_THROW(stream.synchronize(), KernelError);
  EXPECT_EQ(more.load(), 1);
}

TEST_P(StreamContract, OnlyTheFirstOfSeveralErrorsIsKept) {
  Stream& stream = dev().defaultStream();
  stream.launch("first", [] { throw std::runtime_error("one"); }, 0);
  stream.launch("second", [] { throw std::runtime_error("two"); }, 0);
  try {
    stream.synchronize();
    ADD_FAILURE() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "first");
    EXPECT_NE(std::string(e.what()).find("one"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(stream.synchronize());
}

TEST_P(StreamContract, NonStandardExceptionsAreKeptToo) {
  Stream& stream = dev().defaultStream();
  stream.launch("throws_int", [] { throw 42; }, 0);
  try {
    stream.synchronize();
    ADD_FAILURE() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "throws_int");
  }
}

TEST_P(StreamContract, QueryNeitherRaisesNorConsumesAnError) {
  Stream& stream = dev().defaultStream();
  stream.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
  const auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (!stream.query() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(stream.query());
  EXPECT_TRUE(stream.query());
  EXPECT_THROW(stream.synchronize(), KernelError);
}

TEST_P(StreamContract, LaunchBlockingRunsAndRaisesAtTheLaunch) {
  std::unique_ptr<Hal> blocking;
  {
    ScopedEnv env("NPU_LAUNCH_BLOCKING", "1");
    blocking = createHal(GetParam());
  }
  Device& device = blocking->device(0);
  EXPECT_FALSE(device.capabilities().async_streams);
  Stream& stream = device.defaultStream();
  try {
    stream.launch("blocking_bad", [] { throw std::runtime_error("boom"); }, 0);
    ADD_FAILURE() << "launch() did not throw";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "blocking_bad");
  }
  EXPECT_NO_THROW(stream.synchronize());  // nothing left to report
  std::atomic<bool> done{false};
  stream.launch("slow", [&] {
    std::this_thread::sleep_for(5ms);
    done = true;
  }, 0);
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(stream.query());
}

// ---- events --------------------------------------------------------------------------

class EventContract : public HalContract {};
NPU_HAL_CONFORMANCE(EventContract);

TEST_P(EventContract, AnUnrecordedEventIsComplete) {
  auto event = dev().createEvent(false);
  EXPECT_FALSE(event->recorded());
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(event->synchronize());
  EXPECT_EQ(event->device(), dev().index());
}

TEST_P(EventContract, RecordQuerySynchronize) {
  Stream& stream = dev().defaultStream();
  auto event = dev().createEvent(false);
  std::atomic<bool> done{false};
  {
    Blocker blocker(stream);
    stream.launch("slow", [&] { done = true; }, 0);
    event->record(stream);
    EXPECT_TRUE(event->recorded());
    EXPECT_FALSE(event->query());
    std::thread opener([&] {
      std::this_thread::sleep_for(10ms);
      blocker.release();
    });
    event->synchronize();
    EXPECT_TRUE(done.load());  // the event completed after the kernel before it
    EXPECT_TRUE(event->query());
    opener.join();
  }
  // Recording again moves the event to the new point in the stream.
  Blocker again(stream);
  event->record(stream);
  EXPECT_FALSE(event->query());
  again.release();
  event->synchronize();
  EXPECT_TRUE(event->query());
  stream.synchronize();
}

TEST_P(EventContract, SynchronizeRaisesTheStreamsKernelError) {
  Stream& stream = dev().defaultStream();
  auto event = dev().createEvent(false);
  stream.launch("bad_before_event", [] { throw std::runtime_error("boom"); }, 0);
  event->record(stream);
  try {
    event->synchronize();
    ADD_FAILURE() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "bad_before_event");
  }
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(stream.synchronize());  // reported through the event already
}

TEST_P(EventContract, ElapsedTimeAroundASleepingKernel) {
  Stream& stream = dev().defaultStream();
  auto start = dev().createEvent(true);
  auto end = dev().createEvent(true);
  start->record(stream);
  stream.launch("sleep20", [] { std::this_thread::sleep_for(20ms); }, 0);
  end->record(stream);
  end->synchronize();
  start->synchronize();
  if (!caps().timing_events) {
    EXPECT_THROW(start->elapsedMs(*end), Unsupported);
    return;
  }
  const double ms = start->elapsedMs(*end);
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_DOUBLE_EQ(end->elapsedMs(*start), -ms);
}

TEST_P(EventContract, ElapsedTimeMisuseThrowsLogicError) {
  NPU_REQUIRE_CAPABILITY(timing_events);
  Stream& stream = dev().defaultStream();
  auto timed_a = dev().createEvent(true);
  auto timed_b = dev().createEvent(true);
  auto untimed = dev().createEvent(false);

  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);  // not recorded yet
  timed_a->record(stream);
  untimed->record(stream);
  stream.synchronize();
  // Timing not enabled on one or both events.
  EXPECT_THROW(timed_a->elapsedMs(*untimed), std::logic_error);
  EXPECT_THROW(untimed->elapsedMs(*timed_a), std::logic_error);
  EXPECT_THROW(untimed->elapsedMs(*untimed), std::logic_error);
  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);  // the end was never recorded

  Blocker blocker(stream);
  timed_b->record(stream);
  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);  // recorded, not completed
  blocker.release();
  timed_b->synchronize();
  EXPECT_GE(timed_a->elapsedMs(*timed_b), 0.0);
}

// ---- waits between streams -------------------------------------------------------------

TEST_P(EventContract, WaitOrdersWorkAfterAnEventOnAnotherStream) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Stream& a = dev().createStream(0);
  Stream& b = dev().createStream(0);
  auto event = dev().createEvent(false);
  Blocker blocker(a);
  std::atomic<int> produced{0};
  std::atomic<int> observed{-1};
  a.launch("producer", [&] {
    std::this_thread::sleep_for(10ms);
    produced.store(1);
  }, 0);
  event->record(a);
  const auto t0 = std::chrono::steady_clock::now();
  b.wait(*event);  // returns at once: a marker in b
  b.launch("consumer", [&] { observed.store(produced.load()); }, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "wait() blocked the host";
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(observed.load(), -1);  // b is held back behind the event
  EXPECT_FALSE(b.query());
  blocker.release();
  b.synchronize();
  EXPECT_EQ(observed.load(), 1);
  a.synchronize();
}

TEST_P(EventContract, WaitOnAnUnrecordedOrCompletedEventDoesNotBlock) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Stream& a = dev().createStream(0);
  Stream& b = dev().createStream(0);
  auto event = dev().createEvent(false);
  b.wait(*event);  // never recorded: nothing to wait for
  std::atomic<bool> ran{false};
  b.launch("free", [&] { ran = true; }, 0);
  b.synchronize();
  EXPECT_TRUE(ran.load());

  event->record(a);
  a.synchronize();
  b.wait(*event);
  ran = false;
  b.launch("free2", [&] { ran = true; }, 0);
  b.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST_P(EventContract, WaitOnTheSameStreamIsANoOp) {
  Stream& a = dev().defaultStream();
  auto event = dev().createEvent(false);
  std::vector<int> order;
  a.launch("one", [&] { order.push_back(1); }, 0);
  event->record(a);
  a.wait(*event);
  a.launch("two", [&] { order.push_back(2); }, 0);
  a.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// ---- copies ------------------------------------------------------------------------------

class CopyContract : public HalContract {};
NPU_HAL_CONFORMANCE(CopyContract);

// Host -> device -> device -> host, queued behind a kernel that writes the
// source: the copies wait for it, in stream order.
TEST_P(CopyContract, StreamOrderedRoundTrip) {
  Device& device = dev();
  Stream& stream = device.defaultStream();
  constexpr std::size_t n = 4096 + 3;
  auto* host_src = static_cast<unsigned char*>(impl().hostAllocate(n));
  auto* host_dst = static_cast<unsigned char*>(impl().hostAllocate(n));
  auto* dev_a = static_cast<unsigned char*>(device.allocate(n));
  auto* dev_b = static_cast<unsigned char*>(device.allocate(n));
  ASSERT_TRUE(host_src && host_dst && dev_a && dev_b);
  std::memset(host_src, 0, n);
  std::memset(host_dst, 0, n);
  {
    Blocker blocker(stream);
    stream.launch("fill", [&] {
      for (std::size_t i = 0; i < n; ++i) host_src[i] = static_cast<unsigned char>(i * 7 + 1);
    }, n);
    stream.copy(dev_a, host_src, n, CopyKind::HostToDevice);
    stream.copy(dev_b, dev_a, n, CopyKind::DeviceToDevice);
    stream.copy(host_dst, dev_b, n, CopyKind::DeviceToHost);
    stream.copy(host_dst, dev_a, 0, CopyKind::DeviceToHost);  // zero bytes: nothing
    EXPECT_FALSE(stream.query());
  }
  stream.synchronize();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(host_dst[i], static_cast<unsigned char>(i * 7 + 1)) << "byte " << i;
  }
  device.free(dev_a);
  device.free(dev_b);
  impl().hostFree(host_src);
  impl().hostFree(host_dst);
}

TEST_P(CopyContract, PageableHostMemoryAndInteriorDevicePointers) {
  Device& device = dev();
  Stream& stream = device.defaultStream();
  std::vector<char> src(1000), dst(1000, 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i % 251);
  auto* block = static_cast<char*>(device.allocate(2000));
  ASSERT_NE(block, nullptr);
  stream.copy(block + 500, src.data(), src.size(), CopyKind::HostToDevice);
  stream.copy(dst.data(), block + 500, dst.size(), CopyKind::DeviceToHost);
  stream.synchronize();
  EXPECT_EQ(src, dst);
  device.free(block);
}

}  // namespace
}  // namespace npu::runtime
