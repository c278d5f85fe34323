// Tests of the emulated NPU's streams and events: ordering, asynchrony, the
// inline fast path, error reporting, blocking mode, events and copies.
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
#include "test_util.h"

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

// ---- asynchronous streams (always_enqueue) ------------------------------------

TEST(AsyncStream, KernelsRunInFifoOrderOnOneWorkerThread) {
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

TEST(AsyncStream, LaunchReturnsBeforeASlowKernelFinishes) {
  EmuStream stream(0, 1, 0, asyncConfig());
  EXPECT_TRUE(stream.query());  // nothing queued yet
  Gate gate;
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::atomic<bool> gate_timed_out{false};
  stream.launch("slow", [&] {
    started = true;
    if (!gate.wait()) gate_timed_out = true;
    finished = true;
  }, 0);
  // launch() returned while the kernel is (or will be) blocked on the gate.
  EXPECT_FALSE(finished.load());
  EXPECT_FALSE(stream.query());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(finished.load());
  EXPECT_FALSE(stream.query());
  gate.open();
  stream.synchronize();
  EXPECT_TRUE(started.load());
  EXPECT_TRUE(finished.load());
  EXPECT_FALSE(gate_timed_out.load());
  EXPECT_TRUE(stream.query());
}

TEST(AsyncStream, SynchronizeWaitsForEveryKernel) {
  EmuStream stream(0, 1, 0, asyncConfig());
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

TEST(AsyncStream, StreamPropertiesAreKept) {
  EmuStream stream(2, 7, -3, asyncConfig());
  EXPECT_EQ(stream.device(), 2);
  EXPECT_EQ(stream.id(), 7);
  EXPECT_EQ(stream.priority(), -3);
}

TEST(AsyncStream, DestructorRunsQueuedWorkFirst) {
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

TEST(AsyncStream, KernelCapturesAreReleasedAfterTheyRun) {
  EmuStream stream(0, 1, 0, asyncConfig());
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
void expectOrderedAndExclusive(EmuStream& stream, int threads_count, int per_thread, int yield_every) {
  std::vector<std::vector<int>> seen(threads_count);
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        stream.launch("k", [&, t, i] {
          if (running.fetch_add(1) != 0) ++overlaps;
          seen[t].push_back(i);
          if (yield_every > 0 && i % yield_every == 0) std::this_thread::yield();
          running.fetch_sub(1);
        }, 0);
      }
    });
  }
  for (auto& th : threads) th.join();
  stream.synchronize();
  EXPECT_EQ(overlaps.load(), 0);
  for (int t = 0; t < threads_count; ++t) {
    ASSERT_EQ(seen[t].size(), static_cast<std::size_t>(per_thread));
    for (int i = 0; i < per_thread; ++i) ASSERT_EQ(seen[t][i], i);
  }
}

TEST(AsyncStream, ManyLaunchingThreadsKeepPerThreadOrderAndNeverOverlap) {
  EmuStream stream(0, 1, 0, asyncConfig());
  expectOrderedAndExclusive(stream, 4, 500, 0);
}

// ---- the inline fast path (always_enqueue = false) ----------------------------

TEST(InlineStream, IdleStreamRunsTheKernelOnTheCallersThread) {
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

TEST(InlineStream, KernelsOverInlineBytesAreQueued) {
  EmuStream stream(0, 1, 0, inlineConfig(/*inline_bytes=*/1024));
  std::thread::id small_on, big_on;
  stream.launch("small", [&] { small_on = std::this_thread::get_id(); }, 1024);
  EXPECT_EQ(small_on, std::this_thread::get_id());
  stream.launch("big", [&] { big_on = std::this_thread::get_id(); }, 1025);
  stream.synchronize();
  EXPECT_NE(big_on, std::thread::id());
  EXPECT_NE(big_on, std::this_thread::get_id());
}

TEST(InlineStream, BusyStreamQueuesLaterKernelsInOrder) {
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

TEST(InlineStream, ManyLaunchingThreadsKeepPerThreadOrderAndNeverOverlap) {
  EmuStream stream(0, 1, 0, inlineConfig());
  expectOrderedAndExclusive(stream, 4, 2000, 64);
}

TEST(InlineStream, ErrorsAreReportedAtSynchronizeNotAtLaunch) {
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

// ---- errors -------------------------------------------------------------------

TEST(StreamErrors, ReportedOnceAtTheNextSynchronize) {
  EmuStream stream(0, 1, 0, asyncConfig());
  std::atomic<bool> after{false};
  EXPECT_NO_THROW(stream.launch("exploding_kernel", [] { throw std::runtime_error("boom"); }, 0));
  EXPECT_NO_THROW(stream.launch("after", [&] { after = true; }, 0));
  try {
    stream.synchronize();
    FAIL() << "synchronize() did not throw";
  } catch (const KernelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exploding_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("boom"), std::string::npos) << what;
    EXPECT_EQ(e.kernel(), "exploding_kernel");
  }
  EXPECT_TRUE(after.load());  // kernels after the failing one still ran
  EXPECT_FALSE(stream.hasPendingError());
  EXPECT_NO_THROW(stream.synchronize());  // reported once

  // The stream keeps working, and a later failure is reported again.
  std::atomic<int> more{0};
  stream.launch("more", [&] { ++more; }, 0);
  stream.launch("again", [] { throw std::runtime_error("boom2"); }, 0);
  EXPECT_THROW(stream.synchronize(), KernelError);
  EXPECT_EQ(more.load(), 1);
}

TEST(StreamErrors, OnlyTheFirstOfSeveralErrorsIsKept) {
  EmuStream stream(0, 1, 0, asyncConfig());
  stream.launch("first", [] { throw std::runtime_error("one"); }, 0);
  stream.launch("second", [] { throw std::runtime_error("two"); }, 0);
  try {
    stream.synchronize();
    FAIL() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "first");
    EXPECT_NE(std::string(e.what()).find("one"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(stream.synchronize());
}

TEST(StreamErrors, NonStandardExceptionsAreKeptToo) {
  EmuStream stream(0, 1, 0, asyncConfig());
  stream.launch("throws_int", [] { throw 42; }, 0);
  try {
    stream.synchronize();
    FAIL() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "throws_int");
  }
}

TEST(StreamErrors, QueryDoesNotThrowOrConsumeTheError) {
  EmuStream stream(0, 1, 0, asyncConfig());
  stream.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
  auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (!stream.query() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(stream.query());
  EXPECT_TRUE(stream.hasPendingError());
  EXPECT_THROW(stream.synchronize(), KernelError);
}

// ---- blocking mode (NPU_LAUNCH_BLOCKING) --------------------------------------

TEST(BlockingStream, FailingKernelThrowsAtLaunch) {
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

TEST(BlockingStream, KernelsCompleteBeforeLaunchReturns) {
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

// ---- events -------------------------------------------------------------------

TEST(Events, UnrecordedEvent) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  auto event = device.createEvent(false);
  EXPECT_FALSE(event->recorded());
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(event->synchronize());
  EXPECT_EQ(event->device(), 0);
}

TEST(Events, RecordQuerySynchronize) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& stream = device.createStream(0);
  auto event = device.createEvent(false);
  Gate gate;
  std::atomic<bool> done{false};
  stream.launch("slow", [&] {
    gate.wait();
    done = true;
  }, 0);
  event->record(stream);
  EXPECT_TRUE(event->recorded());
  EXPECT_FALSE(event->query());
  std::thread opener([&] {
    std::this_thread::sleep_for(10ms);
    gate.open();
  });
  event->synchronize();
  EXPECT_TRUE(done.load());  // the event completed after the kernel before it
  EXPECT_TRUE(event->query());
  opener.join();

  // Re-recording moves the event to the new point in the stream.
  Gate gate2;
  stream.launch("slow2", [&] { gate2.wait(); }, 0);
  event->record(stream);
  EXPECT_FALSE(event->query());
  gate2.open();
  event->synchronize();
  EXPECT_TRUE(event->query());
  stream.synchronize();
}

TEST(Events, SynchronizeRaisesTheStreamsKernelError) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& stream = device.createStream(0);
  auto event = device.createEvent(false);
  stream.launch("bad_before_event", [] { throw std::runtime_error("boom"); }, 0);
  event->record(stream);
  try {
    event->synchronize();
    FAIL() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "bad_before_event");
  }
  EXPECT_TRUE(event->query());
}

TEST(Events, ElapsedTimeAroundASleepingKernel) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& stream = device.createStream(0);
  auto start = device.createEvent(true);
  auto end = device.createEvent(true);
  start->record(stream);
  stream.launch("sleep20", [] { std::this_thread::sleep_for(20ms); }, 0);
  end->record(stream);
  end->synchronize();
  start->synchronize();
  const double ms = start->elapsedMs(*end);
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_DOUBLE_EQ(end->elapsedMs(*start), -ms);
}

TEST(Events, ElapsedTimeMisuseThrowsLogicError) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& stream = device.createStream(0);
  auto timed_a = device.createEvent(true);
  auto timed_b = device.createEvent(true);
  auto untimed = device.createEvent(false);

  // Not recorded yet.
  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);

  timed_a->record(stream);
  untimed->record(stream);
  stream.synchronize();
  // Timing not enabled on one or both events.
  EXPECT_THROW(timed_a->elapsedMs(*untimed), std::logic_error);
  EXPECT_THROW(untimed->elapsedMs(*timed_a), std::logic_error);
  EXPECT_THROW(untimed->elapsedMs(*untimed), std::logic_error);
  // The end was never recorded.
  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);

  // The end is recorded but has not completed.
  Gate gate;
  stream.launch("slow", [&] { gate.wait(); }, 0);
  timed_b->record(stream);
  EXPECT_THROW(timed_a->elapsedMs(*timed_b), std::logic_error);
  gate.open();
  timed_b->synchronize();
  EXPECT_GE(timed_a->elapsedMs(*timed_b), 0.0);
}

// ---- cross-stream ordering ----------------------------------------------------

TEST(CrossStream, WaitOrdersWorkAfterAnEventOnAnotherStream) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& a = device.createStream(0);
  Stream& b = device.createStream(0);
  auto event = device.createEvent(false);
  Gate gate;
  std::atomic<int> produced{0};
  std::atomic<int> observed{-1};
  a.launch("producer", [&] {
    gate.wait();
    std::this_thread::sleep_for(10ms);
    produced.store(1);
  }, 0);
  event->record(a);
  b.wait(*event);  // returns at once: the waiting happens on b's worker
  b.launch("consumer", [&] { observed.store(produced.load()); }, 0);
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(observed.load(), -1);  // b is held back behind the event
  EXPECT_FALSE(b.query());
  gate.open();
  b.synchronize();
  EXPECT_EQ(observed.load(), 1);
  a.synchronize();
}

TEST(CrossStream, WaitOnAnUnrecordedOrCompletedEventDoesNotBlock) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& a = device.createStream(0);
  Stream& b = device.createStream(0);
  auto event = device.createEvent(false);
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

TEST(CrossStream, WaitOnTheSameStreamIsANoOp) {
  EmuDevice device(0, 1 * MiB, asyncConfig());
  Stream& a = device.createStream(0);
  auto event = device.createEvent(false);
  std::vector<int> order;
  a.launch("one", [&] { order.push_back(1); }, 0);
  event->record(a);
  a.wait(*event);
  a.launch("two", [&] { order.push_back(2); }, 0);
  a.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// ---- copies -------------------------------------------------------------------

TEST(Copy, StreamOrderedMemcpyRoundTrip) {
  EmuHal hal(1, 1 * MiB, asyncConfig());
  Device& device = hal.device(0);
  Stream& stream = device.createStream(0);
  constexpr std::size_t n = 4096 + 3;
  auto* host_src = static_cast<unsigned char*>(hal.hostAllocate(n));
  auto* host_dst = static_cast<unsigned char*>(hal.hostAllocate(n));
  auto* dev_a = static_cast<unsigned char*>(device.allocate(n));
  auto* dev_b = static_cast<unsigned char*>(device.allocate(n));
  ASSERT_TRUE(host_src && host_dst && dev_a && dev_b);
  std::memset(host_src, 0, n);
  std::memset(host_dst, 0, n);

  // The source is written by a kernel that is held back: the copies must
  // wait for it, in stream order.
  Gate gate;
  stream.launch("fill", [&] {
    gate.wait();
    for (std::size_t i = 0; i < n; ++i) host_src[i] = static_cast<unsigned char>(i * 7 + 1);
  }, n);
  stream.copy(dev_a, host_src, n, CopyKind::HostToDevice);
  stream.copy(dev_b, dev_a, n, CopyKind::DeviceToDevice);
  stream.copy(host_dst, dev_b, n, CopyKind::DeviceToHost);
  stream.copy(host_dst, dev_a, 0, CopyKind::DeviceToHost);  // zero bytes: nothing
  EXPECT_FALSE(stream.query());
  gate.open();
  stream.synchronize();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(host_dst[i], static_cast<unsigned char>(i * 7 + 1)) << "byte " << i;
  }

  device.free(dev_a);
  device.free(dev_b);
  hal.hostFree(host_src);
  hal.hostFree(host_dst);
}

TEST(Copy, InlineCopyIsImmediateOnAnIdleStream) {
  EmuDevice device(0, 1 * MiB, inlineConfig());
  char src[16] = "hello, npu";
  char dst[16] = {};
  device.defaultStream().copy(dst, src, sizeof(src), CopyKind::HostToDevice);
  EXPECT_STREQ(dst, "hello, npu");
}

}  // namespace
}  // namespace npu::runtime
