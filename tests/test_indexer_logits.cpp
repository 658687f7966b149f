// Indexer logits (flat and paged) against the float64 oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "cpu/parallel.h"
#include "oracle/oracle_logits.h"
#include "indexer_cases.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::Rng;
using dsa_test::Inputs;
using dsa_test::PagedCache;
using dsa_test::QuantRows;
using dsa_test::make_cache;
using dsa_test::make_inputs;
using dsa_test::quantise;

namespace {

constexpr int64_t D = 128;
const float kNegInf = -std::numeric_limits<float>::infinity();

// |got - ref| in f32 steps of the score's magnitude Σ_h |w'| Σ_d |q·k| s_k (cancellation-safe).
double magnitude(const Inputs& in, int64_t i, const uint8_t* k8, float ks) {
  double m = 0;
  for (int64_t h = 0; h < in.H; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d)
      dot += std::fabs(static_cast<double>(e4m3_to_float(in.q.x8[(i * in.H + h) * D + d])) * e4m3_to_float(k8[d]));
    m += std::fabs(in.weights[i * in.H + h]) * dot;
  }
  return m * ks;
}

constexpr double kMaxSteps = 4;  // observed <= 0.05 on random data

// Checks every entry: -inf exactly where the oracle has -inf, else within kMaxSteps.
::testing::AssertionResult matches(const float* got, const std::vector<double>& ref, int64_t W,
                                   const std::function<double(int64_t, int64_t)>& mag) {
  for (size_t e = 0; e < ref.size(); ++e) {
    const int64_t i = static_cast<int64_t>(e) / W, c = static_cast<int64_t>(e) % W;
    if (std::isinf(ref[e])) {
      if (got[e] != kNegInf) return ::testing::AssertionFailure() << "(" << i << "," << c << "): expected -inf, got " << got[e];
      continue;
    }
    if (!std::isfinite(got[e])) return ::testing::AssertionFailure() << "(" << i << "," << c << "): got " << got[e] << ", ref " << ref[e];
    const double m = std::max(mag(i, c), 1e-30);
    const double steps = std::fabs(got[e] - ref[e]) / (m * std::ldexp(1.0, -23));
    if (steps > kMaxSteps)
      return ::testing::AssertionFailure() << "(" << i << "," << c << "): got " << got[e] << ", ref " << ref[e] << " (" << steps << " steps)";
  }
  return ::testing::AssertionSuccess();
}

// A ragged prefill batch: sequences with cached prefixes laid out back to back in k.
struct Ragged {
  std::vector<int32_t> ks, ke;
  int64_t N = 0, max_len = 0;
};
Ragged ragged(const std::vector<std::pair<int, int>>& kv_q) {  // (kv_len, q_len) per sequence
  Ragged r;
  for (auto [kv, ql] : kv_q) {
    for (int i = 0; i < ql; ++i) {
      r.ks.push_back(static_cast<int32_t>(r.N));
      r.ke.push_back(static_cast<int32_t>(r.N + kv - ql + i + 1));
    }
    r.N += kv;
    r.max_len = std::max<int64_t>(r.max_len, kv);
  }
  return r;
}

struct FlatRun {
  Guarded out;
  Status st;
};
FlatRun run_flat(Inputs& in, Ragged& rg, int64_t col_offset, int64_t W) {
  const int64_t M = static_cast<int64_t>(rg.ks.size());
  FlatRun r{Guarded(static_cast<size_t>(M * W) * 4), {}};
  dsa_test::poison_f32(r.out.as<float>(), static_cast<size_t>(M * W));
  IndexerLogitsParams p;
  p.q = dsa_test::t_e4m3(in.q.x8.data(), {M, in.H, D});
  p.weights = dsa_test::t_f32(in.weights.data(), {M, in.H});
  p.k = dsa_test::t_e4m3(in.k.x8.data(), {rg.N, D});
  p.k_scale = dsa_test::t_f32(in.k.scale.data(), {rg.N});
  p.ks = dsa_test::t_i32(rg.ks.data(), {M});
  p.ke = dsa_test::t_i32(rg.ke.data(), {M});
  p.col_offset = col_offset;
  p.logits = dsa_test::t_f32(r.out.as<float>(), {M, W});
  r.st = indexer_logits(p);
  return r;
}

}  // namespace

TEST(IndexerLogits, RaggedPrefillWithPrefixesMatchesOracle) {
  for (int64_t H : {8, 3, 64}) {
    Rng rng(11 + H);
    Ragged rg = ragged({{70, 70}, {150, 9}, {1, 1}, {129, 5}, {64, 64}});
    Inputs in = make_inputs(rng, static_cast<int64_t>(rg.ks.size()), H, rg.N);
    // Unused key slots past every row's keys hold NaN (e4m3 0x7f, NaN scale): never read.
    in.k.x8.resize(static_cast<size_t>((rg.N + 40) * D), 0x7f);
    in.k.scale.resize(static_cast<size_t>(rg.N + 40), std::numeric_limits<float>::quiet_NaN());
    rg.N += 40;
    const int64_t W = rg.max_len + 7;
    FlatRun r = run_flat(in, rg, 0, W);
    DSA_ASSERT_OK(r.st);
    ASSERT_TRUE(r.out.intact());
    auto ref = oracle::indexer_logits(in.q.x8, in.weights, in.k.x8, in.k.scale, rg.ks, rg.ke, H, 0, W);
    EXPECT_TRUE(matches(r.out.as<float>(), ref, W, [&](int64_t i, int64_t c) {
      const int64_t j = rg.ks[i] + c;
      return magnitude(in, i, &in.k.x8[j * D], in.k.scale[j]);
    })) << "H=" << H;
  }
}

TEST(IndexerLogits, ColumnTilesEqualUntiledBitForBit) {
  Rng rng(3);
  Ragged rg = ragged({{300, 40}, {90, 3}});
  const int64_t M = static_cast<int64_t>(rg.ks.size());
  Inputs in = make_inputs(rng, M, 5, rg.N);
  const int64_t W = rg.max_len;
  FlatRun full = run_flat(in, rg, 0, W);
  DSA_ASSERT_OK(full.st);
  for (int64_t tile : {64, 100, 1}) {
    for (int64_t off = 0; off < W; off += tile) {
      const int64_t w = std::min(tile, W - off);
      FlatRun t = run_flat(in, rg, off, w);
      DSA_ASSERT_OK(t.st);
      ASSERT_TRUE(t.out.intact());
      for (int64_t i = 0; i < M; ++i)
        ASSERT_EQ(0, std::memcmp(t.out.as<float>() + i * w, full.out.as<float>() + i * W + off, w * 4))
            << "tile " << tile << " offset " << off << " row " << i;
    }
  }
  // A tile that starts past every row's keys is all -inf.
  FlatRun past = run_flat(in, rg, W + 5, 3);
  DSA_ASSERT_OK(past.st);
  for (int64_t e = 0; e < M * 3; ++e) EXPECT_EQ(past.out.as<float>()[e], kNegInf);
}

TEST(IndexerLogits, SmallAndOddShapes) {
  for (auto shape : std::vector<std::array<int, 3>>{{1, 1, 1}, {1, 1, 0}, {0, 2, 5}, {3, 1, 2}, {7, 3, 33}}) {
    Rng rng(shape[0] * 100 + shape[1] * 10 + shape[2]);
    const int M = shape[0], H = shape[1], N = shape[2];
    Ragged rg;
    rg.N = N;
    for (int i = 0; i < M; ++i) {
      rg.ks.push_back(static_cast<int32_t>(rng.integer(0, N)));
      rg.ke.push_back(static_cast<int32_t>(rng.integer(rg.ks.back(), N)));
    }
    Inputs in = make_inputs(rng, M, H, std::max(N, 1));
    const int64_t W = std::max(N, 1);
    FlatRun r = run_flat(in, rg, 0, W);
    DSA_ASSERT_OK(r.st);
    ASSERT_TRUE(r.out.intact());
    auto ref = oracle::indexer_logits(in.q.x8, in.weights, in.k.x8, in.k.scale, rg.ks, rg.ke, H, 0, W);
    EXPECT_TRUE(matches(r.out.as<float>(), ref, W, [&](int64_t i, int64_t c) {
      const int64_t j = rg.ks[i] + c;
      return magnitude(in, i, &in.k.x8[j * D], in.k.scale[j]);
    })) << M << "x" << H << "x" << N;
  }
}

TEST(IndexerLogits, RepeatedRunsAndThreadCountsBitIdentical) {
  Rng rng(5);
  Ragged rg = ragged({{400, 13}, {77, 77}});
  const int64_t M = static_cast<int64_t>(rg.ks.size());
  Inputs in = make_inputs(rng, M, 16, rg.N);
  FlatRun a = run_flat(in, rg, 0, 400);
  FlatRun b = run_flat(in, rg, 0, 400);
  const int threads = cpu::pool_threads();
  cpu::set_pool_threads(1);
  FlatRun c = run_flat(in, rg, 0, 400);
  cpu::set_pool_threads(threads);
  DSA_ASSERT_OK(a.st);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size()));
  EXPECT_EQ(0, std::memcmp(a.out.data(), c.out.data(), a.out.size()));
}

// FP8 against the FP32 math on the unquantised inputs: small score error, high top-k overlap.
TEST(IndexerLogits, Fp8CloseToUnquantisedMath) {
  Rng rng(17);
  const int64_t H = 32, L = 1024, k = 128;
  Ragged rg = ragged({{static_cast<int>(L), 4}});
  const int64_t M = 4;
  Inputs in = make_inputs(rng, M, H, rg.N);
  for (float& g : in.gate) g = std::fabs(g);  // gates of one sign, as trained indexers mostly have
  const float c = 1.f / std::sqrt(128.f * H);
  for (size_t i = 0; i < in.gate.size(); ++i) in.weights[i] = in.gate[i] * c * in.q.scale[i];
  std::vector<float> gate_c(in.gate.size());
  for (size_t i = 0; i < in.gate.size(); ++i) gate_c[i] = in.gate[i] * c;
  FlatRun r = run_flat(in, rg, 0, L);
  DSA_ASSERT_OK(r.st);
  auto exact = oracle::indexer_logits_exact(in.q.x, gate_c, in.k.x, rg.ks, rg.ke, H, L);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t len = rg.ke[i] - rg.ks[i];
    double max_abs = 0, max_err = 0;
    for (int64_t j = 0; j < len; ++j) {
      max_abs = std::max(max_abs, std::fabs(exact[i * L + j]));
      max_err = std::max(max_err, std::fabs(r.out.as<float>()[i * L + j] - exact[i * L + j]));
    }
    EXPECT_LT(max_err, 0.06 * max_abs) << max_err / max_abs << "row " << i;
    std::vector<float> ex(static_cast<size_t>(len));
    for (int64_t j = 0; j < len; ++j) ex[j] = static_cast<float>(exact[i * L + j]);
    auto a = oracle::topk_row(r.out.as<float>() + i * L, len, k);
    auto b = oracle::topk_row(ex.data(), len, k);
    std::set<int32_t> sa(a.begin(), a.end());
    int overlap = 0;
    for (int32_t x : b) overlap += sa.count(x) > 0;
    EXPECT_GE(overlap, 0.9 * k) << overlap << "row " << i;
  }
}

// ---- paged -------------------------------------------------------------------------------

namespace {

struct PagedCase {
  int64_t H;
  std::vector<int32_t> seq, len;  // per row (oracle form)
  Inputs in;
  std::vector<int64_t> key_offset;
  PagedCache cache;
};

Status run_paged(PagedCase& pc, const IndexerLogitsPagedParams& base, int64_t W, Guarded* out,
                 DType out_dtype = DType::kF32) {
  const int64_t R = static_cast<int64_t>(pc.seq.size());
  *out = Guarded(static_cast<size_t>(R * W) * 4);
  dsa_test::poison_f32(out->as<float>(), static_cast<size_t>(R * W));
  IndexerLogitsPagedParams p = base;
  p.q = dsa_test::t_e4m3(pc.in.q.x8.data(), {R, pc.H, D});
  p.weights = dsa_test::t_f32(pc.in.weights.data(), {R, pc.H});
  p.cache.data = pc.cache.bytes.data();
  p.cache.num_blocks = pc.cache.num_blocks;
  p.cache.page_size = pc.cache.page;
  p.cache.block_stride_bytes = pc.cache.block_bytes;
  const int64_t B = static_cast<int64_t>(pc.cache.block_table.size()) / pc.cache.max_blocks;
  p.block_table = dsa_test::t_i32(pc.cache.block_table.data(), {B, pc.cache.max_blocks});
  p.logits = out_dtype == DType::kBF16 ? dsa_test::t_bf16(reinterpret_cast<uint16_t*>(out->as<float>()), {R, W})
                                       : dsa_test::t_f32(out->as<float>(), {R, W});
  return indexer_logits_paged(p);
}

::testing::AssertionResult paged_matches(PagedCase& pc, const float* got, int64_t col_offset, int64_t W) {
  auto ref = oracle::indexer_logits_paged(pc.in.q.x8, pc.in.weights, pc.cache.bytes.as<uint8_t>(),
                                          pc.cache.block_bytes, pc.cache.page, pc.cache.block_table,
                                          pc.cache.max_blocks, pc.seq, pc.len, pc.H, col_offset, W);
  return matches(got, ref, W, [&](int64_t r, int64_t c) {
    const int64_t j = pc.key_offset[pc.seq[r]] + col_offset + c;
    return magnitude(pc.in, r, &pc.in.k.x8[j * D], pc.in.k.scale[j]);
  });
}

}  // namespace

TEST(IndexerLogitsPaged, DecodeNextNAroundPageEdges) {
  const std::vector<int64_t> kv = {63, 64, 65, 127, 128, 129, 4, 200};
  for (int64_t page : {64, 16, 12}) {
    for (int64_t next_n = 1; next_n <= 4; ++next_n) {
      Rng rng(page * 10 + next_n);
      PagedCase pc;
      pc.H = next_n == 3 ? 5 : 8;
      int64_t total = 0;
      for (int64_t l : kv) total += l;
      const int64_t R = static_cast<int64_t>(kv.size()) * next_n;
      pc.in = make_inputs(rng, R, pc.H, total);
      pc.cache = make_cache(rng, kv, page, pc.in.k, &pc.key_offset, page == 12 ? 16 : 0);
      std::vector<int32_t> kv_lens(kv.begin(), kv.end());
      for (int64_t r = 0; r < R; ++r) {
        pc.seq.push_back(static_cast<int32_t>(r / next_n));
        pc.len.push_back(static_cast<int32_t>(kv[r / next_n] - next_n + r % next_n + 1));
      }
      IndexerLogitsPagedParams p;
      p.kv_lens = dsa_test::t_i32(kv_lens.data(), {static_cast<int64_t>(kv.size())});
      p.next_n = next_n;
      const int64_t W = 210;
      Guarded out;
      DSA_ASSERT_OK(run_paged(pc, p, W, &out));
      ASSERT_TRUE(out.intact());
      EXPECT_TRUE(paged_matches(pc, out.as<float>(), 0, W)) << "page " << page << " next_n " << next_n;
      // A column tile that starts inside a page: bit-identical to the full result.
      p.col_offset = 61;
      Guarded tile;
      DSA_ASSERT_OK(run_paged(pc, p, 70, &tile));
      for (int64_t r = 0; r < R; ++r)
        ASSERT_EQ(0, std::memcmp(tile.as<float>() + r * 70, out.as<float>() + r * W + 61, 70 * 4)) << "row " << r;
    }
  }
}

TEST(IndexerLogitsPaged, GeneralRowsChunkedPrefillOverCachedPrefix) {
  Rng rng(23);
  const std::vector<int64_t> kv = {130, 64, 1};
  PagedCase pc;
  pc.H = 11;  // pair counts 66, 11, 33: micro-kernel remainders 0, 5, 3
  // sequence 0: 6 new tokens after a 124-token prefix; sequence 2 (1 token); sequence 1: 3 rows.
  const std::vector<std::pair<int, int>> rows = {{0, 125}, {0, 126}, {0, 127}, {0, 128}, {0, 129},
                                                 {0, 130}, {2, 1},   {1, 62},  {1, 63},  {1, 64}};
  for (auto [s, l] : rows) { pc.seq.push_back(s); pc.len.push_back(l); }
  const int64_t R = static_cast<int64_t>(rows.size());
  pc.in = make_inputs(rng, R, pc.H, 195);
  pc.cache = make_cache(rng, kv, 64, pc.in.k, &pc.key_offset);
  IndexerLogitsPagedParams p;
  p.row_seq = dsa_test::t_i32(pc.seq.data(), {R});
  p.row_len = dsa_test::t_i32(pc.len.data(), {R});
  for (int64_t off : {0, 64, 100}) {
    p.col_offset = off;
    Guarded out;
    DSA_ASSERT_OK(run_paged(pc, p, 140 - off, &out));
    ASSERT_TRUE(out.intact());
    EXPECT_TRUE(paged_matches(pc, out.as<float>(), off, 140 - off)) << "col_offset " << off;
  }
}

TEST(IndexerLogits, RejectsBadArgumentsNamingThem) {
  Rng rng(1);
  Ragged rg = ragged({{10, 2}});
  Inputs in = make_inputs(rng, 2, 4, rg.N);
  std::vector<float> out(2 * 10);
  auto base = [&] {
    IndexerLogitsParams p;
    p.q = dsa_test::t_e4m3(in.q.x8.data(), {2, 4, D});
    p.weights = dsa_test::t_f32(in.weights.data(), {2, 4});
    p.k = dsa_test::t_e4m3(in.k.x8.data(), {rg.N, D});
    p.k_scale = dsa_test::t_f32(in.k.scale.data(), {rg.N});
    p.ks = dsa_test::t_i32(rg.ks.data(), {2});
    p.ke = dsa_test::t_i32(rg.ke.data(), {2});
    p.logits = dsa_test::t_f32(out.data(), {2, 10});
    return p;
  };
  DSA_ASSERT_OK(indexer_logits(base()));
  auto p = base(); p.q.dtype = DType::kBF16;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"indexer_logits", "q", "e4m3"}));
  p = base(); p.q.shape[2] = 64;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"q", "128"}));
  p = base(); p.weights.shape[1] = 3;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"weights", "H_idx"}));
  p = base(); p.k_scale.shape[0] = 3;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"k_scale", "N"}));
  p = base(); p.logits.stride[1] = 2;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"logits", "contiguous"}));
  p = base(); p.col_offset = -1;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"col_offset"}));
  p = base(); p.col_offset = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"col_offset"}));
  std::vector<int32_t> bad_ks = {10, 0}, bad_ke = {10, 11};
  p = base(); p.ks = dsa_test::t_i32(bad_ks.data(), {2});
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"ks[0]", "ke"}));
  p = base(); bad_ks = {0, 0}; p.ks = dsa_test::t_i32(bad_ks.data(), {2}); p.ke = dsa_test::t_i32(bad_ke.data(), {2});
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"ke[1]", "N = 10"}));
  bad_ks = {-1, 0};
  p = base(); p.ks = dsa_test::t_i32(bad_ks.data(), {2});
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"ks[0]"}));
}

TEST(IndexerLogitsPaged, RejectsBadArgumentsNamingThem) {
  Rng rng(2);
  PagedCase pc;
  pc.H = 2;
  pc.in = make_inputs(rng, 2, 2, 70);
  pc.cache = make_cache(rng, {70}, 64, pc.in.k, &pc.key_offset);
  pc.seq = {0, 0};
  pc.len = {69, 70};
  std::vector<int32_t> kv_lens = {70};
  IndexerLogitsPagedParams p;
  p.kv_lens = dsa_test::t_i32(kv_lens.data(), {1});
  p.next_n = 2;
  Guarded out;
  DSA_ASSERT_OK(run_paged(pc, p, 80, &out));
  auto q = p; q.next_n = 1;
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"indexer_logits_paged", "q", "B * next_n"}));
  q = p; q.next_n = 0;
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"next_n"}));
  q = p; q.col_offset = -3;
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"col_offset"}));
  kv_lens = {1};
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, 80, &out), {"kv_lens[0]", "next_n"}));
  kv_lens = {1000};
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, 80, &out), {"kv_lens[0]", "max_blocks"}));
  kv_lens = {70};
  const int32_t saved = pc.cache.block_table[1];
  pc.cache.block_table[1] = static_cast<int32_t>(pc.cache.num_blocks);
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, 80, &out), {"block_table[0][1]", "num_blocks"}));
  // The same entry is not read when the columns stop before its page: no error.
  DSA_ASSERT_OK(run_paged(pc, p, 64, &out));
  pc.cache.block_table[1] = saved;
  std::vector<int32_t> row_seq = {0, 1}, row_len = {5, 5};
  q = p; q.row_seq = dsa_test::t_i32(row_seq.data(), {2});
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"row_len", "together"}));
  q.row_len = dsa_test::t_i32(row_len.data(), {2});
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"row_seq[1]", "B = 1"}));
  row_seq = {0, 0}; row_len = {5, -1};
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, q, 80, &out), {"row_len[1]"}));
  row_len = {5, 6};
  DSA_ASSERT_OK(run_paged(pc, q, 80, &out));
  pc.cache.page = 6;
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, 80, &out), {"cache", "page_size"}));
}

// skip_rows_up_to: rows seeing L <= it keys are not computed (logits rows keep their bytes, and
// their pages are not read, so a bad block-table entry there is not an error); every other row
// is bit-identical to the unskipped call.
TEST(IndexerLogitsPaged, SkipsShortRowsUntouched) {
  Rng rng(29);
  const std::vector<int64_t> kv = {130, 50, 65};
  PagedCase pc;
  pc.H = 8;
  const std::vector<std::pair<int, int>> rows = {{0, 129}, {0, 130}, {1, 49}, {1, 50}, {2, 64}, {2, 65}};
  for (auto [s, l] : rows) { pc.seq.push_back(s); pc.len.push_back(l); }
  const int64_t R = static_cast<int64_t>(rows.size()), W = 140;
  pc.in = make_inputs(rng, R, pc.H, 245);
  pc.cache = make_cache(rng, kv, 16, pc.in.k, &pc.key_offset);
  IndexerLogitsPagedParams p;
  p.row_seq = dsa_test::t_i32(pc.seq.data(), {R});
  p.row_len = dsa_test::t_i32(pc.len.data(), {R});
  Guarded full, part;
  DSA_ASSERT_OK(run_paged(pc, p, W, &full));
  pc.cache.block_table[1 * pc.cache.max_blocks + 0] = 1 << 20;  // sequence 1: only skipped rows
  p.skip_rows_up_to = 64;
  DSA_ASSERT_OK(run_paged(pc, p, W, &part));
  ASSERT_TRUE(part.intact());
  std::vector<float> poison(static_cast<size_t>(W));
  dsa_test::poison_f32(poison.data(), poison.size());
  for (int64_t r = 0; r < R; ++r) {
    const float* got = part.as<float>() + r * W;
    if (pc.len[r] <= 64) EXPECT_EQ(0, std::memcmp(got, poison.data(), W * 4)) << "skipped row " << r << " was written";
    else EXPECT_EQ(0, std::memcmp(got, full.as<float>() + r * W, W * 4)) << "row " << r;
  }
  p.skip_rows_up_to = 0;  // unskipped, the bad entry is read and refused
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, W, &part), {"block_table[1][0]"}));
  p.skip_rows_up_to = -1;
  EXPECT_TRUE(dsa_test::fails_naming(run_paged(pc, p, W, &part), {"skip_rows_up_to"}));
}

// BF16 logits: every value is the f32 logit rounded to nearest even (-inf stays -inf), flat and
// paged; other logits dtypes are refused naming the argument.
TEST(IndexerLogits, Bf16LogitsAreRoundedF32Logits) {
  Rng rng(31);
  Ragged rg = ragged({{300, 17}, {64, 64}});
  const int64_t M = static_cast<int64_t>(rg.ks.size()), H = 16, W = 320;
  Inputs in = make_inputs(rng, M, H, rg.N);
  std::vector<float> f32(static_cast<size_t>(M * W));
  std::vector<uint16_t> b16(static_cast<size_t>(M * W), 0x1234);
  IndexerLogitsParams p;
  p.q = dsa_test::t_e4m3(in.q.x8.data(), {M, H, D});
  p.weights = dsa_test::t_f32(in.weights.data(), {M, H});
  p.k = dsa_test::t_e4m3(in.k.x8.data(), {rg.N, D});
  p.k_scale = dsa_test::t_f32(in.k.scale.data(), {rg.N});
  p.ks = dsa_test::t_i32(rg.ks.data(), {M});
  p.ke = dsa_test::t_i32(rg.ke.data(), {M});
  p.logits = dsa_test::t_f32(f32.data(), {M, W});
  DSA_ASSERT_OK(indexer_logits(p));
  p.logits = dsa_test::t_bf16(b16.data(), {M, W});
  DSA_ASSERT_OK(indexer_logits(p));
  int64_t ninf = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    ASSERT_EQ(b16[i], float_to_bf16(f32[i])) << i;
    ninf += std::isinf(f32[i]) ? 1 : 0;
  }
  EXPECT_GT(ninf, 0);
  std::vector<int32_t> bad(static_cast<size_t>(M * W));
  p.logits = make_tensor(bad.data(), DType::kI32, {M, W});
  EXPECT_TRUE(dsa_test::fails_naming(indexer_logits(p), {"logits"}));

  PagedCase pc;
  pc.H = 8;
  pc.in = make_inputs(rng, 4, 8, 200);
  pc.cache = make_cache(rng, {130, 70}, 64, pc.in.k, &pc.key_offset);
  pc.seq = {0, 0, 1, 1};
  pc.len = {129, 130, 69, 70};
  std::vector<int32_t> kv_lens = {130, 70};
  IndexerLogitsPagedParams q;
  q.kv_lens = dsa_test::t_i32(kv_lens.data(), {2});
  q.next_n = 2;
  Guarded a, b;
  DSA_ASSERT_OK(run_paged(pc, q, 150, &a));
  DSA_ASSERT_OK(run_paged(pc, q, 150, &b, DType::kBF16));
  const uint16_t* bb = reinterpret_cast<const uint16_t*>(b.as<float>());
  for (int64_t i = 0; i < 4 * 150; ++i) ASSERT_EQ(bb[i], float_to_bf16(a.as<float>()[i])) << i;
}
