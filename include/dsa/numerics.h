// Bit-exact scalar conversions shared by every backend (host and device code alike).
//   bf16: round to nearest even; NaN stays NaN (quiet).
//   e4m3 "fn": bias 7, max 448, no infinities, NaN = 0x7f/0xff; round to nearest even;
//              values past 448 saturate only where the caller clamps first (SPEC §3.3 does).
//   ue8m0 scale: s = 2^ceil(log2(max(amax, 1e-4) / 448)), a power of two.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif

namespace dsa {

constexpr float kE4M3Max = 448.0f;
constexpr float kScaleAmaxFloor = 1e-4f;

DSA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DSA_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

DSA_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest even; overflow to inf is correct
  return static_cast<uint16_t>(u >> 16);
}

DSA_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

DSA_HD float e4m3_to_float(uint8_t v) {
  uint32_t sign = (v >> 7) & 1u;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t man = v & 0x7u;
  float mag;
  if (exp == 0xfu && man == 0x7u) {
    mag = bits_float(0x7fc00000u);  // NaN
  } else if (exp == 0) {
    mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9 (subnormal)
  } else {
    mag = bits_float(((exp + 120u) << 23) | (man << 20));  // 2^(exp-7) * 1.man
  }
  return sign ? -mag : mag;
}

// Round-to-nearest-even into E4M3fn. |f| > 448 rounds like the format would if it had
// more range: values in (448, 464] round to 448 (464, the midpoint to the next, nonexistent,
// step, ties to the even 448 as in PyTorch's float8_e4m3fn cast); values past 464 and
// infinities become NaN. SPEC callers clamp to ±448 first, so never see NaN.
DSA_HD uint8_t float_to_e4m3(float f) {
  uint32_t u = float_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  if (a > 0x43e80000u) return static_cast<uint8_t>(sign | 0x7fu);  // > 464 (and inf): NaN
  if (a < 0x3c800000u) {
    // Below 2^-6: subnormal range, steps of 2^-9. Scale exactly and round half to even.
    float x = bits_float(a) * 512.0f;  // exact (power-of-two scaling of a normal float)
    uint32_t q = static_cast<uint32_t>(x);
    float rem = x - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q += 1;
    return static_cast<uint8_t>(sign | q);  // q == 8 is the smallest normal, encoded alike
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped bits.
  uint32_t exp = (a >> 23) - 120u;  // e4m3 biased exponent, 1..15
  uint32_t man = a & 0x7fffffu;
  uint32_t keep = man >> 20;
  uint32_t rest = man & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) keep += 1;
  if (keep == 8u) { keep = 0; exp += 1; }
  return static_cast<uint8_t>(sign | (exp << 3) | keep);
}

// The power-of-two scale of SPEC §3.3: 2^ceil(log2(max(amax, 1e-4) / 448)).
// Computed without log2 so it is exact on every backend: for r = amax / 448 (rounded
// to float), the answer is the smallest power of two >= r.
DSA_HD float ue8m0_scale(float amax) {
  float a = amax > kScaleAmaxFloor ? amax : kScaleAmaxFloor;  // NaN amax takes the floor too
  float r = a / kE4M3Max;
  uint32_t u = float_bits(r);
  uint32_t exp = u >> 23;              // r is positive and normal here (>= 1e-4/448)
  if ((u & 0x7fffffu) != 0) exp += 1;  // not already a power of two: round up
  return bits_float(exp << 23);
}

// x / s clamped to ±448 and rounded to E4M3 (s a power of two, so x / s is exact).
DSA_HD uint8_t quantize_e4m3(float x, float inv_scale) {
  float y = x * inv_scale;
  y = y > kE4M3Max ? kE4M3Max : (y < -kE4M3Max ? -kE4M3Max : y);
  return float_to_e4m3(y);
}

}  // namespace dsa
