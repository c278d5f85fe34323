// npu_trans_quant_param's int64 quantization parameters, read once for every host
// kernel that takes them (quant matmuls, weight-quant matmuls, transpose_batchmatmul):
// the float32 scale's bits (cut to FP19) in bits 0..31 and an int8 result's offset
// in bits 37..45 (9 bits, signed). Other dtypes are plain float scales, no offset.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>

#include <cstdint>
#include <cstring>

namespace npu::ops {

// The float32 scale a packed int64 holds in its low 32 bits.
inline float packedScale(int64_t packed) {
  const auto bits = static_cast<uint32_t>(static_cast<uint64_t>(packed) & 0xFFFFFFFFu);
  float f;
  std::memcpy(&f, &bits, sizeof(float));
  return f;
}

// The offset a packed int64 holds in bits 37..45, in [-256, 255].
inline int packedOffset(int64_t packed) {
  const auto field = static_cast<int>((static_cast<uint64_t>(packed) >> 37) & 0x1FF);
  return field >= 256 ? field - 512 : field;
}

// The float32 scales of a quantization parameter (t's shape): int64 ones unpacked, others converted.
inline at::Tensor packedScales(const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kLong) return t.defined() ? t.to(at::kFloat) : t;
  const at::Tensor c = t.contiguous();
  at::Tensor out = at::empty(c.sizes(), c.options().dtype(at::kFloat));
  const int64_t* p = c.const_data_ptr<int64_t>();
  float* o = out.mutable_data_ptr<float>();
  for (const auto i : c10::irange(c.numel())) o[i] = packedScale(p[i]);
  return out;
}

// The offsets an int64 parameter carries, as float32 of t's shape; undefined when t is not
// int64 or carries none (all zero), so that callers apply no offset.
inline at::Tensor packedOffsets(const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kLong) return at::Tensor();
  const at::Tensor c = t.contiguous();
  at::Tensor out = at::empty(c.sizes(), c.options().dtype(at::kFloat));
  const int64_t* p = c.const_data_ptr<int64_t>();
  float* o = out.mutable_data_ptr<float>();
  bool any = false;
  for (const auto i : c10::irange(c.numel())) {
    const int off = packedOffset(p[i]);
    o[i] = static_cast<float>(off);
    any |= off != 0;
  }
  return any ? out : at::Tensor();
}

}  // namespace npu::ops
