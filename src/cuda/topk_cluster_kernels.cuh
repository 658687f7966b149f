// Kernel body of the cluster top-k (SPEC §3.5), sm_90: one thread-block cluster per row.
//
// For few rows of up to 262144 keys (decode; small prefill chunks), where one block per row
// leaves most SMs idle and a split with a merge pays two selection chains one after the other:
//   1. the row is cut into C <= 8 chunks of 512 * m keys (m = 8, 16, 32 or 64 keys a thread,
//      chosen by the launcher), one per CTA of the cluster, read once with 16-byte loads; every
//      key's order-preserving u32 goes to shared memory (4 bytes a key). While
//      loading, each CTA counts a 1-in-16 sample by its top 12 bits and takes its maximum;
//   2. one cluster barrier; every CTA reads the C sample histograms and maxima through
//      distributed shared memory and finds the same floor: the 12-bit bin of the sample
//      above which about 2k + 512 of the row's keys lie. The first pass counts the keys
//      between the floor and the row's maximum in 4096 bins spread over exactly that range,
//      so a row whose keys crowd a few values still spreads over many bins (shared atomics
//      serialise on one address). Each later pass counts the keys of the chosen bin in 4096
//      bins of its range, until the bin is one key value (at most three passes over shared
//      memory; two for most rows). One cluster barrier per pass: histograms alternate between
//      two buffers, so none is cleared while another CTA may still read it. When fewer than k
//      keys reach the floor (a sample unlike its row) the first pass is counted again from key
//      0 (counted in g_topk_fallbacks). The result is a key range [T_lo, T_hi] holding the
//      k-th key and the number of its keys to take, the lowest positions first: T_lo == T_hi,
//      or every key of the range is taken, or (the short list, the usual end of a row of
//      distinct values) the range is a chosen bin of at most kList keys, settled in step 3
//      instead of by one more pass (DSA_CUDA_TOPK_LIST=off counts it; g_topk_short_lists);
//   3. every thread ranks the m consecutive positions it owns (bit masks of the keys above
//      and inside the range), a block scan and the totals of the cluster's lower CTAs
//      (exchanged in shared memory with a last barrier) give each thread its first output
//      slot, and it writes its selected positions in order (values re-read from the row: the
//      order key loses -0 and NaN payloads). With a short list, every CTA also writes its
//      keys of the range into every CTA's list before that barrier; after it one warp ranks
//      the at most kList entries (larger key first, then lower position) and the first
//      `need` of that order are taken.
// No workspace and no candidate buffer that can overflow (the short list is taken only for a
// bin the histograms show to hold at most kList keys): every input takes an exact path, and the
// answer is a function of the input only, so reruns are bit-identical.
#pragma once
#include <type_traits>

#include "cuda/hopper/hopper.cuh"
#include "cuda/topk_radix_kernels.cuh"

namespace dsa {
namespace gpu {
namespace topk_cluster {

namespace radix = topk_radix;

// Chunk sizes are counted in keys a thread of a 512-thread CTA, m = 8, 16, 32 or 64 (chunk
// 512 m). Three forms (kernel template <T, kThr, kMaxPer>: block size, keys a thread at most):
//  <512, 32>: m <= 32, two CTAs an SM, 64 registers;
//  <512, 64>: m = 64 (one CTA an SM: its keys take 128 KiB), up to 128 registers, every 16-byte
//             load of the chunk in flight at once (round 5's default; DSA_CUDA_TOPK_WIDE=512);
//  <1024, 32>: the same chunk as 1024 threads of 32 keys, twice the warps to hide each phase's
//             latencies at 64 registers a thread (the default for m = 64 since round 6:
//             21.2 us against 24.7 us at 64 rows of 65536 on the H200, docs/perf.md).
constexpr int kThreads = 512;
constexpr int kMaxKeys = 64;  // m: shared memory holds 4 bytes a key
constexpr int kWideThreads = 1024;
constexpr int kMaxCtas = 8;   // portable cluster size
constexpr int64_t kMaxWidth = static_cast<int64_t>(kThreads) * kMaxKeys * kMaxCtas;  // 262144
constexpr int kBits = 12, kBins = 1 << kBits;
constexpr int kSampleEvery = 16;  // chunk positions p with p % 16 == 0
constexpr int kList = 32;         // a chosen bin of at most this many keys is settled from a list
static_assert(kThreads == radix::kThreads, "identity_row strides by the streaming kernels' block size");

// Dynamic shared memory for a chunk of 512 m keys; the block size of that chunk (wide1024:
// the 1024-thread form of m = 64).
__host__ __device__ constexpr int keys_bytes(int m) { return kThreads * m * 4; }
__host__ __device__ constexpr int block_threads(int m, bool wide1024) { return m == kMaxKeys && wide1024 ? kWideThreads : kThreads; }

struct Shared {
  uint32_t hist[2][kBins];        // u32 bins: the address is the bin (packed halves cost 7 more instructions a count)
  uint32_t totals[kMaxCtas][2];   // (keys above the range, keys in it) of CTA r's chunk, written by CTA r
  radix::Shared scan;             // the streaming kernels' block scan (32 warp sums: either block size)
  uint32_t digit, above, count;   // cluster_choose's answer
  uint32_t cta_max;               // this chunk's largest key
  // The short list: CTA r's keys of the last bin (order key, row position), in position order,
  // written by CTA r into every CTA's copy; bit e of list_taken: the cluster's e-th entry is taken.
  uint32_t list_key[kMaxCtas][kList];
  int32_t list_pos[kMaxCtas][kList];
  uint32_t list_taken;
};

// Order-preserving key of f32 bits: 2^31 +- |x| (so -0 == +0), every NaN 0 (below -inf's
// 2^23). Six integer instructions; the streaming kernels' order_key differs from it for
// negative values, but each kernel only compares its own keys.
__device__ __forceinline__ uint32_t key_of(uint32_t u) {
  const uint32_t mag = u & 0x7fffffffu;
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  const uint32_t key = 0x80000000u + (mag ^ neg) - neg;
  return mag > 0x7f800000u ? 0u : key;
}

// The smallest shift s with span >> s < kBins.
__device__ __forceinline__ uint32_t shift_for(uint32_t span) {
  return span < static_cast<uint32_t>(kBins) ? 0u : static_cast<uint32_t>(32 - __clz(span)) - kBits;
}

// Bit counts and the lowest set bit of a position mask (32 or 64 positions).
__device__ __forceinline__ uint32_t popc(uint32_t v) { return static_cast<uint32_t>(__popc(v)); }
__device__ __forceinline__ uint32_t popc(uint64_t v) { return static_cast<uint32_t>(__popcll(static_cast<unsigned long long>(v))); }
__device__ __forceinline__ int lowest_bit(uint32_t v) { return __ffs(static_cast<int>(v)) - 1; }
__device__ __forceinline__ int lowest_bit(uint64_t v) { return __ffsll(static_cast<long long>(v)) - 1; }

// Where quad Q of the chunk (positions 4Q..4Q+3) lives in shared memory. Thread t owns quads
// [t * tq, t * tq + tq) (tq = m / 4 = 1 << lt) for the ranking; its quad q sits at slot
// (q + t) mod tq of its range, so the 8 threads of a shared-memory phase that read their quad q
// at once hit 8 different 16-byte bank groups (tq >= 8; 2-way conflicts below), and the loads
// of consecutive quads store without conflicts too.
__device__ __forceinline__ int quad_slot(int Q, int lt) {
  const int mask = (1 << lt) - 1;
  return (Q & ~mask) | ((Q + (Q >> lt)) & mask);
}

// The cluster's choice of a bin over every CTA's copy of a histogram. Thread t owns the
// kBins / kThr (8 or 4) consecutive bins from the top down: it sums them over the C copies
// (16-byte remote reads) into registers, the block scan of the owners' sums finds the owner of
// the bin where the running count from the top first reaches `rank`, and the owner walks its
// own bins (one round of remote reads in all). Every thread gets the bin (if 1 <= rank <=
// total; else the answer is unspecified), the count above it, its own count, and the total.
// Reads remote shared memory: the caller's cluster barrier comes first.
template <int kThr>
__device__ __forceinline__ void cluster_choose(const uint32_t* hist, uint32_t C, uint32_t rank, Shared& sh,
                                               uint32_t* digit, uint32_t* above_out, uint32_t* count_out,
                                               uint32_t* total_out) {
  constexpr int kPer = kBins / kThr;
  static_assert(kPer % 4 == 0, "whole 16-byte words of bins per thread");
  const int tid = threadIdx.x;
  const uint32_t top = static_cast<uint32_t>(kBins - 1 - kPer * tid);
  const uint4* mine = reinterpret_cast<const uint4*>(hist + (top + 1 - kPer));
  uint32_t bin[kPer] = {};  // bin[i]: bin top + 1 - kPer + i
  for (uint32_t r = 0; r < C; ++r) {
    const uint4* src = hopper::cluster_peer(mine, r);
#pragma unroll
    for (int w = 0; w < kPer / 4; ++w) {
      const uint4 a = src[w];
      bin[4 * w] += a.x;
      bin[4 * w + 1] += a.y;
      bin[4 * w + 2] += a.z;
      bin[4 * w + 3] += a.w;
    }
  }
  uint32_t sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) sum += bin[i];
  uint32_t all;
  const uint32_t above = radix::block_exclusive_scan<kThr>(sum, sh.scan, &all);
  if (above < rank && above + sum >= rank) {  // one thread: walk its bins from the top
    uint32_t run = above;
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i) {
      if (run + bin[i] >= rank) {
        sh.digit = top + 1 - kPer + static_cast<uint32_t>(i);
        sh.above = run;
        sh.count = bin[i];
        break;
      }
      run += bin[i];
    }
  }
  __syncthreads();
  *digit = sh.digit;
  *above_out = sh.above;
  *count_out = sh.count;
  *total_out = all;
}

// Counts the keys k of the CTA's chunk with k - lo <= span (unsigned: keys below lo wrap past
// it) into bin (k - lo) >> s. Reads shared memory in slot order: counts only. A warp skips the
// increments of a quad none of its lanes has in range (every later pass, whose range is one
// bin of the one before, and a floor pass's keys below the floor: the branches around the
// predicated increments cost as much as the increments).
template <int kThr>
__device__ __forceinline__ void count_range(const uint4* keys, int quads, uint32_t lo, uint32_t span, uint32_t s,
                                            uint32_t* hist) {
  constexpr int kAhead = 4;  // quads read before their increments
  // quads is a multiple of kThr: whether quad b + j * kThr + tid exists is the same for every
  // thread, so the warp stays converged for the vote.
  for (int b = 0; b < quads; b += kAhead * kThr) {
    uint4 v[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j)
      if (b + j * kThr < quads) v[j] = keys[b + j * kThr + threadIdx.x];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (b + j * kThr >= quads) break;
      const uint32_t d[4] = {v[j].x - lo, v[j].y - lo, v[j].z - lo, v[j].w - lo};
      const bool any = d[0] <= span || d[1] <= span || d[2] <= span || d[3] <= span;
      if (__any_sync(0xffffffffu, any)) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (d[e] <= span) atomicAdd(&hist[d[e] >> s], 1u);
      }
    }
  }
}

// Launch: grid M * C blocks of kThr threads in clusters of C (a.segs = C, a.seg = 512 * m, the
// chunk, m a power of two in [8, kMaxKeys]; chunk / kThr <= kMaxPer keys a thread, the forms
// above); dynamic shared memory keys_bytes(m). Row r is cluster r. Rows of L <= k get the
// identity from the cluster's first CTA.
template <class T, int kThr, int kMaxPer>
__global__ void __launch_bounds__(kThr, kThr == kThreads && kMaxPer <= 32 ? 2 : 1) topk_cluster_kernel(radix::Args a) {
  static_assert(kMaxPer == 32 || (kMaxPer == 64 && kThr == kThreads), "the three forms");
  using Mask = typename std::conditional<kMaxPer == 64, uint64_t, uint32_t>::type;  // a bit per position owned
#if __CUDA_ARCH__ >= 900
  __shared__ __align__(16) Shared sh;
  extern __shared__ uint4 key_quads[];  // the chunk's keys, 4 a quad, quad Q at quad_slot(Q)
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // keys per 16-byte load
  constexpr bool kF32 = sizeof(T) == 4;
  const uint32_t C = static_cast<uint32_t>(a.segs), c = hopper::cluster_rank();
  const int chunk = static_cast<int>(a.seg), m = chunk / kThr, quads = chunk / 4;
  const int tq = m / 4, lt = __ffs(tq) - 1;
  const int tid = threadIdx.x, lane = tid % kWarp;
  const int64_t row = blockIdx.x / C;
  const int L = static_cast<int>(radix::row_length(a, row));  // <= kMaxWidth
  const T* x = static_cast<const T*>(a.logits) + row * a.l0;
  int32_t* idx = a.indices + row * a.i0;
  float* val = a.values ? a.values + row * a.v0 : nullptr;
  if (L <= a.k) {  // the same for every CTA of the cluster: none of them reaches a barrier
    if (c == 0 && tid < radix::kThreads) radix::identity_row<T>(a, row, L);
    return;
  }
  const uint32_t k = static_cast<uint32_t>(a.k);
  const int first = static_cast<int>(c) * chunk;  // the chunk's first row position

  // 1. Load. Keys at or past L get key 0 (NaN's): with L > k they are never selected (a key 0
  // ranks below every key of the row and past every position of it), so no count needs a
  // validity test. The histograms are cleared before the first sample is counted (after the
  // first batch of loads is issued, so the clear and its barrier overlap their latency).
  const auto clear = [&]() {
    uint4* h = reinterpret_cast<uint4*>(&sh.hist[0][0]);  // 2 x 4096 words: 2048 uint4
#pragma unroll
    for (int i = 0; i < 2048 / kThr; ++i) h[tid + i * kThr] = make_uint4(0u, 0u, 0u, 0u);
    if (tid == 0) sh.cta_max = 0u;
    __syncthreads();
  };
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const bool whole = aligned && first + chunk <= L;  // the same for every thread of the CTA
  uint32_t mx = 0;
  // Stores the keys of load v (positions first + kPer v ...): the maximum, the sample, the quads.
  const auto put = [&](int v, const uint32_t (&key)[kPer]) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) mx = key[e] > mx ? key[e] : mx;
    if (a.sample_floor && (v * kPer) % kSampleEvery == 0) atomicAdd(&sh.hist[0][key[0] >> (32 - kBits)], 1u);
#pragma unroll
    for (int h = 0; h < kPer / 4; ++h)
      key_quads[quad_slot(v * (kPer / 4) + h, lt)] = make_uint4(key[4 * h], key[4 * h + 1], key[4 * h + 2], key[4 * h + 3]);
  };
  constexpr int kBatch = kMaxPer / 4;  // 16-byte loads in flight a thread: all of an f32 chunk's
  const int loads = chunk / kPer;
  if (whole) {
    // What the first batch does not cover is asked of the copy engine into L2 now, so the
    // later batches find it there. As launched one batch holds the thread's loads, so this
    // never fires; without it ptxas allocates differently (12 bytes of spills at 64 registers,
    // 119 registers for <512, 64>, against 0 and 104), so it stays until that form is measured.
    const int batch_keys = kBatch * kThr * kPer;
    if (tid == 0 && chunk > batch_keys) hopper::prefetch_l2_bulk(x + first + batch_keys, (chunk - batch_keys) * sizeof(T));
    for (int v0 = 0; v0 < loads; v0 += kBatch * kThr) {
      uint4 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int v = v0 + u * kThr + tid;
        if (v < loads) raw[u] = *reinterpret_cast<const uint4*>(x + first + v * kPer);
      }
      if (v0 == 0) clear();
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int v = v0 + u * kThr + tid;
        if (v >= loads) break;
        const uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
        uint32_t key[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) key[e] = key_of(kF32 ? w[e] : ((e & 1) ? (w[e / 2] & 0xffff0000u) : (w[e / 2] << 16)));
        put(v, key);
      }
    }
  } else {  // the row's last chunk, chunks past it, unaligned rows: one key at a time
    clear();
    for (int v = tid; v < loads; v += kThr) {
      const int p = first + v * kPer;
      uint32_t key[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) key[e] = p + e < L ? key_of(radix::f32_bits(x[p + e])) : 0u;
      put(v, key);
    }
  }
  mx = __reduce_max_sync(0xffffffffu, mx);
  if (lane == 0) atomicMax(&sh.cta_max, mx);

  // 2. The floor and the first range: [floor, the row's largest key], or every key.
  uint32_t lo = 0, span = 0xffffffffu, s = 32 - kBits;
  uint32_t digit, above, count, total;
  int buf = 1;
  if (a.sample_floor) {  // the same in every CTA of the launch
    hopper::cluster_sync();
    uint32_t row_max = 0;
    for (uint32_t r = 0; r < C; ++r) {
      const uint32_t v = *hopper::cluster_peer(&sh.cta_max, r);
      row_max = v > row_max ? v : row_max;
    }
    // 1 in 16 positions was sampled: rank (2k + 512) / 16 of the sample (the margin keeps the
    // sample's error, about sqrt(rank), from missing k, for small k too).
    const uint32_t rank = (2u * k + 512u + kSampleEvery - 1u) / kSampleEvery;
    cluster_choose<kThr>(sh.hist[0], C, rank, sh, &digit, &above, &count, &total);
    if (rank <= total) lo = digit << (32 - kBits);
    span = row_max - lo;  // row_max >= lo: the floor's bin holds sampled keys
    s = shift_for(span);
  } else {
    __syncthreads();  // the keys are stored
  }

  // 3. Passes: count the range, choose a bin, narrow the range to it.
  uint32_t need = k, T_lo = 0, T_hi = 0;
  bool listed = false;  // the same in every CTA of the cluster (every choice is)
  for (;;) {
    count_range<kThr>(key_quads, quads, lo, span, s, sh.hist[buf]);
    hopper::cluster_sync();
    // The other buffer was last read before this barrier: clear it for the next pass (the
    // choice's block barriers order the clear before any count).
#pragma unroll
    for (int i = 0; i < 1024 / kThr; ++i)
      reinterpret_cast<uint4*>(sh.hist[buf ^ 1])[tid + i * kThr] = make_uint4(0u, 0u, 0u, 0u);
    cluster_choose<kThr>(sh.hist[buf], C, need, sh, &digit, &above, &count, &total);
    buf ^= 1;
    if (total < need) {
      // Fewer than k keys reached the floor (only the first pass can miss; every CTA sees the
      // same sums, so all of them come here): count again from key 0.
      if (c == 0 && tid == 0) atomicAdd(&radix::g_topk_fallbacks, 1ull);
      span += lo;
      lo = 0;
      s = shift_for(span);
      continue;
    }
    need -= above;
    const uint32_t bin_lo = lo + (digit << s);
    const uint32_t rest = lo + span - bin_lo, width = (1u << s) - 1u;  // no u32 overflow
    const uint32_t bin_span = rest < width ? rest : width;
    // One key value, or every key of the bin is taken, or few enough keys for the short list
    // (count > need >= 1 there).
    listed = a.short_list && s != 0 && count != need && count <= static_cast<uint32_t>(kList);
    if (s == 0 || count == need || listed) {
      T_lo = bin_lo;
      T_hi = bin_lo + bin_span;
      break;
    }
    lo = bin_lo;
    span = bin_span;
    s = s > static_cast<uint32_t>(kBits) ? s - kBits : 0u;
  }
  const uint32_t need_eq = need, t_span = T_hi - T_lo;

  // 4. Ranks in position order: thread t owns chunk positions [t * m, t * m + m). Bit i of
  // in (keys above T_hi) and tie (keys in [T_lo, T_hi]) is the thread's i-th position.
  Mask in = 0, tie = 0;
#pragma unroll
  for (int q = 0; q < kMaxPer / 4; ++q) {
    if (q < tq) {
      const uint4 v = key_quads[tid * tq + ((q + tid) & (tq - 1))];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        in |= static_cast<Mask>(w[e] > T_hi) << (q * 4 + e);
        tie |= static_cast<Mask>(w[e] - T_lo <= t_span) << (q * 4 + e);
      }
    }
  }
  const uint32_t n_in = popc(in), n_tie = popc(tie);
  uint32_t cta_total;
  const uint32_t before = radix::block_exclusive_scan<kThr>((n_in << 16) | n_tie, sh.scan, &cta_total);
  const uint32_t tie_local = before & 0xffffu;  // this thread's first key of the range, within the CTA
  if (listed && n_tie != 0) {  // the range's keys into every CTA's list, in position order
    Mask t = tie;
    for (uint32_t j = tie_local; t != 0 && j < static_cast<uint32_t>(kList); ++j) {
      const int i = lowest_bit(t);
      t &= t - 1;
      const uint4 v = key_quads[tid * tq + ((i / 4 + tid) & (tq - 1))];
      const uint32_t key = (i & 2) ? ((i & 1) ? v.w : v.z) : ((i & 1) ? v.y : v.x);  // no local array
      const int32_t p = first + tid * m + i;
      for (uint32_t r = 0; r < C; ++r) {
        *hopper::cluster_peer(&sh.list_key[c][j], r) = key;
        *hopper::cluster_peer(&sh.list_pos[c][j], r) = p;
      }
    }
  }
  if (tid < static_cast<int>(C)) {
    uint32_t* slot = hopper::cluster_peer(&sh.totals[c][0], static_cast<uint32_t>(tid));
    slot[0] = cta_total >> 16;
    slot[1] = cta_total & 0xffffu;
  }
  hopper::cluster_sync();  // the last remote access: after it every CTA may exit
  uint32_t in_before = before >> 16, tie_before = tie_local;
  for (uint32_t r = 0; r < c; ++r) {
    in_before += sh.totals[r][0];
    tie_before += sh.totals[r][1];
  }
  uint32_t slot;
  if (listed) {
    // Entry e of the cluster's list (CTA 0's entries first: position order) is taken when
    // fewer than need_eq entries come before it in (larger key, lower position) order.
    if (tid < kWarp) {
      uint32_t key = 0, n = 0;
      int32_t pos = 0x7fffffff;
      for (uint32_t r = 0; r < C; ++r) {
        const uint32_t nr = sh.totals[r][1];
        if (static_cast<uint32_t>(lane) >= n && static_cast<uint32_t>(lane) < n + nr) {
          key = sh.list_key[r][lane - n];
          pos = sh.list_pos[r][lane - n];
        }
        n += nr;
      }
      uint32_t ahead = 0;
#pragma unroll
      for (int f = 0; f < kList; ++f) {
        const uint32_t kf = __shfl_sync(0xffffffffu, key, f);
        const int32_t pf = __shfl_sync(0xffffffffu, pos, f);
        ahead += static_cast<uint32_t>(static_cast<uint32_t>(f) < n && (kf > key || (kf == key && pf < pos)));
      }
      const uint32_t taken = __ballot_sync(0xffffffffu, static_cast<uint32_t>(lane) < n && ahead < need_eq);
      if (lane == 0) {
        sh.list_taken = taken;
        if (c == 0) atomicAdd(&radix::g_topk_short_lists, 1ull);
      }
    }
    __syncthreads();
    // This thread's range keys are entries tie_before, tie_before + 1, ... of the list.
    const uint64_t taken = sh.list_taken;
    slot = in_before + popc(taken & ((uint64_t{1} << tie_before) - 1u));
    Mask keep = 0, t = tie;
    for (uint32_t e = tie_before; t != 0; ++e) {
      const Mask low = t & (Mask{0} - t);
      if ((taken >> e) & 1u) keep |= low;
      t &= t - 1;
    }
    tie = keep;
  } else {
    // Ties past the row's first need_eq are dropped; the rest keep position order.
    slot = in_before + (tie_before < need_eq ? tie_before : need_eq);
    const uint32_t ties_left = tie_before < need_eq ? need_eq - tie_before : 0u;
    if (ties_left < n_tie) {  // keep the lowest ties_left tie bits
      Mask keep = 0, t = tie;
      for (uint32_t i = 0; i < ties_left; ++i) {
        keep |= t & (Mask{0} - t);  // lowest set bit
        t &= t - 1;
      }
      tie = keep;
    }
  }
  Mask take = in | tie;
  const int p0 = first + tid * m;
  while (take != 0) {
    const int i = lowest_bit(take);
    take &= take - 1;
    const int p = p0 + i;
    idx[slot] = p;
    if (val) val[slot] = radix::load_f32(x, p);
    ++slot;
  }
#else
  (void)a;
  __trap();
#endif
}

}  // namespace topk_cluster
}  // namespace gpu
}  // namespace dsa
