// Tests of the HAL registry (registerHal, createHal, NPU_HAL, the API
// version), of the process-wide HAL (hal(), setHal) and of the contract's
// optional methods: a HAL with only the required methods compiles, and its
// optional ones behave as documented.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/device.h"
#include "emu_test_util.h"
#include "hal.h"
#include "test_util.h"

namespace npu::runtime {
namespace {

using testing::ScopedEnv;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- a HAL with the required methods only ---------------------------------------------

// A synchronous device of one stream: work runs inside launch().
class BareStream final : public Stream {
 public:
  int device() const override { return 0; }
  int64_t id() const override { return 0; }
  int priority() const override { return 0; }
  void launch(const char*, Kernel kernel, std::size_t) override {
    ++launched_;
    kernel();
  }
  void copy(void*, const void*, std::size_t, CopyKind) override {}
  void acquire() override {}
  void release() override {}
  void synchronize() override {}
  void drain() override {}
  bool query() override { return true; }
  void wait(Event&) override {}
  uint64_t position() const override { return launched_; }
  bool passed(uint64_t) const override { return true; }

 private:
  uint64_t launched_ = 0;
};

class BareEvent final : public Event {
 public:
  void record(Stream&) override { recorded_ = true; }
  bool query() override { return true; }
  void synchronize() override {}
  bool recorded() const override { return recorded_; }
  int device() const override { return 0; }

 private:
  bool recorded_ = false;
};

class BareDevice final : public Device {
 public:
  int index() const override { return 0; }
  const DeviceProperties& properties() const override { return properties_; }
  Capabilities capabilities() const override { return {}; }
  void* allocate(std::size_t) override { return nullptr; }
  void free(void*) override {}
  bool owns(const void*) const override { return false; }
  void memoryInfo(std::size_t* free, std::size_t* total) const override { *free = *total = 0; }
  Stream& defaultStream() override { return stream_; }
  Stream& stream(int64_t id) override {
    if (id != 0) throw std::out_of_range("no such stream");
    return stream_;
  }
  std::unique_ptr<Event> createEvent(bool) override { return std::make_unique<BareEvent>(); }
  void synchronize() override {}
  void drain() override {}

 private:
  DeviceProperties properties_{"Bare", 0, 1, 1, 0};
  BareStream stream_;
};

class BareHal final : public Hal {
 public:
  std::string name() const override { return "bare"; }
  int deviceCount() const override { return 1; }
  Device& device(int index) override {
    if (index != 0) throw std::out_of_range("no such device");
    return device_;
  }
  void* hostAllocate(std::size_t) override { return nullptr; }
  void hostFree(void*) override {}

 private:
  BareDevice device_;
};

TEST(OptionalMethods, DefaultBodiesRefuseClearly) {
  BareHal bare;
  Device& device = bare.device(0);
  const Capabilities caps = device.capabilities();  // all false: nothing optional
  EXPECT_FALSE(caps.host_addressable || caps.async_streams || caps.multiple_streams || caps.timing_events ||
               caps.stream_priorities);

  // runIfIdle: the default runs nothing and says so.
  bool ran = false;
  EXPECT_FALSE(device.defaultStream().runIfIdle("k", [&] { ran = true; }, 0));
  EXPECT_FALSE(ran);

  try {
    device.createStream(0);
    ADD_FAILURE() << "createStream() did not throw";
  } catch (const Unsupported& e) {
    EXPECT_TRUE(contains(e.what(), "is not supported by this HAL (")) << e.what();
    EXPECT_TRUE(contains(e.what(), "multiple_streams")) << e.what();
    EXPECT_TRUE(contains(e.what(), "BareDevice")) << e.what();
  }
  auto start = device.createEvent(true);
  auto end = device.createEvent(true);
  try {
    start->elapsedMs(*end);
    ADD_FAILURE() << "elapsedMs() did not throw";
  } catch (const std::logic_error& e) {  // Unsupported is a logic_error
    EXPECT_NE(dynamic_cast<const Unsupported*>(&e), nullptr);
    EXPECT_TRUE(contains(e.what(), "is not supported by this HAL (")) << e.what();
    EXPECT_TRUE(contains(e.what(), "BareEvent")) << e.what();
  }
}

// ---- the registry ----------------------------------------------------------------------

TEST(Registry, TheEmulatorIsBuiltInAndTheDefault) {
  EXPECT_STREQ(kDefaultHal, "emu");
  const auto names = registeredHals();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "emu"), names.end());
  auto made = createHal("emu");
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(made->name(), "emulated");
  EXPECT_TRUE(made->device(0).capabilities().host_addressable);
}

TEST(Registry, AnUnknownNameListsTheRegisteredOnes) {
  try {
    createHal("no_such_hal");
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "'no_such_hal'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "emu")) << e.what();
    EXPECT_TRUE(contains(e.what(), "minimal")) << e.what();
  }
}

TEST(Registry, AnotherApiVersionIsRefused) {
  for (int version : {kMinimumHalApiVersion - 1, kHalApiVersion + 1, 0}) {
    try {
      registerHal("versioned_hal", version, [] { return std::make_unique<BareHal>(); });
      ADD_FAILURE() << "version " << version << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "versioned_hal")) << e.what();
      EXPECT_TRUE(contains(e.what(), "version " + std::to_string(version))) << e.what();
      EXPECT_TRUE(contains(e.what(), "version " + std::to_string(kHalApiVersion))) << e.what();
      // The remedy follows the direction: a newer HAL is rebuilt against this hal.h.
      EXPECT_EQ(contains(e.what(), "rebuild it against this runtime's"), version > kHalApiVersion) << e.what();
    }
  }
  const auto names = registeredHals();
  EXPECT_EQ(std::find(names.begin(), names.end(), "versioned_hal"), names.end());
}

// Version 5 only added to the contract: a HAL written against version 4 still
// registers, and the runtime never asks it what version 5 added.
TEST(Registry, AVersion4HalStillRegisters) {
  registerHal("version4_hal", 4, [] { return std::make_unique<BareHal>(); });
  EXPECT_EQ(registeredApiVersion("version4_hal"), 4);
  EXPECT_EQ(registeredApiVersion("emu"), kHalApiVersion);
  EXPECT_EQ(registeredApiVersion("no_such_hal"), 0);
}

TEST(Registry, NamesAreCheckedAndUnique) {
  auto factory = [] { return std::make_unique<BareHal>(); };
  EXPECT_THROW(registerHal("emu", kHalApiVersion, factory), std::invalid_argument);  // taken
  EXPECT_THROW(registerHal("", kHalApiVersion, factory), std::invalid_argument);
  EXPECT_THROW(registerHal("has space", kHalApiVersion, factory), std::invalid_argument);
  EXPECT_THROW(registerHal("a-b", kHalApiVersion, factory), std::invalid_argument);
  EXPECT_THROW(registerHal("no_factory", kHalApiVersion, nullptr), std::invalid_argument);
}

// Registration lasts for the process: under --gtest_repeat the names exist already.
void registerTestHals() {
  static const bool once = [] {
    registerHal("registry_bare", kHalApiVersion, [] { return std::make_unique<BareHal>(); });
    registerHal("registry_failing", kHalApiVersion, []() -> std::unique_ptr<Hal> {
      throw std::invalid_argument("NPU_REGISTRY_TEST='x' is not valid");
    });
    registerHal("registry_null", kHalApiVersion, [] { return std::unique_ptr<Hal>(); });
    return true;
  }();
  (void)once;
}

TEST(Registry, CreateBuildsANewHalEachTime) {
  registerTestHals();
  auto a = createHal("registry_bare");
  auto b = createHal("registry_bare");
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(a->name(), "bare");
  // A factory's own error (a bad setting) reaches the caller as it is.
  try {
    createHal("registry_failing");
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "NPU_REGISTRY_TEST")) << e.what();
  }
  EXPECT_THROW(createHal("registry_null"), std::logic_error);
}

TEST(Registry, NpuHalChoosesTheHal) {
  {
    ScopedEnv env("NPU_HAL", nullptr);
    EXPECT_EQ(createHalFromEnvironment()->name(), "emulated");
  }
  {
    ScopedEnv env("NPU_HAL", "");
    EXPECT_EQ(createHalFromEnvironment()->name(), "emulated");
  }
  {
    ScopedEnv env("NPU_HAL", "minimal");
    EXPECT_EQ(createHalFromEnvironment()->name(), "minimal");
  }
  {
    ScopedEnv env("NPU_HAL", "emu");
    EXPECT_EQ(createHalFromEnvironment()->name(), "emulated");
  }
  ScopedEnv env("NPU_HAL", "bogus");
  try {
    createHalFromEnvironment();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "NPU_HAL='bogus'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "emu")) << e.what();
    EXPECT_TRUE(contains(e.what(), "minimal")) << e.what();
  }
}

// ---- HAL libraries (hal_plugin.h) --------------------------------------------------------

// The minimal HAL's library, loaded by conformance_hals.cpp at start (so the
// conformance suite runs on it) and here again by path: the same name.
TEST(HalLibrary, LoadsByPathRegistersItsNameAndVersion) {
  EXPECT_EQ(loadHalLibrary(NPU_HAL_MINIMAL_PLUGIN), "minimal_plugin");
  EXPECT_EQ(registeredApiVersion("minimal_plugin"), kHalApiVersion);
  auto made = createHal("minimal_plugin");
  EXPECT_EQ(made->deviceCount(), 2);
  Device& device = made->device(0);
  EXPECT_FALSE(device.capabilities().host_addressable);
  EXPECT_TRUE(device.capabilities().op_queries);
  EXPECT_EQ(device.supportsOp("aten::add.Tensor", {"Float"}), OpSupport::Unsupported);
  // Memory and copies work across the library boundary.
  void* p = device.allocate(64);
  ASSERT_NE(p, nullptr);
  const char in[8] = "library";
  char out[8] = {};
  device.defaultStream().copy(p, in, sizeof in, CopyKind::HostToDevice);
  device.defaultStream().copy(out, p, sizeof out, CopyKind::DeviceToHost);
  device.defaultStream().synchronize();
  EXPECT_STREQ(out, "library");
  device.free(p);
  // An optional method it lacks throws the contract's Unsupported, which this side catches as such.
  ScopedEnv basic("NPU_MINIMAL_HAL_BASIC", "1");
  auto bare = createHal("minimal_plugin");
  EXPECT_THROW(bare->device(0).createStream(0), Unsupported);
}

TEST(HalLibrary, NpuHalNamesALibraryByPath) {
  ScopedEnv env("NPU_HAL", NPU_HAL_MINIMAL_PLUGIN);
  EXPECT_EQ(createHalFromEnvironment()->name(), "minimal");
}

TEST(HalLibrary, ABadLibrarySaysWhy) {
  {
    ScopedEnv env("NPU_HAL", "/no/such/libnpu_hal_x.so");
    try {
      createHalFromEnvironment();
      ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "NPU_HAL='/no/such/libnpu_hal_x.so'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "cannot load")) << e.what();
    }
  }
  // A library that is not a HAL library: libc, found where this process loaded it.
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&std::printf), &info), 0);
  try {
    loadHalLibrary(info.dli_fname);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "is not a HAL library")) << e.what();
    EXPECT_TRUE(contains(e.what(), "npu_hal_plugin_init")) << e.what();
  }
}

// ---- the process-wide HAL ---------------------------------------------------------------

// The process-wide HAL is made once per process: ctest runs each test in a
// process of its own; run together (or under --gtest_repeat), the first of
// these tests takes it and the others skip.
bool claimProcessHal() {
  static bool claimed = false;
  const bool first = !claimed;
  claimed = true;
  return first;
}

TEST(ProcessHal, SetHalBeforeFirstUseThenRefusesAnother) {
  if (!claimProcessHal()) GTEST_SKIP() << "the process-wide HAL is already made";
  auto mine = std::make_unique<emu::EmuHal>(3, 1 << 20, testing::asyncConfig());
  Hal* expected = mine.get();
  setHal(std::move(mine));
  EXPECT_EQ(&hal(), expected);
  EXPECT_EQ(hal().deviceCount(), 3);
  EXPECT_THROW(setHal(std::make_unique<emu::EmuHal>(1, 1 << 20, testing::asyncConfig())), std::logic_error);
  EXPECT_EQ(&hal(), expected);
}

// hal() reads NPU_HAL on first use; a bad name is an error each time (the
// Python package reports it at import), until a good one is set.
TEST(ProcessHal, HalReportsABadNpuHalAndTriesAgain) {
  if (!claimProcessHal()) GTEST_SKIP() << "the process-wide HAL is already made";
  {
    ScopedEnv env("NPU_HAL", "bogus");
    EXPECT_THROW(hal(), std::invalid_argument);
    EXPECT_THROW(hal(), std::invalid_argument);
  }
  ScopedEnv env("NPU_HAL", "minimal");
  EXPECT_EQ(hal().name(), "minimal");
  EXPECT_EQ(&hal(), &hal());
}

}  // namespace
}  // namespace npu::runtime
