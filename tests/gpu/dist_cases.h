// Shared cases of the GPU distributed tests (single GPU with the in-process group, and the
// NCCL multi-GPU binary): adversarial top-k rows and lse-merge partials.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace dsa_dist_case {

// Rows [M, W] with their lengths: random, all equal, ties across shards, -inf, NaN, ±0, +inf.
inline void topk_rows(int64_t W, std::vector<float>* logits, std::vector<int32_t>* lengths, int64_t* M_out) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t M = 10;
  std::mt19937_64 gen(1234);
  std::normal_distribution<float> nd;
  logits->assign(static_cast<size_t>(M * W), 0.f);
  lengths->assign(static_cast<size_t>(M), static_cast<int32_t>(W));
  for (int64_t j = 0; j < W; ++j) {
    float* x = logits->data();
    x[0 * W + j] = nd(gen);
    x[1 * W + j] = 1.0f;
    x[2 * W + j] = static_cast<float>(j % 3);
    x[3 * W + j] = -inf;
    x[4 * W + j] = j % 5 == 0 ? nd(gen) : nan;
    x[5 * W + j] = j % 2 ? 0.0f : -0.0f;
    x[6 * W + j] = j % 7 == 0 ? inf : nd(gen);
    x[7 * W + j] = static_cast<float>((j * 37) % 11);
    x[8 * W + j] = nd(gen);
    x[9 * W + j] = nd(gen);
  }
  (*lengths)[8] = static_cast<int32_t>(W / 3);
  (*lengths)[9] = 0;
  *M_out = M;
}

// This rank's shard of rows [M, W] (interleave I over R ranks): local logits [M, W_local]
// and local lengths.
inline int64_t shard(const std::vector<float>& logits, const std::vector<int32_t>& lengths, int64_t M, int64_t W,
                     int R, int r, int64_t I, std::vector<float>* ll, std::vector<int32_t>* len) {
  int64_t Wl = 0;
  for (int64_t g = 0; g < W; ++g) Wl += ((g / I) % R) == r;
  ll->assign(static_cast<size_t>(std::max<int64_t>(M * Wl, 1)), std::numeric_limits<float>::quiet_NaN());
  len->assign(static_cast<size_t>(M), 0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t g = 0; g < W; ++g) {
      if ((g / I) % R != r) continue;
      const int64_t l = (g / (I * R)) * I + g % I;
      (*ll)[i * Wl + l] = logits[i * W + g];
      if (g < lengths[i]) (*len)[i] = static_cast<int32_t>(l + 1);
    }
  return Wl;
}

}  // namespace dsa_dist_case
