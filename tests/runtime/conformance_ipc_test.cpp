// The HAL conformance suite (conformance.h), part 5: sharing memory and events
// between processes (Capabilities::interprocess, optional). A HAL with the
// capability is tested in one process (a handle opened by its own process is
// the contract too) and across a fork; one without it must throw Unsupported,
// naming what is missing.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "conformance.h"

namespace npu::runtime {
namespace {

using testing::HalContract;
using namespace std::chrono_literals;

class InterprocessContract : public HalContract {};
NPU_HAL_CONFORMANCE(InterprocessContract);

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_P(InterprocessContract, WithoutTheCapabilityEveryMethodSaysSo) {
  if (caps().interprocess) GTEST_SKIP() << GetParam() << " has interprocess";
  void* p = dev().allocate(64);
  ASSERT_NE(p, nullptr);
  auto expectUnsupported = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no Unsupported";
    } catch (const Unsupported& e) {
      EXPECT_TRUE(mentions(e.what(), "not supported by this HAL")) << e.what();
      EXPECT_TRUE(mentions(e.what(), "interprocess")) << e.what();
    }
  };
  std::size_t offset = 0;
  expectUnsupported([&] { dev().exportMemory(p, &offset); });
  expectUnsupported([&] { dev().openMemory(std::string(56, 'x')); });
  expectUnsupported([&] { dev().closeMemory(p); });
  expectUnsupported([&] { dev().createInterprocessEvent(); });
  expectUnsupported([&] { dev().openEvent(std::string(56, 'x')); });
  EXPECT_THROW(dev().createEvent(false)->ipcHandle(), std::logic_error);  // Unsupported is one
  dev().free(p);
}

TEST_P(InterprocessContract, AnOpenedAllocationIsTheSameMemory) {
  NPU_REQUIRE_CAPABILITY(interprocess);
  NPU_REQUIRE_CAPABILITY(host_addressable);
  auto* p = static_cast<char*>(dev().allocate(3 * 4096 + 100));
  ASSERT_NE(p, nullptr);
  std::size_t offset = 1;
  const std::string handle = dev().exportMemory(p, &offset);
  EXPECT_EQ(offset, 0u);
  EXPECT_LE(handle.size(), 64u);
  std::size_t inner = 0;
  EXPECT_EQ(dev().exportMemory(p + 5000, &inner), handle) << "an interior pointer names its allocation";
  EXPECT_EQ(inner, 5000u);

  auto* q = static_cast<char*>(dev().openMemory(handle));
  ASSERT_NE(q, nullptr);
  std::memcpy(p + 5000, "producer", 9);
  EXPECT_STREQ(q + 5000, "producer");
  std::memcpy(q + 12000, "consumer", 9);
  EXPECT_STREQ(p + 12000, "consumer");
  auto* again = static_cast<char*>(dev().openMemory(handle));
  std::memcpy(again + 100, "again", 6);
  EXPECT_STREQ(p + 100, "again");
  dev().closeMemory(again);
  dev().closeMemory(q);
  EXPECT_THROW(dev().exportMemory(p + 4 * 4096, &offset), std::invalid_argument);
  dev().free(p);
  EXPECT_THROW(dev().exportMemory(p, &offset), std::invalid_argument) << "a freed allocation has no handle";
  EXPECT_THROW(dev().openMemory("not a handle"), std::invalid_argument);
}

// A forked child (which starts no HAL of its own: it only maps) writes into the
// parent's allocation and records the parent's event after its write.
TEST_P(InterprocessContract, AnotherProcessWritesAndSignals) {
  NPU_REQUIRE_CAPABILITY(interprocess);
  NPU_REQUIRE_CAPABILITY(host_addressable);
  auto* p = static_cast<char*>(dev().allocate(4096));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0, 4096);
  const std::string memory = dev().exportMemory(p, nullptr);
  auto event = dev().createInterprocessEvent();
  const std::string event_handle = event->ipcHandle();
  EXPECT_FALSE(event->recorded());
  // The parent records first, on a stream blocked until the child has written:
  // the event completes only then.
  Stream& stream = dev().defaultStream();
  testing::Blocker blocker(stream, "wait_for_child");
  ASSERT_TRUE(blocker.started());
  event->record(stream);
  EXPECT_TRUE(event->recorded());
  EXPECT_FALSE(event->query());

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only the handles cross: a fresh mapping of the parent's memory.
    auto fresh = createHal(GetParam());
    Device& d = fresh->device(0);
    auto* q = static_cast<char*>(d.openMemory(memory));
    std::memcpy(q + 10, "from the child", 15);
    auto opened = d.openEvent(event_handle);
    const bool waited_for_parent = !opened->query();  // the parent's record has not completed
    d.closeMemory(q);
    _exit(waited_for_parent ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw the event complete before the parent's stream reached it";
  EXPECT_STREQ(p + 10, "from the child");
  blocker.release();
  event->synchronize();
  EXPECT_TRUE(event->query());
  dev().free(p);
}

TEST_P(InterprocessContract, AnOpenedEventTracksTheLatestRecordAndOrdersStreams) {
  NPU_REQUIRE_CAPABILITY(interprocess);
  auto event = dev().createInterprocessEvent();
  auto opened = dev().openEvent(event->ipcHandle());
  EXPECT_TRUE(opened->query()) << "never recorded: complete";
  std::atomic<int> order{0};
  std::atomic<int> waiter_saw{-1};
  Stream& a = dev().defaultStream();
  auto blocker = std::make_unique<testing::Blocker>(a, "gate");
  ASSERT_TRUE(blocker->started());
  a.launch("after_gate", [&] { order = 1; });
  event->record(a);
  EXPECT_FALSE(opened->query());
  if (caps().multiple_streams && caps().async_streams) {
    Stream& b = dev().createStream(0);
    b.wait(*opened);  // never blocks the host
    b.launch("after", [&] { waiter_saw = order.load(); });
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(waiter_saw.load(), -1) << "the waiting stream ran before the event completed";
    blocker->release();
    b.synchronize();
    EXPECT_EQ(waiter_saw.load(), 1);
  } else {
    blocker->release();
  }
  opened->synchronize();
  EXPECT_TRUE(event->query());
  // Recording the opened event moves the mark of the original too.
  blocker = std::make_unique<testing::Blocker>(a, "gate_again");
  opened->record(a);
  EXPECT_FALSE(event->query());
  blocker->release();
  event->synchronize();
  EXPECT_TRUE(opened->query());
  EXPECT_THROW(dev().createEvent(false)->ipcHandle(), std::logic_error);
}

}  // namespace
}  // namespace npu::runtime
