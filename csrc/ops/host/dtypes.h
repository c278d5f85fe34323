// The dtypes npu kernels compute in, defined once. The npu's floating types are
// float32, float16 and bfloat16 (no float64: it takes the CPU fallback);
// integer and bool tensors always pass, as indices, targets and masks.
#pragma once

#include <ATen/Dispatch.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace npu::ops {

// A set of ScalarTypes, as a bit mask.
class DtypeSet {
 public:
  constexpr DtypeSet() = default;
  DtypeSet(std::initializer_list<c10::ScalarType> types) {
    for (auto t : types) bits_ |= bit(t);
  }
  bool contains(c10::ScalarType t) const { return (bits_ & bit(t)) != 0; }
  DtypeSet operator|(DtypeSet other) const {
    DtypeSet out;
    out.bits_ = bits_ | other.bits_;
    return out;
  }
  DtypeSet operator&(DtypeSet other) const {
    DtypeSet out;
    out.bits_ = bits_ & other.bits_;
    return out;
  }
  // The members: the floating types in kFloatingTypes' order, then the others
  // in ScalarType order (the order messages name them).
  std::vector<c10::ScalarType> types() const;
  // "Float, Half, BFloat16"
  std::string toString() const;
  // "float32, float16 or bfloat16": as Python names them
  std::string pythonNames() const;

 private:
  static_assert(static_cast<int>(c10::ScalarType::NumOptions) <= 64, "a ScalarType no longer fits a bit");
  static uint64_t bit(c10::ScalarType t) { return uint64_t(1) << static_cast<int>(t); }
  uint64_t bits_ = 0;
};

// float32, float16, bfloat16: the npu's floating types, in the order messages name them.
inline constexpr std::array<c10::ScalarType, 3> kFloatingTypes = {c10::kFloat, c10::kHalf, c10::kBFloat16};
// kFloatingTypes as a set.
DtypeSet floatingTypes();
// The integer types and bool.
DtypeSet integralTypes();

// AT_DISPATCH over the npu's floating types (the kernels of csrc/ops that
// compute in float for the 16-bit ones); floatingTypes() is the same set.
#define NPU_DISPATCH_FLOATING_TYPES(type, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, name, __VA_ARGS__)

}  // namespace npu::ops
