// CPU benchmarks of indexer preparation and cache writes at GLM-5 prefill size (T = 4096).
// Bytes processed count what each op reads plus what it writes.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dsa/dsa.h"

namespace {

constexpr int64_t kTokens = 4096;

std::vector<float> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = dsa::float_to_bf16(x[i]);
  return o;
}

std::vector<float> cos_sin_table(int64_t P) {
  std::vector<float> cs(static_cast<size_t>(P * 64));
  for (int64_t p = 0; p < P; ++p)
    for (int i = 0; i < 32; ++i) {
      double th = static_cast<double>(p) * std::pow(10000.0, -i / 32.0);
      cs[p * 64 + i] = static_cast<float>(std::cos(th));
      cs[p * 64 + 32 + i] = static_cast<float>(std::sin(th));
    }
  return cs;
}

std::vector<int32_t> positions(int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) p[t] = static_cast<int32_t>(t);
  return p;
}

// Args: hadamard (0/1). GLM-5: H_idx = 32, interleaved RoPE, bf16 inputs.
void BM_PrepareIndexerQ(benchmark::State& state) {
  const int64_t T = kTokens, H = 32;
  auto q = to_bf16(random_vec(static_cast<size_t>(T * H * 128), 1));
  auto w = to_bf16(random_vec(static_cast<size_t>(T * H), 2));
  auto cs = cos_sin_table(T);
  auto pos = positions(T);
  std::vector<uint8_t> q_out(static_cast<size_t>(T * H * 128));
  std::vector<float> w_out(static_cast<size_t>(T * H));
  dsa::PrepareIndexerQParams p;
  p.q = dsa::make_tensor(q.data(), dsa::DType::kBF16, {T, H, 128});
  p.weights = dsa::make_tensor(w.data(), dsa::DType::kBF16, {T, H});
  p.positions = dsa::make_tensor(pos.data(), dsa::DType::kI32, {T});
  p.cos_sin = dsa::make_tensor(cs.data(), dsa::DType::kF32, {T, 64});
  p.rope = dsa::RopeStyle::kInterleaved;
  p.hadamard = state.range(0) != 0;
  p.q_out = dsa::make_tensor(q_out.data(), dsa::DType::kE4M3, {T, H, 128});
  p.weights_out = dsa::make_tensor(w_out.data(), dsa::DType::kF32, {T, H});
  for (auto _ : state) {
    dsa::Status st = dsa::prepare_indexer_q(p);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(q_out.data());
  }
  // q bf16 in + e4m3 out, gates bf16 in + f32 out, positions, one cos_sin row per token.
  state.SetBytesProcessed(state.iterations() * T * (H * (128 * 3 + 2 + 4) + 4 + 64 * 4));
}
BENCHMARK(BM_PrepareIndexerQ)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_PrepareIndexerK(benchmark::State& state) {
  const int64_t T = kTokens;
  auto k = to_bf16(random_vec(static_cast<size_t>(T * 128), 3));
  auto cs = cos_sin_table(T);
  auto pos = positions(T);
  std::vector<uint8_t> k_out(static_cast<size_t>(T * 128));
  std::vector<float> k_scale(static_cast<size_t>(T));
  dsa::PrepareIndexerKParams p;
  p.k = dsa::make_tensor(k.data(), dsa::DType::kBF16, {T, 128});
  p.positions = dsa::make_tensor(pos.data(), dsa::DType::kI32, {T});
  p.cos_sin = dsa::make_tensor(cs.data(), dsa::DType::kF32, {T, 64});
  p.rope = dsa::RopeStyle::kInterleaved;
  p.hadamard = state.range(0) != 0;
  p.k_out = dsa::make_tensor(k_out.data(), dsa::DType::kE4M3, {T, 128});
  p.k_scale = dsa::make_tensor(k_scale.data(), dsa::DType::kF32, {T});
  for (auto _ : state) {
    dsa::Status st = dsa::prepare_indexer_k(p);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(k_out.data());
  }
  state.SetBytesProcessed(state.iterations() * T * (128 * 3 + 4 + 4 + 64 * 4));
}
BENCHMARK(BM_PrepareIndexerK)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Args: cache dtype (0 bf16, 1 fp8). bf16 inputs, page 64, slots in order.
void BM_WriteMlaCache(benchmark::State& state) {
  const int64_t T = kTokens, page = 64, blocks = T / page;
  const auto dt = state.range(0) ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
  auto kv = to_bf16(random_vec(static_cast<size_t>(T * 512), 4));
  auto pe = to_bf16(random_vec(static_cast<size_t>(T * 64), 5));
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slots[t] = t;
  const int64_t tb = dsa::mla_token_bytes(dt);
  std::vector<uint8_t> cache(static_cast<size_t>(blocks * page * tb) + 16);
  dsa::WriteMlaCacheParams p;
  p.kv_c = dsa::make_tensor(kv.data(), dsa::DType::kBF16, {T, 512});
  p.k_pe = dsa::make_tensor(pe.data(), dsa::DType::kBF16, {T, 64});
  p.where.slots = dsa::make_tensor(slots.data(), dsa::DType::kI64, {T});
  // std::vector gives no 16-byte guarantee: align by hand.
  uintptr_t base = reinterpret_cast<uintptr_t>(cache.data());
  p.cache.data = reinterpret_cast<void*>((base + 15) & ~uintptr_t{15});
  p.cache.dtype = dt;
  p.cache.num_blocks = blocks;
  p.cache.page_size = page;
  for (auto _ : state) {
    dsa::Status st = dsa::write_mla_cache(p);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(cache.data());
  }
  state.SetBytesProcessed(state.iterations() * T * (576 * 2 + 8 + tb));
}
BENCHMARK(BM_WriteMlaCache)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
