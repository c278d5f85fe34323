// The HAL conformance suite: tests of the contract of hal.h, run against every
// registered HAL (value-parameterised over HAL names). Each test makes a new
// HAL with createHal(name) and uses it through hal.h alone; what a device
// lacks (Capabilities) skips the tests that need it. The emulator runs it as
// "emu" (its default launch policy) and "emu_queued" (every kernel queued to
// its stream's worker), the test suite's own minimal HAL as "minimal"
// (conformance_hals.cpp). A vendor links its HAL into runtime_tests
// (NPU_HAL_CONFORMANCE_SOURCES in csrc/runtime/CMakeLists.txt) and runs
// `runtime_tests --gtest_filter='Hal/*/its_name'`.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "hal.h"
#include "test_util.h"

namespace npu::runtime::testing {

// The HALs the suite runs against: every registered one.
std::vector<std::string> conformanceTargets();

class HalContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // Errors are deferred unless a test asks for NPU_LAUNCH_BLOCKING itself.
    ScopedEnv not_blocking("NPU_LAUNCH_BLOCKING", nullptr);
    impl_ = createHal(GetParam());
    ASSERT_NE(impl_, nullptr);
    ASSERT_GE(impl_->deviceCount(), 1) << GetParam() << " has no device to test";
  }
  void TearDown() override { impl_.reset(); }  // its streams finish their work first

  Hal& impl() { return *impl_; }
  Device& dev(int index = 0) { return impl_->device(index); }
  Capabilities caps(int index = 0) { return dev(index).capabilities(); }

  std::unique_ptr<Hal> impl_;
};

}  // namespace npu::runtime::testing

// In a test body: skips the test on a device without the capability.
#define NPU_REQUIRE_CAPABILITY(flag) \
  if (!caps().flag) GTEST_SKIP() << GetParam() << " does not have " #flag
#define NPU_REQUIRE_DEVICES(n) \
  if (impl().deviceCount() < (n)) GTEST_SKIP() << GetParam() << " has fewer than " #n " devices"

// Runs the TEST_Ps of fixture `Suite` (a subclass of HalContract) on every HAL.
#define NPU_HAL_CONFORMANCE(Suite)                                                                   \
  INSTANTIATE_TEST_SUITE_P(Hal, Suite, ::testing::ValuesIn(::npu::runtime::testing::conformanceTargets()), \
                           [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })
