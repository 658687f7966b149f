// GPU indexer logits (flat and paged) against the CPU backend. Both accumulate in f32 in
// different orders, so scores are compared within 64 f32 steps of their natural error scale
// s_k · Σ_h |w_h| Σ_d |q_hd k_d| (an exact bound on either backend's rounding); the positions
// of -inf (invalid columns) must match exactly. Device index data cannot be validated, so
// out-of-range ks/ke, block-table entries, row_seq and lengths must read as invalid keys.
#include <climits>
#include <cmath>
#include <limits>

#include "gpu_util.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

uint8_t random_e4m3(Rng& rng) {
  // Mostly moderate magnitudes, no NaN code.
  const float v = rng.normal() * 24.f;
  return quantize_e4m3(v, 1.f);
}

struct Queries {
  int64_t R, H;
  std::vector<uint8_t> q;    // [R, H, 128]
  std::vector<float> w;      // [R, H]
  std::vector<double> qabs;  // [R, 128]: Σ_h |w_h| |q_hd|, for the error scale
};

Queries make_queries(Rng& rng, int64_t R, int64_t H) {
  Queries Q{R, H, std::vector<uint8_t>(static_cast<size_t>(R * H * 128)), std::vector<float>(static_cast<size_t>(R * H)),
            std::vector<double>(static_cast<size_t>(R * 128), 0.0)};
  for (auto& b : Q.q) b = random_e4m3(rng);
  for (auto& w : Q.w) w = rng.normal() * 0.01f;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int d = 0; d < 128; ++d)
        Q.qabs[r * 128 + d] += std::fabs(static_cast<double>(Q.w[r * H + h])) * std::fabs(e4m3_to_float(Q.q[(r * H + h) * 128 + d]));
  return Q;
}

double error_scale(const Queries& Q, int64_t r, const uint8_t* key, float scale) {
  double s = 0;
  for (int d = 0; d < 128; ++d) s += Q.qabs[r * 128 + d] * std::fabs(e4m3_to_float(key[d]));
  return s * std::fabs(static_cast<double>(scale));
}

// got vs ref for one row; key_of(c) gives the key bytes and scale of column c (valid columns).
template <class KeyOf>
::testing::AssertionResult row_close(const Queries& Q, int64_t r, const float* got, const float* ref, int64_t W, KeyOf key_of) {
  for (int64_t c = 0; c < W; ++c) {
    const bool ref_inf = std::isinf(ref[c]) && ref[c] < 0, got_inf = std::isinf(got[c]) && got[c] < 0;
    if (ref_inf != got_inf)
      return ::testing::AssertionFailure() << "row " << r << " col " << c << ": -inf mismatch, got " << got[c] << " ref " << ref[c];
    if (ref_inf) continue;
    if (std::isnan(ref[c]) || std::isnan(got[c])) {  // a NaN-poisoned key inside a row's length
      if (std::isnan(ref[c]) && std::isnan(got[c])) continue;
      return ::testing::AssertionFailure() << "row " << r << " col " << c << ": NaN mismatch, got " << got[c] << " ref " << ref[c];
    }
    float scale = 0;
    const uint8_t* key = key_of(c, &scale);
    const double tol = 64.0 * std::ldexp(1.0, -24) * error_scale(Q, r, key, scale) + 1e-30;
    if (std::isnan(tol) || std::isinf(tol)) {  // a poisoned key (NaN codes: relu gives 0) must agree exactly
      if (got[c] == ref[c]) continue;
      return ::testing::AssertionFailure() << "row " << r << " col " << c << " (poisoned key): got " << got[c] << " ref " << ref[c];
    }
    if (!(std::fabs(static_cast<double>(got[c]) - ref[c]) <= tol))
      return ::testing::AssertionFailure() << "row " << r << " col " << c << ": got " << got[c] << " ref " << ref[c] << " tol " << tol;
  }
  return ::testing::AssertionSuccess();
}

struct FlatCase { int64_t H; std::vector<int64_t> seq_lens; std::vector<int64_t> q_lens; int64_t W, col_offset; };

void run_flat(const FlatCase& fc, uint64_t seed) {
  Rng rng(seed);
  // Keys of all sequences back to back; rows are each sequence's last q_len tokens (causal).
  std::vector<int32_t> ks, ke;
  int64_t N = 0;
  for (size_t b = 0; b < fc.seq_lens.size(); ++b) {
    const int64_t kv = fc.seq_lens[b], ql = fc.q_lens[b];
    for (int64_t i = 0; i < ql; ++i) {
      ks.push_back(static_cast<int32_t>(N));
      ke.push_back(static_cast<int32_t>(N + kv - ql + i + 1));
    }
    N += kv;
  }
  const int64_t M = static_cast<int64_t>(ks.size()), H = fc.H, W = fc.W;
  Queries Q = make_queries(rng, M, H);
  std::vector<uint8_t> k(static_cast<size_t>(std::max<int64_t>(N, 1) * 128));
  for (auto& b : k) b = random_e4m3(rng);
  std::vector<float> kscale(static_cast<size_t>(std::max<int64_t>(N, 1)));
  for (auto& s : kscale) s = std::ldexp(1.f, static_cast<int>(rng.integer(-8, 2)));

  std::vector<float> ref(static_cast<size_t>(M * W));
  IndexerLogitsParams hp;
  hp.q = make_tensor(Q.q.data(), DType::kE4M3, {M, H, 128});
  hp.weights = make_tensor(Q.w.data(), DType::kF32, {M, H});
  hp.k = make_tensor(k.data(), DType::kE4M3, {N, 128});
  hp.k_scale = make_tensor(kscale.data(), DType::kF32, {N});
  hp.ks = make_tensor(ks.data(), DType::kI32, {M});
  hp.ke = make_tensor(ke.data(), DType::kI32, {M});
  hp.col_offset = fc.col_offset;
  hp.logits = make_tensor(ref.data(), DType::kF32, {M, W});
  DSA_ASSERT_OK(indexer_logits(hp));

  DeviceBuffer dq(Q.q), dw(Q.w), dk(k), dks(kscale), dks_(ks), dke(ke), dout(M * W * 4, 0xFF);
  IndexerLogitsParams gp = hp;
  gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {M, H});
  gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
  gp.k_scale = dev_tensor(dks, DType::kF32, {N});
  gp.ks = dev_tensor(dks_, DType::kI32, {M});
  gp.ke = dev_tensor(dke, DType::kI32, {M});
  gp.logits = dev_tensor(dout, DType::kF32, {M, W});
  DSA_ASSERT_OK(indexer_logits(gp));
  ASSERT_TRUE(device_clean());
  const std::vector<float> got = dout.download<float>();
  for (int64_t r = 0; r < M; ++r) {
    auto key_of = [&](int64_t c, float* s) {
      const int64_t j = ks[r] + fc.col_offset + c;
      *s = kscale[j];
      return &k[j * 128];
    };
    ASSERT_TRUE(row_close(Q, r, &got[r * W], &ref[r * W], W, key_of));
  }
  DSA_ASSERT_OK(indexer_logits(gp));
  EXPECT_TRUE(same_bits(dout.download<float>(), got, "repeat run"));
}

}  // namespace

TEST(GpuLogits, FlatMatchesCpu) {
  DSA_REQUIRE_GPU();
  const FlatCase cases[] = {
      {64, {1}, {1}, 1, 0},
      {64, {300}, {300}, 300, 0},                // causal prefill
      {32, {500, 129, 77}, {40, 129, 5}, 512, 0},  // prefix-cached, ragged
      {3, {260}, {17}, 100, 130},                // column tile past col_offset, odd heads
      {64, {1000}, {3}, 1200, 0},                // W beyond every row: -inf tail
      {40, {200, 0}, {200, 0}, 256, 0},
      {128, {700}, {9}, 700, 0},                 // more heads than the tensor-core kernel takes
      {16, {1500}, {2}, 1100, 300},              // chunk-crossing column tile
  };
  uint64_t seed = 300;
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "H " << c.H << " W " << c.W << " col_offset " << c.col_offset);
    run_flat(c, seed++);
  }
}

// A 128K-key context: two decode-like rows of one sequence against every key.
TEST(GpuLogits, FlatLongContext128K) {
  DSA_REQUIRE_GPU();
  run_flat(FlatCase{64, {131072}, {2}, 131072, 0}, 333);
}

// Device ks/ke outside [0, N] or crossed: only keys inside [max(ks, 0), min(ke, N)) count.
TEST(GpuLogits, FlatInvalidRangesReadAsInvalidKeys) {
  DSA_REQUIRE_GPU();
  Rng rng(9);
  const int64_t N = 300, H = 8, W = 320;
  const std::vector<int32_t> ks = {0, -5, INT_MIN, 10, 250, 100, 299, 300, INT_MAX, 50};
  const std::vector<int32_t> ke = {300, 20, 5, 5, 301, INT_MAX, 300, 300, INT_MAX, -1};
  const int64_t M = static_cast<int64_t>(ks.size());
  Queries Q = make_queries(rng, M, H);
  std::vector<uint8_t> k(static_cast<size_t>(N * 128));
  for (auto& b : k) b = random_e4m3(rng);
  std::vector<float> kscale(static_cast<size_t>(N), 0.5f);
  // CPU reference over the clamped ranges, column j - ks' for key j.
  std::vector<int32_t> cks(ks.size()), cke(ke.size());
  for (int64_t r = 0; r < M; ++r) {
    const int64_t s = std::max<int64_t>(ks[r], 0), e = std::min<int64_t>(ke[r], N);
    cks[r] = static_cast<int32_t>(s <= e ? s : 0);
    cke[r] = static_cast<int32_t>(s <= e ? e : 0);
  }
  std::vector<float> ref(static_cast<size_t>(M * W));
  IndexerLogitsParams hp;
  hp.q = make_tensor(Q.q.data(), DType::kE4M3, {M, H, 128});
  hp.weights = make_tensor(Q.w.data(), DType::kF32, {M, H});
  hp.k = make_tensor(k.data(), DType::kE4M3, {N, 128});
  hp.k_scale = make_tensor(kscale.data(), DType::kF32, {N});
  hp.ks = make_tensor(cks.data(), DType::kI32, {M});
  hp.ke = make_tensor(cke.data(), DType::kI32, {M});
  hp.logits = make_tensor(ref.data(), DType::kF32, {M, W});
  DSA_ASSERT_OK(indexer_logits(hp));
  DeviceBuffer dq(Q.q), dw(Q.w), dk(k), dsc(kscale), dks(ks), dke(ke), dout(M * W * 4, 0xFF);
  IndexerLogitsParams gp;
  gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {M, H});
  gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
  gp.k_scale = dev_tensor(dsc, DType::kF32, {N});
  gp.ks = dev_tensor(dks, DType::kI32, {M});
  gp.ke = dev_tensor(dke, DType::kI32, {M});
  gp.logits = dev_tensor(dout, DType::kF32, {M, W});
  DSA_ASSERT_OK(indexer_logits(gp));
  ASSERT_TRUE(device_clean());
  const std::vector<float> got = dout.download<float>();
  for (int64_t r = 0; r < M; ++r) {
    std::vector<float> expect(static_cast<size_t>(W), kNegInf);
    for (int64_t c = 0; c < W; ++c) {
      const int64_t j = static_cast<int64_t>(ks[r]) + c;
      if (j >= cks[r] && j < cke[r]) expect[c] = ref[r * W + (j - cks[r])];
    }
    auto key_of = [&](int64_t c, float* s) {
      const int64_t j = static_cast<int64_t>(ks[r]) + c;
      *s = kscale[j];
      return &k[j * 128];
    };
    ASSERT_TRUE(row_close(Q, r, &got[r * W], expect.data(), W, key_of)) << "ks " << ks[r] << " ke " << ke[r];
  }
}

namespace {

// A paged indexer cache holding sequences of the given lengths in shuffled blocks; every slot
// that holds no key is NaN-poisoned (e4m3 0x7f and NaN scales).
struct PagedCache {
  int64_t page, blocks, B, max_blocks;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> table;  // [B, max_blocks]
  std::vector<int32_t> lens;

  const uint8_t* key(int64_t b, int64_t j, float* scale) const {
    const int64_t blk = table[b * max_blocks + j / page], off = j % page;
    const uint8_t* pg = &bytes[blk * page * kIndexerTokenBytes];
    std::memcpy(scale, pg + page * 128 + off * 4, 4);
    return pg + off * 128;
  }
};

PagedCache make_paged(Rng& rng, const std::vector<int32_t>& lens, int64_t page, int64_t spare_blocks) {
  PagedCache pc;
  pc.page = page;
  pc.B = static_cast<int64_t>(lens.size());
  pc.lens = lens;
  pc.max_blocks = 1;
  int64_t used = 0;
  for (int32_t l : lens) {
    pc.max_blocks = std::max<int64_t>(pc.max_blocks, (l + page - 1) / page + 1);
    used += (l + page - 1) / page;
  }
  pc.blocks = used + spare_blocks + 1;
  pc.bytes.assign(static_cast<size_t>(pc.blocks * page * kIndexerTokenBytes), 0x7f);
  std::vector<int32_t> perm(static_cast<size_t>(pc.blocks));
  for (int64_t i = 0; i < pc.blocks; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  pc.table.assign(static_cast<size_t>(pc.B * pc.max_blocks), 0);
  int64_t next = 0;
  for (int64_t b = 0; b < pc.B; ++b) {
    const int64_t nb = (lens[b] + page - 1) / page;
    for (int64_t c = 0; c < pc.max_blocks; ++c) pc.table[b * pc.max_blocks + c] = c < nb ? perm[next++] : perm[pc.blocks - 1];
    for (int64_t j = 0; j < lens[b]; ++j) {
      const int64_t blk = pc.table[b * pc.max_blocks + j / page], off = j % page;
      uint8_t* pg = &pc.bytes[blk * page * kIndexerTokenBytes];
      for (int d = 0; d < 128; ++d) pg[off * 128 + d] = random_e4m3(rng);
      const float s = std::ldexp(1.f, static_cast<int>(rng.integer(-8, 2)));
      std::memcpy(pg + page * 128 + off * 4, &s, 4);
    }
  }
  return pc;
}

struct PagedRun {
  std::vector<float> got, ref;
};

// Runs the CPU (over `cpu_table`, `cpu_*`) and the GPU (over the device variants) and
// returns both outputs.
void run_paged_pair(const PagedCache& pc, const Queries& Q, int64_t next_n, const std::vector<int32_t>* row_seq,
                    const std::vector<int32_t>* row_len, const std::vector<int32_t>& cpu_table,
                    const std::vector<int32_t>* cpu_row_seq, const std::vector<int32_t>* cpu_row_len,
                    const std::vector<int32_t>& cpu_lens, int64_t W, int64_t col_offset, PagedRun* out) {
  const int64_t R = Q.R, H = Q.H;
  out->ref.assign(static_cast<size_t>(R * W), 0.f);
  std::vector<uint8_t> host_cache = pc.bytes;
  std::vector<int32_t> ht = cpu_table, hl = cpu_lens;
  std::vector<int32_t> hrs = cpu_row_seq ? *cpu_row_seq : std::vector<int32_t>(), hrl = cpu_row_len ? *cpu_row_len : std::vector<int32_t>();
  IndexerLogitsPagedParams hp;
  hp.q = make_tensor(Q.q.data(), DType::kE4M3, {R, H, 128});
  hp.weights = make_tensor(Q.w.data(), DType::kF32, {R, H});
  hp.cache.data = host_cache.data();
  hp.cache.num_blocks = pc.blocks;
  hp.cache.page_size = pc.page;
  hp.block_table = make_tensor(ht.data(), DType::kI32, {pc.B, pc.max_blocks});
  hp.kv_lens = make_tensor(hl.data(), DType::kI32, {pc.B});
  hp.next_n = next_n;
  if (cpu_row_seq) {
    hp.row_seq = make_tensor(hrs.data(), DType::kI32, {R});
    hp.row_len = make_tensor(hrl.data(), DType::kI32, {R});
  }
  hp.col_offset = col_offset;
  hp.logits = make_tensor(out->ref.data(), DType::kF32, {R, W});
  DSA_ASSERT_OK(indexer_logits_paged(hp));

  DeviceBuffer dq(Q.q), dw(Q.w), dcache(pc.bytes), dtable(pc.table), dlens(pc.lens), dout(R * W * 4, 0xFF);
  DeviceBuffer drs, drl;
  IndexerLogitsPagedParams gp = hp;
  gp.q = dev_tensor(dq, DType::kE4M3, {R, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {R, H});
  gp.cache.data = dcache.data();
  gp.cache.device = cuda_device(0);
  gp.block_table = dev_tensor(dtable, DType::kI32, {pc.B, pc.max_blocks});
  gp.kv_lens = dev_tensor(dlens, DType::kI32, {pc.B});
  if (row_seq) {
    drs = DeviceBuffer(*row_seq);
    drl = DeviceBuffer(*row_len);
    gp.row_seq = dev_tensor(drs, DType::kI32, {R});
    gp.row_len = dev_tensor(drl, DType::kI32, {R});
  }
  gp.logits = dev_tensor(dout, DType::kF32, {R, W});
  DSA_ASSERT_OK(indexer_logits_paged(gp));
  ASSERT_TRUE(device_clean());
  out->got = dout.download<float>();
  DSA_ASSERT_OK(indexer_logits_paged(gp));
  EXPECT_TRUE(same_bits(dout.download<float>(), out->got, "repeat run"));
}

void run_decode(int64_t H, std::vector<int32_t> lens, int64_t next_n, int64_t page, int64_t W, int64_t col_offset, uint64_t seed) {
  Rng rng(seed);
  PagedCache pc = make_paged(rng, lens, page, 3);
  const int64_t R = pc.B * next_n;
  Queries Q = make_queries(rng, R, H);
  PagedRun run;
  run_paged_pair(pc, Q, next_n, nullptr, nullptr, pc.table, nullptr, nullptr, pc.lens, W, col_offset, &run);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = r / next_n;
    auto key_of = [&](int64_t c, float* s) { return pc.key(b, col_offset + c, s); };
    ASSERT_TRUE(row_close(Q, r, &run.got[r * W], &run.ref[r * W], W, key_of));
  }
}

}  // namespace

TEST(GpuLogits, PagedDecodeMatchesCpu) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 400;
  run_decode(64, {1}, 1, 64, 64, 0, seed++);
  run_decode(64, {130, 64, 65, 2}, 2, 64, 192, 0, seed++);
  run_decode(32, {1000, 333, 7}, 1, 64, 1024, 0, seed++);
  run_decode(32, {500, 260}, 2, 16, 300, 128, seed++);  // column tile, small pages
  run_decode(5, {77, 3, 190}, 3, 4, 200, 0, seed++);     // page 4 (the smallest: scales stay aligned), odd heads
}

TEST(GpuLogits, PagedDecodeLongContext128K) {
  DSA_REQUIRE_GPU();
  run_decode(64, {131072, 70000}, 2, 64, 131072, 0, 450);
}

// General form: rows of a chunked prefill over a cached prefix, with invalid device rows.
TEST(GpuLogits, PagedGeneralFormAndInvalidDeviceData) {
  DSA_REQUIRE_GPU();
  Rng rng(500);
  const int64_t H = 32, W = 700, page = 64;
  PagedCache pc = make_paged(rng, {600, 450, 129}, page, 4);
  const int64_t cap = pc.max_blocks * page;
  // Valid rows of every sequence plus device-only bad rows.
  std::vector<int32_t> row_seq = {0, 0, 1, 2, 1, 0, -1, 3, INT_MIN, INT_MAX, 2, 1};
  std::vector<int32_t> row_len = {600, 17, 450, 129, 0, 1, 10, 10, 10, 10, static_cast<int32_t>(cap + 5), INT_MAX};
  const int64_t R = static_cast<int64_t>(row_seq.size());
  std::vector<int32_t> cpu_seq(row_seq), cpu_len(row_len);
  std::vector<bool> dead(static_cast<size_t>(R), false);
  for (int64_t r = 0; r < R; ++r) {
    if (row_seq[r] < 0 || row_seq[r] >= pc.B) { cpu_seq[r] = 0; cpu_len[r] = 0; dead[r] = true; }
    if (cpu_len[r] > cap) cpu_len[r] = static_cast<int32_t>(cap);  // reads stop at the table's end
  }
  // Bad block-table entries in sequence 0 (column 3) and 1 (column 5): their keys are invalid
  // on the device; the CPU reference reads a valid block there and the test masks the columns.
  std::vector<int32_t> dev_table = pc.table, cpu_table = pc.table;
  const int32_t bad[] = {INT_MIN, -2, -1, static_cast<int32_t>(pc.blocks), static_cast<int32_t>(pc.blocks + 1), INT_MAX};
  dev_table[0 * pc.max_blocks + 3] = bad[rng.integer(0, 5)];
  dev_table[1 * pc.max_blocks + 5] = bad[rng.integer(0, 5)];
  PagedCache dev_pc = pc;
  dev_pc.table = dev_table;
  Queries Q = make_queries(rng, R, H);
  PagedRun run;
  run_paged_pair(dev_pc, Q, 1, &row_seq, &row_len, cpu_table, &cpu_seq, &cpu_len, pc.lens, W, 0, &run);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> expect(run.ref.begin() + r * W, run.ref.begin() + (r + 1) * W);
    for (int64_t c = 0; c < W; ++c) {
      const int64_t col = c / page;
      if (dead[r] || (cpu_seq[r] == 0 && col == 3) || (cpu_seq[r] == 1 && col == 5)) expect[c] = kNegInf;
    }
    auto key_of = [&](int64_t c, float* s) { return pc.key(cpu_seq[r], c, s); };
    ASSERT_TRUE(row_close(Q, r, &run.got[r * W], expect.data(), W, key_of)) << "row_seq " << row_seq[r] << " row_len " << row_len[r];
  }
  // Every bad-table candidate, one at a time, in the decode form.
  for (int32_t b : bad) {
    std::vector<int32_t> t2 = pc.table;
    t2[2 * pc.max_blocks + 1] = b;
    PagedCache p2 = pc;
    p2.table = t2;
    Queries Q2 = make_queries(rng, pc.B, 4);
    PagedRun run2;
    run_paged_pair(p2, Q2, 1, nullptr, nullptr, pc.table, nullptr, nullptr, pc.lens, W, 0, &run2);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (int64_t c = 0; c < W; ++c) {
      const float g = run2.got[2 * W + c];
      if (c / page == 1 && c < pc.lens[2]) {
        ASSERT_TRUE(std::isinf(g) && g < 0) << "bad entry " << b << " col " << c;
      }
    }
  }
}

// Decode rows whose device kv_len is below next_n see no keys.
TEST(GpuLogits, PagedShortDeviceKvLens) {
  DSA_REQUIRE_GPU();
  Rng rng(600);
  PagedCache pc = make_paged(rng, {100, 50}, 64, 1);
  std::vector<int32_t> lens = {100, 50};
  PagedCache dev_pc = pc;
  dev_pc.lens = {1, INT_MIN};  // next_n = 2: every row of both sequences is short or empty
  Queries Q = make_queries(rng, 4, 8);
  PagedRun run;
  run_paged_pair(dev_pc, Q, 2, nullptr, nullptr, pc.table, nullptr, nullptr, lens, 128, 0, &run);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t c = 0; c < 128; ++c) {
    ASSERT_TRUE(std::isinf(run.got[0 * 128 + c])) << c;  // L = 1 - 2 + 0 + 1 = 0
    if (c > 0) {
      ASSERT_TRUE(std::isinf(run.got[1 * 128 + c])) << c;  // L = 1
    }
    ASSERT_TRUE(std::isinf(run.got[2 * 128 + c])) << c;
    ASSERT_TRUE(std::isinf(run.got[3 * 128 + c])) << c;
  }
  EXPECT_FALSE(std::isinf(run.got[1 * 128 + 0]));
}

// The SIMT reference kernel (DSA_CUDA_LOGITS=simt) on flat and paged cases.
TEST(GpuLogits, SimtKernelMatchesCpu) {
  DSA_REQUIRE_GPU();
  struct ScopedSimt {
    ScopedSimt() { setenv("DSA_CUDA_LOGITS", "simt", 1); }
    ~ScopedSimt() { unsetenv("DSA_CUDA_LOGITS"); }
  } simt;
  run_flat(FlatCase{64, {300}, {300}, 300, 0}, 310);
  run_flat(FlatCase{32, {500, 129, 77}, {40, 129, 5}, 512, 0}, 311);
  run_flat(FlatCase{3, {260}, {17}, 100, 130}, 312);
  run_decode(64, {130, 64, 65, 2}, 2, 64, 192, 0, 313);
  run_decode(32, {500, 260}, 2, 16, 300, 128, 314);
}

// Tiny cases of both kernels and both key sources, for compute-sanitizer (racecheck is slow).
TEST(GpuLogits, SanitizerSmall) {
  DSA_REQUIRE_GPU();
  run_flat(FlatCase{64, {200}, {3}, 256, 0}, 320);
  run_flat(FlatCase{32, {90, 40}, {2, 40}, 100, 0}, 321);
  run_decode(64, {130, 65}, 2, 64, 192, 0, 322);
  struct ScopedSimt {
    ScopedSimt() { setenv("DSA_CUDA_LOGITS", "simt", 1); }
    ~ScopedSimt() { unsetenv("DSA_CUDA_LOGITS"); }
  } simt;
  run_flat(FlatCase{64, {200}, {3}, 256, 0}, 323);
  run_decode(32, {70}, 1, 64, 128, 0, 324);
}

// skip_rows_up_to: rows seeing L <= it keys are not computed (their logits rows keep their
// bytes, their block-table entries are not read: a bad entry there is harmless); every other
// row is bit-identical to the unskipped call. Both kernel families (64 heads: tensor cores; 5
// heads: the SIMT kernel), decode and general forms.
TEST(GpuLogits, PagedSkipsShortRowsUntouched) {
  DSA_REQUIRE_GPU();
  for (int64_t H : {64, 5}) {
    SCOPED_TRACE("H " + std::to_string(H));
    Rng rng(700 + H);
    const int64_t page = 16, next_n = 2, W = 320, skip = 64;
    PagedCache pc = make_paged(rng, {300, 50, 65, 64}, page, 3);
    const int64_t R = pc.B * next_n;
    Queries Q = make_queries(rng, R, H);
    DeviceBuffer dq(Q.q), dw(Q.w), dcache(pc.bytes), dtable(pc.table), dlens(pc.lens);
    std::vector<int32_t> bad_table = pc.table;
    bad_table[1 * pc.max_blocks + 0] = -1;  // sequence 1 (kv 50): every row skipped
    DeviceBuffer dbad(bad_table);
    IndexerLogitsPagedParams p;
    p.q = dev_tensor(dq, DType::kE4M3, {R, H, 128});
    p.weights = dev_tensor(dw, DType::kF32, {R, H});
    p.cache.data = dcache.data();
    p.cache.num_blocks = pc.blocks;
    p.cache.page_size = page;
    p.cache.device = cuda_device(0);
    p.block_table = dev_tensor(dtable, DType::kI32, {pc.B, pc.max_blocks});
    p.kv_lens = dev_tensor(dlens, DType::kI32, {pc.B});
    p.next_n = next_n;
    DeviceBuffer full(R * W * 4, 0xFF), part(R * W * 4, 0xFF);
    p.logits = dev_tensor(full, DType::kF32, {R, W});
    DSA_ASSERT_OK(indexer_logits_paged(p));
    p.skip_rows_up_to = skip;
    p.block_table = dev_tensor(dbad, DType::kI32, {pc.B, pc.max_blocks});
    p.logits = dev_tensor(part, DType::kF32, {R, W});
    DSA_ASSERT_OK(indexer_logits_paged(p));
    ASSERT_TRUE(device_clean());
    const auto f = full.download<uint32_t>(), s = part.download<uint32_t>();
    int64_t skipped = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t L = pc.lens[r / next_n] - next_n + r % next_n + 1;
      for (int64_t c = 0; c < W; ++c) {
        if (L <= skip) ASSERT_EQ(s[r * W + c], 0xFFFFFFFFu) << "skipped row " << r << " written at " << c;
        else ASSERT_EQ(s[r * W + c], f[r * W + c]) << "row " << r << " col " << c;
      }
      skipped += L <= skip;
    }
    EXPECT_EQ(skipped, 2 + 1 + 2) << "kv 50: both rows; kv 65: its first row; kv 64: both rows";
    // The general form skips by row_len the same way.
    std::vector<int32_t> rs, rl;
    for (int64_t r = 0; r < R; ++r) {
      rs.push_back(static_cast<int32_t>(r / next_n));
      rl.push_back(pc.lens[r / next_n] - static_cast<int32_t>(next_n) + static_cast<int32_t>(r % next_n) + 1);
    }
    DeviceBuffer drs(rs), drl(rl), gen(R * W * 4, 0xFF);
    p.row_seq = dev_tensor(drs, DType::kI32, {R});
    p.row_len = dev_tensor(drl, DType::kI32, {R});
    p.logits = dev_tensor(gen, DType::kF32, {R, W});
    DSA_ASSERT_OK(indexer_logits_paged(p));
    EXPECT_TRUE(same_bits(gen.download<uint32_t>(), s, "general form vs decode form, skipped"));
  }
}
