// Sparse MLA attention over BF16 latents on Hopper (sm_90a): wgmma + a gathering producer
// warpgroup (SPEC §5). Launcher: mla_attention.cu; the mma.sync kernel in
// mla_attention_kernels.cuh stays the path for other GPUs, FP8 caches and unaligned inputs.
//
// Work unit as in the mma.sync kernel: one query token and a group of 64 heads (rows past H
// are zero queries whose outputs are never stored). 3 warpgroups (384 threads):
//  * WG0, producer (setmaxnreg down): loads Q [64 x 576] once, then gathers 64 selected keys a
//    tile into one of two key buffers with 16-byte cp.async (8 threads per 128-byte row
//    segment, coalesced), zero-filling invalid keys without reading them; writes the tile's
//    valid flags; waits for its own copies, fence.proxy.async, arrives on the buffer's `full`
//    mbarrier. A dequantising producer (FP8 cache, issue 13) would replace only this part.
//  * WG1, WG2, consumers c = 0, 1 (setmaxnreg up): per key tile
//      S_c[64 x 32]   = Q · K[keys 32c .. 32c+31]^T      wgmma m64n32k16 SS, 36 k-steps
//      mask invalid keys to -inf, row max over the tile (exchanged through shared memory),
//      P = exp2(S - m) in bf16 into shared memory (both halves: P [64 x 64]),
//      O_c[64 x 256] += P · V[:, 256c .. 256c+255]      wgmma m64n256k16 SS, V MN-major
//    then arrive on the buffer's `empty` mbarrier. O_c is 128 f32 registers a thread.
// One shared-memory copy of each key row serves both GEMMs: K-major for S, MN-major for P·V.
//
// Shared-memory operands are in the 128-byte-swizzled layout of hopper.cuh: a [rows x 576]
// bf16 matrix is 9 "K blocks" of rows x 128 B (64 elements), 1024-B atoms of 8 rows, 16-byte
// chunk j of row r at chunk position j ^ (r & 7). Producer threads write that layout directly
// (cp.async of 16 B to the swizzled address), so no TMA tensor map is needed for a gather.
//
// Masking: an invalid key (index < 0, >= key count, position >= topk_length) is never read;
// its row is zero-filled (cp.async src-size 0) and its score is -inf, so P = 0 and V = 0 for it:
// NaN in unused cache slots cannot reach the output. A tile without any valid key is skipped
// by both consumers.
//
// Synchronisation, per key buffer b (tile it uses b = it & 1, use u = it >> 1):
//   full[b]  (128 producer arrivals): phase u completes when tile it's rows and flags are in.
//   empty[b] (256 consumer arrivals): phase u completes when both consumers' wgmma reads of
//            tile it finished; the producer waits for it before writing tile it + 2.
//   Named barrier kBarMax (256 consumer threads): both row maxima of the tile are written.
//   Named barrier kBarP (256): both halves of P are written (and fenced for the async proxy).
// The single P and max buffers are safe: a consumer writes them for tile it + 1 only after
// passing kBarMax(it + 1) / kBarP(it), which the other consumer reaches only after it finished
// reading them for tile it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/hopper/hopper.cuh"
#include "cuda/mla_attention_kernels.cuh"

namespace dsa {
namespace gpu {
namespace mla {
namespace sm90 {

constexpr int kThreads = 384;
constexpr int kProducerRegs = 72;
constexpr int kConsumerRegs = 216;  // 72 + 2 * 216 = 504 <= 512 (65536 / 128)
constexpr int kBlockBytes = 64 * 128;  // one K block: 64 rows x 128 B
constexpr int kKBlocks = kDim / 64;    // 9
constexpr int kTileBytes = kKBlocks * kBlockBytes;  // 73728: Q, or one key tile

// The wgmma descriptor strides, kept here in one place (hopper.cuh explains the layouts).
// K-major, 128-byte swizzle: SBO = 1024 (8-row atoms), LBO unused.
constexpr uint32_t kKMajorLbo = 16;
constexpr uint32_t kKMajorSbo = 1024;
// MN-major (V for P·V: key rows, output columns contiguous), 128-byte swizzle:
// LBO = from one 64-column block to the next (the next K block), SBO = the next 8 keys.
// If the device run shows P·V wrong while S is right, swapping these two is the first suspect.
constexpr uint32_t kVLbo = kBlockBytes;
constexpr uint32_t kVSbo = 1024;

// Shared memory (offsets from a 1024-aligned base).
constexpr int kSmemQ = 0;
constexpr int kSmemK = kSmemQ + kTileBytes;           // 2 buffers
constexpr int kSmemP = kSmemK + 2 * kTileBytes;       // P [64 x 64] bf16, one K block
constexpr int kSmemValid = kSmemP + kBlockBytes;      // int [2][64]
constexpr int kSmemAny = kSmemValid + 2 * 64 * 4;     // int [2][4] (per producer warp)
constexpr int kSmemMax = kSmemAny + 2 * 4 * 4;        // float [2][64]
constexpr int kSmemSum = kSmemMax + 2 * 64 * 4;       // float [2][64]
constexpr int kSmemBar = kSmemSum + 2 * 64 * 4;       // uint64 full[2], empty[2], q
constexpr int kSmemUsed = kSmemBar + 5 * 8;
constexpr int kSmemBytes = kSmemUsed + 1024;          // slack to align the base to 1024
static_assert(kSmemBytes <= 232448, "fits the 227 KiB opt-in");
static_assert(kTileHeads * kStageF32Stride * 4 <= kSmemP, "output staging fits in Q and K");

constexpr int kBarMax = 1;
constexpr int kBarP = 2;
constexpr int kBarEpi = 3;

__device__ __forceinline__ void named_bar(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Byte offset of (row, 16-byte chunk `ch` of the 576-wide row) in a swizzled [rows x 576] tile.
__device__ __forceinline__ uint32_t swz_offset(int row, int ch) {
  return static_cast<uint32_t>((ch >> 3) * kBlockBytes + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

template <int kKv>
__device__ __forceinline__ const uint8_t* key_row(const Problem& p, int64_t slot) {
  if (kKv == kFlatBf16) return p.kv.base + slot * p.kv.row_stride_bytes;
  const uint32_t blk = static_cast<uint32_t>(slot / p.kv.page_size);
  return p.kv.base + blk * p.kv.block_bytes + (slot - int64_t(blk) * p.kv.page_size) * p.kv.token_bytes;
}

template <int kKv>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wgmma_kernel(const Problem p) {
#if DSA_HOPPER_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sQ = smem + kSmemQ;
  uint8_t* sK = smem + kSmemK;
  uint8_t* sP = smem + kSmemP;
  int* sValid = reinterpret_cast<int*>(smem + kSmemValid);
  int* sAny = reinterpret_cast<int*>(smem + kSmemAny);
  float* sMax = reinterpret_cast<float*>(smem + kSmemMax);
  float* sSum = reinterpret_cast<float*>(smem + kSmemSum);
  uint64_t* bar_full = reinterpret_cast<uint64_t*>(smem + kSmemBar);
  uint64_t* bar_empty = bar_full + 2;
  uint64_t* bar_q = bar_full + 4;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int t = tile / p.head_groups;
  const int h0 = (tile % p.head_groups) * kTileHeads;
  const int nh = min(kTileHeads, p.H - h0);

  SparseKeys keys;
  keys.init(p, t);
  const int32_t begin = split * p.split_keys;
  int32_t end = keys.count;
  if (p.splits > 1) end = min(end, begin + p.split_keys);
  const int32_t n_tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;

  if (tid == 0) {
    hopper::mbar_init(&bar_full[0], 128);
    hopper::mbar_init(&bar_full[1], 128);
    hopper::mbar_init(&bar_empty[0], 256);
    hopper::mbar_init(&bar_empty[1], 256);
    hopper::mbar_init(bar_q, 128);
    hopper::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer ----------------
    hopper::regs_decrease<kProducerRegs>();
    if (n_tiles == 0) return;
    const int grp = tid >> 3;   // 16 groups of 8 threads; group g owns rows g, g+16, g+32, g+48
    const int sub = tid & 7;    // the 16-byte chunk within each 128-byte row segment
    // Q: 64 rows x 72 chunks.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = grp + 16 * j;
      const bool ok = r < nh;
      const uint16_t* src = p.q + t * p.q_s0 + static_cast<int64_t>(h0 + (ok ? r : 0)) * p.q_s1;
#pragma unroll
      for (int b = 0; b < kKBlocks; ++b) {
        const int ch = b * 8 + sub;
        mla::cp_async16(hopper::smem_addr(sQ + swz_offset(r, ch)), ok ? static_cast<const void*>(src + ch * 8)
                                                                      : static_cast<const void*>(p.q),
                        ok ? 16 : 0);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    hopper::fence_async_smem();
    hopper::mbar_arrive(bar_q);

    for (int32_t it = 0; it < n_tiles; ++it) {
      const int buf = it & 1;
      const int use = it >> 1;
      if (use > 0) hopper::mbar_wait(&bar_empty[buf], (use - 1) & 1);
      uint8_t* dst = sK + buf * kTileBytes;
      bool any = false;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = grp + 16 * j;
        const int32_t pos = begin + it * kTileKeys + r;
        const int64_t slot = pos < end ? keys.slot(pos) : -1;
        const bool ok = slot >= 0;
        any |= ok;
        const uint8_t* src = ok ? key_row<kKv>(p, slot) : p.kv.base;
#pragma unroll
        for (int b = 0; b < kKBlocks; ++b) {
          const int ch = b * 8 + sub;
          mla::cp_async16(hopper::smem_addr(dst + swz_offset(r, ch)), ok ? src + ch * 16 : p.kv.base, ok ? 16 : 0);
        }
        if (sub == 0) sValid[buf * 64 + r] = ok ? 1 : 0;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, any);
      if ((tid & 31) == 0) sAny[buf * 4 + (tid >> 5)] = ballot != 0u ? 1 : 0;
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      hopper::fence_async_smem();
      hopper::mbar_arrive(&bar_full[buf]);  // release: rows, flags
    }
    return;
  }

  // ---------------- consumers ----------------
  hopper::regs_increase<kConsumerRegs>();
  const int c = wg - 1;            // key half for S, column half for O
  const int ct = tid - 128;        // 0..255 over both consumers
  const int wt = tid & 127;        // within the warpgroup
  const int warp = wt >> 5, lane = wt & 31;
  const int r0 = 16 * warp + (lane >> 2);  // this thread's rows r0 and r0 + 8

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  if (n_tiles > 0) hopper::mbar_wait(bar_q, 0);
  for (int32_t it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    hopper::mbar_wait(&bar_full[buf], (it >> 1) & 1);
    const int* valid = sValid + buf * 64;
    const bool any = (sAny[buf * 4] | sAny[buf * 4 + 1] | sAny[buf * 4 + 2] | sAny[buf * 4 + 3]) != 0;
    if (!any) {  // uniform across both consumers: same flags
      hopper::mbar_arrive(&bar_empty[buf]);
      continue;
    }
    const uint8_t* kt = sK + buf * kTileBytes;

    // S = Q · K^T for this consumer's 32 keys.
    float s[16];
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      const uint32_t in_row = static_cast<uint32_t>((kk >> 2) * kBlockBytes + (kk & 3) * 32);
      const uint64_t da = hopper::smem_desc(sQ + in_row, hopper::Swizzle::k128B, kKMajorLbo, kKMajorSbo);
      const uint64_t db = hopper::smem_desc(kt + in_row + c * 32 * 128, hopper::Swizzle::k128B, kKMajorLbo, kKMajorSbo);
      hopper::wgmma_bf16_ss<32, 0, 0>(s, da, db, kk > 0 ? 1 : 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::fence_regs(s);

    // Mask, scale; row maxima over this half.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int key = c * 32 + hopper::acc_col(i, lane);
      const float v = valid[key] ? s[i] * p.scale_log2 : -INFINITY;
      s[i] = v;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], v);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if ((lane & 3) == 0) {
      sMax[c * 64 + r0] = mx[0];
      sMax[c * 64 + r0 + 8] = mx[1];
    }
    named_bar(kBarMax, 256);
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float other = sMax[(c ^ 1) * 64 + r0 + 8 * h];
      const float m_new = fmaxf(m_run[h], fmaxf(mx[h], other));
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no valid key yet: keep exp2 finite
      alpha[h] = exp2f(m_run[h] - m_use[h]);         // m_run = -inf: 0
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    // P = exp2(S - m): f32 into the running sum, bf16 into the swizzled P tile.
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int h = (i >> 1) & 1;
      const float p0 = exp2f(s[i] - m_use[h]), p1 = exp2f(s[i + 1] - m_use[h]);
      l_run[h] += p0 + p1;
      const int row = r0 + 8 * h;
      const int key = c * 32 + hopper::acc_col(i, lane);
      *reinterpret_cast<uint32_t*>(sP + row * 128 + ((((key >> 3) ^ (row & 7))) << 4) + (key & 7) * 2) =
          pack_bf16(p0, p1);
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    hopper::fence_async_smem();
    named_bar(kBarP, 256);

    // O_c += P · V[:, 256c ..]: 4 k-steps of 16 keys.
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      const uint64_t da = hopper::smem_desc(sP + kk * 32, hopper::Swizzle::k128B, kKMajorLbo, kKMajorSbo);
      const uint64_t db =
          hopper::smem_desc(kt + 4 * c * kBlockBytes + kk * 16 * 128, hopper::Swizzle::k128B, kVLbo, kVSbo);
      hopper::wgmma_bf16_ss<256, 0, 1>(o, da, db, 1);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::fence_regs(o);
    hopper::mbar_arrive(&bar_empty[buf]);
  }

  // Row sums: over the quad, then the other consumer's half.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  if ((lane & 3) == 0) {
    sSum[c * 64 + r0] = l_run[0];
    sSum[c * 64 + r0 + 8] = l_run[1];
  }
  named_bar(kBarEpi, 256);  // also: every wgmma of both consumers is done; Q and K are free
  float l_tot[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) l_tot[h] = l_run[h] + sSum[(c ^ 1) * 64 + r0 + 8 * h];
  const int col0 = 256 * c + 2 * (lane & 3);  // + 8 * (i / 4) for accumulator i

  if (p.splits > 1) {
    const int64_t base_row = (static_cast<int64_t>(split) * gridDim.x + tile) * kTileHeads;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      if (r >= nh) continue;
      float* dst = p.part_o + (base_row + r) * kVDim + col0;
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[4 * n + 2 * h], o[4 * n + 2 * h + 1]);
      if (c == 0 && (lane & 3) == 0) p.part_ml[base_row + r] = make_float2(m_run[h], l_tot[h]);
    }
    return;
  }

  float factor[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    const bool any = l_tot[h] != 0.f;  // NaN (from NaN in a valid key) propagates
    const float lse = any ? (m_run[h] + log2f(l_tot[h])) * kLn2 : INFINITY;
    float f = any ? 1.f / l_tot[h] : 0.f;
    if (any && p.sink != nullptr && r < nh) {
      const float sink = p.sink[static_cast<int64_t>(h0 + r) * p.sink_s];
      f /= 1.f + expf(sink - lse);
    }
    factor[h] = f;
    if (c == 0 && (lane & 3) == 0 && r < nh) p.lse[t * p.lse_s0 + static_cast<int64_t>(h0 + r) * p.lse_s1] = lse;
  }
  // Stage the normalised rows in shared memory (Q and K regions), then store coalesced.
  if (p.out_bf16) {
    uint16_t* stage = reinterpret_cast<uint16_t*>(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<uint32_t*>(stage + r * kStageBf16Stride + col0 + 8 * n) =
            pack_bf16(o[4 * n + 2 * h] * factor[h], o[4 * n + 2 * h + 1] * factor[h]);
    }
  } else {
    float* stage = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<float2*>(stage + r * kStageF32Stride + col0 + 8 * n) =
            make_float2(o[4 * n + 2 * h] * factor[h], o[4 * n + 2 * h + 1] * factor[h]);
    }
  }
  named_bar(kBarEpi, 256);
  const int esize = p.out_bf16 ? 2 : 4;
  const int stage_stride_bytes = p.out_bf16 ? kStageBf16Stride * 2 : kStageF32Stride * 4;
  uint8_t* out = static_cast<uint8_t*>(p.out);
  if (p.out_aligned16) {
    const int chunks = kVDim * esize / 16;
    for (int i = ct; i < nh * chunks; i += 256) {
      const int r = i / chunks, ch = i % chunks;
      uint8_t* dst = out + (t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1) * esize + ch * 16;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(smem + r * stage_stride_bytes + ch * 16);
    }
  } else {
    for (int i = ct; i < nh * kVDim; i += 256) {
      const int r = i / kVDim, d = i % kVDim;
      const int64_t e = t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + d;
      if (p.out_bf16)
        reinterpret_cast<uint16_t*>(out)[e] = reinterpret_cast<const uint16_t*>(smem + r * stage_stride_bytes)[d];
      else
        reinterpret_cast<float*>(out)[e] = reinterpret_cast<const float*>(smem + r * stage_stride_bytes)[d];
    }
  }
#else
  (void)p;
  __trap();
#endif
}

}  // namespace sm90
}  // namespace mla
}  // namespace gpu
}  // namespace dsa
