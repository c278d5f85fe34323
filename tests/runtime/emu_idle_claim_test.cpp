// The emulator's lock-free claim of an idle stream (EmuStream::state_): many
// threads launching on one stream and on several at once, while others hold
// and synchronize them. Every kernel must run alone on its stream, and its
// position must be the one its launch took: all kernels before it completed,
// none after it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "emu/stream.h"
#include "emu_test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuStream;
using namespace std::chrono_literals;

struct Checked {
  EmuStream stream;
  std::atomic<int> inside{0};        // kernels or holders on the stream now
  std::atomic<int> overlaps{0};
  std::atomic<int> misplaced{0};

  explicit Checked(const emu::LaunchConfig& config, int64_t id) : stream(0, id, 0, config) {}

  void enter() {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
  }
  void leave() { inside.fetch_sub(1); }

  // The kernel's own position, from the stream's completion count: every
  // numbered task before it has completed, none after it.
  uint64_t ownPosition() const {
    uint64_t lo = 0;
    while (stream.passed(lo + 1)) ++lo;
    return lo + 1;
  }

  // One launch from thread `t`: through runIfIdle when idle, else queued.
  void launchOne(int t, int i, std::vector<uint64_t>& slot) {
    const uint64_t before = stream.position();
    auto body = [this, &slot, i] {
      enter();
      slot[i] = ownPosition();
      leave();
    };
    if (((t + i) & 1) != 0 || !stream.runIfIdle("k", body, 0)) stream.launch("k", body, 0);
    slot_bounds_lo[t].push_back(before);  // its position comes after this one
  }
  std::vector<std::vector<uint64_t>> slot_bounds_lo;  // per launching thread
};

void hammer(const std::vector<Checked*>& streams, int launchers, int per_thread) {
  for (Checked* c : streams) c->slot_bounds_lo.assign(launchers, {});
  std::vector<std::vector<std::vector<uint64_t>>> slots(
      streams.size(), std::vector<std::vector<uint64_t>>(launchers, std::vector<uint64_t>(per_thread, 0)));
  std::vector<std::vector<std::vector<uint64_t>>> upper(
      streams.size(), std::vector<std::vector<uint64_t>>(launchers, std::vector<uint64_t>(per_thread, 0)));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < launchers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        const std::size_t s = static_cast<std::size_t>(i + t) % streams.size();
        streams[s]->launchOne(t, i, slots[s][t]);
        upper[s][t][i] = streams[s]->stream.position();
      }
    });
  }
  // A holder and a synchronizer on every stream meanwhile.
  std::thread holder([&] {
    while (!stop.load()) {
      for (Checked* c : streams) {
        c->stream.acquire();
        c->enter();
        std::this_thread::yield();
        c->leave();
        c->stream.release();
      }
    }
  });
  std::thread syncer([&] {
    while (!stop.load()) {
      for (Checked* c : streams) {
        c->stream.synchronize();
        (void)c->stream.query();
      }
    }
  });
  for (auto& th : threads) th.join();
  stop.store(true);
  holder.join();
  syncer.join();
  for (std::size_t s = 0; s < streams.size(); ++s) {
    Checked& c = *streams[s];
    c.stream.synchronize();
    EXPECT_EQ(c.overlaps.load(), 0) << "two kernels (or a kernel and a hold) ran at once on stream " << s;
    std::vector<bool> seen(c.stream.position() + 1, false);
    std::size_t count = 0;
    for (int t = 0; t < launchers; ++t) {
      std::size_t j = 0;
      for (int i = 0; i < per_thread; ++i) {
        if (static_cast<std::size_t>(i + t) % streams.size() != s) continue;
        const uint64_t p = slots[s][t][i];
        const uint64_t lo = c.slot_bounds_lo[t][j++];
        ASSERT_GT(p, lo) << "a kernel ran with a position taken before its launch";
        ASSERT_LE(p, upper[s][t][i]) << "a kernel ran with a position taken after its launch returned";
        ASSERT_FALSE(seen[p]) << "two kernels at position " << p;
        seen[p] = true;
        ++count;
      }
    }
    EXPECT_EQ(count, c.stream.position()) << "every launch is numbered once";
    EXPECT_TRUE(c.stream.passed(c.stream.position()));
  }
}

class EmuIdleClaim : public ::testing::TestWithParam<int> {
 protected:
  emu::LaunchConfig config() const {
    switch (GetParam()) {
      case 0: return testing::inlineConfig();
      case 1: return testing::asyncConfig();
      default: return testing::blockingConfig();
    }
  }
};

TEST_P(EmuIdleClaim, ManyThreadsOnOneStream) {
  Checked c(config(), 1);
  hammer({&c}, 4, GetParam() == 2 ? 300 : 3000);
}

TEST_P(EmuIdleClaim, ManyThreadsOnSeveralStreams) {
  Checked a(config(), 1), b(config(), 2), d(config(), 3);
  hammer({&a, &b, &d}, 4, GetParam() == 2 ? 300 : 3000);
}

INSTANTIATE_TEST_SUITE_P(Policies, EmuIdleClaim, ::testing::Values(0, 1, 2));

TEST(EmuIdleClaim, InlineErrorRaisesOnceAtTheCall) {
  EmuStream stream(0, 1, 0, testing::inlineConfig());
  EXPECT_THROW(stream.runIfIdle("bad", [] { throw std::invalid_argument("shape"); }, 0), std::invalid_argument);
  EXPECT_NO_THROW(stream.synchronize()) << "an error raised at the call is not raised again";
  EXPECT_TRUE(stream.passed(stream.position())) << "the failed kernel still completed its position";
  // launch() on an idle stream runs here too, but reports at the next synchronization, once.
  stream.launch("bad", [] { throw std::runtime_error("async"); }, 0);
  EXPECT_THROW(stream.synchronize(), KernelError);
  EXPECT_NO_THROW(stream.synchronize());
  bool ran = false;
  EXPECT_TRUE(stream.runIfIdle("k", [&] { ran = true; }, 0)) << "an error leaves the stream idle";
  EXPECT_TRUE(ran);
}

TEST(EmuIdleClaim, HoldRequestedWhileAKernelRunsInline) {
  EmuStream stream(0, 1, 0, testing::inlineConfig());
  testing::Gate started, finish;
  std::atomic<bool> kernel_done{false};
  std::thread runner([&] {
    EXPECT_TRUE(stream.runIfIdle("long", [&] {
      started.open();
      finish.wait();
      kernel_done.store(true);
    }, 0));
  });
  ASSERT_TRUE(started.wait());
  std::atomic<bool> held{false};
  std::thread holder([&] {
    stream.acquire();
    held.store(true);
    EXPECT_TRUE(kernel_done.load()) << "the hold began while the inline kernel ran";
    std::this_thread::sleep_for(20ms);
    stream.release();
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(held.load());
  EXPECT_FALSE(stream.runIfIdle("k", [] {}, 0)) << "a hold is queued: nothing runs ahead of it";
  finish.open();
  runner.join();
  // Launched while the hold is queued or held: after it.
  std::atomic<bool> after{false};
  stream.launch("after", [&] { after.store(held.load()); }, 0);
  holder.join();
  stream.synchronize();
  EXPECT_TRUE(after.load()) << "a kernel launched behind a hold ran before it";
}

}  // namespace
}  // namespace npu::runtime
