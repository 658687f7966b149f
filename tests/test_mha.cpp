// Dense attention in MHA form (SPEC §5b) on the CPU: against the float64 oracle, against the
// absorbed form on the same inputs, sequence groups, bad arguments, the planner's sizing and
// the cost model's routing table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/dsa.h"
#include "mha_batch.h"

namespace {

using namespace mha_test;

Status run(Batch& b, size_t ws_bytes = 0, DenseMhaPrefillParams* used = nullptr) {
  DenseMhaPrefillParams p = b.params();
  const MhaWorkspaceSize need = dense_mha_prefill_workspace_size(p);
  EXPECT_GT(need.min_bytes, 0u);
  EXPECT_GE(need.batch_bytes, need.min_bytes);
  static std::vector<uint8_t> ws;
  const size_t n = ws_bytes ? ws_bytes : need.batch_bytes;
  ws.assign(n + 64, 0xFF);  // NaN everywhere: nothing may read workspace it did not write
  p.workspace = ws.data() + 3;  // unaligned on purpose
  p.workspace_bytes = n;
  if (used) *used = p;
  return dense_mha_prefill(p);
}

// Varlen with prefix offsets, a sequence without new tokens, page edges, 16-row block edges.
const std::vector<Seq> kVarlen = {{5, 5}, {17, 40}, {1, 1}, {0, 3}, {33, 97}, {16, 16}};

struct Geo {
  int64_t nope, v;
};
const Geo kGeos[] = {{128, 128}, {192, 256}};

TEST(MhaPrefill, AgainstOracleBothGeometriesAndCaches) {
  uint64_t seed = 1;
  for (const Geo& g : kGeos) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE("qk_nope " + std::to_string(g.nope) + " v " + std::to_string(g.v) + " fp8 " + std::to_string(fp8));
      Batch b(seed++, kVarlen, 3, g.nope, g.v, fp8, 16);
      DSA_ASSERT_OK(run(b));
      // The op's function: K/V rounded to bf16 after an f32 GEMM. A K/V element whose f32 sum
      // lands next to a bf16 rounding boundary may round the other way (one bf16 step of that
      // element, <= 2^-8 of its size), moving a score by <= 2^-8 of its |q_d k_d| term: hence
      // 2^-8 of Σp|v| for out and 2^-10 of the row's Σ|q·k| for lse; the output's own
      // rounding is the 1 step.
      expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "vs oracle (bf16 K/V)");
      // Rerun: bit-identical.
      const auto first = b.bytes();
      b.poison();
      DSA_ASSERT_OK(run(b));
      EXPECT_EQ(first, b.bytes()) << "rerun differs";
    }
  }
}

TEST(MhaPrefill, QueryAndOutputDtypesAndSink) {
  for (bool q_f32 : {false, true}) {
    for (bool out_f32 : {false, true}) {
      SCOPED_TRACE("q_f32 " + std::to_string(q_f32) + " out_f32 " + std::to_string(out_f32));
      Batch b(11 + q_f32 * 2 + out_f32, {{7, 20}, {64, 64}, {3, 70}}, 2, 128, 128, false, 64, q_f32, out_f32, true);
      DSA_ASSERT_OK(run(b));
      expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "vs oracle");
    }
  }
}

// The same function as the absorbed form: dense_mla on q_abs = [W_UK[h]ᵀ q_nope | q_pe], then
// out = W_UV[h] · out_latent (both in float64 here). Rounding differs in one place: the MHA
// form rounds the decompressed K_nope and V to bf16 (relative error <= 2^-9 per element),
// which the absorbed form never forms. So outputs agree to ~2^-8 of Σp|v| plus a few steps,
// and lse to the scores' shift, ~2^-8 of Σ|q_nope·k_nope| per row.
TEST(MhaPrefill, EqualsAbsorbedForm) {
  uint64_t seed = 40;
  for (const Geo& g : kGeos) {
    SCOPED_TRACE("qk_nope " + std::to_string(g.nope));
    Batch b(seed++, {{9, 9}, {20, 45}, {1, 30}}, 2, g.nope, g.v, false, 16, false, true);
    DSA_ASSERT_OK(run(b));
    const int64_t T = b.T, H = b.H, nv = g.nope + g.v;
    // q_abs in f32 (the absorbed op takes f32 on the CPU), computed in f64.
    std::vector<float> q_abs(static_cast<size_t>(T * H * 576));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* dst = &q_abs[static_cast<size_t>((t * H + h) * 576)];
        for (int64_t c = 0; c < 512; ++c) {
          double s = 0.0;
          for (int64_t d = 0; d < g.nope; ++d)
            s += b.w[static_cast<size_t>((h * nv + d) * 512 + c)] * b.qn[static_cast<size_t>((t * H + h) * g.nope + d)];
          dst[c] = static_cast<float>(s);
        }
        for (int64_t d = 0; d < 64; ++d) dst[512 + d] = static_cast<float>(b.qp[static_cast<size_t>((t * H + h) * 64 + d)]);
      }
    std::vector<float> lat(static_cast<size_t>(T * H * 512)), lse(static_cast<size_t>(T * H));
    DenseMlaParams d;
    d.q = dsa_test::t_f32(q_abs.data(), {T, H, 576});
    d.kv.paged = b.cache_desc();
    d.cu_seqlens_q = dsa_test::t_i32(b.cu_q.data(), {b.B + 1});
    d.block_table = dsa_test::t_i32(b.table.data(), {b.B, b.max_blocks});
    d.kv_lens = dsa_test::t_i32(b.kv_lens.data(), {b.B});
    d.sm_scale = kScale;
    d.out = dsa_test::t_f32(lat.data(), {T, H, 512});
    d.lse = dsa_test::t_f32(lse.data(), {T, H});
    DSA_ASSERT_OK(dense_mla(d));
    oracle::MhaResult abs;
    abs.out.resize(static_cast<size_t>(T * H * g.v));
    abs.out_scale.resize(abs.out.size());
    abs.lse.assign(lse.begin(), lse.end());
    const oracle::MhaResult exact = b.oracle_result(false);  // for the conditioning only
    abs.score_scale = exact.score_scale;
    for (int64_t r = 0; r < T * H; ++r) {
      const int64_t h = r % H;
      for (int64_t e = 0; e < g.v; ++e) {
        double s = 0.0;
        for (int64_t c = 0; c < 512; ++c)
          s += b.w[static_cast<size_t>((h * nv + g.nope + e) * 512 + c)] * lat[static_cast<size_t>(r * 512 + c)];
        abs.out[static_cast<size_t>(r * g.v + e)] = s;
        abs.out_scale[static_cast<size_t>(r * g.v + e)] = exact.out_scale[static_cast<size_t>(r * g.v + e)];
      }
    }
    // And the exact (unrounded K/V) oracle agrees with the absorbed form tightly: the same function.
    expect_close(b, abs, 4.0, std::ldexp(1.0, -6), std::ldexp(1.0, -8), "MHA vs absorbed");
    int64_t far = 0;
    for (size_t i = 0; i < abs.out.size(); ++i)
      far += std::fabs(abs.out[i] - exact.out[i]) > 1e-5 * (exact.out_scale[i] + 1e-3);
    EXPECT_EQ(far, 0) << "absorbed form (f32) vs exact MHA oracle";
  }
}

TEST(MhaPrefill, SequenceGroupsGiveIdenticalResults) {
  const std::vector<Seq> seqs = {{30, 30}, {8, 50}, {1, 1}, {40, 41}, {2, 9}, {25, 25}};
  Batch b(77, seqs, 2, 192, 256, true, 16);
  DenseMhaPrefillParams p;
  DSA_ASSERT_OK(run(b, 0, &p));
  const auto whole = b.bytes();
  const MhaWorkspaceSize need = dense_mha_prefill_workspace_size(b.params());
  EXPECT_EQ(need.min_bytes, static_cast<size_t>(mha_prefill_workspace_bytes(cpu_device(), 2, 192, 256, 50)));
  EXPECT_EQ(need.batch_bytes, static_cast<size_t>(mha_prefill_workspace_bytes(cpu_device(), 2, 192, 256, 156)));
  for (size_t ws : {need.min_bytes, need.min_bytes + 40 * 2 * 448 * 2 + 4096, (need.min_bytes + need.batch_bytes) / 2}) {
    b.poison();
    DSA_ASSERT_OK(run(b, ws));
    EXPECT_EQ(whole, b.bytes()) << "groups of a " << ws << "-byte workspace differ from one group";
  }
  b.poison();
  Status st = run(b, need.min_bytes - 1);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_TRUE(dsa_test::fails_naming(st, {"dense_mha_prefill", "workspace"}));
}

// Both decompression paths (the BLAS found at build time, if any, and our own loop) compute
// the op's function.
TEST(MhaPrefill, OwnGemmLoopAgainstOracle) {
  cpu::set_mha_blas(false);
  EXPECT_FALSE(cpu::mha_uses_blas());
  Batch b(21, kVarlen, 2, 192, 256, false, 16);
  const Status st = run(b);
  cpu::set_mha_blas(true);
  DSA_ASSERT_OK(st);
  expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "own GEMM loop vs oracle");
}

TEST(MhaPrefill, ThreadCountDoesNotChangeBits) {
  Batch b(5, {{20, 33}, {50, 50}}, 3, 128, 128, false, 16);
  const int before = cpu::pool_threads();
  cpu::set_pool_threads(1);
  DSA_ASSERT_OK(run(b));
  const auto one = b.bytes();
  cpu::set_pool_threads(3);
  b.poison();
  DSA_ASSERT_OK(run(b));
  cpu::set_pool_threads(before);
  EXPECT_EQ(one, b.bytes());
}

TEST(MhaPrefill, EmptyShapes) {
  Batch b(6, {{0, 4}, {0, 0}}, 2, 128, 128, false, 16);
  DSA_ASSERT_OK(run(b));
  EXPECT_TRUE(b.out.intact());
}

TEST(MhaPrefill, RejectsBadArguments) {
  Batch b(8, {{4, 10}}, 2, 128, 128, false, 16);
  std::vector<uint16_t> ws(1 << 24);
  auto with_ws = [&](DenseMhaPrefillParams p) {
    p.workspace = ws.data();
    p.workspace_bytes = ws.size() * 2;
    return dense_mha_prefill(p);
  };
  {
    DenseMhaPrefillParams p = b.params();
    p.kv_b_proj = dsa_test::t_bf16(b.w_bf.data(), {2 * 256 - 1, 512});
    Status st = with_ws(p);
    EXPECT_TRUE(dsa_test::fails_naming(st, {"kv_b_proj", "[H * (qk_nope + v), 512]", "512", "[511, 512]"})) << st.to_string();
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.kv_b_proj = dsa_test::t_bf16(b.w_bf.data(), {512, 256});
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"kv_b_proj", "expected shape"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    std::vector<float> wf(b.w.begin(), b.w.end());
    p.kv_b_proj = dsa_test::t_f32(wf.data(), {2 * 256, 512});
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"kv_b_proj", "bf16", "f32"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.kv_b_proj = TensorDesc{};
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"kv_b_proj", "required"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.kv_b_proj.stride[1] = 2;
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"kv_b_proj"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.q_pe = dsa_test::t_bf16(b.qp_bf.data(), {b.T, b.H, 32});
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"q_pe", "64"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.q_pe = dsa_test::t_f32(b.qp_f.data(), {b.T, b.H, 64});
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"q_pe", "bf16"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    b.kv_lens[0] = 3;  // q_len 4 > kv_len 3
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"kv_lens", "q_len <= kv_len"}));
    b.kv_lens[0] = 10;
  }
  {
    DenseMhaPrefillParams p = b.params();
    b.table[0] = static_cast<int32_t>(b.num_blocks);
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"block_table"}));
    b.table[0] = 0;
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.sm_scale = 0.f;
    EXPECT_TRUE(dsa_test::fails_naming(with_ws(p), {"sm_scale"}));
  }
  {
    DenseMhaPrefillParams p = b.params();
    p.workspace = nullptr;
    EXPECT_TRUE(dsa_test::fails_naming(dense_mha_prefill(p), {"workspace", "none"}));
  }
  EXPECT_EQ(dense_mha_prefill_workspace_size(DenseMhaPrefillParams{}).min_bytes, 0u);
}

TEST(MhaPrefill, PlannerReservation) {
  for (const char* name : {"deepseek-v3.2", "glm-5"}) {
    SCOPED_TRACE(name);
    PlannerConfig c;
    ASSERT_TRUE(geometry_preset(name, &c.geometry).ok());
    c.max_tokens_per_step = 8192;
    c.max_seqs_per_step = 64;
    c.max_context = 65536;
    const ModelGeometry& g = c.geometry;
    const int64_t per_token = g.num_heads * (g.qk_nope_head_dim + g.v_head_dim) * 2 + 576 * 4;
    MhaPrefillReservation r;
    DSA_ASSERT_OK(plan_mha_prefill(c, int64_t{1} << 40, &r));
    EXPECT_EQ(r.max_seq_context, 2048);
    EXPECT_EQ(r.batch_tokens, 64 * 2048);
    EXPECT_EQ(r.group_tokens, r.batch_tokens);
    EXPECT_EQ(r.bytes, r.batch_bytes);
    EXPECT_EQ(r.bytes, mha_prefill_workspace_bytes(c.device, g.num_heads, g.qk_nope_head_dim, g.v_head_dim, r.batch_tokens));
    EXPECT_GE(r.bytes, r.batch_tokens * per_token);
    // A 2 GiB budget: the largest group that fits, at least one sequence.
    DSA_ASSERT_OK(plan_mha_prefill(c, int64_t{2} << 30, &r));
    EXPECT_LE(r.bytes, int64_t{2} << 30);
    EXPECT_GT(mha_prefill_workspace_bytes(c.device, g.num_heads, g.qk_nope_head_dim, g.v_head_dim, r.group_tokens + 1),
              int64_t{2} << 30);
    EXPECT_GE(r.group_tokens, 2048);
    // No budget: one sequence of the longest dense context.
    DSA_ASSERT_OK(plan_mha_prefill(c, 0, &r));
    EXPECT_EQ(r.group_tokens, 2048);
    EXPECT_EQ(r.bytes, r.min_bytes);
    // Short contexts bound the sequence.
    c.max_context = 100;
    DSA_ASSERT_OK(plan_mha_prefill(c, 0, &r));
    EXPECT_EQ(r.max_seq_context, 100);
  }
  PlannerConfig bad;
  MhaPrefillReservation r;
  EXPECT_TRUE(dsa_test::fails_naming(plan_mha_prefill(bad, 0, &r), {"qk_nope_head_dim"}));
}

// Many short prefills under a small reservation: processed in groups, same bits as one group.
TEST(MhaPrefill, ManyShortPrefillsWithinThePlannedBytes) {
  std::vector<Seq> seqs;
  for (int i = 0; i < 24; ++i) seqs.push_back({static_cast<int32_t>(1 + i % 5), static_cast<int32_t>(3 + (i * 7) % 20)});
  Batch b(99, seqs, 2, 128, 128, false, 16);
  DSA_ASSERT_OK(run(b));
  const auto whole = b.bytes();
  PlannerConfig c;
  c.geometry.num_heads = 2;
  c.geometry.qk_nope_head_dim = 128;
  c.geometry.v_head_dim = 128;
  c.geometry.topk = 22;  // the batch's longest context
  c.max_context = 1000;
  c.max_tokens_per_step = 100;
  c.max_seqs_per_step = 24;
  MhaPrefillReservation r;
  DSA_ASSERT_OK(plan_mha_prefill(c, mha_prefill_workspace_bytes(cpu_device(), 2, 128, 128, 60), &r));
  EXPECT_EQ(r.group_tokens, 60);
  b.poison();
  DSA_ASSERT_OK(run(b, static_cast<size_t>(r.bytes)));
  EXPECT_EQ(whole, b.bytes());
}

// The cost model's routing table (docs/mha.md): fresh prompts go MHA, decodes and short
// chunks over long prefixes stay absorbed; the crossover of a chunk over a long prefix is
// about q_len = 2·512·(qk_nope + v) / (2·(1088 - (qk_nope + 64 + v))): 171 (V3.2), 398 (GLM-5).
TEST(MhaRouting, Table) {
  struct Row {
    int64_t q, kv, H, nope, v;
    bool mha;
  };
  const Row rows[] = {
      {2048, 2048, 128, 128, 128, true},   {2048, 2048, 64, 192, 256, true},  // a 2048-token prompt
      {2, 2048, 128, 128, 128, false},     {2, 2048, 64, 192, 256, false},    // decode, next_n 2
      {1, 4096, 128, 128, 128, false},     {1, 1, 128, 128, 128, true},       // decode; 1-token prompt
      {512, 2048, 128, 128, 128, true},    {64, 2048, 128, 128, 128, false},  // chunks over a prefix
      {150, 65536, 128, 128, 128, false},  {200, 65536, 128, 128, 128, true}, // V3.2 crossover ~171
      {380, 65536, 64, 192, 256, false},   {420, 65536, 64, 192, 256, true},  // GLM-5 crossover ~398
  };
  for (const Row& r : rows) {
    EXPECT_EQ(prefer_mha_form(r.q, r.kv, r.H, r.nope, r.v), r.mha)
        << "q_len " << r.q << " kv_len " << r.kv << " H " << r.H << " qk_nope " << r.nope;
  }
  const MhaCost c = mha_form_cost(2048, 2048, 128, 128, 128);
  // Decompression 2·512·128·256·2048 + pairs (2048·2049/2)·2·128·320, against pairs·2·128·1088
  // plus absorbing q and up-projecting out (2·512·128·256 per query).
  const double pairs = 2048.0 * 2049 / 2;
  EXPECT_DOUBLE_EQ(c.mha_flops, 2.0 * 512 * 128 * 256 * 2048 + pairs * 2 * 128 * 320);
  EXPECT_DOUBLE_EQ(c.absorbed_flops, 2.0 * 512 * 128 * 256 * 2048 + pairs * 2 * 128 * 1088);
  EXPECT_FALSE(prefer_mha_form(0, 10, 128, 128, 128));
}

}  // namespace
