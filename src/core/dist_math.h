// The lse merge of one (token, head), shared by the CPU and CUDA backends (dsa/dist.h).
#pragma once
#include <cmath>
#include <cstdint>

#include "dsa/numerics.h"

namespace dsa {
namespace distops {

// lse[r * stride] for r < R -> merged lse (+inf when no rank has a key) and the weights
// w[r] = exp(lse_r - lse) (0 for ranks without a key). Ranks in order 0 .. R-1, f32.
template <int kMaxR>
DSA_HD float lse_merge_weights(const float* lse, int64_t stride, int R, float* w) {
  const float kInf = INFINITY;
  float m = -kInf;
  bool any = false;
  for (int r = 0; r < R && r < kMaxR; ++r) {
    const float l = lse[r * stride];
    if (!(l == kInf)) {
      any = true;
      m = fmaxf(m, l);
    }
  }
  if (!any) {
    for (int r = 0; r < R && r < kMaxR; ++r) w[r] = 0.f;
    return kInf;
  }
  float s = 0.f;
  for (int r = 0; r < R && r < kMaxR; ++r) {
    const float l = lse[r * stride];
    if (!(l == kInf)) s += expf(l - m);
  }
  const float L = m + logf(s);
  for (int r = 0; r < R && r < kMaxR; ++r) {
    const float l = lse[r * stride];
    w[r] = (l == kInf) ? 0.f : expf(l - L);
  }
  return L;
}

// The sink factor exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)).
DSA_HD float sink_factor(float lse, float sink) { return 1.f / (1.f + expf(sink - lse)); }

constexpr int kMaxRanks = 64;

// Ownership of global key positions (docs/distributed.md).
DSA_HD int owner_of(int64_t g, int ranks, int64_t interleave) {
  return static_cast<int>((g / interleave) % ranks);
}
DSA_HD int64_t local_of(int64_t g, int ranks, int64_t interleave) {
  return (g / (interleave * ranks)) * interleave + g % interleave;
}
DSA_HD int64_t global_of(int64_t l, int ranks, int rank, int64_t interleave) {
  return (l / interleave) * interleave * ranks + int64_t{rank} * interleave + l % interleave;
}


}  // namespace distops
}  // namespace dsa
