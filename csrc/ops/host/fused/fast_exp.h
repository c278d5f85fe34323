// e^x for the fused ops' softmax rows (attention and moe_quant kernels).
#pragma once

#include <cstdint>

namespace npu::ops {

// e^x for x <= 0 (a score minus its row's maximum), written so its loops vectorise:
// x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), e^r by its
// Taylor series to r^7 (relative error below 1e-8 there), times 2^n from the exponent
// bits. Below -87 (e^x under FLT_MIN) the result is exactly 0, so a logit or score of
// -inf gets probability 0.
inline __attribute__((always_inline)) float expOfNonPositive(float x) {
  const bool underflows = x < -87.0f;
  x = underflows ? -87.0f : x;  // (2^n stays a normal float)
  const float t = x * 1.44269504088896341f - 0.5f;
  const int32_t n = static_cast<int32_t>(t);  // rounds t + 0.5 to the nearest: t <= 0 truncates upwards
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693145751953125f) - nf * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return underflows ? 0.0f : p * __builtin_bit_cast(float, (n + 127) << 23);
}

}  // namespace npu::ops
