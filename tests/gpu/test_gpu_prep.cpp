// GPU indexer preparation (quantize_fp8, prepare_indexer_q/k) against the CPU backend.
// Quantisation is exact, so bytes and scales must match bit for bit; RoPE/Hadamard are f32
// arithmetic whose FMA contraction may differ between compilers, so prepared vectors must
// match in scale and within one e4m3 step per element (and are bit-identical run to run).
#include <climits>
#include <cmath>

#include "gpu_util.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

namespace {

// One e4m3 step at the magnitude of the larger of a and b.
double e4m3_step(float a, float b) {
  const double m = std::max(std::fabs(a), std::fabs(b));
  if (m < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9);
  return std::ldexp(1.0, std::ilogb(m) - 3);
}

std::vector<float> rope_table(int64_t max_pos) {
  std::vector<float> cs(static_cast<size_t>(max_pos) * 64);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int i = 0; i < 32; ++i) {
      const double f = std::pow(10000.0, -2.0 * i / 64.0);
      cs[p * 64 + i] = static_cast<float>(std::cos(p * f));
      cs[p * 64 + 32 + i] = static_cast<float>(std::sin(p * f));
    }
  return cs;
}

// Values with outliers and a spread of magnitudes, so scales vary per vector.
std::vector<float> spread_values(Rng& rng, size_t n, size_t vec) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>((i / vec) % 17) - 10);
    v[i] = rng.normal() * mag;
    if (rng.integer(0, 199) == 0) v[i] *= 37.f;
  }
  return v;
}

struct QuantCase { int64_t rows, dim, group; bool bf16; };

void run_quant(const QuantCase& c, uint64_t seed) {
  Rng rng(seed);
  const size_t n = static_cast<size_t>(c.rows * c.dim);
  std::vector<float> xf = spread_values(rng, n, static_cast<size_t>(c.group));
  if (n > 3) { xf[1] = 0.f; xf[2] = -0.f; xf[3] = 1e-30f; }
  std::vector<uint16_t> xb = dsa_test::to_bf16(xf);
  const DType dt = c.bf16 ? DType::kBF16 : DType::kF32;
  const void* host_x = c.bf16 ? static_cast<const void*>(xb.data()) : static_cast<const void*>(xf.data());
  const size_t es = c.bf16 ? 2 : 4;
  const int64_t groups = c.dim / c.group;

  std::vector<uint8_t> ref_q(n, 0xEE);
  std::vector<float> ref_s(static_cast<size_t>(c.rows * groups), -1.f);
  QuantizeFp8Params hp;
  hp.x = make_tensor(host_x, dt, {c.rows, c.dim});
  hp.out = make_tensor(ref_q.data(), DType::kE4M3, {c.rows, c.dim});
  hp.scale = make_tensor(ref_s.data(), DType::kF32, {c.rows, groups});
  hp.group = c.group;
  DSA_ASSERT_OK(quantize_fp8(hp));

  DeviceBuffer dx(n * es), dq(n, 0xEE), ds(ref_s.size() * 4, 0xFF);
  dx.upload_bytes(host_x, n * es);
  QuantizeFp8Params gp = hp;
  gp.x = dev_tensor(dx, dt, {c.rows, c.dim});
  gp.out = dev_tensor(dq, DType::kE4M3, {c.rows, c.dim});
  gp.scale = dev_tensor(ds, DType::kF32, {c.rows, groups});
  for (int rep = 0; rep < 2; ++rep) {
    DSA_ASSERT_OK(quantize_fp8(gp));
    ASSERT_TRUE(device_clean());
    EXPECT_TRUE(same_bits(dq.download<uint8_t>(), ref_q, "e4m3 bytes"));
    EXPECT_TRUE(same_bits(ds.download<float>(), ref_s, "scales"));
  }
}

}  // namespace

TEST(GpuPrep, QuantizeFp8MatchesCpuBitForBit) {
  DSA_REQUIRE_GPU();
  const QuantCase cases[] = {{1, 128, 128, false}, {7, 256, 128, true}, {33, 512, 64, false},
                             {5, 96, 32, true},    {1000, 128, 128, false}, {3, 576, 192, false}};
  uint64_t seed = 1;
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " dim " << c.dim << " group " << c.group << " bf16 " << c.bf16);
    run_quant(c, seed++);
  }
}

TEST(GpuPrep, QuantizeFp8ZeroRows) {
  DSA_REQUIRE_GPU();
  DeviceBuffer dx(16), dq(16), ds(16);
  QuantizeFp8Params p;
  p.x = dev_tensor(dx, DType::kF32, {0, 128});
  p.out = dev_tensor(dq, DType::kE4M3, {0, 128});
  p.scale = dev_tensor(ds, DType::kF32, {0, 1});
  DSA_ASSERT_OK(quantize_fp8(p));
  EXPECT_TRUE(device_clean());
}

namespace {

struct PrepCase { int64_t tokens, heads; RopeStyle rope; bool hadamard, bf16; };

// Compares prepared vectors: equal scales, codes within one e4m3 step, bit-identical gates
// when the scales agree (the gate is fl(fl(w * c) * s) on both backends).
void expect_prepared_close(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref,
                           const std::vector<float>& got_s, const std::vector<float>& ref_s) {
  ASSERT_EQ(got.size(), ref.size());
  ASSERT_EQ(got_s.size() * 128, got.size());
  int64_t differing = 0;
  for (size_t v = 0; v < got_s.size(); ++v) {
    ASSERT_EQ(got_s[v], ref_s[v]) << "scale of vector " << v;
    for (size_t d = 0; d < 128; ++d) {
      const size_t i = v * 128 + d;
      const float a = e4m3_to_float(got[i]), b = e4m3_to_float(ref[i]);
      ASSERT_FALSE(std::isnan(a)) << "NaN code at vector " << v << " dim " << d;
      ASSERT_LE(std::fabs(a - b), e4m3_step(a, b)) << "vector " << v << " dim " << d;
      differing += got[i] != ref[i];
    }
  }
  // A code may differ only where the f32 RoPE rounding straddles a rounding midpoint.
  EXPECT_LE(differing, static_cast<int64_t>(got.size() / 1000 + 2));
}

void run_prep(const PrepCase& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t T = c.tokens, H = c.heads, max_pos = 4096;
  const std::vector<float> cs = rope_table(max_pos);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (auto& p : pos) p = static_cast<int32_t>(rng.integer(0, max_pos - 1));
  std::vector<float> qf = spread_values(rng, static_cast<size_t>(T * H * 128), 128);
  std::vector<float> kf = spread_values(rng, static_cast<size_t>(T * 128), 128);
  std::vector<float> wf = dsa_test::random_floats(rng, static_cast<size_t>(T * H));
  std::vector<uint16_t> qb = dsa_test::to_bf16(qf), kb = dsa_test::to_bf16(kf), wb = dsa_test::to_bf16(wf);
  const DType dt = c.bf16 ? DType::kBF16 : DType::kF32;
  const size_t es = c.bf16 ? 2 : 4;
  const void* hq = c.bf16 ? static_cast<const void*>(qb.data()) : qf.data();
  const void* hk = c.bf16 ? static_cast<const void*>(kb.data()) : kf.data();
  const void* hw = c.bf16 ? static_cast<const void*>(wb.data()) : wf.data();

  // CPU reference.
  std::vector<uint8_t> rq(static_cast<size_t>(T * H * 128)), rk(static_cast<size_t>(T * 128));
  std::vector<float> rw(static_cast<size_t>(T * H)), rqs(static_cast<size_t>(T * H)), rks(static_cast<size_t>(T));
  PrepareIndexerQParams hq_p;
  hq_p.q = make_tensor(hq, dt, {T, H, 128});
  hq_p.weights = make_tensor(hw, dt, {T, H});
  hq_p.positions = make_tensor(pos.data(), DType::kI32, {T});
  hq_p.cos_sin = make_tensor(cs.data(), DType::kF32, {max_pos, 64});
  hq_p.rope = c.rope;
  hq_p.hadamard = c.hadamard;
  hq_p.q_out = make_tensor(rq.data(), DType::kE4M3, {T, H, 128});
  hq_p.weights_out = make_tensor(rw.data(), DType::kF32, {T, H});
  hq_p.q_scale = make_tensor(rqs.data(), DType::kF32, {T, H});
  DSA_ASSERT_OK(prepare_indexer_q(hq_p));
  PrepareIndexerKParams hk_p;
  hk_p.k = make_tensor(hk, dt, {T, 128});
  hk_p.positions = hq_p.positions;
  hk_p.cos_sin = hq_p.cos_sin;
  hk_p.rope = c.rope;
  hk_p.hadamard = c.hadamard;
  hk_p.k_out = make_tensor(rk.data(), DType::kE4M3, {T, 128});
  hk_p.k_scale = make_tensor(rks.data(), DType::kF32, {T});
  DSA_ASSERT_OK(prepare_indexer_k(hk_p));

  DeviceBuffer dq(rq.size() * es), dk(rk.size() * es), dw(rw.size() * es), dpos(pos), dcs(cs);
  dq.upload_bytes(hq, rq.size() * es);
  dk.upload_bytes(hk, rk.size() * es);
  dw.upload_bytes(hw, rw.size() * es);
  DeviceBuffer oq(rq.size(), 0xEE), ok(rk.size(), 0xEE), ow(rw.size() * 4, 0xFF), oqs(rqs.size() * 4, 0xFF),
      oks(rks.size() * 4, 0xFF);
  PrepareIndexerQParams gq = hq_p;
  gq.q = dev_tensor(dq, dt, {T, H, 128});
  gq.weights = dev_tensor(dw, dt, {T, H});
  gq.positions = dev_tensor(dpos, DType::kI32, {T});
  gq.cos_sin = dev_tensor(dcs, DType::kF32, {max_pos, 64});
  gq.q_out = dev_tensor(oq, DType::kE4M3, {T, H, 128});
  gq.weights_out = dev_tensor(ow, DType::kF32, {T, H});
  gq.q_scale = dev_tensor(oqs, DType::kF32, {T, H});
  PrepareIndexerKParams gk = hk_p;
  gk.k = dev_tensor(dk, dt, {T, 128});
  gk.positions = gq.positions;
  gk.cos_sin = gq.cos_sin;
  gk.k_out = dev_tensor(ok, DType::kE4M3, {T, 128});
  gk.k_scale = dev_tensor(oks, DType::kF32, {T});

  DSA_ASSERT_OK(prepare_indexer_q(gq));
  DSA_ASSERT_OK(prepare_indexer_k(gk));
  ASSERT_TRUE(device_clean());
  const auto q1 = oq.download<uint8_t>(), k1 = ok.download<uint8_t>();
  const auto w1 = ow.download<float>(), qs1 = oqs.download<float>(), ks1 = oks.download<float>();
  expect_prepared_close(q1, rq, qs1, rqs);
  expect_prepared_close(k1, rk, ks1, rks);
  EXPECT_TRUE(same_bits(w1, rw, "folded gates"));

  // Run to run: bit-identical.
  DSA_ASSERT_OK(prepare_indexer_q(gq));
  DSA_ASSERT_OK(prepare_indexer_k(gk));
  EXPECT_TRUE(same_bits(oq.download<uint8_t>(), q1, "q repeat"));
  EXPECT_TRUE(same_bits(ok.download<uint8_t>(), k1, "k repeat"));
  EXPECT_TRUE(same_bits(ow.download<float>(), w1, "gate repeat"));
  EXPECT_TRUE(same_bits(oks.download<float>(), ks1, "k scale repeat"));
}

}  // namespace

TEST(GpuPrep, PrepareQkMatchesCpu) {
  DSA_REQUIRE_GPU();
  const PrepCase cases[] = {
      {1, 64, RopeStyle::kHalfSplit, false, false},  {17, 64, RopeStyle::kHalfSplit, true, true},
      {9, 32, RopeStyle::kInterleaved, true, false}, {33, 32, RopeStyle::kInterleaved, false, true},
      {5, 3, RopeStyle::kHalfSplit, true, false},    {512, 64, RopeStyle::kHalfSplit, true, true},
  };
  uint64_t seed = 100;
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << "T " << c.tokens << " H " << c.heads << " rope " << static_cast<int>(c.rope)
                                    << " hadamard " << c.hadamard << " bf16 " << c.bf16);
    run_prep(c, seed++);
  }
}

// Device positions cannot be validated without a sync: an out-of-table position zeroes the
// vector, its scale and its gate (it contributes nothing); valid tokens are unaffected.
TEST(GpuPrep, InvalidDevicePositionsZeroTheVector) {
  DSA_REQUIRE_GPU();
  const int64_t max_pos = 64, H = 4;
  const std::vector<int32_t> pos = {3, INT_MIN, -2, -1, static_cast<int32_t>(max_pos), static_cast<int32_t>(max_pos + 1), INT_MAX, 63};
  const int64_t T = static_cast<int64_t>(pos.size());
  Rng rng(7);
  std::vector<float> q = dsa_test::random_floats(rng, static_cast<size_t>(T * H * 128));
  std::vector<float> k = dsa_test::random_floats(rng, static_cast<size_t>(T * 128));
  std::vector<float> w = dsa_test::random_floats(rng, static_cast<size_t>(T * H));
  DeviceBuffer dq(q), dk(k), dw(w), dpos(pos), dcs(rope_table(max_pos));
  DeviceBuffer oq(q.size(), 0xEE), ok(k.size(), 0xEE), ow(w.size() * 4, 0xFF), oks(T * 4, 0xFF);
  PrepareIndexerQParams gq;
  gq.q = dev_tensor(dq, DType::kF32, {T, H, 128});
  gq.weights = dev_tensor(dw, DType::kF32, {T, H});
  gq.positions = dev_tensor(dpos, DType::kI32, {T});
  gq.cos_sin = dev_tensor(dcs, DType::kF32, {max_pos, 64});
  gq.q_out = dev_tensor(oq, DType::kE4M3, {T, H, 128});
  gq.weights_out = dev_tensor(ow, DType::kF32, {T, H});
  PrepareIndexerKParams gk;
  gk.k = dev_tensor(dk, DType::kF32, {T, 128});
  gk.positions = gq.positions;
  gk.cos_sin = gq.cos_sin;
  gk.k_out = dev_tensor(ok, DType::kE4M3, {T, 128});
  gk.k_scale = dev_tensor(oks, DType::kF32, {T});
  DSA_ASSERT_OK(prepare_indexer_q(gq));
  DSA_ASSERT_OK(prepare_indexer_k(gk));
  ASSERT_TRUE(device_clean());
  const auto rq = oq.download<uint8_t>(), rk = ok.download<uint8_t>();
  const auto rw = ow.download<float>(), rks = oks.download<float>();
  for (int64_t t = 0; t < T; ++t) {
    const bool valid = pos[t] >= 0 && pos[t] < max_pos;
    int nonzero = 0;
    for (int d = 0; d < 128; ++d) nonzero += rk[t * 128 + d] != 0;
    if (valid) {
      EXPECT_GT(nonzero, 0) << "token " << t;
      EXPECT_GT(rks[t], 0.f) << "token " << t;
    } else {
      EXPECT_EQ(nonzero, 0) << "token " << t;
      EXPECT_EQ(rks[t], 0.f) << "token " << t;
      for (int64_t h = 0; h < H; ++h) {
        EXPECT_EQ(rw[t * H + h], 0.f) << "token " << t;
        for (int d = 0; d < 128; ++d) ASSERT_EQ(rq[(t * H + h) * 128 + d], 0) << "token " << t;
      }
    }
  }
}
