// `dsa bench --op layer_prefill` and `--op layer_decode`: one layer of a preset driven through
// dsa::make_plan and dsa::Attention::step the way an engine drives it (issue 9).
//
//   layer_prefill: one prompt of S tokens prefilled in steps of `step` new tokens, each step a
//     chunked prefill over the prefix already cached; one plan for the whole prompt
//     (max_tokens_per_step = step, max_context = S, the score budget), caches sized for S.
//     Time: CUDA events around every step, summed; then a second pass with
//     StepParams::time_stages for the GPU time of each stage (or, while the step does not
//     measure them, its host enqueue times, marked as such).
//   layer_decode: B sequences of ctx cached tokens each, next_n new tokens per sequence per
//     step; the median of the timed steps, and the mean per-stage split of a second series.
// Inputs are random (never zeros): the new tokens' latents and indexer inputs are refreshed
// from the random pools before every prefill step (outside the timed region), the absorbed
// queries are one random set; decode caches are filled with random tokens.
// With --backend cpu the same runs on the CPU backend (host memory, steady_clock; the host
// stage times are then the real split), at the sizes given by --prefill / --decode.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "dsa/layer.h"
#include "dsa/planner.h"

namespace dsa_bench {
namespace {

// ---- the backend under test: memory, fills, timing -----------------------------------------
dsa::Device layer_device(const Options& o) { return o.cpu ? dsa::cpu_device() : dsa::cuda_device(o.device); }

const char* kAllocFailed = "allocation or fill failed";

// Device memory on CUDA, host memory (256-byte aligned) on the CPU.
class Mem {
 public:
  Mem(bool cpu, size_t bytes) : cpu_(cpu), bytes_(bytes) {
    if (!bytes) return;
    if (cpu) {
      p_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    } else {
#if defined(DSA_WITH_CUDA)
      if (cudaMalloc(&p_, bytes) != cudaSuccess) {
        cudaGetLastError();
        p_ = nullptr;
      }
#endif
    }
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  ~Mem() {
    if (!p_) return;
    if (cpu_) std::free(p_);
#if defined(DSA_WITH_CUDA)
    else cudaFree(p_);
#endif
  }
  void* get() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  bool ok() const { return bytes_ == 0 || p_ != nullptr; }

 private:
  bool cpu_;
  size_t bytes_;
  void* p_ = nullptr;
};

// Random fills: from the device pools on CUDA, generated in place on the CPU.
struct Filler {
  const Options& o;
  const Pools* pools;
  Rng rng;
  Filler(const Options& opt, const Pools* p, uint64_t seed) : o(opt), pools(p), rng(seed) {}
  bool bf16(const Mem& m) {
    if (o.cpu) {
      for (size_t i = 0; i < m.bytes() / 2; ++i) m.as<uint16_t>()[i] = dsa::float_to_bf16(rng.normal());
      return true;
    }
#if defined(DSA_WITH_CUDA)
    return pools->bf16.fill(m.get(), m.bytes(), rng);
#else
    return false;
#endif
  }
  bool f32(const Mem& m) {
    if (o.cpu) {
      for (size_t i = 0; i < m.bytes() / 4; ++i) m.as<float>()[i] = rng.normal();
      return true;
    }
#if defined(DSA_WITH_CUDA)
    return pools->f32.fill(m.get(), m.bytes(), rng);
#else
    return false;
#endif
  }
  bool e4m3(const Mem& m) {
    if (o.cpu) {
      for (size_t i = 0; i < m.bytes(); ++i) m.as<uint8_t>()[i] = dsa::quantize_e4m3(rng.normal() * 64.f, 1.f);
      return true;
    }
#if defined(DSA_WITH_CUDA)
    return pools->e4m3.fill(m.get(), m.bytes(), rng);
#else
    return false;
#endif
  }
  // An indexer cache of `blocks` pages, [64 x 128 e4m3][64 x f32 scale] each: random keys,
  // power-of-two scales.
  bool indexer_cache(const Mem& m, int64_t blocks, int64_t page) {
    if (!e4m3(m)) return false;
    const size_t page_bytes = static_cast<size_t>(page * dsa::kIndexerTokenBytes);
    if (o.cpu) {
      for (int64_t b = 0; b < blocks; ++b) {
        float* sc = reinterpret_cast<float*>(m.as<uint8_t>() + static_cast<size_t>(b) * page_bytes + page * 128);
        for (int64_t t = 0; t < page; ++t) sc[t] = std::ldexp(1.f, -4 - static_cast<int>(rng.next() % 6));
      }
      return true;
    }
#if defined(DSA_WITH_CUDA)
    const size_t scale_bytes = static_cast<size_t>(page * 4);
    const size_t rows_per_copy = pools->pow2.bytes() / scale_bytes;
    for (int64_t b0 = 0; b0 < blocks; b0 += static_cast<int64_t>(rows_per_copy)) {
      const size_t nb = std::min<size_t>(rows_per_copy, static_cast<size_t>(blocks - b0));
      if (cudaMemcpy2DAsync(m.as<uint8_t>() + static_cast<size_t>(b0) * page_bytes + page * 128, page_bytes,
                            pools->pow2.data(), scale_bytes, scale_bytes, nb, cudaMemcpyDeviceToDevice) != cudaSuccess)
        return false;
    }
    return true;
#else
    return false;
#endif
  }
  bool upload(const Mem& m, const void* host, size_t bytes) {
    if (!m.ok() || bytes > m.bytes()) return false;
    if (o.cpu) {
      std::memcpy(m.get(), host, bytes);
      return true;
    }
#if defined(DSA_WITH_CUDA)
    return cudaMemcpy(m.get(), host, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
#else
    return false;
#endif
  }
};

// Waits for the backend; "" or the device error.
std::string sync(const Options& o) {
  if (o.cpu) return "";
#if defined(DSA_WITH_CUDA)
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return std::string("device error: ") + cudaGetErrorString(e);
  return "";
#else
  return "no CUDA backend";
#endif
}

// Time of one step: CUDA events on the default stream (GPU time), or host time on the CPU.
class Timer {
 public:
  explicit Timer(const Options& o) : cpu_(o.cpu) {
#if defined(DSA_WITH_CUDA)
    if (!cpu_) {
      cudaEventCreate(&ev_[0]);
      cudaEventCreate(&ev_[1]);
    }
#endif
  }
  ~Timer() {
#if defined(DSA_WITH_CUDA)
    if (!cpu_) {
      cudaEventDestroy(ev_[0]);
      cudaEventDestroy(ev_[1]);
    }
#endif
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start() {
    t0_ = std::chrono::steady_clock::now();
#if defined(DSA_WITH_CUDA)
    if (!cpu_) cudaEventRecord(ev_[0]);
#endif
  }
  void stop() {
    t1_ = std::chrono::steady_clock::now();
#if defined(DSA_WITH_CUDA)
    if (!cpu_) cudaEventRecord(ev_[1]);
#endif
  }
  // ms between start and stop (waits for the stop event); false on a device error.
  bool ms(double* out, std::string* err) {
    if (cpu_) {
      *out = std::chrono::duration<double, std::milli>(t1_ - t0_).count();
      return true;
    }
#if defined(DSA_WITH_CUDA)
    const cudaError_t e = cudaEventSynchronize(ev_[1]);
    if (e != cudaSuccess) {
      *err = std::string("device error: ") + cudaGetErrorString(e);
      return false;
    }
    float t = 0;
    cudaEventElapsedTime(&t, ev_[0], ev_[1]);
    *out = t;
    return true;
#else
    *err = "no CUDA backend";
    return false;
#endif
  }

 private:
  bool cpu_;
  std::chrono::steady_clock::time_point t0_, t1_;
#if defined(DSA_WITH_CUDA)
  cudaEvent_t ev_[2] = {nullptr, nullptr};
#endif
};

constexpr int64_t kPage = 64;
constexpr double kAttnFlopsPerKeyHead = (576.0 + 512.0) * 2.0;  // scores + value sums

std::string budget_text(int64_t bytes) {
  if (bytes % (int64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "GiB";
  if (bytes % (int64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes) + "B";
}

// The stage split of one or more steps: GPU ms when the step measured them, else host ms.
struct Stages {
  bool gpu = false;
  double cache = 0, prepare = 0, score = 0, select = 0, map = 0, sparse = 0, dense = 0, total = 0;
  void add(const dsa::StepReport& r, double scale = 1.0) {
    gpu = r.gpu_timed;
    if (r.gpu_timed) {
      cache += scale * r.gpu_ms_cache; prepare += scale * r.gpu_ms_prepare; score += scale * r.gpu_ms_score;
      select += scale * r.gpu_ms_select; map += scale * r.gpu_ms_map; sparse += scale * r.gpu_ms_sparse;
      dense += scale * r.gpu_ms_dense; total += scale * r.gpu_ms_total;
    } else {
      cache += scale * r.ms_cache; prepare += scale * r.ms_prepare; score += scale * r.ms_score;
      select += scale * r.ms_select; map += scale * r.ms_map; sparse += scale * r.ms_sparse;
      dense += scale * r.ms_dense; total += scale * r.ms_total;
    }
  }
  std::string json() const {
    char b[512];
    std::snprintf(b, sizeof(b),
                  "{\"source\": \"%s\", \"cache\": %.6f, \"prepare\": %.6f, \"score\": %.6f, \"select\": %.6f, "
                  "\"map\": %.6f, \"sparse\": %.6f, \"dense\": %.6f, \"total\": %.6f}",
                  gpu ? "gpu" : "host", cache, prepare, score, select, map, sparse, dense, total);
    return b;
  }
  std::string text() const {
    char b[320];
    std::snprintf(b, sizeof(b), "cache %.3f  prepare %.3f  score %.3f  select %.3f  map %.3f  sparse %.3f  dense %.3f  (total %.3f)",
                  cache, prepare, score, select, map, sparse, dense, total);
    return b;
  }
};

const char* kNotMeasured = "gpu stage times: not measured (the step did not record them; host enqueue ms below)";

// FLOPs of `n` rows of one sequence at positions s0 .. s0 + n - 1 (row i sees s0 + i + 1 keys),
// kv_len = s0 + n after the step. A sequence past topk is scored (indexer over every visible
// key of every row) and its rows attend to min(L, topk) keys; one within topk runs dense causal.
void count_rows(int64_t s0, int64_t n, int64_t kv_len, const dsa::ModelGeometry& g, double* fp8, double* bf16) {
  const double first = static_cast<double>(s0 + 1), last = static_cast<double>(s0 + n);
  const double visible = (first + last) * static_cast<double>(n) / 2.0;  // Σ L over the rows
  if (kv_len > g.topk) {
    *fp8 += 2.0 * 128.0 * g.index_heads * visible;
    // Σ min(L, K): rows below K attend to their L keys, the rest to K.
    const int64_t below = std::max<int64_t>(0, std::min<int64_t>(n, g.topk - s0));  // rows with L <= K
    const double lb = static_cast<double>(below);
    const double sum_below = below ? (first + (first + lb - 1)) * lb / 2.0 : 0.0;
    const double keys = sum_below + static_cast<double>(n - below) * g.topk;
    *bf16 += keys * g.num_heads * kAttnFlopsPerKeyHead;
  } else {
    *bf16 += visible * g.num_heads * kAttnFlopsPerKeyHead;
  }
}

std::vector<float> rope_table(int64_t positions) {
  std::vector<float> cs(static_cast<size_t>(positions * 64));
  for (int64_t pos = 0; pos < positions; ++pos)
    for (int i = 0; i < 32; ++i) {
      const double inv_freq = std::pow(10000.0, -2.0 * i / 64.0);
      cs[static_cast<size_t>(pos * 64 + i)] = static_cast<float>(std::cos(pos * inv_freq));
      cs[static_cast<size_t>(pos * 64 + 32 + i)] = static_cast<float>(std::sin(pos * inv_freq));
    }
  return cs;
}

// A shuffled page list: block-table mistakes cannot hide behind the identity.
std::vector<int32_t> shuffled_pages(int64_t n, Rng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[static_cast<size_t>(i)], v[rng.next() % static_cast<uint64_t>(i + 1)]);
  return v;
}

// The paged caches of a layer benchmark: B sequences of up to ctx tokens each on shuffled
// pages (block-table mistakes cannot hide behind the identity; one spare page), random
// latents and indexer keys with power-of-two scales in every slot, the block table
// [B, per_seq] and the RoPE table of ctx positions.
struct LayerCaches {
  int64_t ctx, per_seq, blocks;
  Mem mla, idx, bt, cs;
  LayerCaches(bool cpu, int64_t B, int64_t context)
      : ctx(context), per_seq((ctx + kPage - 1) / kPage), blocks(B * per_seq + 1),
        mla(cpu, static_cast<size_t>(blocks * kPage * dsa::kMlaBf16TokenBytes)),
        idx(cpu, static_cast<size_t>(blocks * kPage * dsa::kIndexerTokenBytes)),
        bt(cpu, static_cast<size_t>(B * per_seq * 4)), cs(cpu, static_cast<size_t>(ctx * 64 * 4)) {}
  bool fill(Filler& f) const {
    const std::vector<int32_t> perm = shuffled_pages(blocks, f.rng);
    const std::vector<float> rope = rope_table(ctx);
    return mla.ok() && idx.ok() && f.upload(bt, perm.data(), bt.bytes()) && f.upload(cs, rope.data(), rope.size() * 4) &&
           f.bf16(mla) && f.indexer_cache(idx, blocks, kPage);
  }
  dsa::MlaCacheDesc mla_desc(dsa::Device d) const {
    dsa::MlaCacheDesc m;
    m.data = mla.get(); m.dtype = dsa::MlaCacheDtype::kBF16; m.num_blocks = blocks; m.page_size = kPage; m.device = d;
    return m;
  }
  dsa::IndexerCacheDesc idx_desc(dsa::Device d) const {
    dsa::IndexerCacheDesc i;
    i.data = idx.get(); i.num_blocks = blocks; i.page_size = kPage; i.device = d;
    return i;
  }
};

// The per-token inputs of a step of up to T rows.
struct StepInputs {
  Mem q, iq, ik, iw, kvc, kpe, out, lse;
  StepInputs(bool cpu, int64_t T, const dsa::ModelGeometry& g)
      : q(cpu, static_cast<size_t>(T * g.num_heads * dsa::kQkDim * 2)),
        iq(cpu, static_cast<size_t>(T * g.index_heads * 128 * 2)), ik(cpu, static_cast<size_t>(T * 128 * 2)),
        iw(cpu, static_cast<size_t>(T * g.index_heads * 4)), kvc(cpu, static_cast<size_t>(T * dsa::kLatentDim * 2)),
        kpe(cpu, static_cast<size_t>(T * 64 * 2)), out(cpu, static_cast<size_t>(T * g.num_heads * dsa::kLatentDim * 2)),
        lse(cpu, static_cast<size_t>(T * g.num_heads * 4)) {}
  bool ok() const { return q.ok() && iq.ok() && ik.ok() && iw.ok() && kvc.ok() && kpe.ok() && out.ok() && lse.ok(); }
  bool refresh_tokens(Filler& f) const {  // everything but q
    return f.bf16(iq) && f.bf16(ik) && f.f32(iw) && f.bf16(kvc) && f.bf16(kpe);
  }
  bool fill_all(Filler& f) const { return refresh_tokens(f) && f.bf16(q); }
};

// The step's params for T rows of B sequences (host q_lens / kv_lens).
dsa::StepParams step_params(const dsa::ModelGeometry& g, const StepInputs& in, int64_t T, int64_t B, int32_t* q_lens,
                            int32_t* kv_lens, const Mem& bt, int64_t max_blocks, const Mem& cos_sin, int64_t positions,
                            const dsa::MlaCacheDesc& mla, const dsa::IndexerCacheDesc& idx, const Mem& ws, dsa::Device d) {
  const int64_t H = g.num_heads, Hi = g.index_heads;
  dsa::StepParams p;
  p.role = dsa::IndexerRole::kFull;
  p.q_lens = dsa::make_tensor(q_lens, dsa::DType::kI32, {B}, dsa::cpu_device());
  p.kv_lens = dsa::make_tensor(kv_lens, dsa::DType::kI32, {B}, dsa::cpu_device());
  p.block_table = dsa::make_tensor(bt.get(), dsa::DType::kI32, {B, max_blocks}, d);
  p.kv_c = dsa::make_tensor(in.kvc.get(), dsa::DType::kBF16, {T, dsa::kLatentDim}, d);
  p.k_pe = dsa::make_tensor(in.kpe.get(), dsa::DType::kBF16, {T, 64}, d);
  p.q = dsa::make_tensor(in.q.get(), dsa::DType::kBF16, {T, H, dsa::kQkDim}, d);
  p.index_q = dsa::make_tensor(in.iq.get(), dsa::DType::kBF16, {T, Hi, 128}, d);
  p.index_k = dsa::make_tensor(in.ik.get(), dsa::DType::kBF16, {T, 128}, d);
  p.index_w = dsa::make_tensor(in.iw.get(), dsa::DType::kF32, {T, Hi}, d);
  p.cos_sin = dsa::make_tensor(cos_sin.get(), dsa::DType::kF32, {positions, 64}, d);
  p.mla_cache = mla;
  p.index_cache = idx;
  p.out = dsa::make_tensor(in.out.get(), dsa::DType::kBF16, {T, H, dsa::kLatentDim}, d);
  p.lse = dsa::make_tensor(in.lse.get(), dsa::DType::kF32, {T, H}, d);
  p.workspace = ws.get();
  p.workspace_bytes = ws.bytes();
  return p;
}

bool make_plan_for(const Options& o, const dsa::ModelGeometry& g, int64_t tokens, int64_t seqs, int64_t ctx, int64_t next_n,
                   int64_t budget, dsa::Plan* plan, std::unique_ptr<dsa::Attention>* attn, std::string* err,
                   dsa::SelectPath select = dsa::SelectPath::kAuto) {
  dsa::PlannerConfig c;
  c.select = select;
  c.geometry = g;
  c.cache_dtype = dsa::MlaCacheDtype::kBF16;
  c.page_size = kPage;
  c.max_tokens_per_step = tokens;
  c.max_seqs_per_step = seqs;
  c.max_context = ctx;
  c.max_next_n = next_n;
  c.score_budget_bytes = budget;
  c.device = layer_device(o);
  dsa::Status st = dsa::make_plan(c, plan);
  if (st.ok()) st = dsa::Attention::create(*plan, attn);
  if (!st.ok()) *err = "plan: " + st.to_string();
  return st.ok();
}

// The host cost of the step per layer (issue 15): one batch run as `layers` layers, once as
// step() per layer (v0.1's only form) and once as prepare() + run() per layer (and, with
// `device_kv`, as the graph-stable decode form over device lengths). Every call is timed alone,
// the device idle before it, from StepReport::host_us: the figures are the host's own work,
// not waits behind queued GPU work. Means per layer; prepare once per batch. Then the ways
// engines pay it: the layers' run() calls enqueued back to back (no sync between them: host
// wall time of the loop / layers, median of kBackToBackReps), the host split of one run() by
// op (StepReport::ms_*), and on CUDA the device-lengths step captured once in a CUDA graph and
// replayed (host time of cudaGraphLaunch and GPU time of a replay, each / layers).
constexpr int kBackToBackReps = 5;
constexpr int kGraphReplays = 50;

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  return o + "\"";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Host us of one run() by op (StepReport::ms_* of run's stages; `other`: the rest of host_us:
// validation, routing, chunk sizing, the report).
struct OpSplit {
  double cache = 0, queries = 0, score = 0, select = 0, map = 0, sparse = 0, dense = 0, other = 0;
  void add(const dsa::StepReport& r, double scale) {
    const double staged = r.ms_cache + r.ms_prepare + r.ms_score + r.ms_select + r.ms_map + r.ms_sparse + r.ms_dense;
    cache += scale * 1e3 * r.ms_cache;
    queries += scale * 1e3 * r.ms_prepare;
    score += scale * 1e3 * r.ms_score;
    select += scale * 1e3 * r.ms_select;
    map += scale * 1e3 * r.ms_map;
    sparse += scale * 1e3 * r.ms_sparse;
    dense += scale * 1e3 * r.ms_dense;
    other += scale * std::max(0.0, r.host_us - 1e3 * staged);
  }
  std::string json() const {
    char b[320];
    std::snprintf(b, sizeof(b),
                  "{\"cache\": %.2f, \"queries\": %.2f, \"score\": %.2f, \"select\": %.2f, \"map\": %.2f, \"sparse\": %.2f, "
                  "\"dense\": %.2f, \"other\": %.2f}",
                  cache, queries, score, select, map, sparse, dense, other);
    return b;
  }
  std::string text() const {
    char b[240];
    std::snprintf(b, sizeof(b), "cache %.1f queries %.1f score %.1f select %.1f map %.1f sparse %.1f dense %.1f other %.1f",
                  cache, queries, score, select, map, sparse, dense, other);
    return b;
  }
};

// The device-lengths decode step captured in one CUDA graph (one prepare + `layers` runs).
struct GraphReplay {
  bool measured = false;
  std::string why;  // when not measured
  int replays = 0;
  double launch_us = 0, gpu_us = 0;  // medians per replay (the whole graph)
};

struct HostCost {
  int layers = 0;
  double step_us = 0, prepare_us = 0, run_us = 0, dl_prepare_us = 0, dl_run_us = 0;
  bool dl = false;
  double b2b_run_us = 0, dl_b2b_run_us = 0;  // back to back, per layer
  OpSplit run_ops, dl_run_ops;               // means over the timed-alone runs
  GraphReplay graph;
  std::string json() const {
    char b[400];
    std::snprintf(b, sizeof(b), "{\"layers\": %d, \"step\": %.2f, \"prepare\": %.2f, \"run\": %.2f", layers, step_us,
                  prepare_us, run_us);
    std::string j = b;
    if (dl) {
      std::snprintf(b, sizeof(b), ", \"device_lengths_prepare\": %.2f, \"device_lengths_run\": %.2f", dl_prepare_us, dl_run_us);
      j += b;
    }
    std::snprintf(b, sizeof(b), ", \"back_to_back_reps\": %d, \"back_to_back_run\": %.2f", kBackToBackReps, b2b_run_us);
    j += b;
    if (dl) {
      std::snprintf(b, sizeof(b), ", \"device_lengths_back_to_back_run\": %.2f", dl_b2b_run_us);
      j += b;
    }
    j += ", \"run_by_op\": " + run_ops.json();
    if (dl) j += ", \"device_lengths_run_by_op\": " + dl_run_ops.json();
    if (graph.measured) {
      std::snprintf(b, sizeof(b),
                    ", \"graph_replay\": {\"measured\": true, \"replays\": %d, \"launch_us\": %.2f, \"launch_us_per_layer\": %.3f, "
                    "\"gpu_us\": %.2f, \"gpu_us_per_layer\": %.3f}",
                    graph.replays, graph.launch_us, graph.launch_us / layers, graph.gpu_us, graph.gpu_us / layers);
      j += b;
    } else {
      j += ", \"graph_replay\": {\"measured\": false, \"reason\": " + json_str(graph.why) + "}";
    }
    return j + "}";
  }
  std::string text() const {
    char b[400];
    std::snprintf(b, sizeof(b),
                  "    host us per layer (each call alone, mean of %d layers): step() %.1f | prepare() %.1f once + run() %.1f "
                  "per layer",
                  layers, step_us, prepare_us, run_us);
    std::string t = b;
    if (dl) {
      std::snprintf(b, sizeof(b), " | device lengths: prepare() %.1f + run() %.1f", dl_prepare_us, dl_run_us);
      t += b;
    }
    t += "\n";
    std::snprintf(b, sizeof(b), "    host us per layer, back to back (%d run() calls, no sync; median of %d): run() %.1f",
                  layers, kBackToBackReps, b2b_run_us);
    t += b;
    if (dl) {
      std::snprintf(b, sizeof(b), " | device lengths run() %.1f", dl_b2b_run_us);
      t += b;
    }
    t += "\n    run() host us by op: " + run_ops.text() + "\n";
    if (dl) t += "    device lengths run() by op: " + dl_run_ops.text() + "\n";
    if (graph.measured) {
      std::snprintf(b, sizeof(b),
                    "    graph replay (prepare + %d runs, median of %d): launch %.1f us = %.2f per layer | gpu %.1f us = %.1f per "
                    "layer\n",
                    layers, graph.replays, graph.launch_us, graph.launch_us / layers, graph.gpu_us, graph.gpu_us / layers);
      t += b;
    } else {
      t += "    graph replay: not measured (" + graph.why + ")\n";
    }
    return t;
  }
};

using Clock = std::chrono::steady_clock;
double us_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

// One prepare, then `layers` run() calls enqueued back to back, `reps` times (the device idle
// before each prepare): the median of (host wall time of the run loop) / layers.
std::string back_to_back(const Options& o, dsa::Attention& attn, const dsa::StepParams& p, int layers, double* out) {
  std::vector<double> per_layer;
  std::string e;
  for (int r = 0; r < kBackToBackReps; ++r) {
    if (!(e = sync(o)).empty()) return e;
    dsa::Status st = attn.prepare(p);
    if (!st.ok()) return "prepare: " + st.to_string();
    const auto t0 = Clock::now();
    for (int l = 0; l < layers && st.ok(); ++l) st = attn.run(p);
    const auto t1 = Clock::now();
    if (!st.ok()) return "run: " + st.to_string();
    per_layer.push_back(us_between(t0, t1) / layers);
  }
  if (!(e = sync(o)).empty()) return e;
  *out = median(per_layer);
  return "";
}

#if defined(DSA_WITH_CUDA)
// The device-lengths step `q` captured as one graph (prepare + `layers` runs) on a stream of its
// own, by an Attention object of its own (layer.h: one object per captured graph, destroyed
// after the graph; warmed up eagerly and synchronised before the capture), then replayed: per
// replay the host time of cudaGraphLaunch alone and the GPU time between events around it,
// the device idle before each. Fills g; "" or why it could not be measured.
std::string graph_replay(const dsa::Plan& plan, const dsa::StepParams& q_in, int layers, GraphReplay* g) {
  std::unique_ptr<dsa::Attention> owner;  // declared first: destroyed after the graph below
  dsa::Status st = dsa::Attention::create(plan, &owner);
  if (!st.ok()) return "attention object: " + st.to_string();
  struct Cuda {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    ~Cuda() {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      if (stream) cudaStreamDestroy(stream);
    }
  } c;
  auto cuda_error = [](const char* what, cudaError_t e) {
    cudaGetLastError();
    return std::string(what) + ": " + cudaGetErrorString(e);
  };
  cudaError_t e = cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&c.ev[0]);
  if (e == cudaSuccess) e = cudaEventCreate(&c.ev[1]);
  if (e != cudaSuccess) return cuda_error("stream or events", e);
  dsa::StepParams q = q_in;
  q.stream = c.stream;
  auto one_step = [&]() {
    dsa::Status s = owner->prepare(q);
    for (int l = 0; l < layers && s.ok(); ++l) s = owner->run(q);
    return s;
  };
  if (!(st = one_step()).ok()) return "eager warm-up: " + st.to_string();
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) return cuda_error("eager warm-up", e);
  if ((e = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal)) != cudaSuccess) return cuda_error("begin capture", e);
  st = one_step();
  e = cudaStreamEndCapture(c.stream, &c.graph);
  if (!st.ok()) return "step under capture: " + st.to_string();
  if (e != cudaSuccess || c.graph == nullptr) return cuda_error("end capture", e);
  if ((e = cudaGraphInstantiate(&c.exec, c.graph, 0)) != cudaSuccess) return cuda_error("instantiate", e);
  for (int i = 0; i < 3 && e == cudaSuccess; ++i) e = cudaGraphLaunch(c.exec, c.stream);  // upload, warm
  if (e == cudaSuccess) e = cudaStreamSynchronize(c.stream);
  if (e != cudaSuccess) return cuda_error("warm-up replays", e);
  std::vector<double> launch, gpu;
  for (int i = 0; i < kGraphReplays; ++i) {
    if ((e = cudaEventRecord(c.ev[0], c.stream)) != cudaSuccess) return cuda_error("event", e);
    const auto t0 = Clock::now();
    e = cudaGraphLaunch(c.exec, c.stream);
    const auto t1 = Clock::now();
    if (e != cudaSuccess) return cuda_error("replay", e);
    if ((e = cudaEventRecord(c.ev[1], c.stream)) != cudaSuccess || (e = cudaEventSynchronize(c.ev[1])) != cudaSuccess)
      return cuda_error("replay", e);
    float ms = 0;
    if ((e = cudaEventElapsedTime(&ms, c.ev[0], c.ev[1])) != cudaSuccess) return cuda_error("event time", e);
    launch.push_back(us_between(t0, t1));
    gpu.push_back(1e3 * ms);
  }
  g->measured = true;
  g->replays = kGraphReplays;
  g->launch_us = median(launch);
  g->gpu_us = median(gpu);
  return "";
}
#endif

std::string host_cost(const Options& o, dsa::Attention& attn, const dsa::StepParams& p, int layers, const Mem* device_kv,
                      int64_t next_n, HostCost* out) {
  HostCost c;
  c.layers = layers;
  dsa::StepReport rep;
  std::string e;
  auto one = [&](dsa::Status (dsa::Attention::*call)(const dsa::StepParams&, dsa::StepReport*), const dsa::StepParams& q,
                 double* acc, OpSplit* ops = nullptr) -> std::string {
    if (!(e = sync(o)).empty()) return e;
    const dsa::Status st = (attn.*call)(q, &rep);
    if (!st.ok()) return st.to_string();
    *acc += rep.host_us;
    if (ops) ops->add(rep, 1.0 / layers);
    return "";
  };
  for (int l = 0; l < layers; ++l)
    if (!(e = one(&dsa::Attention::step, p, &c.step_us)).empty()) return "host cost, step: " + e;
  if (!(e = one(&dsa::Attention::prepare, p, &c.prepare_us)).empty()) return "host cost, prepare: " + e;
  for (int l = 0; l < layers; ++l)
    if (!(e = one(&dsa::Attention::run, p, &c.run_us, &c.run_ops)).empty()) return "host cost, run: " + e;
  if (!(e = back_to_back(o, attn, p, layers, &c.b2b_run_us)).empty()) return "host cost, back to back: " + e;
  if (device_kv) {
    dsa::StepParams q = p;
    q.q_lens = dsa::TensorDesc{};
    q.kv_lens = dsa::make_tensor(device_kv->get(), dsa::DType::kI32, {p.kv_lens.shape[0]}, p.q.device);
    q.device_lengths = true;
    q.next_n = next_n;
    c.dl = true;
    if (!(e = one(&dsa::Attention::prepare, q, &c.dl_prepare_us)).empty()) return "host cost, device-lengths prepare: " + e;
    for (int l = 0; l < layers; ++l)
      if (!(e = one(&dsa::Attention::run, q, &c.dl_run_us, &c.dl_run_ops)).empty())
        return "host cost, device-lengths run: " + e;
    c.dl_run_us /= layers;
    if (!(e = back_to_back(o, attn, q, layers, &c.dl_b2b_run_us)).empty())
      return "host cost, device-lengths back to back: " + e;
    if (o.cpu) {
      c.graph.why = "CUDA graphs: CUDA backend only";
    } else {
#if defined(DSA_WITH_CUDA)
      if (!(e = sync(o)).empty()) return e;
      const std::string why = graph_replay(attn.plan(), q, layers, &c.graph);
      if (!why.empty()) c.graph.why = "graph: " + why;
#else
      c.graph.why = "this build has no CUDA backend";
#endif
    }
  } else {
    c.graph.why = "graph-stable decode form (device lengths) only";
  }
  c.step_us /= layers;
  c.run_us /= layers;
  if (!(e = sync(o)).empty()) return e;
  *out = c;
  return "";
}

}  // namespace

Result bench_layer_prefill(const Options& o, const Pools* pools, const std::string& preset, int64_t S, int64_t step,
                           int64_t budget, dsa::SelectPath select, const std::string& shape_suffix) {
  Result r;
  r.op = "layer_prefill";
  r.shape = preset + " S=" + std::to_string(S) + " step=" + std::to_string(step) + " budget=" + budget_text(budget) +
            shape_suffix;
  dsa::ModelGeometry g;
  dsa::Status st = dsa::geometry_preset(preset, &g);
  if (!st.ok()) { r.error = st.to_string(); return r; }
  const int64_t nsteps = (S + step - 1) / step;
  std::vector<double> step_fp8(static_cast<size_t>(nsteps), 0), step_bf16(static_cast<size_t>(nsteps), 0);
  double fp8 = 0, bf16 = 0;
  for (int64_t i = 0; i < nsteps; ++i) {
    const int64_t s0 = i * step, n = std::min(step, S - s0);
    count_rows(s0, n, s0 + n, g, &step_fp8[static_cast<size_t>(i)], &step_bf16[static_cast<size_t>(i)]);
    fp8 += step_fp8[static_cast<size_t>(i)];
    bf16 += step_bf16[static_cast<size_t>(i)];
  }
  r.work.flops = fp8 + bf16;
  r.work.flops_fp8 = fp8;
  r.work.fp8 = true;

  dsa::Plan plan;
  std::unique_ptr<dsa::Attention> attn;
  if (!make_plan_for(o, g, step, 1, S, 1, budget, &plan, &attn, &r.error, select)) return r;
  const dsa::Device d = layer_device(o);
  Filler fill(o, pools, 21);
  const LayerCaches caches(o.cpu, 1, S);  // random contents too (every slot a step reads it has written first)
  const int64_t pages = caches.per_seq;
  const Mem &bt = caches.bt, &cs = caches.cs;
  Mem ws(o.cpu, static_cast<size_t>(plan.workspace_bytes));
  StepInputs in(o.cpu, step, g);
  bool ok = ws.ok() && in.ok() && caches.fill(fill) && in.fill_all(fill);
  if (!ok) { r.error = kAllocFailed; return r; }
  const dsa::MlaCacheDesc mdesc = caches.mla_desc(d);
  const dsa::IndexerCacheDesc idesc = caches.idx_desc(d);

  Timer timer(o);
  std::vector<double> ms(static_cast<size_t>(nsteps), 0);
  std::vector<dsa::StepReport> reps(static_cast<size_t>(nsteps));
  // Pass 0 warms up (skipped with --warmup 0), pass 1 is timed, pass 2 records the stages.
  for (int pass = o.warmup > 0 ? 0 : 1; pass < 3 && ok; ++pass) {
    for (int64_t i = 0; i < nsteps && ok; ++i) {
      const int64_t s0 = i * step, n = std::min(step, S - s0);
      int32_t ql = static_cast<int32_t>(n), kl = static_cast<int32_t>(s0 + n);
      if (!in.refresh_tokens(fill)) { r.error = kAllocFailed; ok = false; break; }
      dsa::StepParams p = step_params(g, in, n, 1, &ql, &kl, bt, pages, cs, S, mdesc, idesc, ws, d);
      p.time_stages = pass == 2;
      timer.start();
      st = attn->step(p, pass == 2 ? &reps[static_cast<size_t>(i)] : nullptr);
      timer.stop();
      if (!st.ok()) { r.error = "step " + std::to_string(i) + ": " + st.to_string(); ok = false; break; }
      if (pass == 1 && !timer.ms(&ms[static_cast<size_t>(i)], &r.error)) { ok = false; break; }
      if (i == nsteps - 1) r.kernel = dsa::last_kernel_name();
    }
    const std::string e = sync(o);
    if (ok && !e.empty()) { r.error = e; ok = false; }
  }
  if (!ok) return r;
  // The host cost per layer, at the last step's batch (its tokens rewritten in place).
  HostCost hc;
  {
    const int64_t s0 = (nsteps - 1) * step, n = S - s0;
    int32_t ql = static_cast<int32_t>(n), kl = static_cast<int32_t>(S);
    const dsa::StepParams p = step_params(g, in, n, 1, &ql, &kl, bt, pages, cs, S, mdesc, idesc, ws, d);
    const std::string e = host_cost(o, *attn, p, 4, nullptr, 1, &hc);
    if (!e.empty()) { r.error = e; return r; }
  }

  Stages total;
  std::string steps_json;
  char line[512];
  r.text_extra = "    per step: ctx rows ms floor_ms x_floor | stages\n";
  for (int64_t i = 0; i < nsteps; ++i) {
    const size_t k = static_cast<size_t>(i);
    const int64_t s0 = i * step, n = std::min(step, S - s0);
    Stages one;
    one.add(reps[k]);
    total.add(reps[k]);
    r.ms += ms[k];
    const double floor_ms = (step_fp8[k] / o.fp8_tflops + step_bf16[k] / o.bf16_tflops) / 1e9;
    std::snprintf(line, sizeof(line),
                  "%s{\"ctx\": %lld, \"rows\": %lld, \"ms\": %.6f, \"flops\": %.6g, \"flops_fp8\": %.6g, \"floor_ms\": %.6f, "
                  "\"stages\": ",
                  i ? ", " : "", static_cast<long long>(s0 + n), static_cast<long long>(n), ms[k], step_fp8[k] + step_bf16[k],
                  step_fp8[k], floor_ms);
    steps_json += line + one.json() + "}";
    std::snprintf(line, sizeof(line), "    %8lld %6lld %9.3f %9.3f %7.2f | %s\n", static_cast<long long>(s0 + n),
                  static_cast<long long>(n), ms[k], floor_ms, floor_ms > 0 ? ms[k] / floor_ms : 0.0, one.text().c_str());
    r.text_extra += line;
  }
  r.ms_min = r.ms;
  // Rows per path, and the selection memory: the score region's high-water over the steps (the
  // plan's bytes of one chunk of a whole step's rows at S keys on each path follow below).
  int64_t fused_rows = 0, rows = 0, score_high = 0;
  for (const dsa::StepReport& rep : reps) {
    fused_rows += rep.fused_rows;
    rows += rep.rows[static_cast<int>(dsa::Route::kSparseScored)];
    score_high = std::max(score_high, rep.score_high_water_bytes);
  }
  r.json_extra = ", \"gpu_timed\": " + std::string(total.gpu ? "true" : "false") + ", \"stages\": " + total.json() +
                 ", \"steps\": [" + steps_json + "]" + ", \"workspace_bytes\": " + std::to_string(plan.workspace_bytes) +
                 ", \"select\": \"" + dsa::select_path_name(select) + "\", \"fused_rows\": " + std::to_string(fused_rows) +
                 ", \"scored_rows\": " + std::to_string(rows) + ", \"fused_min_width\": " +
                 std::to_string(plan.fused_select ? plan.fused_min_width : -1) +
                 ", \"score_high_water_bytes\": " + std::to_string(score_high) +
                 ", \"unfused_bytes_all_rows\": " + std::to_string(plan.unfused_bytes_all_rows) +
                 ", \"fused_bytes_all_rows\": " + std::to_string(plan.fused_bytes_all_rows) +
                 ", \"host_us_per_layer\": " + hc.json();
  std::snprintf(line, sizeof(line),
                "    select %s: %lld of %lld scored rows fused; score region high-water %s; one chunk of %lld rows at "
                "%lld keys: unfused %s, fused %s\n",
                dsa::select_path_name(select), static_cast<long long>(fused_rows), static_cast<long long>(rows),
                dsa::format_byte_size(score_high).c_str(), static_cast<long long>(step), static_cast<long long>(S),
                dsa::format_byte_size(plan.unfused_bytes_all_rows).c_str(),
                plan.fused_select                     ? dsa::format_byte_size(plan.fused_bytes_all_rows).c_str()
                : select == dsa::SelectPath::kUnfused ? "(not planned)"
                                                      : "(no fused kernel)");
  r.text_extra = line + r.text_extra;
  r.text_extra = std::string("    ") +
                 (o.cpu ? std::string("cpu stage ms, summed over the steps: ")
                        : total.gpu ? std::string("gpu stage ms, summed over the steps: ") : std::string(kNotMeasured) + "\n    host ms: ") +
                 total.text() + "\n" + hc.text() + r.text_extra;
  r.ok = true;
  return r;
}

Result bench_layer_decode(const Options& o, const Pools* pools, const std::string& preset, int64_t B, int64_t next_n,
                          int64_t ctx) {
  Result r;
  r.op = "layer_decode";
  r.shape = preset + " B=" + std::to_string(B) + " next_n=" + std::to_string(next_n) + " ctx=" + std::to_string(ctx);
  dsa::ModelGeometry g;
  dsa::Status st = dsa::geometry_preset(preset, &g);
  if (!st.ok()) { r.error = st.to_string(); return r; }
  const int64_t T = B * next_n;
  double fp8 = 0, bf16 = 0;
  for (int64_t b = 0; b < B; ++b) count_rows(ctx - next_n, next_n, ctx, g, &fp8, &bf16);
  r.work.flops = fp8 + bf16;
  r.work.flops_fp8 = fp8;
  r.work.fp8 = true;
  // Compulsory bytes: every sequence's indexer keys once (shared by its next_n rows) and its
  // distinct selected MLA keys once (at most next_n * topk of them).
  r.work.bytes = static_cast<double>(B) * ctx * dsa::kIndexerTokenBytes +
                 static_cast<double>(B) * std::min<int64_t>(ctx, next_n * g.topk) * dsa::kMlaBf16TokenBytes;

  dsa::Plan plan;
  std::unique_ptr<dsa::Attention> attn;
  if (!make_plan_for(o, g, T, B, ctx, next_n, dsa::kDefaultScoreBudgetBytes, &plan, &attn, &r.error)) return r;
  const dsa::Device d = layer_device(o);
  Filler fill(o, pools, 22);
  const LayerCaches caches(o.cpu, B, ctx);
  const int64_t per_seq = caches.per_seq;
  const Mem &bt = caches.bt, &cs = caches.cs;
  Mem ws(o.cpu, static_cast<size_t>(plan.workspace_bytes));
  bool ok = ws.ok() && caches.fill(fill);
  std::vector<std::unique_ptr<StepInputs>> sets;
  for (int s = 0; s < 2 && ok; ++s) {
    sets.push_back(std::make_unique<StepInputs>(o.cpu, T, g));
    ok = sets.back()->ok() && sets.back()->fill_all(fill);
  }
  if (!ok || !sync(o).empty()) { r.error = kAllocFailed; return r; }
  const dsa::MlaCacheDesc mdesc = caches.mla_desc(d);
  const dsa::IndexerCacheDesc idesc = caches.idx_desc(d);
  std::vector<int32_t> ql(static_cast<size_t>(B), static_cast<int32_t>(next_n)), kl(static_cast<size_t>(B), static_cast<int32_t>(ctx));
  auto params = [&](int s) {
    return step_params(g, *sets[static_cast<size_t>(s)], T, B, ql.data(), kl.data(), bt, per_seq, cs, ctx, mdesc, idesc, ws, d);
  };
  // warmup + iters steps, two input sets rotated; the median of the timed ones.
  Timer timer(o);
  std::vector<double> ms;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    timer.start();
    st = attn->step(params(i % 2), nullptr);
    timer.stop();
    if (!st.ok()) { r.error = st.to_string(); return r; }
    if (i == 0) r.kernel = dsa::last_kernel_name();
    double t = 0;
    if (i >= o.warmup) {
      if (!timer.ms(&t, &r.error)) return r;
      ms.push_back(t);
    }
  }
  const std::string e = sync(o);
  if (!e.empty()) { r.error = e; return r; }
  std::sort(ms.begin(), ms.end());
  r.ms = ms[ms.size() / 2];
  r.ms_min = ms.front();
  r.ok = true;
  // The stage split: the mean over a second series of steps with time_stages.
  Stages mean;
  const int n = std::max(1, o.iters);
  for (int i = 0; i < n; ++i) {
    dsa::StepParams p = params(i % 2);
    p.time_stages = true;
    dsa::StepReport rep;
    st = attn->step(p, &rep);
    if (!st.ok()) { r.ok = false; r.error = "stage series: " + st.to_string(); return r; }
    mean.add(rep, 1.0 / n);
  }
  if (!sync(o).empty()) { r.ok = false; r.error = "stage series: " + sync(o); return r; }
  // The host cost per layer: host-planned and device-length forms of the same batch.
  HostCost hc;
  {
    Mem dkv(o.cpu, static_cast<size_t>(B * 4));
    if (!dkv.ok() || !fill.upload(dkv, kl.data(), static_cast<size_t>(B * 4))) { r.ok = false; r.error = kAllocFailed; return r; }
    const std::string e = host_cost(o, *attn, params(0), 16, &dkv, next_n, &hc);
    if (!e.empty()) { r.ok = false; r.error = e; return r; }
  }
  r.json_extra = ", \"gpu_timed\": " + std::string(mean.gpu ? "true" : "false") + ", \"stages\": " + mean.json() +
                 ", \"workspace_bytes\": " + std::to_string(plan.workspace_bytes) + ", \"host_us_per_layer\": " + hc.json();
  r.text_extra = std::string("    ") +
                 (o.cpu ? std::string("cpu stage ms, mean per step: ")
                        : mean.gpu ? std::string("gpu stage ms, mean per step: ") : std::string(kNotMeasured) + "\n    host ms: ") +
                 mean.text() + "\n" + hc.text();
  return r;
}

}  // namespace dsa_bench

namespace dsa_bench {

// `dsa bench --op layer_core`: one batch of B fresh prompts of L tokens through the step in
// core mode (issue 14: q_nope / q_pe / kv_b_proj in, [T, H, v] out), three ways on the same
// inputs: the cost model's choice (short prompts go MHA form), dense in absorbed form
// (dense_form = absorbed), and forced through the sparse route (force_score: score, select,
// sparse attend, absorbed). Medians of the timed steps; r.ms is the cost model's.
Result bench_layer_core(const Options& o, const Pools* pools, const std::string& preset, int64_t B, int64_t L) {
  Result r;
  r.op = "layer_core";
  r.shape = preset + " B=" + std::to_string(B) + " len=" + std::to_string(L);
  dsa::ModelGeometry g;
  dsa::Status st = dsa::geometry_preset(preset, &g);
  if (!st.ok()) { r.error = st.to_string(); return r; }
  const int64_t T = B * L, H = g.num_heads, nope = g.qk_nope_head_dim, v = g.v_head_dim;
  // The MHA form's FLOPs (what the cost model picks for these prompts): decompression + pairs.
  const double pairs = static_cast<double>(B) * L * (L + 1) / 2.0;
  r.work.flops = 2.0 * 512 * H * (nope + v) * static_cast<double>(T) + 2.0 * H * (nope + 64 + v) * pairs;
  dsa::PlannerConfig c;
  c.geometry = g;
  c.page_size = kPage;
  c.max_tokens_per_step = T;
  c.max_seqs_per_step = B;
  c.max_context = L;
  c.device = layer_device(o);
  c.core_mode = true;
  dsa::Plan plan;
  std::unique_ptr<dsa::Attention> attn;
  st = dsa::make_plan(c, &plan);
  if (st.ok()) st = dsa::Attention::create(plan, &attn);
  if (!st.ok()) { r.error = "plan: " + st.to_string(); return r; }
  const dsa::Device d = layer_device(o);
  Filler fill(o, pools, 23);
  const LayerCaches caches(o.cpu, B, L);
  const int64_t per_seq = caches.per_seq;
  const Mem &bt = caches.bt, &cs = caches.cs;
  Mem ws(o.cpu, static_cast<size_t>(plan.workspace_bytes));
  Mem qn(o.cpu, static_cast<size_t>(T * H * nope * 2)), qp(o.cpu, static_cast<size_t>(T * H * 64 * 2));
  Mem w(o.cpu, static_cast<size_t>(H * (nope + v) * 512 * 2)), out(o.cpu, static_cast<size_t>(T * H * v * 2));
  StepInputs in(o.cpu, T, g);
  bool ok = ws.ok() && qn.ok() && qp.ok() && w.ok() && out.ok() && in.ok() && caches.fill(fill) &&
            in.refresh_tokens(fill) && fill.bf16(qn) && fill.bf16(qp) && fill.bf16(w);
  if (!ok || !sync(o).empty()) { r.error = kAllocFailed; return r; }
  const dsa::MlaCacheDesc mdesc = caches.mla_desc(d);
  const dsa::IndexerCacheDesc idesc = caches.idx_desc(d);
  std::vector<int32_t> ql(static_cast<size_t>(B), static_cast<int32_t>(L)), kl(static_cast<size_t>(B), static_cast<int32_t>(L));
  // mode 0: cost model; 1: dense absorbed; 2: forced sparse.
  auto params = [&](int mode) {
    dsa::StepParams p = step_params(g, in, T, B, ql.data(), kl.data(), bt, per_seq, cs, L, mdesc, idesc, ws, d);
    p.q = dsa::TensorDesc{};
    p.q_nope = dsa::make_tensor(qn.get(), dsa::DType::kBF16, {T, H, nope}, d);
    p.q_pe = dsa::make_tensor(qp.get(), dsa::DType::kBF16, {T, H, 64}, d);
    p.kv_b_proj = dsa::make_tensor(w.get(), dsa::DType::kBF16, {H * (nope + v), 512}, d);
    p.out = dsa::make_tensor(out.get(), dsa::DType::kBF16, {T, H, v}, d);
    p.dense_form = mode == 1 ? dsa::DenseForm::kAbsorbed : dsa::DenseForm::kAuto;
    p.force_score = mode == 2;
    return p;
  };
  Timer timer(o);
  double med[3] = {0, 0, 0};
  int64_t mha_seqs = 0;
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<double> ms;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      dsa::StepReport rep;
      timer.start();
      st = attn->step(params(mode), &rep);
      timer.stop();
      if (!st.ok()) { r.error = "mode " + std::to_string(mode) + ": " + st.to_string(); return r; }
      if (mode == 0 && i == 0) { r.kernel = dsa::last_kernel_name(); mha_seqs = rep.mha_seqs; }
      double t = 0;
      if (i >= o.warmup) {
        if (!timer.ms(&t, &r.error)) return r;
        ms.push_back(t);
      }
    }
    if (ms.empty()) { r.error = "no timed steps (--iters 0)"; return r; }
    std::sort(ms.begin(), ms.end());
    med[mode] = ms[ms.size() / 2];
  }
  const std::string e = sync(o);
  if (!e.empty()) { r.error = e; return r; }
  r.ms = r.ms_min = med[0];
  r.ok = true;
  char b[400];
  std::snprintf(b, sizeof(b),
                "    core mode, cost model (%lld of %lld sequences MHA form) %.3f ms | dense absorbed %.3f ms | forced sparse %.3f ms"
                " | sparse / cost model %.2fx\n",
                static_cast<long long>(mha_seqs), static_cast<long long>(B), med[0], med[1], med[2], med[2] / med[0]);
  r.text_extra = b;
  std::snprintf(b, sizeof(b),
                ", \"mha_seqs\": %lld, \"ms_cost_model\": %.6f, \"ms_dense_absorbed\": %.6f, \"ms_forced_sparse\": %.6f, "
                "\"workspace_bytes\": %lld",
                static_cast<long long>(mha_seqs), med[0], med[1], med[2], static_cast<long long>(plan.workspace_bytes));
  r.json_extra = b;
  return r;
}

}  // namespace dsa_bench
