// Kernel bodies of top-k selection and index mapping (SPEC §3.5-3.6).
//
// Top-k: one block per row. Floats map to order-preserving u32 keys (NaN lowest, -0 == +0).
// A radix select finds the exact k-th key T and how many keys equal to T must be taken:
//   pass 1 (row, 16-byte loads): histogram of the top 12 key bits;
//   pass 2 (row, read backwards so its start hits what pass 1 left in L2): the keys in the
//     chosen 12-bit bucket go to a shared-memory candidate list (their count is known from
//     pass 1, so the list never overflows: a bucket larger than kCandCap, e.g. many equal
//     values, skips the list and the last two passes read the row instead);
//   passes 3-4: 10-bit histograms over the candidates.
// A final pass in index order (one block scan per chunk) writes the keys > T and the
// lowest-index keys == T in ascending index order. The row is read 3 times (5 with the
// overflow fallback). Deterministic, no workspace, any width and alignment.
#pragma once
#include <math_constants.h>

#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace topk_detail {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTopBits = 12, kTopBins = 1 << kTopBits;  // first digit, 4 bins per thread
constexpr int kLowBits = 10, kLowBins = 1 << kLowBits;  // two more digits: 12 + 10 + 10 = 32
constexpr int kCandCap = 7168;  // shared candidate keys (static shared memory stays < 48 KiB)
constexpr int kVecUnroll = 2;   // float4 loads in flight per thread in the row passes
constexpr int kItems = 4;       // output pass: one float4 per thread (8 would spill at 32 registers)
static_assert(kTopBins % kThreads == 0 && kLowBins == kThreads, "bin/thread layout");

// Order-preserving: a > b (as numbers) iff key(a) > key(b); equal numbers have equal keys;
// every NaN is 0, below -inf (0x007fffff).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  if (u == 0x80000000u) u = 0u;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over the block (kThreads threads, all must call); *total gets the sum.
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_sums, uint32_t* total) {
  const int lane = threadIdx.x % kWarp, wid = threadIdx.x / kWarp;
  uint32_t x = v;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == kWarp - 1) warp_sums[wid] = x;
  __syncthreads();
  if (wid == 0) {
    uint32_t s = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  const uint32_t before = (wid > 0 ? warp_sums[wid - 1] : 0u) + x - v;
  *total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is reused by the next scan
  return before;
}

// Warp-converged: lanes with the same digit add once (logits often share their top bits).
__device__ __forceinline__ void hist_add(uint32_t* hist, bool counted, uint32_t digit) {
  const uint32_t peers = __match_any_sync(0xffffffffu, counted ? digit : 0xffffffffu);
  if (counted && (threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
}

// Calls f(value, valid) for every element of x[0:len] (order unspecified), the same number
// of times in every thread, so warps are converged at each call. The aligned body uses
// float4 loads (chunks in reverse order when `backwards`); up to 3 head and 3 tail elements
// (or the whole row if x is not even 4-byte aligned) are read one by one.
template <class F>
__device__ __forceinline__ void visit_row(const float* x, int64_t len, bool backwards, F&& f) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(x);
  int64_t head = (addr & 3u) ? len : static_cast<int64_t>(((16u - (addr & 15u)) & 15u) >> 2);
  head = head < len ? head : len;
  const int64_t nvec = (len - head) >> 2, tail0 = head + nvec * 4;
  const float4* xv = reinterpret_cast<const float4*>(x + head);
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * kVecUnroll;
  const int64_t steps = (nvec + kStep - 1) / kStep;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t base = (backwards ? steps - 1 - s : s) * kStep + threadIdx.x;
    float4 v[kVecUnroll];
    bool ok[kVecUnroll];
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u) {
      ok[u] = base + u * kThreads < nvec;
      v[u] = ok[u] ? xv[base + u * kThreads] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u) {
      f(v[u].x, ok[u]);
      f(v[u].y, ok[u]);
      f(v[u].z, ok[u]);
      f(v[u].w, ok[u]);
    }
  }
  const int64_t edges = head + (len - tail0);
  for (int64_t e0 = 0; e0 < edges; e0 += kThreads) {
    const int64_t e = e0 + threadIdx.x;
    const bool ok = e < edges;
    const int64_t j = e < head ? e : tail0 + (e - head);
    f(ok ? x[j] : 0.f, ok);
  }
}

struct Chosen {
  uint32_t digit, above, count;
};

// hist holds kPer * kThreads bins. Counting from the highest bin down, picks the bin where the
// running count first reaches `remaining` (1 <= remaining <= sum of the bins): its digit, the
// count above it and its own count. All threads must call; the result is in *out on return.
template <int kPer>
__device__ __forceinline__ void choose_digit(const uint32_t* hist, uint32_t remaining, uint32_t* warp_sums, Chosen* out) {
  const int top = kPer * kThreads - 1 - static_cast<int>(threadIdx.x) * kPer;
  uint32_t cnt = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) cnt += hist[top - i];
  uint32_t total;
  const uint32_t above = block_exclusive_scan(cnt, warp_sums, &total);
  if (above < remaining && above + cnt >= remaining) {
    uint32_t run = above;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const uint32_t c = hist[top - i];
      if (run + c >= remaining) {
        *out = Chosen{static_cast<uint32_t>(top - i), run, c};
        break;
      }
      run += c;
    }
  }
  __syncthreads();
}

struct TopkArgs {
  const float* logits; int64_t l0;
  I32Vec lengths;
  int64_t width, k;
  int32_t* indices; int64_t i0;
  float* values; int64_t v0;  // nullptr when not requested
};

// Two blocks per SM (32 registers, no spills): one block's loads overlap the other's scans.
__global__ void __launch_bounds__(kThreads, 2) topk_row_kernel(TopkArgs a) {
  __shared__ uint32_t hist[kTopBins];  // the 10-bit passes use the first kLowBins
  __shared__ uint32_t cand[kCandCap];
  __shared__ uint32_t warp_sums[kWarps];
  __shared__ Chosen chosen;
  __shared__ uint32_t cand_n;

  const int tid = threadIdx.x;
  const int lane = tid % kWarp;
  const int64_t row = blockIdx.x;
  const float* x = a.logits + row * a.l0;
  int32_t* idx_out = a.indices + row * a.i0;
  float* val_out = a.values ? a.values + row * a.v0 : nullptr;
  int64_t len = a.lengths[row];
  len = len < 0 ? 0 : (len > a.width ? a.width : len);  // device lengths cannot be validated

  if (len <= a.k) {  // every key is selected
    for (int64_t j = tid; j < a.k; j += kThreads) {
      idx_out[j] = j < len ? static_cast<int32_t>(j) : -1;
      if (val_out) val_out[j] = j < len ? x[j] : -CUDART_INF_F;
    }
    return;
  }

  // Pass 1: top 12 bits.
  for (int b = tid; b < kTopBins; b += kThreads) hist[b] = 0;
  if (tid == 0) cand_n = 0;
  __syncthreads();
  visit_row(x, len, false, [&](float f, bool ok) { hist_add(hist, ok, order_key(f) >> (32 - kTopBits)); });
  __syncthreads();
  choose_digit<kTopBins / kThreads>(hist, static_cast<uint32_t>(a.k), warp_sums, &chosen);
  uint32_t prefix = chosen.digit << (32 - kTopBits);
  uint32_t mask = ~0u << (32 - kTopBits);
  uint32_t remaining = static_cast<uint32_t>(a.k) - chosen.above;  // keys still to take at the prefix
  const uint32_t bucket = chosen.count;
  const bool use_cand = bucket <= static_cast<uint32_t>(kCandCap);

  // Pass 2: gather the bucket's keys (warp-aggregated appends).
  if (use_cand) {
    visit_row(x, len, true, [&](float f, bool ok) {
      const uint32_t key = order_key(f);
      const bool take = ok && (key & mask) == prefix;
      const uint32_t ballot = __ballot_sync(0xffffffffu, take);
      if (ballot == 0u) return;
      uint32_t base = 0;
      if (lane == 0) base = atomicAdd(&cand_n, __popc(ballot));
      base = __shfl_sync(0xffffffffu, base, 0);
      const uint32_t pos = base + __popc(ballot & ((1u << lane) - 1u));
      if (take && pos < static_cast<uint32_t>(kCandCap)) cand[pos] = key;
    });
  }

  // Passes 3-4: the low 20 bits, 10 at a time, over the candidates (or the row).
  for (int shift = 32 - kTopBits - kLowBits; shift >= 0; shift -= kLowBits) {
    for (int b = tid; b < kLowBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    const auto count = [&](uint32_t key, bool ok) {
      hist_add(hist, ok && (key & mask) == prefix, (key >> shift) & (kLowBins - 1u));
    };
    if (use_cand) {
      for (uint32_t j0 = 0; j0 < bucket; j0 += kThreads) {  // block-uniform trip count
        const uint32_t j = j0 + tid;
        count(j < bucket ? cand[j] : 0u, j < bucket);
      }
    } else {
      visit_row(x, len, shift != 0, [&](float f, bool ok) { count(order_key(f), ok); });
    }
    __syncthreads();
    choose_digit<1>(hist, remaining, warp_sums, &chosen);
    prefix |= chosen.digit << shift;
    mask |= (kLowBins - 1u) << shift;
    remaining -= chosen.above;
  }
  const uint32_t threshold = prefix;
  const uint32_t need_eq = remaining;  // keys == threshold to take, lowest index first

  // Output pass in index order, chunks of kThreads * kItems (thread t holds kItems consecutive
  // elements of a chunk). Before element j, gt_before keys > T and eq_before keys == T were
  // seen; the lowest-index ties are taken, so j's output slot is
  // gt_before + min(eq_before, need_eq). One block scan of packed (gt, eq) counts per chunk.
  const bool aligned16 = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  uint32_t gt_run = 0, eq_run = 0;  // block-uniform totals of the previous chunks
  for (int64_t c0 = 0; c0 < len; c0 += kThreads * kItems) {
    const int64_t first = c0 + static_cast<int64_t>(tid) * kItems;
    float vals[kItems];
    if (aligned16 && first + kItems <= len) {
#pragma unroll
      for (int q = 0; q < kItems / 4; ++q) {
        const float4 v = reinterpret_cast<const float4*>(x + first)[q];
        vals[4 * q] = v.x;
        vals[4 * q + 1] = v.y;
        vals[4 * q + 2] = v.z;
        vals[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) vals[i] = first + i < len ? x[first + i] : 0.f;
    }
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const uint32_t key = order_key(vals[i]);
      gt += first + i < len && key > threshold;
      eq += first + i < len && key == threshold;
    }
    uint32_t total;
    const uint32_t before = block_exclusive_scan((gt << 16) | eq, warp_sums, &total);
    uint32_t gt_before = gt_run + (before >> 16), eq_before = eq_run + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (first + i >= len) break;
      const uint32_t key = order_key(vals[i]);
      const bool is_gt = key > threshold, is_eq = key == threshold;
      if (is_gt || (is_eq && eq_before < need_eq)) {
        const uint32_t pos = gt_before + (eq_before < need_eq ? eq_before : need_eq);
        idx_out[pos] = static_cast<int32_t>(first + i);
        if (val_out) val_out[pos] = vals[i];
      }
      gt_before += is_gt;
      eq_before += is_eq;
    }
    gt_run += total >> 16;
    eq_run += total & 0xffffu;
  }
}

struct MapArgs {
  const int32_t* in; int64_t in0;
  int32_t* out; int64_t out0;
  int64_t rows, k;
  I32Vec row_seq; bool has_row_seq; int64_t rows_per_seq;
  bool paged;
  I32Vec kv_start; int64_t num_seqs;
  I32Mat block_table; int64_t page_size;
};

// Elementwise; out may alias in (each element is read, then written, by one thread).
__global__ void map_indices_kernel(MapArgs a) {
  const int64_t n = a.rows * a.k;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t i = e / a.k, c = e % a.k;
    const int64_t j = a.in[i * a.in0 + c];
    const int64_t b = a.has_row_seq ? static_cast<int64_t>(a.row_seq[i]) : i / a.rows_per_seq;
    int64_t addr = -1;
    if (j >= 0 && b >= 0 && b < a.num_seqs) {
      if (!a.paged) {
        addr = static_cast<int64_t>(a.kv_start[b]) + j;
      } else {
        const int64_t col = j / a.page_size;
        if (col < a.block_table.cols) {
          const int64_t blk = a.block_table.at(b, col);
          if (blk >= 0) addr = blk * a.page_size + j % a.page_size;
        }
      }
      if (addr < 0 || addr > 0x7fffffffLL) addr = -1;  // not representable: invalid
    }
    a.out[i * a.out0 + c] = static_cast<int32_t>(addr);
  }
}

}  // namespace topk_detail
}  // namespace gpu
}  // namespace dsa
