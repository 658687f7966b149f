// Sparse MLA attention over BF16 latents on Hopper (sm_90a): wgmma + a gathering producer
// warpgroup (SPEC §5). Launcher: mla_attention.cu; the mma.sync kernel in
// mla_attention_kernels.cuh stays the path for other GPUs, FP8 caches and unaligned inputs.
//
// Work unit as in the mma.sync kernel: one query token and a group of 64 heads (rows past H
// are zero queries whose outputs are never stored). 3 warpgroups (384 threads):
//  * WG0, producer (setmaxnreg down): loads Q [64 x 576] once (its arrival on `q` tracks the
//    copies, so the first key tiles are issued meanwhile), then gathers 64 selected keys a
//    tile into one of two key buffers with 16-byte cp.async (8 threads per 128-byte row
//    segment, coalesced; L2 evict_last + 256-byte prefetch), zero-filling invalid keys without
//    reading them; writes the tile's valid flags. A tile arrives in two parts: K blocks 0..4
//    (arrive on `full`) and 5..8 (arrive on `full_b`), each after the producer's own copies of
//    that part completed and fence.proxy.async; the consumers start S on the first part. The
//    token's index row is prefetched into L2 at the start, and the indices of tile it + 2 are
//    loaded while tile it is issued. A dequantising producer (FP8 cache, issue 13) would
//    replace only this part.
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
//   full[b]  (128 producer arrivals): phase u completes when tile it's K blocks 0..4 and flags
//            are in; full_b[b] (128): when blocks 5..8 are in. A consumer skipping an all-invalid
//            tile still waits full_b (the zero-fills land before the buffer is released).
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
constexpr int kProducerRegs = 88;
constexpr int kConsumerRegs = 208;  // 88 + 2 * 208 = 504 <= 512 (65536 / 128)
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
constexpr int kSmemBar = kSmemSum + 2 * 64 * 4;       // uint64 full[2], empty[2], q, full_b[2]
constexpr int kSmemUsed = kSmemBar + 7 * 8;
constexpr int kSmemBytes = kSmemUsed + 1024;          // slack to align the base to 1024
static_assert(kSmemBytes <= 232448, "fits the 227 KiB opt-in");
static_assert(kTileHeads * kStageF32Stride * 4 <= kSmemP, "output staging fits in Q and K");

// A key tile arrives in two parts: K blocks 0 .. kFirstBlocks-1 (full[b]), then the rest
// (full_b[b]); the S GEMM starts on the first part while the second is still in flight.
constexpr int kFirstBlocks = 5;
constexpr int kFirstKSteps = kFirstBlocks * 4;  // k-steps of 16 over the first part

constexpr int kBarMax = 1;
constexpr int kBarP = 2;
constexpr int kBarEpi = 3;

// A value the compiler cannot see through: keeps loop-invariant descriptor arithmetic inside
// the loop instead of hoisting dozens of 64-bit descriptors into registers.
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}
// 2^x flushing subnormal results to zero: exp2f is ex2.approx.f32 plus a fix-up for results
// below 2^-126 (three more instructions per exponential on the softmax's critical path). A
// probability below 2^-126 of the row maximum changes no output in any dtype we write; -inf
// gives +0 and NaN stays NaN, as with exp2f.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// A 128-byte-swizzle descriptor for the shared address `addr`.
__device__ __forceinline__ uint64_t desc_at(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(static_cast<uint32_t>(hopper::Swizzle::k128B)) << 62;
  return d;
}

__device__ __forceinline__ void named_bar(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Byte offset of (row, 16-byte chunk `ch` of the 576-wide row) in a swizzled [rows x 576] tile.
__device__ __forceinline__ uint32_t swz_offset(int row, int ch) {
  return static_cast<uint32_t>((ch >> 3) * kBlockBytes + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

// Key rows: 16-byte cp.async with an L2 evict_last policy (selected rows are re-read by other
// tokens; the streamed Q and outputs should leave L2 first) and a 256-byte L2 prefetch (a row is
// 1152 contiguous bytes).
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void cp_async16_keep(uint32_t dst, const void* src, int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(pol));
}

__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int kKv>
__device__ __forceinline__ const uint8_t* key_row(const Problem& p, int64_t slot) {
  if (kKv == kFlatBf16) return p.kv.base + slot * p.kv.row_stride_bytes;
  const uint32_t blk = static_cast<uint32_t>(slot / p.kv.page_size);
  return p.kv.base + blk * p.kv.block_bytes + (slot - int64_t(blk) * p.kv.page_size) * p.kv.token_bytes;
}

// The producer warpgroup (threads 0..127): Q rows 0 .. kQRows-1 (zero past nh) once, then
// key tile it into buffer it & 1 after the buffer's previous use was released (empty).
// kDefer: tile it's arrivals are made after tile it + 1's copies are issued, so the copies of
// consecutive tiles overlap (the bytes in flight never drain to zero between tiles). Used where
// the producer is the bottleneck (few heads: consumers take alternate buffers and finish fast);
// where the consumers are (64 heads), it would add the next tile's issue time to their wait.
// kAsync (the default for H <= 32; DSA_SPARSE_KERNEL=async_gather / sync_gather force it on or
// off): no wait on the producer's own copies. Each part's release is a cp.async-tracked arrival (hopper::cp_async_mbar_arrive_noinc), so the producer
// issues tile it + 1 as soon as its buffer is free instead of after tile it landed: two tiles'
// bytes in flight instead of one, the gather no longer drains to zero between tiles. full[b]
// then counts 256 arrivals (128 tracked + 128 ordinary ones that publish the valid flags),
// full_b[b] 128 tracked ones. kDefer is ignored. The consumers fence the async proxy after
// their waits (the producer cannot: it never sees its copies complete).
template <int kKv, int kQRows, bool kDefer = false, bool kAsync = false>
__device__ __forceinline__ void produce(const Problem& p, const SparseKeys& keys, int32_t begin, int32_t end,
                                        int32_t n_tiles, int t, int h0, int nh, uint8_t* sQ, uint8_t* sK,
                                        int* sValid, int* sAny, uint64_t* bar_full, uint64_t* bar_full_b,
                                        uint64_t* bar_empty, uint64_t* bar_q) {
  if (n_tiles == 0) return;
  const int tid = threadIdx.x;
  const int grp = tid >> 3;  // 16 groups of 8 threads; group g owns rows g, g+16, g+32, g+48
  const int sub = tid & 7;   // the 16-byte chunk within each 128-byte row segment
  constexpr int kQBlock = kQRows * 128;  // Q's K blocks: kQRows rows x 128 B

  // The token's index row is read once, in 256-byte pieces, one piece per tile: loaded one
  // tile ahead, each piece missed L2 and put the DRAM latency on the gather's critical path
  // (perf.md round 13). So the whole row is prefetched into L2 first, and each tile's indices
  // are loaded two tiles ahead (raw_a / raw_b alternate, so no register is moved while its
  // load is in flight).
  if (keys.stride == 1) {
    for (int32_t pos = begin + tid * 32; pos < end; pos += 128 * 32) hopper::prefetch_l2(keys.row + pos);
    if (tid == 0) hopper::prefetch_l2(keys.row + (end - 1));  // the last line, if the row is not line-aligned
  }
  auto load_raw = [&](int32_t it, int32_t (&raw)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int32_t pos = begin + it * kTileKeys + grp + 16 * j;
      raw[j] = pos < end ? keys.raw(pos) : -1;
    }
  };
  int32_t raw_a[4], raw_b[4];
  load_raw(0, raw_a);
  load_raw(1, raw_b);

  // Q: tracked by bar_q (the consumers fence the async proxy after waiting on it), so the
  // first key tiles are issued while Q is still in flight.
  for (int r = grp; r < kQRows; r += 16) {
    const bool ok = r < nh;
    const uint16_t* src = p.q + t * p.q_s0 + static_cast<int64_t>(h0 + (ok ? r : 0)) * p.q_s1;
#pragma unroll
    for (int b = 0; b < kKBlocks; ++b) {
      const int ch = b * 8 + sub;
      const uint32_t off = static_cast<uint32_t>(b * kQBlock + r * 128 + ((sub ^ (r & 7)) << 4));
      cp_async16(hopper::smem_addr(sQ + off),
                 ok ? static_cast<const void*>(src + ch * 8) : static_cast<const void*>(p.q), ok ? 16 : 0);
    }
  }
  hopper::cp_async_mbar_arrive_noinc(bar_q);

  const uint64_t pol = l2_evict_last_policy();
  auto one_tile = [&](int32_t it, int32_t (&raw)[4]) {
    int64_t slot[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) slot[j] = keys.checked(raw[j]);
    load_raw(it + 2, raw);
    const int buf = it & 1;
    const int use = it >> 1;
    if (use > 0) hopper::mbar_wait(&bar_empty[buf], (use - 1) & 1);
    // opaque: with the loop unrolled by two, buf is a constant in each copy, and the 2 x 36
    // destination addresses would be hoisted out of the loop into registers (spills).
    uint8_t* dst = sK + opaque(static_cast<uint32_t>(buf * kTileBytes));
    bool any = false;
    const uint8_t* src[4];  // each row's address, computed once for both parts
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = grp + 16 * j;
      const bool ok = slot[j] >= 0;
      any |= ok;
      src[j] = ok ? key_row<kKv>(p, slot[j]) : p.kv.base;
#pragma unroll
      for (int b = 0; b < kFirstBlocks; ++b) {
        const int ch = b * 8 + sub;
        cp_async16_keep(hopper::smem_addr(dst + swz_offset(r, ch)), src[j] + (ok ? ch * 16 : 0), ok ? 16 : 0, pol);
      }
      if (sub == 0) sValid[buf * 64 + r] = ok ? 1 : 0;
    }
    if (kAsync) {
      hopper::cp_async_mbar_arrive_noinc(&bar_full[buf]);
      // The flags before the second part's issue, so full[b] does not wait on it.
      const unsigned early = __ballot_sync(0xffffffffu, any);
      if ((tid & 31) == 0) sAny[buf * 4 + (tid >> 5)] = early != 0u ? 1 : 0;
      hopper::mbar_arrive(&bar_full[buf]);  // release semantics: sValid and sAny
    }
    if (!kAsync) cp_async_commit_group();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = grp + 16 * j;
      const bool ok = slot[j] >= 0;
#pragma unroll
      for (int b = kFirstBlocks; b < kKBlocks; ++b) {
        const int ch = b * 8 + sub;
        cp_async16_keep(hopper::smem_addr(dst + swz_offset(r, ch)), src[j] + (ok ? ch * 16 : 0), ok ? 16 : 0, pol);
      }
    }
    if (kAsync) hopper::cp_async_mbar_arrive_noinc(&bar_full_b[buf]);
    if (!kAsync) cp_async_commit_group();
    if (!kAsync) {
      const unsigned ballot = __ballot_sync(0xffffffffu, any);
      if ((tid & 31) == 0) sAny[buf * 4 + (tid >> 5)] = ballot != 0u ? 1 : 0;
    }
    if (kAsync) {
      // nothing to wait for: the tracked arrivals release the tile
    } else if (!kDefer) {
      cp_async_wait_group<1>();
      hopper::fence_async_smem();
      hopper::mbar_arrive(&bar_full[buf]);  // release: the first K blocks and the flags
      cp_async_wait_group<0>();
      hopper::fence_async_smem();
      hopper::mbar_arrive(&bar_full_b[buf]);  // release: the remaining K blocks
    } else if (it > 0) {  // tile it - 1 (two groups older than tile it's two)
      cp_async_wait_group<3>();
      hopper::fence_async_smem();
      hopper::mbar_arrive(&bar_full[buf ^ 1]);
      cp_async_wait_group<2>();
      hopper::fence_async_smem();
      hopper::mbar_arrive(&bar_full_b[buf ^ 1]);
    }
  };
  for (int32_t it = 0; it < n_tiles; it += 2) {
    one_tile(it, raw_a);
    if (it + 1 < n_tiles) one_tile(it + 1, raw_b);
  }
  if (kAsync) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives the producer thread
  } else if (kDefer) {  // the last tile
    const int buf = (n_tiles - 1) & 1;
    cp_async_wait_group<1>();
    hopper::fence_async_smem();
    hopper::mbar_arrive(&bar_full[buf]);
    cp_async_wait_group<0>();
    hopper::fence_async_smem();
    hopper::mbar_arrive(&bar_full_b[buf]);
  }
}

template <int kKv, bool kAsync = false>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wgmma_kernel(const Problem p) {
#if DSA_HOPPER_DEVICE
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = hopper::smem_aligned<1024>(smem_raw);
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
  uint64_t* bar_full_b = bar_full + 5;

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so the compiler sees it warp-uniform: the consumers' descriptors then
  // stay in uniform registers (logits round 9; here 7% at H >= 64, perf.md round 12).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
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
    hopper::mbar_init(&bar_full[0], kAsync ? 256 : 128);
    hopper::mbar_init(&bar_full[1], kAsync ? 256 : 128);
    hopper::mbar_init(&bar_empty[0], 256);
    hopper::mbar_init(&bar_empty[1], 256);
    hopper::mbar_init(bar_q, 128);
    hopper::mbar_init(&bar_full_b[0], 128);
    hopper::mbar_init(&bar_full_b[1], 128);
    hopper::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    hopper::regs_decrease<kProducerRegs>();
    produce<kKv, kTileHeads, false, kAsync>(p, keys, begin, end, n_tiles, t, h0, nh, sQ, sK, sValid, sAny, bar_full, bar_full_b, bar_empty, bar_q);
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

  if (n_tiles > 0) {
    hopper::mbar_wait(bar_q, 0);
    hopper::fence_async_smem();  // Q's cp.async rows (a tracked arrival), before wgmma reads them
  }
  for (int32_t it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    hopper::mbar_wait(&bar_full[buf], (it >> 1) & 1);
    if (kAsync) hopper::fence_async_smem();  // the gathered rows, before wgmma reads them
    const int* valid = sValid + buf * 64;
    const bool any = (sAny[buf * 4] | sAny[buf * 4 + 1] | sAny[buf * 4 + 2] | sAny[buf * 4 + 3]) != 0;
    if (!any) {  // uniform across both consumers: same flags
      // The tile's zero-fills must have landed before the buffer is released (and before the
      // epilogue reuses the key buffers as staging).
      hopper::mbar_wait(&bar_full_b[buf], (it >> 1) & 1);
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
      if (kk == kFirstKSteps) {  // the rest of the tile: the first k-steps run meanwhile
        hopper::wgmma_commit();
        hopper::mbar_wait(&bar_full_b[buf], (it >> 1) & 1);
        if (kAsync) hopper::fence_async_smem();
        hopper::wgmma_fence();
      }
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
      alpha[h] = exp2_ftz(m_run[h] - m_use[h]);      // m_run = -inf: 0
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    // P = exp2(S - m): f32 into the running sum, bf16 into the swizzled P tile.
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int h = (i >> 1) & 1;
      const float p0 = exp2_ftz(s[i] - m_use[h]), p1 = exp2_ftz(s[i + 1] - m_use[h]);
      l_run[h] += p0 + p1;
      const int row = r0 + 8 * h;
      const int key = c * 32 + hopper::acc_col(i, lane);
      *reinterpret_cast<uint32_t*>(sP + row * 128 + ((((key >> 3) ^ (row & 7))) << 4) + (key & 7) * 2) =
          pack_bf16(p0, p1);
    }
    // Once the maxima settle most tiles move none of a warp's 16 rows (alpha exactly 1): the
    // 128 multiplies are skipped then, warp-uniformly (the result is the same bits).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
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

// ---- few heads (H <= 32): the transposed form ------------------------------------------------
// With H < 64 a 64-row head tile would be mostly padding. Keys become the M side instead:
//   S^T[64 keys x N]  = K · Q^T                 wgmma m64nNk16 SS (A = key rows, K-major)
//   O^T[512 x N]     += V^T · P^T               8 x wgmma m64nNk16 SS (A = V^T: the same key
//                                               rows read MN-major; B = P^T [N x 64] K-major)
// N = 8, 16 or 32 (H rounded up). The two consumers take alternate key tiles (consumer c owns
// buffer c), each with its own online-softmax state over all N heads and all 512 dims
// (8 x N/2 f32 accumulators), merged once at the end: no per-tile exchange between them. The
// softmax runs down the columns: the maximum over the tile's 64 keys is reduced over lanes and
// the warpgroup's 4 warps (shared memory, a warpgroup barrier).
template <int kN>
struct FewHeadsLayout {
  static constexpr int kQBlock = kN * 128;                     // one K block of Q: N rows x 128 B
  static constexpr int kSmemQ = 0;
  static constexpr int kSmemK = kKBlocks * kQBlock;            // multiple of 1024
  static constexpr int kSmemP = kSmemK + 2 * kTileBytes;       // P^T [N x 64] per consumer
  static constexpr int kSmemValid = kSmemP + 2 * kQBlock;      // int [2][64]
  static constexpr int kSmemAny = kSmemValid + 2 * 64 * 4;     // int [2][4]
  static constexpr int kSmemRed = kSmemAny + 2 * 4 * 4;        // float [2][4 warps][N]
  static constexpr int kSmemML = kSmemRed + 2 * 4 * kN * 4;    // float2 [2][N]
  static constexpr int kSmemBar = kSmemML + 2 * kN * 8;
  static constexpr int kSmemUsed = kSmemBar + 7 * 8;
  static constexpr int kSmemBytes = kSmemUsed + 1024;
  static constexpr int kStageStride = kVDim + 4;               // f32 staging [N][516] at kSmemK
  static_assert(kN * kStageStride * 4 <= 2 * kTileBytes, "staging fits in the key buffers");
  static_assert(kSmemBytes <= 232448, "fits the 227 KiB opt-in");
};

// Warpgroup-local named barriers of the few-heads kernel (kBarEpi spans both consumers).
constexpr int kBarColMax = 4;  // + consumer
constexpr int kBarPt = 6;      // + consumer

template <int kKv, int kN, bool kAsync = false>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wgmma_few_heads_kernel(const Problem p) {
#if DSA_HOPPER_DEVICE
  using L = FewHeadsLayout<kN>;
  constexpr int kCols = kN / 4;  // head columns a thread holds
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = hopper::smem_aligned<1024>(smem_raw);
  uint8_t* sQ = smem + L::kSmemQ;
  uint8_t* sK = smem + L::kSmemK;
  int* sValid = reinterpret_cast<int*>(smem + L::kSmemValid);
  int* sAny = reinterpret_cast<int*>(smem + L::kSmemAny);
  float* sRed = reinterpret_cast<float*>(smem + L::kSmemRed);
  float2* sML = reinterpret_cast<float2*>(smem + L::kSmemML);
  uint64_t* bar_full = reinterpret_cast<uint64_t*>(smem + L::kSmemBar);
  uint64_t* bar_empty = bar_full + 2;
  uint64_t* bar_q = bar_full + 4;
  uint64_t* bar_full_b = bar_full + 5;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int t = tile / p.head_groups;
  const int h0 = (tile % p.head_groups) * kTileHeads;  // 0: H <= 32 is one group
  const int nh = min(kN, p.H - h0);

  SparseKeys keys;
  keys.init(p, t);
  const int32_t begin = split * p.split_keys;
  int32_t end = keys.count;
  if (p.splits > 1) end = min(end, begin + p.split_keys);
  const int32_t n_tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;

  if (tid == 0) {
    hopper::mbar_init(&bar_full[0], kAsync ? 256 : 128);
    hopper::mbar_init(&bar_full[1], kAsync ? 256 : 128);
    hopper::mbar_init(&bar_empty[0], 128);  // buffer c is consumed by consumer c alone
    hopper::mbar_init(&bar_empty[1], 128);
    hopper::mbar_init(bar_q, 128);
    hopper::mbar_init(&bar_full_b[0], 128);
    hopper::mbar_init(&bar_full_b[1], 128);
    hopper::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    hopper::regs_decrease<kProducerRegs>();
    produce<kKv, kN, true, kAsync>(p, keys, begin, end, n_tiles, t, h0, nh, sQ, sK, sValid, sAny, bar_full, bar_full_b, bar_empty, bar_q);
    return;
  }

  hopper::regs_increase<kConsumerRegs>();
  const int c = wg - 1;      // consumes tiles c, c + 2, ... from buffer c
  const int ct = tid - 128;  // 0..255 over both consumers
  const int wt = tid & 127;
  const int warp = wt >> 5, lane = wt & 31;
  uint8_t* sPt = smem + L::kSmemP + c * L::kQBlock;
  const uint8_t* kt = sK + c * kTileBytes;
  // Accumulator i of an m64nN fragment: row 16 * warp + lane / 4 + 8 * ((i >> 1) & 1), column
  // 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); column slot j = 2 * (i >> 2) + (i & 1).
  auto col_of = [&](int j) { return 8 * (j >> 1) + 2 * (lane & 3) + (j & 1); };

  float o[8][kN / 2];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) o[mb][i] = 0.f;
  float m_run[kCols], l_run[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    m_run[j] = -INFINITY;
    l_run[j] = 0.f;
  }

  if (n_tiles > c) {
    hopper::mbar_wait(bar_q, 0);
    hopper::fence_async_smem();  // Q's cp.async rows (a tracked arrival), before wgmma reads them
  }
  for (int32_t it = c; it < n_tiles; it += 2) {
    hopper::mbar_wait(&bar_full[c], (it >> 1) & 1);
    if (kAsync) hopper::fence_async_smem();  // the gathered rows, before wgmma reads them
    const int* valid = sValid + c * 64;
    const bool any = (sAny[c * 4] | sAny[c * 4 + 1] | sAny[c * 4 + 2] | sAny[c * 4 + 3]) != 0;
    if (!any) {
      hopper::mbar_wait(&bar_full_b[c], (it >> 1) & 1);  // zero-fills landed (see above)
      hopper::mbar_arrive(&bar_empty[c]);
      continue;
    }
    float s[kN / 2];
    const uint32_t k_addr = opaque(hopper::smem_addr(kt));
    const uint32_t q_addr = opaque(hopper::smem_addr(sQ));
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      const uint64_t da = desc_at(k_addr + (kk >> 2) * kBlockBytes + (kk & 3) * 32, kKMajorLbo, kKMajorSbo);
      const uint64_t db = desc_at(q_addr + (kk >> 2) * L::kQBlock + (kk & 3) * 32, kKMajorLbo, kKMajorSbo);
      if (kk == kFirstKSteps) {  // the rest of the tile: the first k-steps run meanwhile
        hopper::wgmma_commit();
        hopper::mbar_wait(&bar_full_b[c], (it >> 1) & 1);
        if (kAsync) hopper::fence_async_smem();
        hopper::wgmma_fence();
      }
      hopper::wgmma_bf16_ss<kN, 0, 0>(s, da, db, kk > 0 ? 1 : 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::fence_regs(s);

    // Mask and scale; column maxima over this thread's 2 keys, the warp's 16, the tile's 64.
    // (One column slot at a time: few registers live beside the 8 x N/2 accumulators.)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const int key = 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
      s[i] = valid[key] ? s[i] * p.scale_log2 : -INFINITY;
    }
    float* red = sRed + c * 4 * kN;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int i0 = 4 * (j >> 1) + (j & 1);  // accumulators i0 and i0 + 2 hold slot j
      float mx = fmaxf(s[i0], s[i0 + 2]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      if (lane < 4) red[warp * kN + col_of(j)] = mx;
    }
    named_bar(kBarColMax + c, 128);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = col_of(j);
      const float tile_max = fmaxf(fmaxf(red[col], red[kN + col]), fmaxf(red[2 * kN + col], red[3 * kN + col]));
      const float m_new = fmaxf(m_run[j], tile_max);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no valid key yet: keep exp2 finite
      const float alpha = exp2_ftz(m_run[j] - m_use);        // m_run = -inf: 0
      m_run[j] = m_new;
      l_run[j] *= alpha;
      const int i0 = 4 * (j >> 1) + (j & 1);
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
        o[mb][i0] *= alpha;
        o[mb][i0 + 2] *= alpha;
      }
    }
    // P^T [head][key] in bf16, swizzled K-major.
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const int j = 2 * (i >> 2) + (i & 1);
      const float m_use = m_run[j] == -INFINITY ? 0.f : m_run[j];
      const float pv = exp2_ftz(s[i] - m_use);
      l_run[j] += pv;
      const int key = 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
      const int head = col_of(j);
      *reinterpret_cast<uint16_t*>(sPt + head * 128 + (((key >> 3) ^ (head & 7)) << 4) + (key & 7) * 2) =
          float_to_bf16(pv);
    }
    hopper::fence_async_smem();
    named_bar(kBarPt + c, 128);

    // O^T += V^T · P^T: 8 blocks of 64 dims x 4 k-steps of 16 keys.
    const uint32_t v_addr = opaque(hopper::smem_addr(kt));
    const uint32_t p_addr = opaque(hopper::smem_addr(sPt));
    hopper::wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) {
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) {
        const uint64_t da = desc_at(v_addr + mb * kBlockBytes + kk * 16 * 128, kVLbo, kVSbo);
        const uint64_t db = desc_at(p_addr + kk * 32, kKMajorLbo, kKMajorSbo);
        hopper::wgmma_bf16_ss<kN, 1, 0>(o[mb], da, db, 1);
      }
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) hopper::fence_regs(o[mb]);
    hopper::mbar_arrive(&bar_empty[c]);
  }

  // This consumer's column sums: over lanes with the same columns, then the 4 warps.
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 4);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 8);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 16);
  }
  float* red = sRed + c * 4 * kN;
  if (lane < 4) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) red[warp * kN + col_of(j)] = l_run[j];
  }
  named_bar(kBarColMax + c, 128);
  if (warp == 0 && lane < 4) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = col_of(j);
      sML[c * kN + col] = make_float2(m_run[j], red[col] + red[kN + col] + red[2 * kN + col] + red[3 * kN + col]);
    }
  }
  named_bar(kBarEpi, 256);  // both states are in; every wgmma is done, the key buffers are free
  // The merged state of column `col`: m, l and the two consumers' weights (recomputed where
  // needed rather than held in registers beside the accumulators).
  struct Merged {
    float m, l, w0, w1;
  };
  auto merged = [&](int col) {
    const float2 a = sML[col], b = sML[kN + col];
    Merged r;
    r.m = fmaxf(a.x, b.x);
    r.w0 = a.y != 0.f ? exp2f(a.x - r.m) : 0.f;  // a state without keys has l = 0
    r.w1 = b.y != 0.f ? exp2f(b.x - r.m) : 0.f;
    r.l = a.y * r.w0 + b.y * r.w1;
    return r;
  };
  // The output factor of column `col`: 1 / l with the sink, 0 without keys; lse beside it.
  auto out_factor = [&](int col, const Merged& g, float& lse) {
    const bool any = g.l != 0.f;  // NaN (from NaN in a valid key) propagates
    lse = any ? (g.m + log2f(g.l)) * kLn2 : INFINITY;
    float f = any ? 1.f / g.l : 0.f;
    if (any && p.sink != nullptr && col < nh) f /= 1.f + expf(p.sink[static_cast<int64_t>(h0 + col) * p.sink_s] - lse);
    return f;
  };
  float* stage = reinterpret_cast<float*>(sK);  // [N][516] f32
  if (c == 1) {
    float w[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) w[j] = merged(col_of(j)).w1;
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        const int dim = mb * 64 + 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
        const int j = 2 * (i >> 2) + (i & 1);
        stage[col_of(j) * L::kStageStride + dim] = o[mb][i] * w[j];
      }
  }
  named_bar(kBarEpi, 256);
  if (p.splits > 1) {
    if (c == 0) {
      const int64_t base_row = (static_cast<int64_t>(split) * gridDim.x + tile) * kTileHeads;
      float w[kCols];
#pragma unroll
      for (int j = 0; j < kCols; ++j) w[j] = merged(col_of(j)).w0;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) {
          const int dim = mb * 64 + 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
          const int j = 2 * (i >> 2) + (i & 1);
          const int col = col_of(j);
          if (col < nh) p.part_o[(base_row + col) * kVDim + dim] = stage[col * L::kStageStride + dim] + o[mb][i] * w[j];
        }
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          const Merged g = merged(col_of(j));
          if (col_of(j) < nh) p.part_ml[base_row + col_of(j)] = make_float2(g.m, g.l);
        }
      }
    }
    return;
  }
  if (c == 0) {
    float f[kCols], fw[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int col = col_of(j);
      const Merged g = merged(col);
      float lse;
      f[j] = out_factor(col, g, lse);
      fw[j] = f[j] * g.w0;
      if (warp == 0 && lane < 4 && col < nh) p.lse[t * p.lse_s0 + static_cast<int64_t>(h0 + col) * p.lse_s1] = lse;
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        const int dim = mb * 64 + 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1);
        const int j = 2 * (i >> 2) + (i & 1);
        float* e = stage + col_of(j) * L::kStageStride + dim;
        *e = *e * f[j] + o[mb][i] * fw[j];
      }
  }
  named_bar(kBarEpi, 256);
  uint8_t* out = static_cast<uint8_t*>(p.out);
  if (p.out_bf16) {
    if (p.out_aligned16) {
      for (int i = ct; i < nh * (kVDim / 8); i += 256) {
        const int r = i / (kVDim / 8), ch = i % (kVDim / 8);
        const float* src = stage + r * L::kStageStride + ch * 8;
        uint4 u;
        u.x = pack_bf16(src[0], src[1]);
        u.y = pack_bf16(src[2], src[3]);
        u.z = pack_bf16(src[4], src[5]);
        u.w = pack_bf16(src[6], src[7]);
        *reinterpret_cast<uint4*>(out + (t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + ch * 8) * 2) = u;
      }
    } else {
      for (int i = ct; i < nh * kVDim; i += 256) {
        const int r = i / kVDim, d = i % kVDim;
        reinterpret_cast<uint16_t*>(out)[t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + d] =
            float_to_bf16(stage[r * L::kStageStride + d]);
      }
    }
  } else {
    if (p.out_aligned16) {
      for (int i = ct; i < nh * (kVDim / 4); i += 256) {
        const int r = i / (kVDim / 4), ch = i % (kVDim / 4);
        *reinterpret_cast<float4*>(out + (t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + ch * 4) * 4) =
            *reinterpret_cast<const float4*>(stage + r * L::kStageStride + ch * 4);
      }
    } else {
      for (int i = ct; i < nh * kVDim; i += 256) {
        const int r = i / kVDim, d = i % kVDim;
        reinterpret_cast<float*>(out)[t * p.out_s0 + static_cast<int64_t>(h0 + r) * p.out_s1 + d] =
            stage[r * L::kStageStride + d];
      }
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
