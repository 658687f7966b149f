// CPU indexer preparation (SPEC §3.1-3): RoPE -> optional Hadamard-128 -> BF16 -> FP8 with one
// ue8m0 scale per vector. Each 128-vector is processed in a small f32 buffer by straight-line
// loops the compiler vectorises; vectors are independent, so threads split them freely.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/fp8_block.h"
#include "cpu/parallel.h"
#include "dsa/geometry.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

constexpr int kD = kIndexHeadDim;     // 128
constexpr int kHalf = kIndexRopeDim / 2;  // 32 rotation pairs
// fl(1 / sqrt(128)): the normalisation of the Hadamard transform.
const float kInvSqrt128 = static_cast<float>(1.0 / std::sqrt(128.0));

// Loads n values (f32 or bf16) into f32.
inline void load_row(const void* src, DType dtype, int64_t n, float* __restrict dst) {
  if (dtype == DType::kBF16) {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

inline float load_scalar(const TensorDesc& t, int64_t offset) {
  if (t.dtype == DType::kBF16) return bf16_to_float(t.ptr<const uint16_t>()[offset]);
  return t.ptr<const float>()[offset];
}

// Rotates dims 0..63 by (cos[i], sin[i]) per pair: a' = a cos - b sin, b' = b cos + a sin.
inline void apply_rope(float* __restrict x, const float* __restrict cs, RopeStyle style) {
  const float* __restrict cosv = cs;
  const float* __restrict sinv = cs + kHalf;
  if (style == RopeStyle::kHalfSplit) {
    for (int i = 0; i < kHalf; ++i) {
      float a = x[i], b = x[i + kHalf];
      x[i] = a * cosv[i] - b * sinv[i];
      x[i + kHalf] = b * cosv[i] + a * sinv[i];
    }
  } else {
    float out[2 * kHalf];
    for (int i = 0; i < kHalf; ++i) {
      float a = x[2 * i], b = x[2 * i + 1];
      out[2 * i] = a * cosv[i] - b * sinv[i];
      out[2 * i + 1] = b * cosv[i] + a * sinv[i];
    }
    std::memcpy(x, out, sizeof(out));
  }
}

// Normalised fast Walsh-Hadamard transform in Sylvester order: H[i][j] = (-1)^popcount(i & j).
// Constant-geometry form: the same stage, y[i] = x[2i] + x[2i+1], y[i+64] = x[2i] - x[2i+1],
// applied log2(128) = 7 times yields the natural order; each stage is one even/odd
// deinterleave with contiguous stores, which vectorises.
inline void wht_stage(const float* __restrict in, float* __restrict out) {
  for (int i = 0; i < kD / 2; ++i) {
    const float a = in[2 * i], b = in[2 * i + 1];
    out[i] = a + b;
    out[i + kD / 2] = a - b;
  }
}

inline void apply_hadamard(float* __restrict x) {
  alignas(64) float buf[kD];
  for (int pair = 0; pair < 3; ++pair) {
    wht_stage(x, buf);
    wht_stage(buf, x);
  }
  wht_stage(x, buf);  // the 7th stage
  for (int i = 0; i < kD; ++i) x[i] = buf[i] * kInvSqrt128;
}

// Rounds x[0..n) to BF16 in place and quantises it to e4m3; returns the ue8m0 scale.
inline float quantize_group(float* __restrict x, int64_t n, uint8_t* __restrict out) {
  const float s = ue8m0_scale(round_bf16_and_amax(x, n));
  quantize_block(x, n, 1.0f / s, out);  // 1 / s is exact: s is a power of two
  return s;
}

// The RoPE -> Hadamard -> BF16 -> FP8 pipeline for one 128-vector.
inline float prepare_vector(const void* src, DType dtype, const float* cs, RopeStyle rope,
                            bool hadamard, uint8_t* out) {
  alignas(64) float x[kD];
  load_row(src, dtype, kD, x);
  apply_rope(x, cs, rope);
  if (hadamard) apply_hadamard(x);
  return quantize_group(x, kD, out);
}

}  // namespace

StatusCode quantize_fp8(const QuantizeFp8Params& p) {
  const int64_t R = p.x.shape[0], D = p.x.shape[1], g = p.group;
  const int64_t groups = D / g;
  const int64_t es = static_cast<int64_t>(dtype_size(p.x.dtype));
  const char* xb = static_cast<const char*>(p.x.data);
  uint8_t* ob = p.out.ptr<uint8_t>();
  float* sb = p.scale.ptr<float>();
  const int64_t n = R * groups;
  return parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(g, 1)), [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(g));
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = i / groups, k = i % groups;
      load_row(xb + (r * p.x.stride[0] + k * g) * es, p.x.dtype, g, buf.data());
      sb[r * p.scale.stride[0] + k * p.scale.stride[1]] =
          quantize_group(buf.data(), g, ob + r * p.out.stride[0] + k * g);
    }
  });
}

// Position t of an i32 or i64 vector.
static int64_t position_at(const TensorDesc& pos, int64_t t) {
  return pos.dtype == DType::kI64 ? pos.ptr<const int64_t>()[t * pos.stride[0]]
                                  : static_cast<int64_t>(pos.ptr<const int32_t>()[t * pos.stride[0]]);
}

StatusCode prepare_indexer_q(const PrepareIndexerQParams& p) {
  const int64_t T = p.q.shape[0], H = p.q.shape[1];
  const int64_t es = static_cast<int64_t>(dtype_size(p.q.dtype));
  const char* qb = static_cast<const char*>(p.q.data);
  const float* cs = p.cos_sin.ptr<const float>();
  uint8_t* qo = p.q_out.ptr<uint8_t>();
  float* wo = p.weights_out.ptr<float>();
  float* qs = p.q_scale.present() ? p.q_scale.ptr<float>() : nullptr;
  // c = fl(1 / sqrt(128 * H_idx)), computed in double so every backend gets the same float.
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kD * H)));
  return parallel_for(T * H, 32, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / H, h = i % H;
      const float* row_cs = cs + position_at(p.positions, t) * p.cos_sin.stride[0];
      const float s = prepare_vector(qb + (t * p.q.stride[0] + h * p.q.stride[1]) * es, p.q.dtype,
                                     row_cs, p.rope, p.hadamard,
                                     qo + t * p.q_out.stride[0] + h * p.q_out.stride[1]);
      const float w = load_scalar(p.weights, t * p.weights.stride[0] + h * p.weights.stride[1]);
      const float wc = w * c;
      wo[t * p.weights_out.stride[0] + h * p.weights_out.stride[1]] = wc * s;
      if (qs) qs[t * p.q_scale.stride[0] + h * p.q_scale.stride[1]] = s;
    }
  });
}

StatusCode prepare_indexer_k(const PrepareIndexerKParams& p) {
  const int64_t T = p.k.shape[0];
  const int64_t es = static_cast<int64_t>(dtype_size(p.k.dtype));
  const char* kb = static_cast<const char*>(p.k.data);
  const float* cs = p.cos_sin.ptr<const float>();
  uint8_t* ko = p.k_out.ptr<uint8_t>();
  float* ks = p.k_scale.ptr<float>();
  return parallel_for(T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* row_cs = cs + position_at(p.positions, t) * p.cos_sin.stride[0];
      ks[t * p.k_scale.stride[0]] = prepare_vector(kb + t * p.k.stride[0] * es, p.k.dtype, row_cs,
                                                   p.rope, p.hadamard, ko + t * p.k_out.stride[0]);
    }
  });
}

}  // namespace cpu
}  // namespace dsa
