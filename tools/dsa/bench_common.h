// Shared pieces of `dsa bench` (cmd_bench.cpp: options, the per-op benchmarks and the output;
// bench_layer.cpp: the layer benchmarks): options, device buffers, random input pools, timing
// and floors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsa/dsa.h"

#if defined(DSA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsa_bench {

// Ceilings of the lent H200 as given in the project brief (bf16 GEMM ~780 TFLOP/s, fp8 GEMM
// ~1420 TFLOP/s, device copy ~4.25 TB/s counting read + write; see docs/perf.md). Override with
// --bf16-tflops / --fp8-tflops / --copy-tbs on other devices.
constexpr double kBf16Tflops = 780.0;
constexpr double kFp8Tflops = 1420.0;
constexpr double kCopyTBs = 4.25;

struct Options {
  bool quick = false;
  bool help = false;  // --help: usage printed, nothing else to do
  bool json = false;
  std::string json_path;  // empty: stdout
  std::vector<std::string> ops;  // empty: all
  int warmup = 3;
  int iters = 30;
  int device = 0;
  double bf16_tflops = kBf16Tflops;
  double fp8_tflops = kFp8Tflops;
  double copy_tbs = kCopyTBs;
  // The layer benchmarks only: the backend, and sizes in place of the default shapes.
  bool cpu = false;                 // --backend cpu (the host times are the device times)
  std::string preset;               // --preset: one preset instead of both
  int64_t prefill_S = 0, prefill_step = 0;             // --prefill S,step
  int64_t decode_B = 0, decode_next_n = 0, decode_ctx = 0;  // --decode B,next_n,ctx
  int64_t core_B = 4, core_len = 2048;                 // --core B,LEN (layer_core)
  // --select: layer_prefill's selection paths: "both" (default) runs the plan's own choice
  // (auto) and, where the device has the fused kernel, the unfused path beside it; or one of
  // auto, unfused, fused alone.
  std::string select = "both";
};

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 7) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {
    const uint64_t z = next();
    float acc = 0.f;
    for (int i = 0; i < 4; ++i) acc += static_cast<float>((z >> (16 * i)) & 0xffff) * (1.f / 65536.f);
    return (acc - 2.f) * 1.7320508f;
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

struct Work {
  double flops = 0;
  double bytes = 0;
  bool fp8 = false;  // which tensor-core ceiling bounds the FLOPs
  // Mixed work (the layer benchmarks): flops_fp8 of the FLOPs run at the fp8 ceiling, the rest
  // at bf16, one after the other (compute floor = fp8 part / fp8 peak + rest / bf16 peak).
  double flops_fp8 = -1;
};

struct Result {
  std::string op, shape;
  bool ok = false;
  std::string error;
  double ms = 0, ms_min = 0;
  Work work;
  double floor_ms = 0;
  const char* bound = "";
  std::string kernel;      // dsa::last_kernel_name() after the op ("" on the CPU)
  std::string json_extra;  // more JSON members (", \"stages\": {...}"), the layer benchmarks
  std::string text_extra;  // more lines under the table row
};

inline void set_floor(const Options& o, Result* r) {
  const double t_bytes = r->work.bytes / (o.copy_tbs * 1e12) * 1e3;
  if (r->work.flops_fp8 >= 0) {
    const double t_flops = (r->work.flops_fp8 / o.fp8_tflops + (r->work.flops - r->work.flops_fp8) / o.bf16_tflops) / 1e9;
    r->floor_ms = std::max(t_flops, t_bytes);
    r->bound = t_flops >= t_bytes ? "fp8+bf16" : "memory";
    return;
  }
  const double peak = (r->work.fp8 ? o.fp8_tflops : o.bf16_tflops) * 1e12;
  const double t_flops = r->work.flops / peak * 1e3;
  r->floor_ms = std::max(t_flops, t_bytes);
  r->bound = t_flops >= t_bytes ? (r->work.fp8 ? "fp8" : "bf16") : "memory";
}

#if defined(DSA_WITH_CUDA)

// ---- device memory and random inputs ---------------------------------------------------------
class Buf {
 public:
  Buf() = default;
  explicit Buf(size_t bytes) : bytes_(bytes) {
    if (bytes && cudaMalloc(&p_, bytes) != cudaSuccess) {
      cudaGetLastError();
      p_ = nullptr;
    }
  }
  Buf(Buf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  Buf& operator=(Buf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  Buf(const Buf&) = delete;
  ~Buf() {
    if (p_) cudaFree(p_);
  }
  void* get() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  bool ok() const { return bytes_ == 0 || p_ != nullptr; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};


// A device pool of random values of one kind; big buffers are filled by copying 1 MiB pieces
// from random offsets of it (generating gigabytes on the host would dominate the run).
class Pool {
 public:
  Pool(const std::vector<uint8_t>& host, size_t unit) : unit_(unit), dev_(host.size()) {
    ok_ = dev_.ok() && cudaMemcpy(dev_.get(), host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  const void* data() const { return dev_.get(); }
  size_t bytes() const { return dev_.bytes(); }
  bool fill(void* dst, size_t bytes, Rng& rng) const {
    if (!ok_) return false;
    const size_t piece_max = std::min<size_t>(1 << 20, dev_.bytes() / 2) / unit_ * unit_;
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (size_t off = 0; off < bytes; off += piece_max) {
      const size_t n = std::min(piece_max, bytes - off);
      const size_t units = (dev_.bytes() - n) / unit_;
      const size_t src = (units ? rng.next() % units : 0) * unit_;
      if (cudaMemcpyAsync(d + off, dev_.as<uint8_t>() + src, n, cudaMemcpyDeviceToDevice) != cudaSuccess) return false;
    }
    return true;
  }

 private:
  size_t unit_;
  Buf dev_;
  bool ok_ = false;
};

struct Pools {
  Pool f32, bf16, e4m3, pow2, mla_fp8;
  static std::vector<uint8_t> make(size_t n, size_t unit, const std::function<void(uint8_t*, Rng&)>& gen, uint64_t seed) {
    std::vector<uint8_t> v(n * unit);
    Rng rng(seed);
    for (size_t i = 0; i < n; ++i) gen(v.data() + i * unit, rng);
    return v;
  }
  Pools()
      : f32(make(8u << 20, 4, [](uint8_t* p, Rng& r) { const float x = r.normal(); std::memcpy(p, &x, 4); }, 1), 4),
        bf16(make(8u << 20, 2, [](uint8_t* p, Rng& r) { const uint16_t b = dsa::float_to_bf16(r.normal()); std::memcpy(p, &b, 2); }, 2), 2),
        e4m3(make(16u << 20, 1, [](uint8_t* p, Rng& r) { *p = dsa::quantize_e4m3(r.normal() * 64.f, 1.f); }, 3), 1),
        pow2(make(1u << 18, 4, [](uint8_t* p, Rng& r) { const float x = std::ldexp(1.f, -4 - static_cast<int>(r.next() % 6)); std::memcpy(p, &x, 4); }, 4), 4),
        mla_fp8(make(1u << 15, dsa::kMlaFp8TokenBytes, [](uint8_t* p, Rng& r) {
          for (int i = 0; i < 512; ++i) p[i] = dsa::quantize_e4m3(r.normal() * 64.f, 1.f);
          for (int t = 0; t < 4; ++t) { const float s = 1.f / 64.f; std::memcpy(p + 512 + 4 * t, &s, 4); }
          for (int i = 0; i < 64; ++i) { const uint16_t b = dsa::float_to_bf16(r.normal()); std::memcpy(p + 528 + 2 * i, &b, 2); }
        }, 5), dsa::kMlaFp8TokenBytes) {}
};

// ---- measurement --------------------------------------------------------------------------------

// Runs op(set) warmup + iters times, rotating sets; fills ms with the median of the timed runs.
inline bool time_op(const Options& o, int sets, const std::function<dsa::Status(int)>& op, Result* r) {
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(o.iters));
  for (auto& e : ev) cudaEventCreate(&e);
  bool ok = true;
  for (int i = 0; i < o.warmup && ok; ++i) {
    const dsa::Status st = op(i % sets);
    if (!st.ok()) { r->error = st.to_string(); ok = false; }
    if (i == 0) r->kernel = dsa::last_kernel_name();
  }
  for (int i = 0; i < o.iters && ok; ++i) {
    cudaEventRecord(ev[2 * i]);
    const dsa::Status st = op((o.warmup + i) % sets);
    cudaEventRecord(ev[2 * i + 1]);
    if (!st.ok()) { r->error = st.to_string(); ok = false; }
    if (i == 0 && o.warmup == 0) r->kernel = dsa::last_kernel_name();
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (ok && e != cudaSuccess) { r->error = std::string("device error: ") + cudaGetErrorString(e); ok = false; }
  if (ok) {
    std::vector<double> ms(static_cast<size_t>(o.iters));
    for (int i = 0; i < o.iters; ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]);
      ms[static_cast<size_t>(i)] = t;
    }
    std::sort(ms.begin(), ms.end());
    r->ms = ms[ms.size() / 2];
    r->ms_min = ms.front();
  }
  for (auto& e2 : ev) cudaEventDestroy(e2);
  r->ok = ok;
  return ok;
}


inline int rotation_sets(const Options& o, double bytes_per_set) {
  // Enough sets that one pass over them exceeds the 50 MB L2 twice; at least 2.
  int n = bytes_per_set > 0 ? static_cast<int>(100e6 / bytes_per_set) + 1 : 2;
  return std::max(2, std::min(n, o.quick ? 2 : 4));
}

inline dsa::Device dev0(const Options& o) { return dsa::cuda_device(o.device); }

inline std::string fail_alloc() { return "device allocation or fill failed"; }

#endif  // DSA_WITH_CUDA

// The layer benchmarks (bench_layer.cpp), on CUDA (pools: the device's random pools) or, with
// o.cpu, on the CPU (pools unused, may be null).
struct Pools;
// select: the plan's PlannerConfig::select; shape_suffix names a forced path in the shape.
Result bench_layer_prefill(const Options& o, const Pools* pools, const std::string& preset, int64_t S, int64_t step,
                           int64_t budget, dsa::SelectPath select, const std::string& shape_suffix);
Result bench_layer_decode(const Options& o, const Pools* pools, const std::string& preset, int64_t B, int64_t next_n,
                          int64_t ctx);
// One batch of B fresh prompts of L tokens through the step in core mode (cost model, dense
// absorbed, forced sparse).
Result bench_layer_core(const Options& o, const Pools* pools, const std::string& preset, int64_t B, int64_t L);

}  // namespace dsa_bench
