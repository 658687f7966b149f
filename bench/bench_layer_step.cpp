// CPU benchmarks of the planner and of one layer step at GLM-5 geometry (H = 64, H_idx = 32,
// topk = 2048): plan cost, the dense route against forced scoring for a short prefill, and
// decode under the default budget against a budget that forces key-axis tiling.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dsa/dsa.h"

namespace {

// Args: 0 glm-5 (202,752 positions), 1 glm-5.2 (1M positions).
void BM_MakePlan(benchmark::State& state) {
  dsa::PlannerConfig c;
  dsa::geometry_preset(state.range(0) ? "glm-5.2" : "glm-5", &c.geometry);
  c.device_memory_bytes = int64_t{141} << 30;
  for (auto _ : state) {
    dsa::Plan p;
    dsa::Status st = dsa::make_plan(c, &p);
    benchmark::DoNotOptimize(p.workspace_bytes);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  }
}
BENCHMARK(BM_MakePlan)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

struct Setup {
  dsa::ModelGeometry g;
  int64_t B, T, max_blocks, num_blocks, page = 64;
  std::vector<int32_t> q_lens, kv_lens, block_table;
  std::vector<uint16_t> mla;
  std::vector<uint8_t> idx;
  std::vector<float> cos_sin, kv_c, k_pe, q, iq, ik, iw, out, lse;

  Setup(int64_t seqs, int32_t q_len, int32_t kv_len) : B(seqs) {
    dsa::geometry_preset("glm-5", &g);
    std::mt19937_64 gen(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto rnd = [&](size_t n, float sd) {
      std::vector<float> v(n);
      for (auto& x : v) x = sd * nd(gen);
      return v;
    };
    T = seqs * q_len;
    max_blocks = (kv_len + page - 1) / page;
    num_blocks = seqs * max_blocks;
    for (int64_t b = 0; b < B; ++b) {
      q_lens.push_back(q_len);
      kv_lens.push_back(kv_len);
      for (int64_t j = 0; j < max_blocks; ++j) block_table.push_back(static_cast<int32_t>(b * max_blocks + j));
    }
    mla.resize(static_cast<size_t>(num_blocks * page * 576));
    for (auto& v : mla) v = dsa::float_to_bf16(0.5f * nd(gen));
    idx.resize(static_cast<size_t>(num_blocks * page * dsa::kIndexerTokenBytes));
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
      uint8_t* p = idx.data() + blk * page * dsa::kIndexerTokenBytes;
      for (int64_t i = 0; i < page * 128; ++i) p[i] = static_cast<uint8_t>(gen() % 0x7e);  // no NaN codes
      const float s = 1.0f / 64;
      for (int64_t i = 0; i < page; ++i) std::memcpy(p + page * 128 + i * 4, &s, 4);
    }
    cos_sin.assign(static_cast<size_t>(kv_len) * 64, 0.5f);
    kv_c = rnd(static_cast<size_t>(T * 512), 1.f);
    k_pe = rnd(static_cast<size_t>(T * 64), 1.f);
    q = rnd(static_cast<size_t>(T * g.num_heads * 576), 0.05f);
    iq = rnd(static_cast<size_t>(T * g.index_heads * 128), 1.f);
    ik = rnd(static_cast<size_t>(T * 128), 1.f);
    iw = rnd(static_cast<size_t>(T * g.index_heads), 1.f);
    out.resize(static_cast<size_t>(T * g.num_heads * 512));
    lse.resize(static_cast<size_t>(T * g.num_heads));
  }

  dsa::StepParams params(void* ws, size_t ws_bytes, bool force) {
    using dsa::DType;
    dsa::StepParams p;
    p.q_lens = dsa::make_tensor(q_lens.data(), DType::kI32, {B});
    p.kv_lens = dsa::make_tensor(kv_lens.data(), DType::kI32, {B});
    p.block_table = dsa::make_tensor(block_table.data(), DType::kI32, {B, max_blocks});
    p.kv_c = dsa::make_tensor(kv_c.data(), DType::kF32, {T, 512});
    p.k_pe = dsa::make_tensor(k_pe.data(), DType::kF32, {T, 64});
    p.q = dsa::make_tensor(q.data(), DType::kF32, {T, g.num_heads, 576});
    p.index_q = dsa::make_tensor(iq.data(), DType::kF32, {T, g.index_heads, 128});
    p.index_k = dsa::make_tensor(ik.data(), DType::kF32, {T, 128});
    p.index_w = dsa::make_tensor(iw.data(), DType::kF32, {T, g.index_heads});
    p.cos_sin = dsa::make_tensor(cos_sin.data(), DType::kF32, {static_cast<int64_t>(cos_sin.size() / 64), 64});
    p.mla_cache.data = mla.data();
    p.mla_cache.num_blocks = num_blocks;
    p.mla_cache.page_size = page;
    p.index_cache.data = idx.data();
    p.index_cache.num_blocks = num_blocks;
    p.index_cache.page_size = page;
    p.force_score = force;
    p.out = dsa::make_tensor(out.data(), DType::kF32, {T, g.num_heads, 512});
    p.lse = dsa::make_tensor(lse.data(), DType::kF32, {T, g.num_heads});
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    return p;
  }
};

void run_step(benchmark::State& state, Setup& s, int64_t budget, bool force) {
  dsa::PlannerConfig c;
  c.geometry = s.g;
  c.max_tokens_per_step = s.T;
  c.max_seqs_per_step = s.B;
  c.max_context = s.kv_lens[0];
  c.score_budget_bytes = budget;
  dsa::Plan plan;
  dsa::Status st = dsa::make_plan(c, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  std::vector<uint8_t> ws(static_cast<size_t>(plan.workspace_bytes));
  dsa::Attention attn(plan);
  dsa::StepParams p = s.params(ws.data(), ws.size(), force);
  dsa::StepReport rep;
  for (auto _ : state) {
    st = attn.step(p, &rep);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      return;
    }
  }
  state.counters["chunks"] = static_cast<double>(rep.score_chunks);
  state.counters["tiled_rows"] = static_cast<double>(rep.tiled_rows);
  state.counters["high_water_KiB"] = static_cast<double>(rep.workspace_high_water_bytes) / 1024;
  state.counters["score_ms"] = rep.ms_score;
  state.counters["attend_ms"] = rep.ms_sparse + rep.ms_dense;
}

// A short prefill (1 x 1024 tokens <= topk): Arg 0 dense route, 1 forced scoring.
void BM_ShortPrefill(benchmark::State& state) {
  Setup s(1, 1024, 1024);
  run_step(state, s, dsa::kDefaultScoreBudgetBytes, state.range(0) != 0);
}
BENCHMARK(BM_ShortPrefill)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Decode, 2 sequences x 65536 keys, next_n = 1: Arg = score budget in KiB (512 MiB whole rows;
// 128 KiB: a row of scores exceeds the budget, so rows are tiled along the keys).
void BM_Decode(benchmark::State& state) {
  Setup s(2, 1, 65536);
  run_step(state, s, state.range(0) * 1024, false);
}
BENCHMARK(BM_Decode)->Arg(512 * 1024)->Arg(128)->Unit(benchmark::kMillisecond);

}  // namespace
