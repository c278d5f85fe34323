// The HAL conformance suite (conformance.h), part 3: holding a stream for host
// work, runIfIdle, failures that travel with events, drain, stream positions.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "conformance.h"

namespace npu::runtime {
namespace {

using testing::Blocker;
using testing::HalContract;
using namespace std::chrono_literals;

// ---- holding a stream for host work --------------------------------------------------

class HoldContract : public HalContract {};
NPU_HAL_CONFORMANCE(HoldContract);

TEST_P(HoldContract, AcquireWaitsForEarlierWorkAndOthersQueueBehindTheHold) {
  Stream& stream = dev().defaultStream();
  std::atomic<int> value{0};
  Blocker blocker(stream);
  stream.launch("set1", [&] { value = 1; }, 0);
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    blocker.release();
  });
  stream.acquire();  // returns only after "set1" ran
  EXPECT_EQ(value.load(), 1);
  opener.join();

  // Another thread launches while we hold: its kernel must not run until release.
  std::thread other([&] { stream.launch("later", [&] { value = 2; }, 0); });
  other.join();  // launch() returned: the kernel was queued, not run
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(value.load(), 1) << "a kernel ran while the stream was held";
  stream.release();
  stream.synchronize();
  EXPECT_EQ(value.load(), 2);
}

TEST_P(HoldContract, TheHoldersWorkRunsAtOnceAndItsWaitsReturn) {
  Device& device = dev();
  Stream& stream = device.defaultStream();
  auto* block = static_cast<char*>(device.allocate(64));
  ASSERT_NE(block, nullptr);
  stream.acquire();
  stream.acquire();  // re-entrant
  bool ran = false;
  stream.launch("holder_kernel", [&] { ran = true; }, 0);
  EXPECT_TRUE(ran);
  char in[64] = "host work in stream order";
  char out[64] = {};
  stream.copy(block, in, sizeof(in), CopyKind::HostToDevice);
  stream.copy(out, block, sizeof(out), CopyKind::DeviceToHost);
  EXPECT_STREQ(out, in);  // both copies ran already
  auto event = device.createEvent(false);
  event->record(stream);
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_NO_THROW(stream.drain());
  EXPECT_TRUE(stream.query());
  stream.release();

  // Still held once: another thread's kernel waits for the second release.
  std::atomic<bool> other_ran{false};
  std::thread other([&] { stream.launch("other", [&] { other_ran = true; }, 0); });
  other.join();
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(other_ran.load()) << "the first release() ended a re-entrant hold";
  stream.release();
  stream.synchronize();
  EXPECT_TRUE(other_ran.load());
  device.free(block);
}

TEST_P(HoldContract, TheHolderWaitsOnAnEventItself) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Stream& held = dev().defaultStream();
  Stream& producer = dev().createStream(0);
  std::atomic<int> value{0};
  Blocker blocker(producer);
  producer.launch("produce", [&] { value = 1; }, 0);
  auto event = dev().createEvent(false);
  event->record(producer);
  held.acquire();
  std::thread opener([&] {
    std::this_thread::sleep_for(10ms);
    blocker.release();
  });
  held.wait(*event);  // host work in stream order waits here, as the device would
  EXPECT_EQ(value.load(), 1);
  EXPECT_TRUE(event->query());
  held.release();
  opener.join();
  producer.synchronize();
}

TEST_P(HoldContract, ManyThreadsMixingKernelsAndHoldsNeverOverlap) {
  Stream& stream = dev().defaultStream();
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
  EXPECT_EQ(overlaps.load(), 0);
}

// ---- runIfIdle ----------------------------------------------------------------------------

TEST_P(HoldContract, RunIfIdleRunsInStreamOrderOrNotAtAll) {
  Stream& stream = dev().defaultStream();
  {
    Blocker blocker(stream);
    bool ran = false;
    EXPECT_FALSE(stream.runIfIdle("k", [&] { ran = true; }, 0)) << "ran on a busy stream";
    EXPECT_FALSE(ran);
  }
  stream.synchronize();
  // Idle: a HAL either runs it now, propagating its error, or refuses.
  bool ran = false;
  const bool accepted = stream.runIfIdle("k", [&] { ran = true; }, 0);
  EXPECT_EQ(accepted, ran);
  if (accepted) {
    EXPECT_THROW(stream.runIfIdle("bad", [] { throw std::invalid_argument("shape"); }, 0), std::invalid_argument);
    EXPECT_NO_THROW(stream.synchronize());  // raised at the call, not kept
  }
}

// ---- failures travel with events -------------------------------------------------------

TEST_P(HoldContract, AStreamWaitingOnAFailedStreamInheritsItsErrorOnce) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Stream& s1 = dev().createStream(0);
  Stream& s0 = dev().defaultStream();
  s1.launch("index_kernel", [] { throw std::out_of_range("index 7 is out of bounds"); }, 0);
  auto event = dev().createEvent(false);
  event->record(s1);
  s0.wait(*event);
  try {
    s0.synchronize();
    ADD_FAILURE() << "the waiting stream did not report the failure";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), "index_kernel");
    EXPECT_EQ(e.failure().stream, s1.id());
    EXPECT_EQ(e.failure().launch_index, 1u);  // the first launch on s1
    EXPECT_THROW(std::rethrow_exception(e.failure().cause), std::out_of_range);  // the type is kept
  }
  // Reported once: neither the failed stream nor the event raise it again.
  EXPECT_NO_THROW(s1.synchronize());
  EXPECT_NO_THROW(event->synchronize());
  EXPECT_NO_THROW(dev().synchronize());
}

TEST_P(HoldContract, EventsCarryOnlyFailuresBeforeThem) {
  Stream& s = dev().defaultStream();
  auto before = dev().createEvent(false);
  before->record(s);
  s.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
  auto after = dev().createEvent(false);
  after->record(s);
  EXPECT_NO_THROW(before->synchronize());
  EXPECT_THROW(after->synchronize(), KernelError);
  EXPECT_NO_THROW(s.synchronize());  // reported through the event already
}

TEST_P(HoldContract, DrainWaitsButLeavesTheErrorPending) {
  Stream& stream = dev().defaultStream();
  {
    Blocker blocker(stream);
    stream.launch("bad", [] { throw std::runtime_error("boom"); }, 0);
    std::thread opener([&] {
      std::this_thread::sleep_for(5ms);
      blocker.release();
    });
    stream.drain();
    opener.join();
  }
  EXPECT_TRUE(stream.query());
  EXPECT_THROW(stream.synchronize(), KernelError);

  stream.launch("bad_again", [] { throw std::runtime_error("boom"); }, 0);
  dev().drain();
  EXPECT_TRUE(stream.query());
  EXPECT_THROW(dev().synchronize(), KernelError);
}

// ---- positions ---------------------------------------------------------------------------

TEST_P(HoldContract, PositionsPassInLaunchOrder) {
  Stream& stream = dev().defaultStream();
  const uint64_t start = stream.position();
  EXPECT_TRUE(stream.passed(start));
  Blocker blocker(stream);
  stream.launch("next", [] {}, 0);
  const uint64_t p = stream.position();
  EXPECT_GE(p, start + 2);  // at least one per launch
  EXPECT_FALSE(stream.passed(p));
  EXPECT_TRUE(stream.passed(start));
  blocker.release();
  stream.synchronize();
  EXPECT_TRUE(stream.passed(p));
  EXPECT_TRUE(stream.passed(start));
}

}  // namespace
}  // namespace npu::runtime
