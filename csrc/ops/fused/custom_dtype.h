// The Ascend adapter's integer dtype codes (torch_npu._C._cd.DType, copied onto torch_npu as
// torch_npu.float8_e8m0fnu, torch_npu.hifloat8, ...): each is ACL's aclDataType plus 256, so an
// `int` dtype argument of an op is either an at::ScalarType (below 256, what a torch.dtype
// converts to) or one of these codes. A code whose dtype torch has (float8_e8m0fnu,
// float4_e2m1fn_x2, float8_e4m3fn, the ordinary ones) means that torch dtype; the others
// (hifloat8, int4, float6_*, float4_e1m2fn_x2, uint1, string) have no torch dtype: data in them
// is carried in uint8 (HiFloat8Tensor) and ops refuse them by name.
//
// HiFloat8 (HiF8): Huawei's 8-bit tapered-precision float. The bit layout follows the decoder that
// Ascend ships in msprobe's msaccucmp (conversion/dtype_conversion.py) and the format's public
// description (arXiv 2409.16626): a sign bit, then a prefix-coded "dot" field giving the width
// of the exponent (11 -> 4 bits, 10 -> 3, 01 -> 2, 001 -> 1, 0001 -> 0, 0000 -> denormal mode),
// the exponent in sign-magnitude with an implicit leading magnitude bit (so exponents 0, +-1,
// +-[2,3], +-[4,7], +-[8,15]), and the remaining 3, 3, 3, 2, 1 bits of mantissa. Denormals are
// 2^(m - 23) for m = 1..7 (2^-22 .. 2^-16). 0x00 is zero (there is no -0), 0x80 NaN, 0x6F and 0xEF
// +-inf; the largest finite magnitude is 2^15 = 32768 (0x6E). Encoding rounds to nearest with
// ties away from zero (round_mode "round" of Ascend's casts to hifloat8, C's round(); their other
// mode, "hybrid", is not provided); a magnitude at or beyond 40960, halfway from 32768 to the next
// step, becomes inf.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace npu::ops::custom_dtype {

constexpr int64_t kOffset = 256;

struct Entry {
  const char* name;                    // "hifloat8": torch_npu.<name>, torch_npu._C._cd.DType.<name>
  int64_t acl;                         // ACL's aclDataType; the code is acl + kOffset
  std::optional<at::ScalarType> torch; // the torch dtype it means, when torch has one
  int64_t code() const { return acl + kOffset; }
};

// Every code of the Ascend adapter's DType, in ACL's order.
const std::vector<Entry>& table();
// The entry of `code` (>= 256), nullptr for an unknown one.
const Entry* find(int64_t code);
// "torch_npu.hifloat8 (290)", or the ScalarType's name for a code below 256.
std::string describe(int64_t code);

// An op's `int` dtype argument: a ScalarType code, or a custom code with a torch dtype. Refuses,
// naming op, device, argument and value, anything else (a custom code without a torch dtype: the
// chip's hifloat8/float4/int4 data, which this npu's kernels do not take).
at::ScalarType scalarTypeArg(const char* op, c10::Device device, int64_t value, const char* arg);

uint8_t hif8Encode(float x);
float hif8Decode(uint8_t bits);

// torch_npu._C._cd.cast_to_fp8(input, dtype): `input` (float32/float16/bfloat16) in the 8-bit
// format `dtype` (hifloat8, float8_e5m2, float8_e4m3fn), as uint8 on input's device.
at::Tensor castToFp8(const at::Tensor& input, int64_t dtype);
// The same into `output` (uint8, input's shape).
void castToFp8NoAlloc(const at::Tensor& input, at::Tensor& output, int64_t dtype);
// torch_npu._C._cd.cast_from_fp8(input, itype, otype): uint8 data in format `itype` decoded to
// `otype` (a code or ScalarType of float32/float16/bfloat16).
at::Tensor castFromFp8(const at::Tensor& input, int64_t itype, int64_t otype);

}  // namespace npu::ops::custom_dtype
