// Kernel bodies of the streaming radix top-k (SPEC §3.5). Plain CUDA; on sm_90 the stream also
// asks the copy engine for bulk L2 prefetches (a no-op hint elsewhere).
//
// One block selects the exact top-k of one run of keys (a row, a segment of a long row, or a
// merge list of per-segment winners):
//   1. sample: 32 chunks of 128 keys spread over the run; a two-digit radix select over the
//      sample picks a threshold key t (22-bit prefix) that about `target` keys of the run pass;
//   2. stream: the run is read once with 16-byte loads; every key >= t is appended, as
//      (value bits, position), to a shared candidate list (per step a thread tests its 16-32
//      keys into a mask, the warp reserves slots with one scan and one atomic; the count goes
//      on past the capacity, nothing past it is stored);
//   3. if k <= count <= capacity the list holds the k best and every key equal to the k-th
//      (all are >= t): a 12+10+10-bit radix select over the list gives the k-th key T and how
//      many keys == T to take, a position bitmap ranks the ties (lowest positions win) and
//      orders the output (prefix popcounts): written from the list, no second read;
//   4. else (too few or too many passed t: many equal keys, skewed rows) the exact fallback,
//      the three-pass radix select over the run plus an output scan in position order
//      (reads the run 3-5 times; counted in g_topk_fallbacks for the tests).
// The answer is a function of the input only (the list's order never shows), so reruns are
// bit-identical. Keys: order-preserving u32 of the f32 value (bf16 widened exactly); every NaN
// is 0, below -inf; -0 == +0.
#pragma once
#include <math_constants.h>

#include <type_traits>

#include "cuda/hopper/hopper.cuh"
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace topk_radix {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTopBits = 12, kTopBins = 1 << kTopBits;  // first digit
constexpr int kLowBits = 10, kLowBins = 1 << kLowBits;  // two more: 12 + 10 + 10 = 32
constexpr int kUnroll = 4;                               // 16-byte loads in flight per thread
constexpr int kSampleChunks = 32, kSampleChunk = 128;
constexpr int kSamplePer = kSampleChunks * kSampleChunk / kThreads;  // sampled keys per thread
constexpr int64_t kMaxRun = 131072;                      // longest run one block takes (bitmap)
constexpr int kBitmapWords = static_cast<int>(kMaxRun / 32);
// Shared region reused by phase: the 4096-bin histogram | the position bitmap + u16 prefixes.
constexpr int kRegionBytes = kBitmapWords * 4 + kBitmapWords * 2 > kTopBins * 4 ? kBitmapWords * 6 : kTopBins * 4;
constexpr int kOutItems = 4;  // fallback output scan: consecutive positions per thread
static_assert(kTopBins % kThreads == 0 && kLowBins % kThreads == 0, "bin/thread layout");
static_assert(kSampleChunk % kWarp == 0 && (kSampleChunks * kSampleChunk) % kThreads == 0, "sample layout");
static_assert(kRegionBytes % 16 == 0, "candidate arrays stay 16-byte aligned");

// Candidate capacity for k (the list must hold more than k): 4k, at least 8192, at most 24576.
__host__ __device__ constexpr int cand_cap(int64_t k) {
  return k * 4 < 8192 ? 8192 : (k * 4 > 24576 ? 24576 : static_cast<int>(k * 4));
}
__host__ __device__ constexpr int smem_bytes(int64_t k) { return kRegionBytes + cand_cap(k) * 8; }

__device__ unsigned long long g_topk_fallbacks;  // blocks that took the exact fallback
__device__ unsigned long long g_topk_short_lists;  // cluster kernel: rows settled from the short list

__device__ __forceinline__ uint32_t order_key(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN: lowest
  if (u == 0x80000000u) u = 0u;                     // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t f32_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t f32_bits(uint16_t v) { return static_cast<uint32_t>(v) << 16; }  // bf16

// A run of keys: positions [0, len). Merge lists (kMerge) are [segs, k] slots of which slot
// j is valid iff j % k < min(k, clamp(row_len - (j / k) * seg, 0, seg)).
// kL2: loads bypass L1 (ld.global.cg): the fused split's merging block reads slots that other
// blocks of the same launch wrote, which a non-coherent L1 line could hold stale.
template <class T, bool kMerge, bool kL2 = false>
struct Run {
  const T* x;
  int64_t len;
  int64_t k = 0, seg = 0, row_len = 0;
  __device__ __forceinline__ uint4 vec(const uint4* p) const {
    if (kL2) return __ldcg(p);
    return *p;
  }
  __device__ __forceinline__ bool valid(int64_t j) const {
    if (!kMerge) return true;
    // Merge lists hold at most kMaxRun slots and k <= 16384: a 32-bit division (the 64-bit one
    // is a ~70-instruction call, once per slot of every pass).
    const uint32_t s32 = static_cast<uint32_t>(j) / static_cast<uint32_t>(k);
    const int64_t s = s32, l = j - s * k;
    int64_t n = row_len - s * seg;
    n = n < 0 ? 0 : (n > seg ? seg : n);
    return l < (n < k ? n : k);
  }
  __device__ __forceinline__ uint32_t bits(int64_t j) const {
    if (kL2) return f32_bits(__ldcg(x + j));
    return f32_bits(x[j]);
  }
};

// Calls f(bits, pos, ok) for every position of the run (order unspecified), the same number of
// times in every thread, so warps are converged at each call. The aligned body uses 16-byte
// loads (chunks in reverse order when `backwards`); the unaligned head and the tail (or the
// whole run if x is not element-aligned) are read one by one.
template <int kUnr, class R, class F>
__device__ __forceinline__ void visit(const R& r, bool backwards, F&& f) {
  using T = typename std::remove_cv<typename std::remove_pointer<decltype(r.x)>::type>::type;
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  const int64_t len = r.len;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(r.x);
  int64_t head = (addr % sizeof(T)) ? len : static_cast<int64_t>(((16u - (addr & 15u)) & 15u) / sizeof(T));
  head = head < len ? head : len;
  const int64_t nvec = (len - head) / kPer, tail0 = head + nvec * kPer;
  const uint4* xv = reinterpret_cast<const uint4*>(r.x + head);
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * kUnr;
  const int64_t steps = (nvec + kStep - 1) / kStep;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t base = (backwards ? steps - 1 - s : s) * kStep + threadIdx.x;
    uint4 v[kUnr];
    bool ok[kUnr];
#pragma unroll
    for (int u = 0; u < kUnr; ++u) {
      ok[u] = base + u * kThreads < nvec;
      v[u] = ok[u] ? r.vec(xv + base + u * kThreads) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kUnr; ++u) {
      const int64_t p0 = head + (base + u * kThreads) * kPer;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        uint32_t b;
        if (sizeof(T) == 4) b = w[e];
        else b = (e & 1) ? (w[e / 2] & 0xffff0000u) : (w[e / 2] << 16);  // little-endian pairs
        f(b, p0 + e, ok[u] && r.valid(p0 + e));
      }
    }
  }
  const int64_t edges = head + (len - tail0);
  for (int64_t e0 = 0; e0 < edges; e0 += kThreads) {
    const int64_t e = e0 + threadIdx.x;
    const bool ok = e < edges;
    const int64_t j = e < head ? e : tail0 + (e - head);
    f(ok ? r.bits(j) : 0u, j, ok && r.valid(j));
  }
}

// a >= b on f32 bit patterns with denormals kept whatever -ftz says (setp without .ftz).
__device__ __forceinline__ bool f32_ge(uint32_t a, float b) {
  uint32_t r;
  asm("{\n\t.reg .pred p;\n\tsetp.ge.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(r) : "f"(__uint_as_float(a)), "f"(b));
  return r != 0u;
}

// Inclusive warp scan of cnt; lane 31 reserves the warp's total at *counter (one shared atomic
// per warp, not one per element). Warp-converged. Returns where this lane's first item goes.
__device__ __forceinline__ uint32_t warp_reserve(uint32_t cnt, uint32_t* counter) {
  const int lane = threadIdx.x % kWarp;
  uint32_t x = cnt;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  uint32_t base = 0;
  if (lane == kWarp - 1 && x != 0u) base = atomicAdd(counter, x);
  base = __shfl_sync(0xffffffffu, base, kWarp - 1);
  return base + x - cnt;
}

// The stream of step 2 (same traversal as visit): every valid key >= thr is appended, as
// (value bits, position), to the candidate list. Each thread tests its kUnr * kPer keys of a
// step into a bit mask, the warp reserves their slots with one atomic, then the keys are
// stored; the count goes on past cap, nothing past it is stored. The next step's loads are
// independent of this step's stores, so warps keep their loads in flight while others append.
// With `prefetch` (sm_90), thread 0 asks the copy engine to bring the step kAhead steps ahead
// into L2 (one bulk prefetch of the step's contiguous 16 * kThreads * kUnr bytes), so the bytes
// in flight per block are not bounded by the registers the loads of one step hold.
constexpr int kAhead = 2;
template <int kUnr, class R>
__device__ __forceinline__ void stream_append(const R& r, uint32_t thr, uint32_t cap, uint32_t* cand_val,
                                              uint32_t* cand_idx, uint32_t* counter, bool prefetch) {
  using T = typename std::remove_cv<typename std::remove_pointer<decltype(r.x)>::type>::type;
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  static_assert(kUnr * kPer <= 32, "one mask bit per key of a step");
  const int64_t len = r.len;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(r.x);
  int64_t head = (addr % sizeof(T)) ? len : static_cast<int64_t>(((16u - (addr & 15u)) & 15u) / sizeof(T));
  head = head < len ? head : len;
  const int64_t nvec = (len - head) / kPer, tail0 = head + nvec * kPer;
  const uint4* xv = reinterpret_cast<const uint4*>(r.x + head);
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * kUnr;
  const int64_t steps = (nvec + kStep - 1) / kStep;
  // order_key(b) >= thr as one float compare: keys order the non-NaN values as floats do
  // (-0 == +0), so it is v >= key_value(thr); NaN (key 0) fails every compare. thr == 0 takes
  // every key (NaN too); a thr at or below the key of -inf (no key lies between 0 and it) takes
  // every non-NaN key, as v >= -inf does.
  const bool take_all = thr == 0u;
  const float tf = thr <= 0x007fffffu ? -CUDART_INF_F
                                      : __uint_as_float(thr >= 0x80000000u ? (thr & 0x7fffffffu) : ~thr);
  const auto passes = [&](uint32_t b) { return take_all || f32_ge(b, tf); };
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t base = s * kStep + threadIdx.x;
    if (prefetch && threadIdx.x == 0 && s + kAhead < steps) {
      const int64_t first = (s + kAhead) * kStep, n = nvec - first < kStep ? nvec - first : kStep;
      hopper::prefetch_l2_bulk(xv + first, static_cast<uint32_t>(n * 16));
    }
    uint4 v[kUnr];
    bool ok[kUnr];
#pragma unroll
    for (int u = 0; u < kUnr; ++u) {
      ok[u] = base + u * kThreads < nvec;
      v[u] = ok[u] ? r.vec(xv + base + u * kThreads) : make_uint4(0u, 0u, 0u, 0u);
    }
    uint32_t take = 0;
#pragma unroll
    for (int u = 0; u < kUnr; ++u) {
      const int64_t p0 = head + (base + u * kThreads) * kPer;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        uint32_t b;
        if (sizeof(T) == 4) b = w[e];
        else b = (e & 1) ? (w[e / 2] & 0xffff0000u) : (w[e / 2] << 16);
        const bool t = ok[u] && r.valid(p0 + e) && passes(b);
        take |= static_cast<uint32_t>(t) << (u * kPer + e);
      }
    }
    uint32_t p = warp_reserve(static_cast<uint32_t>(__popc(take)), counter);
    if (take == 0u) continue;
#pragma unroll
    for (int u = 0; u < kUnr; ++u) {
      const int64_t p0 = head + (base + u * kThreads) * kPer;
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        if ((take >> (u * kPer + e)) & 1u) {
          uint32_t b;
          if (sizeof(T) == 4) b = w[e];
          else b = (e & 1) ? (w[e / 2] & 0xffff0000u) : (w[e / 2] << 16);
          if (p < cap) {
            cand_val[p] = b;
            cand_idx[p] = static_cast<uint32_t>(p0 + e);
          }
          ++p;
        }
      }
    }
  }
  const int64_t edges = head + (len - tail0);
  for (int64_t e0 = 0; e0 < edges; e0 += kThreads) {  // block-uniform trip count
    const int64_t e = e0 + threadIdx.x;
    const int64_t j = e < head ? e : tail0 + (e - head);
    const bool in = e < edges && r.valid(j);
    const uint32_t b = in ? r.bits(j) : 0u;
    const bool t = in && passes(b);
    const uint32_t p = warp_reserve(t ? 1u : 0u, counter);
    if (t && p < cap) {
      cand_val[p] = b;
      cand_idx[p] = static_cast<uint32_t>(j);
    }
  }
}

struct Shared {
  uint32_t warp_sums[kWarp];
  uint32_t chosen_digit, chosen_above, chosen_count;
  uint32_t cand_n, gather_n;
  int32_t n_sample;
};

// Exclusive prefix sum over a block of kThr threads (all call; kThr <= 32 warps, one a slot of
// warp_sums); *total gets the sum.
template <int kThr = kThreads>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, Shared& sh, uint32_t* total) {
  constexpr int kScanWarps = kThr / kWarp;
  static_assert(kScanWarps <= kWarp, "one warp scans the warp sums");
  const int lane = threadIdx.x % kWarp, wid = threadIdx.x / kWarp;
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == kWarp - 1) sh.warp_sums[wid] = x;
  __syncthreads();
  if (wid == 0) {
    uint32_t s = lane < kScanWarps ? sh.warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < kScanWarps) sh.warp_sums[lane] = s;
  }
  __syncthreads();
  const uint32_t before = (wid > 0 ? sh.warp_sums[wid - 1] : 0u) + x - v;
  *total = sh.warp_sums[kScanWarps - 1];
  __syncthreads();  // warp_sums is reused by the next scan
  return before;
}

// Warp-converged: lanes with the same digit add once.
__device__ __forceinline__ void hist_add(uint32_t* hist, bool counted, uint32_t digit) {
  const uint32_t peers = __match_any_sync(0xffffffffu, counted ? digit : 0xffffffffu);
  if (counted && (threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
}

// Plain shared atomic (no match): for histograms of few keys per thread with spread digits
// (the sample, the candidate list), where the match costs more than rare same-digit conflicts.
__device__ __forceinline__ void hist_inc(uint32_t* hist, bool counted, uint32_t digit) {
  if (counted) atomicAdd(&hist[digit], 1u);
}

// hist holds kPer * kThreads bins. Counting from the highest bin down, picks the bin where the
// running count first reaches `remaining` (1 <= remaining <= sum of the bins). All threads
// call; the result is in sh.chosen_* on return.
template <int kPer>
__device__ __forceinline__ void choose_digit(const uint32_t* hist, uint32_t remaining, Shared& sh) {
  const int top = kPer * kThreads - 1 - static_cast<int>(threadIdx.x) * kPer;
  uint32_t cnt = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) cnt += hist[top - i];
  uint32_t total;
  const uint32_t above = block_exclusive_scan(cnt, sh, &total);
  if (above < remaining && above + cnt >= remaining) {
    uint32_t run = above;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const uint32_t c = hist[top - i];
      if (run + c >= remaining) {
        sh.chosen_digit = static_cast<uint32_t>(top - i);
        sh.chosen_above = run;
        sh.chosen_count = c;
        break;
      }
      run += c;
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void clear(uint32_t* p, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) p[i] = 0u;
}

// Builds the bitmap of candidate positions where pick(j) holds and, per word, the count of set
// bits in the words before it (u16: counts stay below the capacity). Ends with a barrier.
template <class Pick>
__device__ __forceinline__ void rank_bitmap(uint32_t* bm, uint16_t* pre, int words, const uint32_t* cand_idx,
                                            uint32_t n, Shared& sh, Pick&& pick) {
  clear(bm, words);
  __syncthreads();
  for (uint32_t j = threadIdx.x; j < n; j += kThreads) {
    if (pick(j)) {
      const uint32_t p = cand_idx[j] & 0x7fffffffu;
      atomicOr(&bm[p >> 5], 1u << (p & 31u));
    }
  }
  __syncthreads();
  const int per = (words + kThreads - 1) / kThreads;  // contiguous words per thread
  const int w0 = static_cast<int>(threadIdx.x) * per;
  uint32_t sum = 0;
  for (int i = 0; i < per; ++i)
    if (w0 + i < words) sum += __popc(bm[w0 + i]);
  uint32_t total;
  uint32_t run = block_exclusive_scan(sum, sh, &total);
  for (int i = 0; i < per; ++i) {
    if (w0 + i < words) {
      pre[w0 + i] = static_cast<uint16_t>(run);
      run += __popc(bm[w0 + i]);
    }
  }
  __syncthreads();
}

__device__ __forceinline__ uint32_t bitmap_rank(const uint32_t* bm, const uint16_t* pre, uint32_t p) {
  return pre[p >> 5] + __popc(bm[p >> 5] & ((1u << (p & 31u)) - 1u));
}

// The exact top-k of run r (more than k valid positions; r.len <= kMaxRun), emitted as
// emit(slot, position, value bits) with slots 0..k-1 in ascending position order. All threads
// of the block call; `smem` is the dynamic shared memory (smem_bytes(k)).
// prefetch (block-uniform; runs of 16-byte-aligned keys): the stream's first kAhead steps are
// asked into L2 before the sample, and each step asks for the one kAhead further.
template <class R, class Emit>
__device__ void block_topk(const R& r, uint32_t k, uint8_t* smem, Shared& sh, Emit&& emit, bool prefetch = false) {
  const int tid = threadIdx.x, lane = tid % kWarp;
  const uint32_t cap = static_cast<uint32_t>(cand_cap(k));
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem);
  uint32_t* bm = reinterpret_cast<uint32_t*>(smem);
  uint16_t* pre = reinterpret_cast<uint16_t*>(smem + kBitmapWords * 4);
  uint32_t* cand_val = reinterpret_cast<uint32_t*>(smem + kRegionBytes);
  uint32_t* cand_idx = cand_val + cap;
  const int64_t len = r.len;
  if (tid == 0) {
    sh.cand_n = 0;
    sh.gather_n = 0;
  }
  using Elem = typename std::remove_cv<typename std::remove_pointer<decltype(r.x)>::type>::type;
  prefetch = prefetch && (reinterpret_cast<uintptr_t>(r.x) & 15u) == 0;
  if (prefetch && tid == 0) {
    const int64_t bytes = len * static_cast<int64_t>(sizeof(Elem)) / 16 * 16;
    const int64_t ahead = static_cast<int64_t>(kAhead) * kThreads * kUnroll * 16;
    if (bytes > 0) hopper::prefetch_l2_bulk(r.x, static_cast<uint32_t>(bytes < ahead ? bytes : ahead));
  }

  // 1. Threshold. Runs that fit the list take every key (t = 0).
  uint32_t thr = 0;
  if (len > static_cast<int64_t>(cap)) {
    uint32_t sk[kSamplePer];
    bool sok[kSamplePer];
    int n_samp = 0;
    // All sample loads are issued before the first barrier (one memory latency, not 8).
#pragma unroll
    for (int u = 0; u < kSamplePer; ++u) {
      const int slot = u * kThreads + tid;
      const int64_t pos = (slot / kSampleChunk) * len / kSampleChunks + slot % kSampleChunk;
      sok[u] = pos < len && r.valid(pos);
      sk[u] = sok[u] ? r.bits(pos) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kSamplePer; ++u) {
      sk[u] = order_key(sk[u]);
      n_samp += __syncthreads_count(sok[u]);
    }
    if (n_samp > 0) {
      // Rank in the sample of the key about `target` keys of the run reach: half the list
      // (or midway between k and the list) leaves room for sampling error both ways.
      const int64_t target = cap >= 4 * static_cast<int64_t>(k) ? cap / 2 : (static_cast<int64_t>(k) + cap) / 2;
      // The sample covers a fixed share (4096 / len) of the positions, valid or not (merge
      // lists have empty slots), so the rank is that share of the target.
      int64_t rank = (target * (kSampleChunks * kSampleChunk) + len - 1) / len;
      rank = rank < 1 ? 1 : (rank > n_samp ? n_samp : rank);
      clear(hist, kTopBins);
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kSamplePer; ++u) hist_inc(hist, sok[u], sk[u] >> (32 - kTopBits));
      __syncthreads();
      choose_digit<kTopBins / kThreads>(hist, static_cast<uint32_t>(rank), sh);
      const uint32_t d1 = sh.chosen_digit;
      const uint32_t rem = static_cast<uint32_t>(rank) - sh.chosen_above;
      clear(hist, kLowBins);
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kSamplePer; ++u)
        hist_inc(hist, sok[u] && (sk[u] >> (32 - kTopBits)) == d1, (sk[u] >> (32 - kTopBits - kLowBits)) & (kLowBins - 1u));
      __syncthreads();
      choose_digit<kLowBins / kThreads>(hist, rem, sh);
      thr = (d1 << (32 - kTopBits)) | (sh.chosen_digit << (32 - kTopBits - kLowBits));
    }
  }
  __syncthreads();  // cand_n = 0 is visible

  // 2. Stream: append every key >= thr.
  stream_append<kUnroll>(r, thr, cap, cand_val, cand_idx, &sh.cand_n, prefetch);
  __syncthreads();
  const uint32_t lt_mask = (1u << lane) - 1u;
  const uint32_t n = sh.cand_n;

  if (n >= k && n <= cap) {
    // 3. Exact select over the list: T = k-th key, need_eq keys == T to take.
    uint32_t prefix = 0, mask = 0, remaining = k, eq_count = 0;
    clear(hist, kTopBins);
    __syncthreads();
    for (uint32_t j0 = 0; j0 < n; j0 += kThreads) {  // block-uniform trip count
      const uint32_t j = j0 + tid;
      hist_inc(hist, j < n, j < n ? order_key(cand_val[j]) >> (32 - kTopBits) : 0u);
    }
    __syncthreads();
    choose_digit<kTopBins / kThreads>(hist, remaining, sh);
    prefix = sh.chosen_digit << (32 - kTopBits);
    mask = ~0u << (32 - kTopBits);
    remaining -= sh.chosen_above;
    for (int shift = 32 - kTopBits - kLowBits; shift >= 0; shift -= kLowBits) {
      clear(hist, kLowBins);
      __syncthreads();
      for (uint32_t j0 = 0; j0 < n; j0 += kThreads) {
        const uint32_t j = j0 + tid;
        const uint32_t key = j < n ? order_key(cand_val[j]) : 0u;
        hist_inc(hist, j < n && (key & mask) == prefix, (key >> shift) & (kLowBins - 1u));
      }
      __syncthreads();
      choose_digit<kLowBins / kThreads>(hist, remaining, sh);
      prefix |= sh.chosen_digit << shift;
      mask |= (kLowBins - 1u) << shift;
      remaining -= sh.chosen_above;
      eq_count = sh.chosen_count;
    }
    const uint32_t T = prefix, need_eq = remaining;
    const int words = static_cast<int>((len + 31) / 32);
    if (need_eq < eq_count) {
      // Ties at T: keep the need_eq lowest positions, mark the others (bit 31 of the position).
      rank_bitmap(bm, pre, words, cand_idx, n, sh, [&](uint32_t j) { return order_key(cand_val[j]) == T; });
      for (uint32_t j = tid; j < n; j += kThreads) {
        if (order_key(cand_val[j]) == T && bitmap_rank(bm, pre, cand_idx[j]) >= need_eq) cand_idx[j] |= 0x80000000u;
      }
      __syncthreads();  // the bitmap is rebuilt below
    }
    const auto picked = [&](uint32_t j) {
      const uint32_t key = order_key(cand_val[j]);
      return key > T || (key == T && (cand_idx[j] & 0x80000000u) == 0u);
    };
    rank_bitmap(bm, pre, words, cand_idx, n, sh, picked);
    for (uint32_t j = tid; j < n; j += kThreads) {
      if (picked(j)) emit(bitmap_rank(bm, pre, cand_idx[j]), static_cast<int64_t>(cand_idx[j]), cand_val[j]);
    }
    return;
  }

  // 4. Exact fallback: radix select over the run (12, 10, 10 bits), the second and third digit
  // over the first digit's bucket gathered into the list when it fits (its 2 * cap words).
  if (tid == 0) atomicAdd(&g_topk_fallbacks, 1ull);
  uint32_t* gathered = cand_val;
  const uint32_t gather_cap = 2 * cap;
  clear(hist, kTopBins);
  __syncthreads();
  visit<2>(r, false, [&](uint32_t b, int64_t, bool ok) { hist_add(hist, ok, order_key(b) >> (32 - kTopBits)); });
  __syncthreads();
  choose_digit<kTopBins / kThreads>(hist, k, sh);
  uint32_t prefix = sh.chosen_digit << (32 - kTopBits);
  uint32_t mask = ~0u << (32 - kTopBits);
  uint32_t remaining = k - sh.chosen_above;
  const uint32_t bucket = sh.chosen_count;
  const bool use_list = bucket <= gather_cap;
  if (use_list) {
    visit<2>(r, true, [&](uint32_t b, int64_t, bool ok) {
      const uint32_t key = order_key(b);
      const bool take = ok && (key & mask) == prefix;
      const uint32_t ballot = __ballot_sync(0xffffffffu, take);
      if (ballot == 0u) return;
      uint32_t base = 0;
      if (lane == 0) base = atomicAdd(&sh.gather_n, __popc(ballot));
      base = __shfl_sync(0xffffffffu, base, 0);
      const uint32_t p = base + __popc(ballot & lt_mask);
      if (take && p < gather_cap) gathered[p] = key;
    });
  }
  for (int shift = 32 - kTopBits - kLowBits; shift >= 0; shift -= kLowBits) {
    clear(hist, kLowBins);
    __syncthreads();
    const auto count = [&](uint32_t key, bool ok) {
      hist_add(hist, ok && (key & mask) == prefix, (key >> shift) & (kLowBins - 1u));
    };
    if (use_list) {
      for (uint32_t j0 = 0; j0 < bucket; j0 += kThreads) {
        const uint32_t j = j0 + tid;
        count(j < bucket ? gathered[j] : 0u, j < bucket);
      }
    } else {
      visit<2>(r, shift != 0, [&](uint32_t b, int64_t, bool ok) { count(order_key(b), ok); });
    }
    __syncthreads();
    choose_digit<kLowBins / kThreads>(hist, remaining, sh);
    prefix |= sh.chosen_digit << shift;
    mask |= (kLowBins - 1u) << shift;
    remaining -= sh.chosen_above;
  }
  const uint32_t T = prefix, need_eq = remaining;
  // Output scan in position order: before position j, gt_before keys > T and eq_before keys
  // == T were seen, so j's slot is gt_before + min(eq_before, need_eq).
  uint32_t gt_run = 0, eq_run = 0;
  for (int64_t c0 = 0; c0 < len; c0 += kThreads * kOutItems) {
    const int64_t first = c0 + static_cast<int64_t>(tid) * kOutItems;
    uint32_t vb[kOutItems];
    bool vok[kOutItems];
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < kOutItems; ++i) {
      vok[i] = first + i < len && r.valid(first + i);
      vb[i] = vok[i] ? r.bits(first + i) : 0u;
      const uint32_t key = order_key(vb[i]);
      gt += vok[i] && key > T;
      eq += vok[i] && key == T;
    }
    uint32_t total;
    const uint32_t before = block_exclusive_scan((gt << 16) | eq, sh, &total);
    uint32_t gt_before = gt_run + (before >> 16), eq_before = eq_run + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kOutItems; ++i) {
      if (!vok[i]) continue;
      const uint32_t key = order_key(vb[i]);
      const bool is_gt = key > T, is_eq = key == T;
      if (is_gt || (is_eq && eq_before < need_eq))
        emit(gt_before + (eq_before < need_eq ? eq_before : need_eq), first + i, vb[i]);
      gt_before += is_gt;
      eq_before += is_eq;
    }
    gt_run += total >> 16;
    eq_run += total & 0xffffu;
  }
}

struct Args {
  const void* logits; int64_t l0;
  I32Vec lengths;
  int64_t width, k;
  int32_t* indices; int64_t i0;
  float* values; int64_t v0;  // nullptr when not requested
  int64_t segs, seg;          // split rows: segs blocks of seg keys per row (cluster: CTAs per row)
  bool prefetch;              // stream rows and segments with bulk L2 prefetch (sm_90)
  bool sample_floor;          // cluster kernel: first pass above a sampled floor
  bool short_list;            // cluster kernel: a bin of <= 32 keys is settled from a list, not another pass
  float* ws_val;              // [M, segs, k] per-segment winners (split rows only)
  int32_t* ws_idx;
};

__device__ __forceinline__ int64_t row_length(const Args& a, int64_t row) {
  const int64_t len = a.lengths[row];
  return len < 0 ? 0 : (len > a.width ? a.width : len);  // device lengths cannot be validated
}

template <class T>
__device__ __forceinline__ float load_f32(const T* x, int64_t j) { return __uint_as_float(f32_bits(x[j])); }

// Rows of <= k keys: every key, then -1 (values -inf).
template <class T>
__device__ void identity_row(const Args& a, int64_t row, int64_t len) {
  const T* x = static_cast<const T*>(a.logits) + row * a.l0;
  int32_t* idx = a.indices + row * a.i0;
  float* val = a.values ? a.values + row * a.v0 : nullptr;
  for (int64_t j = threadIdx.x; j < a.k; j += kThreads) {
    idx[j] = j < len ? static_cast<int32_t>(j) : -1;
    if (val) val[j] = j < len ? load_f32(x, j) : -CUDART_INF_F;
  }
}

// One block per row (rows of at most kMaxRun keys).
template <class T>
__global__ void __launch_bounds__(kThreads, 2) topk_rows_kernel(Args a) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const int64_t len = row_length(a, row);
  if (len <= a.k) {
    identity_row<T>(a, row, len);
    return;
  }
  int32_t* idx = a.indices + row * a.i0;
  float* val = a.values ? a.values + row * a.v0 : nullptr;
  Run<T, false> r{static_cast<const T*>(a.logits) + row * a.l0, len};
  block_topk(r, static_cast<uint32_t>(a.k), reinterpret_cast<uint8_t*>(dyn_smem), sh,
             [&](uint32_t slot, int64_t pos, uint32_t b) {
               idx[slot] = static_cast<int32_t>(pos);
               if (val) val[slot] = __uint_as_float(b);
             }, a.prefetch);
}

// Split rows, step 1: block (row, s) writes the top-k of keys [s * seg, (s + 1) * seg) of the
// row, as (value, row position), to the row's slot list s (all of them when it holds <= k).
// Rows of L > k only (the caller returns or writes the identity for the others).
template <class T>
__device__ __forceinline__ void segment_winners(const Args& a, int64_t row, int64_t s, int64_t L, uint8_t* smem,
                                                Shared& sh) {
  int64_t n = L - s * a.seg;
  n = n < 0 ? 0 : (n > a.seg ? a.seg : n);
  const T* x = static_cast<const T*>(a.logits) + row * a.l0 + s * a.seg;
  float* wv = a.ws_val + (row * a.segs + s) * a.k;
  int32_t* wi = a.ws_idx + (row * a.segs + s) * a.k;
  const int64_t base = s * a.seg;
  if (n <= a.k) {
    for (int64_t j = threadIdx.x; j < n; j += kThreads) {
      wv[j] = load_f32(x, j);
      wi[j] = static_cast<int32_t>(base + j);
    }
    return;
  }
  Run<T, false> r{x, n};
  block_topk(r, static_cast<uint32_t>(a.k), smem, sh, [&](uint32_t slot, int64_t pos, uint32_t b) {
    wv[slot] = __uint_as_float(b);
    wi[slot] = static_cast<int32_t>(base + pos);
  }, a.prefetch);
}

// Split rows, step 2: the top-k of the row's segs * k slot lists (in ascending position order
// list by list, so slot order is position order and the tie rule carries over). Rows of L > k.
// kL2: the lists were written by other blocks of the same launch, so they are read through L2.
template <bool kL2>
__device__ __forceinline__ void merge_row(const Args& a, int64_t row, int64_t L, uint8_t* smem, Shared& sh) {
  int32_t* idx = a.indices + row * a.i0;
  float* val = a.values ? a.values + row * a.v0 : nullptr;
  const int32_t* wi = a.ws_idx + row * a.segs * a.k;
  Run<float, true, kL2> r{a.ws_val + row * a.segs * a.k, a.segs * a.k, a.k, a.seg, L};
  block_topk(r, static_cast<uint32_t>(a.k), smem, sh, [&](uint32_t slot, int64_t pos, uint32_t b) {
    idx[slot] = kL2 ? __ldcg(wi + pos) : wi[pos];
    if (val) val[slot] = __uint_as_float(b);
  });
}

template <class T>
__global__ void __launch_bounds__(kThreads, 2) topk_segments_kernel(Args a) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ Shared sh;
  const int64_t row = blockIdx.x / a.segs, s = blockIdx.x % a.segs;
  const int64_t L = row_length(a, row);
  if (L <= a.k) return;  // the merge writes the identity
  segment_winners<T>(a, row, s, L, reinterpret_cast<uint8_t*>(dyn_smem), sh);
}

template <class T>
__global__ void __launch_bounds__(kThreads, 2) topk_merge_kernel(Args a) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const int64_t L = row_length(a, row);
  if (L <= a.k) {
    identity_row<T>(a, row, L);
    return;
  }
  merge_row<false>(a, row, L, reinterpret_cast<uint8_t*>(dyn_smem), sh);
}

// Split rows in one launch (DSA_CUDA_TOPK=fused_split): block (row, s) writes its segment's
// winners as topk_segments_kernel does, then counts itself done on the row's counter
// (zeroed by the launcher before the launch); the row's last block to finish merges the row's
// slot lists as topk_merge_kernel does. Saves the second launch, and each row merges as soon
// as its own segments are done instead of after the slowest segment of the grid.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) topk_fused_split_kernel(Args a, unsigned* row_done) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ Shared sh;
  __shared__ int last;
  const int64_t row = blockIdx.x / a.segs, s = blockIdx.x % a.segs;
  const int64_t L = row_length(a, row);
  if (L <= a.k) {  // block-uniform: no block of this row counts, segment 0 writes the identity
    if (s == 0) identity_row<T>(a, row, L);
    return;
  }
  segment_winners<T>(a, row, s, L, reinterpret_cast<uint8_t*>(dyn_smem), sh);
  // Every thread's slot writes are made device-visible before the block counts itself done.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&row_done[row], 1u) == static_cast<unsigned>(a.segs - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();  // order the counter read before the slot reads (which go to L2: Run kL2)
  merge_row<true>(a, row, L, reinterpret_cast<uint8_t*>(dyn_smem), sh);
}

}  // namespace topk_radix
}  // namespace gpu
}  // namespace dsa
