// The small geometry and mixed batch the GPU layer-step suites share: caches with each
// sequence's earlier tokens already written (on the host, by the CPU ops) and NaN poison
// (0xFF bytes) everywhere else, plus the new tokens' random inputs.
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "gpu_util.h"

namespace dsa_gpu_test {
namespace step_batch {

using namespace dsa;

constexpr int64_t kH = 4, kHi = 2, kK = 64, kPage = 16, kMaxPos = 4096;

inline ModelGeometry tiny() {
  ModelGeometry g;
  g.name = "tiny";
  g.num_heads = kH;
  g.qk_nope_head_dim = 128;
  g.v_head_dim = 128;
  g.index_heads = kHi;
  g.topk = kK;
  g.index_rope = RopeStyle::kInterleaved;
  g.num_layers = 3;
  g.num_mtp_layers = 1;
  g.max_positions = kMaxPos;
  g.sm_scale = 0.0625;
  return g;
}

// A batch with its caches' earlier tokens written (on the host, by the CPU ops).
struct Batch {
  std::vector<int32_t> q_lens, kv_lens, block_table;
  int64_t B = 0, T = 0, max_blocks = 0, num_blocks = 0, max_kv = 0;
  std::vector<uint8_t> mla, idx;
  std::vector<float> cos_sin, iq, ik, iw;
  std::vector<uint16_t> kv_c, k_pe, q;  // bf16
};

inline Batch make_batch(const std::vector<std::pair<int32_t, int32_t>>& seqs, uint64_t seed) {
  Batch b;
  dsa_test::Rng rng(seed);
  b.B = static_cast<int64_t>(seqs.size());
  int64_t pages = 0;
  for (auto [q, kv] : seqs) {
    b.q_lens.push_back(q);
    b.kv_lens.push_back(kv);
    b.T += q;
    b.max_kv = std::max<int64_t>(b.max_kv, kv);
    b.max_blocks = std::max<int64_t>(b.max_blocks, (kv + kPage - 1) / kPage);
    pages += (kv + kPage - 1) / kPage;
  }
  b.num_blocks = pages + 2;
  std::vector<int32_t> perm(static_cast<size_t>(b.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  b.block_table.assign(static_cast<size_t>(b.B * b.max_blocks), -1);
  int64_t next = 0;
  for (int64_t s = 0; s < b.B; ++s)
    for (int64_t j = 0; j < (b.kv_lens[s] + kPage - 1) / kPage; ++j) b.block_table[s * b.max_blocks + j] = perm[next++];
  b.cos_sin.resize(static_cast<size_t>(kMaxPos * 64));
  for (int64_t p = 0; p < kMaxPos; ++p)
    for (int i = 0; i < 32; ++i) {
      const double a = p * std::pow(10000.0, -i / 32.0);
      b.cos_sin[p * 64 + i] = static_cast<float>(std::cos(a));
      b.cos_sin[p * 64 + 32 + i] = static_cast<float>(std::sin(a));
    }
  b.mla.assign(static_cast<size_t>(b.num_blocks * kPage * kMlaBf16TokenBytes), 0xFF);  // NaN poison
  b.idx.assign(static_cast<size_t>(b.num_blocks * kPage * kIndexerTokenBytes), 0xFF);
  std::vector<int64_t> slots;
  std::vector<int32_t> pos;
  for (int64_t s = 0; s < b.B; ++s)
    for (int32_t j = 0; j < b.kv_lens[s] - b.q_lens[s]; ++j) {
      slots.push_back(int64_t{b.block_table[s * b.max_blocks + j / kPage]} * kPage + j % kPage);
      pos.push_back(j);
    }
  const int64_t P = static_cast<int64_t>(slots.size());
  if (P > 0) {
    auto c = dsa_test::random_floats(rng, static_cast<size_t>(P * 512));
    auto pe = dsa_test::random_floats(rng, static_cast<size_t>(P * 64));
    auto k = dsa_test::random_floats(rng, static_cast<size_t>(P * 128));
    MlaCacheDesc mc;
    mc.data = b.mla.data();
    mc.num_blocks = b.num_blocks;
    mc.page_size = kPage;
    WriteMlaCacheParams w;
    w.kv_c = make_tensor(c.data(), DType::kF32, {P, 512});
    w.k_pe = make_tensor(pe.data(), DType::kF32, {P, 64});
    w.where.slots = make_tensor(slots.data(), DType::kI64, {P});
    w.cache = mc;
    EXPECT_TRUE(write_mla_cache(w).ok());
    std::vector<uint8_t> k8(static_cast<size_t>(P * 128));
    std::vector<float> ks(static_cast<size_t>(P));
    PrepareIndexerKParams pk;
    pk.k = make_tensor(k.data(), DType::kF32, {P, 128});
    pk.positions = make_tensor(pos.data(), DType::kI32, {P});
    pk.cos_sin = make_tensor(b.cos_sin.data(), DType::kF32, {kMaxPos, 64});
    pk.rope = RopeStyle::kInterleaved;
    pk.k_out = make_tensor(k8.data(), DType::kE4M3, {P, 128});
    pk.k_scale = make_tensor(ks.data(), DType::kF32, {P});
    EXPECT_TRUE(prepare_indexer_k(pk).ok());
    IndexerCacheDesc ic;
    ic.data = b.idx.data();
    ic.num_blocks = b.num_blocks;
    ic.page_size = kPage;
    WriteIndexerCacheParams wi;
    wi.k = pk.k_out;
    wi.k_scale = pk.k_scale;
    wi.where.slots = w.where.slots;
    wi.cache = ic;
    EXPECT_TRUE(write_indexer_cache(wi).ok());
  }
  b.kv_c = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(b.T * 512)));
  b.k_pe = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(b.T * 64)));
  b.q = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(b.T * kH * 576), 0.5f));
  b.iq = dsa_test::random_floats(rng, static_cast<size_t>(b.T * kHi * 128));
  b.ik = dsa_test::random_floats(rng, static_cast<size_t>(b.T * 128));
  b.iw = dsa_test::random_floats(rng, static_cast<size_t>(b.T * kHi));
  return b;
}

}  // namespace step_batch
}  // namespace dsa_gpu_test
