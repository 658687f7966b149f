// The layer step's core mode on CUDA (SPEC §6): q_nope / q_pe / kv_b_proj in, [T, H, v] out.
// Absorbed form bit-identical to the latent step between the CUDA projection ops; the MHA form
// for the short prompt only where the cost model says so, the same function up to rounding;
// caches byte-identical across modes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_util.h"
#include "step_batch.h"

using namespace dsa;
using namespace dsa_gpu_test;

namespace {

using namespace step_batch;

constexpr int64_t kNope = 128, kV = 128;

struct CoreRun {
  Status status;
  StepReport report;
  std::vector<float> out, lse;
  std::vector<uint8_t> mla;
};

// One step on CUDA. core: q_nope / q_pe / kv_b_proj (form); else latent mode with q_abs (bf16)
// and out_latent [T, H, 512] bf16 downloaded into *latent.
CoreRun run(const Batch& b, const Plan& plan, bool core, DenseForm form, const std::vector<uint16_t>& q_nope,
            const std::vector<uint16_t>& q_pe, const std::vector<uint16_t>& w, const DeviceBuffer* q_abs,
            std::vector<uint16_t>* latent) {
  CoreRun r;
  const Device dev = cuda_device(0);
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceBuffer bt(b.block_table), kv_c(b.kv_c), k_pe(b.k_pe), iq(b.iq), ik(b.ik), iw(b.iw), cs(b.cos_sin), mla(b.mla),
      idx(b.idx), qn(q_nope), qp(q_pe), wb(w);
  const int64_t width = core ? kV : 512;
  DeviceBuffer out(static_cast<size_t>(b.T * kH * width * (core ? 4 : 2)), 0xFF), lse(static_cast<size_t>(b.T * kH * 4), 0xFF);
  std::vector<int32_t> ql = b.q_lens, kl = b.kv_lens;
  StepParams p;
  p.q_lens = make_tensor(ql.data(), DType::kI32, {b.B});
  p.kv_lens = make_tensor(kl.data(), DType::kI32, {b.B});
  p.block_table = dev_tensor(bt, DType::kI32, {b.B, b.max_blocks});
  p.kv_c = dev_tensor(kv_c, DType::kBF16, {b.T, 512});
  p.k_pe = dev_tensor(k_pe, DType::kBF16, {b.T, 64});
  if (core) {
    p.q_nope = dev_tensor(qn, DType::kBF16, {b.T, kH, kNope});
    p.q_pe = dev_tensor(qp, DType::kBF16, {b.T, kH, 64});
    p.kv_b_proj = dev_tensor(wb, DType::kBF16, {kH * (kNope + kV), 512});
    p.dense_form = form;
    p.out = dev_tensor(out, DType::kF32, {b.T, kH, kV});
  } else {
    p.q = dev_tensor(*q_abs, DType::kBF16, {b.T, kH, 576});
    p.out = dev_tensor(out, DType::kBF16, {b.T, kH, 512});
  }
  p.index_q = dev_tensor(iq, DType::kF32, {b.T, kHi, 128});
  p.index_k = dev_tensor(ik, DType::kF32, {b.T, 128});
  p.index_w = dev_tensor(iw, DType::kF32, {b.T, kHi});
  p.cos_sin = dev_tensor(cs, DType::kF32, {kMaxPos, 64});
  p.mla_cache.data = mla.data();
  p.mla_cache.num_blocks = b.num_blocks;
  p.mla_cache.page_size = kPage;
  p.mla_cache.device = dev;
  p.index_cache.data = idx.data();
  p.index_cache.num_blocks = b.num_blocks;
  p.index_cache.page_size = kPage;
  p.index_cache.device = dev;
  p.lse = dev_tensor(lse, DType::kF32, {b.T, kH});
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  Attention a(plan);
  r.status = a.step(p, &r.report);
  EXPECT_TRUE(device_clean());
  if (core) r.out = out.download<float>();
  else if (latent) *latent = out.download<uint16_t>();
  r.lse = lse.download<float>();
  r.mla = mla.download<uint8_t>();
  return r;
}

}  // namespace

TEST(GpuCoreMode, AbsorbedEqualsLatentStepBetweenProjectionsAndMhaOnlyWhereCheaper) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{150, 150}, {20, 20}, {40, 300}, {1, 70}, {4, 64}, {2, 65}}, 4242);
  dsa_test::Rng rng(4343);
  const auto q_nope = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(b.T * kH * kNope), 0.5f));
  const auto q_pe = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(b.T * kH * 64), 0.5f));
  const auto w = dsa_test::to_bf16(dsa_test::random_floats(rng, static_cast<size_t>(kH * (kNope + kV) * 512), 0.06f));
  PlannerConfig c;
  c.geometry = tiny();
  c.page_size = kPage;
  c.max_tokens_per_step = b.T;
  c.max_seqs_per_step = b.B;
  c.max_context = b.max_kv;
  c.device = cuda_device(0);
  c.core_mode = true;
  Plan plan;
  ASSERT_TRUE(make_plan(c, &plan).ok());
  ASSERT_GE(plan.mha_max_context, 64);

  // The latent reference: q_abs by the CUDA absorb op, the latent step, W_UV by the up-project op.
  DeviceBuffer qn(q_nope), qp(q_pe), wb(w), q_abs(static_cast<size_t>(b.T * kH * 576 * 2), 0xFF);
  MlaAbsorbQParams ap;
  ap.q_nope = dev_tensor(qn, DType::kBF16, {b.T, kH, kNope});
  ap.q_pe = dev_tensor(qp, DType::kBF16, {b.T, kH, 64});
  ap.kv_b_proj = dev_tensor(wb, DType::kBF16, {kH * (kNope + kV), 512});
  ap.v_dim = kV;
  ap.q_out = dev_tensor(q_abs, DType::kBF16, {b.T, kH, 576});
  ASSERT_TRUE(mla_absorb_q(ap).ok());
  std::vector<uint16_t> latent;
  const CoreRun lat = run(b, plan, false, DenseForm::kAuto, q_nope, q_pe, w, &q_abs, &latent);
  ASSERT_TRUE(lat.status.ok()) << lat.status.to_string();
  DeviceBuffer lat_d(latent), ref_d(static_cast<size_t>(b.T * kH * kV * 4), 0xFF);
  MlaUpProjectParams up;
  up.latent = dev_tensor(lat_d, DType::kBF16, {b.T, kH, 512});
  up.kv_b_proj = ap.kv_b_proj;
  up.qk_nope = kNope;
  up.out = dev_tensor(ref_d, DType::kF32, {b.T, kH, kV});
  ASSERT_TRUE(mla_up_project(up).ok());
  ASSERT_TRUE(device_clean());
  const std::vector<float> ref = ref_d.download<float>();

  const CoreRun abs = run(b, plan, true, DenseForm::kAbsorbed, q_nope, q_pe, w, nullptr, nullptr);
  ASSERT_TRUE(abs.status.ok()) << abs.status.to_string();
  EXPECT_EQ(abs.report.mha_seqs, 0);
  EXPECT_EQ(std::memcmp(abs.out.data(), ref.data(), ref.size() * 4), 0) << "absorbed core mode != latent step + W_UV";
  EXPECT_EQ(std::memcmp(abs.lse.data(), lat.lse.data(), lat.lse.size() * 4), 0);
  EXPECT_EQ(abs.mla, lat.mla);
  EXPECT_LE(abs.report.workspace_high_water_bytes, plan.workspace_bytes);

  const CoreRun aut = run(b, plan, true, DenseForm::kAuto, q_nope, q_pe, w, nullptr, nullptr);
  ASSERT_TRUE(aut.status.ok()) << aut.status.to_string();
  EXPECT_EQ(aut.report.mha_seqs, 1);  // the fresh 20-token prompt (rows 150 .. 169)
  EXPECT_EQ(aut.report.mha_rows, 20);
  EXPECT_EQ(aut.mla, lat.mla);
  for (int64_t t = 0; t < b.T; ++t)
    for (int64_t h = 0; h < kH; ++h) {
      const size_t o0 = static_cast<size_t>((t * kH + h) * kV);
      const bool mha_row = t >= 150 && t < 170;
      double scale = 0;
      for (int64_t d = 0; d < kV; ++d) scale = std::max(scale, std::fabs(static_cast<double>(ref[o0 + d])));
      for (int64_t d = 0; d < kV; ++d) {
        const float got = aut.out[o0 + d], want = ref[o0 + d];
        if (!mha_row) {
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "absorbed row " << t << " head " << h << " dim " << d;
        } else {
          // Both bf16 paths: q_abs and P rounded to bf16 (absorbed), K/V and P to bf16 (MHA).
          ASSERT_LE(std::fabs(static_cast<double>(got) - want), std::ldexp(scale, -5) + 1e-6)
              << "MHA row " << t << " head " << h << " dim " << d;
        }
      }
      const size_t l = static_cast<size_t>(t * kH + h);
      if (mha_row) EXPECT_NEAR(aut.lse[l], lat.lse[l], 5e-2) << "MHA row " << t << " head " << h;
    }
}
