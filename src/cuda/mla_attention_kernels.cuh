// Kernel bodies for sparse and dense MLA attention (SPEC §5), sm_90a.
//
// Work unit ("tile"): one query token and a group of up to 64 of its heads. In absorbed (MQA)
// form every head of a token attends to the same keys, so a block stages the token's 64 query
// heads in shared memory once and streams the selected keys through shared memory 64 at a
// time; each key is read from global memory once per head group and used by all 64 heads.
// Sparse and dense attention differ only in how a key position maps to a cache slot (the
// KeyMap policies below), so both run the same engine.
//
// Per 64-key tile, 8 warps: warp w owns heads (w & 3) * 16 .. +16 and
//   scores  S[16 x 32] = Q[16 x 576] · K^T   for keys (w >> 2) * 32 .. +32  (mma m16n8k16 bf16)
//   output  O[16 x 256] += P[16 x 64] · V    for dims (w >> 2) * 256 .. +256, f32 registers
// The two warps of a head group exchange row maxima and the probabilities P (bf16) through
// shared memory. Online softmax in the log2 domain, f32. Keys are double-buffered (cp.async).
// FP8 caches dequantise to bf16 in shared memory: e4m3 · (power-of-two scale) is exact.
//
// Invalid keys (index < 0, >= key count, past topk_length, outside a sequence or a block
// table) are never read: their shared-memory rows are zero-filled and their scores masked to
// -inf, so NaN in unused cache slots cannot reach the output.
//
// With split-K (few tiles, long key lists) each block handles one key range and writes an
// unnormalised partial (O, m, l) to the workspace; mla_combine_kernel merges them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops_common.cuh"
#include "dsa/numerics.h"

namespace dsa {
namespace gpu {
namespace mla {

constexpr int kDim = 576;          // [c_kv 512 | k_pe 64]
constexpr int kVDim = 512;
constexpr int kRowChunks = 72;     // 16-byte chunks in a 576 x bf16 row
constexpr int kTileHeads = 64;     // query heads per block
constexpr int kTileKeys = 64;      // keys per shared-memory tile
constexpr int kThreads = 256;      // 8 warps
constexpr float kLn2 = 0.6931471805599453f;

enum KvKind : int { kFlatBf16 = 0, kPagedBf16 = 1, kPagedFp8 = 2 };

// Shared memory layout (bytes).
constexpr int kQBytes = kTileHeads * kDim * 2;             // 73728
constexpr int kKBytes = kTileKeys * kDim * 2;              // 73728 per buffer
constexpr int kPBytes = kTileHeads * kTileKeys * 2;        // 8192
constexpr int kRedBytes = 2 * kTileHeads * 4;              // 512
constexpr int kLutBytes = 256 * 4;                         // 1024
constexpr int kValidBytes = 2 * kTileKeys * 4;             // 512
constexpr int kSmemQ = 0;
constexpr int kSmemK = kSmemQ + kQBytes;
constexpr int kSmemP = kSmemK + 2 * kKBytes;
constexpr int kSmemRed = kSmemP + kPBytes;
constexpr int kSmemLut = kSmemRed + kRedBytes;
constexpr int kSmemValid = kSmemLut + kLutBytes;
constexpr int kSmemBytes = kSmemValid + kValidBytes;       // 231424 (<= 227 KiB opt-in)
// Output staging at the end reuses the Q and K region, rows padded against bank conflicts.
constexpr int kStageF32Stride = kVDim + 4;
constexpr int kStageBf16Stride = kVDim + 8;
static_assert(kTileHeads * kStageF32Stride * 4 <= kQBytes + 2 * kKBytes, "staging fits");

// Where the keys live. Slots are key rows (flat) or cache slots (paged).
struct KvSource {
  const uint8_t* base = nullptr;
  int64_t num_keys = 0;          // flat: S; paged: num_blocks * page_size
  int64_t row_stride_bytes = 0;  // flat only
  int64_t block_bytes = 0;       // paged only
  uint32_t page_size = 1;        // paged only
  int32_t token_bytes = 0;       // paged only
  bool aligned16 = true;         // flat: base and row stride allow 16-byte copies
};

// Everything a launch needs, passed by value (kernel parameter space).
struct Problem {
  // queries [T, H, 576] bf16
  const uint16_t* q = nullptr;
  int64_t q_s0 = 0, q_s1 = 0;
  bool q_aligned16 = true;
  int32_t T = 0, H = 0, head_groups = 1;
  KvSource kv;
  // sparse
  const int32_t* indices = nullptr;
  int64_t idx_s0 = 0, idx_s1 = 0;
  int32_t K = 0;
  const int32_t* topk_length = nullptr;
  int64_t tl_s0 = 0;
  // dense
  const int32_t* cu_q = nullptr;
  int64_t cu_q_s = 0;
  int32_t B = 0;
  const int32_t* cu_k = nullptr;  // flat
  int64_t cu_k_s = 0;
  const int32_t* block_table = nullptr;  // paged
  int64_t bt_s0 = 0, bt_s1 = 0;
  int32_t max_blocks = 0;
  const int32_t* kv_lens = nullptr;
  int64_t kv_lens_s = 0;
  // outputs
  const float* sink = nullptr;
  int64_t sink_s = 0;
  float scale_log2 = 0.f;  // sm_scale * log2(e)
  void* out = nullptr;
  bool out_bf16 = true;
  bool out_aligned16 = true;
  int64_t out_s0 = 0, out_s1 = 0;
  float* lse = nullptr;
  int64_t lse_s0 = 0, lse_s1 = 0;
  // split-K
  int32_t splits = 1;
  int32_t split_keys = 0;       // key positions per split (multiple of kTileKeys)
  float* part_o = nullptr;      // [splits][tiles][64][512]
  float2* part_ml = nullptr;    // [splits][tiles][64]: (m in log2 units, l)
};

// ---- small device helpers -----------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
// D += A · B, m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 576-wide bf16 rows in shared memory: 16-byte chunk c of row r sits at chunk
// r * 72 + (c ^ (r & 7)), so the 8 rows an ldmatrix reads hit 8 different bank groups.
__device__ __forceinline__ int row_chunk(int r, int c) { return r * kRowChunks + (c ^ (r & 7)); }
// 64-wide bf16 rows of P: 8 chunks per row, same XOR.
__device__ __forceinline__ int p_chunk(int r, int c) { return r * 8 + (c ^ (r & 7)); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

// ---- key maps: key position -> slot (or -1), per tile ---------------------------------------
// Sparse: positions 0 .. K-1 of indices[t], the first topk_length[t] of them.
struct SparseKeys {
  const int32_t* row = nullptr;
  int64_t stride = 0;
  int64_t num_keys = 0;
  int32_t count = 0;  // positions that may hold a valid index
  __device__ __forceinline__ void init(const Problem& p, int t) {
    row = p.indices + t * p.idx_s0;
    stride = p.idx_s1;
    num_keys = p.kv.num_keys;
    int32_t n = p.K;
    if (p.topk_length != nullptr) {
      const int32_t len = p.topk_length[t * p.tl_s0];
      n = len < 0 ? 0 : (len < n ? len : n);  // device contents are not validated: clamp
    }
    count = n;
  }
  __device__ __forceinline__ int64_t slot(int32_t pos) const { return checked(raw(pos)); }
  // The two halves of slot(), for callers that load ahead and check at use.
  __device__ __forceinline__ int32_t raw(int32_t pos) const { return row[pos * stride]; }
  __device__ __forceinline__ int64_t checked(int32_t idx) const { return (idx >= 0 && idx < num_keys) ? idx : -1; }
};

// Dense: positions 0 .. L_t-1 of token t's sequence, L_t = kv_len - q_len + i + 1.
template <bool kPaged>
struct DenseKeys {
  int64_t num_keys = 0;
  int64_t key_base = 0;        // flat: first key row of the sequence
  const int32_t* bt_row = nullptr;
  int64_t bt_s1 = 0;
  int32_t max_blocks = 0;
  uint32_t page = 1;
  int32_t count = 0;
  __device__ __forceinline__ void init(const Problem& p, int t) {
    num_keys = p.kv.num_keys;
    page = p.kv.page_size;
    count = 0;
    // The sequence of token t: the last b with cu_q[b] <= t (cu_q is not validated on the
    // device, so every outcome is checked and a token outside every sequence sees no key).
    int lo = 0, hi = p.B - 1, b = -1;
    while (lo <= hi) {
      const int mid = (lo + hi) >> 1;
      if (p.cu_q[mid * p.cu_q_s] <= t) { b = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    if (b < 0) return;
    const int64_t q0 = p.cu_q[b * p.cu_q_s], q1 = p.cu_q[(b + 1) * p.cu_q_s];
    if (t >= q1) return;
    int64_t kv_len;
    if (kPaged) {
      kv_len = p.kv_lens[b * p.kv_lens_s];
      bt_row = p.block_table + b * p.bt_s0;
      bt_s1 = p.bt_s1;
      max_blocks = p.max_blocks;
    } else {
      key_base = p.cu_k[b * p.cu_k_s];
      kv_len = p.cu_k[(b + 1) * p.cu_k_s] - key_base;
    }
    int64_t L = kv_len - (q1 - q0) + (t - q0) + 1;
    if (L > kv_len) L = kv_len;
    if (L < 0) L = 0;
    count = static_cast<int32_t>(L > INT32_MAX ? INT32_MAX : L);
  }
  __device__ __forceinline__ int64_t slot(int32_t pos) const {
    if (kPaged) {
      const uint32_t col = static_cast<uint32_t>(pos) / page;
      if (col >= static_cast<uint32_t>(max_blocks)) return -1;
      const int64_t blk = bt_row[col * bt_s1];
      const int64_t s = blk * page + (static_cast<uint32_t>(pos) - col * page);
      return (blk >= 0 && s < num_keys) ? s : -1;
    }
    const int64_t s = key_base + pos;
    return (s >= 0 && s < num_keys) ? s : -1;
  }
};

// ---- staging ------------------------------------------------------------------------------
// Q rows 0 .. nh-1 of the tile into shared memory (rows past nh are zero).
__device__ __forceinline__ void load_q(const Problem& p, int t, int h0, int nh, uint8_t* sQ) {
  const int tid = threadIdx.x;
  for (int i = tid; i < kTileHeads * kRowChunks; i += kThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    uint8_t* dst = sQ + row_chunk(r, c) * 16;
    const uint16_t* src = p.q + t * p.q_s0 + static_cast<int64_t>(h0 + r) * p.q_s1 + c * 8;
    if (p.q_aligned16) {
      cp_async16(smem_addr(dst), r < nh ? static_cast<const void*>(src) : static_cast<const void*>(p.q),
                 r < nh ? 16 : 0);
    } else {
      uint16_t v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = r < nh ? src[e] : uint16_t(0);
      uint4 u;
      u.x = v[0] | (uint32_t(v[1]) << 16);
      u.y = v[2] | (uint32_t(v[3]) << 16);
      u.z = v[4] | (uint32_t(v[5]) << 16);
      u.w = v[6] | (uint32_t(v[7]) << 16);
      *reinterpret_cast<uint4*>(dst) = u;
    }
  }
}

// Key tile: 4 threads per key row. Returns whether this thread's row is a valid key.
template <int kKv, class Keys>
__device__ __forceinline__ bool load_keys(const Problem& p, const Keys& keys, int32_t pos0, int32_t end,
                                          uint8_t* sK, int* sValid, const float* sLut) {
  const int tid = threadIdx.x;
  const int r = tid >> 2, sub = tid & 3;
  const int32_t pos = pos0 + r;
  const int64_t slot = pos < end ? keys.slot(pos) : -1;
  const bool valid = slot >= 0;
  if (sub == 0) sValid[r] = valid ? 1 : 0;
  const uint8_t* src = p.kv.base;
  if (valid) {
    if (kKv == kFlatBf16) {
      src += slot * p.kv.row_stride_bytes;
    } else {
      const uint32_t blk = static_cast<uint32_t>(slot / p.kv.page_size);
      src += blk * p.kv.block_bytes + (slot - int64_t(blk) * p.kv.page_size) * p.kv.token_bytes;
    }
  }
  if (kKv == kPagedFp8) {
    // Thread `sub` dequantises scale tile `sub` (128 values = 8 x 16 bytes -> 16 chunks).
    const float scale = valid ? reinterpret_cast<const float*>(src + 512)[sub] : 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 raw[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        raw[i] = valid ? __ldg(reinterpret_cast<const uint4*>(src + sub * 128 + (half * 4 + i) * 16))
                       : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        uint32_t o[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t x = w[j];
          o[2 * j] = pack_bf16(sLut[x & 0xff] * scale, sLut[(x >> 8) & 0xff] * scale);
          o[2 * j + 1] = pack_bf16(sLut[(x >> 16) & 0xff] * scale, sLut[x >> 24] * scale);
        }
        const int c = sub * 16 + (half * 4 + i) * 2;  // destination chunk (8 bf16 each)
        *reinterpret_cast<uint4*>(sK + row_chunk(r, c) * 16) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(sK + row_chunk(r, c + 1) * 16) = make_uint4(o[4], o[5], o[6], o[7]);
      }
    }
    // k_pe: 64 bf16 = 8 chunks at byte 528, two per thread.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = 64 + sub * 2 + i;
      cp_async16(smem_addr(sK + row_chunk(r, c) * 16), valid ? src + 528 + (sub * 2 + i) * 16 : p.kv.base,
                 valid ? 16 : 0);
    }
  } else if (kKv == kPagedBf16 || p.kv.aligned16) {
#pragma unroll 6
    for (int c = sub; c < kRowChunks; c += 4)
      cp_async16(smem_addr(sK + row_chunk(r, c) * 16), valid ? src + c * 16 : p.kv.base, valid ? 16 : 0);
  } else {
    // Flat keys without 16-byte alignment: element loads.
    const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
    for (int c = sub; c < kRowChunks; c += 4) {
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[e] = valid ? (uint32_t(s16[c * 8 + 2 * e]) | (uint32_t(s16[c * 8 + 2 * e + 1]) << 16)) : 0u;
      *reinterpret_cast<uint4*>(sK + row_chunk(r, c) * 16) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
  return valid;
}

// ---- the engine -----------------------------------------------------------------------------
template <int kKv, class Keys>
__device__ __forceinline__ void attend_tile(const Problem& p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sQ = smem + kSmemQ;
  uint8_t* sKbuf = smem + kSmemK;
  uint8_t* sP = smem + kSmemP;
  float* sRed = reinterpret_cast<float*>(smem + kSmemRed);
  float* sLut = reinterpret_cast<float*>(smem + kSmemLut);
  int* sValid = reinterpret_cast<int*>(smem + kSmemValid);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int t = tile / p.head_groups;
  const int h0 = (tile % p.head_groups) * kTileHeads;
  const int nh = min(kTileHeads, p.H - h0);
  const int mrow0 = (warp & 3) * 16;  // this warp's heads within the tile
  const int half = warp >> 2;         // key half (scores) and dim half (output)
  const int kcol0 = half * 32;
  const int dcol0 = half * 256;

  if (kKv == kPagedFp8) sLut[tid] = e4m3_to_float(static_cast<uint8_t>(tid));

  Keys keys;
  keys.init(p, t);
  const int32_t begin = split * p.split_keys;
  int32_t end = keys.count;
  if (p.splits > 1) end = min(end, begin + p.split_keys);
  const int32_t n_tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;

  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of scaled scores (log2 units)
  float l_run[2] = {0.f, 0.f};              // this thread's share of the running sum

  bool next_valid = false;  // whether this thread's key row of the next tile is valid
  if (n_tiles > 0) {
    __syncthreads();  // the FP8 LUT is written before any thread dequantises
    load_q(p, t, h0, nh, sQ);
    next_valid = load_keys<kKv>(p, keys, begin, end, sKbuf, sValid, sLut);
  }
  cp_async_commit();

  for (int32_t it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    const bool cur_valid = next_valid;
    if (it + 1 < n_tiles)
      next_valid = load_keys<kKv>(p, keys, begin + (it + 1) * kTileKeys, end, sKbuf + (buf ^ 1) * kKBytes,
                                  sValid + (buf ^ 1) * kTileKeys, sLut);
    cp_async_commit();
    cp_async_wait<1>();
    // Tiles without a valid key (e.g. -1 padding) are skipped by the whole block.
    if (!__syncthreads_or(cur_valid ? 1 : 0)) continue;
    const uint8_t* sK = sKbuf + buf * kKBytes;
    const int* valid = sValid + buf * kTileKeys;

    // S = Q K^T for 16 heads x 32 keys.
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    {
      const int a_row = mrow0 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int a_cofs = lane >> 4;
      const int b_row = kcol0 + (lane & 7) + (lane >> 4) * 8;
      const int b_cofs = (lane >> 3) & 1;
#pragma unroll 4
      for (int kk = 0; kk < kDim / 16; ++kk) {
        uint32_t a0, a1, a2, a3, b0, b1, b2, b3, b4, b5, b6, b7;
        ldmatrix_x4(smem_addr(sQ + row_chunk(a_row, kk * 2 + a_cofs) * 16), a0, a1, a2, a3);
        ldmatrix_x4(smem_addr(sK + row_chunk(b_row, kk * 2 + b_cofs) * 16), b0, b1, b2, b3);
        ldmatrix_x4(smem_addr(sK + row_chunk(b_row + 16, kk * 2 + b_cofs) * 16), b4, b5, b6, b7);
        mma_bf16(s[0], a0, a1, a2, a3, b0, b1);
        mma_bf16(s[1], a0, a1, a2, a3, b2, b3);
        mma_bf16(s[2], a0, a1, a2, a3, b4, b5);
        mma_bf16(s[3], a0, a1, a2, a3, b6, b7);
      }
    }
    // Mask, scale, and this warp's row maxima over its 32 keys.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kcol0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        const float v = valid[key] ? s[nt][e] * p.scale_log2 : -INFINITY;
        s[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
    const int r0 = mrow0 + (lane >> 2);
    if ((lane & 3) == 0) {
      sRed[half * kTileHeads + r0] = mx[0];
      sRed[half * kTileHeads + r0 + 8] = mx[1];
    }
    __syncthreads();
    float alpha[2], m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float other = sRed[(half ^ 1) * kTileHeads + r0 + i * 8];
      const float m_new = fmaxf(m_run[i], fmaxf(mx[i], other));
      m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // no valid key yet: keep exp2 finite
      alpha[i] = exp2f(m_run[i] - m_use[i]);        // m_run = -inf on the first tile: 0
      m_run[i] = m_new;
      l_run[i] *= alpha[i];
    }
    // P = exp2(S - m): f32 into the running sum, bf16 into shared memory for P · V.
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const float p0 = exp2f(s[nt][0] - m_use[0]), p1 = exp2f(s[nt][1] - m_use[0]);
      const float p2 = exp2f(s[nt][2] - m_use[1]), p3 = exp2f(s[nt][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int key = kcol0 + nt * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(sP + p_chunk(r0, key >> 3) * 16 + (key & 7) * 2) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(sP + p_chunk(r0 + 8, key >> 3) * 16 + (key & 7) * 2) = pack_bf16(p2, p3);
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
    __syncthreads();  // P of both key halves is in shared memory

    // O[16 x 256] += P[16 x 64] · V[64 x 256].
    {
      const int a_row = mrow0 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int a_cofs = lane >> 4;
      const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
      const int v_cofs = lane >> 4;
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) {
        uint32_t a0, a1, a2, a3;
        ldmatrix_x4(smem_addr(sP + p_chunk(a_row, kk * 2 + a_cofs) * 16), a0, a1, a2, a3);
#pragma unroll
        for (int np = 0; np < 16; ++np) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(smem_addr(sK + row_chunk(kk * 16 + v_row, (dcol0 >> 3) + np * 2 + v_cofs) * 16),
                            b0, b1, b2, b3);
          mma_bf16(o[2 * np], a0, a1, a2, a3, b0, b1);
          mma_bf16(o[2 * np + 1], a0, a1, a2, a3, b2, b3);
        }
      }
    }
    __syncthreads();  // before the next tile overwrites this buffer, P and the maxima
  }
  cp_async_wait<0>();

  // Row sums: reduce over the quad, then add the other key half's.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  const int r0 = mrow0 + (lane >> 2);
  __syncthreads();
  if ((lane & 3) == 0) {
    sRed[half * kTileHeads + r0] = l_run[0];
    sRed[half * kTileHeads + r0 + 8] = l_run[1];
  }
  __syncthreads();
  float l_tot[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) l_tot[i] = l_run[i] + sRed[(half ^ 1) * kTileHeads + r0 + i * 8];

  if (p.splits > 1) {
    // Unnormalised partial for the combine kernel.
    const int64_t base_row = (static_cast<int64_t>(split) * gridDim.x + tile) * kTileHeads;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + i * 8;
      if (r >= nh) continue;
      float* dst = p.part_o + (base_row + r) * kVDim + dcol0 + (lane & 3) * 2;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
      if (half == 0 && (lane & 3) == 0) p.part_ml[base_row + r] = make_float2(m_run[i], l_tot[i]);
    }
    return;
  }

  // Final output: normalise (and apply the sink), stage in shared memory, store coalesced.
  float factor[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + i * 8;
    const bool any = l_tot[i] != 0.f;  // NaN (from NaN in a valid key) propagates
    const float lse = any ? (m_run[i] + log2f(l_tot[i])) * kLn2 : INFINITY;
    float f = any ? 1.f / l_tot[i] : 0.f;
    if (any && p.sink != nullptr && r < nh) {
      const float sink = p.sink[static_cast<int64_t>(h0 + r) * p.sink_s];
      f /= 1.f + expf(sink - lse);  // exp(lse) / (exp(lse) + exp(sink)), overflow-safe
    }
    factor[i] = f;
    if (half == 0 && (lane & 3) == 0 && r < nh) p.lse[t * p.lse_s0 + static_cast<int64_t>(h0 + r) * p.lse_s1] = lse;
  }
  __syncthreads();  // Q and K buffers are free: reuse them for staging
  if (p.out_bf16) {
    uint16_t* stage = reinterpret_cast<uint16_t*>(smem);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + i * 8;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<uint32_t*>(stage + r * kStageBf16Stride + dcol0 + nt * 8 + (lane & 3) * 2) =
            pack_bf16(o[nt][2 * i] * factor[i], o[nt][2 * i + 1] * factor[i]);
    }
  } else {
    float* stage = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + i * 8;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(stage + r * kStageF32Stride + dcol0 + nt * 8 + (lane & 3) * 2) =
            make_float2(o[nt][2 * i] * factor[i], o[nt][2 * i + 1] * factor[i]);
    }
  }
  __syncthreads();
  const int esize = p.out_bf16 ? 2 : 4;
  const int stage_stride_bytes = p.out_bf16 ? kStageBf16Stride * 2 : kStageF32Stride * 4;
  const int row_bytes = kVDim * esize;
  uint8_t* out = static_cast<uint8_t*>(p.out);
  if (p.out_aligned16) {
    const int chunks = row_bytes / 16;
    for (int i = tid; i < nh * chunks; i += kThreads) {
      const int r = i / chunks, c = i % chunks;
      uint8_t* dst = out + (t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1) * esize + c * 16;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(smem + r * stage_stride_bytes + c * 16);
    }
  } else {
    for (int i = tid; i < nh * kVDim; i += kThreads) {
      const int r = i / kVDim, d = i % kVDim;
      const int64_t e = t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + d;
      if (p.out_bf16)
        reinterpret_cast<uint16_t*>(out)[e] = reinterpret_cast<const uint16_t*>(smem + r * stage_stride_bytes)[d];
      else
        reinterpret_cast<float*>(out)[e] = reinterpret_cast<const float*>(smem + r * stage_stride_bytes)[d];
    }
  }
}

template <int kKv>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(const Problem p) {
  attend_tile<kKv, SparseKeys>(p);
}

template <int kKv>
__global__ void __launch_bounds__(kThreads, 1) dense_mla_kernel(const Problem p) {
  attend_tile<kKv, DenseKeys<kKv != kFlatBf16>>(p);
}

// Merge the split-K partials of one (tile, head row): block per row, 128 threads x 4 dims.
__global__ void __launch_bounds__(128) mla_combine_kernel(const Problem p, int tiles) {
  const int tile = blockIdx.x / kTileHeads, r = blockIdx.x % kTileHeads;
  const int t = tile / p.head_groups;
  const int h = (tile % p.head_groups) * kTileHeads + r;
  if (h >= p.H) return;
  const int64_t stride_split = static_cast<int64_t>(tiles) * kTileHeads;
  const int64_t row = static_cast<int64_t>(tile) * kTileHeads + r;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) {
    const float2 ml = p.part_ml[s * stride_split + row];
    if (ml.y != 0.f) m = fmaxf(m, ml.x);
  }
  float l = 0.f;
  for (int s = 0; s < p.splits; ++s) {
    const float2 ml = p.part_ml[s * stride_split + row];
    if (ml.y != 0.f) l += ml.y * exp2f(ml.x - m);
  }
  const bool any = l != 0.f;
  const float lse = any ? (m + log2f(l)) * kLn2 : INFINITY;
  float f = any ? 1.f / l : 0.f;
  if (any && p.sink != nullptr) f /= 1.f + expf(p.sink[h * p.sink_s] - lse);
  if (threadIdx.x == 0) p.lse[t * p.lse_s0 + h * p.lse_s1] = lse;
  const int d0 = threadIdx.x * 4;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (any) {
    for (int s = 0; s < p.splits; ++s) {
      const float2 ml = p.part_ml[s * stride_split + row];
      if (ml.y == 0.f) continue;  // a split without a valid key holds no partial
      const float w = exp2f(ml.x - m);
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + (s * stride_split + row) * kVDim + d0);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
    }
  }
  const int64_t e = t * p.out_s0 + static_cast<int64_t>(h) * p.out_s1 + d0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float v = acc[i] * f;
    if (p.out_bf16)
      static_cast<uint16_t*>(p.out)[e + i] = float_to_bf16(v);
    else
      static_cast<float*>(p.out)[e + i] = v;
  }
}

}  // namespace mla
}  // namespace gpu
}  // namespace dsa
