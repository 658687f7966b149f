// GPU indexer logits (flat and paged) against the CPU backend and the float64 oracle. The
// mma.sync and SIMT kernels accumulate exact products in f32 (in another order than the CPU),
// so their scores are compared within 64 f32 steps of the error scale
// E = s_k · Σ_h |w_h| Σ_d |q_hd k_d| (an exact bound on either backend's rounding). The
// Hopper fp8 wgmma kernel accumulates each K = 128 dot product with fewer mantissa bits
// (test_gpu_hopper.cu measured errors up to 2e-4 of Σ_d |q_hd k_d| on the H200); since
// relu is 1-Lipschitz, |Σ_h w_h relu(dot_h) - Σ_h w_h relu(exact_h)| <= Σ_h |w_h| |err_h|, so
// its scores get (2^-12 + 64 · 2^-24) · E (kWgmmaRel; docs/perf.md has the derivation and
// the round-1 measurements, all below 2^-16 · E). Which tolerance applies is read from
// dsa::last_kernel_name() after each GPU launch. -inf positions and NaN positions must match
// exactly on every kernel; reruns are bit-identical. Device index data cannot be validated,
// so out-of-range ks/ke, block-table entries, row_seq and lengths must read as invalid keys.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <cmath>
#include <limits>
#include <memory>

#include "gpu_util.h"
#include "oracle/oracle_logits.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

// Extra relative tolerance (times E) of the fp8 wgmma kernel's reduced-precision accumulation.
constexpr double kWgmmaRel = 1.0 / 4096;  // 2^-12 >= the 2e-4 measured per dot product

// The tolerance that applies to the GPU launch just made on this thread: kWgmmaRel when it was
// the fp8 wgmma kernel, else 0 (exact products summed in f32).
double launched_rel() { return std::strstr(dsa::last_kernel_name(), "wgmma") != nullptr ? kWgmmaRel : 0.0; }

std::string last_kernel_name_note(double rel) {
  return std::string("kernel '") + dsa::last_kernel_name() + (rel > 0 ? "' (fp8 wgmma tolerance)" : "' (exact-product tolerance)");
}

// The kernel the wgmma launcher should name for prefill row blocks (flat keys, or paged rows
// of the general form / next_n > 4) under DSA_CUDA_LOGITS: the four-consumer form by default
// (and when a decode form is forced), the two-consumer forms when asked; "" where another
// kernel is forced.
std::string expected_rows_kernel(bool paged) {
  const char* v = std::getenv("DSA_CUDA_LOGITS");
  const std::string form = v == nullptr ? "" : v;
  if (form == "mma" || form == "simt" || form == "wgmma_mma_only") return "";
  const std::string base = paged ? "indexer_logits_paged.wgmma_fp8_rows" : "indexer_logits.wgmma_fp8";
  const char* g = std::getenv("DSA_CUDA_LOGITS_GATES");
  const std::string gates = g == nullptr ? "" : g;
  // Flat forms only: the two-consumer forms hold 16 gate groups in registers at 8 or 16; the
  // four-consumer form holds all of them by default, 8 at "8", none at "smem".
  const bool held2 = !paged && (gates == "8" || gates == "16");
  if (form == "wgmma_overlap") return base + (held2 ? "_overlap_gates16" : "_overlap");
  if (form == "wgmma_serial") return base + (held2 ? "_gates16" : "");
  if (!paged && gates == "8") return base + "_4wg_gates8";
  if (!paged && gates == "smem") return base + "_4wg_gates_smem";
  return base + "_4wg";
}

// The decode-block kernel the launcher should name for H heads and next_n rows (page 64,
// aligned q, sm_90a; "" where DSA_CUDA_LOGITS forces another kernel): by default four consumer
// warpgroups with a copy warp each at every width N = next_n x padded heads; a forced decode
// form where it applies (two CTAs only up to 64 columns, else the default).
std::string expected_decode_kernel(int64_t H, int64_t next_n) {
  const char* v = std::getenv("DSA_CUDA_LOGITS");
  const std::string form = v == nullptr ? "" : v;
  const int64_t n = (H <= 16 ? 16 : H <= 32 ? 32 : 64) * (next_n <= 2 ? next_n : 4);
  if (form == "mma" || form == "simt" || form == "wgmma_mma_only") return "";  // no wgmma decode block runs
  const std::string base = "indexer_logits_paged.wgmma_fp8_decode";
  if (form == "wgmma_decode_serial") return base;
  if (form == "wgmma_decode_4wg") return base + "_4wg";
  if (form == "wgmma_decode_4wg_split") return base + "_4wg_split";
  if (form == "wgmma_decode_2cta" && n <= 64) return base + "_2cta";
  return base + "_4wg_split";
}

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
::testing::AssertionResult row_close(const Queries& Q, int64_t r, const float* got, const float* ref, int64_t W, KeyOf key_of,
                                     double rel) {
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
    const double tol = (64.0 * std::ldexp(1.0, -24) + rel) * error_scale(Q, r, key, scale) + 1e-30;
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
  const double rel = launched_rel();
  ASSERT_TRUE(device_clean());
  const std::vector<float> got = dout.download<float>();
  for (int64_t r = 0; r < M; ++r) {
    auto key_of = [&](int64_t c, float* s) {
      const int64_t j = ks[r] + fc.col_offset + c;
      *s = kscale[j];
      return &k[j * 128];
    };
    ASSERT_TRUE(row_close(Q, r, &got[r * W], &ref[r * W], W, key_of, rel)) << last_kernel_name_note(rel);
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

// The fp8 wgmma tolerance still tells a right result from a wrongly mapped one: with it
// doubled (so that any output passing the real tolerance is covered by the triangle
// inequality), results whose keys (columns shifted by one), rows (adjacent rows swapped) or
// heads (gate weights rotated by one head) are mapped wrongly fail on every row, while the
// right result passes. Host-only (CPU backend and the float64 oracle): runs without a device.
TEST(GpuLogits, WgmmaToleranceRejectsWrongMappings) {
  Rng rng(350);
  const int64_t N = 400, W = 400;
  for (int64_t H : {64, 32, 8}) {
    SCOPED_TRACE(testing::Message() << "H " << H);
    const int64_t M = 12;
    std::vector<int32_t> ks(static_cast<size_t>(M), 0), ke(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r) ke[r] = static_cast<int32_t>(N - M + r + 1);
    Queries Q = make_queries(rng, M, H);
    std::vector<uint8_t> k(static_cast<size_t>(N * 128));
    for (auto& b : k) b = random_e4m3(rng);
    std::vector<float> kscale(static_cast<size_t>(N));
    for (auto& x : kscale) x = std::ldexp(1.f, static_cast<int>(rng.integer(-8, 2)));
    std::vector<float> got(static_cast<size_t>(M * W));
    IndexerLogitsParams hp;
    hp.q = make_tensor(Q.q.data(), DType::kE4M3, {M, H, 128});
    hp.weights = make_tensor(Q.w.data(), DType::kF32, {M, H});
    hp.k = make_tensor(k.data(), DType::kE4M3, {N, 128});
    hp.k_scale = make_tensor(kscale.data(), DType::kF32, {N});
    hp.ks = make_tensor(ks.data(), DType::kI32, {M});
    hp.ke = make_tensor(ke.data(), DType::kI32, {M});
    hp.logits = make_tensor(got.data(), DType::kF32, {M, W});
    DSA_ASSERT_OK(indexer_logits(hp));
    const std::vector<double> ref64 = oracle::indexer_logits(Q.q, Q.w, k, kscale, ks, ke, H, 0, W);
    const std::vector<float> ref(ref64.begin(), ref64.end());
    // Gate weights rotated by one head within each row: the head mapping is wrong.
    std::vector<float> wrot(Q.w.size());
    for (int64_t r = 0; r < M; ++r)
      for (int64_t h = 0; h < H; ++h) wrot[r * H + h] = Q.w[r * H + (h + 1) % H];
    const std::vector<double> rot64 = oracle::indexer_logits(Q.q, wrot, k, kscale, ks, ke, H, 0, W);
    auto key_of = [&](int64_t c, float* sc) {
      *sc = kscale[c];
      return &k[c * 128];
    };
    for (int64_t r = 0; r < M; ++r) {
      ASSERT_TRUE(row_close(Q, r, &got[r * W], &ref[r * W], W, key_of, kWgmmaRel)) << "row " << r;
      std::vector<float> shifted(&got[r * W], &got[r * W] + W), swapped(&got[((r + 1) % M) * W], &got[((r + 1) % M) * W] + W);
      for (int64_t c = 0; c + 1 < ke[r]; ++c) shifted[c] = got[r * W + c + 1];
      for (int64_t c = 0; c < W; ++c)  // the -inf tail of the other row stays where this row's is
        if (c >= ke[r] || c >= ke[(r + 1) % M]) swapped[c] = got[r * W + c];
      const std::vector<float> rot(rot64.begin() + r * W, rot64.begin() + (r + 1) * W);
      EXPECT_FALSE(row_close(Q, r, shifted.data(), &ref[r * W], W, key_of, 2 * kWgmmaRel)) << "keys shifted, row " << r;
      EXPECT_FALSE(row_close(Q, r, swapped.data(), &ref[r * W], W, key_of, 2 * kWgmmaRel)) << "rows swapped, row " << r;
      EXPECT_FALSE(row_close(Q, r, rot.data(), &ref[r * W], W, key_of, 2 * kWgmmaRel)) << "heads rotated, row " << r;
    }
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
  const double rel = launched_rel();
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
    ASSERT_TRUE(row_close(Q, r, &got[r * W], expect.data(), W, key_of, rel)) << "ks " << ks[r] << " ke " << ke[r];
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
  double rel = 0;  // launched_rel() of the GPU run
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
  out->rel = launched_rel();
  if (H <= 64 && device_is_sm90() && pc.page == 64 && (row_seq != nullptr || next_n > 4) && !expected_rows_kernel(true).empty())
    EXPECT_EQ(std::string(dsa::last_kernel_name()), expected_rows_kernel(true));
  if (H <= 64 && device_is_sm90() && pc.page == 64 && row_seq == nullptr && next_n <= 4 &&
      !expected_decode_kernel(H, next_n).empty())
    EXPECT_EQ(std::string(dsa::last_kernel_name()), expected_decode_kernel(H, next_n));
  ASSERT_TRUE(device_clean());
  out->got = dout.download<float>();
  DSA_ASSERT_OK(indexer_logits_paged(gp));
  EXPECT_TRUE(same_bits(dout.download<float>(), out->got, "repeat run"));
}

void run_decode(int64_t H, std::vector<int32_t> lens, int64_t next_n, int64_t page, int64_t W, int64_t col_offset, uint64_t seed,
                std::vector<float>* got = nullptr) {
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
    ASSERT_TRUE(row_close(Q, r, &run.got[r * W], &run.ref[r * W], W, key_of, run.rel)) << last_kernel_name_note(run.rel);
  }
  if (got) *got = run.got;
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
static void paged_general_form_and_invalid_data() {
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
    ASSERT_TRUE(row_close(Q, r, &run.got[r * W], expect.data(), W, key_of, run.rel)) << "row_seq " << row_seq[r] << " row_len " << row_len[r];
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

TEST(GpuLogits, PagedGeneralFormAndInvalidDeviceData) {
  DSA_REQUIRE_GPU();
  paged_general_form_and_invalid_data();
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
  ScopedEnv simt("DSA_CUDA_LOGITS", "simt");
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
  ScopedEnv simt("DSA_CUDA_LOGITS", "simt");
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

// ---- the Hopper wgmma kernel (and its agreement with the mma.sync kernel) -----------------
// On an sm_90a device the default path of H_idx <= 64 is the wgmma kernel (flat keys; paged
// with page 64); DSA_CUDA_LOGITS=mma forces the mma.sync kernel. Elsewhere these tests run the
// mma.sync kernel twice and still check it against the references.

namespace {

struct ScopedLogitsKernel : ScopedEnv {
  explicit ScopedLogitsKernel(const char* v) : ScopedEnv("DSA_CUDA_LOGITS", v) {}
};

// Flat logits with explicit (valid) row ranges against the float64 oracle of the dequantised
// FP8 inputs (SPEC §3's tight reference); -inf positions exact; reruns bit-identical. Returns
// the GPU output.
std::vector<float> flat_vs_oracle(int64_t H, int64_t N, const std::vector<int32_t>& ks, const std::vector<int32_t>& ke,
                                  int64_t W, int64_t col_offset, uint64_t seed) {
  Rng rng(seed);
  const int64_t M = static_cast<int64_t>(ks.size());
  Queries Q = make_queries(rng, M, H);
  std::vector<uint8_t> k(static_cast<size_t>(N * 128));
  for (auto& b : k) b = random_e4m3(rng);
  std::vector<float> kscale(static_cast<size_t>(N));
  for (auto& s : kscale) s = std::ldexp(1.f, static_cast<int>(rng.integer(-8, 2)));
  const std::vector<double> ref64 = oracle::indexer_logits(Q.q, Q.w, k, kscale, ks, ke, H, col_offset, W);
  std::vector<float> ref(ref64.begin(), ref64.end());
  DeviceBuffer dq(Q.q), dw(Q.w), dk(k), dsc(kscale), dks(ks), dke(ke), dout(M * W * 4, 0xFF);
  IndexerLogitsParams gp;
  gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {M, H});
  gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
  gp.k_scale = dev_tensor(dsc, DType::kF32, {N});
  gp.ks = dev_tensor(dks, DType::kI32, {M});
  gp.ke = dev_tensor(dke, DType::kI32, {M});
  gp.col_offset = col_offset;
  gp.logits = dev_tensor(dout, DType::kF32, {M, W});
  EXPECT_TRUE(indexer_logits(gp).ok());
  const double rel = launched_rel();
  if (std::getenv("DSA_CUDA_LOGITS") == nullptr && H <= 64 && device_is_sm90()) {
    EXPECT_GT(rel, 0.0) << "expected the wgmma kernel on sm_90, ran " << last_kernel_name_note(rel);
  }
  if (H <= 64 && device_is_sm90() && !expected_rows_kernel(false).empty())
    EXPECT_EQ(std::string(dsa::last_kernel_name()), expected_rows_kernel(false));
  EXPECT_TRUE(device_clean());
  const std::vector<float> got = dout.download<float>();
  for (int64_t r = 0; r < M; ++r) {
    auto key_of = [&](int64_t c, float* sc) {
      const int64_t j = ks[r] + col_offset + c;
      *sc = kscale[j];
      return &k[j * 128];
    };
    EXPECT_TRUE(row_close(Q, r, &got[r * W], &ref[r * W], W, key_of, rel)) << "ks " << ks[r] << " ke " << ke[r] << " "
                                                                            << last_kernel_name_note(rel);
    if (::testing::Test::HasFailure()) return got;
  }
  EXPECT_TRUE(indexer_logits(gp).ok());
  EXPECT_TRUE(same_bits(dout.download<float>(), got, "repeat run"));
  return got;
}

// Rows at the wgmma kernel's tile edges: lengths 0, 1, 63, 64, 65, ranges that skip whole key
// tiles or start past them, row counts that are not multiples of a row block (4, 8 or 16).
void edge_ranges(int64_t N, int64_t M, Rng& rng, std::vector<int32_t>* ks, std::vector<int32_t>* ke) {
  const int64_t fixed[][2] = {{0, 0}, {0, 1}, {5, 5}, {0, 63}, {0, 64}, {0, 65}, {64, 128}, {63, 129},
                              {640, 700}, {N - 1, N}, {N, N}, {0, N}, {700, N}, {128, 129}, {1, 2}};
  ks->clear();
  ke->clear();
  for (const auto& f : fixed) {
    if (static_cast<int64_t>(ks->size()) == M) break;
    ks->push_back(static_cast<int32_t>(std::min(f[0], N)));
    ke->push_back(static_cast<int32_t>(std::min(f[1], N)));
  }
  while (static_cast<int64_t>(ks->size()) < M) {
    const int64_t a = rng.integer(0, N), b = rng.integer(0, N);
    ks->push_back(static_cast<int32_t>(std::min(a, b)));
    ke->push_back(static_cast<int32_t>(std::max(a, b)));
  }
}

}  // namespace

static void wgmma_flat_tile_edges() {
  Rng rng(700);
  uint64_t seed = 701;
  for (int64_t H : {8, 16, 32, 64, 24}) {
    for (int64_t M : {1, 5, 37}) {
      std::vector<int32_t> ks, ke;
      const int64_t N = 1000;
      edge_ranges(N, M, rng, &ks, &ke);
      SCOPED_TRACE(testing::Message() << "H " << H << " M " << M);
      flat_vs_oracle(H, N, ks, ke, 1000, 0, seed++);
      flat_vs_oracle(H, N, ks, ke, 300, 70, seed++);  // column tile: keys past W not computed
      if (::testing::Test::HasFailure()) return;
    }
  }
  // Causal prefill blocks: consecutive rows of one sequence, 37 rows of 130 keys each side of
  // the tile grid, and keys that end inside a tile (N = 4097).
  std::vector<int32_t> ks, ke;
  for (int64_t i = 0; i < 37; ++i) {
    ks.push_back(3);
    ke.push_back(static_cast<int32_t>(4097 - 37 + i + 1));
  }
  flat_vs_oracle(64, 4097, ks, ke, 4200, 0, seed++);
  flat_vs_oracle(32, 4097, ks, ke, 4094, 0, seed++);
}

TEST(GpuLogits, WgmmaFlatTileEdgesMatchOracle) {
  DSA_REQUIRE_GPU();
  wgmma_flat_tile_edges();
}

// The FP32 math on the unquantised inputs (SPEC §3's loose reference): score error against
// the row's largest score, on the default kernel.
TEST(GpuLogits, WgmmaFlatCloseToUnquantisedMath) {
  DSA_REQUIRE_GPU();
  Rng rng(720);
  const int64_t H = 64, N = 2000, M = 9;
  std::vector<float> qf(static_cast<size_t>(M * H * 128)), kf(static_cast<size_t>(N * 128)), gate(static_cast<size_t>(M * H));
  for (auto& x : qf) x = rng.normal();
  for (auto& x : kf) x = rng.normal();
  for (auto& g : gate) g = std::fabs(rng.normal());
  const float c = 1.f / std::sqrt(128.f * H);
  std::vector<uint8_t> q8(qf.size()), k8(kf.size());
  std::vector<float> w(gate.size()), gate_c(gate.size()), kscale(static_cast<size_t>(N));
  auto quant = [](const float* x, uint8_t* out) {
    float amax = 0;
    for (int d = 0; d < 128; ++d) amax = std::max(amax, std::fabs(bf16_to_float(float_to_bf16(x[d]))));
    const float s = ue8m0_scale(amax);
    for (int d = 0; d < 128; ++d) out[d] = quantize_e4m3(bf16_to_float(float_to_bf16(x[d])), 1.f / s);
    return s;
  };
  for (int64_t i = 0; i < M * H; ++i) {
    const float sq = quant(&qf[i * 128], &q8[i * 128]);
    w[i] = gate[i] * c * sq;
    gate_c[i] = gate[i] * c;
  }
  for (int64_t j = 0; j < N; ++j) kscale[j] = quant(&kf[j * 128], &k8[j * 128]);
  std::vector<int32_t> ks(static_cast<size_t>(M), 0), ke(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) ke[i] = static_cast<int32_t>(N - M + i + 1);
  const std::vector<double> exact = oracle::indexer_logits_exact(qf, gate_c, kf, ks, ke, H, N);
  DeviceBuffer dq(q8), dw(w), dk(k8), dsc(kscale), dks(ks), dke(ke), dout(M * N * 4, 0xFF);
  IndexerLogitsParams gp;
  gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {M, H});
  gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
  gp.k_scale = dev_tensor(dsc, DType::kF32, {N});
  gp.ks = dev_tensor(dks, DType::kI32, {M});
  gp.ke = dev_tensor(dke, DType::kI32, {M});
  gp.logits = dev_tensor(dout, DType::kF32, {M, N});
  DSA_ASSERT_OK(indexer_logits(gp));
  ASSERT_TRUE(device_clean());
  const std::vector<float> got = dout.download<float>();
  for (int64_t i = 0; i < M; ++i) {
    double max_abs = 0, max_err = 0;
    for (int64_t j = 0; j < ke[i]; ++j) {
      max_abs = std::max(max_abs, std::fabs(exact[i * N + j]));
      max_err = std::max(max_err, std::fabs(got[i * N + j] - exact[i * N + j]));
    }
    EXPECT_LT(max_err, 0.06 * max_abs) << "row " << i;
    for (int64_t j = ke[i]; j < N; ++j) ASSERT_TRUE(std::isinf(got[i * N + j]) && got[i * N + j] < 0) << i << " " << j;
  }
}

// Decode rows, next_n 1-4 (one row block per sequence) and 5 (row blocks crossing sequences),
// with contexts long enough to be split over several CTAs; the unused (NaN-poisoned) slots of
// the last pages never reach a logit.
TEST(GpuLogits, WgmmaPagedDecodeSplitContexts) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 740;
  for (int64_t H : {64, 32, 16}) {
    for (int64_t nn : {1, 2, 3, 4, 5}) {
      SCOPED_TRACE(testing::Message() << "H " << H << " next_n " << nn);
      run_decode(H, {9000, 4097, 64, 5, 130}, nn, 64, 9000, 0, seed++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  run_decode(64, {9000, 4097, 64, 5, 130}, 2, 64, 3000, 1000, seed++);  // column tile past col_offset
  // No NaN anywhere inside a decode row's length (poisoned slots lie past every length).
  Rng rng(760);
  PagedCache pc = make_paged(rng, {1000, 65}, 64, 2);
  Queries Q = make_queries(rng, pc.B * 2, 32);
  PagedRun run;
  run_paged_pair(pc, Q, 2, nullptr, nullptr, pc.table, nullptr, nullptr, pc.lens, 1100, 0, &run);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t r = 0; r < pc.B * 2; ++r) {
    const int64_t L = pc.lens[r / 2] - 2 + r % 2 + 1;
    for (int64_t c = 0; c < 1100; ++c) {
      const float g = run.got[r * 1100 + c];
      if (c < L) {
        ASSERT_TRUE(std::isfinite(g)) << r << " " << c;
      } else {
        ASSERT_TRUE(std::isinf(g) && g < 0) << r << " " << c;
      }
    }
  }
}

// Every form of the Hopper decode blocks (two consumers at one CTA per SM; two CTAs per SM for
// N <= 64; four consumers, 256-column blocks as two column halves; four consumers with a copy
// warp per consumer group, the default) on the decode tests' inputs: each against the oracle, named as expected, and
// bit-identical to the others (the same per-element MMA and epilogue order; only the consumers
// per SM and the columns per MMA differ).
TEST(GpuLogits, WgmmaDecodeFormsAgree) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the wgmma kernel runs on sm_90a only";
  uint64_t seed = 1740;
  for (int64_t H : {64, 32, 16, 8}) {
    for (int64_t nn : {1, 2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << "H " << H << " next_n " << nn);
      // Contexts of next_n tokens (the shortest valid), a page and one more, odd, and long
      // enough to split over CTAs; then a column tile past col_offset.
      const std::vector<int32_t> lens = {4097, static_cast<int32_t>(nn), 65, 64, 9000, 130};
      std::vector<float> first;
      for (const char* form : {"wgmma_decode_serial", "wgmma_decode_2cta", "wgmma_decode_4wg", "wgmma_decode_4wg_split"}) {
        ScopedLogitsKernel force(form);
        std::vector<float> got;
        run_decode(H, lens, nn, 64, 9000, 0, seed, &got);
        if (::testing::Test::HasFatalFailure()) return;
        if (first.empty()) first = got;
        else EXPECT_TRUE(same_bits(got, first, form));
        std::vector<float> tile;
        run_decode(H, lens, nn, 64, 2000, 3000, seed + 1, &tile);
        if (::testing::Test::HasFatalFailure()) return;
      }
      seed += 2;
    }
  }
}

// General form as the layer step uses it for prefill chunks: many causal rows per sequence,
// row blocks that straddle two sequences, rows of length 0 and 1.
static void wgmma_paged_prefill_rows() {
  uint64_t seed = 780;
  for (int64_t H : {64, 32, 16, 8}) {
    SCOPED_TRACE(testing::Message() << "H " << H);
    Rng rng(seed++);
    PagedCache pc = make_paged(rng, {700, 333, 64, 1}, 64, 3);
    std::vector<int32_t> row_seq, row_len;
    const int64_t q_lens[] = {101, 50, 13, 1};
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t i = 0; i < q_lens[b]; ++i) {
        row_seq.push_back(static_cast<int32_t>(b));
        row_len.push_back(static_cast<int32_t>(pc.lens[b] - q_lens[b] + i + 1));
      }
    row_seq.push_back(1);
    row_len.push_back(0);
    const int64_t R = static_cast<int64_t>(row_seq.size()), W = 768;
    Queries Q = make_queries(rng, R, H);
    PagedRun run;
    run_paged_pair(pc, Q, 1, &row_seq, &row_len, pc.table, &row_seq, &row_len, pc.lens, W, 0, &run);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (int64_t r = 0; r < R; ++r) {
      auto key_of = [&](int64_t c, float* s) { return pc.key(row_seq[r], c, s); };
      ASSERT_TRUE(row_close(Q, r, &run.got[r * W], &run.ref[r * W], W, key_of, run.rel)) << "row " << r;
    }
  }
}

TEST(GpuLogits, WgmmaPagedPrefillRows) {
  DSA_REQUIRE_GPU();
  wgmma_paged_prefill_rows();
}

// Both kernels (wgmma and mma.sync) on the same inputs: the same -inf positions and scores
// within the shared tolerance.
TEST(GpuLogits, WgmmaAndMmaSyncKernelsAgree) {
  DSA_REQUIRE_GPU();
  Rng rng(800);
  {
    std::vector<int32_t> ks, ke;
    edge_ranges(3000, 41, rng, &ks, &ke);
    const std::vector<float> a = flat_vs_oracle(64, 3000, ks, ke, 3000, 0, 801);
    std::vector<float> b;
    {
      ScopedLogitsKernel force("mma");
      b = flat_vs_oracle(64, 3000, ks, ke, 3000, 0, 801);
    }
    // Each is within the tolerance of the oracle (so within twice of each other); the -inf
    // positions are identical.
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(std::isinf(a[i]), std::isinf(b[i])) << i;
  }
  {
    PagedCache pc = make_paged(rng, {5000, 130, 64}, 64, 2);
    Queries Q = make_queries(rng, pc.B * 3, 32);
    PagedRun w, m;
    run_paged_pair(pc, Q, 3, nullptr, nullptr, pc.table, nullptr, nullptr, pc.lens, 5000, 0, &w);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    {
      ScopedLogitsKernel force("mma");
      run_paged_pair(pc, Q, 3, nullptr, nullptr, pc.table, nullptr, nullptr, pc.lens, 5000, 0, &m);
    }
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (int64_t r = 0; r < Q.R; ++r) {
      auto key_of = [&](int64_t c, float* s) { return pc.key(r / 3, c, s); };
      // Each within its tolerance of the exact value: within the sum of both of each other.
      ASSERT_TRUE(row_close(Q, r, &w.got[r * 5000], &m.got[r * 5000], 5000, key_of, w.rel + m.rel + 64.0 * std::ldexp(1.0, -24)))
          << "row " << r;
    }
  }
}

// The MMA-only measurement variant runs (its output is unspecified) and leaves the device
// clean; the default kernel afterwards still matches the oracle.
TEST(GpuLogits, WgmmaMmaOnlyHookRuns) {
  DSA_REQUIRE_GPU();
  Rng rng(820);
  std::vector<int32_t> ks(64, 0), ke(64, 2048);
  {
    ScopedLogitsKernel force("wgmma_mma_only");
    const int64_t M = 64, H = 64, N = 2048;
    std::vector<uint8_t> q(static_cast<size_t>(M * H * 128), 0x38), k(static_cast<size_t>(N * 128), 0x38);
    std::vector<float> w(static_cast<size_t>(M * H), 1.f), sc(static_cast<size_t>(N), 1.f);
    DeviceBuffer dq(q), dw(w), dk(k), dsc(sc), dks(ks), dke(ke), dout(M * N * 4, 0);
    IndexerLogitsParams gp;
    gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
    gp.weights = dev_tensor(dw, DType::kF32, {M, H});
    gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
    gp.k_scale = dev_tensor(dsc, DType::kF32, {N});
    gp.ks = dev_tensor(dks, DType::kI32, {M});
    gp.ke = dev_tensor(dke, DType::kI32, {M});
    gp.logits = dev_tensor(dout, DType::kF32, {M, N});
    DSA_ASSERT_OK(indexer_logits(gp));
    ASSERT_TRUE(device_clean());
  }
  edge_ranges(2048, 8, rng, &ks, &ke);
  flat_vs_oracle(64, 2048, ks, ke, 2048, 0, 821);
}

// BF16 logits on the device: bit-equal to the f32 logits of the same kernel rounded to nearest
// even, on the kernels (wgmma in its three row-block forms on flat keys, mma.sync) and both key
// sources (paged: next_n 2 at 64 heads, a four-consumer decode block).
TEST(GpuLogits, Bf16LogitsAreRoundedF32Logits) {
  DSA_REQUIRE_GPU();
  Rng rng(900);
  const int64_t N = 700, H = 32, W = 720;
  std::vector<int32_t> ks, ke;
  edge_ranges(N, 21, rng, &ks, &ke);
  const int64_t M = static_cast<int64_t>(ks.size());
  Queries Q = make_queries(rng, M, H);
  std::vector<uint8_t> k(static_cast<size_t>(N * 128));
  for (auto& b : k) b = random_e4m3(rng);
  std::vector<float> kscale(static_cast<size_t>(N), 0.25f);
  DeviceBuffer dq(Q.q), dw(Q.w), dk(k), dsc(kscale), dks(ks), dke(ke), d32(M * W * 4, 0xFF), d16(M * W * 2, 0xFF);
  IndexerLogitsParams gp;
  gp.q = dev_tensor(dq, DType::kE4M3, {M, H, 128});
  gp.weights = dev_tensor(dw, DType::kF32, {M, H});
  gp.k = dev_tensor(dk, DType::kE4M3, {N, 128});
  gp.k_scale = dev_tensor(dsc, DType::kF32, {N});
  gp.ks = dev_tensor(dks, DType::kI32, {M});
  gp.ke = dev_tensor(dke, DType::kI32, {M});
  for (const char* kernel : {"", "mma", "wgmma_serial", "wgmma_overlap"}) {
    SCOPED_TRACE(kernel);
    std::unique_ptr<ScopedLogitsKernel> force;
    if (*kernel) force.reset(new ScopedLogitsKernel(kernel));
    gp.logits = dev_tensor(d32, DType::kF32, {M, W});
    DSA_ASSERT_OK(indexer_logits(gp));
    gp.logits = dev_tensor(d16, DType::kBF16, {M, W});
    DSA_ASSERT_OK(indexer_logits(gp));
    ASSERT_TRUE(device_clean());
    const std::vector<float> f = d32.download<float>();
    const std::vector<uint16_t> b = d16.download<uint16_t>();
    for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(b[i], float_to_bf16(f[i])) << i;
  }
  // Paged decode, next_n 2.
  PagedCache pc = make_paged(rng, {1000, 65}, 64, 2);
  Queries Q2 = make_queries(rng, pc.B * 2, 64);
  DeviceBuffer pq(Q2.q), pw(Q2.w), pcache(pc.bytes), ptable(pc.table), plens(pc.lens), p32(pc.B * 2 * 1024 * 4, 0xFF),
      p16(pc.B * 2 * 1024 * 2, 0xFF);
  IndexerLogitsPagedParams pp;
  pp.q = dev_tensor(pq, DType::kE4M3, {pc.B * 2, 64, 128});
  pp.weights = dev_tensor(pw, DType::kF32, {pc.B * 2, 64});
  pp.cache.data = pcache.data();
  pp.cache.device = cuda_device(0);
  pp.cache.num_blocks = pc.blocks;
  pp.cache.page_size = pc.page;
  pp.block_table = dev_tensor(ptable, DType::kI32, {pc.B, pc.max_blocks});
  pp.kv_lens = dev_tensor(plens, DType::kI32, {pc.B});
  pp.next_n = 2;
  pp.logits = dev_tensor(p32, DType::kF32, {pc.B * 2, 1024});
  DSA_ASSERT_OK(indexer_logits_paged(pp));
  pp.logits = dev_tensor(p16, DType::kBF16, {pc.B * 2, 1024});
  DSA_ASSERT_OK(indexer_logits_paged(pp));
  ASSERT_TRUE(device_clean());
  const std::vector<float> f = p32.download<float>();
  const std::vector<uint16_t> b = p16.download<uint16_t>();
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(b[i], float_to_bf16(f[i])) << i;
}

// The two-consumer forms of the wgmma kernel's prefill row blocks (DSA_CUDA_LOGITS=wgmma_serial:
// blocks of 256 columns, the epilogue after each tile's MMA; wgmma_overlap: each tile's MMA in
// two halves, pingpong between the consumer warpgroups; the default is the four-consumer form)
// on the default kernel's oracle tests: flat tile edges (rows of length 0/1/63/64/65, ranges
// skipping tiles, row counts off the row block, H 8/16/24/32/64, column tiles), a 128K-key
// context, paged prefill rows straddling sequences and the general form with bad device data
// (unresolvable pages: -inf exactly). Same tolerances (the kernel name carries "wgmma"); only on
// sm_90a, where the forms run.
TEST(GpuLogits, WgmmaTwoConsumerFormsMatchOracle) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the wgmma kernel runs on sm_90a only";
  for (const char* form : {"wgmma_serial", "wgmma_overlap"}) {
    SCOPED_TRACE(form);
    ScopedLogitsKernel force(form);
    wgmma_flat_tile_edges();
    if (::testing::Test::HasFailure()) return;
    run_flat(FlatCase{64, {131072}, {2}, 131072, 0}, 333);
    run_flat(FlatCase{32, {500, 129, 77}, {40, 129, 5}, 512, 0}, 302);  // prefix-cached, ragged
    if (::testing::Test::HasFailure()) return;
    wgmma_paged_prefill_rows();
    if (::testing::Test::HasFailure()) return;
    paged_general_form_and_invalid_data();
    if (::testing::Test::HasFailure()) return;
  }
}

// The flat forms' other gate placements (DSA_CUDA_LOGITS_GATES; the default four-consumer form
// holds all 16 groups a thread in registers, round 10): in the four-consumer form 8 groups, or
// none ("smem", per tile from shared memory); in the two-consumer forms 16 of 32 (round 6). On
// the default form's oracle tests: tile edges, a 128K-key row, prefix-cached ragged rows, each
// rerun bit-identical; the kernel name says which form ran (the tile-edge cases check it).
TEST(GpuLogits, WgmmaGateRegisterFormsMatchOracle) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the wgmma kernel runs on sm_90a only";
  for (const char* form : {"wgmma_4wg", "wgmma_serial", "wgmma_overlap"}) {
    for (const char* gates : {"8", "smem", "16"}) {
      const bool four = std::string(form) == "wgmma_4wg";
      // 16 is the 4wg default; in the two-consumer forms 8 is their 16, smem their default.
      if (four == (std::string(gates) == "16")) continue;
      SCOPED_TRACE(std::string(form) + " DSA_CUDA_LOGITS_GATES=" + gates);
      ScopedLogitsKernel force(form);
      ScopedEnv held("DSA_CUDA_LOGITS_GATES", gates);
      wgmma_flat_tile_edges();
      if (::testing::Test::HasFailure()) return;
      run_flat(FlatCase{64, {131072}, {2}, 131072, 0}, 333);
      run_flat(FlatCase{32, {500, 129, 77}, {40, 129, 5}, 512, 0}, 302);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Fused score-and-select has no CUDA kernel yet (docs/fused_select.md): the op says so and what
// exists, and CUDA plans keep every row on the unfused path, whatever the context.
TEST(GpuIndexerTopk, CudaSaysUnsupportedAndPlansStayUnfused) {
  DSA_REQUIRE_GPU();
  const int64_t R = 4, H = 2, B = 1, blocks = 4, page = 64, k = 64;
  DeviceBuffer dq(R * H * 128), dw(R * H * 4), dcache(blocks * page * kIndexerTokenBytes), dbt(B * blocks * 4),
      dseq(R * 4), dlen(R * 4), didx(R * k * 4);
  IndexerTopkParams p;
  p.q = dev_tensor(dq, DType::kE4M3, {R, H, 128});
  p.weights = dev_tensor(dw, DType::kF32, {R, H});
  p.cache.data = dcache.data();
  p.cache.num_blocks = blocks;
  p.cache.page_size = page;
  p.cache.device = cuda_device(0);
  p.block_table = dev_tensor(dbt, DType::kI32, {B, blocks});
  p.row_seq = dev_tensor(dseq, DType::kI32, {R});
  p.row_len = dev_tensor(dlen, DType::kI32, {R});
  p.width = blocks * page;
  p.k = k;
  p.indices = dev_tensor(didx, DType::kI32, {R, k});
  EXPECT_FALSE(indexer_topk_available(DeviceType::kCUDA));
  EXPECT_EQ(indexer_topk_workspace_size(p), 0u);
  const Status st = indexer_topk(p);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_TRUE(dsa_test::fails_naming(st, {"indexer_topk", "cuda", "indexer_logits_paged", "topk"}));

  PlannerConfig c;
  ASSERT_TRUE(geometry_preset("glm-5", &c.geometry).ok());
  c.max_context = 131072;
  c.device = cuda_device(0);
  Plan plan;
  DSA_ASSERT_OK(make_plan(c, &plan));
  EXPECT_FALSE(plan.fused_select);
  EXPECT_FALSE(plan.takes_fused(131072));
  EXPECT_EQ(plan.unfused_max_width, 131072);
  EXPECT_EQ(plan.fused_region_bytes, 0);
  c.select = SelectPath::kFused;
  EXPECT_TRUE(dsa_test::fails_naming(make_plan(c, &plan), {"select = fused", "cuda"}));
}
