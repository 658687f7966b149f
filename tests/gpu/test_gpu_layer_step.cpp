// The layer step on CUDA: within the plan (high-water, attention scratch), chunked and tiled
// runs bit-identical to the one-chunk run on the device, cache bytes equal to the CPU step's,
// dense rows' identity selection exact, and the sparse selection and outputs near the CPU's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gpu_util.h"
#include "step_batch.h"

using namespace dsa;
using namespace dsa_gpu_test;

namespace {

using namespace step_batch;

struct Out {
  Status status;
  StepReport report;
  Plan plan;
  std::vector<float> out, lse;
  std::vector<int32_t> indices;
  std::vector<uint8_t> mla, idx;
};

PlannerConfig config(const Batch& b, int64_t budget, Device dev) {
  PlannerConfig c;
  c.geometry = tiny();
  c.page_size = kPage;
  c.max_tokens_per_step = b.T;
  c.max_seqs_per_step = b.B;
  c.max_context = b.max_kv;
  c.score_budget_bytes = budget;
  c.device = dev;
  return c;
}

Out run_cpu(const Batch& b) {
  Out o;
  Batch w = b;
  o.status = make_plan(config(b, kDefaultScoreBudgetBytes, cpu_device()), &o.plan);
  if (!o.status.ok()) return o;
  std::vector<uint8_t> ws(static_cast<size_t>(o.plan.workspace_bytes));
  o.out.resize(static_cast<size_t>(b.T * kH * 512));
  o.lse.resize(static_cast<size_t>(b.T * kH));
  o.indices.resize(static_cast<size_t>(b.T * kK));
  StepParams p;
  p.q_lens = make_tensor(w.q_lens.data(), DType::kI32, {b.B});
  p.kv_lens = make_tensor(w.kv_lens.data(), DType::kI32, {b.B});
  p.block_table = make_tensor(w.block_table.data(), DType::kI32, {b.B, b.max_blocks});
  p.kv_c = make_tensor(w.kv_c.data(), DType::kBF16, {b.T, 512});
  p.k_pe = make_tensor(w.k_pe.data(), DType::kBF16, {b.T, 64});
  p.q = make_tensor(w.q.data(), DType::kBF16, {b.T, kH, 576});
  p.index_q = make_tensor(w.iq.data(), DType::kF32, {b.T, kHi, 128});
  p.index_k = make_tensor(w.ik.data(), DType::kF32, {b.T, 128});
  p.index_w = make_tensor(w.iw.data(), DType::kF32, {b.T, kHi});
  p.cos_sin = make_tensor(w.cos_sin.data(), DType::kF32, {kMaxPos, 64});
  p.mla_cache.data = w.mla.data();
  p.mla_cache.num_blocks = b.num_blocks;
  p.mla_cache.page_size = kPage;
  p.index_cache.data = w.idx.data();
  p.index_cache.num_blocks = b.num_blocks;
  p.index_cache.page_size = kPage;
  p.indices_out = make_tensor(o.indices.data(), DType::kI32, {b.T, kK});
  p.out = make_tensor(o.out.data(), DType::kF32, {b.T, kH, 512});
  p.lse = make_tensor(o.lse.data(), DType::kF32, {b.T, kH});
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  Attention a(o.plan);
  o.status = a.step(p, &o.report);
  o.mla = w.mla;
  o.idx = w.idx;
  return o;
}

Out run_gpu(const Batch& b, int64_t budget) {
  Out o;
  const Device dev = cuda_device(0);
  o.status = make_plan(config(b, budget, dev), &o.plan);
  if (!o.status.ok()) return o;
  DeviceBuffer ws(static_cast<size_t>(o.plan.workspace_bytes), 0x7F);
  DeviceBuffer bt(b.block_table), kv_c(b.kv_c), k_pe(b.k_pe), q(b.q), iq(b.iq), ik(b.ik), iw(b.iw), cs(b.cos_sin),
      mla(b.mla), idx(b.idx);
  DeviceBuffer out(static_cast<size_t>(b.T * kH * 512 * 4), 0xFF), lse(static_cast<size_t>(b.T * kH * 4), 0xFF),
      ind(static_cast<size_t>(b.T * kK * 4), 0x5A);
  std::vector<int32_t> ql = b.q_lens, kl = b.kv_lens;
  StepParams p;
  p.q_lens = make_tensor(ql.data(), DType::kI32, {b.B});  // host, by contract
  p.kv_lens = make_tensor(kl.data(), DType::kI32, {b.B});
  p.block_table = dev_tensor(bt, DType::kI32, {b.B, b.max_blocks});
  p.kv_c = dev_tensor(kv_c, DType::kBF16, {b.T, 512});
  p.k_pe = dev_tensor(k_pe, DType::kBF16, {b.T, 64});
  p.q = dev_tensor(q, DType::kBF16, {b.T, kH, 576});
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
  p.indices_out = dev_tensor(ind, DType::kI32, {b.T, kK});
  p.out = dev_tensor(out, DType::kF32, {b.T, kH, 512});
  p.lse = dev_tensor(lse, DType::kF32, {b.T, kH});
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  Attention a(o.plan);
  o.status = a.step(p, &o.report);
  EXPECT_TRUE(device_clean());
  o.out = out.download<float>();
  o.lse = lse.download<float>();
  o.indices = ind.download<int32_t>();
  o.mla = mla.download<uint8_t>();
  o.idx = idx.download<uint8_t>();
  return o;
}

// Float64 attention of one (row, head) over keys given as positions of sequence s, read back
// from an MLA cache (the CPU and GPU steps write the same bytes). Besides the output it gives,
// per dim, the magnitude Σ_j w_j |v_j| that bounds the rounding of the probabilities: the CUDA
// kernels multiply bf16 probabilities into V (FlashMLA-style), an error of up to 2^-9 of that
// magnitude, not of |out| (outputs that nearly cancel would otherwise look wrong).
struct RowRef {
  std::vector<double> out, scale;
  double lse = 0.0, score_err = 0.0;
};

RowRef row_reference(const Batch& b, const std::vector<uint8_t>& mla, int64_t s, int64_t row, int64_t h,
                     const std::vector<int32_t>& positions) {
  const int64_t n = static_cast<int64_t>(positions.size());
  std::vector<double> kv(static_cast<size_t>(n * 576)), sc(static_cast<size_t>(n));
  double m = -INFINITY, mag = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t pos = positions[static_cast<size_t>(j)];
    const int64_t slot = int64_t{b.block_table[s * b.max_blocks + pos / kPage]} * kPage + pos % kPage;
    uint16_t tok[576];
    std::memcpy(tok, mla.data() + slot * kMlaBf16TokenBytes, sizeof(tok));
    double dot = 0.0, abs_dot = 0.0;
    for (int64_t d = 0; d < 576; ++d) {
      const double k = bf16_to_float(tok[d]), q = bf16_to_float(b.q[(row * kH + h) * 576 + d]);
      kv[static_cast<size_t>(j * 576 + d)] = k;
      dot += q * k;
      abs_dot += std::fabs(q * k);
    }
    sc[static_cast<size_t>(j)] = tiny().sm_scale * dot;
    m = std::max(m, sc[static_cast<size_t>(j)]);
    mag = std::max(mag, tiny().sm_scale * abs_dot);
  }
  RowRef r;
  r.out.assign(512, 0.0);
  r.scale.assign(512, 0.0);
  r.score_err = 64 * std::ldexp(1.0, -23) * mag;  // 576-term f32 dot products, with room
  double l = 0.0;
  for (double& v : sc) l += (v = std::exp(v - m));
  r.lse = m + std::log(l);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < 512; ++d) {
      const double w = sc[static_cast<size_t>(j)] / l, v = kv[static_cast<size_t>(j * 576 + d)];
      r.out[static_cast<size_t>(d)] += w * v;
      r.scale[static_cast<size_t>(d)] += w * std::fabs(v);
    }
  return r;
}

// |got - ref| in bf16 steps of max(|ref|, scale), after the share that score rounding explains.
double out_steps(double got, double ref, double scale, double score_err) {
  if (std::isnan(got)) return INFINITY;
  const double mag = std::max(std::fabs(ref), scale);
  if (mag == 0.0) return got == 0.0 ? 0.0 : INFINITY;
  const double err = std::max(0.0, std::fabs(got - ref) - 2.0 * score_err * scale);
  return err / std::ldexp(1.0, std::ilogb(mag) - 7);
}

}  // namespace

TEST(GpuLayerStep, WithinPlanTiledEqualsWholeAndNearTheCpu) {
  DSA_REQUIRE_GPU();
  // dense prefill, sparse prefill from 0, chunk over a prefix, decodes (next_n 1, 3), long rows
  const Batch b = make_batch({{40, 40}, {150, 150}, {20, 600}, {1, 90}, {3, 1500}, {2, 2000}}, 1);
  Out cpu = run_cpu(b);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status.to_string();
  Out whole = run_gpu(b, kDefaultScoreBudgetBytes);
  ASSERT_TRUE(whole.status.ok()) << whole.status.to_string();
  EXPECT_EQ(whole.report.tiled_rows, 0);
  EXPECT_LE(whole.report.workspace_high_water_bytes, whole.plan.workspace_bytes);
  const int64_t min_budget = whole.plan.min_score_budget_bytes;
  for (int64_t budget : {int64_t{30000}, min_budget}) {
    Out t = run_gpu(b, budget);
    ASSERT_TRUE(t.status.ok()) << budget << ": " << t.status.to_string();
    EXPECT_LE(t.report.score_high_water_bytes, budget);
    EXPECT_LE(t.report.workspace_high_water_bytes, t.plan.workspace_bytes);
    EXPECT_TRUE(same_bits(t.indices, whole.indices, "indices, chunked vs whole"));
    EXPECT_TRUE(same_bits(t.out, whole.out, "out, chunked vs whole"));
    EXPECT_TRUE(same_bits(t.lse, whole.lse, "lse, chunked vs whole"));
    if (budget == min_budget) {
      EXPECT_GT(t.report.tiled_rows, 0);
    }
  }
  // Caches: the same bytes as the CPU step (exact conversions), poison kept elsewhere.
  EXPECT_TRUE(same_bits(whole.mla, cpu.mla, "MLA cache"));
  EXPECT_TRUE(same_bits(whole.idx, cpu.idx, "indexer cache"));
  EXPECT_EQ(whole.report.seqs[static_cast<int>(Route::kDense)], 1);  // only kv_len 40 <= topk 64
  // Rows: the dense ones have the exact identity; sparse selections overlap the CPU's up to
  // near-ties of the FP8 accumulation order; outputs agree where the selections do.
  int64_t row = 0, differing = 0, sparse_rows = 0;
  for (int64_t s = 0; s < b.B; ++s) {
    for (int32_t i = 0; i < b.q_lens[s]; ++i, ++row) {
      const int32_t* g = whole.indices.data() + row * kK;
      const int32_t* c = cpu.indices.data() + row * kK;
      const bool same = std::equal(g, g + kK, c);
      if (b.kv_lens[s] <= kK) {
        ASSERT_TRUE(same) << "dense row " << row;
      } else {
        ++sparse_rows;
        differing += !same;
        int64_t common = 0;
        for (int64_t x = 0; x < kK; ++x) common += std::count(c, c + kK, g[x]) > 0;
        EXPECT_GE(common, kK - 4) << "row " << row;
      }
      if (!same) continue;
      // Outputs against a float64 reference over the selected keys (both backends) and against
      // each other, in bf16 steps of the magnitude Σ w|v| (see row_reference).
      std::vector<int32_t> keys;
      for (int64_t x = 0; x < kK; ++x)
        if (c[x] >= 0) keys.push_back(c[x]);
      for (int64_t h = 0; h < kH; ++h) {
        const RowRef r = row_reference(b, cpu.mla, s, row, h, keys);
        const float gl = whole.lse[row * kH + h];
        ASSERT_LE(std::fabs(gl - r.lse), r.score_err + 64 * std::ldexp(1.0, -23) * std::fabs(r.lse) + 1e-6)
            << "row " << row << " head " << h << " lse " << gl << " vs " << r.lse;
        for (int64_t d = 0; d < 512; ++d) {
          const size_t e = static_cast<size_t>((row * kH + h) * 512 + d);
          const double gv = whole.out[e], cv = cpu.out[e], rv = r.out[static_cast<size_t>(d)];
          const double scale = r.scale[static_cast<size_t>(d)];
          ASSERT_LE(out_steps(gv, rv, scale, r.score_err), 2.0)
              << "row " << row << " head " << h << " dim " << d << ": gpu " << gv << " vs reference " << rv;
          ASSERT_LE(out_steps(cv, rv, scale, r.score_err), 2.0)
              << "row " << row << " head " << h << " dim " << d << ": cpu " << cv << " vs reference " << rv;
          ASSERT_LE(out_steps(gv, cv, scale, 2 * r.score_err), 3.0)
              << "row " << row << " head " << h << " dim " << d << ": gpu " << gv << " vs cpu " << cv;
        }
      }
    }
  }
  EXPECT_LE(differing * 10, sparse_rows) << "selections differ from the CPU in more than 10% of rows";
}
