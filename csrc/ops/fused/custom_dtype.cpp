#include "custom_dtype.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>

#include "common.h"

namespace npu::ops::custom_dtype {

const std::vector<Entry>& table() {
  // ACL's aclDataType values (acl_base.h); 5, 14, 15, 18..26, 28, 31, 32 are not exported.
  static const std::vector<Entry> entries = {
      {"float32", 0, at::kFloat},
      {"float16", 1, at::kHalf},
      {"int8", 2, at::kChar},
      {"int32", 3, at::kInt},
      {"uint8", 4, at::kByte},
      {"int16", 6, at::kShort},
      {"uint16", 7, at::kUInt16},
      {"uint32", 8, at::kUInt32},
      {"int64", 9, at::kLong},
      {"uint64", 10, at::kUInt64},
      {"float64", 11, at::kDouble},
      {"bool", 12, at::kBool},
      {"string", 13, std::nullopt},
      {"complex64", 16, at::kComplexFloat},
      {"complex128", 17, at::kComplexDouble},
      {"bfloat16", 27, at::kBFloat16},
      {"int4", 29, std::nullopt},
      {"uint1", 30, std::nullopt},
      {"complex32", 33, at::kComplexHalf},
      {"hifloat8", 34, std::nullopt},
      {"float8_e5m2", 35, at::kFloat8_e5m2},
      {"float8_e4m3fn", 36, at::kFloat8_e4m3fn},
      {"float8_e8m0fnu", 37, at::kFloat8_e8m0fnu},
      {"float6_e3m2", 38, std::nullopt},
      {"float6_e2m3", 39, std::nullopt},
      {"float4_e2m1fn_x2", 40, at::kFloat4_e2m1fn_x2},
      {"float4_e1m2fn_x2", 41, std::nullopt},
  };
  return entries;
}

const Entry* find(int64_t code) {
  for (const auto& e : table())
    if (e.code() == code) return &e;
  return nullptr;
}

std::string describe(int64_t code) {
  if (code >= kOffset) {
    const Entry* e = find(code);
    return e ? "torch_npu." + std::string(e->name) + " (" + std::to_string(code) + ")"
             : "the integer " + std::to_string(code) + " (no torch_npu dtype code)";
  }
  if (code >= 0 && code < static_cast<int64_t>(at::ScalarType::NumOptions))
    return std::string("torch.") + c10::toString(static_cast<at::ScalarType>(code));
  return "the integer " + std::to_string(code);
}

at::ScalarType scalarTypeArg(const char* op, c10::Device device, int64_t value, const char* arg) {
  if (value >= 0 && value < static_cast<int64_t>(at::ScalarType::NumOptions)) return static_cast<at::ScalarType>(value);
  const Entry* e = value >= kOffset ? find(value) : nullptr;
  NPU_OP_CHECK(e != nullptr, op, device, arg, " must be a torch.dtype or a torch_npu dtype code (torch_npu.float8_e8m0fnu, ...), got ",
               describe(value));
  NPU_OP_CHECK(e->torch.has_value(), op, device, arg, " ", describe(value),
               " names data in a format torch has no dtype for; the npu's kernels do not take it (on Ascend only the "
               "950 chips compute in it). Use a torch dtype, or keep hifloat8 data as torch_npu.HiFloat8Tensor");
  return *e->torch;
}

// ---- HiFloat8 --------------------------------------------------------------------------

namespace {
constexpr uint8_t kHif8Nan = 0x80;
constexpr uint8_t kHif8Inf = 0x6F;
constexpr float kHif8Overflow = 40960.0f;  // halfway from the largest finite 32768 to the next step, 49152
}  // namespace

float hif8Decode(uint8_t bits) {
  if (bits == 0x00) return 0.0f;
  if (bits == kHif8Nan) return std::numeric_limits<float>::quiet_NaN();
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int f = bits & 0x7F;
  if (f == kHif8Inf) return sign * std::numeric_limits<float>::infinity();
  int dot = 0;     // the exponent's stored width
  int prefix = 0;  // the dot field's width
  if ((f & 0x60) == 0x60) { dot = 4; prefix = 2; }
  else if ((f & 0x60) == 0x40) { dot = 3; prefix = 2; }
  else if ((f & 0x60) == 0x20) { dot = 2; prefix = 2; }
  else if ((f & 0x70) == 0x10) { dot = 1; prefix = 3; }
  else if ((f & 0x78) == 0x08) { dot = 0; prefix = 4; }
  else return sign * std::ldexp(1.0f, (f & 0x7) - 23);  // denormal mode: 2^(m-23)
  const int mant_bits = 7 - prefix - dot;
  int exponent = 0;
  if (dot > 0) {
    const int raw = (f >> mant_bits) & ((1 << dot) - 1);
    const int magnitude = (1 << (dot - 1)) | (raw & ((1 << (dot - 1)) - 1));  // implicit leading 1
    exponent = (raw >> (dot - 1)) ? -magnitude : magnitude;
  }
  const float mantissa = 1.0f + static_cast<float>(f & ((1 << mant_bits) - 1)) / static_cast<float>(1 << mant_bits);
  return sign * std::ldexp(mantissa, exponent);
}

namespace {

// The finite non-negative values in ascending order, with their codes.
struct Hif8Tables {
  std::vector<float> boundaries;  // between neighbours (ties go up), then the overflow threshold
  std::vector<uint8_t> codes;     // one more than boundaries: the last is inf
  std::vector<float> decoded;     // all 256 codes
};

const Hif8Tables& hif8Tables() {
  static const Hif8Tables tables = [] {
    Hif8Tables t;
    std::vector<std::pair<float, uint8_t>> values;
    for (int b = 0; b < 0x80; ++b) {
      const float v = hif8Decode(static_cast<uint8_t>(b));
      if (std::isfinite(v)) values.emplace_back(v, static_cast<uint8_t>(b));
    }
    std::sort(values.begin(), values.end());
    for (std::size_t i = 0; i < values.size(); ++i) {
      t.codes.push_back(values[i].second);
      if (i + 1 < values.size()) t.boundaries.push_back(0.5f * (values[i].first + values[i + 1].first));
    }
    t.boundaries.push_back(kHif8Overflow);
    t.codes.push_back(kHif8Inf);
    for (int b = 0; b < 256; ++b) t.decoded.push_back(hif8Decode(static_cast<uint8_t>(b)));
    return t;
  }();
  return tables;
}

}  // namespace

uint8_t hif8Encode(float x) {
  if (std::isnan(x)) return kHif8Nan;
  const auto& t = hif8Tables();
  const float a = std::fabs(x);
  const auto index = std::upper_bound(t.boundaries.begin(), t.boundaries.end(), a) - t.boundaries.begin();
  const uint8_t code = t.codes[index];
  return (x < 0 && code != 0) ? static_cast<uint8_t>(code | 0x80) : code;
}

namespace {

constexpr const char* kCastTo = "cast_to_fp8";
constexpr const char* kCastFrom = "cast_from_fp8";

int64_t checkedFormat(const char* op, c10::Device device, int64_t dtype, const char* arg) {
  const Entry* e = dtype >= kOffset ? find(dtype) : nullptr;
  const bool eight_bit = e != nullptr && (e->acl == 34 || e->acl == 35 || e->acl == 36 || e->acl == 37);
  NPU_OP_CHECK(eight_bit, op, device, arg, " must be torch_npu.hifloat8, float8_e5m2, float8_e4m3fn or float8_e8m0fnu "
               "(a torch_npu._C._cd.DType), got ", describe(dtype));
  return e->acl;
}

// Runs the conversion where the tensor is; the lookup tables go to its device once per call.
at::Tensor table(const at::Tensor& like, c10::ArrayRef<float> values) {
  return at::tensor(std::vector<float>(values.begin(), values.end()), at::kFloat).to(like.device());
}

at::Tensor hif8EncodeTensor(const at::Tensor& input) {
  const auto& t = hif8Tables();
  const at::Tensor x = input.to(at::kFloat);
  const at::Tensor boundaries = table(x, t.boundaries);
  const at::Tensor codes =
      at::tensor(std::vector<int64_t>(t.codes.begin(), t.codes.end()), at::kLong).to(x.device());
  const at::Tensor index = at::bucketize(x.abs(), boundaries, /*out_int32=*/false, /*right=*/true);
  at::Tensor code = codes.index_select(0, index.reshape(-1)).reshape(x.sizes());
  code = at::where(x.lt(0).logical_and(code.ne(0)), code.bitwise_or(0x80), code);
  code = at::where(x.isnan(), at::scalar_tensor(kHif8Nan, code.options()), code);
  return code.to(at::kByte);
}

}  // namespace

at::Tensor castToFp8(const at::Tensor& input, int64_t dtype) {
  const c10::Device device = input.device();
  const int64_t acl = checkedFormat(kCastTo, device, dtype, "dtype");
  const auto st = input.scalar_type();
  NPU_OP_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, kCastTo, device,
               "input must be float32, float16 or bfloat16, got ", c10::toString(st));
  if (acl == 34) return hif8EncodeTensor(input);
  return input.to(*find(dtype)->torch).view(at::kByte);
}

void castToFp8NoAlloc(const at::Tensor& input, at::Tensor& output, int64_t dtype) {
  const at::Tensor encoded = castToFp8(input, dtype);
  NPU_OP_CHECK(output.scalar_type() == at::kByte && output.sizes() == input.sizes() && output.device() == input.device(),
               "cast_to_fp8_noalloc", input.device(), "output must be uint8 with input's shape ", input.sizes(),
               " on its device, got ", c10::toString(output.scalar_type()), " ", output.sizes(), " on ", output.device());
  output.copy_(encoded);
}

at::Tensor castFromFp8(const at::Tensor& input, int64_t itype, int64_t otype) {
  const c10::Device device = input.device();
  const int64_t acl = checkedFormat(kCastFrom, device, itype, "itype");
  NPU_OP_CHECK(input.scalar_type() == at::kByte, kCastFrom, device, "input must hold the 8-bit data as uint8, got ",
               c10::toString(input.scalar_type()));
  const at::ScalarType out = scalarTypeArg(kCastFrom, device, otype, "otype");
  NPU_OP_CHECK(out == at::kFloat || out == at::kHalf || out == at::kBFloat16, kCastFrom, device,
               "otype must be float32, float16 or bfloat16, got ", describe(otype));
  if (acl == 34) {
    const at::Tensor lut = table(input, hif8Tables().decoded);
    return lut.index_select(0, input.reshape(-1).to(at::kLong)).reshape(input.sizes()).to(out);
  }
  return input.contiguous().view(*find(itype)->torch).to(out);
}

}  // namespace npu::ops::custom_dtype
