// Indexer preparation (SPEC §3.1-3) against the float64 oracle: RoPE in both styles, Hadamard
// on/off, BF16 -> FP8 quantisation with power-of-two scales, gate folding, strides, shapes
// 0/1/odd, determinism and argument errors.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/parallel.h"
#include "oracle/oracle_indexer_prep.h"
#include "oracle/oracle_numerics.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;

namespace {

// cos_sin [P, 64] = [cos 32 | sin 32] with NeoX-like frequencies; position 0 is the identity.
std::vector<float> make_cos_sin(int64_t P) {
  std::vector<float> cs(static_cast<size_t>(P * 64));
  for (int64_t p = 0; p < P; ++p) {
    for (int i = 0; i < 32; ++i) {
      const double theta = static_cast<double>(p) * std::pow(10000.0, -i / 32.0);
      cs[p * 64 + i] = static_cast<float>(std::cos(theta));
      cs[p * 64 + 32 + i] = static_cast<float>(std::sin(theta));
    }
  }
  return cs;
}

// Input values as the op sees them: f32, or bf16 codes (the doubles are the decoded values).
struct Input {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<double> values;
  DType dtype;
  Input(dsa_test::Rng& rng, size_t n, DType dt, float sd) : dtype(dt) {
    f32 = dsa_test::random_floats(rng, n, sd);
    sync();
  }
  // Re-derives the bf16 codes and values after f32 was edited.
  void sync() {
    values.clear();
    if (dtype == DType::kBF16) {
      bf16 = dsa_test::to_bf16(f32);
      for (uint16_t b : bf16) values.push_back(oracle::bf16_value(b));
    } else {
      for (float f : f32) values.push_back(f);
    }
  }
  void* data() { return dtype == DType::kBF16 ? static_cast<void*>(bf16.data()) : static_cast<void*>(f32.data()); }
};

double bf16_ulp(double v) {
  const double a = std::fabs(v);
  return std::ldexp(1.0, (a > 0 ? std::max(std::ilogb(a), -126) : -126) - 7);
}

// One prepared vector against the oracle: the scale is a power of two consistent with amax
// (up to BF16 rounding of amax), and each value dequantises to within half an e4m3 step plus
// one BF16 step of the exact pre-rounding value.
::testing::AssertionResult vector_matches(const std::vector<double>& ref, const uint8_t* codes, float scale) {
  const double s = scale;
  if (!oracle::is_power_of_two(s)) return ::testing::AssertionFailure() << "scale " << s << " is not a power of two";
  double amax = 0;
  for (double v : ref) amax = std::max(amax, std::fabs(v));
  const double lo = amax * (1 - 1.0 / 128), hi = amax * (1 + 1.0 / 128);
  if (448.0 * s < lo) return ::testing::AssertionFailure() << "scale " << s << " too small for amax " << amax;
  if (224.0 * s >= hi && s > oracle::ue8m0_scale(0.0))
    return ::testing::AssertionFailure() << "scale " << s << " too large for amax " << amax;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double deq = oracle::e4m3_value(codes[i]) * s;
    const double tol = 0.5 * s * oracle::e4m3_step(std::fabs(ref[i]) / s * (1 + 1.0 / 128)) + bf16_ulp(ref[i]);
    if (!(std::fabs(deq - ref[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << deq << ", want " << ref[i]
                                           << " +- " << tol << " (scale " << s << ")";
  }
  return ::testing::AssertionSuccess();
}

struct QCase {
  int64_t T, H;
  DType dtype;
  RopeStyle rope;
  bool hadamard;
  bool with_scale;
};

void run_q_case(const QCase& c) {
  SCOPED_TRACE(::testing::Message() << "T=" << c.T << " H=" << c.H << " dtype=" << dtype_name(c.dtype)
                                    << " rope=" << static_cast<int>(c.rope) << " hadamard=" << c.hadamard);
  dsa_test::Rng rng(100 + c.T * 7 + c.H);
  const int64_t P = 97;
  std::vector<float> cs = make_cos_sin(P);
  Input q(rng, static_cast<size_t>(c.T * c.H * 128), c.dtype, 2.f);
  Input w(rng, static_cast<size_t>(c.T * c.H), c.dtype, 1.f);
  std::vector<int32_t> pos(static_cast<size_t>(c.T));
  for (auto& p : pos) p = static_cast<int32_t>(rng.integer(0, P - 1));
  if (c.T > 0) pos[0] = static_cast<int32_t>(P - 1);
  Guarded q_out(static_cast<size_t>(c.T * c.H * 128)), w_out(static_cast<size_t>(c.T * c.H * 4)),
      q_scale(static_cast<size_t>(c.T * c.H * 4));
  dsa_test::poison_f32(w_out.as<float>(), static_cast<size_t>(c.T * c.H));
  PrepareIndexerQParams p;
  p.q = make_tensor(q.data(), c.dtype, {c.T, c.H, 128});
  p.weights = make_tensor(w.data(), c.dtype, {c.T, c.H});
  p.positions = dsa_test::t_i32(pos.data(), {c.T});
  p.cos_sin = dsa_test::t_f32(cs.data(), {P, 64});
  p.rope = c.rope;
  p.hadamard = c.hadamard;
  p.q_out = dsa_test::t_e4m3(q_out.as<uint8_t>(), {c.T, c.H, 128});
  p.weights_out = dsa_test::t_f32(w_out.as<float>(), {c.T, c.H});
  if (c.with_scale) p.q_scale = dsa_test::t_f32(q_scale.as<float>(), {c.T, c.H});
  DSA_ASSERT_OK(prepare_indexer_q(p));
  ASSERT_TRUE(q_out.intact() && w_out.intact() && q_scale.intact());
  const float gate_c = oracle::gate_constant(c.H);
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t v = t * c.H + h;
      std::vector<double> x(q.values.begin() + v * 128, q.values.begin() + (v + 1) * 128);
      const std::vector<double> ref = oracle::prep_vector(x, &cs[pos[t] * 64], c.rope == RopeStyle::kHalfSplit, c.hadamard);
      const float w_folded = w_out.as<float>()[v];
      // The scale the op used: given, or recovered from the folded gate (a power of two).
      const float wc = static_cast<float>(w.values[v]) * gate_c;
      const float s = c.with_scale ? q_scale.as<float>()[v] : static_cast<float>(static_cast<double>(w_folded) / wc);
      ASSERT_TRUE(vector_matches(ref, q_out.as<uint8_t>() + v * 128, s)) << "t=" << t << " h=" << h;
      ASSERT_EQ(w_folded, wc * s) << "folded gate, t=" << t << " h=" << h;
    }
  }
}

}  // namespace

TEST(IndexerPrep, OracleRopeIsARotationAndHadamardIsOrthogonal) {
  dsa_test::Rng rng(5);
  std::vector<float> cs = make_cos_sin(50);
  std::vector<double> x(128), y(128);
  for (auto& v : x) v = rng.normal();
  for (bool half : {true, false}) {
    std::vector<double> r = oracle::prep_vector(x, &cs[37 * 64], half, false);
    // Each pair's norm scales by cos^2 + sin^2 of the (float-rounded) table entry.
    double nx = 0, nr = 0;
    for (int i = 0; i < 128; ++i) nr += r[i] * r[i];
    for (int i = 64; i < 128; ++i) nx += x[i] * x[i];
    for (int i = 0; i < 32; ++i) {
      const double c = cs[37 * 64 + i], s = cs[37 * 64 + 32 + i];
      const int ia = half ? i : 2 * i, ib = half ? i + 32 : 2 * i + 1;
      nx += (x[ia] * x[ia] + x[ib] * x[ib]) * (c * c + s * s);
    }
    EXPECT_NEAR(nr, nx, 1e-12 * nx);
    for (int i = 64; i < 128; ++i) EXPECT_EQ(r[i], x[i]);  // pass-through half untouched
  }
  // Hadamard: dot products unchanged, and applying it twice is the identity.
  std::vector<double> a(128), b(128), ha(128), hb(128), hha(128);
  for (int i = 0; i < 128; ++i) { a[i] = rng.normal(); b[i] = rng.normal(); }
  oracle::hadamard128(a.data(), ha.data());
  oracle::hadamard128(b.data(), hb.data());
  oracle::hadamard128(ha.data(), hha.data());
  double dab = 0, dhab = 0;
  for (int i = 0; i < 128; ++i) { dab += a[i] * b[i]; dhab += ha[i] * hb[i]; }
  EXPECT_NEAR(dhab, dab, 1e-12 * 128);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(hha[i], a[i], 1e-13);
  // Sylvester order: row 1 alternates signs.
  std::vector<double> e1(128, 0.0), he1(128);
  e1[1] = std::sqrt(128.0);
  oracle::hadamard128(e1.data(), he1.data());
  for (int i = 0; i < 128; ++i) EXPECT_DOUBLE_EQ(he1[i], (i % 2) ? -1.0 : 1.0);
}

TEST(IndexerPrep, QuantizeFp8IsExact) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto shape : std::vector<std::pair<int64_t, int64_t>>{{0, 256}, {1, 128}, {5, 256}, {17, 96}}) {
      const int64_t R = shape.first, D = shape.second, g = D == 96 ? 32 : 128;
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " R=" << R << " D=" << D);
      dsa_test::Rng rng(R * 31 + D);
      Input x(rng, static_cast<size_t>(R * D), dt, 3.f);
      // Zero group (floor scale), huge and tiny groups.
      if (R >= 5) {
        for (int64_t i = 0; i < g; ++i) {
          x.f32[i] = 0.f;
          x.f32[g + i] *= 1e4f;
          x.f32[D + i] *= 1e-6f;
        }
        x.f32[2 * D + 5] = std::numeric_limits<float>::quiet_NaN();  // NaN stays NaN, others unaffected
        x.f32[2 * D + 6] = -std::numeric_limits<float>::quiet_NaN();
        x.sync();
      }
      Guarded out(static_cast<size_t>(R * D)), scale(static_cast<size_t>(R * D / g * 4));
      QuantizeFp8Params p;
      p.x = make_tensor(x.data(), dt, {R, D});
      p.out = dsa_test::t_e4m3(out.as<uint8_t>(), {R, D});
      p.scale = dsa_test::t_f32(scale.as<float>(), {R, D / g});
      p.group = g;
      DSA_ASSERT_OK(quantize_fp8(p));
      ASSERT_TRUE(out.intact() && scale.intact());
      for (int64_t k = 0; k < R * D / g; ++k) {
        std::vector<double> v(static_cast<size_t>(g));
        for (int64_t i = 0; i < g; ++i) v[i] = oracle::bf16_value(oracle::bf16_encode(x.values[k * g + i]));
        std::vector<uint8_t> codes(static_cast<size_t>(g));
        const double s = oracle::quantize_group(v.data(), g, codes.data());
        ASSERT_EQ(static_cast<double>(scale.as<float>()[k]), s) << "group " << k;
        ASSERT_EQ(0, std::memcmp(codes.data(), out.as<uint8_t>() + k * g, static_cast<size_t>(g))) << "group " << k;
      }
    }
  }
}

TEST(IndexerPrep, KeysWithIdentityRotationAreExact) {
  // Position 0 rotates by (1, 0): the pipeline is then BF16 rounding and quantisation only,
  // which the oracle reproduces bit for bit.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (RopeStyle rope : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
      const int64_t T = 9;
      dsa_test::Rng rng(9);
      std::vector<float> cs = make_cos_sin(4);
      Input k(rng, T * 128, dt, 5.f);
      std::vector<int32_t> pos(T, 0);
      Guarded k_out(T * 128), k_scale(T * 4);
      PrepareIndexerKParams p;
      p.k = make_tensor(k.data(), dt, {T, 128});
      p.positions = dsa_test::t_i32(pos.data(), {T});
      p.cos_sin = dsa_test::t_f32(cs.data(), {4, 64});
      p.rope = rope;
      p.k_out = dsa_test::t_e4m3(k_out.as<uint8_t>(), {T, 128});
      p.k_scale = dsa_test::t_f32(k_scale.as<float>(), {T});
      DSA_ASSERT_OK(prepare_indexer_k(p));
      ASSERT_TRUE(k_out.intact() && k_scale.intact());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> v(128);
        for (int i = 0; i < 128; ++i) v[i] = oracle::bf16_value(oracle::bf16_encode(k.values[t * 128 + i]));
        uint8_t codes[128];
        const double s = oracle::quantize_group(v.data(), 128, codes);
        EXPECT_EQ(static_cast<double>(k_scale.as<float>()[t]), s);
        EXPECT_EQ(0, std::memcmp(codes, k_out.as<uint8_t>() + t * 128, 128)) << "token " << t;
      }
    }
  }
}

TEST(IndexerPrep, KeysMatchOracle) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (RopeStyle rope : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved}) {
      for (bool had : {false, true}) {
        for (int64_t T : {0, 1, 67}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rope=" << static_cast<int>(rope)
                                            << " hadamard=" << had << " T=" << T);
          dsa_test::Rng rng(T + 1000);
          const int64_t P = 300;
          std::vector<float> cs = make_cos_sin(P);
          Input k(rng, static_cast<size_t>(T * 128), dt, 1.5f);
          if (T > 0) {
            k.f32[3] = 0.f;
            k.sync();
          }
          std::vector<int32_t> pos(static_cast<size_t>(T));
          for (auto& x : pos) x = static_cast<int32_t>(rng.integer(0, P - 1));
          Guarded k_out(static_cast<size_t>(T * 128)), k_scale(static_cast<size_t>(T * 4));
          PrepareIndexerKParams p;
          p.k = make_tensor(k.data(), dt, {T, 128});
          p.positions = dsa_test::t_i32(pos.data(), {T});
          p.cos_sin = dsa_test::t_f32(cs.data(), {P, 64});
          p.rope = rope;
          p.hadamard = had;
          p.k_out = dsa_test::t_e4m3(k_out.as<uint8_t>(), {T, 128});
          p.k_scale = dsa_test::t_f32(k_scale.as<float>(), {T});
          DSA_ASSERT_OK(prepare_indexer_k(p));
          ASSERT_TRUE(k_out.intact() && k_scale.intact());
          for (int64_t t = 0; t < T; ++t) {
            std::vector<double> x(k.values.begin() + t * 128, k.values.begin() + (t + 1) * 128);
            auto ref = oracle::prep_vector(x, &cs[pos[t] * 64], rope == RopeStyle::kHalfSplit, had);
            ASSERT_TRUE(vector_matches(ref, k_out.as<uint8_t>() + t * 128, k_scale.as<float>()[t])) << "t=" << t;
          }
        }
      }
    }
  }
}

TEST(IndexerPrep, QueriesMatchOracleWithFoldedGates) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (RopeStyle rope : {RopeStyle::kHalfSplit, RopeStyle::kInterleaved})
      for (bool had : {false, true}) {
        run_q_case({5, 3, dt, rope, had, true});
        run_q_case({1, 1, dt, rope, had, false});
      }
  run_q_case({0, 4, DType::kF32, RopeStyle::kInterleaved, true, true});
  run_q_case({3, 32, DType::kBF16, RopeStyle::kInterleaved, true, false});  // GLM-5 heads: c = 1/64
  run_q_case({2, 64, DType::kF32, RopeStyle::kHalfSplit, true, true});      // V3.2 heads: c inexact
}

TEST(IndexerPrep, HadamardSpreadsAnOutlier) {
  // One outlier of 100 in a zero vector: with Hadamard every output is +-100/sqrt(128).
  const int64_t T = 1;
  std::vector<float> cs = make_cos_sin(1), k(128, 0.f);
  k[70] = 100.f;
  std::vector<int32_t> pos = {0};
  uint8_t out[128];
  float scale = 0;
  PrepareIndexerKParams p;
  p.k = dsa_test::t_f32(k.data(), {T, 128});
  p.positions = dsa_test::t_i32(pos.data(), {T});
  p.cos_sin = dsa_test::t_f32(cs.data(), {1, 64});
  p.hadamard = true;
  p.k_out = dsa_test::t_e4m3(out, {T, 128});
  p.k_scale = dsa_test::t_f32(&scale, {T});
  DSA_ASSERT_OK(prepare_indexer_k(p));
  const double want = 100.0 / std::sqrt(128.0);
  for (int i = 0; i < 128; ++i) {
    const double sign = (__builtin_popcount(i & 70) % 2) ? -1.0 : 1.0;
    EXPECT_NEAR(oracle::e4m3_value(out[i]) * scale, sign * want, want / 16) << i;
  }
}

TEST(IndexerPrep, StridedInputsAndRepeatedRunsAreBitIdentical) {
  const int64_t T = 301, H = 4, P = 64;
  dsa_test::Rng rng(77);
  std::vector<float> cs = make_cos_sin(P);
  // q rows padded: token stride H*128 + 64, weights token stride H + 3.
  std::vector<float> q((T - 1) * (H * 128 + 64) + H * 128), w((T - 1) * (H + 3) + H);
  for (auto& v : q) v = rng.normal();
  for (auto& v : w) v = rng.uniform();
  std::vector<float> qc(T * H * 128), wc(T * H);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&qc[t * H * 128], &q[t * (H * 128 + 64)], H * 128 * 4);
    std::memcpy(&wc[t * H], &w[t * (H + 3)], H * 4);
  }
  std::vector<int32_t> pos(T);
  for (auto& v : pos) v = static_cast<int32_t>(rng.integer(0, P - 1));
  auto run = [&](bool strided, std::vector<uint8_t>& qo, std::vector<float>& wo) {
    qo.assign(T * H * 128, 0);
    wo.assign(T * H, 0.f);
    PrepareIndexerQParams p;
    p.q = dsa_test::t_f32(strided ? q.data() : qc.data(), {T, H, 128});
    p.weights = dsa_test::t_f32(strided ? w.data() : wc.data(), {T, H});
    if (strided) { p.q.stride[0] = H * 128 + 64; p.weights.stride[0] = H + 3; }
    p.positions = dsa_test::t_i32(pos.data(), {T});
    p.cos_sin = dsa_test::t_f32(cs.data(), {P, 64});
    p.rope = RopeStyle::kInterleaved;
    p.hadamard = true;
    p.q_out = dsa_test::t_e4m3(qo.data(), {T, H, 128});
    p.weights_out = dsa_test::t_f32(wo.data(), {T, H});
    return prepare_indexer_q(p);
  };
  std::vector<uint8_t> q1, q2, q3;
  std::vector<float> w1, w2, w3;
  DSA_ASSERT_OK(run(false, q1, w1));
  DSA_ASSERT_OK(run(true, q2, w2));
  const int threads = cpu::pool_threads();
  cpu::set_pool_threads(1);
  Status st = run(false, q3, w3);
  cpu::set_pool_threads(threads);
  DSA_ASSERT_OK(st);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(q1, q3);
  EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * 4));
  EXPECT_EQ(0, std::memcmp(w1.data(), w3.data(), w1.size() * 4));
}

TEST(IndexerPrep, RejectsBadArgumentsNamingThem) {
  const int64_t T = 2, H = 2, P = 8;
  std::vector<float> q(T * H * 128, 1.f), w(T * H, 1.f), cs = make_cos_sin(P), wo(T * H), qs(T * H);
  std::vector<uint8_t> qo(T * H * 128);
  std::vector<int32_t> pos = {1, 7};
  PrepareIndexerQParams good;
  good.q = dsa_test::t_f32(q.data(), {T, H, 128});
  good.weights = dsa_test::t_f32(w.data(), {T, H});
  good.positions = dsa_test::t_i32(pos.data(), {T});
  good.cos_sin = dsa_test::t_f32(cs.data(), {P, 64});
  good.q_out = dsa_test::t_e4m3(qo.data(), {T, H, 128});
  good.weights_out = dsa_test::t_f32(wo.data(), {T, H});
  DSA_ASSERT_OK(prepare_indexer_q(good));
  auto p = good;
  p.q = dsa_test::t_f32(q.data(), {T, H * 2, 64});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"prepare_indexer_q", "q", "128"}));
  p = good;
  p.q.dtype = DType::kE4M3;
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"q", "dtype"}));
  p = good;
  p.weights_out = dsa_test::t_f32(wo.data(), {T, H + 1});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"weights_out", "H_idx"}));
  p = good;
  p.q_out.stride[2] = 2;
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"q_out", "contiguous"}));
  p = good;
  p.positions.dtype = DType::kF32;
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"positions", "i32"}));
  {  // i64 positions (engines' dtype) give the same bytes as i32 ones; out-of-range ones are named
    std::vector<int64_t> pos64(pos.begin(), pos.end());
    std::vector<uint8_t> qo64(qo.size());
    std::vector<float> wo64(wo.size());
    p = good;
    p.positions = dsa_test::t_i64(pos64.data(), {T});
    p.q_out = dsa_test::t_e4m3(qo64.data(), {T, H, 128});
    p.weights_out = dsa_test::t_f32(wo64.data(), {T, H});
    DSA_ASSERT_OK(prepare_indexer_q(good));
    DSA_ASSERT_OK(prepare_indexer_q(p));
    EXPECT_EQ(qo64, qo);
    EXPECT_EQ(0, std::memcmp(wo64.data(), wo.data(), wo.size() * 4));
    pos64[1] = int64_t{1} << 33;
    EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"positions", "8589934592"}));
  }
  p = good;
  p.cos_sin = dsa_test::t_f32(cs.data(), {P * 2, 32});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"cos_sin", "64"}));
  p = good;
  p.q_scale = dsa_test::t_f32(qs.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"q_scale"}));
  p = good;
  p.rope = static_cast<RopeStyle>(7);
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"rope"}));
  std::vector<int32_t> bad_pos = {1, 8};
  p = good;
  p.positions = dsa_test::t_i32(bad_pos.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"positions", "max_positions = 8", "positions[1] = 8"}));
  bad_pos = {-1, 0};
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_q(p), {"positions", "positions[0] = -1"}));

  std::vector<float> ks(T);
  PrepareIndexerKParams k;
  k.k = dsa_test::t_f32(q.data(), {T, 128});
  k.positions = dsa_test::t_i32(pos.data(), {T});
  k.cos_sin = dsa_test::t_f32(cs.data(), {P, 64});
  k.k_out = dsa_test::t_e4m3(qo.data(), {T, 128});
  k.k_scale = dsa_test::t_f32(ks.data(), {T});
  DSA_ASSERT_OK(prepare_indexer_k(k));
  auto k2 = k;
  k2.k_scale = dsa_test::t_f32(ks.data(), {T + 1});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_k(k2), {"prepare_indexer_k", "k_scale", "T"}));
  k2 = k;
  k2.k_out.dtype = DType::kU8;
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_k(k2), {"k_out", "e4m3"}));
  k2 = k;
  k2.positions = dsa_test::t_i32(bad_pos.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(prepare_indexer_k(k2), {"positions", "max_positions"}));

  QuantizeFp8Params f;
  f.x = dsa_test::t_f32(q.data(), {T, 192});
  f.out = dsa_test::t_e4m3(qo.data(), {T, 192});
  f.scale = dsa_test::t_f32(ks.data(), {T, 1});
  EXPECT_TRUE(dsa_test::fails_naming(quantize_fp8(f), {"quantize_fp8", "x", "group = 128"}));
  f.group = 0;
  EXPECT_TRUE(dsa_test::fails_naming(quantize_fp8(f), {"group"}));
  f.group = 96;
  f.scale = dsa_test::t_f32(ks.data(), {T, 1});
  EXPECT_TRUE(dsa_test::fails_naming(quantize_fp8(f), {"scale", "D / group"}));
}
