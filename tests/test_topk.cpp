// Top-k selection and index mapping against the oracle.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "dsa/numerics.h"
#include "oracle/oracle_logits.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::Rng;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Runs topk on rows x [M, W] and checks indices (exactly the oracle's, which fixes the tie rule)
// and values (logits at each index, -inf at -1).
// bf16: x must hold bf16 values (exactly representable); the op reads them as bf16 and must
// give the answer of their f32 values.
void check_topk(const std::vector<float>& x, int64_t M, int64_t W, const std::vector<int32_t>& lengths,
                int64_t k, const char* what, bool bf16 = false) {
  Guarded idx(static_cast<size_t>(M * k) * 4), val(static_cast<size_t>(M * k) * 4);
  dsa_test::poison_f32(val.as<float>(), static_cast<size_t>(M * k));
  std::vector<uint16_t> xb;
  TopkParams p;
  p.logits = dsa_test::t_f32(const_cast<float*>(x.data()), {M, W});
  if (bf16) {
    for (float v : x) {
      xb.push_back(float_to_bf16(v));
      const float back = bf16_to_float(xb.back());
      ASSERT_EQ(0, std::memcmp(&v, &back, 4)) << what << ": not a bf16 value";
    }
    p.logits.data = xb.data();
    p.logits.dtype = DType::kBF16;
  }
  p.lengths = dsa_test::t_i32(const_cast<int32_t*>(lengths.data()), {M});
  p.k = k;
  p.indices = dsa_test::t_i32(idx.as<int32_t>(), {M, k});
  p.values = dsa_test::t_f32(val.as<float>(), {M, k});
  // Scratch comes from the workspace: 8 bytes per column per row slot, none when W <= k.
  const size_t ws_bytes = topk_workspace_size(p);
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  EXPECT_EQ(ws_bytes, W <= k ? 0u : static_cast<size_t>(std::min<int64_t>(M, hw)) * ((W * 8 + 63) / 64 * 64));
  Guarded ws(ws_bytes);
  p.workspace = ws_bytes ? ws.data() : nullptr;
  p.workspace_bytes = ws_bytes;
  DSA_ASSERT_OK(topk(p));
  ASSERT_TRUE(idx.intact() && val.intact() && ws.intact()) << what;
  for (int64_t i = 0; i < M; ++i) {
    auto ref = oracle::topk_row(&x[i * W], lengths[i], k);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t got = idx.as<int32_t>()[i * k + j];
      ASSERT_EQ(got, ref[j]) << what << ": row " << i << " slot " << j << " (len " << lengths[i] << ")";
      const float v = val.as<float>()[i * k + j];
      if (got < 0) ASSERT_EQ(v, -kInf);
      else ASSERT_EQ(0, std::memcmp(&v, &x[i * W + got], 4)) << what;
    }
  }
}

}  // namespace

TEST(Topk, LengthsAroundKMatchOracle) {
  for (int64_t k : {64, 2048}) {
    Rng rng(k);
    const int64_t W = 2 * k + 37;
    std::vector<int32_t> lengths = {0, 1, static_cast<int32_t>(k - 1), static_cast<int32_t>(k),
                                    static_cast<int32_t>(k + 1), static_cast<int32_t>(W), 100, 63};
    const int64_t M = static_cast<int64_t>(lengths.size());
    std::vector<float> x = dsa_test::random_floats(rng, static_cast<size_t>(M * W));
    check_topk(x, M, W, lengths, k, "random");
  }
}

TEST(Topk, LargeK) {
  Rng rng(9);
  const int64_t k = 16384, W = 20000;
  std::vector<int32_t> lengths = {20000, 16384, 16385};
  std::vector<float> x = dsa_test::random_floats(rng, static_cast<size_t>(3 * W));
  for (int64_t j = 0; j < W; j += 7) x[j] = 0.5f;  // ties across the threshold
  check_topk(x, 3, W, lengths, k, "k=16384");
}

TEST(Topk, HeavyTiesGoToLowerIndex) {
  Rng rng(4);
  const int64_t W = 1000, k = 64;
  std::vector<float> x(static_cast<size_t>(4 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = 1.0f;                                            // all equal: indices 0..63
    x[W + j] = static_cast<float>(rng.integer(0, 2));       // three values, hundreds of each
    x[2 * W + j] = (j % 2) ? 0.0f : -0.0f;                  // -0 ties +0 by value
    x[3 * W + j] = j < 10 ? 5.f : 2.f;                      // 10 clear winners, then ties
  }
  std::vector<int32_t> lengths(4, static_cast<int32_t>(W));
  check_topk(x, 4, W, lengths, k, "ties");
}

TEST(Topk, NanRanksBelowMinusInf) {
  const int64_t W = 300, k = 64;
  std::vector<float> x(static_cast<size_t>(4 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = kNaN;                                          // all NaN: lowest indices
    x[W + j] = (j % 3 == 0) ? -kInf : kNaN;               // 100 -inf beat 200 NaN
    x[2 * W + j] = j < 30 ? static_cast<float>(j) : (j % 2 ? -kInf : -kNaN);  // 30 numbers, then -inf
    x[3 * W + j] = j == 299 ? kInf : (j % 5 == 0 ? kNaN : -1e30f * static_cast<float>(j));
  }
  std::vector<int32_t> lengths(4, static_cast<int32_t>(W));
  check_topk(x, 4, W, lengths, k, "nan");
}

TEST(Topk, AdversarialOrders) {
  const int64_t W = 5000, k = 2048;
  std::vector<float> x(static_cast<size_t>(5 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = static_cast<float>(j);                                  // ascending
    x[W + j] = static_cast<float>(-j);                             // descending
    x[2 * W + j] = 1.0f + static_cast<float>(j % 97) * 1.1920929e-7f;  // differ only in low bits
    x[3 * W + j] = std::ldexp(1.0f, -140) * static_cast<float>(j % 13);  // subnormals
    x[4 * W + j] = -kInf;
  }
  std::vector<int32_t> lengths(5, static_cast<int32_t>(W));
  lengths[4] = 4000;
  check_topk(x, 5, W, lengths, k, "adversarial");
}

// Rows built to defeat radix selection: one first-digit bucket holding 100K keys, keys that
// differ only in the last mantissa bit, all but a few equal, signed zeros, -inf runs.
std::vector<float> adversarial_row(int kind, int64_t W, Rng& rng) {
  std::vector<float> x(static_cast<size_t>(W));
  for (int64_t j = 0; j < W; ++j) {
    float v = 0.f;
    switch (kind) {
      case 0: v = 1.f + std::ldexp(static_cast<float>(rng.integer(0, (1 << 20) - 1)), -23); break;  // [1, 1.125)
      case 1: v = j % 2 ? std::nextafter(1.5f, 2.f) : 1.5f; break;  // last mantissa bit
      case 2: v = (j % 9973 == 17) ? 3.f + static_cast<float>(j % 5) : 0.25f; break;  // a few winners
      case 3: v = (j % 3 == 0) ? -0.f : (j % 3 == 1 ? 0.f : -1.f); break;
      case 4: v = (j / 700) % 2 ? -kInf : static_cast<float>(rng.integer(-2, 2)); break;
      default: v = rng.normal(); break;
    }
    x[static_cast<size_t>(j)] = v;
  }
  return x;
}

TEST(Topk, AdversarialBucketsTiesZerosAndInfRuns) {
  Rng rng(12);
  const int64_t W = 100000;
  for (int64_t k : {64, 2048, 16384}) {
    std::vector<float> x;
    for (int kind = 0; kind < 5; ++kind) {
      const auto row = adversarial_row(kind, W, rng);
      x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<int32_t> lengths = {static_cast<int32_t>(W), static_cast<int32_t>(W - 1), static_cast<int32_t>(W),
                                    static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 3)};
    check_topk(x, 5, W, lengths, k, "adversarial rows");
  }
}

TEST(Topk, MillionKeyRows) {
  Rng rng(13);
  const int64_t W = 1048576, k = 2048;
  std::vector<float> x = dsa_test::random_floats(rng, static_cast<size_t>(2 * W));
  for (int64_t j = 0; j < W; j += 3) x[W + j] = 0.75f;  // ties across the threshold in row 1
  check_topk(x, 2, W, {static_cast<int32_t>(W), static_cast<int32_t>(W - 5)}, k, "1M keys");
}

// bf16 rows give the answer of their exact f32 values: ties are common (8 mantissa bits),
// NaN and -inf included.
TEST(Topk, Bf16LogitsMatchTheirF32Values) {
  Rng rng(14);
  for (int64_t k : {64, 2048}) {
    const int64_t W = 3 * k + 11, M = 6;
    std::vector<float> x(static_cast<size_t>(M * W));
    for (int64_t e = 0; e < M * W; ++e) {
      const int64_t c = rng.integer(0, 40);
      const float v = c == 0 ? kNaN : c == 1 ? -kInf : c == 2 ? -0.f : rng.normal();
      x[static_cast<size_t>(e)] = bf16_to_float(float_to_bf16(v));
    }
    std::vector<int32_t> lengths = {0, 1, static_cast<int32_t>(k - 1), static_cast<int32_t>(k),
                                    static_cast<int32_t>(k + 1), static_cast<int32_t>(W)};
    check_topk(x, M, W, lengths, k, "bf16", true);
  }
}

TEST(Topk, RejectsBadArgumentsNamingThem) {
  std::vector<float> x(2 * 100);
  std::vector<int32_t> lengths = {10, 100}, idx(2 * 64);
  std::vector<float> val(2 * 64);
  std::vector<uint8_t> ws(2 * 1024);
  auto base = [&] {
    TopkParams p;
    p.logits = dsa_test::t_f32(x.data(), {2, 100});
    p.lengths = dsa_test::t_i32(lengths.data(), {2});
    p.k = 64;
    p.indices = dsa_test::t_i32(idx.data(), {2, 64});
    p.workspace = ws.data();
    p.workspace_bytes = ws.size();
    return p;
  };
  DSA_ASSERT_OK(topk(base()));
  {
    TopkParams p = base();
    p.workspace_bytes = 800 - 1;  // one slot is 8 * 100 bytes, rounded to 832
    EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"topk", "workspace", "832"}));
  }
  for (int64_t k : {0, -64, 100, 16448}) {
    auto p = base(); p.k = k;
    EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"topk", "k", "multiple of 64"})) << k;
  }
  auto p = base(); p.indices.shape[1] = 128;
  EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"indices", "k"}));
  p = base(); p.values = dsa_test::t_f32(val.data(), {2, 64}); p.values.dtype = DType::kBF16;
  EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"values", "f32"}));
  p = base(); p.logits.dtype = DType::kI32;
  EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"logits"}));
  p = base(); p.lengths.shape[0] = 3;
  EXPECT_TRUE(dsa_test::fails_naming(topk(p), {"lengths", "M"}));
  lengths = {10, 101};
  EXPECT_TRUE(dsa_test::fails_naming(topk(base()), {"lengths[1]", "W = 100"}));
  lengths = {-1, 5};
  EXPECT_TRUE(dsa_test::fails_naming(topk(base()), {"lengths[0]"}));
}

// ---- map_indices -------------------------------------------------------------------------

TEST(MapIndices, FlatAndPagedMatchOracleIncludingInvalid) {
  Rng rng(31);
  const int64_t B = 3, rows_per_seq = 2, M = B * rows_per_seq, K = 64, page = 16, max_blocks = 5;
  const int64_t len = max_blocks * page;
  // The last sequence's largest index lands exactly on INT32_MAX (flat); past it is an error on
  // the host (tests/test_adversarial.cpp), so the flat form takes no index >= len here.
  std::vector<int32_t> kv_start = {0, 1000, static_cast<int32_t>(2147483647 - (len - 1))};
  std::vector<int32_t> bt(B * max_blocks);
  for (auto& e : bt) e = static_cast<int32_t>(rng.integer(0, 200));
  bt[1] = -1;                   // sequence 0, page 1: absent
  bt[2 * max_blocks + 4] = 134217727;  // 134217727 * 16 + 15 still fits in int32
  const std::vector<int64_t> invalid = {INT_MIN, -2, -1, len, len + 1, INT_MAX};
  std::vector<int32_t> ind(M * K);
  for (int64_t e = 0; e < M * K; ++e)
    ind[e] = e % K < static_cast<int64_t>(invalid.size()) ? static_cast<int32_t>(invalid[e % K])
                                                           : static_cast<int32_t>(rng.integer(0, len - 1));
  std::vector<int32_t> row_seq = {2, 0, 1, 1, 0, 2};
  for (bool use_row_seq : {false, true}) {
    for (IndexMapKind kind : {IndexMapKind::kFlat, IndexMapKind::kPaged}) {
      Guarded out(M * K * 4);
      std::vector<int32_t> in = ind;
      if (kind == IndexMapKind::kFlat)
        for (auto& v : in) v = v >= len ? static_cast<int32_t>(len - 1) : v;
      MapIndicesParams p;
      p.indices = dsa_test::t_i32(in.data(), {M, K});
      if (use_row_seq) p.row_seq = dsa_test::t_i32(row_seq.data(), {M});
      p.rows_per_seq = rows_per_seq;
      p.kind = kind;
      p.kv_start = dsa_test::t_i32(kv_start.data(), {B});
      p.block_table = dsa_test::t_i32(bt.data(), {B, max_blocks});
      p.page_size = page;
      p.out = dsa_test::t_i32(out.as<int32_t>(), {M, K});
      DSA_ASSERT_OK(map_indices(p));
      ASSERT_TRUE(out.intact());
      for (int64_t i = 0; i < M; ++i) {
        const int64_t b = use_row_seq ? row_seq[i] : i / rows_per_seq;
        for (int64_t c = 0; c < K; ++c) {
          const int64_t j = in[i * K + c];
          const int32_t want = kind == IndexMapKind::kFlat ? oracle::map_flat(kv_start[b], j)
                                                           : oracle::map_paged(&bt[b * max_blocks], max_blocks, page, j);
          ASSERT_EQ(out.as<int32_t>()[i * K + c], want) << "row " << i << " j " << j;
          if (j < 0 || (kind == IndexMapKind::kPaged && j >= len)) {
            ASSERT_EQ(want, -1);
          }
        }
      }
    }
  }
  // In place (out aliases indices) gives the same answer.
  std::vector<int32_t> inplace = ind;
  MapIndicesParams p;
  p.indices = dsa_test::t_i32(inplace.data(), {M, K});
  p.rows_per_seq = rows_per_seq;
  p.kind = IndexMapKind::kPaged;
  p.block_table = dsa_test::t_i32(bt.data(), {B, max_blocks});
  p.page_size = page;
  p.out = p.indices;
  DSA_ASSERT_OK(map_indices(p));
  for (int64_t e = 0; e < M * K; ++e)
    ASSERT_EQ(inplace[e], oracle::map_paged(&bt[(e / K / rows_per_seq) * max_blocks], max_blocks, page, ind[e]));
}

TEST(MapIndices, RejectsBadArgumentsNamingThem) {
  std::vector<int32_t> ind(4 * 64), out(4 * 64), kv_start = {0, 5}, bt(2 * 3), row_seq = {0, 1, 1, 0};
  auto base = [&] {
    MapIndicesParams p;
    p.indices = dsa_test::t_i32(ind.data(), {4, 64});
    p.rows_per_seq = 2;
    p.kv_start = dsa_test::t_i32(kv_start.data(), {2});
    p.out = dsa_test::t_i32(out.data(), {4, 64});
    return p;
  };
  DSA_ASSERT_OK(map_indices(base()));
  auto p = base(); p.out.shape[1] = 32;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"map_indices", "out"}));
  p = base(); p.rows_per_seq = 1;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"kv_start", "rows_per_seq"}));
  p = base(); p.rows_per_seq = 0;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"rows_per_seq"}));
  p = base(); p.kv_start = TensorDesc{};
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"kv_start", "required"}));
  p = base(); p.kind = IndexMapKind::kPaged;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"block_table", "required"}));
  p.block_table = dsa_test::t_i32(bt.data(), {2, 3}); p.page_size = 0;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"page_size"}));
  p.page_size = int64_t{1} << 40;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"page_size"}));
  p.page_size = 64;
  DSA_ASSERT_OK(map_indices(p));
  p = base(); p.row_seq = dsa_test::t_i32(row_seq.data(), {4});
  DSA_ASSERT_OK(map_indices(p));
  row_seq[2] = 2;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(p), {"row_seq[2]", "B = 2"}));
  kv_start[1] = -5;
  EXPECT_TRUE(dsa_test::fails_naming(map_indices(base()), {"kv_start[1]"}));
}

// One row slot of scratch (less parallelism) gives the same bits as one per thread.
TEST(Topk, FewerScratchSlotsThanThreadsSameResult) {
  dsa_test::Rng rng(99);
  const int64_t M = 9, W = 5000, k = 128;
  std::vector<float> x = dsa_test::random_floats(rng, static_cast<size_t>(M * W));
  std::vector<int32_t> lengths(M, static_cast<int32_t>(W));
  lengths[3] = 100;
  std::vector<int32_t> a(M * k), b(M * k);
  TopkParams p;
  p.logits = dsa_test::t_f32(x.data(), {M, W});
  p.lengths = dsa_test::t_i32(lengths.data(), {M});
  p.k = k;
  p.indices = dsa_test::t_i32(a.data(), {M, k});
  std::vector<uint8_t> ws(topk_workspace_size(p));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  DSA_ASSERT_OK(topk(p));
  p.indices = dsa_test::t_i32(b.data(), {M, k});
  p.workspace_bytes = static_cast<size_t>((W * 8 + 63) / 64 * 64);  // exactly one slot
  DSA_ASSERT_OK(topk(p));
  EXPECT_EQ(a, b);
}
