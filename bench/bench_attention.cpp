// CPU benchmarks of sparse and dense MLA attention. FLOP counts: every (token, head, key)
// costs 2 * 576 for the score and 2 * 512 for the value sum.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "dsa/dsa.h"

namespace {

using namespace dsa;

constexpr int64_t kDim = 576, kVDim = 512;
constexpr double kFlopsPerKey = 2.0 * (576 + 512);

// A paged cache of random finite latents.
std::vector<uint8_t> random_cache(std::mt19937& gen, bool fp8, int64_t slots) {
  const int64_t tb = fp8 ? kMlaFp8TokenBytes : kMlaBf16TokenBytes;
  std::vector<uint8_t> buf(static_cast<size_t>(slots * tb + 64));
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t s = 0; s < slots; ++s) {
    uint8_t* tok = buf.data() + s * tb;
    if (!fp8) {
      for (int64_t d = 0; d < kDim; ++d) {
        uint16_t v = float_to_bf16(nd(gen));
        std::memcpy(tok + 2 * d, &v, 2);
      }
      continue;
    }
    for (int i = 0; i < 512; ++i) {
      int b = byte(gen);
      tok[i] = static_cast<uint8_t>((b & 0x7f) == 0x7f ? b - 1 : b);  // no NaN
    }
    for (int t = 0; t < 4; ++t) {
      float s4 = 1.0f / 128.0f;
      std::memcpy(tok + kMlaFp8ScaleOffset + 4 * t, &s4, 4);
    }
    for (int d = 0; d < 64; ++d) {
      uint16_t v = float_to_bf16(nd(gen));
      std::memcpy(tok + kMlaFp8RopeOffset + 2 * d, &v, 2);
    }
  }
  return buf;
}

// 16-byte aligned view into a vector (the cache must be 16-byte aligned).
void* aligned16(std::vector<uint8_t>& v) {
  uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<void*>((p + 15) & ~uintptr_t{15});
}

std::vector<uint16_t> random_bf16(std::mt19937& gen, size_t n) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(nd(gen));
  return v;
}

// range(0): CPU threads; 0 = all (timed in wall-clock time), 1 = one (timed in CPU time,
// which stays meaningful on a busy machine).
struct Threads {
  int saved;
  explicit Threads(int64_t n) : saved(num_threads()) { set_num_threads(static_cast<int>(n)); }
  ~Threads() { set_num_threads(saved); }
};

// Sparse prefill-like: T tokens, H heads, topk random distinct keys from a BF16 paged cache.
void BM_SparseMlaPrefillBf16Paged(benchmark::State& state) {
  Threads threads(state.range(0));
  const int64_t T = 64, H = 64, K = 2048, page = 64, blocks = 128;
  std::mt19937 gen(1);
  auto cache_bytes = random_cache(gen, false, blocks * page);
  auto q = random_bf16(gen, static_cast<size_t>(T * H * kDim));
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  std::vector<int32_t> all(static_cast<size_t>(blocks * page));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::sort(all.begin(), all.begin() + K);
    std::copy(all.begin(), all.begin() + K, idx.begin() + t * K);
  }
  std::vector<uint16_t> out(static_cast<size_t>(T * H * kVDim));
  std::vector<float> lse(static_cast<size_t>(T * H));
  SparseMlaParams p;
  p.q = make_tensor(q.data(), DType::kBF16, {T, H, kDim});
  p.kv.paged.data = aligned16(cache_bytes);
  p.kv.paged.num_blocks = blocks;
  p.kv.paged.page_size = page;
  p.indices = make_tensor(idx.data(), DType::kI32, {T, K});
  p.sm_scale = 0.13523f;
  p.out = make_tensor(out.data(), DType::kBF16, {T, H, kVDim});
  p.lse = make_tensor(lse.data(), DType::kF32, {T, H});
  for (auto _ : state) {
    Status st = sparse_mla(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(T * H * K) * kFlopsPerKey,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SparseMlaPrefillBf16Paged)->ArgName("threads")->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SparseMlaPrefillBf16Paged)->ArgName("threads")->Arg(1)->Unit(benchmark::kMillisecond);

// FP8 sparse decode: `batch` sequences of `ctx` tokens, next_n new tokens each, topk 2048.
void BM_SparseMlaDecodeFp8(benchmark::State& state) {
  Threads threads(state.range(0));
  const int64_t batch = 32, next_n = 2, H = 64, K = 2048, page = 64, ctx = 4096;
  const int64_t T = batch * next_n, blocks_per_seq = ctx / page, blocks = batch * blocks_per_seq;
  std::mt19937 gen(2);
  auto cache_bytes = random_cache(gen, true, blocks * page);
  auto q = random_bf16(gen, static_cast<size_t>(T * H * kDim));
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  std::vector<int32_t> pos(static_cast<size_t>(ctx));
  std::iota(pos.begin(), pos.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = t / next_n;
    std::shuffle(pos.begin(), pos.end(), gen);
    std::sort(pos.begin(), pos.begin() + K);
    for (int64_t k = 0; k < K; ++k) idx[static_cast<size_t>(t * K + k)] = static_cast<int32_t>(b * ctx + pos[static_cast<size_t>(k)]);
  }
  std::vector<uint16_t> out(static_cast<size_t>(T * H * kVDim));
  std::vector<float> lse(static_cast<size_t>(T * H));
  SparseMlaParams p;
  p.q = make_tensor(q.data(), DType::kBF16, {T, H, kDim});
  p.kv.paged.data = aligned16(cache_bytes);
  p.kv.paged.dtype = MlaCacheDtype::kFP8;
  p.kv.paged.num_blocks = blocks;
  p.kv.paged.page_size = page;
  p.indices = make_tensor(idx.data(), DType::kI32, {T, K});
  p.sm_scale = 0.13523f;
  p.out = make_tensor(out.data(), DType::kBF16, {T, H, kVDim});
  p.lse = make_tensor(lse.data(), DType::kF32, {T, H});
  for (auto _ : state) {
    Status st = sparse_mla(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(T * H * K) * kFlopsPerKey,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SparseMlaDecodeFp8)->ArgName("threads")->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SparseMlaDecodeFp8)->ArgName("threads")->Arg(1)->Unit(benchmark::kMillisecond);

// Dense causal short prefill: one sequence of 512 tokens, H = 64, BF16 paged cache.
void BM_DenseMlaShortPrefill(benchmark::State& state) {
  Threads threads(state.range(0));
  const int64_t n = 512, H = 64, page = 64, blocks = (n + page - 1) / page;
  std::mt19937 gen(3);
  auto cache_bytes = random_cache(gen, false, blocks * page);
  auto q = random_bf16(gen, static_cast<size_t>(n * H * kDim));
  std::vector<int32_t> cu_q = {0, static_cast<int32_t>(n)}, kv_lens = {static_cast<int32_t>(n)};
  std::vector<int32_t> bt(static_cast<size_t>(blocks));
  std::iota(bt.begin(), bt.end(), 0);
  std::vector<uint16_t> out(static_cast<size_t>(n * H * kVDim));
  std::vector<float> lse(static_cast<size_t>(n * H));
  DenseMlaParams p;
  p.q = make_tensor(q.data(), DType::kBF16, {n, H, kDim});
  p.kv.paged.data = aligned16(cache_bytes);
  p.kv.paged.num_blocks = blocks;
  p.kv.paged.page_size = page;
  p.cu_seqlens_q = make_tensor(cu_q.data(), DType::kI32, {2});
  p.block_table = make_tensor(bt.data(), DType::kI32, {1, blocks});
  p.kv_lens = make_tensor(kv_lens.data(), DType::kI32, {1});
  p.sm_scale = 0.13523f;
  p.out = make_tensor(out.data(), DType::kBF16, {n, H, kVDim});
  p.lse = make_tensor(lse.data(), DType::kF32, {n, H});
  for (auto _ : state) {
    Status st = dense_mla(p);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  const double keys = static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;  // causal
  state.counters["FLOP/s"] = benchmark::Counter(keys * static_cast<double>(H) * kFlopsPerKey,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DenseMlaShortPrefill)->ArgName("threads")->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DenseMlaShortPrefill)->ArgName("threads")->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
