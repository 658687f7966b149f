// Kernel bodies of the indexer preparation family (SPEC §3.1-3). One warp per quantisation
// group / 128-vector; the arithmetic mirrors the CPU backend operation for operation
// (RoPE a*c - b*s, Sylvester-order Hadamard butterflies, then *fl(1/sqrt(128))), and the
// BF16/E4M3/ue8m0 steps come from dsa/numerics.h, so the bytes match the CPU wherever the
// f32 rounding of RoPE matches (always for the quantisation itself).
#pragma once
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace prep {

constexpr int kD = 128;
constexpr int kHalf = 32;
constexpr int kWarpsPerBlock = 8;

// Per-group FP8: warp w of the grid handles group g = w; lanes stride over the group.
struct QuantArgs {
  const char* x; bool x_bf16; int64_t x_stride0; int64_t x_esize;
  uint8_t* out; int64_t out_stride0;
  float* scale; int64_t scale_stride0, scale_stride1;
  int64_t rows, groups, group;
};

__global__ void quantize_fp8_kernel(QuantArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       g < a.rows * a.groups; g += warps) {
    const int64_t r = g / a.groups, k = g % a.groups;
    const char* src = a.x + (r * a.x_stride0 + k * a.group) * a.x_esize;
    float amax = 0.f;
    for (int64_t i = lane; i < a.group; i += kWarp)
      amax = fmaxf(amax, fabsf(round_to_bf16(load_f32_or_bf16(src, a.x_bf16, i))));
    amax = warp_max(amax);
    const float s = ue8m0_scale(amax);
    const float inv = 1.0f / s;  // exact: a power of two
    uint8_t* dst = a.out + r * a.out_stride0 + k * a.group;
    for (int64_t i = lane; i < a.group; i += kWarp)
      dst[i] = quantize_e4m3(round_to_bf16(load_f32_or_bf16(src, a.x_bf16, i)), inv);
    if (lane == 0) a.scale[r * a.scale_stride0 + k * a.scale_stride1] = s;
  }
}

// Rotates dims 0..63 of the warp's vector in shared memory (one pair per lane).
__device__ __forceinline__ void rope_pair(float* x, const float* cs, bool interleaved, int lane) {
  const int i0 = interleaved ? 2 * lane : lane;
  const int i1 = interleaved ? 2 * lane + 1 : lane + kHalf;
  const float c = cs[lane], s = cs[kHalf + lane];
  const float a = x[i0], b = x[i1];
  const float ra = a * c - b * s;
  const float rb = b * c + a * s;
  __syncwarp();
  x[i0] = ra;
  x[i1] = rb;
  __syncwarp();
}

// Normalised Walsh-Hadamard (Sylvester order), the CPU's butterfly order: 64 butterflies per
// stage, two per lane.
__device__ __forceinline__ void hadamard128(float* x, int lane, float inv_sqrt128) {
#pragma unroll
  for (int h = 1; h < kD; h *= 2) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int b = lane + q * kWarp;                  // butterfly 0..63
      const int j = (b / h) * (2 * h) + (b % h);       // its lower element
      const float u = x[j], v = x[j + h];
      x[j] = u + v;
      x[j + h] = u - v;
    }
    __syncwarp();
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) x[lane + q * kWarp] *= inv_sqrt128;
  __syncwarp();
}

// Quantises the warp's 128 values (already in x) to out; returns the scale (all lanes).
__device__ __forceinline__ float quantize_vec128(const float* x, uint8_t* out, int lane) {
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    v[q] = round_to_bf16(x[lane + q * kWarp]);
    amax = fmaxf(amax, fabsf(v[q]));
  }
  amax = warp_max(amax);
  const float s = ue8m0_scale(amax);
  const float inv = 1.0f / s;
#pragma unroll
  for (int q = 0; q < 4; ++q) out[lane + q * kWarp] = quantize_e4m3(v[q], inv);
  return s;
}

struct VecArgs {
  const char* src; bool src_bf16; int64_t esize;
  int64_t s0, s1;            // element strides of [T, H, 128] (s1 unused for k: H == 1)
  IdxVec positions;  // i32 or i64
  const float* cos_sin; int64_t cs_stride0; int64_t max_positions;
  bool interleaved, hadamard;
  float inv_sqrt128;
  uint8_t* out; int64_t o0, o1;
  int64_t T, H;
  // q only
  const void* w; bool w_bf16; int64_t w0, w1;
  float gate_c;
  float* w_out; int64_t wo0, wo1;
  float* q_scale; int64_t qs0, qs1;
  // k only
  float* k_scale; int64_t ks0;
};

// One warp per (token, head) vector. A position outside the RoPE table (device data cannot be
// checked by the API) zeroes the vector, its scale and its gate: it contributes nothing.
template <bool kIsQuery>
__global__ void prepare_vec_kernel(VecArgs a) {
  __shared__ float buf[kWarpsPerBlock][kD];
  const int lane = threadIdx.x % kWarp;
  const int wib = threadIdx.x / kWarp;
  float* x = buf[wib];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + wib; v < a.T * a.H; v += warps) {
    const int64_t t = v / a.H, h = v % a.H;
    const int64_t pos = a.positions[t];
    uint8_t* out = a.out + t * a.o0 + h * a.o1;
    const bool valid = pos >= 0 && pos < a.max_positions;
    if (!valid) {
#pragma unroll
      for (int q = 0; q < 4; ++q) out[lane + q * kWarp] = 0;
      if (lane == 0) {
        if (kIsQuery) {
          a.w_out[t * a.wo0 + h * a.wo1] = 0.f;
          if (a.q_scale) a.q_scale[t * a.qs0 + h * a.qs1] = 0.f;
        } else {
          a.k_scale[t * a.ks0] = 0.f;
        }
      }
      continue;
    }
    const char* src = a.src + (t * a.s0 + h * a.s1) * a.esize;
#pragma unroll
    for (int q = 0; q < 4; ++q) x[lane + q * kWarp] = load_f32_or_bf16(src, a.src_bf16, lane + q * kWarp);
    __syncwarp();
    rope_pair(x, a.cos_sin + pos * a.cs_stride0, a.interleaved, lane);
    if (a.hadamard) hadamard128(x, lane, a.inv_sqrt128);
    const float s = quantize_vec128(x, out, lane);
    __syncwarp();  // x is reused by the next vector
    if (lane == 0) {
      if (kIsQuery) {
        const float w = load_f32_or_bf16(a.w, a.w_bf16, t * a.w0 + h * a.w1);
        const float wc = w * a.gate_c;
        a.w_out[t * a.wo0 + h * a.wo1] = wc * s;
        if (a.q_scale) a.q_scale[t * a.qs0 + h * a.qs1] = s;
      } else {
        a.k_scale[t * a.ks0] = s;
      }
    }
  }
}

}  // namespace prep
}  // namespace gpu
}  // namespace dsa
