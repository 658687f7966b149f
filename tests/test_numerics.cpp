// dsa/numerics.h against the oracle's definitions of the formats: every e4m3 and bf16 code
// decoded, encoding checked on exact values, midpoints, their neighbours, range edges and
// random floats, and the ue8m0 scale against its defining inequalities.
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/fp8_block.h"
#include "oracle/oracle_numerics.h"
#include "test_util.h"

using namespace dsa;

namespace {

float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

// Random floats spread over every binade, both signs.
std::vector<float> log_uniform_floats(uint64_t seed, int n, int min_exp, int max_exp) {
  dsa_test::Rng rng(seed);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) {
    float m = rng.uniform(1.f, 2.f);
    float f = std::ldexp(m, static_cast<int>(rng.integer(min_exp, max_exp)));
    v.push_back(rng.integer(0, 1) ? -f : f);
  }
  return v;
}

// Both signs of x.
void push_signed(std::vector<float>& v, float x) {
  v.push_back(x);
  v.push_back(-x);
}

}  // namespace

TEST(Numerics, E4m3DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const double want = oracle::e4m3_value(static_cast<uint8_t>(c));
    const float got = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
}

TEST(Numerics, E4m3EncodesToNearestEven) {
  std::vector<float> xs;
  for (int c = 0; c <= 0x7e; ++c) {
    const float v = static_cast<float>(oracle::e4m3_value(static_cast<uint8_t>(c)));
    push_signed(xs, v);
    if (c < 0x7e) {
      // The midpoint to the next code and its float neighbours: ties and near-ties.
      const float mid = static_cast<float>(
          (oracle::e4m3_value(static_cast<uint8_t>(c)) + oracle::e4m3_value(static_cast<uint8_t>(c + 1))) / 2);
      push_signed(xs, mid);
      push_signed(xs, next_up(mid));
      push_signed(xs, next_down(mid));
    }
  }
  for (float x : {448.f, next_up(448.f), 455.f, 456.f, 463.99f, next_down(464.f), 464.f, next_up(464.f),
                  480.f, 1e6f, FLT_MAX, std::numeric_limits<float>::infinity(),
                  std::ldexp(1.f, -10), next_up(std::ldexp(1.f, -10)), next_down(std::ldexp(1.f, -10)),
                  std::ldexp(1.f, -11), 1e-30f, FLT_MIN, next_down(FLT_MIN), 1e-45f, 0.f,
                  std::numeric_limits<float>::quiet_NaN()}) {
    push_signed(xs, x);
  }
  for (float x : log_uniform_floats(1, 200000, -14, 9)) xs.push_back(x);
  for (float x : xs) {
    ASSERT_EQ(float_to_e4m3(x), oracle::e4m3_encode(x)) << "x = " << x;
  }
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(460.f), 0x7e);  // (448, 464) rounds to 448
  EXPECT_EQ(float_to_e4m3(464.f), 0x7e);  // the midpoint ties to the even 448
  EXPECT_EQ(float_to_e4m3(next_up(464.f)) & 0x7f, 0x7f);  // past 464: NaN (no infinities)
}

TEST(Numerics, QuantizeE4m3ClampsAndDivides) {
  dsa_test::Rng rng(7);
  for (int i = 0; i < 50000; ++i) {
    const float s = std::ldexp(1.f, static_cast<int>(rng.integer(-20, 20)));
    const float x = rng.normal(0.f, 300.f) * s;
    double y = static_cast<double>(x) / s;
    y = y > 448 ? 448 : (y < -448 ? -448 : y);
    ASSERT_EQ(quantize_e4m3(x, 1.0f / s), oracle::e4m3_encode(y)) << x << " / " << s;
  }
}

TEST(Numerics, Bf16DecodesEveryCode) {
  for (int c = 0; c < 65536; ++c) {
    const double want = oracle::bf16_value(static_cast<uint16_t>(c));
    const float got = bf16_to_float(static_cast<uint16_t>(c));
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got)) << c;
    else ASSERT_EQ(static_cast<double>(got), want) << c;
  }
}

TEST(Numerics, Bf16EncodesToNearestEven) {
  std::vector<float> xs;
  dsa_test::Rng rng(3);
  for (int c = 0; c < 0x7f80; ++c) {
    const double v = oracle::bf16_value(static_cast<uint16_t>(c));
    const double next = c + 1 == 0x7f80 ? std::ldexp(1.0, 128) : oracle::bf16_value(static_cast<uint16_t>(c + 1));
    push_signed(xs, static_cast<float>(v));
    if (c + 1 < 0x7f80) {
      const float mid = static_cast<float>((v + next) / 2);  // 9 significant bits: exact in f32
      push_signed(xs, mid);
      push_signed(xs, next_up(mid));
      push_signed(xs, next_down(mid));
    }
    // A random float inside the step.
    push_signed(xs, bits_float((static_cast<uint32_t>(c) << 16) | static_cast<uint32_t>(rng.integer(0, 0xffff))));
  }
  for (float x : {FLT_MAX, std::numeric_limits<float>::infinity(), FLT_MIN, next_down(FLT_MIN), 1e-45f})
    push_signed(xs, x);
  for (float x : xs) {
    ASSERT_EQ(float_to_bf16(x), oracle::bf16_encode(x)) << "x = " << x;
    ASSERT_EQ(round_to_bf16(x), static_cast<float>(oracle::bf16_value(oracle::bf16_encode(x)))) << x;
  }
  for (uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xffbadbadu, 0x7fffffffu}) {
    const uint16_t b = float_to_bf16(bits_float(nan_bits));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << nan_bits;
    EXPECT_TRUE(b & 0x40) << "quiet bit, " << std::hex << nan_bits;
    EXPECT_EQ(b >> 15, nan_bits >> 31);
  }
}

TEST(Numerics, Ue8m0ScaleIsTheSmallestPowerOfTwoAbove) {
  std::vector<float> amaxes = {0.f, -1.f, std::numeric_limits<float>::quiet_NaN(), 1e-4f,
                               next_up(1e-4f), next_down(1e-4f), 1e-30f, 1e-45f, FLT_MAX, 448.f, 1.f};
  for (int k = -30; k <= 100; ++k) {
    const float edge = std::ldexp(448.f, k);
    for (float a : {edge, next_up(edge), next_down(edge), std::ldexp(224.f, k), next_up(std::ldexp(224.f, k))})
      amaxes.push_back(a);
  }
  for (float a : log_uniform_floats(11, 100000, -20, 120)) amaxes.push_back(std::fabs(a));
  const double floor_scale = oracle::ue8m0_scale(0.0);
  for (float a : amaxes) {
    const double got = ue8m0_scale(a);
    ASSERT_EQ(got, oracle::ue8m0_scale(a)) << "amax = " << a;
    ASSERT_TRUE(oracle::is_power_of_two(got)) << a;
    const double eff = (std::isnan(a) || a < 1e-4f) ? static_cast<double>(1e-4f) : a;
    ASSERT_GE(448.0 * got, eff) << a;  // s >= amax / 448 exactly
    if (got > floor_scale) {
      ASSERT_LT(224.0 * got, eff) << a;  // s / 2 < amax / 448
    }
  }
  EXPECT_EQ(ue8m0_scale(448.f), 1.0f);
  EXPECT_EQ(ue8m0_scale(next_up(448.f)), 2.0f);
  EXPECT_EQ(ue8m0_scale(0.f), std::ldexp(1.0f, -22));  // 1e-4 / 448 = 2.23e-7 -> 2^-22
}

// The CPU backend's branch-free block conversions must equal the scalar ones bit for bit
// (checked on all 2^32 patterns once by hand; here a dense sweep that keeps the suite fast).
TEST(Numerics, CpuBlockConversionsEqualScalarOnes) {
  auto check = [](uint32_t bits) {
    const float f = bits_float(bits);
    if (cpu::e4m3_from_float_nobranch(f) != float_to_e4m3(f)) return false;
    return float_bits(cpu::round_bf16_nobranch(f)) == float_bits(round_to_bf16(f));
  };
  for (uint64_t u = 0; u < (1ull << 32); u += 251) ASSERT_TRUE(check(static_cast<uint32_t>(u))) << std::hex << u;
  // Every pattern within a few steps of the format boundaries, both signs.
  for (uint32_t edge : {0x3c800000u, 0x43e00000u, 0x43e80000u, 0x7f800000u, 0x3a800000u, 0x3a000000u, 0u, 0x7f7f8000u}) {
    for (uint32_t d = 0; d < 4096; ++d) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        ASSERT_TRUE(check(sign | (edge + d))) << std::hex << (sign | (edge + d));
        ASSERT_TRUE(check(sign | (edge - d))) << std::hex << (sign | (edge - d));
      }
    }
  }
  // amax ignores NaN and counts -0 / inf like fmax of |x|.
  float x[19] = {0};
  x[3] = -7.5f;
  x[17] = 3.f;
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(cpu::round_bf16_and_amax(x, 19), 7.5f);
  x[18] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::round_bf16_and_amax(x, 19), std::numeric_limits<float>::infinity());
}
