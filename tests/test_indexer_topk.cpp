// Fused score-and-select (indexer_topk) against the unfused path (indexer_logits_paged, then
// topk) on the same inputs, and against the float64 oracle's scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "indexer_cases.h"
#include "oracle/oracle_logits.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::Rng;

namespace {

constexpr int64_t D = dsa_test::kIndexDim;

// One batch of paged rows: rows (seq, len) in the general form, or the decode form when
// next_n > 0.
struct Case {
  int64_t H = 8, k = 64, next_n = 0;
  std::vector<int64_t> seq_lens;       // tokens of each sequence in the cache
  std::vector<int32_t> seq, len;       // per row
  std::vector<int32_t> kv_lens;        // decode form
  dsa_test::Inputs in;
  std::vector<int64_t> key_offset;
  dsa_test::PagedCache cache;
  int64_t width() const { return len.empty() ? 0 : *std::max_element(len.begin(), len.end()); }
  int64_t rows() const { return static_cast<int64_t>(seq.size()); }
};

// General-form rows: each (seq, len) pair is a row of sequence seq that sees len keys.
Case make_case(uint64_t seed, const std::vector<int64_t>& seq_lens, const std::vector<std::pair<int, int>>& rows,
               int64_t H, int64_t k, int64_t page = 64) {
  Rng rng(seed);
  Case c;
  c.H = H;
  c.k = k;
  c.seq_lens = seq_lens;
  for (auto [s, l] : rows) {
    c.seq.push_back(s);
    c.len.push_back(l);
  }
  int64_t total = 0;
  for (int64_t l : seq_lens) total += l;
  c.in = dsa_test::make_inputs(rng, c.rows(), H, total);
  c.cache = dsa_test::make_cache(rng, seq_lens, page, c.in.k, &c.key_offset);
  return c;
}

void fill_base(Case& c, IndexerCacheDesc* cache, TensorDesc* bt) {
  cache->data = c.cache.bytes.data();
  cache->num_blocks = c.cache.num_blocks;
  cache->page_size = c.cache.page;
  cache->block_stride_bytes = c.cache.block_bytes;
  const int64_t B = static_cast<int64_t>(c.seq_lens.size());
  *bt = dsa_test::t_i32(c.cache.block_table.data(), {B, c.cache.max_blocks});
}

// The fused op: indices [R, k] (guarded) with an exactly sized, guarded workspace.
struct Fused {
  Status st;
  Guarded idx, ws;
  size_t ws_bytes = 0;
};
IndexerTopkParams fused_params(Case& c, int64_t width) {
  IndexerTopkParams p;
  const int64_t R = c.rows();
  p.q = dsa_test::t_e4m3(c.in.q.x8.data(), {R, c.H, D});
  p.weights = dsa_test::t_f32(c.in.weights.data(), {R, c.H});
  fill_base(c, &p.cache, &p.block_table);
  if (c.next_n > 0) {
    p.kv_lens = dsa_test::t_i32(c.kv_lens.data(), {static_cast<int64_t>(c.kv_lens.size())});
    p.next_n = c.next_n;
  } else {
    p.row_seq = dsa_test::t_i32(c.seq.data(), {R});
    p.row_len = dsa_test::t_i32(c.len.data(), {R});
  }
  p.width = width;
  p.k = c.k;
  return p;
}
Fused run_fused(Case& c, int64_t width = -1) {
  if (width < 0) width = c.width();
  const int64_t R = c.rows();
  IndexerTopkParams p = fused_params(c, width);
  Fused f;
  f.idx = Guarded(static_cast<size_t>(R * c.k) * 4, 0xEE);
  p.indices = dsa_test::t_i32(f.idx.as<int32_t>(), {R, c.k});
  f.ws_bytes = indexer_topk_workspace_size(p);
  f.ws = Guarded(f.ws_bytes, 0xCD);
  p.workspace = f.ws.data();
  p.workspace_bytes = f.ws_bytes;
  f.st = indexer_topk(p);
  return f;
}

// The unfused path: f32 logits [R, width] then topk.
std::vector<int32_t> run_unfused(Case& c, std::vector<float>* logits_out = nullptr) {
  const int64_t R = c.rows(), W = std::max<int64_t>(c.width(), 1);
  std::vector<float> logits(static_cast<size_t>(R * W));
  IndexerLogitsPagedParams lp;
  lp.q = dsa_test::t_e4m3(c.in.q.x8.data(), {R, c.H, D});
  lp.weights = dsa_test::t_f32(c.in.weights.data(), {R, c.H});
  fill_base(c, &lp.cache, &lp.block_table);
  std::vector<int32_t> row_len = c.len;
  lp.row_seq = dsa_test::t_i32(c.seq.data(), {R});
  lp.row_len = dsa_test::t_i32(row_len.data(), {R});
  lp.skip_rows_up_to = c.k;
  lp.logits = dsa_test::t_f32(logits.data(), {R, W});
  EXPECT_TRUE(indexer_logits_paged(lp).ok());
  TopkParams tp;
  tp.logits = lp.logits;
  tp.lengths = lp.row_len;
  tp.k = c.k;
  std::vector<int32_t> idx(static_cast<size_t>(R * c.k));
  tp.indices = dsa_test::t_i32(idx.data(), {R, c.k});
  std::vector<uint8_t> ws(topk_workspace_size(tp));
  tp.workspace = ws.data();
  tp.workspace_bytes = ws.size();
  EXPECT_TRUE(topk(tp).ok());
  if (logits_out) *logits_out = std::move(logits);
  return idx;
}

// Fused == unfused entry for entry (both ascending, then -1), indices and workspace guards
// intact.
::testing::AssertionResult same_as_unfused(Case& c, Fused& f, const std::vector<int32_t>& ref) {
  if (!f.st.ok()) return ::testing::AssertionFailure() << f.st.to_string();
  if (!f.idx.intact()) return ::testing::AssertionFailure() << "indices: sentinel bytes overwritten";
  if (!f.ws.intact()) return ::testing::AssertionFailure() << "workspace: sentinel bytes overwritten";
  const int32_t* got = f.idx.as<int32_t>();
  for (int64_t r = 0; r < c.rows(); ++r)
    for (int64_t j = 0; j < c.k; ++j)
      if (got[r * c.k + j] != ref[static_cast<size_t>(r * c.k + j)])
        return ::testing::AssertionFailure() << "row " << r << " (len " << c.len[r] << ") entry " << j << ": fused "
                                             << got[r * c.k + j] << ", unfused " << ref[static_cast<size_t>(r * c.k + j)];
  return ::testing::AssertionSuccess();
}

// Against the float64 oracle: each row's selection is k distinct keys (0..L-1 when L <= k)
// and no unselected key scores above a selected one by more than the f32 rounding of the
// scores (|err| <= 8 steps of the row's largest |score|).
::testing::AssertionResult valid_under_oracle(Case& c, const int32_t* got) {
  const int64_t W = std::max<int64_t>(c.width(), 1);
  auto ref = oracle::indexer_logits_paged(c.in.q.x8, c.in.weights, c.cache.bytes.as<uint8_t>(), c.cache.block_bytes,
                                          c.cache.page, c.cache.block_table, c.cache.max_blocks, c.seq, c.len, c.H, 0, W);
  for (int64_t r = 0; r < c.rows(); ++r) {
    const int64_t L = c.len[r];
    const int32_t* row = got + r * c.k;
    std::set<int32_t> sel;
    for (int64_t j = 0; j < c.k; ++j) {
      if (row[j] < 0) continue;
      if (row[j] >= L) return ::testing::AssertionFailure() << "row " << r << ": index " << row[j] << " >= L " << L;
      sel.insert(row[j]);
    }
    if (static_cast<int64_t>(sel.size()) != std::min(L, c.k))
      return ::testing::AssertionFailure() << "row " << r << ": " << sel.size() << " distinct indices, expected "
                                           << std::min(L, c.k);
    if (L <= c.k) continue;
    double lo = INFINITY, hi = -INFINITY, mag = 0;
    for (int64_t j = 0; j < L; ++j) {
      const double v = ref[static_cast<size_t>(r * W + j)];
      mag = std::max(mag, std::fabs(v));
      if (sel.count(static_cast<int32_t>(j))) lo = std::min(lo, v); else hi = std::max(hi, v);
    }
    if (hi > lo + 8 * mag * std::ldexp(1.0, -23))
      return ::testing::AssertionFailure() << "row " << r << ": an unselected key scores " << hi
                                           << " above the lowest selected " << lo;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(IndexerTopk, MatchesUnfusedAroundKAndPageEdges) {
  // Rows of a chunked prefill over cached prefixes: lengths just below, at and above k, across
  // page edges, with k 64 and 128 and page sizes 64 and 16.
  for (int64_t k : {64, 128}) {
    for (int64_t page : {64, 16}) {
      const std::vector<int64_t> seq_lens = {k + 70, 3 * k + 1, 17, 700};
      std::vector<std::pair<int, int>> rows;
      for (int l = static_cast<int>(k) - 2; l <= static_cast<int>(k) + 70; l += 9) rows.push_back({0, l});
      for (int l : {1, 2, 16, 17}) rows.push_back({2, l});
      for (int l = 3 * static_cast<int>(k) - 5; l <= 3 * static_cast<int>(k) + 1; ++l) rows.push_back({1, l});
      for (int l = 600; l <= 700; l += 7) rows.push_back({3, l});
      Case c = make_case(static_cast<uint64_t>(k * 100 + page), seq_lens, rows, 11, k, page);
      Fused f = run_fused(c);
      const auto ref = run_unfused(c);
      EXPECT_TRUE(same_as_unfused(c, f, ref)) << "k " << k << " page " << page;
      EXPECT_TRUE(valid_under_oracle(c, f.idx.as<int32_t>())) << "k " << k << " page " << page;
    }
  }
}

TEST(IndexerTopk, DecodeFormMatchesGeneralForm) {
  for (int64_t next_n : {1, 2, 4}) {
    const std::vector<int64_t> kv = {63, 64, 65, 129, 300, 1000};
    std::vector<std::pair<int, int>> rows;
    for (size_t b = 0; b < kv.size(); ++b)
      for (int64_t i = 0; i < next_n; ++i)
        rows.push_back({static_cast<int>(b), static_cast<int>(kv[b] - next_n + i + 1)});
    Case c = make_case(static_cast<uint64_t>(next_n), kv, rows, 5, 64, 64);
    const auto ref = run_unfused(c);
    Fused general = run_fused(c);
    EXPECT_TRUE(same_as_unfused(c, general, ref)) << "next_n " << next_n;
    c.next_n = next_n;
    c.kv_lens.assign(kv.begin(), kv.end());
    Fused decode = run_fused(c);
    EXPECT_TRUE(same_as_unfused(c, decode, ref)) << "decode form, next_n " << next_n;
  }
}

TEST(IndexerTopk, FewWideRowsSplitIntoSegmentsMatch) {
  // One, two and three rows of tens of thousands of keys: few rows leave threads idle, so each
  // row is split into key segments whose best are merged (on a many-core host; on two threads
  // a single row already takes two segments of 16384 keys).
  for (int rows_n : {1, 2, 3}) {
    std::vector<std::pair<int, int>> rows;
    for (int i = 0; i < rows_n; ++i) rows.push_back({0, 70000 - 13 * i});
    Case c = make_case(static_cast<uint64_t>(rows_n), {70000}, rows, 2, 512, 64);
    Fused f = run_fused(c);
    const auto ref = run_unfused(c);
    EXPECT_TRUE(same_as_unfused(c, f, ref)) << rows_n << " rows";
  }
}

TEST(IndexerTopk, MillionKeyRowMatchesUnfused) {
  const int64_t L = int64_t{1} << 20;
  Case c = make_case(7, {L}, {{0, static_cast<int>(L)}, {0, static_cast<int>(L - 4097)}}, 1, 2048, 64);
  Fused f = run_fused(c);
  const auto ref = run_unfused(c);
  EXPECT_TRUE(same_as_unfused(c, f, ref));
}

namespace {

// Keys whose scores strictly increase with j (q = e4m3 1.0 on dim 0 of every head, gate 1;
// key j = (1 + (j % 8) / 8) on dim 0, scale 2^(j / 8 - 120)): every key beats every earlier
// one, so every key is admitted and the candidate buffer overflows again every k + 64 keys.
void make_ascending(Case& c) {
  const int64_t n = c.in.k.scale.size();
  for (int64_t j = 0; j < n; ++j) {
    std::fill(c.in.k.x8.begin() + j * D, c.in.k.x8.begin() + (j + 1) * D, 0);
    c.in.k.x8[j * D] = quantize_e4m3(1.0f + static_cast<float>(j % 8) / 8.0f, 1.0f);
    c.in.k.scale[j] = std::ldexp(1.0f, static_cast<int>(j / 8) - 120);
  }
  for (size_t i = 0; i < c.in.q.x8.size(); ++i) c.in.q.x8[i] = (i % D == 0) ? quantize_e4m3(1.0f, 1.0f) : 0;
  std::fill(c.in.weights.begin(), c.in.weights.end(), 1.0f);
}

}  // namespace

TEST(IndexerTopk, AscendingScoresOverflowTheBufferAndStayExact) {
  const int64_t L = 1900, k = 64;
  Case c = make_case(3, {L}, {{0, static_cast<int>(L)}, {0, static_cast<int>(L - 100)}}, 1, k, 64);
  make_ascending(c);
  Rng rng(4);
  std::vector<int64_t> offs;
  c.cache = dsa_test::make_cache(rng, c.seq_lens, 64, c.in.k, &offs);
  const uint64_t before = cpu::indexer_topk_compactions();
  Fused f = run_fused(c);
  const uint64_t compactions = cpu::indexer_topk_compactions() - before;
  // Each row fills its 2k + 64 buffer, then compacts every k + 64 admitted keys.
  EXPECT_GE(compactions, 2u * ((L - 100 - (2 * k + 64)) / (k + 64)));
  ASSERT_TRUE(f.st.ok()) << f.st.to_string();
  const int32_t* got = f.idx.as<int32_t>();
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < k; ++j) ASSERT_EQ(got[r * k + j], c.len[r] - k + j) << "row " << r;
  EXPECT_TRUE(same_as_unfused(c, f, run_unfused(c)));
}

TEST(IndexerTopk, TiesFloodsAndNonFiniteScoresMatchUnfused) {
  const int64_t k = 64, L = 3000;
  std::vector<std::pair<int, int>> rows;
  for (int i = 0; i < 6; ++i) rows.push_back({0, static_cast<int>(L - 37 * i)});
  Case c = make_case(11, {L}, rows, 3, k, 64);
  // Keys: a flood of one key (every score ties) in [0, 1000), four distinct keys cycling in
  // [1000, 2000), random keys after.
  for (int64_t j = 0; j < 2000; ++j) {
    const int64_t src = j < 1000 ? 0 : 1000 + j % 4;
    std::memcpy(&c.in.k.x8[j * D], &c.in.k.x8[src * D], D);
    c.in.k.scale[j] = c.in.k.scale[src];
  }
  // Row 1: every score ties (zero query): the lowest k indices win. Rows 2 and 3: +inf and -inf
  // gates (inf or NaN scores, NaN ranking lowest). Row 4: NaN gate on one head.
  std::fill(c.in.q.x8.begin() + 1 * c.H * D, c.in.q.x8.begin() + 2 * c.H * D, 0);
  for (int64_t h = 0; h < c.H; ++h) {
    c.in.weights[2 * c.H + h] = std::numeric_limits<float>::infinity();
    c.in.weights[3 * c.H + h] = -std::numeric_limits<float>::infinity();
  }
  c.in.weights[4 * c.H + 1] = std::numeric_limits<float>::quiet_NaN();
  Rng rng(12);
  std::vector<int64_t> offs;
  c.cache = dsa_test::make_cache(rng, c.seq_lens, 64, c.in.k, &offs);
  Fused f = run_fused(c);
  EXPECT_TRUE(same_as_unfused(c, f, run_unfused(c)));
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(f.idx.as<int32_t>()[1 * k + j], j) << "all-tie row";
}

TEST(IndexerTopk, RerunsAndThreadCountsAreBitIdentical) {
  std::vector<std::pair<int, int>> rows;
  for (int i = 0; i < 40; ++i) rows.push_back({i % 3, 1500 + 31 * i});
  Case c = make_case(21, {4000, 3000, 2800}, rows, 4, 128, 64);
  Fused first = run_fused(c);
  ASSERT_TRUE(first.st.ok()) << first.st.to_string();
  for (int threads : {1, 3, 2}) {
    cpu::set_pool_threads(threads);
    Fused again = run_fused(c);
    ASSERT_TRUE(again.st.ok());
    EXPECT_EQ(0, std::memcmp(first.idx.data(), again.idx.data(), first.idx.size())) << threads << " threads";
  }
  cpu::set_pool_threads(0);
}

TEST(IndexerTopk, ShortRowsAreTheIdentityAndReadNoKey) {
  // Every row sees <= k keys: 0..L-1 then -1, and the block table (all -1 here) is never read.
  Case c = make_case(5, {100}, {{0, 0}, {0, 1}, {0, 63}, {0, 64}}, 2, 64, 64);
  std::fill(c.cache.block_table.begin(), c.cache.block_table.end(), -1);
  Fused f = run_fused(c, 64);
  ASSERT_TRUE(f.st.ok()) << f.st.to_string();
  EXPECT_EQ(f.ws_bytes, 0u);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(f.idx.as<int32_t>()[r * 64 + j], j < c.len[r] ? j : -1);
  // Zero rows.
  Case none = make_case(6, {10}, {}, 2, 64, 64);
  EXPECT_TRUE(run_fused(none, 0).st.ok());
}

TEST(IndexerTopk, WorkspaceIsExactAndNonDecreasing) {
  std::vector<std::pair<int, int>> rows;
  for (int i = 0; i < 20; ++i) rows.push_back({0, 2000});
  Case c = make_case(8, {2000}, rows, 2, 64, 64);
  IndexerTopkParams p = fused_params(c, 2000);
  std::vector<int32_t> idx(static_cast<size_t>(c.rows() * c.k));
  p.indices = dsa_test::t_i32(idx.data(), {c.rows(), c.k});
  const size_t need = indexer_topk_workspace_size(p);
  ASSERT_GT(need, 0u);
  std::vector<uint8_t> ws(need);
  p.workspace = ws.data();
  p.workspace_bytes = need - 1;
  EXPECT_TRUE(dsa_test::fails_naming(indexer_topk(p), {"workspace", std::to_string(need).c_str()}));
  p.workspace_bytes = need;
  DSA_ASSERT_OK(indexer_topk(p));
  // Non-decreasing in rows and in width (a planner searches chunk sizes over it).
  auto size_at = [&](int64_t R, int64_t W) {
    IndexerTopkParams q = p;
    for (TensorDesc* t : {&q.q, &q.weights, &q.row_seq, &q.row_len, &q.indices}) t->shape[0] = R;
    q.width = W;
    return indexer_topk_workspace_size(q);
  };
  const std::vector<int64_t> Rs = {1, 2, 15, 16, 17, 31, 33, 48, 49, 64, 65, 1000, 100000};
  const std::vector<int64_t> Ws = {64, 65, 5000, 16384, 40000, 65536, 1 << 20};
  for (size_t i = 0; i < Rs.size(); ++i)
    for (size_t j = 0; j < Ws.size(); ++j) {
      const size_t s = size_at(Rs[i], Ws[j]);
      if (Ws[j] == 64) EXPECT_EQ(s, 0u) << "rows of <= k keys need no scratch";
      if (i > 0) EXPECT_GE(s, size_at(Rs[i - 1], Ws[j])) << Rs[i] << " rows, width " << Ws[j];
      if (j > 0) EXPECT_GE(s, size_at(Rs[i], Ws[j - 1])) << Rs[i] << " rows, width " << Ws[j];
    }
}

TEST(IndexerTopk, RejectsBadArgumentsNamingThem) {
  std::vector<std::pair<int, int>> rows = {{0, 300}, {0, 200}};
  Case c = make_case(9, {300}, rows, 2, 64, 64);
  auto run = [&](auto&& edit) {
    IndexerTopkParams p = fused_params(c, 300);
    std::vector<int32_t> idx(static_cast<size_t>(2 * 64));
    p.indices = dsa_test::t_i32(idx.data(), {2, 64});
    std::vector<uint8_t> ws(1 << 22);
    p.workspace = ws.data();
    p.workspace_bytes = ws.size();
    edit(p);
    return indexer_topk(p);
  };
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams& p) { p.k = 100; }), {"k", "multiple of 64"}));
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams& p) { p.width = 299; }), {"row_len[0]", "width = 299"}));
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams& p) { p.width = -1; }), {"width"}));
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams& p) { p.indices.shape[1] = 128; }), {"indices"}));
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams& p) { p.row_len = TensorDesc{}; }), {"row_len"}));
  c.cache.block_table[2] = static_cast<int32_t>(c.cache.num_blocks);
  EXPECT_TRUE(dsa_test::fails_naming(run([](IndexerTopkParams&) {}), {"block_table[0][2]", "num_blocks"}));
  // On a CUDA device the call says what exists (no tensor is read).
  const Status st = run([](IndexerTopkParams& p) {
    for (TensorDesc* t : {&p.q, &p.weights, &p.block_table, &p.row_seq, &p.row_len, &p.indices})
      t->device = Device{DeviceType::kCUDA, 0};
    p.cache.device = Device{DeviceType::kCUDA, 0};
  });
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  const auto built = compiled_backends();
  if (std::find(built.begin(), built.end(), "cuda") != built.end())
    EXPECT_TRUE(dsa_test::fails_naming(st, {"indexer_topk", "cuda", "CPU only", "indexer_logits_paged"}));
  else  // a CPU-only build says so first
    EXPECT_TRUE(dsa_test::fails_naming(st, {"indexer_topk", "cuda", "cpu backend"}));
  EXPECT_FALSE(indexer_topk_available(DeviceType::kCUDA));
  EXPECT_TRUE(indexer_topk_available(DeviceType::kCPU));
}
