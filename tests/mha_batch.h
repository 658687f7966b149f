// The MHA-form prefill's test batch (tests/test_mha.cpp, tests/gpu/test_gpu_mha.cpp): a paged
// latent cache whose unused bytes are NaN, a shuffled block table, kv_b_proj, queries, guarded
// NaN-poisoned outputs, the float64 oracle, and the comparison in steps of the output dtype.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "dsa/dsa.h"
#include "oracle/oracle_attention.h"
#include "oracle/oracle_mha.h"
#include "test_util.h"

namespace mha_test {

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::Rng;

constexpr float kScale = 0.125f;
const double kKvFlipLse = std::ldexp(1.0, -10);  // see AgainstOracleBothGeometriesAndCaches

struct Seq {
  int32_t q_len, kv_len;
};

// A batch: paged cache (every byte 0xFF = NaN until written; only context slots are written),
// shuffled block table, kv_b_proj, queries, NaN-poisoned guarded outputs.
struct Batch {
  int64_t H, nope, v, page, B, T = 0, max_blocks = 0, num_blocks = 0;
  bool fp8, q_f32, out_f32, sink;
  Guarded cache;
  std::vector<int32_t> cu_q, kv_lens, table;
  std::vector<uint16_t> w_bf;
  std::vector<double> w;
  std::vector<uint16_t> qn_bf, qp_bf;
  std::vector<float> qn_f, qp_f;
  std::vector<double> qn, qp;
  std::vector<float> sink_f;
  std::vector<double> sink_d;
  Guarded out, lse;

  Batch(uint64_t seed, const std::vector<Seq>& seqs, int64_t H_, int64_t nope_, int64_t v_, bool fp8_, int64_t page_,
        bool q_f32_ = false, bool out_f32_ = false, bool sink_ = false)
      : H(H_), nope(nope_), v(v_), page(page_), B(static_cast<int64_t>(seqs.size())), fp8(fp8_), q_f32(q_f32_),
        out_f32(out_f32_), sink(sink_) {
    Rng rng(seed);
    cu_q.push_back(0);
    for (const Seq& s : seqs) {
      cu_q.push_back(cu_q.back() + s.q_len);
      kv_lens.push_back(s.kv_len);
      max_blocks = std::max<int64_t>(max_blocks, (s.kv_len + page - 1) / page);
    }
    max_blocks += 1;  // one spare column, -1 (never used)
    T = cu_q.back();
    num_blocks = B * max_blocks + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    table.assign(static_cast<size_t>(B * max_blocks), -1);
    const int64_t tb = fp8 ? kMlaFp8TokenBytes : kMlaBf16TokenBytes;
    cache = Guarded(static_cast<size_t>(num_blocks * page * tb), 0xFF);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < (kv_lens[b] + page - 1) / page; ++j) table[b * max_blocks + j] = perm[next++];
      for (int64_t j = 0; j < kv_lens[b]; ++j) {
        const int64_t slot = int64_t{table[b * max_blocks + j / page]} * page + j % page;
        write_token(rng, cache.as<uint8_t>() + slot * tb);
      }
    }
    const int64_t N = H * (nope + v);
    std::vector<float> wf = dsa_test::random_floats(rng, static_cast<size_t>(N * 512), 0.05f);
    w_bf = dsa_test::to_bf16(wf);
    for (uint16_t x : w_bf) w.push_back(bf16_to_float(x));
    make_q(rng, T * H * nope, &qn_bf, &qn_f, &qn);
    make_q(rng, T * H * 64, &qp_bf, &qp_f, &qp);
    if (sink) {
      for (int64_t h = 0; h < H; ++h) sink_f.push_back(rng.uniform(-2.f, 4.f));
      sink_d.assign(sink_f.begin(), sink_f.end());
    }
    out = Guarded(static_cast<size_t>(T * H * v) * (out_f32 ? 4 : 2));
    lse = Guarded(static_cast<size_t>(T * H) * 4);
    poison();
  }

  void poison() {
    if (out_f32) dsa_test::poison_f32(out.as<float>(), static_cast<size_t>(T * H * v));
    else dsa_test::poison_bf16(out.as<uint16_t>(), static_cast<size_t>(T * H * v));
    dsa_test::poison_f32(lse.as<float>(), static_cast<size_t>(T * H));
  }

  void make_q(Rng& rng, int64_t n, std::vector<uint16_t>* bf, std::vector<float>* f, std::vector<double>* exact) {
    *f = dsa_test::random_floats(rng, static_cast<size_t>(n), 1.f);
    *bf = dsa_test::to_bf16(*f);
    if (!q_f32) *f = dsa_test::from_bf16(*bf);
    exact->assign(f->begin(), f->end());
  }

  void write_token(Rng& rng, uint8_t* tok) {
    std::vector<float> x(576);
    for (auto& e : x) e = rng.normal();
    if (!fp8) {
      for (int d = 0; d < 576; ++d) {
        const uint16_t b = float_to_bf16(x[d]);
        std::memcpy(tok + 2 * d, &b, 2);
      }
      return;
    }
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(round_to_bf16(x[tile * 128 + i])));
      const float s = ue8m0_scale(amax);
      for (int i = 0; i < 128; ++i) tok[tile * 128 + i] = quantize_e4m3(round_to_bf16(x[tile * 128 + i]), 1.f / s);
      std::memcpy(tok + kMlaFp8ScaleOffset + 4 * tile, &s, 4);
    }
    for (int d = 0; d < 64; ++d) {
      const uint16_t b = float_to_bf16(x[512 + d]);
      std::memcpy(tok + kMlaFp8RopeOffset + 2 * d, &b, 2);
    }
  }

  MlaCacheDesc cache_desc() {
    MlaCacheDesc c;
    c.data = cache.data();
    c.dtype = fp8 ? MlaCacheDtype::kFP8 : MlaCacheDtype::kBF16;
    c.num_blocks = num_blocks;
    c.page_size = page;
    return c;
  }

  DenseMhaPrefillParams params() {
    DenseMhaPrefillParams p;
    if (q_f32) {
      p.q_nope = dsa_test::t_f32(qn_f.data(), {T, H, nope});
      p.q_pe = dsa_test::t_f32(qp_f.data(), {T, H, 64});
    } else {
      p.q_nope = dsa_test::t_bf16(qn_bf.data(), {T, H, nope});
      p.q_pe = dsa_test::t_bf16(qp_bf.data(), {T, H, 64});
    }
    p.cache = cache_desc();
    p.block_table = dsa_test::t_i32(table.data(), {B, max_blocks});
    p.kv_lens = dsa_test::t_i32(kv_lens.data(), {B});
    p.cu_seqlens_q = dsa_test::t_i32(cu_q.data(), {B + 1});
    p.kv_b_proj = dsa_test::t_bf16(w_bf.data(), {H * (nope + v), 512});
    if (sink) p.attn_sink = dsa_test::t_f32(sink_f.data(), {H});
    p.sm_scale = kScale;
    p.out = out_f32 ? dsa_test::t_f32(out.as<float>(), {T, H, v}) : dsa_test::t_bf16(out.as<uint16_t>(), {T, H, v});
    p.lse = dsa_test::t_f32(lse.as<float>(), {T, H});
    return p;
  }

  std::vector<double> latents() const {
    return oracle::decode_mla_cache(cache.data(), fp8, num_blocks, page, 0);
  }
  oracle::MhaResult oracle_result(bool round_kv) const {
    return oracle::dense_mha(qn, qp, T, H, nope, v, w, latents(), cu_q, table, max_blocks, kv_lens, page, sink_d,
                             kScale, round_kv);
  }
  double out_at(size_t i) const { return out_f32 ? out.as<float>()[i] : bf16_to_float(out.as<uint16_t>()[i]); }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b(static_cast<const uint8_t*>(out.data()), static_cast<const uint8_t*>(out.data()) + out.size());
    b.insert(b.end(), static_cast<const uint8_t*>(lse.data()), static_cast<const uint8_t*>(lse.data()) + lse.size());
    return b;
  }
};

// |got - want| within `steps` steps of the output dtype, plus `rel` of the row's Σp|v| scale
// and the f32 rounding of the scores carried through the weights.
inline void expect_close(const Batch& b, const oracle::MhaResult& ref, double steps, double rel, double lse_abs,
                  const std::string& what) {
  int64_t bad = 0;
  std::string first;
  const double eps32 = std::ldexp(1.0, -24);
  for (int64_t r = 0; r < b.T * b.H; ++r) {
    const double got_lse = b.lse.as<float>()[r], ref_lse = ref.lse[static_cast<size_t>(r)];
    const double ds = 16 * eps32 * ref.score_scale[static_cast<size_t>(r)];
    if (!(std::fabs(got_lse - ref_lse) <= lse_abs * std::max(1.0, ref.score_scale[static_cast<size_t>(r)]) + ds +
                                              8 * eps32 * std::fabs(ref_lse))) {
      if (bad++ == 0) first = "lse row " + std::to_string(r) + ": got " + std::to_string(got_lse) + ", want " + std::to_string(ref_lse);
    }
    for (int64_t d = 0; d < b.v; ++d) {
      const size_t i = static_cast<size_t>(r * b.v + d);
      const double got = b.out_at(i), want = ref.out[i], sc = ref.out_scale[i];
      const double step = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 1e-30)) - (b.out_f32 ? 23 : 7));
      const bool ok = std::fabs(got - want) <= steps * step + (rel + ds + 16 * eps32) * sc;
      if (!ok && bad++ == 0)
        first = "out row " + std::to_string(r) + " dim " + std::to_string(d) + ": got " + std::to_string(got) +
                ", want " + std::to_string(want) + " (scale " + std::to_string(sc) + ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": first mismatch: " << first;
  EXPECT_TRUE(b.out.intact()) << what << ": wrote outside out";
  EXPECT_TRUE(b.lse.intact()) << what << ": wrote outside lse";
}

}  // namespace mha_test
