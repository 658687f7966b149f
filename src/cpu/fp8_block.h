// Vectorisable block forms of the dsa/numerics.h conversions for the CPU backend. Each is
// bit-identical to its scalar counterpart in numerics.h (tests compare the ops that use them
// against the oracle bit for bit); they avoid branches so the compiler can vectorise loops.
#pragma once
#include <cstdint>
#include <cstring>

#include "dsa/numerics.h"

namespace dsa {
namespace cpu {

// float_to_e4m3 without branches. Normal range: drop 20 mantissa bits with round-to-nearest-
// even on the rebiased bits. Subnormal range (|y| < 2^-6): adding 2^14 makes the float's ulp
// 2^-9, so the hardware's own round-to-nearest-even picks the subnormal step.
inline uint8_t e4m3_from_float_nobranch(float y) {
  uint32_t u;
  std::memcpy(&u, &y, 4);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  float mag;
  std::memcpy(&mag, &a, 4);
  const float shifted = mag + 16384.0f;
  uint32_t sbits;
  std::memcpy(&sbits, &shifted, 4);
  const uint32_t q_sub = sbits - 0x46800000u;  // bits of 16384.0f
  const uint32_t q_norm = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t q = a < 0x3c800000u ? q_sub : q_norm;
  q = a > 0x43e80000u ? 0x7fu : q;  // > 464, inf and NaN (464 itself ties to 448)
  return static_cast<uint8_t>(sign | q);
}

// round_to_bf16 without branches (NaN keeps its payload's top bits and becomes quiet).
inline float round_bf16_nobranch(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet_nan = (u & 0xffff0000u) | 0x00400000u;
  const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

// Rounds x[0..n) to BF16 in place and returns the largest |x| (NaN values ignored, as fmax).
inline float round_bf16_and_amax(float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16_nobranch(x[i]);
  // Sixteen running maxima, one per lane, so the loop needs no reduction to vectorise.
  uint32_t lane[16] = {0};
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    for (int l = 0; l < 16; ++l) {
      uint32_t b;
      std::memcpy(&b, &x[i + l], 4);
      b &= 0x7fffffffu;
      b = b > 0x7f800000u ? 0u : b;  // NaN does not count
      lane[l] = b > lane[l] ? b : lane[l];  // non-negative floats order like their bits
    }
  }
  for (int64_t j = full; j < n; ++j) {
    uint32_t b;
    std::memcpy(&b, &x[j], 4);
    b &= 0x7fffffffu;
    b = b > 0x7f800000u ? 0u : b;
    lane[0] = b > lane[0] ? b : lane[0];
  }
  uint32_t amax_bits = 0;
  for (int l = 0; l < 16; ++l) amax_bits = lane[l] > amax_bits ? lane[l] : amax_bits;
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  return amax;
}

// SPEC §3.3 on x[0..n) (already BF16 values): e4m3(clamp(x / s, ±448)) with s a power of two.
inline void quantize_block(const float* __restrict x, int64_t n, float inv_scale, uint8_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    float y = x[i] * inv_scale;
    y = y > kE4M3Max ? kE4M3Max : y;
    y = y < -kE4M3Max ? -kE4M3Max : y;
    out[i] = e4m3_from_float_nobranch(y);
  }
}

}  // namespace cpu
}  // namespace dsa
