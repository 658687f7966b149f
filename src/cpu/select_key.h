// The order key of top-k selection (SPEC §3.5), shared by the CPU top-k and the fused
// score-and-select so both rank every value the same way.
#pragma once
#include <cstdint>

#include "dsa/numerics.h"

namespace dsa {
namespace cpu {

// Monotone in value: larger float -> larger key. Every NaN -> 0 (below -inf's key); -0 -> +0.
// Branch-free so the key loop vectorises.
inline uint32_t order_key(float f) {
  uint32_t u = float_bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0u : u;
  const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u;
  return nan ? 0u : (u ^ flip);
}

}  // namespace cpu
}  // namespace dsa
