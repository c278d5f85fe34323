// Emulator-specific tests of stream order for host work: heldByCaller() (the
// emulator's own), runIfIdle under its launch policies, and how it numbers
// positions. Holds, waits, failures carried by events and positions as every
// HAL must provide them are tested by the conformance suite
// (conformance_ordering_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "emu/stream.h"
#include "hal.h"
#include "emu_test_util.h"

namespace npu::runtime {
namespace {

using emu::EmuStream;
using testing::asyncConfig;
using testing::Gate;
using testing::inlineConfig;

// ---- holds ---------------------------------------------------------------------------

TEST(EmuHold, HeldByCallerTracksTheHoldingThreadAndItsDepth) {
  for (bool always_enqueue : {false, true}) {
    EmuStream stream(0, 1, 0, always_enqueue ? asyncConfig() : inlineConfig());
    EXPECT_FALSE(stream.heldByCaller());
    stream.acquire();
    stream.acquire();
    EXPECT_TRUE(stream.heldByCaller());
    bool other_sees_hold = true;
    std::thread([&] { other_sees_hold = stream.heldByCaller(); }).join();
    EXPECT_FALSE(other_sees_hold);
    stream.release();
    EXPECT_TRUE(stream.heldByCaller());
    stream.release();
    EXPECT_FALSE(stream.heldByCaller());
  }
}

// ---- runIfIdle -------------------------------------------------------------------

TEST(EmuRunIfIdle, RunsOnAnIdleInlineStreamAndPropagatesTheError) {
  EmuStream stream(0, 1, 0, inlineConfig());
  bool ran = false;
  EXPECT_TRUE(stream.runIfIdle("k", [&] { ran = true; }, 0));
  EXPECT_TRUE(ran);
  EXPECT_THROW(stream.runIfIdle("bad", [] { throw std::invalid_argument("shape"); }, 0), std::invalid_argument);
  EXPECT_FALSE(stream.hasPendingError());  // raised at the call, not kept
  EXPECT_NO_THROW(stream.synchronize());
  EXPECT_TRUE(stream.runIfIdle("after", [] {}, 0));  // the stream keeps working
}

TEST(EmuRunIfIdle, RefusesWhenBusyOrAlwaysEnqueue) {
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

// ---- positions ---------------------------------------------------------------------

TEST(EmuPositions, EveryLaunchCountsOneAndTheHoldersWorkNone) {
  EmuStream stream(0, 1, 0, inlineConfig(/*inline_bytes=*/100));
  const uint64_t start = stream.position();
  Gate gate;
  stream.launch("slow", [&] { gate.wait(); }, 1000);  // queued: over the inline size
  stream.launch("next", [] {}, 0);
  EXPECT_EQ(stream.position(), start + 2);
  gate.open();
  stream.acquire();
  stream.launch("holders", [] {}, 0);
  EXPECT_EQ(stream.position(), start + 2);
  stream.release();
  EXPECT_TRUE(stream.passed(start + 2));
}

}  // namespace
}  // namespace npu::runtime
