// CPU benchmarks: indexer logits (FLOP/s), fused vs unfused score-and-select, top-k and
// map_indices (bytes/s), and a rough FP32 FMA peak of this machine for comparison.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu/parallel.h"
#include "dsa/dsa.h"

using namespace dsa;

namespace {

std::vector<uint8_t> random_e4m3(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 64.f);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = float_to_e4m3(std::max(-448.f, std::min(448.f, nd(g))));
  return v;
}

std::vector<float> random_f32(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

// Runs the benchmark body on `threads` pool threads (0: all), restoring the pool afterwards.
struct PoolThreads {
  int saved;
  explicit PoolThreads(int64_t threads) : saved(cpu::pool_threads()) {
    if (threads > 0) cpu::set_pool_threads(static_cast<int>(threads));
  }
  ~PoolThreads() { cpu::set_pool_threads(saved); }
};

// M rows (one long prefill chunk at the end of an N-token sequence) x N keys, H heads;
// range(3): pool threads (0: all).
void BM_IndexerLogits(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), H = state.range(2), D = 128;
  PoolThreads pool(state.range(3));
  auto q = random_e4m3(M * H * D, 1), k = random_e4m3(N * D, 2);
  auto w = random_f32(M * H, 3), ks = random_f32(N, 4, 1e-3f, 2e-3f);
  std::vector<int32_t> rs(M, 0), re(M, static_cast<int32_t>(N));  // every row sees all N keys
  std::vector<float> out(M * N);
  IndexerLogitsParams p;
  p.q = make_tensor(q.data(), DType::kE4M3, {M, H, D});
  p.weights = make_tensor(w.data(), DType::kF32, {M, H});
  p.k = make_tensor(k.data(), DType::kE4M3, {N, D});
  p.k_scale = make_tensor(ks.data(), DType::kF32, {N});
  p.ks = make_tensor(rs.data(), DType::kI32, {M});
  p.ke = make_tensor(re.data(), DType::kI32, {M});
  p.logits = make_tensor(out.data(), DType::kF32, {M, N});
  for (auto _ : state) {
    Status st = indexer_logits(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * M * N * H * D, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_IndexerLogits)->Args({256, 8192, 32, 0})->Args({256, 8192, 64, 0})->Args({256, 8192, 64, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// Decode: B sequences x next_n rows against a paged cache of kv tokens each.
void BM_IndexerLogitsPagedDecode(benchmark::State& state) {
  const int64_t B = state.range(0), kv = state.range(1), next_n = state.range(2), H = 64, D = 128, page = 64;
  const int64_t R = B * next_n, blocks_per_seq = (kv + page - 1) / page, nb = B * blocks_per_seq;
  auto q = random_e4m3(R * H * D, 1);
  auto w = random_f32(R * H, 3);
  std::vector<uint8_t> cache(nb * page * kIndexerTokenBytes + 16);
  auto kbytes = random_e4m3(cache.size(), 5);
  std::memcpy(cache.data(), kbytes.data(), cache.size());
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < page; ++t) {
      const float s = 1e-3f;
      std::memcpy(cache.data() + b * page * kIndexerTokenBytes + page * D + t * 4, &s, 4);
    }
  std::vector<int32_t> bt(nb), lens(B, static_cast<int32_t>(kv));
  for (int64_t i = 0; i < nb; ++i) bt[i] = static_cast<int32_t>(i);
  std::vector<float> out(R * kv);
  IndexerLogitsPagedParams p;
  p.q = make_tensor(q.data(), DType::kE4M3, {R, H, D});
  p.weights = make_tensor(w.data(), DType::kF32, {R, H});
  p.cache.data = cache.data();
  p.cache.num_blocks = nb;
  p.cache.page_size = page;
  p.block_table = make_tensor(bt.data(), DType::kI32, {B, blocks_per_seq});
  p.kv_lens = make_tensor(lens.data(), DType::kI32, {B});
  p.next_n = next_n;
  p.logits = make_tensor(out.data(), DType::kF32, {R, kv});
  for (auto _ : state) {
    Status st = indexer_logits_paged(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * R * kv * H * D, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_IndexerLogitsPagedDecode)->Args({8, 8192, 1})->Args({8, 8192, 4})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Topk(benchmark::State& state) {
  const int64_t M = state.range(0), W = state.range(1), k = state.range(2);
  PoolThreads pool(state.range(3));
  auto x = random_f32(M * W, 7);
  std::vector<int32_t> lens(M, static_cast<int32_t>(W)), idx(M * k);
  TopkParams p;
  p.logits = make_tensor(x.data(), DType::kF32, {M, W});
  p.lengths = make_tensor(lens.data(), DType::kI32, {M});
  p.k = k;
  p.indices = make_tensor(idx.data(), DType::kI32, {M, k});
  std::vector<uint8_t> ws(topk_workspace_size(p));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  for (auto _ : state) {
    Status st = topk(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetBytesProcessed(state.iterations() * M * W * 4);
}
BENCHMARK(BM_Topk)->Args({64, 65536, 2048, 0})->Args({64, 65536, 2048, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// Score and select, fused (indexer_topk) against unfused (indexer_logits_paged + topk), for
// R rows at the end of one sequence of N cached keys (row i sees N - R + i + 1), H index heads,
// k 2048; range(3): 1 fused, 0 unfused. At H = 1 scoring is smallest, so the selection costs
// show: these runs fitted the cost model's CPU constants (docs/fused_select.md).
void BM_ScoreSelect(benchmark::State& state) {
  const int64_t R = state.range(0), N = state.range(1), H = state.range(2), D = 128, page = 64, k = 2048;
  const bool fused = state.range(3) != 0;
  const int64_t nb = (N + page - 1) / page;
  auto q = random_e4m3(R * H * D, 1);
  auto w = random_f32(R * H, 3);
  std::vector<uint8_t> cache(nb * page * kIndexerTokenBytes);
  auto kbytes = random_e4m3(cache.size(), 5);
  std::memcpy(cache.data(), kbytes.data(), cache.size());
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t t = 0; t < page; ++t) {
      const float sc = 1e-3f;
      std::memcpy(cache.data() + b * page * kIndexerTokenBytes + page * D + t * 4, &sc, 4);
    }
  std::vector<int32_t> bt(nb), seq(R, 0), len(R), idx(R * k);
  for (int64_t i = 0; i < nb; ++i) bt[i] = static_cast<int32_t>(i);
  for (int64_t r = 0; r < R; ++r) len[r] = static_cast<int32_t>(N - R + r + 1);
  IndexerCacheDesc cd;
  cd.data = cache.data();
  cd.num_blocks = nb;
  cd.page_size = page;
  IndexerTopkParams fp;
  fp.q = make_tensor(q.data(), DType::kE4M3, {R, H, D});
  fp.weights = make_tensor(w.data(), DType::kF32, {R, H});
  fp.cache = cd;
  fp.block_table = make_tensor(bt.data(), DType::kI32, {1, nb});
  fp.row_seq = make_tensor(seq.data(), DType::kI32, {R});
  fp.row_len = make_tensor(len.data(), DType::kI32, {R});
  fp.width = N;
  fp.k = k;
  fp.indices = make_tensor(idx.data(), DType::kI32, {R, k});
  std::vector<uint8_t> fws(indexer_topk_workspace_size(fp));
  fp.workspace = fws.data();
  fp.workspace_bytes = fws.size();
  std::vector<float> logits(fused ? 0 : R * N);
  IndexerLogitsPagedParams lp;
  lp.q = fp.q;
  lp.weights = fp.weights;
  lp.cache = cd;
  lp.block_table = fp.block_table;
  lp.row_seq = fp.row_seq;
  lp.row_len = fp.row_len;
  lp.skip_rows_up_to = k;
  lp.logits = make_tensor(logits.data(), DType::kF32, {R, N});
  TopkParams tp;
  tp.logits = lp.logits;
  tp.lengths = fp.row_len;
  tp.k = k;
  tp.indices = fp.indices;
  std::vector<uint8_t> tws(fused ? 0 : topk_workspace_size(tp));
  tp.workspace = tws.data();
  tp.workspace_bytes = tws.size();
  for (auto _ : state) {
    Status st = fused ? indexer_topk(fp) : indexer_logits_paged(lp);
    if (st.ok() && !fused) st = topk(tp);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(idx.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * R * (N - R / 2.0) * H * D, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["scratch_MiB"] = (fused ? fws.size() : logits.size() * 4.0 + tws.size()) / (1 << 20);
}
BENCHMARK(BM_ScoreSelect)
    ->ArgNames({"rows", "keys", "heads", "fused"})
    ->Args({64, 8192, 1, 0})->Args({64, 8192, 1, 1})
    ->Args({64, 32768, 1, 0})->Args({64, 32768, 1, 1})
    ->Args({64, 131072, 1, 0})->Args({64, 131072, 1, 1})
    ->Args({64, 32768, 32, 0})->Args({64, 32768, 32, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MapIndices(benchmark::State& state) {
  const int64_t M = state.range(0), K = 2048, B = 16, max_blocks = 1024, page = 64;
  std::vector<int32_t> ind(M * K), out(M * K), bt(B * max_blocks);
  std::mt19937_64 g(9);
  for (auto& j : ind) j = static_cast<int32_t>(g() % (max_blocks * page));
  for (int64_t i = 0; i < B * max_blocks; ++i) bt[i] = static_cast<int32_t>(g() % 100000);
  MapIndicesParams p;
  p.indices = make_tensor(ind.data(), DType::kI32, {M, K});
  p.rows_per_seq = (M + B - 1) / B;
  p.kind = IndexMapKind::kPaged;
  p.block_table = make_tensor(bt.data(), DType::kI32, {B, max_blocks});
  p.page_size = page;
  p.out = make_tensor(out.data(), DType::kI32, {M, K});
  for (auto _ : state) {
    Status st = map_indices(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * M * K * 8);
}
BENCHMARK(BM_MapIndices)->Arg(1024)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A rough FP32 peak: independent FMA chains in vector registers, on every pool thread. The
// bench is not built with the library's -march, so the loop picks its ISA at run time.
typedef float v16f __attribute__((vector_size(64)));
constexpr int kChains = 12;
constexpr int64_t kPeakIters = 1 << 20;
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=fast")))
#endif
float fma_chains(float seed) {
  v16f acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = v16f{} + (seed + static_cast<float>(c));
  const v16f m = v16f{} + 0.999999f, a = v16f{} + 1e-7f;
  for (int64_t i = 0; i < kPeakIters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * m + a;
  v16f s = {};
  for (int c = 0; c < kChains; ++c) s += acc[c];
  return s[0];
}

void BM_Fp32FmaPeak(benchmark::State& state) {
  PoolThreads pool(state.range(0));
  const int threads = cpu::pool_threads();
  for (auto _ : state) {
    (void)cpu::parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) benchmark::DoNotOptimize(fma_chains(static_cast<float>(t)));
    });
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * 16 * kChains * kPeakIters * threads,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_Fp32FmaPeak)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
