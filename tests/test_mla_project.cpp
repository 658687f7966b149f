// The absorbed form's projections (dsa/mha.h: mla_absorb_q, mla_up_project) against a float64
// oracle written here from SPEC §5b: q_abs = [W_UK[h]ᵀ q_nope | q_pe], out = W_UV[h] latent.
// f32 outputs within the f32 accumulation bound (2^-20 of the sum of |terms|), bf16 outputs
// within one bf16 step of the exact value plus that bound; q_pe copied exactly; sentinel bytes
// after every output; bad arguments named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dsa/dsa.h"
#include "test_util.h"

namespace {

using namespace dsa;

struct Case {
  int64_t T, H, nope, v;
  std::vector<float> qn, qp, lat;    // inputs (f32 values; bf16-exact when fed as bf16)
  std::vector<uint16_t> w;           // [H (nope + v), 512] bf16
  Case(uint64_t seed, int64_t T_, int64_t H_, int64_t nope_, int64_t v_) : T(T_), H(H_), nope(nope_), v(v_) {
    dsa_test::Rng rng(seed);
    qn = dsa_test::from_bf16(dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * nope))));
    qp = dsa_test::from_bf16(dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * 64))));
    lat = dsa_test::from_bf16(dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(T * H * 512))));
    w = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(H * (nope + v) * 512), 0.05f));
  }
  double W(int64_t row, int64_t c) const { return bf16_to_float(w[static_cast<size_t>(row * 512 + c)]); }
};

// |got - want| within the f32 accumulation bound, plus one step of the output dtype.
::testing::AssertionResult near(double got, double want, double abs_sum, bool bf16, const std::string& where) {
  const double tol = std::ldexp(abs_sum, -20) + (bf16 ? std::ldexp(std::fabs(want), -8) : 0.0) + 1e-30;
  if (std::isfinite(got) && std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << where << ": got " << got << ", want " << want << " (tolerance " << tol << ")";
}

template <typename Out>
void check_absorb(const Case& k, bool bf16_io) {
  const int64_t T = k.T, H = k.H;
  std::vector<uint16_t> qn16 = dsa_test::to_bf16(k.qn), qp16 = dsa_test::to_bf16(k.qp);
  std::vector<float> qn = k.qn, qp = k.qp;
  const size_t n_out = static_cast<size_t>(T * H * 576);
  std::vector<Out> out(n_out + 16);
  std::memset(out.data(), 0x7B, out.size() * sizeof(Out));
  MlaAbsorbQParams p;
  p.q_nope = bf16_io ? dsa_test::t_bf16(qn16.data(), {T, H, k.nope}) : dsa_test::t_f32(qn.data(), {T, H, k.nope});
  p.q_pe = bf16_io ? dsa_test::t_bf16(qp16.data(), {T, H, 64}) : dsa_test::t_f32(qp.data(), {T, H, 64});
  p.kv_b_proj = make_tensor(k.w.data(), DType::kBF16, {H * (k.nope + k.v), 512});
  p.v_dim = k.v;
  constexpr bool out_bf16 = sizeof(Out) == 2;
  p.q_out = make_tensor(out.data(), out_bf16 ? DType::kBF16 : DType::kF32, {T, H, 576});
  DSA_ASSERT_OK(mla_absorb_q(p));
  auto val = [&](size_t i) { return out_bf16 ? double(bf16_to_float(static_cast<uint16_t>(out[i]))) : double(out[i]); };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t o = static_cast<size_t>((t * H + h) * 576);
      for (int64_t c = 0; c < 512; ++c) {
        double s = 0, a = 0;
        for (int64_t d = 0; d < k.nope; ++d) {
          const double x = k.qn[static_cast<size_t>((t * H + h) * k.nope + d)] * k.W(h * (k.nope + k.v) + d, c);
          s += x;
          a += std::fabs(x);
        }
        ASSERT_TRUE(near(val(o + c), s, a, out_bf16, "q_abs[" + std::to_string(t) + ", " + std::to_string(h) + ", " +
                                                        std::to_string(c) + "]"));
      }
      for (int64_t r = 0; r < 64; ++r)  // q_pe is copied (bf16-exact values): exactly
        ASSERT_EQ(val(o + 512 + r), k.qp[static_cast<size_t>((t * H + h) * 64 + r)]);
    }
  std::vector<Out> sentinel(16);
  std::memset(sentinel.data(), 0x7B, sentinel.size() * sizeof(Out));
  EXPECT_EQ(0, std::memcmp(out.data() + n_out, sentinel.data(), 16 * sizeof(Out))) << "written past q_out";
}

template <typename Out>
void check_up_project(const Case& k, bool bf16_in) {
  const int64_t T = k.T, H = k.H;
  std::vector<uint16_t> l16 = dsa_test::to_bf16(k.lat);
  std::vector<float> l = k.lat;
  const size_t n_out = static_cast<size_t>(T * H * k.v);
  std::vector<Out> out(n_out + 16);
  std::memset(out.data(), 0x7B, out.size() * sizeof(Out));
  MlaUpProjectParams p;
  p.latent = bf16_in ? dsa_test::t_bf16(l16.data(), {T, H, 512}) : dsa_test::t_f32(l.data(), {T, H, 512});
  p.kv_b_proj = make_tensor(k.w.data(), DType::kBF16, {H * (k.nope + k.v), 512});
  p.qk_nope = k.nope;
  constexpr bool out_bf16 = sizeof(Out) == 2;
  p.out = make_tensor(out.data(), out_bf16 ? DType::kBF16 : DType::kF32, {T, H, k.v});
  DSA_ASSERT_OK(mla_up_project(p));
  auto val = [&](size_t i) { return out_bf16 ? double(bf16_to_float(static_cast<uint16_t>(out[i]))) : double(out[i]); };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < k.v; ++e) {
        double s = 0, a = 0;
        for (int64_t c = 0; c < 512; ++c) {
          const double x = k.lat[static_cast<size_t>((t * H + h) * 512 + c)] * k.W(h * (k.nope + k.v) + k.nope + e, c);
          s += x;
          a += std::fabs(x);
        }
        ASSERT_TRUE(near(val(static_cast<size_t>((t * H + h) * k.v + e)), s, a, out_bf16,
                         "out[" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(e) + "]"));
      }
  std::vector<Out> sentinel(16);
  std::memset(sentinel.data(), 0x7B, sentinel.size() * sizeof(Out));
  EXPECT_EQ(0, std::memcmp(out.data() + n_out, sentinel.data(), 16 * sizeof(Out))) << "written past out";
}

TEST(MlaProject, AbsorbAgainstFloat64BothGeometries) {
  // 130 rows: two row blocks of the CPU kernel and a partial third; 3 heads (odd).
  for (auto [nope, v] : {std::pair<int64_t, int64_t>{128, 128}, {192, 256}}) {
    SCOPED_TRACE("qk_nope " + std::to_string(nope));
    const Case k(61 + nope, 130, 3, nope, v);
    check_absorb<float>(k, false);
    check_absorb<uint16_t>(k, true);
  }
}

TEST(MlaProject, UpProjectAgainstFloat64BothGeometries) {
  for (auto [nope, v] : {std::pair<int64_t, int64_t>{128, 128}, {192, 256}}) {
    SCOPED_TRACE("qk_nope " + std::to_string(nope));
    const Case k(71 + nope, 130, 3, nope, v);
    check_up_project<float>(k, false);
    check_up_project<uint16_t>(k, true);
  }
}

TEST(MlaProject, RepeatedRunsBitIdenticalAndEmptyShapes) {
  const Case k(81, 33, 2, 128, 128);
  std::vector<float> qn = k.qn, qp = k.qp, a(static_cast<size_t>(33 * 2 * 576)), b(a.size());
  MlaAbsorbQParams p;
  p.q_nope = dsa_test::t_f32(qn.data(), {33, 2, 128});
  p.q_pe = dsa_test::t_f32(qp.data(), {33, 2, 64});
  p.kv_b_proj = make_tensor(k.w.data(), DType::kBF16, {2 * 256, 512});
  p.v_dim = 128;
  p.q_out = dsa_test::t_f32(a.data(), {33, 2, 576});
  DSA_ASSERT_OK(mla_absorb_q(p));
  p.q_out = dsa_test::t_f32(b.data(), {33, 2, 576});
  DSA_ASSERT_OK(mla_absorb_q(p));
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  MlaAbsorbQParams e = p;  // T = 0: nothing to do, nothing touched
  e.q_nope.shape[0] = e.q_pe.shape[0] = e.q_out.shape[0] = 0;
  DSA_ASSERT_OK(mla_absorb_q(e));
}

TEST(MlaProject, RejectsBadArgumentsNamingThem) {
  const Case k(91, 4, 2, 128, 128);
  std::vector<float> qn = k.qn, qp = k.qp, lat = k.lat, out(4 * 2 * 576), up(4 * 2 * 128);
  std::vector<float> wf(static_cast<size_t>(2 * 256 * 512));
  auto absorb = [&]() {
    MlaAbsorbQParams p;
    p.q_nope = dsa_test::t_f32(qn.data(), {4, 2, 128});
    p.q_pe = dsa_test::t_f32(qp.data(), {4, 2, 64});
    p.kv_b_proj = make_tensor(k.w.data(), DType::kBF16, {2 * 256, 512});
    p.v_dim = 128;
    p.q_out = dsa_test::t_f32(out.data(), {4, 2, 576});
    return p;
  };
  auto refused = [](const Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  MlaAbsorbQParams p = absorb();
  p.kv_b_proj = dsa_test::t_f32(wf.data(), {2 * 256, 512});
  refused(mla_absorb_q(p), "mla_absorb_q: kv_b_proj: expected dtype bf16, got f32");
  p = absorb();
  p.kv_b_proj.shape[0] = 2 * 255;
  refused(mla_absorb_q(p), "mla_absorb_q: kv_b_proj: expected shape [H * (qk_nope + v), 512] = [2 * (128 + 128), 512]");
  p = absorb();
  p.v_dim = 0;
  refused(mla_absorb_q(p), "mla_absorb_q: v_dim: expected > 0");
  p = absorb();
  p.q_out = dsa_test::t_f32(out.data(), {4, 2, 512});
  refused(mla_absorb_q(p), "mla_absorb_q: q_out");
  p = absorb();
  p.q_pe = dsa_test::t_f32(qp.data(), {4, 2, 32});
  refused(mla_absorb_q(p), "mla_absorb_q: q_pe");
  p = absorb();
  p.q_out = dsa_test::t_f32(qn.data(), {1, 2, 576});  // over its own input
  p.q_nope.shape[0] = p.q_pe.shape[0] = 1;
  refused(mla_absorb_q(p), "mla_absorb_q: q_out");

  MlaUpProjectParams u;
  u.latent = dsa_test::t_f32(lat.data(), {4, 2, 512});
  u.kv_b_proj = make_tensor(k.w.data(), DType::kBF16, {2 * 256, 512});
  u.qk_nope = 128;
  u.out = dsa_test::t_f32(up.data(), {4, 2, 128});
  DSA_ASSERT_OK(mla_up_project(u));
  MlaUpProjectParams b = u;
  b.qk_nope = 0;
  refused(mla_up_project(b), "mla_up_project: qk_nope: expected > 0");
  b = u;
  b.out = dsa_test::t_f32(up.data(), {4, 2, 64});  // v = 64 does not match the weight's 2 * 256 rows
  refused(mla_up_project(b), "mla_up_project: kv_b_proj: expected shape");
  b = u;
  b.latent = dsa_test::t_f32(lat.data(), {4, 2, 500});
  refused(mla_up_project(b), "mla_up_project: latent");
  b = u;
  b.out = dsa_test::t_f32(lat.data(), {4, 2, 128});  // overlaps latent
  refused(mla_up_project(b), "mla_up_project: out");
}

}  // namespace
