// e^x for the fused ops' host kernels, written so the loops around it vectorise.
#pragma once

#include <bit>
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

// e^x for any float (std::exp does not vectorise): Cody-Waite range reduction and
// Cephes' degree-6 polynomial, about 1 ulp. Comparisons and integer truncation
// instead of fmin/fmax/floor, which are library calls (NaN and errno rules) that
// stop the vectoriser. x is clamped to [-87.3, 88.37] (beyond 88.37 2^n overflows).
// FlushUnderflow: below -87.3 the result is exactly 0, by a bit mask
// rather than a branch: exp there is under the smallest normal float, and denormal
// results (masked softmax entries times 1/sum) are slow to compute with. Without it
// the result there is e^-87.3.
template <bool FlushUnderflow>
inline __attribute__((always_inline)) float vectorExp(float x) {
  const int32_t keep = FlushUnderflow ? -static_cast<int32_t>(x >= -87.3f) : -1;  // all ones, or 0
  x = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);  // (NaN stays NaN, and so does the result)
  const float scaled = x * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(scaled);
  n -= scaled < static_cast<float>(n) ? 1 : 0;  // floor
  const float nf = static_cast<float>(n);
  const float r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float poly = p * r * r + r + 1.0f;
  return poly * std::bit_cast<float>(((n + 127) << 23) & keep);
}

}  // namespace npu::ops
