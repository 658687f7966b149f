// GPU sparse and dense MLA attention against a float64 reference and the CPU backend.
// Every test skips cleanly without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_ops.h"
#include "dsa/dsa.h"
#include "gpu_util.h"
#include "test_util.h"

namespace {

using dsa::DType;
using dsa::Status;
using dsa::TensorDesc;
using dsa_gpu_test::DeviceBuffer;
using dsa_gpu_test::device_is_sm90;
using dsa_gpu_test::ScopedEnv;

constexpr int64_t D = 576, DV = 512;
constexpr float kScale = 0.13523f;  // DeepSeek-V3.2's sm_scale
const double kInf = std::numeric_limits<double>::infinity();

// ---- inputs -------------------------------------------------------------------------------
// Cheap deterministic normal-ish values (large shapes make std::normal_distribution slow).
struct FastRng {
  uint64_t s;
  explicit FastRng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {  // Irwin-Hall(4), scaled to unit variance
    const uint64_t z = next();
    float acc = 0.f;
    for (int i = 0; i < 4; ++i) acc += static_cast<float>((z >> (16 * i)) & 0xffff) * (1.f / 65536.f);
    return (acc - 2.f) * 1.7320508f;
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

enum class KvMode { kFlat, kPagedBf16, kPagedFp8 };

// Keys in their byte form, plus what the reference sees.
struct HostKv {
  KvMode mode = KvMode::kFlat;
  int64_t num_keys = 0;      // flat rows or cache slots
  int64_t flat_stride = D;   // elements (flat)
  int64_t page = 64, num_blocks = 0, block_stride = 0;  // paged; block_stride 0 = packed
  std::vector<uint8_t> bytes;
  std::vector<double> value;  // [num_keys][576] exact key values (NaN where poisoned)
  std::vector<double> orig;   // [num_keys][576] latents before rounding/quantisation

  int64_t token_bytes() const { return mode == KvMode::kPagedFp8 ? dsa::kMlaFp8TokenBytes : dsa::kMlaBf16TokenBytes; }
  int64_t block_bytes() const { return block_stride ? block_stride : page * token_bytes(); }
  dsa::MlaKv desc(void* data, dsa::Device dev) const {
    dsa::MlaKv kv;
    if (mode == KvMode::kFlat) {
      kv.flat = dsa::make_tensor(data, DType::kBF16, {num_keys, D}, dev);
      kv.flat.stride[0] = flat_stride;
    } else {
      kv.paged.data = data;
      kv.paged.dtype = mode == KvMode::kPagedFp8 ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
      kv.paged.num_blocks = num_blocks;
      kv.paged.page_size = page;
      kv.paged.block_stride_bytes = block_stride;
      kv.paged.device = dev;
    }
    return kv;
  }
  uint8_t* token(int64_t s) {
    if (mode == KvMode::kFlat) return bytes.data() + s * flat_stride * 2;
    return bytes.data() + (s / page) * block_bytes() + (s % page) * token_bytes();
  }
};

// Builds keys; slots with used(s) false (and all padding) hold NaN bytes.
HostKv make_kv(KvMode mode, int64_t num_keys_or_blocks, int64_t page, uint64_t seed,
               const std::function<bool(int64_t)>& used = nullptr, int64_t pad = 0, bool vary_tiles = true) {
  HostKv kv;
  kv.mode = mode;
  if (mode == KvMode::kFlat) {
    kv.num_keys = num_keys_or_blocks;
    kv.flat_stride = D + pad;
    kv.bytes.assign(static_cast<size_t>(kv.num_keys * kv.flat_stride * 2), 0xFF);
  } else {
    kv.num_blocks = num_keys_or_blocks;
    kv.page = page;
    kv.block_stride = pad ? page * kv.token_bytes() + pad : 0;
    kv.num_keys = kv.num_blocks * page;
    kv.bytes.assign(static_cast<size_t>(kv.num_blocks * kv.block_bytes()), 0xFF);
  }
  kv.value.assign(static_cast<size_t>(kv.num_keys * D), std::nan(""));
  kv.orig.assign(static_cast<size_t>(kv.num_keys * D), std::nan(""));
  FastRng rng(seed);
  float x[D];
  for (int64_t s = 0; s < kv.num_keys; ++s) {
    if (used && !used(s)) continue;
    for (int tile = 0; tile < 4; ++tile) {
      // Tiles of different magnitude exercise the per-tile FP8 scales.
      const float mag = vary_tiles ? std::ldexp(1.f, static_cast<int>(rng.below(7)) - 3) : 1.f;
      for (int i = 0; i < 128; ++i) x[tile * 128 + i] = rng.normal() * mag;
    }
    for (int i = 512; i < D; ++i) x[i] = rng.normal();
    double* val = kv.value.data() + s * D;
    double* org = kv.orig.data() + s * D;
    for (int i = 0; i < D; ++i) org[i] = x[i];
    uint8_t* tok = kv.token(s);
    if (mode != KvMode::kPagedFp8) {
      for (int i = 0; i < D; ++i) {
        const uint16_t b = dsa::float_to_bf16(x[i]);
        std::memcpy(tok + 2 * i, &b, 2);
        val[i] = dsa::bf16_to_float(b);
      }
      continue;
    }
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(dsa::round_to_bf16(x[tile * 128 + i])));
      const float sc = dsa::ue8m0_scale(amax);
      std::memcpy(tok + dsa::kMlaFp8ScaleOffset + 4 * tile, &sc, 4);
      for (int i = 0; i < 128; ++i) {
        const uint8_t q8 = dsa::quantize_e4m3(dsa::round_to_bf16(x[tile * 128 + i]), 1.f / sc);
        tok[tile * 128 + i] = q8;
        val[tile * 128 + i] = static_cast<double>(dsa::e4m3_to_float(q8)) * sc;
      }
    }
    for (int i = 512; i < D; ++i) {
      const uint16_t b = dsa::float_to_bf16(x[i]);
      std::memcpy(tok + dsa::kMlaFp8RopeOffset + 2 * (i - 512), &b, 2);
      val[i] = dsa::bf16_to_float(b);
    }
  }
  return kv;
}

struct Queries {
  int64_t T = 0, H = 0, s1 = D, s0 = 0;  // strides in elements
  std::vector<uint16_t> data;
  double at(int64_t t, int64_t h, int64_t d) const { return dsa::bf16_to_float(data[t * s0 + h * s1 + d]); }
};

Queries make_q(int64_t T, int64_t H, uint64_t seed, int64_t pad = 0) {
  Queries q;
  q.T = T;
  q.H = H;
  q.s1 = D + pad;
  q.s0 = H * q.s1;
  q.data.assign(static_cast<size_t>(std::max<int64_t>(T * q.s0, 1)), 0xFFFF);
  FastRng rng(seed);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) q.data[t * q.s0 + h * q.s1 + d] = dsa::float_to_bf16(rng.normal());
  return q;
}

// ---- float64 reference ------------------------------------------------------------------------
struct Ref {
  int64_t T = 0, H = 0;
  std::vector<double> out, lse, out_scale, score_scale;
  std::vector<char> done;  // [T][H]: computed
};

// keys_of(t) gives the slots token t attends to (already filtered to valid ones).
Ref reference(const HostKv& kv, const Queries& q, const std::function<std::vector<int64_t>(int64_t)>& keys_of,
              const std::vector<float>& sink, const std::vector<int64_t>& tokens, const std::vector<int64_t>& heads) {
  Ref r;
  r.T = q.T;
  r.H = q.H;
  r.out.assign(static_cast<size_t>(q.T * q.H * DV), 0.0);
  r.out_scale.assign(r.out.size(), 0.0);
  r.lse.assign(static_cast<size_t>(q.T * q.H), kInf);
  r.score_scale.assign(r.lse.size(), 0.0);
  r.done.assign(r.lse.size(), 0);
  std::vector<double> s, a;
  for (int64_t t : tokens) {
    const std::vector<int64_t> keys = keys_of(t);
    for (int64_t h : heads) {
      const size_t row = static_cast<size_t>(t * q.H + h);
      r.done[row] = 1;
      if (keys.empty()) continue;
      s.assign(keys.size(), 0.0);
      double m = -kInf, sc = 0.0;
      for (size_t j = 0; j < keys.size(); ++j) {
        const double* k = kv.value.data() + keys[j] * D;
        double dot = 0.0, mag = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          dot += q.at(t, h, d) * k[d];
          mag += std::fabs(q.at(t, h, d) * k[d]);
        }
        s[j] = kScale * dot;
        m = std::max(m, s[j]);
        sc = std::max(sc, kScale * mag);
      }
      double l = 0.0;
      for (double& v : s) l += (v = std::exp(v - m));
      const double lse = m + std::log(l);
      double f = 1.0 / l;
      if (!sink.empty()) f /= 1.0 + std::exp(static_cast<double>(sink[h]) - lse);
      a.assign(2 * DV, 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const double* k = kv.value.data() + keys[j] * D;
        for (int64_t d = 0; d < DV; ++d) {
          a[d] += s[j] * k[d];
          a[DV + d] += s[j] * std::fabs(k[d]);
        }
      }
      for (int64_t d = 0; d < DV; ++d) {
        r.out[row * DV + d] = a[d] * f;
        r.out_scale[row * DV + d] = a[DV + d] * f;
      }
      r.lse[row] = lse;
      r.score_scale[row] = sc;
    }
  }
  return r;
}

std::vector<int64_t> all_of(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// ---- running the op ---------------------------------------------------------------------------
struct Result {
  Status status;
  std::vector<float> out;  // [T][H][512] as f32
  std::vector<float> lse;  // [T][H]
  std::vector<uint8_t> raw;  // the out buffer's bytes (for bit-identity and padding checks)
  size_t workspace = 0;
};

struct OutSpec {
  DType dtype = DType::kBF16;
  int64_t pad = 0;  // extra elements per head row (left untouched)
};

std::vector<float> decode_out(const std::vector<uint8_t>& raw, DType dt, int64_t T, int64_t H, int64_t s1) {
  std::vector<float> o(static_cast<size_t>(T * H * DV));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < DV; ++d) {
        const int64_t e = (t * H + h) * s1 + d;
        if (dt == DType::kBF16) {
          uint16_t b;
          std::memcpy(&b, raw.data() + 2 * e, 2);
          o[(t * H + h) * DV + d] = dsa::bf16_to_float(b);
        } else {
          std::memcpy(&o[(t * H + h) * DV + d], raw.data() + 4 * e, 4);
        }
      }
  return o;
}

// The tensors an op reads, as host vectors; run() places them on the GPU or the CPU.
struct SparseInputs {
  Queries q;
  std::vector<int32_t> indices;  // [T][K]
  int64_t K = 0;
  std::vector<int32_t> topk_length;
  std::vector<float> sink;
};

struct DenseInputs {
  Queries q;
  std::vector<int32_t> cu_q, cu_k, block_table, kv_lens;
  int64_t max_blocks = 0;
  std::vector<float> sink;
};

TensorDesc vec_i32(void* p, int64_t n, dsa::Device dev) { return dsa::make_tensor(p, DType::kI32, {n}, dev); }

// One buffer per host vector, on the device or aliasing host memory.
struct Place {
  explicit Place(bool on_gpu) : gpu(on_gpu) {}
  bool gpu;
  std::vector<std::unique_ptr<DeviceBuffer>> held;
  bool ok = true;
  template <typename T>
  void* put(const std::vector<T>& h) {
    if (!gpu) return const_cast<T*>(h.data());
    held.emplace_back(new DeviceBuffer(h));
    ok = ok && (h.empty() || held.back()->data() != nullptr);
    return held.back()->data();
  }
  void* scratch(size_t bytes, int fill) {
    if (bytes == 0) return nullptr;
    held.emplace_back(new DeviceBuffer(bytes, fill));
    ok = ok && held.back()->data() != nullptr;
    return held.back()->data();
  }
  dsa::Device dev() const { return gpu ? dsa::cuda_device(0) : dsa::cpu_device(); }
};

template <class Params, class Query, class Op>
Result finish(Place& pl, Params& p, const Queries& q, const OutSpec& os, std::vector<uint8_t>& out_host,
              std::vector<float>& lse_host, Query query, Op op) {
  Result r;
  const int64_t s1 = DV + os.pad;
  const size_t out_bytes = static_cast<size_t>(q.T * q.H * s1) * dsa::dtype_size(os.dtype);
  void* out = pl.gpu ? pl.scratch(std::max<size_t>(out_bytes, 1), 0xFF) : out_host.data();
  void* lse = pl.gpu ? pl.scratch(std::max<size_t>(q.T * q.H * 4, 1), 0xFF) : lse_host.data();
  p.out = dsa::make_tensor(out, os.dtype, {q.T, q.H, DV}, pl.dev());
  p.out.stride[1] = s1;
  p.out.stride[0] = q.H * s1;
  p.lse = dsa::make_tensor(lse, DType::kF32, {q.T, q.H}, pl.dev());
  r.workspace = query(p);
  if (pl.gpu) {
    p.workspace = pl.scratch(r.workspace, 0xFF);
    p.workspace_bytes = r.workspace;
  }
  r.status = op(p);
  if (pl.gpu) {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) r.status = Status(dsa::StatusCode::kDeviceError, std::string("after the op: ") + cudaGetErrorString(e));
    if (out_bytes && cudaMemcpy(out_host.data(), out, out_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      r.status = Status(dsa::StatusCode::kDeviceError, "copy");
    if (q.T * q.H > 0 && cudaMemcpy(lse_host.data(), lse, q.T * q.H * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      r.status = Status(dsa::StatusCode::kDeviceError, "copy");
  }
  if (!pl.ok) r.status = Status(dsa::StatusCode::kDeviceError, "device allocation or upload failed");
  r.raw = out_host;
  r.out = decode_out(out_host, os.dtype, q.T, q.H, s1);
  r.lse = lse_host;
  return r;
}

Result run_sparse(const HostKv& kv, const SparseInputs& in, bool gpu, OutSpec os = {}) {
  Place pl(gpu);
  const Queries& q = in.q;
  dsa::SparseMlaParams p;
  p.q = dsa::make_tensor(pl.put(q.data), DType::kBF16, {q.T, q.H, D}, pl.dev());
  p.q.stride[0] = q.s0;
  p.q.stride[1] = q.s1;
  p.kv = kv.desc(pl.put(kv.bytes), pl.dev());
  p.indices = dsa::make_tensor(pl.put(in.indices), DType::kI32, {q.T, in.K}, pl.dev());
  if (!in.topk_length.empty()) p.topk_length = vec_i32(pl.put(in.topk_length), q.T, pl.dev());
  if (!in.sink.empty()) p.attn_sink = dsa::make_tensor(pl.put(in.sink), DType::kF32, {q.H}, pl.dev());
  p.sm_scale = kScale;
  std::vector<uint8_t> out_host(static_cast<size_t>(q.T * q.H * (DV + os.pad)) * dsa::dtype_size(os.dtype), 0xFF);
  std::vector<float> lse_host(static_cast<size_t>(q.T * q.H), 0.f);
  return finish(pl, p, q, os, out_host, lse_host, [](const dsa::SparseMlaParams& x) { return dsa::sparse_mla_workspace_size(x); },
                [](const dsa::SparseMlaParams& x) { return dsa::sparse_mla(x); });
}

Result run_dense(const HostKv& kv, const DenseInputs& in, bool gpu, OutSpec os = {}) {
  Place pl(gpu);
  const Queries& q = in.q;
  const int64_t B = static_cast<int64_t>(in.cu_q.size()) - 1;
  dsa::DenseMlaParams p;
  p.q = dsa::make_tensor(pl.put(q.data), DType::kBF16, {q.T, q.H, D}, pl.dev());
  p.q.stride[0] = q.s0;
  p.q.stride[1] = q.s1;
  p.kv = kv.desc(pl.put(kv.bytes), pl.dev());
  p.cu_seqlens_q = vec_i32(pl.put(in.cu_q), B + 1, pl.dev());
  if (kv.mode == KvMode::kFlat) {
    p.cu_seqlens_k = vec_i32(pl.put(in.cu_k), B + 1, pl.dev());
  } else {
    p.block_table = dsa::make_tensor(pl.put(in.block_table), DType::kI32, {B, in.max_blocks}, pl.dev());
    p.kv_lens = vec_i32(pl.put(in.kv_lens), B, pl.dev());
  }
  if (!in.sink.empty()) p.attn_sink = dsa::make_tensor(pl.put(in.sink), DType::kF32, {q.H}, pl.dev());
  p.sm_scale = kScale;
  std::vector<uint8_t> out_host(static_cast<size_t>(q.T * q.H * (DV + os.pad)) * dsa::dtype_size(os.dtype), 0xFF);
  std::vector<float> lse_host(static_cast<size_t>(q.T * q.H), 0.f);
  return finish(pl, p, q, os, out_host, lse_host, [](const dsa::DenseMlaParams& x) { return dsa::dense_mla_workspace_size(x); },
                [](const dsa::DenseMlaParams& x) { return dsa::dense_mla(x); });
}

// Key lists by the SPEC's rules, for the reference.
std::function<std::vector<int64_t>(int64_t)> sparse_keys(const HostKv& kv, const SparseInputs& in) {
  return [&kv, &in](int64_t t) {
    std::vector<int64_t> keys;
    int64_t n = in.K;
    if (!in.topk_length.empty()) n = std::max<int64_t>(0, std::min<int64_t>(in.topk_length[t], in.K));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t idx = in.indices[t * in.K + j];
      if (idx >= 0 && idx < kv.num_keys) keys.push_back(idx);
    }
    return keys;
  };
}

std::function<std::vector<int64_t>(int64_t)> dense_keys(const HostKv& kv, const DenseInputs& in) {
  return [&kv, &in](int64_t t) {
    std::vector<int64_t> keys;
    const int64_t B = static_cast<int64_t>(in.cu_q.size()) - 1;
    for (int64_t b = 0; b < B; ++b) {
      if (t < in.cu_q[b] || t >= in.cu_q[b + 1]) continue;
      const int64_t q_len = in.cu_q[b + 1] - in.cu_q[b];
      const int64_t kv_len = kv.mode == KvMode::kFlat ? in.cu_k[b + 1] - in.cu_k[b] : in.kv_lens[b];
      const int64_t L = std::min(kv_len, kv_len - q_len + (t - in.cu_q[b]) + 1);
      for (int64_t j = 0; j < L; ++j) {
        if (kv.mode == KvMode::kFlat) {
          keys.push_back(in.cu_k[b] + j);
          continue;
        }
        const int64_t col = j / kv.page;
        if (col >= in.max_blocks) continue;
        const int64_t blk = in.block_table[b * in.max_blocks + col];
        if (blk < 0 || blk >= kv.num_blocks) continue;  // a bad entry makes its keys invalid
        keys.push_back(blk * kv.page + j % kv.page);
      }
    }
    return keys;
  };
}

// ---- comparison ---------------------------------------------------------------------------------
// Output error in bf16 steps at the magnitude of the terms that formed the value
// (max(|ref|, Σ p |v|)): P enters the tensor cores as bf16, which costs up to 2^-9 of that.
// `score_err` is the scores' own f32 rounding budget (natural-log units): a score off by e
// moves its weight by a factor exp(e), so the output may move by 2 e · Σ p |v| more.
double out_steps(double got, double ref, double scale, double score_err) {
  if (std::isnan(got)) return kInf;
  const double mag = std::max(std::fabs(ref), scale);
  if (mag == 0.0) return got == 0.0 ? 0.0 : kInf;
  const double err = std::max(0.0, std::fabs(got - ref) - 2.0 * score_err * scale);
  return err / std::ldexp(1.0, std::ilogb(mag) - 7);
}

// Scores are 576-term f32 dot products (tensor cores on the GPU): 64 f32 steps of their
// magnitude Σ|q k| bounds the rounding with room.
double score_budget(double score_scale) { return 64 * std::ldexp(1.0, -23) * score_scale; }

// Compares `got` with `ref` on the computed rows; `other` (optional) is another backend's
// result whose errors add to the tolerance.
void expect_matches(const Result& got, const Ref& ref, double max_steps, const char* what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.to_string();
  int64_t bad = 0, checked = 0;
  double worst = 0.0;
  std::string first;
  for (int64_t row = 0; row < ref.T * ref.H; ++row) {
    if (!ref.done[row]) continue;
    ++checked;
    const double rl = ref.lse[row], gl = got.lse[row];
    if (std::isinf(rl)) {
      // No valid key: lse exactly +inf, out exactly 0.
      bool zero = true;
      for (int64_t d = 0; d < DV; ++d) zero = zero && got.out[row * DV + d] == 0.f && !std::signbit(got.out[row * DV + d]);
      if (!(std::isinf(gl) && gl > 0) || !zero) {
        ++bad;
        if (first.empty()) first = "row " + std::to_string(row) + ": expected lse +inf and out 0, got lse " + std::to_string(gl);
      }
      continue;
    }
    const double score_err = score_budget(ref.score_scale[row]);
    const double lse_tol = score_err + 64 * std::ldexp(1.0, -23) * std::fabs(rl) + 1e-6;
    if (!(std::fabs(gl - rl) <= lse_tol)) {
      ++bad;
      if (first.empty()) first = "row " + std::to_string(row) + ": lse " + std::to_string(gl) + " vs " + std::to_string(rl);
    }
    for (int64_t d = 0; d < DV; ++d) {
      const size_t e = static_cast<size_t>(row * DV + d);
      const double st = out_steps(got.out[e], ref.out[e], ref.out_scale[e], score_err);
      worst = std::max(worst, st);
      if (!(st <= max_steps)) {
        ++bad;
        if (first.empty())
          first = "row " + std::to_string(row) + " dim " + std::to_string(d) + ": " + std::to_string(got.out[e]) +
                  " vs " + std::to_string(ref.out[e]) + " (" + std::to_string(st) + " steps)";
      }
    }
  }
  EXPECT_GT(checked, 0) << what;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatches, first: " << first << " (worst " << worst << " steps)";
}

// GPU against CPU on the rows `mags` computed: the CPU result stands in for the reference,
// with the oracle's magnitudes; the two backends' errors add.
void expect_backends_agree(const Result& gpu, const Result& cpu, const Ref& mags, double max_steps, const char* what) {
  ASSERT_TRUE(cpu.status.ok()) << what << " (cpu): " << cpu.status.to_string();
  Ref r = mags;  // compares the rows the reference computed
  for (size_t i = 0; i < r.done.size(); ++i) r.lse[i] = cpu.lse[i];
  for (size_t i = 0; i < r.out.size(); ++i) r.out[i] = cpu.out[i];
  expect_matches(gpu, r, max_steps, what);
}

// Indices that mix valid keys with every invalid candidate.
std::vector<int32_t> random_indices(int64_t T, int64_t K, int64_t num_keys, uint64_t seed, double invalid_share,
                                    const std::function<bool(int64_t)>& usable = nullptr) {
  FastRng rng(seed);
  const int64_t len = num_keys;
  const int64_t bad[] = {INT_MIN, -2, -1, len, len + 1, INT_MAX};
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  for (auto& v : idx) {
    if (static_cast<double>(rng.below(1000)) < invalid_share * 1000) {
      v = static_cast<int32_t>(std::min<int64_t>(INT_MAX, bad[rng.below(6)]));
      continue;
    }
    int64_t k;
    do k = rng.below(num_keys); while (usable && !usable(k));
    v = static_cast<int32_t>(k);
  }
  return idx;
}

std::vector<float> random_sink(int64_t H, uint64_t seed) {
  FastRng rng(seed);
  std::vector<float> s(static_cast<size_t>(H));
  for (auto& v : s) v = 2.f * rng.normal();
  return s;
}

// ---- sparse -------------------------------------------------------------------------------------
TEST(GpuSparseMla, FlatBf16MatchesReferenceAndCpu) {
  DSA_REQUIRE_GPU();
  const HostKv kv = make_kv(KvMode::kFlat, 333, 0, 1);
  SparseInputs in;
  in.q = make_q(7, 64, 2);
  in.K = 192;
  in.indices = random_indices(7, in.K, kv.num_keys, 3, 0.1);
  const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(7), all_of(64));
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Result g = run_sparse(kv, in, true, {dt, 0});
    expect_matches(g, ref, 2.0, "gpu vs reference");
    const Result c = run_sparse(kv, in, false, {DType::kF32, 0});
    expect_backends_agree(g, c, ref, 3.0, "gpu vs cpu");
  }
}

TEST(GpuSparseMla, PagedBf16NaNPoisonedSlotsNeverReachOutput) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return (s * 7) % 5 != 0; };  // every fifth-ish slot is NaN
  const HostKv kv = make_kv(KvMode::kPagedBf16, 12, 64, 4, used);
  SparseInputs in;
  in.q = make_q(6, 128, 5);
  in.K = 256;
  in.indices = random_indices(6, in.K, kv.num_keys, 6, 0.2, used);
  const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(6), all_of(128));
  const Result g = run_sparse(kv, in, true);
  expect_matches(g, ref, 2.0, "paged bf16");
  expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), ref, 3.0, "paged bf16 gpu vs cpu");
}

TEST(GpuSparseMla, PagedFp8AgainstDequantisedAndFp32References) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s % 3 != 1; };
  const HostKv kv = make_kv(KvMode::kPagedFp8, 10, 64, 7, used);
  SparseInputs in;
  in.q = make_q(5, 64, 8);
  in.K = 320;
  in.indices = random_indices(5, in.K, kv.num_keys, 9, 0.1, used);
  const Ref exact = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(5), all_of(64));
  const Result g = run_sparse(kv, in, true, {DType::kF32, 0});
  expect_matches(g, exact, 2.0, "fp8 vs dequantised reference");
  expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), exact, 3.0, "fp8 gpu vs cpu");
  // Loose: the f32 latents before quantisation (unit-magnitude tiles, so the FP8 error of a
  // score stays well below 1). FP8 keeps 3 mantissa bits.
  HostKv unit = make_kv(KvMode::kPagedFp8, 10, 64, 7, used, 0, false);
  const Result gu = run_sparse(unit, in, true, {DType::kF32, 0});
  ASSERT_TRUE(gu.status.ok()) << gu.status.to_string();
  unit.value = unit.orig;
  const Ref loose = reference(unit, in.q, sparse_keys(unit, in), {}, all_of(5), all_of(64));
  // Bounds from simulating this distribution (worst 0.23, lse 0.19, rms 0.034): about 2x.
  double worst = 0.0, worst_lse = 0.0, err2 = 0.0, mag2 = 0.0;
  for (size_t i = 0; i < loose.out.size(); ++i) {
    const double e = gu.out[i] - loose.out[i];
    worst = std::max(worst, std::fabs(e) / std::max(loose.out_scale[i], 1e-30));
    err2 += e * e;
    mag2 += loose.out_scale[i] * loose.out_scale[i];
  }
  for (size_t i = 0; i < loose.lse.size(); ++i) worst_lse = std::max(worst_lse, std::fabs(gu.lse[i] - loose.lse[i]));
  EXPECT_LT(std::sqrt(err2 / mag2), 0.08) << "fp8 output far from the f32 math (rms)";
  EXPECT_LT(worst, 0.5) << "fp8 output far from the f32 math";
  EXPECT_LT(worst_lse, 0.5) << "fp8 lse far from the f32 math";
}

TEST(GpuSparseMla, InvalidCandidatesAndEmptyRows) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s < 200; };  // slots 200.. are NaN
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    const HostKv kv = make_kv(mode, 5, 64, 10, used);
    SparseInputs in;
    const int64_t T = 6;
    in.q = make_q(T, 64, 11);
    in.K = 128;
    in.indices = random_indices(T, in.K, kv.num_keys, 12, 0.5, used);
    const int64_t len = kv.num_keys;
    const int64_t cand[] = {INT_MIN, -2, -1, len, len + 1, INT_MAX};
    for (int64_t j = 0; j < in.K; ++j) {
      in.indices[0 * in.K + j] = static_cast<int32_t>(cand[j % 6]);  // row 0: nothing valid
      in.indices[1 * in.K + j] = -1;                                   // row 1: all -1
    }
    in.indices[2 * in.K + 77] = 5;  // row 2: one valid key among candidates
    for (int64_t j = 0; j < in.K; ++j)
      if (j != 77) in.indices[2 * in.K + j] = static_cast<int32_t>(cand[j % 6]);
    in.topk_length = {static_cast<int32_t>(in.K), static_cast<int32_t>(in.K), static_cast<int32_t>(in.K), 0, 1,
                      static_cast<int32_t>(in.K - 1)};  // row 3: length 0
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(T), all_of(64));
    ASSERT_TRUE(std::isinf(ref.lse[0]) && std::isinf(ref.lse[1 * 64]) && std::isinf(ref.lse[3 * 64]));
    const Result g = run_sparse(kv, in, true);
    expect_matches(g, ref, 2.0, "invalid candidates");
    expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), ref, 3.0, "invalid candidates gpu vs cpu");
  }
}

TEST(GpuSparseMla, TopkLengthSinkAndHeadTail) {
  DSA_REQUIRE_GPU();
  const HostKv kv = make_kv(KvMode::kFlat, 500, 0, 13);
  for (int64_t H : {16, 80}) {
    SparseInputs in;
    const int64_t T = 9;
    in.q = make_q(T, H, 14);
    in.K = 200;
    in.indices = random_indices(T, in.K, kv.num_keys, 15, 0.05);
    FastRng rng(16);
    for (int64_t t = 0; t < T; ++t) in.topk_length.push_back(static_cast<int32_t>(rng.below(in.K + 1)));
    in.topk_length[0] = 0;
    in.topk_length[1] = static_cast<int32_t>(in.K);
    in.sink = random_sink(H, 17);
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), all_of(H));
    const Result g = run_sparse(kv, in, true);
    expect_matches(g, ref, 2.0, "topk_length + sink");
    expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), ref, 3.0, "topk_length + sink gpu vs cpu");
  }
}

TEST(GpuSparseMla, DeviceTopkLengthOutOfRangeIsClamped) {
  DSA_REQUIRE_GPU();
  // Device contents are not validated; a length past K means K, a negative one means none.
  const HostKv kv = make_kv(KvMode::kFlat, 300, 0, 18);
  SparseInputs in;
  in.q = make_q(3, 64, 19);
  in.K = 100;
  in.indices = random_indices(3, in.K, kv.num_keys, 20, 0.0);
  in.topk_length = {-5, static_cast<int32_t>(in.K + 7), INT_MAX};
  SparseInputs clamped = in;
  clamped.topk_length = {0, static_cast<int32_t>(in.K), static_cast<int32_t>(in.K)};
  const Ref ref = reference(kv, in.q, sparse_keys(kv, clamped), {}, all_of(3), all_of(64));
  expect_matches(run_sparse(kv, in, true), ref, 2.0, "clamped topk_length");
}

TEST(GpuSparseMla, PageEdgesOddPagesAndPaddedBlocks) {
  DSA_REQUIRE_GPU();
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    for (int64_t page : {1, 5, 64}) {
      // Blocks padded by 48 bytes (NaN) beyond their tokens.
      const HostKv kv = make_kv(mode, 4096 / (page * 8) + 3, page, 21 + page, nullptr, 48);
      SparseInputs in;
      const int64_t T = 4;
      in.q = make_q(T, 64, 22);
      in.K = 130;
      std::vector<int32_t> idx;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < in.K; ++j) {
          // the first and last slot of pages, around the page boundaries
          const int64_t blk = (t * 31 + j) % kv.num_blocks;
          const int64_t off = (j % 2) ? page - 1 : 0;
          idx.push_back(static_cast<int32_t>(blk * page + off));
        }
      in.indices = idx;
      const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(T), all_of(64));
      const Result g = run_sparse(kv, in, true);
      expect_matches(g, ref, 2.0, "page edges");
      expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), ref, 3.0, "page edges gpu vs cpu");
    }
  }
}

TEST(GpuSparseMla, StridedAndUnalignedTensors) {
  DSA_REQUIRE_GPU();
  // Row strides that are not multiples of 16 bytes take the element-wise load/store paths;
  // padding elements of q and kv hold NaN, the out padding must stay untouched.
  const HostKv kv = make_kv(KvMode::kFlat, 200, 0, 23, nullptr, 4);
  SparseInputs in;
  in.q = make_q(5, 64, 24, 1);
  in.K = 96;
  in.indices = random_indices(5, in.K, kv.num_keys, 25, 0.1);
  const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(5), all_of(64));
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Result g = run_sparse(kv, in, true, {dt, 3});
    expect_matches(g, ref, 2.0, "strided");
    const size_t es = dsa::dtype_size(dt);
    bool pad_intact = true;
    for (int64_t row = 0; row < 5 * 64; ++row)
      for (int64_t d = DV; d < DV + 3; ++d)
        for (size_t b = 0; b < es; ++b) pad_intact = pad_intact && g.raw[(row * (DV + 3) + d) * es + b] == 0xFF;
    EXPECT_TRUE(pad_intact) << "out padding was written";
  }
}

TEST(GpuSparseMla, DecodeRowsNextN1To4) {
  DSA_REQUIRE_GPU();
  const HostKv kv = make_kv(KvMode::kPagedFp8, 40, 64, 26);
  for (int64_t next_n = 1; next_n <= 4; ++next_n) {
    const int64_t B = 3, T = B * next_n;
    SparseInputs in;
    in.q = make_q(T, 128, 27 + next_n);
    in.K = 512;
    in.indices = random_indices(T, in.K, kv.num_keys, 28 + next_n, 0.0);
    // Row i of a sequence with context L sees L - next_n + i + 1 keys: the rest is -1.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < next_n; ++i) {
        const int64_t L = 300 * (b + 1) - next_n + i + 1;
        for (int64_t j = std::min<int64_t>(L, in.K); j < in.K; ++j) in.indices[(b * next_n + i) * in.K + j] = -1;
      }
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, all_of(T), all_of(128));
    const Result g = run_sparse(kv, in, true);
    expect_matches(g, ref, 2.0, "decode next_n");
    expect_backends_agree(g, run_sparse(kv, in, false, {DType::kF32, 0}), ref, 3.0, "decode gpu vs cpu");
  }
}

TEST(GpuSparseMla, SplitKWorkspaceAndBitIdenticalRepeats) {
  DSA_REQUIRE_GPU();
  // Two tokens with 2048 candidates: too few tiles for the device, so the key list is split.
  const HostKv kv = make_kv(KvMode::kPagedBf16, 64, 64, 30);
  SparseInputs in;
  in.q = make_q(2, 64, 31);
  in.K = 2048;
  in.indices = random_indices(2, in.K, kv.num_keys, 32, 0.1);
  in.sink = random_sink(64, 33);
  const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(2), all_of(64));
  const Result a = run_sparse(kv, in, true);
  EXPECT_GT(a.workspace, 0u) << "expected the split-K path";
  expect_matches(a, ref, 2.0, "split-K");
  const Result b = run_sparse(kv, in, true);
  EXPECT_TRUE(a.raw == b.raw) << "repeated runs differ";
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4)) << "repeated lse differ";

  // Too small a workspace is an error naming it.
  DeviceBuffer q(in.q.data), cache(kv.bytes), idx(in.indices), out(2 * 64 * DV * 2), lse(2 * 64 * 4), ws(64);
  dsa::SparseMlaParams p;
  p.q = dsa::make_tensor(q.data(), DType::kBF16, {2, 64, D}, dsa::cuda_device(0));
  p.kv = kv.desc(cache.data(), dsa::cuda_device(0));
  p.indices = dsa::make_tensor(idx.data(), DType::kI32, {2, in.K}, dsa::cuda_device(0));
  p.sm_scale = kScale;
  p.out = dsa::make_tensor(out.data(), DType::kBF16, {2, 64, DV}, dsa::cuda_device(0));
  p.lse = dsa::make_tensor(lse.data(), DType::kF32, {2, 64}, dsa::cuda_device(0));
  p.workspace = ws.data();
  p.workspace_bytes = 64;
  EXPECT_TRUE(dsa_test::fails_naming(dsa::sparse_mla(p), {"sparse_mla", "workspace"}));
}

// ---- the Hopper (wgmma) kernel and the mma.sync one --------------------------------------------
// On an sm_90a device BF16 caches run the wgmma kernel; DSA_FORCE_KERNEL=mma_sync keeps the
// mma.sync one, so both run on the same inputs.
struct ForceMmaSync : ScopedEnv {
  ForceMmaSync() : ScopedEnv("DSA_FORCE_KERNEL", "mma_sync") {}
};

// DSA_SPARSE_KERNEL=async_gather / sync_gather: the Hopper producer that releases tiles with
// cp.async-tracked mbarrier arrivals, or the one that waits for its copies (same arithmetic).
// The default is async for H <= 32, sync above.
struct ScopedSparseKernel : ScopedEnv {
  explicit ScopedSparseKernel(const char* v) : ScopedEnv("DSA_SPARSE_KERNEL", v) {}
};

// What the launcher should choose for these keys and heads (16-byte-aligned q).
const char* expected_kernel(const HostKv& kv, int64_t H) {
  if (!device_is_sm90() || kv.mode == KvMode::kPagedFp8) return "sparse_mla.mma_sync";
  return H <= 32 ? "sparse_mla.wgmma_bf16_few_heads_async" : "sparse_mla.wgmma_bf16";
}

// The producer the default does not run for H, as (DSA_SPARSE_KERNEL value, kernel name).
std::pair<const char*, std::string> other_producer(const std::string& def) {
  const std::string async = "_async";
  if (def.size() > async.size() && def.compare(def.size() - async.size(), async.size(), async) == 0)
    return {"sync_gather", def.substr(0, def.size() - async.size())};
  return {"async_gather", def + async};
}

const char* kernel_for(const HostKv& kv, const SparseInputs& in) {
  dsa::SparseMlaParams p;
  alignas(256) static uint8_t dummy[64];
  p.q = dsa::make_tensor(dummy, DType::kBF16, {in.q.T, in.q.H, D}, dsa::cuda_device(0));
  p.q.stride[0] = in.q.s0;
  p.q.stride[1] = in.q.s1;
  p.kv = kv.desc(dummy, dsa::cuda_device(0));
  p.indices = dsa::make_tensor(dummy, DType::kI32, {in.q.T, in.K}, dsa::cuda_device(0));
  return dsa::gpu::sparse_mla_kernel_name(p);
}

// Runs the default kernel and the forced mma.sync one; both must match the reference, each
// other, and repeat bit-identically.
void check_both_kernels(const HostKv& kv, const SparseInputs& in, const Ref& ref, const std::string& what,
                        OutSpec os = {}) {
  EXPECT_STREQ(kernel_for(kv, in), expected_kernel(kv, in.q.H)) << what;
  const Result a = run_sparse(kv, in, true, os);
  std::string launched = dsa::last_kernel_name();  // "<name>" or "<name>+combine"
  launched = launched.substr(0, launched.find('+'));
  EXPECT_EQ(launched, expected_kernel(kv, in.q.H)) << what;
  expect_matches(a, ref, 2.0, (what + ": default kernel").c_str());
  const Result a2 = run_sparse(kv, in, true, os);
  EXPECT_TRUE(a.raw == a2.raw) << what << ": repeated runs differ";
  EXPECT_EQ(0, std::memcmp(a.lse.data(), a2.lse.data(), a.lse.size() * 4)) << what << ": repeated lse differ";
  Result b;
  {
    ForceMmaSync force;
    EXPECT_STREQ(kernel_for(kv, in), "sparse_mla.mma_sync") << what;
    b = run_sparse(kv, in, true, os);
  }
  expect_matches(b, ref, 2.0, (what + ": mma.sync kernel").c_str());
  expect_backends_agree(a, b, ref, 3.0, (what + ": default vs mma.sync").c_str());
  // The other producer (sm_90a BF16 caches only; elsewhere the switch changes nothing): the
  // same reference and tolerance, repeatable, and bit-identical to the default kernel, whose
  // arithmetic it shares (only the producer's release of the key tiles differs).
  const std::string def = expected_kernel(kv, in.q.H);
  if (def == "sparse_mla.mma_sync") return;
  const auto other = other_producer(def);
  ScopedSparseKernel force_other(other.first);
  const std::string& want = other.second;
  EXPECT_EQ(std::string(kernel_for(kv, in)), want) << what;
  const Result c = run_sparse(kv, in, true, os);
  launched = dsa::last_kernel_name();
  launched = launched.substr(0, launched.find('+'));
  EXPECT_EQ(launched, want) << what;
  expect_matches(c, ref, 2.0, (what + ": " + other.first + " kernel").c_str());
  const Result c2 = run_sparse(kv, in, true, os);
  EXPECT_TRUE(c.raw == c2.raw) << what << ": " << other.first << " repeated runs differ";
  EXPECT_TRUE(c.raw == a.raw) << what << ": " << other.first << " differs from the default kernel";
  EXPECT_EQ(0, std::memcmp(c.lse.data(), a.lse.data(), a.lse.size() * 4)) << what << ": " << other.first << " lse differ";
}

TEST(GpuSparseMlaWgmma, KernelChoice) {
  DSA_REQUIRE_GPU();
  const HostKv flat = make_kv(KvMode::kFlat, 8, 0, 1);
  const HostKv fp8 = make_kv(KvMode::kPagedFp8, 1, 64, 1);
  SparseInputs in;
  in.q = make_q(1, 64, 1);
  in.K = 4;
  EXPECT_STREQ(kernel_for(flat, in), expected_kernel(flat, 64));
  // FP8 caches go to the FP8 split-KV decode kernel on sm_90a (any T up to its token bound).
  EXPECT_STREQ(kernel_for(fp8, in), "sparse_mla.wgmma_fp8_splitkv");
  for (int64_t H : {1, 8, 12, 16, 32, 33, 128}) {
    SparseInputs few;
    few.q = make_q(1, H, 1);
    few.K = 4;
    EXPECT_STREQ(kernel_for(flat, few), expected_kernel(flat, H)) << "H=" << H;
  }
  {
    ForceMmaSync force;
    EXPECT_STREQ(kernel_for(flat, in), "sparse_mla.mma_sync");
    EXPECT_STREQ(kernel_for(fp8, in), "sparse_mla.mma_sync");
  }
  if (device_is_sm90()) {
    ScopedSparseKernel async("async_gather");
    EXPECT_STREQ(kernel_for(flat, in), "sparse_mla.wgmma_bf16_async");
    EXPECT_STREQ(kernel_for(fp8, in), "sparse_mla.wgmma_fp8_splitkv");  // the switch is BF16-only
    SparseInputs few;
    few.q = make_q(1, 16, 1);
    few.K = 4;
    EXPECT_STREQ(kernel_for(flat, few), "sparse_mla.wgmma_bf16_few_heads_async");
  }
  if (device_is_sm90()) {
    ScopedSparseKernel sync("sync_gather");
    EXPECT_STREQ(kernel_for(flat, in), "sparse_mla.wgmma_bf16");
    SparseInputs few;
    few.q = make_q(1, 16, 1);
    few.K = 4;
    EXPECT_STREQ(kernel_for(flat, few), "sparse_mla.wgmma_bf16_few_heads");
  }
  in.q.s1 = D + 3;  // queries without 16-byte rows stay on mma.sync
  in.q.s0 = 64 * in.q.s1;
  EXPECT_STREQ(kernel_for(flat, in), "sparse_mla.mma_sync");
}

// Every head count a tensor-parallel rank holds, flat and paged, with the tile edges of
// topk_length, rows with fewer valid indices than k, all-invalid rows, duplicates, the
// cache's last slot and NaN-poisoned unused slots.
TEST(GpuSparseMlaWgmma, HeadCountsAndTileEdges) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s % 7 != 3; };
  const int64_t K = 2048;
  const int32_t lengths[] = {0, 1, 63, 64, 65, 2047, 2048, 2048};
  const int64_t T = 8;
  for (KvMode mode : {KvMode::kFlat, KvMode::kPagedBf16}) {
    const HostKv kv = mode == KvMode::kFlat ? make_kv(mode, 3001, 0, 40, used) : make_kv(mode, 47, 64, 41, used);
    const int64_t last = kv.num_keys - 1;  // used: (3000 % 7, 3007 % 7) != 3
    ASSERT_TRUE(used(last));
    for (int64_t H : {8, 16, 32, 64, 128, 3, 12, 40}) {  // and rounded-up N / partial groups
      SparseInputs in;
      in.q = make_q(T, H, 42 + H);
      in.K = K;
      in.indices = random_indices(T, K, kv.num_keys, 43 + H, 0.05, used);
      in.topk_length.assign(lengths, lengths + T);
      int32_t* row6 = in.indices.data() + 6 * K;  // fewer valid than k: 100 valid, then -1
      for (int64_t j = 100; j < K; ++j) row6[j] = -1;
      int32_t* row7 = in.indices.data() + 7 * K;  // duplicates, the last slot, a valid tail
      for (int64_t j = 0; j < 64; ++j) row7[j] = static_cast<int32_t>(j % 2 ? last : 5);
      row7[K - 1] = static_cast<int32_t>(last);
      in.indices[2 * K + 62] = static_cast<int32_t>(last);  // length 63: the last position
      in.sink = random_sink(H, 44 + H);
      const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), all_of(H));
      check_both_kernels(kv, in, ref, std::string(mode == KvMode::kFlat ? "flat" : "paged") + " H=" + std::to_string(H));
    }
  }
}

TEST(GpuSparseMlaWgmma, AllInvalidAndSinkInfinities) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s < 150; };  // slots 150.. are NaN
  const HostKv kv = make_kv(KvMode::kPagedBf16, 4, 64, 50, used);
  for (int64_t H : {64, 16, 8}) {  // both Hopper kernels, without split-K (K = 192)
    SparseInputs in;
    const int64_t T = 4;
    in.q = make_q(T, H, 51);
    in.K = 192;
    in.indices = random_indices(T, in.K, kv.num_keys, 52, 0.3, used);
    for (int64_t j = 0; j < in.K; ++j) {
      in.indices[j] = j % 2 ? -1 : static_cast<int32_t>(kv.num_keys + j);  // row 0: nothing valid
      in.indices[1 * in.K + j] = static_cast<int32_t>(150 + j % 100);       // row 1: only NaN slots...
    }
    in.topk_length = {static_cast<int32_t>(in.K), 0, static_cast<int32_t>(in.K), 65};  // ...masked by length 0
    in.sink.assign(static_cast<size_t>(H), 0.f);
    for (int64_t h = 0; h < H; ++h)
      in.sink[h] = h % 3 == 0 ? std::numeric_limits<float>::infinity()
                              : (h % 3 == 1 ? -std::numeric_limits<float>::infinity() : 0.5f);
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), all_of(H));
    const std::string what = "all invalid, sink +-inf, H=" + std::to_string(H);
    check_both_kernels(kv, in, ref, what);
    check_both_kernels(kv, in, ref, what + ", f32 out", {DType::kF32, 0});
  }
}

// All-invalid 64-key tiles between valid ones, first and last (the consumers skip them while
// the producer's zero-fills of their second part may still land; the few-heads producer keeps
// two tiles in flight), over NaN-poisoned unused slots. K = 448: 7 tiles, no split-K.
TEST(GpuSparseMlaWgmma, InvalidTilesBetweenValidOnes) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s % 5 != 2; };
  const HostKv kv = make_kv(KvMode::kPagedBf16, 16, 64, 70, used);
  for (int64_t H : {64, 128, 32, 16, 8}) {
    SparseInputs in;
    const int64_t T = 5, K = 448;
    in.q = make_q(T, H, 71 + H);
    in.K = K;
    in.indices = random_indices(T, K, kv.num_keys, 72 + H, 0.0, used);
    // Row r keeps tile t valid when bit t of keep[r] is set; other tiles hold -1 or
    // out-of-range indices (never read).
    const int keep[T] = {0x55, 0x40, 0x01, 0x2A, 0x7F};
    for (int64_t r = 0; r < T; ++r)
      for (int64_t j = 0; j < K; ++j)
        if (!((keep[r] >> (j / 64)) & 1))
          in.indices[r * K + j] = j % 3 ? -1 : static_cast<int32_t>(kv.num_keys + j);
    in.sink = random_sink(H, 73 + H);
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), all_of(H));
    check_both_kernels(kv, in, ref, "invalid tiles between valid ones, H=" + std::to_string(H));
  }
}

// Decode batches: next_n = 2 rows per sequence, keys of the sequence's context; few tiles
// per SM at H=16, so the key list splits (the combine path); the reference checks a sample.
TEST(GpuSparseMlaWgmma, DecodeBatches) {
  DSA_REQUIRE_GPU();
  const HostKv kv = make_kv(KvMode::kPagedBf16, 8 * 34, 64, 60);
  for (int64_t H : {16, 64, 128}) {
    const int64_t B = 8, next_n = 2, T = B * next_n, K = 2048;
    SparseInputs in;
    in.q = make_q(T, H, 61 + H);
    in.K = K;
    in.indices.assign(static_cast<size_t>(T * K), -1);
    FastRng rng(62 + H);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t ctx = 1000 + 160 * b;  // context of sequence b: slots b*34*64 .. (> K for b = 7)
      for (int64_t i = 0; i < next_n; ++i) {
        const int64_t L = ctx - next_n + i + 1;
        for (int64_t j = 0; j < std::min<int64_t>(L, K); ++j)
          in.indices[(b * next_n + i) * K + j] = static_cast<int32_t>(b * 34 * 64 + rng.below(L));
      }
    }
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, {0, 5, 15}, all_of(H));
    check_both_kernels(kv, in, ref, "decode H=" + std::to_string(H));
  }
}

TEST(GpuSparseMla, Prefill4096TokensTopk2048) {
  DSA_REQUIRE_GPU();
  const int64_t T = 4096, H = 64, K = 2048, S = 8192;
  const HostKv kv = make_kv(KvMode::kFlat, S, 0, 34);
  SparseInputs in;
  in.q = make_q(T, H, 35);
  in.K = K;
  in.indices = random_indices(T, K, S, 36, 0.02);
  for (int64_t t = 0; t < 64; ++t)  // causal-like early rows: only t + 1 keys, then -1
    for (int64_t j = t + 1; j < K; ++j) in.indices[t * K + j] = -1;
  const std::vector<int64_t> sample = {0, 1, 63, 64, 511, 1000, 2047, 2048, 3001, 4094, 4095};
  const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, sample, all_of(H));
  const Result a = run_sparse(kv, in, true);
  expect_matches(a, ref, 2.0, "4096-token prefill (sampled rows)");
  const Result b = run_sparse(kv, in, true);
  EXPECT_TRUE(a.raw == b.raw) << "repeated runs differ";
  if (!device_is_sm90()) return;
  ScopedSparseKernel async("async_gather");  // 32 tiles a CTA: many phases of each barrier
  const Result c = run_sparse(kv, in, true);
  EXPECT_STREQ(dsa::last_kernel_name(), "sparse_mla.wgmma_bf16_async");
  expect_matches(c, ref, 2.0, "4096-token prefill, async-gather kernel");
  EXPECT_TRUE(c.raw == a.raw) << "async-gather kernel differs from the default one";
}

// ---- dense --------------------------------------------------------------------------------------
// Sequences as (q_len, kv_len); keys of sequence b are a contiguous flat range or pages.
DenseInputs dense_inputs(const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t H, uint64_t seed) {
  DenseInputs in;
  in.cu_q = {0};
  for (const auto& s : seqs) in.cu_q.push_back(in.cu_q.back() + static_cast<int32_t>(s.first));
  in.q = make_q(in.cu_q.back(), H, seed);
  return in;
}

TEST(GpuDenseMla, FlatVarlenWithPrefixOffsets) {
  DSA_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{5, 5}, {3, 70}, {0, 10}, {17, 130}, {1, 1}, {64, 64}};
  DenseInputs in = dense_inputs(seqs, 64, 40);
  in.cu_k = {7};  // keys start at row 7: rows 0..6 belong to nobody (and hold NaN)
  for (const auto& s : seqs) in.cu_k.push_back(in.cu_k.back() + static_cast<int32_t>(s.second));
  const int64_t S = in.cu_k.back() + 5;
  const HostKv kv = make_kv(KvMode::kFlat, S, 0, 41, [&](int64_t s) { return s >= 7 && s < in.cu_k.back(); });
  in.sink = random_sink(64, 42);
  const Ref ref = reference(kv, in.q, dense_keys(kv, in), in.sink, all_of(in.q.T), all_of(64));
  const Result g = run_dense(kv, in, true);
  expect_matches(g, ref, 2.0, "dense flat");
  expect_backends_agree(g, run_dense(kv, in, false, {DType::kF32, 0}), ref, 3.0, "dense flat gpu vs cpu");
}

// Paged sequences over a shuffled block table; slots past each kv_len hold NaN.
struct PagedSetup {
  HostKv kv;
  DenseInputs in;
};
PagedSetup paged_setup(KvMode mode, const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t H, int64_t page,
                       uint64_t seed) {
  PagedSetup ps;
  ps.in = dense_inputs(seqs, H, seed);
  int64_t max_blocks = 1, total = 0;
  for (const auto& s : seqs) {
    max_blocks = std::max(max_blocks, (s.second + page - 1) / page + 1);
    total += (s.second + page - 1) / page;
  }
  const int64_t num_blocks = total + 3;
  std::vector<int64_t> perm = all_of(num_blocks);
  FastRng rng(seed + 1);
  for (int64_t i = num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  ps.in.max_blocks = max_blocks;
  ps.in.block_table.assign(static_cast<size_t>(seqs.size() * max_blocks), -1);
  std::vector<char> used(static_cast<size_t>(num_blocks * page), 0);
  int64_t next = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    ps.in.kv_lens.push_back(static_cast<int32_t>(seqs[b].second));
    for (int64_t j = 0; j < (seqs[b].second + page - 1) / page; ++j) {
      const int64_t blk = perm[next++];
      ps.in.block_table[b * max_blocks + j] = static_cast<int32_t>(blk);
      for (int64_t o = 0; o < page && j * page + o < seqs[b].second; ++o) used[blk * page + o] = 1;
    }
  }
  ps.kv = make_kv(mode, num_blocks, page, seed + 2, [&](int64_t s) { return used[s] != 0; });
  return ps;
}

TEST(GpuDenseMla, PagedBf16AndFp8DecodeAndPrefill) {
  DSA_REQUIRE_GPU();
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    for (int64_t page : {16, 64}) {
      for (int64_t next_n = 1; next_n <= 4; ++next_n) {
        const std::vector<std::pair<int64_t, int64_t>> seqs = {
            {next_n, 100}, {next_n, 257}, {next_n, next_n}, {20, 150}};
        PagedSetup ps = paged_setup(mode, seqs, 64, page, 50 + page + next_n);
        const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(ps.in.q.T), all_of(64));
        const Result g = run_dense(ps.kv, ps.in, true);
        expect_matches(g, ref, 2.0, "dense paged");
        expect_backends_agree(g, run_dense(ps.kv, ps.in, false, {DType::kF32, 0}), ref, 3.0, "dense paged gpu vs cpu");
      }
    }
  }
}

// Few heads (tensor-parallel shards, small test geometries): the head tile is mostly padding.
TEST(GpuDenseMla, FewHeadsF32OutMatchesReferenceAndCpu) {
  DSA_REQUIRE_GPU();
  for (int64_t H : {1, 4, 5, 16}) {
    const std::vector<std::pair<int64_t, int64_t>> seqs = {{40, 40}, {3, 90}, {20, 600}};
    PagedSetup ps = paged_setup(KvMode::kPagedBf16, seqs, H, 16, 70 + H);
    const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(ps.in.q.T), all_of(H));
    const Result g = run_dense(ps.kv, ps.in, true, {DType::kF32, 0});
    expect_matches(g, ref, 2.0, ("dense few heads H=" + std::to_string(H)).c_str());
    expect_backends_agree(g, run_dense(ps.kv, ps.in, false, {DType::kF32, 0}), ref, 3.0,
                          ("dense few heads gpu vs cpu H=" + std::to_string(H)).c_str());
  }
}

TEST(GpuDenseMla, BadDeviceBlockTableEntriesAreInvalidKeys) {
  DSA_REQUIRE_GPU();
  PagedSetup ps = paged_setup(KvMode::kPagedBf16, {{2, 200}, {3, 190}}, 64, 64, 60);
  ps.in.block_table[1] = -1;                                               // seq 0, page 1
  ps.in.block_table[ps.in.max_blocks + 2] = static_cast<int32_t>(ps.kv.num_blocks + 3);  // seq 1, page 2
  const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(ps.in.q.T), all_of(64));
  expect_matches(run_dense(ps.kv, ps.in, true), ref, 2.0, "bad block-table entries");
}

TEST(GpuDenseMla, DenseEqualsSparseWhenContextFitsTopk) {
  DSA_REQUIRE_GPU();
  PagedSetup ps = paged_setup(KvMode::kPagedFp8, {{40, 300}, {2, 1000}}, 128, 64, 70);
  const Result dense = run_dense(ps.kv, ps.in, true);
  SparseInputs sp;
  sp.q = ps.in.q;
  sp.K = 2048;
  sp.indices.assign(static_cast<size_t>(sp.q.T * sp.K), -1);
  auto keys = dense_keys(ps.kv, ps.in);
  for (int64_t t = 0; t < sp.q.T; ++t) {
    const std::vector<int64_t> k = keys(t);
    for (size_t j = 0; j < k.size(); ++j) sp.indices[t * sp.K + j] = static_cast<int32_t>(k[j]);
  }
  const Result sparse = run_sparse(ps.kv, sp, true);
  const Ref ref = reference(ps.kv, ps.in.q, keys, {}, all_of(sp.q.T), all_of(128));
  expect_matches(dense, ref, 2.0, "dense");
  expect_matches(sparse, ref, 2.0, "sparse");
  expect_backends_agree(sparse, dense, ref, 3.0, "sparse vs dense");
}

TEST(GpuDenseMla, Decode128KContext) {
  DSA_REQUIRE_GPU();
  const int64_t ctx = 131072, H = 64;
  PagedSetup ps = paged_setup(KvMode::kPagedBf16, {{2, ctx}}, H, 64, 80);
  const std::vector<int64_t> heads = {0, 17, 63};
  const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(2), heads);
  const Result a = run_dense(ps.kv, ps.in, true);
  EXPECT_GT(a.workspace, 0u) << "expected the split-K path";
  expect_matches(a, ref, 2.0, "128K decode (sampled heads)");
  expect_backends_agree(a, run_dense(ps.kv, ps.in, false, {DType::kF32, 0}), ref, 3.0, "128K decode gpu vs cpu");
  const Result b = run_dense(ps.kv, ps.in, true);
  EXPECT_TRUE(a.raw == b.raw) << "repeated runs differ";
}

TEST(GpuDenseMla, Prefill16KRows) {
  DSA_REQUIRE_GPU();
  const int64_t T = 16384, H = 16;
  DenseInputs in = dense_inputs({{T, T + 100}}, H, 90);  // a 100-token cached prefix
  in.cu_k = {0, static_cast<int32_t>(T + 100)};
  const HostKv kv = make_kv(KvMode::kFlat, T + 100, 0, 91);
  const std::vector<int64_t> sample = {0, 1, 63, 64, 4097, 10000, T - 1};
  const Ref ref = reference(kv, in.q, dense_keys(kv, in), {}, sample, {0, 15});
  const Result a = run_dense(kv, in, true);
  expect_matches(a, ref, 2.0, "16K-row prefill (sampled rows)");
  const Result b = run_dense(kv, in, true);
  EXPECT_TRUE(a.raw == b.raw) << "repeated runs differ";
}

// ---- Hopper decode kernels (src/cuda/mla_decode*): on sm_90a decode-shaped dense calls over
// paged caches and sparse calls over the FP8 cache take them; DSA_FORCE_KERNEL=mma_sync keeps
// the mma.sync kernels, which the tests below use as a second opinion on every row.

// Every row of two GPU results: lse within a small relative error (+inf exactly), outputs
// within 4 bf16 steps of the row's largest magnitude (P enters both as bf16, the score order
// differs).
void expect_kernels_agree(const Result& a, const Result& b, int64_t T, int64_t H, const char* what) {
  ASSERT_TRUE(a.status.ok()) << what << ": " << a.status.to_string();
  ASSERT_TRUE(b.status.ok()) << what << " (mma_sync): " << b.status.to_string();
  int64_t bad = 0;
  std::string first;
  for (int64_t row = 0; row < T * H; ++row) {
    const float la = a.lse[row], lb = b.lse[row];
    const bool inf_a = std::isinf(la), inf_b = std::isinf(lb);
    if (inf_a || inf_b) {
      if (!(inf_a && inf_b && la > 0 && lb > 0)) {
        ++bad;
        if (first.empty()) first = "row " + std::to_string(row) + ": lse " + std::to_string(la) + " vs " + std::to_string(lb);
      }
      continue;
    }
    if (!(std::fabs(la - lb) <= 1e-4f * std::max(1.f, std::fabs(lb)))) {
      ++bad;
      if (first.empty()) first = "row " + std::to_string(row) + ": lse " + std::to_string(la) + " vs " + std::to_string(lb);
    }
    float mag = 0.f;
    for (int64_t d = 0; d < DV; ++d) mag = std::max(mag, std::fabs(b.out[row * DV + d]));
    const float tol = 4.f * std::ldexp(1.f, std::ilogb(std::max(mag, 1e-30f)) - 7);
    for (int64_t d = 0; d < DV; ++d) {
      const float x = a.out[row * DV + d], y = b.out[row * DV + d];
      if (!(std::fabs(x - y) <= tol)) {
        ++bad;
        if (first.empty())
          first = "row " + std::to_string(row) + " dim " + std::to_string(d) + ": " + std::to_string(x) + " vs " + std::to_string(y);
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatches with the mma.sync kernel, first: " << first;
}

std::vector<int64_t> sample_heads(int64_t H) {
  std::vector<int64_t> h = {0, 1, H / 2 + 1, H - 1};
  std::sort(h.begin(), h.end());
  h.erase(std::unique(h.begin(), h.end()), h.end());
  while (!h.empty() && h.back() >= H) h.pop_back();
  return h;
}

TEST(GpuDecodeHopper, DenseContextsHeadsNextN) {
  DSA_REQUIRE_GPU();
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    for (int64_t H : {64, 128}) {
      for (int64_t next_n = 1; next_n <= 4; ++next_n) {
        // Contexts 1, 63, 64, 65, 2048 (a context below next_n is raised to next_n).
        std::vector<std::pair<int64_t, int64_t>> seqs;
        for (int64_t ctx : {1, 63, 64, 65, 2048}) seqs.push_back({next_n, std::max(ctx, next_n)});
        const int64_t page = (next_n == 3 && mode == KvMode::kPagedBf16) ? 16 : 64;  // TMA sub-page boxes too
        PagedSetup ps = paged_setup(mode, seqs, H, page, 300 + 10 * H + next_n);
        const std::string what = std::string(mode == KvMode::kPagedFp8 ? "fp8" : "bf16") + " H=" + std::to_string(H) +
                                 " next_n=" + std::to_string(next_n);
        const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(ps.in.q.T), sample_heads(H));
        const Result g = run_dense(ps.kv, ps.in, true);
        expect_matches(g, ref, 2.0, ("hopper dense " + what).c_str());
        const Result again = run_dense(ps.kv, ps.in, true);
        EXPECT_TRUE(g.raw == again.raw) << what << ": repeated runs differ";
        ForceMmaSync force;
        expect_kernels_agree(g, run_dense(ps.kv, ps.in, true), ps.in.q.T, H, what.c_str());
      }
    }
  }
}

TEST(GpuDecodeHopper, DenseFewAndOddHeadsSinkF32Out) {
  DSA_REQUIRE_GPU();
  for (int64_t H : {1, 5, 16, 32, 100}) {
    PagedSetup ps = paged_setup(KvMode::kPagedBf16, {{2, 130}, {1, 1}, {4, 700}, {3, 64}}, H, 64, 400 + H);
    ps.in.sink = random_sink(H, 401 + H);
    const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), ps.in.sink, all_of(ps.in.q.T), all_of(H));
    const std::string what = "hopper dense H=" + std::to_string(H);
    const Result g = run_dense(ps.kv, ps.in, true, {DType::kF32, 3});
    expect_matches(g, ref, 2.0, what.c_str());
    ForceMmaSync force;
    expect_kernels_agree(g, run_dense(ps.kv, ps.in, true, {DType::kF32, 3}), ps.in.q.T, H, what.c_str());
  }
}

TEST(GpuDecodeHopper, DenseSplitAndWholeSchedulesBitIdentical) {
  DSA_REQUIRE_GPU();
  // One long sequence: every CTA holds a piece of it (split, combined); 128 short ones: each
  // CTA holds whole row blocks.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {{1, 20000}}, std::vector<std::pair<int64_t, int64_t>>(128, {1, 300}), {{2, 9000}, {1, 40}, {1, 5000}}};
  for (size_t i = 0; i < batches.size(); ++i) {
    for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
      PagedSetup ps = paged_setup(mode, batches[i], 128, 64, 500 + i);
      ps.in.sink = random_sink(128, 510 + i);
      const std::string what = "schedule " + std::to_string(i) + (mode == KvMode::kPagedFp8 ? " fp8" : " bf16");
      const std::vector<int64_t> tokens = {0, ps.in.q.T / 2, ps.in.q.T - 1};
      const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), ps.in.sink, tokens, sample_heads(128));
      const Result a = run_dense(ps.kv, ps.in, true);
      expect_matches(a, ref, 2.0, what.c_str());
      const Result b = run_dense(ps.kv, ps.in, true);
      EXPECT_TRUE(a.raw == b.raw) << what << ": repeated runs differ";
      EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4)) << what << ": repeated lse differ";
      ForceMmaSync force;
      expect_kernels_agree(a, run_dense(ps.kv, ps.in, true), ps.in.q.T, 128, what.c_str());
    }
  }
}

TEST(GpuDecodeHopper, Dense128KContextH128) {
  DSA_REQUIRE_GPU();
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    PagedSetup ps = paged_setup(mode, {{1, 131072}}, 128, 64, 600);
    const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(1), {0, 77, 127});
    const Result a = run_dense(ps.kv, ps.in, true);
    expect_matches(a, ref, 2.0, "128K H=128");
    const Result b = run_dense(ps.kv, ps.in, true);
    EXPECT_TRUE(a.raw == b.raw) << "repeated runs differ";
    ForceMmaSync force;
    expect_kernels_agree(a, run_dense(ps.kv, ps.in, true), 1, 128, "128K H=128");
  }
}

// The schedule is computed on the device: a captured call replays correctly after kv_lens
// changes in device memory.
TEST(GpuDecodeHopper, DenseGraphReplayWithDeviceLengthChanges) {
  DSA_REQUIRE_GPU();
  const int64_t H = 128;
  PagedSetup ps = paged_setup(KvMode::kPagedBf16, {{1, 3000}, {2, 500}, {1, 64}}, H, 64, 700);
  const int64_t T = ps.in.q.T, B = 3;
  const dsa::Device dev = dsa::cuda_device(0);
  DeviceBuffer q(ps.in.q.data), cache(ps.kv.bytes), cu(ps.in.cu_q), bt(ps.in.block_table), lens(ps.in.kv_lens),
      out(static_cast<size_t>(T * H * DV * 2), 0xFF), lse(static_cast<size_t>(T * H * 4), 0xFF);
  dsa::DenseMlaParams p;
  p.q = dsa::make_tensor(q.data(), DType::kBF16, {T, H, D}, dev);
  p.kv = ps.kv.desc(cache.data(), dev);
  p.cu_seqlens_q = vec_i32(cu.data(), B + 1, dev);
  p.block_table = dsa::make_tensor(bt.data(), DType::kI32, {B, ps.in.max_blocks}, dev);
  p.kv_lens = vec_i32(lens.data(), B, dev);
  p.sm_scale = kScale;
  p.out = dsa::make_tensor(out.data(), DType::kBF16, {T, H, DV}, dev);
  p.lse = dsa::make_tensor(lse.data(), DType::kF32, {T, H}, dev);
  const size_t ws_bytes = dsa::dense_mla_workspace_size(p);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 1), 0xFF);
  p.workspace = ws.data();
  p.workspace_bytes = ws_bytes;
  cudaStream_t stream;
  DSA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  p.stream = stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DSA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = dsa::dense_mla(p);
  DSA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // Lengths per replay: the captured ones, then shorter ones (same block tables; slots past
  // the original lengths hold NaN and stay unread).
  const std::vector<std::vector<int32_t>> rounds = {ps.in.kv_lens, {1000, 64, 1}, {2999, 2, 63}};
  for (size_t r = 0; r < rounds.size(); ++r) {
    DSA_CUDA_OK(cudaMemcpyAsync(lens.data(), rounds[r].data(), B * 4, cudaMemcpyHostToDevice, stream));
    DSA_CUDA_OK(cudaGraphLaunch(exec, stream));
    DSA_CUDA_OK(cudaStreamSynchronize(stream));
    DenseInputs in = ps.in;
    in.kv_lens = rounds[r];
    Result g;
    g.raw.resize(static_cast<size_t>(T * H * DV * 2));
    g.lse.resize(static_cast<size_t>(T * H));
    DSA_CUDA_OK(cudaMemcpy(g.raw.data(), out.data(), g.raw.size(), cudaMemcpyDeviceToHost));
    DSA_CUDA_OK(cudaMemcpy(g.lse.data(), lse.data(), g.lse.size() * 4, cudaMemcpyDeviceToHost));
    g.out = decode_out(g.raw, DType::kBF16, T, H, DV);
    const Ref ref = reference(ps.kv, in.q, dense_keys(ps.kv, in), {}, all_of(T), sample_heads(H));
    expect_matches(g, ref, 2.0, ("graph replay " + std::to_string(r)).c_str());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The sparse FP8 decode case of the SparseFp8DecodeHeadsTopkLengthSink tests: 8 sequences of
// next_n 2, K 2048, topk_length at its edges (0, 1, 64, K) and random, a sink.
template <class Used>
SparseInputs sparse_fp8_decode_case(const HostKv& kv, int64_t H, Used used) {
  const int64_t B = 8, next_n = 2, T = B * next_n, K = 2048;
  SparseInputs in;
  in.q = make_q(T, H, 801 + H);
  in.K = K;
  in.indices = random_indices(T, K, kv.num_keys, 802 + H, 0.1, used);
  FastRng rng(803 + H);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pick = rng.below(6);
    in.topk_length.push_back(static_cast<int32_t>(pick == 0 ? 0 : pick == 1 ? K : pick == 2 ? 1 : pick == 3 ? 64 : rng.below(K + 1)));
  }
  in.sink = random_sink(H, 804 + H);
  return in;
}

TEST(GpuDecodeHopper, SparseFp8DecodeHeadsTopkLengthSink) {
  DSA_REQUIRE_GPU();
  auto used = [](int64_t s) { return s % 5 != 2; };
  const HostKv kv = make_kv(KvMode::kPagedFp8, 80, 64, 800, used);
  for (int64_t H : {16, 32, 64, 128}) {
    const SparseInputs in = sparse_fp8_decode_case(kv, H, used);
    const int64_t T = in.q.T;
    const std::string what = "sparse fp8 H=" + std::to_string(H);
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), sample_heads(H));
    const Result g = run_sparse(kv, in, true);
    expect_matches(g, ref, 2.0, what.c_str());
    const Result again = run_sparse(kv, in, true);
    EXPECT_TRUE(g.raw == again.raw) << what << ": repeated runs differ";
    ForceMmaSync force;
    expect_kernels_agree(g, run_sparse(kv, in, true), T, H, what.c_str());
  }
}

// More units than the scheduler's 512 threads (each thread scans several tokens or
// sequences; all 16 warp sums of the block scan carry values). Round 1's scheduler wrote past
// its warp-sum array in every call; compute-sanitizer memcheck over these tests finds such a
// write, the comparisons find a schedule that loses or repeats row blocks.
TEST(GpuDecodeHopper, SchedulerManyUnits) {
  DSA_REQUIRE_GPU();
  {
    auto used = [](int64_t s) { return s % 7 != 3; };
    const HostKv kv = make_kv(KvMode::kPagedFp8, 40, 64, 1700, used);
    const int64_t T = 1100, H = 64, K = 192;
    SparseInputs in;
    in.q = make_q(T, H, 1701);
    in.K = K;
    in.indices = random_indices(T, K, kv.num_keys, 1702, 0.1, used);
    FastRng rng(1703);
    for (int64_t t = 0; t < T; ++t) in.topk_length.push_back(static_cast<int32_t>(rng.below(K + 1)));
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), {}, {0, 511, 512, 1099}, sample_heads(H));
    const Result g = run_sparse(kv, in, true);
    expect_matches(g, ref, 2.0, "sparse fp8 T=1100");
    const Result again = run_sparse(kv, in, true);
    EXPECT_TRUE(g.raw == again.raw) << "sparse T=1100: repeated runs differ";
    ForceMmaSync force;
    expect_kernels_agree(g, run_sparse(kv, in, true), T, H, "sparse fp8 T=1100");
  }
  {
    std::vector<std::pair<int64_t, int64_t>> seqs;
    for (int64_t b = 0; b < 600; ++b) seqs.push_back({1 + b % 2, std::max<int64_t>(1 + b % 2, 1 + (b * 37) % 300)});
    PagedSetup ps = paged_setup(KvMode::kPagedBf16, seqs, 64, 64, 1710);
    const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, {0, ps.in.q.T / 2, ps.in.q.T - 1},
                              sample_heads(64));
    const Result a = run_dense(ps.kv, ps.in, true);
    expect_matches(a, ref, 2.0, "dense B=600");
    ForceMmaSync force;
    expect_kernels_agree(a, run_dense(ps.kv, ps.in, true), ps.in.q.T, 64, "dense B=600");
  }
}

TEST(GpuDecodeHopper, SparseFp8Batch128AgainstBf16Latents) {
  DSA_REQUIRE_GPU();
  // The benchmark shape, smaller cache: B=128 next_n=2, K=2048, H=128, against the
  // dequantised-exact reference (sampled rows) and loosely against the unquantised latents.
  const HostKv kv = make_kv(KvMode::kPagedFp8, 128, 64, 900, nullptr, 0, false);
  const int64_t T = 256, H = 128, K = 2048;
  SparseInputs in;
  in.q = make_q(T, H, 901);
  in.K = K;
  in.indices = random_indices(T, K, kv.num_keys, 902, 0.0);
  const std::vector<int64_t> tokens = {0, 1, 127, 255};
  const Ref exact = reference(kv, in.q, sparse_keys(kv, in), {}, tokens, sample_heads(H));
  const Result g = run_sparse(kv, in, true, {DType::kF32, 0});
  expect_matches(g, exact, 2.0, "sparse fp8 B=128");
  HostKv latents = kv;
  latents.value = latents.orig;
  const Ref loose = reference(latents, in.q, sparse_keys(latents, in), {}, tokens, sample_heads(H));
  double err2 = 0.0, mag2 = 0.0, worst_lse = 0.0;
  for (int64_t t : tokens)
    for (int64_t h : sample_heads(H)) {
      const int64_t row = t * H + h;
      worst_lse = std::max(worst_lse, std::fabs(g.lse[row] - loose.lse[row]));
      for (int64_t d = 0; d < DV; ++d) {
        const double e = g.out[row * DV + d] - loose.out[row * DV + d];
        err2 += e * e;
        mag2 += loose.out_scale[row * DV + d] * loose.out_scale[row * DV + d];
      }
    }
  EXPECT_LT(std::sqrt(err2 / mag2), 0.08) << "fp8 output far from the bf16 latents (rms)";
  EXPECT_LT(worst_lse, 0.5) << "fp8 lse far from the bf16 latents";
}

// ---- DSA_DECODE_KERNEL=split_s: the decode kernel variant in which both consumer warpgroups
// compute S over half of each key tile (issue 13, round 3). The cases above, run on it: the
// oracle, bit-identical repeats, and the mma.sync kernel as a second opinion on every row.
struct ScopedDecodeKernel : ScopedEnv {
  explicit ScopedDecodeKernel(const char* v) : ScopedEnv("DSA_DECODE_KERNEL", v) {}
};

// The launch just made ran the split_s variant (its name says so through note_kernel).
void expect_split_s_ran(const std::string& what) {
  const std::string name = dsa::last_kernel_name();
  EXPECT_NE(name.find("_split_s"), std::string::npos) << what << ": ran " << name;
}

#define DSA_REQUIRE_SM90()                                                   \
  do {                                                                       \
    DSA_REQUIRE_GPU();                                                       \
    if (!device_is_sm90()) GTEST_SKIP() << "the split_s decode kernel needs sm_90a"; \
  } while (0)

TEST(GpuDecodeHopperSplitS, DenseContextsHeadsNextN) {
  DSA_REQUIRE_SM90();
  for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
    for (int64_t H : {64, 128}) {
      for (int64_t next_n = 1; next_n <= 4; ++next_n) {
        std::vector<std::pair<int64_t, int64_t>> seqs;
        for (int64_t ctx : {1, 63, 64, 65, 2048}) seqs.push_back({next_n, std::max(ctx, next_n)});
        const int64_t page = (next_n == 3 && mode == KvMode::kPagedBf16) ? 16 : 64;
        PagedSetup ps = paged_setup(mode, seqs, H, page, 300 + 10 * H + next_n);
        const std::string what = std::string("split_s ") + (mode == KvMode::kPagedFp8 ? "fp8" : "bf16") +
                                 " H=" + std::to_string(H) + " next_n=" + std::to_string(next_n);
        const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), {}, all_of(ps.in.q.T), sample_heads(H));
        Result g, again;
        {
          ScopedDecodeKernel v("split_s");
          g = run_dense(ps.kv, ps.in, true);
          expect_split_s_ran(what);
          again = run_dense(ps.kv, ps.in, true);
        }
        expect_matches(g, ref, 2.0, what.c_str());
        EXPECT_TRUE(g.raw == again.raw) << what << ": repeated runs differ";
        ForceMmaSync force;
        expect_kernels_agree(g, run_dense(ps.kv, ps.in, true), ps.in.q.T, H, what.c_str());
      }
    }
  }
}

TEST(GpuDecodeHopperSplitS, DenseFewAndOddHeadsSinkF32Out) {
  DSA_REQUIRE_SM90();
  for (int64_t H : {1, 5, 16, 32, 100}) {
    PagedSetup ps = paged_setup(KvMode::kPagedBf16, {{2, 130}, {1, 1}, {4, 700}, {3, 64}}, H, 64, 400 + H);
    ps.in.sink = random_sink(H, 401 + H);
    const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), ps.in.sink, all_of(ps.in.q.T), all_of(H));
    const std::string what = "split_s dense H=" + std::to_string(H);
    Result g;
    {
      ScopedDecodeKernel v("split_s");
      g = run_dense(ps.kv, ps.in, true, {DType::kF32, 3});
      expect_split_s_ran(what);
    }
    expect_matches(g, ref, 2.0, what.c_str());
    ForceMmaSync force;
    expect_kernels_agree(g, run_dense(ps.kv, ps.in, true, {DType::kF32, 3}), ps.in.q.T, H, what.c_str());
  }
}

// Split (combined partials) and whole-row-block schedules, and the 128K context.
TEST(GpuDecodeHopperSplitS, DenseSplitWholeAnd128K) {
  DSA_REQUIRE_SM90();
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {{1, 20000}}, std::vector<std::pair<int64_t, int64_t>>(128, {1, 300}), {{2, 9000}, {1, 40}, {1, 5000}},
      {{1, 131072}}};
  for (size_t i = 0; i < batches.size(); ++i) {
    for (KvMode mode : {KvMode::kPagedBf16, KvMode::kPagedFp8}) {
      PagedSetup ps = paged_setup(mode, batches[i], 128, 64, 500 + i);
      if (i < 3) ps.in.sink = random_sink(128, 510 + i);
      const std::string what = "split_s schedule " + std::to_string(i) + (mode == KvMode::kPagedFp8 ? " fp8" : " bf16");
      const std::vector<int64_t> tokens = {0, ps.in.q.T / 2, ps.in.q.T - 1};
      const Ref ref = reference(ps.kv, ps.in.q, dense_keys(ps.kv, ps.in), ps.in.sink, tokens, sample_heads(128));
      Result a, b;
      {
        ScopedDecodeKernel v("split_s");
        a = run_dense(ps.kv, ps.in, true);
        expect_split_s_ran(what);
        b = run_dense(ps.kv, ps.in, true);
      }
      expect_matches(a, ref, 2.0, what.c_str());
      EXPECT_TRUE(a.raw == b.raw) << what << ": repeated runs differ";
      EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4)) << what << ": repeated lse differ";
      ForceMmaSync force;
      expect_kernels_agree(a, run_dense(ps.kv, ps.in, true), ps.in.q.T, 128, what.c_str());
    }
  }
}

TEST(GpuDecodeHopperSplitS, SparseFp8DecodeHeadsTopkLengthSink) {
  DSA_REQUIRE_SM90();
  auto used = [](int64_t s) { return s % 5 != 2; };
  const HostKv kv = make_kv(KvMode::kPagedFp8, 80, 64, 800, used);
  for (int64_t H : {16, 32, 64, 128}) {
    const SparseInputs in = sparse_fp8_decode_case(kv, H, used);
    const int64_t T = in.q.T;
    const std::string what = "split_s sparse fp8 H=" + std::to_string(H);
    const Ref ref = reference(kv, in.q, sparse_keys(kv, in), in.sink, all_of(T), sample_heads(H));
    Result g, again;
    {
      ScopedDecodeKernel v("split_s");
      EXPECT_STREQ(kernel_for(kv, in), "sparse_mla.wgmma_fp8_splitkv_split_s") << what;
      g = run_sparse(kv, in, true);
      expect_split_s_ran(what);
      again = run_sparse(kv, in, true);
    }
    expect_matches(g, ref, 2.0, what.c_str());
    EXPECT_TRUE(g.raw == again.raw) << what << ": repeated runs differ";
    ForceMmaSync force;
    expect_kernels_agree(g, run_sparse(kv, in, true), T, H, what.c_str());
  }
}

}  // namespace
