// The HAL conformance suite (conformance.h), part 6: virtual memory
// (Capabilities::virtual_memory, optional): reserving address space, committing
// device memory to parts of it and taking it back, what the caching
// allocator's expandable segments need. A HAL without it must throw
// Unsupported, naming what is missing.
#include <cstring>
#include <stdexcept>
#include <string>

#include "conformance.h"

namespace npu::runtime {
namespace {

using testing::HalContract;

class VirtualMemoryContract : public HalContract {};
NPU_HAL_CONFORMANCE(VirtualMemoryContract);

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::size_t freeBytes(Device& d) {
  std::size_t free = 0, total = 0;
  d.memoryInfo(&free, &total);
  return free;
}

TEST_P(VirtualMemoryContract, WithoutTheCapabilityEveryMethodSaysSo) {
  if (caps().virtual_memory) GTEST_SKIP() << GetParam() << " has virtual_memory";
  int local = 0;
  auto expectUnsupported = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no Unsupported";
    } catch (const Unsupported& e) {
      EXPECT_TRUE(mentions(e.what(), "not supported by this HAL")) << e.what();
      EXPECT_TRUE(mentions(e.what(), "virtual_memory")) << e.what();
    }
  };
  expectUnsupported([&] { dev().virtualMemoryGranularity(); });
  expectUnsupported([&] { dev().reserveAddress(1 << 20); });
  expectUnsupported([&] { dev().mapMemory(&local, 4096); });
  expectUnsupported([&] { dev().unmapMemory(&local, 4096); });
  expectUnsupported([&] { dev().releaseAddress(&local); });
}

TEST_P(VirtualMemoryContract, MappedPagesAreDeviceMemoryCountedAgainstTheCapacity) {
  NPU_REQUIRE_CAPABILITY(virtual_memory);
  Device& d = dev();
  const std::size_t page = d.virtualMemoryGranularity();
  ASSERT_GT(page, 0u);
  const std::size_t free_before = freeBytes(d);
  auto* base = static_cast<char*>(d.reserveAddress(16 * page));
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(freeBytes(d), free_before) << "a reservation commits nothing";
  EXPECT_FALSE(d.owns(base));
  ASSERT_TRUE(d.mapMemory(base, 2 * page));
  EXPECT_EQ(freeBytes(d), free_before - 2 * page);
  EXPECT_TRUE(d.owns(base));
  EXPECT_TRUE(d.owns(base + 2 * page - 1));
  EXPECT_FALSE(d.owns(base + 2 * page));
  // Growing in place: the next pages join the first ones, whose contents stay.
  if (caps().host_addressable) std::memset(base, 5, 2 * page);
  ASSERT_TRUE(d.mapMemory(base + 2 * page, 3 * page));
  EXPECT_EQ(freeBytes(d), free_before - 5 * page);
  if (caps().host_addressable) {
    std::memset(base + 2 * page, 6, 3 * page);
    EXPECT_EQ(base[0], 5);
    EXPECT_EQ(base[2 * page - 1], 5);
    EXPECT_EQ(base[5 * page - 1], 6);
  }
  // Kernels and copies use it as any device memory.
  std::string host(5 * page, 'q');
  d.defaultStream().copy(base, host.data(), host.size(), CopyKind::HostToDevice);
  std::string back(5 * page, '\0');
  d.defaultStream().copy(back.data(), base, back.size(), CopyKind::DeviceToHost);
  d.defaultStream().synchronize();
  EXPECT_EQ(back, host);
  // Pages in the middle go back; the others stay.
  d.unmapMemory(base + page, 2 * page);
  EXPECT_EQ(freeBytes(d), free_before - 3 * page);
  EXPECT_TRUE(d.owns(base));
  EXPECT_FALSE(d.owns(base + page));
  EXPECT_TRUE(d.owns(base + 3 * page));
  if (caps().host_addressable) EXPECT_EQ(base[4 * page], 'q');
  ASSERT_TRUE(d.mapMemory(base + page, page));  // a hole is mapped again
  EXPECT_EQ(freeBytes(d), free_before - 4 * page);
  // Releasing gives back what is still committed.
  d.releaseAddress(base);
  EXPECT_EQ(freeBytes(d), free_before);
  EXPECT_FALSE(d.owns(base));
}

TEST_P(VirtualMemoryContract, MappingPastTheCapacityFailsAndCommitsNothing) {
  NPU_REQUIRE_CAPABILITY(virtual_memory);
  Device& d = dev();
  const std::size_t page = d.virtualMemoryGranularity();
  const std::size_t capacity = d.properties().total_memory;
  const std::size_t size = (capacity / page + 2) * page;  // more than the device holds
  auto* base = static_cast<char*>(d.reserveAddress(size));
  ASSERT_NE(base, nullptr) << "address space beyond the capacity may be reserved";
  const std::size_t free_before = freeBytes(d);
  EXPECT_FALSE(d.mapMemory(base, size));
  EXPECT_EQ(freeBytes(d), free_before);
  EXPECT_FALSE(d.owns(base));
  // allocate() and mapMemory() share the capacity.
  void* held = d.allocate(free_before - page);
  ASSERT_NE(held, nullptr);
  EXPECT_FALSE(d.mapMemory(base, 2 * page));
  EXPECT_TRUE(d.mapMemory(base, page));
  EXPECT_EQ(freeBytes(d), 0u);
  EXPECT_EQ(d.allocate(64), nullptr);
  d.unmapMemory(base, page);
  d.free(held);
  EXPECT_EQ(freeBytes(d), free_before);
  d.releaseAddress(base);
}

TEST_P(VirtualMemoryContract, BadRangesThrowInvalidArgumentAndChangeNothing) {
  NPU_REQUIRE_CAPABILITY(virtual_memory);
  Device& d = dev();
  const std::size_t page = d.virtualMemoryGranularity();
  auto* base = static_cast<char*>(d.reserveAddress(4 * page));
  ASSERT_NE(base, nullptr);
  const std::size_t free_before = freeBytes(d);
  int local = 0;
  EXPECT_THROW(d.mapMemory(&local, page), std::invalid_argument);          // not reserved
  EXPECT_THROW(d.mapMemory(base + 1, page), std::invalid_argument);        // misaligned
  EXPECT_THROW(d.mapMemory(base, page + 1), std::invalid_argument);        // not whole pages
  EXPECT_THROW(d.mapMemory(base, 0), std::invalid_argument);
  EXPECT_THROW(d.mapMemory(base + 3 * page, 2 * page), std::invalid_argument);  // past the end
  EXPECT_THROW(d.unmapMemory(base, page), std::invalid_argument);          // not mapped
  ASSERT_TRUE(d.mapMemory(base + page, page));
  EXPECT_THROW(d.mapMemory(base, 2 * page), std::invalid_argument);        // a page mapped already
  EXPECT_THROW(d.unmapMemory(base, 2 * page), std::invalid_argument);      // a page not mapped
  EXPECT_EQ(freeBytes(d), free_before - page);
  EXPECT_THROW(d.releaseAddress(base + page), std::invalid_argument);      // not a base
  EXPECT_THROW(d.releaseAddress(&local), std::invalid_argument);
  EXPECT_THROW(d.free(base + page), std::invalid_argument);  // mapped pages are not allocate()'s
  d.unmapMemory(base + page, page);
  EXPECT_EQ(freeBytes(d), free_before);
  d.releaseAddress(base);
}

}  // namespace
}  // namespace npu::runtime
