// The HAL conformance suite (conformance.h), part 1: device memory, devices,
// their streams and capabilities, host memory.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "conformance.h"

namespace npu::runtime {
namespace {

using testing::Blocker;
using testing::HalContract;
using namespace std::chrono_literals;

std::size_t freeBytes(Device& device) {
  std::size_t free = 0, total = 0;
  device.memoryInfo(&free, &total);
  return free;
}

// Allocates blocks of a quarter of the capacity until the device says no.
std::vector<void*> fill(Device& device) {
  std::vector<void*> blocks;
  const std::size_t quarter = device.properties().total_memory / 4;
  for (int i = 0; i < 8; ++i) {
    void* p = device.allocate(quarter);
    if (p == nullptr) break;
    blocks.push_back(p);
  }
  return blocks;
}

// ---- device memory ---------------------------------------------------------------

class MemoryContract : public HalContract {};
NPU_HAL_CONFORMANCE(MemoryContract);

TEST_P(MemoryContract, AllocateCountsAndFreeGivesBack) {
  Device& device = dev();
  std::size_t free0 = 0, total = 0;
  device.memoryInfo(&free0, &total);
  EXPECT_EQ(total, device.properties().total_memory);
  EXPECT_GT(total, 0u);
  EXPECT_LE(free0, total);

  auto* a = static_cast<char*>(device.allocate(100));
  auto* b = static_cast<char*>(device.allocate(1000));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a + 100 <= b || b + 1000 <= a) << "the blocks overlap";
  EXPECT_LE(freeBytes(device), free0 - 1100);
  if (caps().host_addressable) {  // what the flag promises
    std::memset(a, 0xab, 100);
    std::memset(b, 0xcd, 1000);
  }
  device.free(a);
  device.free(b);
  EXPECT_EQ(freeBytes(device), free0);
}

TEST_P(MemoryContract, AFullDeviceReturnsNullAndRecoversAfterAFree) {
  Device& device = dev();
  const std::size_t free0 = freeBytes(device);
  EXPECT_EQ(device.allocate(device.properties().total_memory + 1), nullptr);
  EXPECT_EQ(freeBytes(device), free0);  // a failed allocation takes nothing

  auto blocks = fill(device);
  ASSERT_FALSE(blocks.empty());
  ASSERT_LT(blocks.size(), 8u) << "the device never ran out of memory";
  const std::size_t quarter = device.properties().total_memory / 4;
  EXPECT_EQ(device.allocate(quarter), nullptr);
  device.free(blocks.back());
  blocks.pop_back();
  void* again = device.allocate(quarter);
  EXPECT_NE(again, nullptr);
  if (again != nullptr) blocks.push_back(again);
  for (void* p : blocks) device.free(p);
  EXPECT_EQ(freeBytes(device), free0);
}

TEST_P(MemoryContract, HugeRequestsReturnNullInsteadOfWrapping) {
  Device& device = dev();
  const std::size_t free0 = freeBytes(device);
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t n : {max, max - 1, max - 62, max - 63, max - 255, max / 2}) {
    void* p = device.allocate(n);
    EXPECT_EQ(p, nullptr) << n;
    if (p != nullptr) device.free(p);
  }
  EXPECT_EQ(freeBytes(device), free0);
}

TEST_P(MemoryContract, OwnsInteriorPointersOfLiveBlocksOnly) {
  Device& device = dev();
  auto* p = static_cast<char*>(device.allocate(100));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(device.owns(p));
  EXPECT_TRUE(device.owns(p + 1));
  EXPECT_TRUE(device.owns(p + 99));
  EXPECT_FALSE(device.owns(nullptr));
  int on_stack = 0;
  EXPECT_FALSE(device.owns(&on_stack));
  std::unique_ptr<char[]> on_heap(new char[256]);
  EXPECT_FALSE(device.owns(on_heap.get()));
  EXPECT_FALSE(device.owns(on_heap.get() + 100));
  if (impl().deviceCount() > 1) {
    EXPECT_FALSE(dev(1).owns(p));
  }
  device.free(p);
  EXPECT_FALSE(device.owns(p));  // no live block left
  EXPECT_FALSE(device.owns(p + 10));
}

TEST_P(MemoryContract, FreeOfForeignPointersThrowsAndChangesNothing) {
  Device& device = dev();
  const std::size_t free0 = freeBytes(device);
  auto* p = static_cast<char*>(device.allocate(256));
  ASSERT_NE(p, nullptr);
  const std::size_t free1 = freeBytes(device);

  int on_stack = 0;
  EXPECT_THROW(device.free(&on_stack), std::invalid_argument);
  std::unique_ptr<char[]> on_heap(new char[64]);
  EXPECT_THROW(device.free(on_heap.get()), std::invalid_argument);
  EXPECT_THROW(device.free(p + 64), std::invalid_argument);  // interior, not a block
  if (impl().deviceCount() > 1) {
    const std::size_t other_free = freeBytes(dev(1));
    EXPECT_THROW(dev(1).free(p), std::invalid_argument);  // another device's block
    EXPECT_EQ(freeBytes(dev(1)), other_free);
  }
  EXPECT_NO_THROW(device.free(nullptr));
  EXPECT_EQ(freeBytes(device), free1);  // the failed frees changed nothing
  EXPECT_TRUE(device.owns(p));

  device.free(p);
  EXPECT_THROW(device.free(p), std::invalid_argument);  // double free
  EXPECT_EQ(freeBytes(device), free0);
}

TEST_P(MemoryContract, ConcurrentAllocateAndFreeKeepExactAccounting) {
  Device& device = dev();
  if (device.properties().total_memory < (std::size_t(16) << 20)) GTEST_SKIP() << "needs 16 MiB";
  const std::size_t free0 = freeBytes(device);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&device, &failures, t] {
      std::vector<void*> blocks;
      for (int i = 0; i < 2000; ++i) {
        void* p = device.allocate(static_cast<std::size_t>((i * 37 + t) % 1000));
        if (p == nullptr) {
          ++failures;
          continue;
        }
        blocks.push_back(p);
        if (i % 3 == 0) {
          device.free(blocks.back());
          blocks.pop_back();
        }
      }
      for (void* p : blocks) device.free(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(freeBytes(device), free0);
}

// ---- devices -----------------------------------------------------------------------

class DeviceContract : public HalContract {};
NPU_HAL_CONFORMANCE(DeviceContract);

TEST_P(DeviceContract, PropertiesAndCapabilitiesAreStable) {
  EXPECT_FALSE(impl().name().empty());
  for (int i = 0; i < impl().deviceCount(); ++i) {
    Device& device = dev(i);
    EXPECT_EQ(&impl().device(i), &device);
    EXPECT_EQ(device.index(), i);
    EXPECT_FALSE(device.properties().name.empty());
    EXPECT_GT(device.properties().total_memory, 0u);
    EXPECT_GE(device.properties().compute_units, 1);
    const Capabilities a = device.capabilities();
    const Capabilities b = device.capabilities();
    EXPECT_EQ(a.host_addressable, b.host_addressable);
    EXPECT_EQ(a.async_streams, b.async_streams);
    EXPECT_EQ(a.multiple_streams, b.multiple_streams);
    EXPECT_EQ(a.timing_events, b.timing_events);
    EXPECT_EQ(a.stream_priorities, b.stream_priorities);
  }
}

TEST_P(DeviceContract, UnknownDeviceIndexThrowsOutOfRange) {
  const int count = impl().deviceCount();
  EXPECT_THROW(impl().device(count), std::out_of_range);
  EXPECT_THROW(impl().device(count + 3), std::out_of_range);
  EXPECT_THROW(impl().device(-1), std::out_of_range);
  EXPECT_NO_THROW(impl().device(count - 1));
}

TEST_P(DeviceContract, IndependentCapacities) {
  NPU_REQUIRE_DEVICES(2);
  Device& d0 = dev(0);
  Device& d1 = dev(1);
  const std::size_t free1 = freeBytes(d1);
  auto blocks = fill(d0);
  ASSERT_FALSE(blocks.empty());
  EXPECT_EQ(freeBytes(d1), free1);  // device 0 being full takes nothing from device 1
  void* other = d1.allocate(d1.properties().total_memory / 4);
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(d1.owns(other));
  EXPECT_FALSE(d0.owns(other));
  EXPECT_FALSE(d1.owns(blocks.front()));
  d1.free(other);
  for (void* p : blocks) d0.free(p);
}

TEST_P(DeviceContract, DefaultStreamAndStreamLookup) {
  Device& device = dev(impl().deviceCount() - 1);
  Stream& s0 = device.defaultStream();
  EXPECT_EQ(s0.id(), 0);
  EXPECT_EQ(s0.device(), device.index());
  EXPECT_EQ(&device.stream(0), &s0);
  EXPECT_THROW(device.stream(-1), std::out_of_range);
  EXPECT_THROW(device.stream(12345), std::out_of_range);
  auto event = device.createEvent(false);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(event->device(), device.index());
  if (!device.capabilities().multiple_streams) {
    EXPECT_THROW(device.createStream(0), Unsupported);
    return;
  }
  Stream& s1 = device.createStream(0);
  Stream& s2 = device.createStream(-1);
  Stream& s3 = device.createStream(5);
  std::set<int64_t> ids{s0.id(), s1.id(), s2.id(), s3.id()};
  EXPECT_EQ(ids.size(), 4u) << "stream ids are unique per device";
  EXPECT_EQ(s1.priority(), 0);
  EXPECT_EQ(s2.priority(), -1);
  EXPECT_EQ(s3.priority(), 5);
  for (Stream* s : {&s1, &s2, &s3}) {
    EXPECT_EQ(s->device(), device.index());
    EXPECT_EQ(&device.stream(s->id()), s);
  }
  EXPECT_EQ(&device.defaultStream(), &s0);  // unchanged by the new streams
}

// Streams are created on one thread while another keeps using the default
// stream: the default stream must stay valid while the stream table grows.
TEST_P(DeviceContract, DefaultStreamUsableWhileStreamsAreCreated) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Device& device = dev();
  std::atomic<bool> stop{false};
  std::atomic<long> ran{0};
  std::thread user([&] {
    while (!stop.load()) {
      device.defaultStream().launch("tick", [&ran] { ++ran; }, 0);
      device.defaultStream().synchronize();
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + testing::kTimeout;
  while (ran.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  constexpr int kStreams = 500;
  std::set<int64_t> ids;
  for (int i = 0; i < kStreams; ++i) ids.insert(device.createStream(0).id());
  stop = true;
  user.join();
  device.synchronize();
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(kStreams));
  EXPECT_EQ(ids.count(0), 0u);
  EXPECT_GT(ran.load(), 0);
}

TEST_P(DeviceContract, SynchronizeWaitsForEveryStream) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Device& device = dev();
  std::vector<Stream*> streams{&device.defaultStream(), &device.createStream(0), &device.createStream(0)};
  std::vector<std::unique_ptr<Blocker>> blockers;
  std::atomic<int> done{0};
  for (Stream* s : streams) {
    blockers.push_back(std::make_unique<Blocker>(*s));
    ASSERT_TRUE(blockers.back()->started());
    s->launch("after_blocker", [&done] {
      std::this_thread::sleep_for(2ms);
      ++done;
    }, 0);
  }
  for (Stream* s : streams) EXPECT_FALSE(s->query());
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    for (auto& b : blockers) b->release();
  });
  device.synchronize();
  EXPECT_EQ(done.load(), 3);
  for (Stream* s : streams) EXPECT_TRUE(s->query());
  opener.join();
}

TEST_P(DeviceContract, SynchronizeRaisesTheLowestStreamsFailureAfterWaitingForAll) {
  NPU_REQUIRE_CAPABILITY(multiple_streams);
  Device& device = dev();
  Stream& s0 = device.defaultStream();
  Stream& s1 = device.createStream(0);
  Stream& s2 = device.createStream(0);
  Stream& s3 = device.createStream(0);
  std::atomic<bool> slow_done{false};
  s1.launch("first_bad", [] { throw std::runtime_error("one"); }, 0);
  s2.launch("second_bad", [] { throw std::runtime_error("two"); }, 0);
  Blocker blocker(s3);
  s3.launch("slow", [&] {
    std::this_thread::sleep_for(10ms);
    slow_done = true;
  }, 0);
  s0.launch("fine", [] {}, 0);
  std::thread opener([&] {
    std::this_thread::sleep_for(10ms);
    blocker.release();
  });
  try {
    device.synchronize();
    ADD_FAILURE() << "no exception";
  } catch (const KernelError& e) {
    EXPECT_EQ(e.kernel(), s1.id() < s2.id() ? "first_bad" : "second_bad");
  }
  opener.join();
  EXPECT_TRUE(slow_done.load());  // it waited for the slow stream before raising
  for (Stream* s : {&s0, &s1, &s2, &s3}) EXPECT_TRUE(s->query());
  // Both errors were consumed by that synchronisation.
  EXPECT_NO_THROW(device.synchronize());
  EXPECT_NO_THROW(s2.synchronize());
}

// ---- host memory -------------------------------------------------------------------

class HostMemoryContract : public HalContract {};
NPU_HAL_CONFORMANCE(HostMemoryContract);

TEST_P(HostMemoryContract, AllocateWriteFree) {
  const std::size_t device_free = freeBytes(dev());
  void* p = impl().hostAllocate(1000);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 1000);
  impl().hostFree(p);
  EXPECT_EQ(impl().hostAllocate(std::numeric_limits<std::size_t>::max()), nullptr);
  EXPECT_EQ(impl().hostAllocate(std::numeric_limits<std::size_t>::max() - 10), nullptr);
  EXPECT_EQ(freeBytes(dev()), device_free);  // host memory is not device memory
}

}  // namespace
}  // namespace npu::runtime
