// Kernel bodies of dense attention in MHA form (SPEC §5b) that run on every GPU (sm_80+):
// the latent gather and the portable attention kernel. The Hopper kernel is in
// mha_prefill_hopper.cuh; tile constants of both in mha_prefill_config.h.
//
// One launch handles one sequence group (src/core/api_mha.cpp): sequence b0 + s of the group
// has its context rows at ctx0(s) .. ctx0(s) + kv_len in the workspace buffers
//   kv     [capacity][H][qk_nope + v] bf16   (written by cuBLAS: latent · kv_b_projᵀ)
//   latent [capacity][576] bf16              (written by mha_gather_kernel)
// ctx0 is the sum of the earlier sequences' kv_len (packed) or s * seq_stride. Device data
// (kv_lens, cu_seqlens_q, block tables) is guarded: a sequence whose lengths do not fit the
// group's plan is skipped by the gather and its output rows are written as NaN; a block-table
// entry outside the cache gathers a NaN row. Valid data never touches unused cache slots.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/mha_prefill_config.h"
#include "dsa/cache.h"
#include "dsa/numerics.h"

namespace dsa {
namespace gpu {
namespace mha {

struct Problem {
  // the group
  int32_t b0 = 0, nb = 0;
  int64_t capacity = 0;     // context rows the workspace holds
  int32_t packed = 1;
  int64_t seq_stride = 0;
  int32_t T = 0;
  const int32_t* kv_lens = nullptr;
  int64_t kv_lens_s = 0;
  const int32_t* cu_q = nullptr;
  int64_t cu_q_s = 0;
  const int32_t* block_table = nullptr;
  int64_t bt_s0 = 0, bt_s1 = 0;
  int32_t max_blocks = 0;
  // the cache
  const uint8_t* cache = nullptr;
  int64_t block_bytes = 0, num_blocks = 0;
  int32_t page = 0, token_bytes = 0, fp8 = 0;
  // workspace
  uint16_t* kv = nullptr;
  uint16_t* latent = nullptr;
  // queries and outputs
  const uint16_t* q_nope = nullptr;
  int64_t qn_s0 = 0, qn_s1 = 0;
  const uint16_t* q_pe = nullptr;
  int64_t qp_s0 = 0, qp_s1 = 0;
  void* out = nullptr;
  int32_t out_bf16 = 1;
  int64_t out_s0 = 0, out_s1 = 0;
  float* lse = nullptr;
  int64_t lse_s0 = 0, lse_s1 = 0;
  const float* sink = nullptr;
  int64_t sink_s = 0;
  int32_t H = 0, nope = 0, v = 0;
  float scale_log2 = 0.f;  // sm_scale · log2(e)
};

// A sequence of the group as the kernels see it.
struct Seq {
  int64_t ctx0;
  int32_t kv_len, q0, q_len;
  bool rows_ok;  // q0 .. q0 + q_len are rows of the batch
  bool ok;       // and the lengths fit the group's plan
};

// Every thread of the block must call it (block reduction for the packed offset).
__device__ __forceinline__ Seq load_seq(const Problem& p, int s) {
  __shared__ long long red[32];
  const int b = p.b0 + s;
  long long part = 0;
  if (p.packed) {
    for (int i = threadIdx.x; i < s; i += blockDim.x) {
      const int32_t k = p.kv_lens[static_cast<int64_t>(p.b0 + i) * p.kv_lens_s];
      part += k > 0 ? k : 0;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = part;
  __syncthreads();
  long long sum = 0;
  for (int w = 0; w < warps; ++w) sum += red[w];
  Seq q;
  q.ctx0 = p.packed ? sum : static_cast<int64_t>(s) * p.seq_stride;
  q.kv_len = p.kv_lens[static_cast<int64_t>(b) * p.kv_lens_s];
  q.q0 = p.cu_q[static_cast<int64_t>(b) * p.cu_q_s];
  const int32_t q1 = p.cu_q[static_cast<int64_t>(b + 1) * p.cu_q_s];
  q.q_len = q1 - q.q0;
  q.rows_ok = q.q0 >= 0 && q1 >= q.q0 && q1 <= p.T;
  const int64_t table = static_cast<int64_t>(p.max_blocks) * p.page;
  q.ok = q.rows_ok && q.kv_len >= 0 && q.kv_len <= table && q.q_len <= q.kv_len &&
         (p.packed ? q.ctx0 + q.kv_len <= p.capacity : q.kv_len <= p.seq_stride);
  return q;
}

// grid (ceil(rows / kGatherTokens), nb), kGatherThreads threads: one warp per context token.
__global__ void __launch_bounds__(kGatherThreads) mha_gather_kernel(const Problem p) {
  const Seq sq = load_seq(p, blockIdx.y);
  if (!sq.ok) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGatherTokens + warp;
  if (j >= sq.kv_len) {
    // Strided groups: zero the sequence's padding rows, so that the attention kernels' tiles
    // past the context hold finite keys and values (they are masked, and 0 · NaN would not be).
    if (!p.packed && j < p.seq_stride) {
      uint4* d4 = reinterpret_cast<uint4*>(p.latent + (sq.ctx0 + j) * kRowElems);
      for (int c = lane; c < kRowElems / 8; c += 32) d4[c] = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int b = p.b0 + blockIdx.y;
  const int32_t blk = p.block_table[static_cast<int64_t>(b) * p.bt_s0 + (j / p.page) * p.bt_s1];
  uint16_t* dst = p.latent + (sq.ctx0 + j) * kRowElems;
  if (blk < 0 || blk >= p.num_blocks) {
    for (int d = lane; d < kRowElems; d += 32) dst[d] = 0x7fc0;  // NaN: a bad block table shows
    return;
  }
  const uint8_t* tok = p.cache + static_cast<int64_t>(blk) * p.block_bytes + (j % p.page) * p.token_bytes;
  if (!p.fp8) {
    const uint4* src = reinterpret_cast<const uint4*>(tok);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int c = lane; c < kRowElems / 8; c += 32) d4[c] = src[c];
    return;
  }
  // FP8: lane owns values 16·lane .. +16 of c_kv (tile lane / 8), e4m3 · 2^k is exact in bf16.
  const float scale = reinterpret_cast<const float*>(tok + kMlaFp8ScaleOffset)[lane / 8];
  const uint4 raw = reinterpret_cast<const uint4*>(tok)[lane];
  const uint8_t* q8 = reinterpret_cast<const uint8_t*>(&raw);
  uint32_t packed[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = float_to_bf16(e4m3_to_float(q8[2 * i]) * scale);
    const uint32_t hi = float_to_bf16(e4m3_to_float(q8[2 * i + 1]) * scale);
    packed[i] = lo | (hi << 16);
  }
  uint4* d4 = reinterpret_cast<uint4*>(dst) + 2 * lane;
  d4[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  d4[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  if (lane < 8) {
    reinterpret_cast<uint4*>(dst + 512)[lane] = reinterpret_cast<const uint4*>(tok + kMlaFp8RopeOffset)[lane];
  }
}

// Writes the output row (t, h) of a finished query: acc / l with the sink factor, lse.
__device__ __forceinline__ float finish_factor(const Problem& p, int h, float m, float l, float* lse_out) {
  const float lse = (m + log2f(l)) * kLn2;
  float f = 1.f / l;
  if (p.sink) f /= 1.f + expf(p.sink[h * p.sink_s] - lse);
  *lse_out = lse;
  return f;
}

__device__ __forceinline__ void store_out(const Problem& p, int64_t t, int h, int d, float x) {
  const int64_t o = t * p.out_s0 + static_cast<int64_t>(h) * p.out_s1 + d;
  if (p.out_bf16) static_cast<uint16_t*>(p.out)[o] = float_to_bf16(x);
  else static_cast<float*>(p.out)[o] = x;
}

// Rows of a sequence whose lengths did not validate on the device: NaN, visibly.
__device__ __forceinline__ void poison_rows(const Problem& p, const Seq& sq, int h, int r0, int rows) {
  const float nan = __int_as_float(0x7fc00000);
  for (int r = r0; r < r0 + rows && r < sq.q_len; ++r) {
    const int64_t t = sq.q0 + r;
    for (int d = threadIdx.x; d < p.v; d += blockDim.x) store_out(p, t, h, d, nan);
    if (threadIdx.x == 0) p.lse[t * p.lse_s0 + static_cast<int64_t>(h) * p.lse_s1] = nan;
  }
}

// ---- the portable kernel: f32 CUDA cores, simple and obviously right -------------------------
// grid (q blocks, H, nb), 128 threads: 4 warps x 4 query rows (kPortRows = 16 rows); key tiles
// of 32 in shared memory (bf16, rows padded by one word against bank conflicts); lane = key
// for the scores, lane = output column (strided by 32) for P·V. Online softmax in log2 domain.
template <int kNope, int kV>
__global__ void __launch_bounds__(kPortThreads) mha_attn_portable_kernel(const Problem p) {
  constexpr int kQk = kNope + kRopeElems;
  constexpr int kKW = kQk / 2 + 1;  // K row stride in 32-bit words (odd)
  constexpr int kVW = kV / 2;
  constexpr int kCols = kV / 32;    // output columns per lane
  extern __shared__ __align__(16) uint8_t smem[];
  float* qs = reinterpret_cast<float*>(smem);                                      // [16][kQk]
  uint32_t* ks = reinterpret_cast<uint32_t*>(qs + kPortRows * kQk);                // [32][kKW]
  uint32_t* vs = ks + kPortKeys * kKW;                                             // [32][kVW]

  const int h = blockIdx.y;
  const Seq sq = load_seq(p, blockIdx.z);
  const int nqb = (sq.q_len + kPortRows - 1) / kPortRows;
  const int qb = nqb - 1 - static_cast<int>(blockIdx.x);  // heaviest (latest) blocks first
  if (!sq.rows_ok || qb < 0) return;
  const int r0 = qb * kPortRows;
  if (!sq.ok) {
    poison_rows(p, sq, h, r0, kPortRows);
    return;
  }
  const int rows = min(kPortRows, sq.q_len - r0);
  const int prefix = sq.kv_len - sq.q_len;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  for (int i = threadIdx.x; i < kPortRows * kQk; i += blockDim.x) {
    const int r = i / kQk, d = i % kQk;
    float x = 0.f;
    if (r < rows) {
      const int64_t t = sq.q0 + r0 + r;
      x = d < kNope ? bf16_to_float(p.q_nope[t * p.qn_s0 + h * p.qn_s1 + d])
                    : bf16_to_float(p.q_pe[t * p.qp_s0 + h * p.qp_s1 + (d - kNope)]);
    }
    qs[i] = x * p.scale_log2;
  }

  float m[4], l[4], acc[4][kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.f;
  }
  const int keys = prefix + r0 + rows;  // the last row's L
  const int64_t row_elems = static_cast<int64_t>(p.H) * (kNope + kV);
  for (int k0 = 0; k0 < keys; k0 += kPortKeys) {
    __syncthreads();  // the previous tile is consumed (and qs written, on the first pass)
    for (int i = threadIdx.x; i < kPortKeys * (kQk / 2); i += blockDim.x) {
      const int j = i / (kQk / 2), w = i % (kQk / 2);
      uint32_t x = 0;
      if (k0 + j < keys) {
        const int64_t row = sq.ctx0 + k0 + j;
        x = 2 * w < kNope ? reinterpret_cast<const uint32_t*>(p.kv + row * row_elems + h * (kNope + kV))[w]
                          : reinterpret_cast<const uint32_t*>(p.latent + row * kRowElems + 512)[w - kNope / 2];
      }
      ks[j * kKW + w] = x;
    }
    for (int i = threadIdx.x; i < kPortKeys * kVW; i += blockDim.x) {
      const int j = i / kVW, w = i % kVW;
      uint32_t x = 0;
      if (k0 + j < keys) {
        const int64_t row = sq.ctx0 + k0 + j;
        x = reinterpret_cast<const uint32_t*>(p.kv + row * row_elems + h * (kNope + kV) + kNope)[w];
      }
      vs[j * kVW + w] = x;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = warp * 4 + i;
      if (r >= rows) continue;  // warp-uniform
      const float* q = qs + r * kQk;
      float s = 0.f;
      const uint32_t* kr = ks + lane * kKW;
#pragma unroll 8
      for (int w = 0; w < kQk / 2; ++w) {
        const uint32_t x = kr[w];
        s += q[2 * w] * __uint_as_float(x << 16) + q[2 * w + 1] * __uint_as_float(x & 0xffff0000u);
      }
      const int L = prefix + r0 + r + 1;
      const bool valid = k0 + lane < L;
      s = valid ? s : -INFINITY;
      float mx = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (mx == -INFINITY) continue;  // a tile past this row's keys (warp-uniform)
      const float m_new = fmaxf(m[i], mx);
      const float alpha = exp2f(m[i] - m_new);  // 0 on the first tile
      const float pj = valid ? exp2f(s - m_new) : 0.f;
      float sum = pj;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      m[i] = m_new;
      l[i] = l[i] * alpha + sum;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= alpha;
      for (int j = 0; j < kPortKeys; ++j) {
        const float pjj = __shfl_sync(0xffffffffu, pj, j);
        const uint16_t* vr = reinterpret_cast<const uint16_t*>(vs + j * kVW);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[i][c] += pjj * bf16_to_float(vr[lane + 32 * c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = warp * 4 + i;
    if (r >= rows) continue;
    const int64_t t = sq.q0 + r0 + r;
    float lse;
    const float f = finish_factor(p, h, m[i], l[i], &lse);
#pragma unroll
    for (int c = 0; c < kCols; ++c) store_out(p, t, h, lane + 32 * c, acc[i][c] * f);
    if (lane == 0) p.lse[t * p.lse_s0 + static_cast<int64_t>(h) * p.lse_s1] = lse;
  }
}

template <int kNope, int kV>
constexpr int portable_smem_bytes() {
  return kPortRows * (kNope + kRopeElems) * 4 + kPortKeys * ((kNope + kRopeElems) / 2 + 1) * 4 + kPortKeys * kV * 2;
}

}  // namespace mha
}  // namespace gpu
}  // namespace dsa
