// Kernel bodies of the indexer logits family (SPEC §3.4).
//
// logits[r, c] = s_k[j] * Σ_h w[r, h] * relu(q[r, h] · k[j]) for the key j of column c.
// Two kernels, one contract: logits_mma_kernel (tensor cores, H_idx <= 64, the default) and
// logits_tile_kernel (SIMT, any H_idx; the reference). Each block scores one row against a
// tile of columns: a small GEMM of (heads x 128) by (128 x keys) through shared memory on
// exactly converted e4m3 values with f32 accumulation, relu and the gate folded in, then a
// fixed-order reduction over heads (deterministic). The key source (flat buffer or paged
// cache) is a template parameter that resolves column -> key pointer with every
// data-dependent address guarded; an unresolvable key is an invalid column (-inf). Tuned
// kernels replace these behind the same launcher.
#pragma once
#include <cuda_fp16.h>
#include <math_constants.h>

#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace logits {

constexpr int kThreads = 256;
constexpr int kTileKeys = 128;
constexpr int kKeyGroups = 16;                        // threads along keys
constexpr int kHeadGroups = kThreads / kKeyGroups;    // 16 threads along heads
constexpr int kKeysPerThread = kTileKeys / kKeyGroups;  // 8: keys kg + 16 * i
constexpr int kDChunk = 32;
constexpr int kD = 128;

struct QArgs {
  const uint8_t* q; int64_t q0, q1;
  const float* w; int64_t w0, w1;
  void* out; int64_t out0; bool out_bf16;  // logits f32, or bf16 (round to nearest even)
  int64_t rows, width, heads;
  int64_t col_offset;
};

// One logit into an f32 or bf16 row (bf16: round to nearest even; -inf stays -inf).
struct OutRow {
  void* p; bool bf16;
  __device__ __forceinline__ void set(int64_t c, float v) const {
    if (bf16) static_cast<uint16_t*>(p)[c] = float_to_bf16(v);
    else static_cast<float*>(p)[c] = v;
  }
};
__device__ __forceinline__ OutRow out_row_of(void* out, int64_t out0, bool bf16, int64_t r) {
  return OutRow{bf16 ? static_cast<void*>(static_cast<uint16_t*>(out) + r * out0)
                     : static_cast<void*>(static_cast<float*>(out) + r * out0), bf16};
}

// The keys of one row: column c is key j = base + c, valid iff j in [lo, hi).
struct RowKeys {
  int64_t base, lo, hi;
  int64_t seq;
  bool skip;  // the row is not computed (paged skip_rows_up_to): nothing is written
};

struct FlatKeys {
  const uint8_t* k; int64_t k0;
  const float* k_scale; int64_t ks0;
  I32Vec ks, ke;
  int64_t n;
  bool aligned16;

  __device__ RowKeys row(int64_t r, int64_t col_offset) const {
    const int64_t s = ks[r], e = ke[r];
    RowKeys rk;
    rk.base = s + col_offset;
    rk.lo = s > 0 ? s : 0;
    rk.hi = e < n ? e : n;
    rk.seq = 0;
    rk.skip = false;
    return rk;
  }
  // Key pointer and scale for a valid j (j in [lo, hi)), nullptr if unresolvable.
  __device__ const uint8_t* key(const RowKeys&, int64_t j, float* scale) const {
    *scale = k_scale[j * ks0];
    return k + j * k0;
  }
};

struct PagedKeys {
  const uint8_t* cache; int64_t block_bytes, page_size, num_blocks;
  I32Mat block_table;
  I32Vec kv_lens; int64_t next_n;
  I32Vec row_seq, row_len; bool general;
  int64_t skip_up_to;  // rows with len <= skip_up_to are skipped
  static constexpr bool aligned16 = true;  // 16-byte aligned cache, 128-byte key rows

  __device__ RowKeys row(int64_t r, int64_t col_offset) const {
    RowKeys rk;
    rk.base = col_offset;
    rk.lo = 0;
    int64_t len;
    if (general) {
      rk.seq = row_seq[r];
      len = row_len[r];
    } else {
      rk.seq = r / next_n;
      len = static_cast<int64_t>(kv_lens[rk.seq]) - next_n + (r % next_n) + 1;
    }
    const int64_t cap = block_table.cols * page_size;
    rk.skip = skip_up_to > 0 && len <= skip_up_to;
    if (rk.seq < 0 || rk.seq >= block_table.rows) len = 0;
    rk.hi = len < cap ? len : cap;
    return rk;
  }
  __device__ const uint8_t* key(const RowKeys& rk, int64_t j, float* scale) const {
    const int64_t blk = block_table.at(rk.seq, j / page_size);
    if (blk < 0 || blk >= num_blocks) return nullptr;
    const uint8_t* page = cache + blk * block_bytes;
    const int64_t off = j % page_size;
    *scale = reinterpret_cast<const float*>(page + page_size * 128)[off];
    return page + off * 128;
  }
};

// kHeadsPerThread (2 or 4): a head chunk is 16 * kHeadsPerThread heads.
template <class Keys, int kHeadsPerThread>
__global__ void __launch_bounds__(kThreads) logits_tile_kernel(QArgs a, Keys keys) {
  constexpr int kHC = kHeadGroups * kHeadsPerThread;
  __shared__ float As[kDChunk][kHC + 1];
  __shared__ float Bs[kDChunk][kTileKeys + 1];
  __shared__ float red[kHeadGroups][kTileKeys];
  __shared__ const uint8_t* key_ptr[kTileKeys];
  __shared__ float key_scale[kTileKeys];
  const int tid = threadIdx.x;
  const int64_t r = blockIdx.x;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTileKeys;
  const RowKeys rk = keys.row(r, a.col_offset);
  if (rk.skip) return;  // block-uniform (one row per block): no barrier is skipped unevenly
  const OutRow out_row = out_row_of(a.out, a.out0, a.out_bf16, r);

  bool mine = false;
  if (tid < kTileKeys) {
    const int64_t c = c0 + tid;
    const int64_t j = rk.base + c;
    const uint8_t* p = nullptr;
    float s = 0.f;
    if (c < a.width && j >= rk.lo && j < rk.hi) p = keys.key(rk, j, &s);
    key_ptr[tid] = p;
    key_scale[tid] = s;
    mine = p != nullptr;
  }
  if (!__syncthreads_or(mine)) {  // no valid key in the tile: -inf, no loads
    if (tid < kTileKeys && c0 + tid < a.width) out_row.set(c0 + tid, -CUDART_INF_F);
    return;
  }

  const int mg = tid / kKeyGroups;  // head group
  const int kg = tid % kKeyGroups;  // key group
  float acc[kKeysPerThread];
#pragma unroll
  for (int i = 0; i < kKeysPerThread; ++i) acc[i] = 0.f;

  const uint8_t* q_row = a.q + r * a.q0;
  constexpr int kAPerThread = kHC * kDChunk / kThreads;  // 2 * kHeadsPerThread
  constexpr int kAThreadsPerHead = kDChunk / kAPerThread;
  const int a_head = tid / kAThreadsPerHead;
  const int a_d0 = (tid % kAThreadsPerHead) * kAPerThread;
  const int b_key = tid / 2;
  const int b_d0 = (tid % 2) * 16;

  for (int64_t hc = 0; hc < a.heads; hc += kHC) {
    float dot[kHeadsPerThread][kKeysPerThread];
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h)
#pragma unroll
      for (int i = 0; i < kKeysPerThread; ++i) dot[h][i] = 0.f;

    for (int dc = 0; dc < kD; dc += kDChunk) {
      __syncthreads();  // the previous chunk's tiles are consumed
      {
        const int64_t h = hc + a_head;
        const uint8_t* src = q_row + h * a.q1 + dc + a_d0;
#pragma unroll
        for (int e = 0; e < kAPerThread; ++e)
          As[a_d0 + e][a_head] = h < a.heads ? e4m3_to_float(src[e]) : 0.f;
      }
      {
        const uint8_t* kp = key_ptr[b_key];
        uint32_t words[4] = {0u, 0u, 0u, 0u};
        if (kp != nullptr) {
          const uint8_t* src = kp + dc + b_d0;
          if (keys.aligned16) {
            const uint4 v = *reinterpret_cast<const uint4*>(src);
            words[0] = v.x; words[1] = v.y; words[2] = v.z; words[3] = v.w;
          } else {
#pragma unroll
            for (int e = 0; e < 16; ++e) words[e / 4] |= static_cast<uint32_t>(src[e]) << (8 * (e % 4));
          }
        }
#pragma unroll
        for (int e = 0; e < 16; ++e)
          Bs[b_d0 + e][b_key] = e4m3_to_float(static_cast<uint8_t>(words[e / 4] >> (8 * (e % 4))));
      }
      __syncthreads();
#pragma unroll 8
      for (int d = 0; d < kDChunk; ++d) {
        float av[kHeadsPerThread], bv[kKeysPerThread];
#pragma unroll
        for (int h = 0; h < kHeadsPerThread; ++h) av[h] = As[d][mg * kHeadsPerThread + h];
#pragma unroll
        for (int i = 0; i < kKeysPerThread; ++i) bv[i] = Bs[d][kg + kKeyGroups * i];
#pragma unroll
        for (int h = 0; h < kHeadsPerThread; ++h)
#pragma unroll
          for (int i = 0; i < kKeysPerThread; ++i) dot[h][i] = fmaf(av[h], bv[i], dot[h][i]);
      }
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      const int64_t head = hc + mg * kHeadsPerThread + h;
      const float w = head < a.heads ? a.w[r * a.w0 + head * a.w1] : 0.f;
#pragma unroll
      for (int i = 0; i < kKeysPerThread; ++i) acc[i] = fmaf(w, fmaxf(dot[h][i], 0.f), acc[i]);
    }
  }

#pragma unroll
  for (int i = 0; i < kKeysPerThread; ++i) red[mg][kg + kKeyGroups * i] = acc[i];
  __syncthreads();
  if (tid < kTileKeys && c0 + tid < a.width) {
    float s = 0.f;
#pragma unroll
    for (int g = 0; g < kHeadGroups; ++g) s += red[g][tid];
    out_row.set(c0 + tid, key_ptr[tid] != nullptr ? s * key_scale[tid] : -CUDART_INF_F);
  }
}

// ---- tensor-core kernel ----------------------------------------------------------------
// The same score with mma.sync m16n8k16 F16 -> F32: e4m3 values are exact in F16 (one
// cvt.rn.f16x2.e4m3x2 per pair) and their products exact in F32, so only the accumulation
// order differs from the SIMT kernel. One block
// (4 warps) scores one row against kMmaChunk columns: the row's q (heads x 128, padded to
// 16 * kMTiles heads with zeros) is staged once, then kMmaKeys-key sub-tiles are staged in
// turn; warp w owns keys [16 w, 16 w + 16) of a sub-tile, all heads. relu and the gate are
// applied per accumulator, the sum over heads is a fixed-order shuffle reduction.
constexpr int kMmaThreads = 128;
constexpr int kMmaKeys = 64;
constexpr int kMmaChunk = 512;
constexpr int kMmaStride = kD + 8;  // f16 row stride in shared memory: conflict-free fragments

__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two e4m3 bytes (lo, hi: the low 8 bits of each) -> a packed pair of F16 (exact), lo in the
// low half.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t lo, uint32_t hi) {
#if __CUDA_ARCH__ >= 890
  const uint16_t pair = static_cast<uint16_t>((lo & 0xffu) | ((hi & 0xffu) << 8));
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(pair));
  return out;
#else
  // No fp8 conversion instruction before sm_89: every e4m3 value is exact in f16.
  const uint32_t l = __half_as_ushort(__float2half_rn(e4m3_to_float(static_cast<uint8_t>(lo))));
  const uint32_t h = __half_as_ushort(__float2half_rn(e4m3_to_float(static_cast<uint8_t>(hi))));
  return l | (h << 16);
#endif
}

template <class Keys, int kMTiles>
__global__ void __launch_bounds__(kMmaThreads) logits_mma_kernel(QArgs a, Keys keys) {
  constexpr int kHeads = 16 * kMTiles;
  __shared__ __align__(16) uint16_t Qs[kHeads][kMmaStride];  // f16 bits
  __shared__ __align__(16) uint16_t Ks[kMmaKeys][kMmaStride];
  __shared__ float w_s[kHeads];
  __shared__ const uint8_t* key_ptr[kMmaKeys];
  __shared__ float key_scale[kMmaKeys];

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t2 = (lane % 4) * 2;
  const int64_t r = blockIdx.x;
  const int64_t chunk0 = static_cast<int64_t>(blockIdx.y) * kMmaChunk;
  const RowKeys rk = keys.row(r, a.col_offset);
  if (rk.skip) return;  // block-uniform (one row per block): no barrier is skipped unevenly
  const OutRow out_row = out_row_of(a.out, a.out0, a.out_bf16, r);

  // The row's queries, once per block (zero rows pad the heads).
  const uint8_t* q_row = a.q + r * a.q0;
  for (int e = tid; e < kHeads * kD / 2; e += kMmaThreads) {
    const int h = e / (kD / 2), d = (e % (kD / 2)) * 2;
    uint32_t v = 0;
    if (h < a.heads) v = e4m3x2_to_f16x2(q_row[h * a.q1 + d], q_row[h * a.q1 + d + 1]);
    *reinterpret_cast<uint32_t*>(&Qs[h][d]) = v;
  }
  for (int h = tid; h < kHeads; h += kMmaThreads) w_s[h] = h < a.heads ? a.w[r * a.w0 + h * a.w1] : 0.f;

  for (int64_t c0 = chunk0; c0 < chunk0 + kMmaChunk && c0 < a.width; c0 += kMmaKeys) {
    __syncthreads();  // the previous sub-tile (and key_ptr) is consumed; Qs is written
    bool mine = false;
    if (tid < kMmaKeys) {
      const int64_t c = c0 + tid;
      const int64_t j = rk.base + c;
      const uint8_t* p = nullptr;
      float sc = 0.f;
      if (c < a.width && j >= rk.lo && j < rk.hi) p = keys.key(rk, j, &sc);
      key_ptr[tid] = p;
      key_scale[tid] = sc;
      mine = p != nullptr;
    }
    if (!__syncthreads_or(mine)) {  // nothing valid: -inf, no loads
      if (tid < kMmaKeys && c0 + tid < a.width) out_row.set(c0 + tid, -CUDART_INF_F);
      continue;
    }
    {  // stage the keys: thread -> (key tid / 2, half tid % 2) = 64 bytes
      const int key = tid / 2, half = tid % 2;
      const uint8_t* kp = key_ptr[key];
      uint32_t* dst = reinterpret_cast<uint32_t*>(&Ks[key][half * 64]);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        uint32_t w4[4] = {0u, 0u, 0u, 0u};
        if (kp != nullptr) {
          const uint8_t* src = kp + half * 64 + v * 16;
          if (keys.aligned16) {
            const uint4 x = *reinterpret_cast<const uint4*>(src);
            w4[0] = x.x; w4[1] = x.y; w4[2] = x.z; w4[3] = x.w;
          } else {
#pragma unroll
            for (int e = 0; e < 16; ++e) w4[e / 4] |= static_cast<uint32_t>(src[e]) << (8 * (e % 4));
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          dst[v * 8 + q * 2] = e4m3x2_to_f16x2(w4[q], w4[q] >> 8);
          dst[v * 8 + q * 2 + 1] = e4m3x2_to_f16x2(w4[q] >> 16, w4[q] >> 24);
        }
      }
    }
    __syncthreads();

    float acc[kMTiles][2][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD; kk += 16) {
      uint32_t bf[2][2];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int key = warp * 16 + n * 8 + g;
        bf[n][0] = *reinterpret_cast<const uint32_t*>(&Ks[key][kk + t2]);
        bf[n][1] = *reinterpret_cast<const uint32_t*>(&Ks[key][kk + t2 + 8]);
      }
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        uint32_t af[4];
        af[0] = *reinterpret_cast<const uint32_t*>(&Qs[m * 16 + g][kk + t2]);
        af[1] = *reinterpret_cast<const uint32_t*>(&Qs[m * 16 + g + 8][kk + t2]);
        af[2] = *reinterpret_cast<const uint32_t*>(&Qs[m * 16 + g][kk + t2 + 8]);
        af[3] = *reinterpret_cast<const uint32_t*>(&Qs[m * 16 + g + 8][kk + t2 + 8]);
#pragma unroll
        for (int n = 0; n < 2; ++n) mma_f16_16816(acc[m][n], af, bf[n]);
      }
    }
    // acc[m][n][i]: head m*16 + g (+8 for i >= 2), key warp*16 + n*8 + t2 + (i & 1).
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float part = 0.f;
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          part = fmaf(w_s[m * 16 + g], fmaxf(acc[m][n][c], 0.f), part);
          part = fmaf(w_s[m * 16 + g + 8], fmaxf(acc[m][n][2 + c], 0.f), part);
        }
        part += __shfl_xor_sync(0xffffffffu, part, 4);
        part += __shfl_xor_sync(0xffffffffu, part, 8);
        part += __shfl_xor_sync(0xffffffffu, part, 16);
        const int key = warp * 16 + n * 8 + t2 + c;
        if (g == 0 && c0 + key < a.width)
          out_row.set(c0 + key, key_ptr[key] != nullptr ? part * key_scale[key] : -CUDART_INF_F);
      }
    }
  }
}

}  // namespace logits
}  // namespace gpu
}  // namespace dsa
