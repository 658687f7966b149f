// Kernel body of the cluster top-k (SPEC §3.5), sm_90: one thread-block cluster per row.
//
// For few rows of up to 196608 keys (decode; small prefill chunks), where one block per row
// leaves most SMs idle and a split with a merge pays two selection chains one after the other:
//   1. the row is cut into chunks of 24576 keys, one per CTA of a cluster of C <= 8 CTAs, and
//      read once (coalesced 16-byte loads). Each key becomes its order-preserving u32; its top
//      16 bits stay in registers (two keys a register: 24 registers for a thread's 48 keys),
//      its low 16 bits go to shared memory (f32 only: a bf16 key's low half follows from its
//      top half). So 64 rows of 65536 keys are 64 clusters of 3 CTAs, one wave at two CTAs
//      per SM (clusters of 4 CTAs of 16384 keys do not: 62 of them fit at once on the H200);
//   2. a radix select of three digits (12 + 10 + 10 bits): each CTA counts its keys into a
//      shared histogram (two u16 bins per word: a CTA holds at most 24576 keys), a cluster
//      barrier, then every CTA reads all C histograms of the digit through distributed shared
//      memory and picks the same bin (no broadcast: one barrier per digit; each digit has its
//      own histogram, so none is overwritten while another CTA may still read it). The first
//      digit counts only keys at or above a floor taken from a 1-in-24 sample (one barrier
//      before): a few thousand keys instead of the whole row, since shared atomics serialise on
//      the few bins where most of a row's keys lie. When fewer than k keys reach the floor
//      the first digit is counted again over every key (counted in g_topk_fallbacks). Only
//      keys that share the top 12 bits of the threshold read their low half. The result is
//      the exact k-th key T and the number of keys equal to T to take (the lowest positions);
//   3. every CTA ranks its selected keys in position order (warp scans per 16-byte column, a
//      block scan over warps, and the totals of the cluster's lower CTAs, exchanged in shared
//      memory with a last barrier) and writes them at their output slots (values re-read from
//      the row: the order key loses -0 and NaN payloads).
// No candidate list and no workspace: every input takes an exact path, and the answer is a
// function of the input only, so reruns are bit-identical.
#pragma once
#include "cuda/hopper/hopper.cuh"
#include "cuda/topk_radix_kernels.cuh"

namespace dsa {
namespace gpu {
namespace topk_cluster {

namespace radix = topk_radix;

constexpr int kThreads = 512;
constexpr int kKeys = 48;                                           // keys per thread
constexpr int kWarpKeys = kWarp * kKeys;                            // 1536 consecutive keys per warp
constexpr int64_t kChunk = static_cast<int64_t>(kThreads) * kKeys;  // 24576 keys per CTA
constexpr int kMaxCtas = 8;                                         // portable cluster size
constexpr int64_t kMaxWidth = kChunk * kMaxCtas;                    // rows up to 196608 keys
constexpr int kTopBits = 12, kLowBits = 10;                         // 12 + 10 + 10 = 32
constexpr int kTopBins = 1 << kTopBits, kLowBins = 1 << kLowBits;
constexpr int kSampleStride = kKeys / 2;  // keys 0 and 24 of each thread: 1 in 24

struct Shared {
  // Packed histograms: bin b in word b / 2, half b % 2. First digit: [0] the sample's (then
  // every key's, if the floor misses), [1] the keys' at or above the floor.
  uint32_t hist_top[2][kTopBins / 2];
  uint32_t hist_low[2][kLowBins / 2];  // second and third digits
  uint32_t totals[kMaxCtas][2];        // (keys > T, keys == T) of CTA r's chunk, written by CTA r
  radix::Shared scan;  // the streaming kernels' block scan (same 512 threads)
  uint32_t digit, above;
};
static_assert(kThreads == radix::kThreads, "radix::block_exclusive_scan and identity_row assume its block size");

__device__ __forceinline__ void bin_inc(uint32_t* hist, uint32_t d) { atomicAdd(&hist[d >> 1], 1u << ((d & 1u) * 16u)); }
__device__ __forceinline__ uint32_t bin_of(uint32_t word, uint32_t d) { return (word >> ((d & 1u) * 16u)) & 0xffffu; }

// The cluster's choice of a digit over every CTA's copy of a packed histogram of kBins bins.
// Thread t owns kBins / kThreads consecutive bins from the top; the block scan of the owners'
// sums finds the owner of the bin where the running count from the top first reaches
// rank_of(total of all bins), and that owner's warp walks its bins (a lane a bin). All threads
// get the bin (1 <= rank <= total, else *digit is unspecified), the count above it and the
// total. Reads remote shared memory: the caller's cluster barrier comes before.
template <int kBins, class RankOf>
__device__ __forceinline__ void cluster_choose(const uint32_t* hist, uint32_t C, RankOf&& rank_of, Shared& sh,
                                               uint32_t* digit, uint32_t* above_out, uint32_t* total_out) {
  constexpr int kPer = kBins / kThreads;  // bins per thread: 16 or 4, at most one a lane
  static_assert(kPer % 2 == 0 && kPer <= kWarp, "whole words per thread, a lane per bin");
  const int tid = threadIdx.x, lane = tid % kWarp;
  const uint32_t top = static_cast<uint32_t>(kBins - 1 - kPer * tid);  // this thread's highest bin
  const uint32_t* mine = hist + (top + 1 - kPer) / 2;
  uint32_t sum = 0;
  for (uint32_t r = 0; r < C; ++r) {
    const uint32_t* src = hopper::cluster_peer(mine, r);
#pragma unroll
    for (int w = 0; w < kPer / 2; ++w) sum += (src[w] >> 16) + (src[w] & 0xffffu);
  }
  uint32_t all;
  const uint32_t above = radix::block_exclusive_scan(sum, sh.scan, &all);
  const uint32_t rank = rank_of(all);
  const bool owner = above < rank && above + sum >= rank;
  const uint32_t owners = __ballot_sync(0xffffffffu, owner);
  if (owners != 0u) {  // the owner's warp: lane j counts bin top(owner) - j
    const int src_lane = __ffs(owners) - 1;
    const uint32_t o_top = __shfl_sync(0xffffffffu, top, src_lane);
    const uint32_t o_above = __shfl_sync(0xffffffffu, above, src_lane);
    uint32_t cnt = 0;
    if (lane < kPer) {
      const uint32_t b = o_top - static_cast<uint32_t>(lane);
      for (uint32_t r = 0; r < C; ++r) cnt += bin_of(*hopper::cluster_peer(hist + b / 2, r), b);
    }
    uint32_t x = cnt;  // inclusive scan over the lanes (the bins, highest first)
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    const bool here = lane < kPer && o_above + x - cnt < rank && o_above + x >= rank;
    if (here) {
      sh.digit = o_top - static_cast<uint32_t>(lane);
      sh.above = o_above + x - cnt;
    }
  }
  __syncthreads();
  *digit = sh.digit;
  *above_out = sh.above;
  *total_out = all;
}

// This thread's keys: warp w of CTA c holds positions [base, base + 1536) with
// base = c * kChunk + w * 1536; lane l holds the kPer keys of each 16-byte column q at
// base + q * 32 * kPer + l * kPer (coalesced loads), key i = q * kPer + e. Keys at or past L are
// not loaded. hi: the top 16 bits of each order key, two a register; the low 16 bits of an
// f32 key are at its CTA-local position in `lo`.
template <class T>
struct Keys {
  static constexpr bool kF32 = sizeof(T) == 4;
  static constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  static constexpr int kCols = kKeys / kPer;
  uint32_t hi[kKeys / 2];
  // Extracted anew at every use (a volatile asm): the compiler would otherwise keep each key's
  // extracted half alive from one pass to the next, a register per key.
  __device__ __forceinline__ uint32_t high(int i) const {
    uint32_t r;
    asm volatile("bfe.u32 %0, %1, %2, 16;" : "=r"(r) : "r"(hi[i / 2]), "r"((i & 1) * 16));
    return r;
  }
  // The CTA-local position of key i (lane l of warp w).
  __device__ __forceinline__ static int local(int wid, int lane, int i) {
    return wid * kWarpKeys + (i / kPer) * kWarp * kPer + lane * kPer + i % kPer;
  }
  // The low 16 bits of key i's order key: from shared memory (f32), or what the top half implies
  // (bf16: a widened bf16 has zero low bits, so its order key's low half is 0xffff for negative
  // values, whose top halves are 1..0x7fff, and 0 for the rest; NaN's key is 0).
  __device__ __forceinline__ uint32_t low(int i, const uint16_t* lo, int wid, int lane) const {
    if (kF32) {
      // One shared load where it is needed (a volatile asm: the compiler would otherwise batch
      // the 64 predicated loads of a pass ahead of their uses, a register each).
      uint16_t v;
      asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(hopper::smem_addr(lo + local(wid, lane, i))));
      return v;
    }
    const uint32_t h = high(i);
    return h != 0u && h < 0x8000u ? 0xffffu : 0u;
  }
  // Keys at or past L get order key 0 (NaN's): they rank below every key of the row, and at
  // key 0 below every position of the row, so with L > k none of them is ever selected and no
  // count needs a validity test (a bin may count them; the choice is the same).
  __device__ __forceinline__ void load(const T* x, int base, int L, uint16_t* lo, int wid, int lane) {
    const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
#pragma unroll
    for (int q = 0; q < kCols; ++q) {
      const int p = base + q * kWarp * kPer + lane * kPer;
      uint32_t key[kPer];
      if (aligned && p + kPer <= L) {
        const uint4 v = *reinterpret_cast<const uint4*>(x + p);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < kPer; ++e)
          key[e] = radix::order_key(kF32 ? w[e] : ((e & 1) ? (w[e / 2] & 0xffff0000u) : (w[e / 2] << 16)));
      } else {
#pragma unroll
        for (int e = 0; e < kPer; ++e) key[e] = p + e < L ? radix::order_key(radix::f32_bits(x[p + e])) : 0u;
      }
      if (kF32) {
        hi[q * 2] = (key[0] >> 16) | (key[1] & 0xffff0000u);
        hi[q * 2 + 1] = (key[2] >> 16) | (key[3] & 0xffff0000u);
        *reinterpret_cast<uint2*>(lo + local(wid, lane, q * kPer)) =
            make_uint2((key[0] & 0xffffu) | (key[1] << 16), (key[2] & 0xffffu) | (key[3] << 16));
      } else {
#pragma unroll
        for (int r = 0; r < 4; ++r) hi[q * 4 + r] = (key[2 * r] >> 16) | (key[2 * r + 1] & 0xffff0000u);
      }
    }
  }
};

// Dynamic shared memory of the kernel: the f32 keys' low halves.
template <class T>
__host__ __device__ constexpr int lo_bytes() { return sizeof(T) == 4 ? static_cast<int>(kChunk) * 2 : 0; }

// Launch: grid M * C blocks of kThreads in clusters of C (a.segs = C); row r is cluster r.
// Rows of L <= k get the identity from the cluster's first CTA.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) topk_cluster_kernel(radix::Args a) {
#if __CUDA_ARCH__ >= 900
  __shared__ __align__(16) Shared sh;
  extern __shared__ uint4 lo_smem[];  // f32: the low halves, kChunk u16 (lo_bytes<T>())
  uint16_t* lo = reinterpret_cast<uint16_t*>(lo_smem);
  constexpr int kPer = Keys<T>::kPer, kCols = Keys<T>::kCols;
  const uint32_t C = static_cast<uint32_t>(a.segs), c = hopper::cluster_rank();
  const int tid = threadIdx.x, lane = tid % kWarp, wid = tid / kWarp;
  const int64_t row = blockIdx.x / C;
  const int L = static_cast<int>(radix::row_length(a, row));  // <= kMaxWidth
  const T* x = static_cast<const T*>(a.logits) + row * a.l0;
  int32_t* idx = a.indices + row * a.i0;
  float* val = a.values ? a.values + row * a.v0 : nullptr;
  if (L <= a.k) {  // the same for every CTA of the cluster: none of them reaches a barrier
    if (c == 0) radix::identity_row<T>(a, row, L);
    return;
  }
  for (int i = tid; i < kTopBins; i += kThreads) sh.hist_top[i / (kTopBins / 2)][i % (kTopBins / 2)] = 0u;
  for (int i = tid; i < kLowBins; i += kThreads) sh.hist_low[i / (kLowBins / 2)][i % (kLowBins / 2)] = 0u;
  const int base = static_cast<int>(c) * static_cast<int>(kChunk) + wid * kWarpKeys;
  Keys<T> keys;
  keys.load(x, base, L, lo, wid, lane);
  __syncthreads();  // histograms cleared, low halves stored
  const uint32_t k = static_cast<uint32_t>(a.k);
  uint32_t digit, above, total;

  // Sample: keys 0 and 24 of every thread (1 in 24 of the row). The sample bin above which
  // about 2k + 512 of the row's keys would lie gives the floor of the first digit.
  uint32_t floor_rank = 0;
  if (a.sample_floor) {  // the same in every CTA of the launch
#pragma unroll
    for (int i = 0; i < kKeys; i += kSampleStride)
      bin_inc(sh.hist_top[0], keys.high(i) >> (16 - kTopBits));
    hopper::cluster_sync();
    cluster_choose<kTopBins>(sh.hist_top[0], C, [&](uint32_t samples) {
      // 1 in 24 positions was sampled: rank (2k + 512) / 24 of the sample (0: no floor). The
      // margin keeps the sample's error (about sqrt(rank)) from missing k, for small k too.
      const uint32_t r = (2u * k + 512u + kSampleStride - 1u) / kSampleStride;
      floor_rank = r >= samples ? 0u : r;
      return floor_rank;
    }, sh, &digit, &above, &total);
  }
  const uint32_t floor_digit = floor_rank ? digit : 0u;

  // Digit 1: the top 12 bits of the keys at or above the floor.
#pragma unroll
  for (int i = 0; i < kKeys; ++i) {
    const uint32_t d = keys.high(i) >> (16 - kTopBits);
    if (d >= floor_digit) bin_inc(sh.hist_top[1], d);
  }
  hopper::cluster_sync();
  cluster_choose<kTopBins>(sh.hist_top[1], C, [&](uint32_t) { return k; }, sh, &digit, &above, &total);
  if (total < k) {
    // Fewer than k keys reached the floor (a sample unlike its row): every key, in the
    // sample's histogram (no CTA reads it after the last barrier). Every CTA sees the same
    // sums, so all of them come here.
    if (c == 0 && tid == 0) atomicAdd(&radix::g_topk_fallbacks, 1ull);
    for (int i = tid; i < kTopBins / 2; i += kThreads) sh.hist_top[0][i] = 0u;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kKeys; ++i)
      bin_inc(sh.hist_top[0], keys.high(i) >> (16 - kTopBits));
    hopper::cluster_sync();
    cluster_choose<kTopBins>(sh.hist_top[0], C, [&](uint32_t) { return k; }, sh, &digit, &above, &total);
  }
  const uint32_t top12 = digit;
  uint32_t remaining = k - above;

  // Digits 2 and 3 (10 bits each) over the keys whose top 12 bits are top12: the prefix so far
  // is (top12 << 20) | low_prefix, low_mask the bits of the 20 below it already fixed.
  uint32_t low_prefix = 0, low_mask = 0;
#pragma unroll 1  // unrolled, the two passes' 48-key bodies spill (ptxas)
  for (int d = 0; d < 2; ++d) {
    const int shift = 20 - kLowBits * (d + 1);
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const uint32_t h = keys.high(i);
      if ((h >> (16 - kTopBits)) == top12) {
        const uint32_t low20 = ((h & 0xfu) << 16) | keys.low(i, lo, wid, lane);
        if ((low20 & low_mask) == low_prefix) bin_inc(sh.hist_low[d], (low20 >> shift) & (kLowBins - 1u));
      }
    }
    hopper::cluster_sync();
    cluster_choose<kLowBins>(sh.hist_low[d], C, [&](uint32_t) { return remaining; }, sh, &digit, &above, &total);
    low_prefix |= digit << shift;
    low_mask |= (kLowBins - 1u) << shift;
    remaining -= above;
  }
  const uint32_t T_key = (top12 << 20) | low_prefix;
  const uint32_t need_eq = remaining;

  // Ranks in position order. Per column q the warp's keys run lane by lane, so a warp scan of
  // the lanes' (gt << 16 | eq) counts gives each lane's offset inside the column; columns
  // follow one another, warps follow one another (a block scan of the warp totals), CTAs too.
  // The counts are taken twice (the totals first, then column by column while writing) rather
  // than kept in registers.
  const auto packed = [&](int i) -> uint32_t {
    const uint32_t key = (keys.high(i) << 16) | keys.low(i, lo, wid, lane);
    return key > T_key ? (1u << 16) : (key == T_key ? 1u : 0u);
  };
  uint32_t mine = 0;
#pragma unroll
  for (int i = 0; i < kKeys; ++i) mine += packed(i);
  uint32_t cta_total;
  const uint32_t thread_before = radix::block_exclusive_scan(__reduce_add_sync(0xffffffffu, mine) * (lane == 0), sh.scan, &cta_total);
  const uint32_t warp_before = __shfl_sync(0xffffffffu, thread_before, 0);
  if (tid < static_cast<int>(C)) {
    uint32_t* slot = hopper::cluster_peer(&sh.totals[c][0], static_cast<uint32_t>(tid));
    slot[0] = cta_total >> 16;
    slot[1] = cta_total & 0xffffu;
  }
  hopper::cluster_sync();  // the last remote access: after it every CTA may exit
  uint32_t gt_base = 0, eq_base = 0;
  for (uint32_t r = 0; r < c; ++r) {
    gt_base += sh.totals[r][0];
    eq_base += sh.totals[r][1];
  }
  uint32_t run = warp_before;  // packed counts of the CTA's positions before this column
#pragma unroll
  for (int q = 0; q < kCols; ++q) {
    uint32_t col = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) col += packed(q * kPer + e);
    uint32_t s = col;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    const uint32_t before = run + s - col;
    run += __shfl_sync(0xffffffffu, s, kWarp - 1);
    if (col == 0u) continue;
    uint32_t gt_before = gt_base + (before >> 16), eq_before = eq_base + (before & 0xffffu);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const uint32_t t = packed(q * kPer + e);
      const bool is_gt = t > 1u, is_eq = t == 1u;
      if (is_gt || (is_eq && eq_before < need_eq)) {
        const uint32_t slot = gt_before + (eq_before < need_eq ? eq_before : need_eq);
        const int p = base + q * kWarp * kPer + lane * kPer + e;
        idx[slot] = p;
        if (val) val[slot] = __uint_as_float(radix::f32_bits(x[p]));
      }
      gt_before += is_gt;
      eq_before += is_eq;
    }
  }
#else
  (void)a;
  __trap();
#endif
}

}  // namespace topk_cluster
}  // namespace gpu
}  // namespace dsa
