// Kernel bodies of top-k selection and index mapping (SPEC §3.5-3.6).
//
// Top-k: one block per row. Floats map to order-preserving u32 keys (NaN lowest, -0 == +0);
// four 8-bit radix passes over the row (warp-aggregated shared-memory histograms) find the
// exact k-th key T and how many keys equal to T must be taken; a final pass in index order
// (one block scan per chunk) writes the keys > T and the lowest-index keys == T in ascending
// index order. Deterministic, no
// workspace, any width. A tuned multi-block or cached-pass kernel can replace topk_row_kernel
// behind the same launcher.
#pragma once
#include <math_constants.h>

#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace topk_detail {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarp;
constexpr int kBins = 256;
constexpr int kItems = 4;  // output pass: consecutive elements per thread (chunk counts < 2^16)

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

struct TopkArgs {
  const float* logits; int64_t l0;
  I32Vec lengths;
  int64_t width, k;
  int32_t* indices; int64_t i0;
  float* values; int64_t v0;  // nullptr when not requested
};

__global__ void __launch_bounds__(kThreads) topk_row_kernel(TopkArgs a) {
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t warp_sums[kWarps];
  __shared__ uint32_t chosen_digit, chosen_above;

  const int tid = threadIdx.x;
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

  // Radix select of the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0;
  uint32_t remaining = static_cast<uint32_t>(a.k);  // keys still to take at or below the prefix
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    // Block-uniform trip count, so every warp is converged at the match below. Lanes of a
    // warp with the same digit add once (logits often share their top bits: contention).
    for (int64_t j0 = 0; j0 < len; j0 += kThreads) {
      const int64_t j = j0 + tid;
      uint32_t key = 0;
      bool counted = false;
      if (j < len) {
        key = order_key(x[j]);
        counted = (key & mask) == prefix;
      }
      const uint32_t digit = counted ? (key >> shift) & 0xffu : 0x100u;
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      if (counted && (threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    // Counts from the highest digit down: the chosen digit is where the running count
    // first reaches `remaining`.
    const uint32_t cnt = tid < kBins ? hist[kBins - 1 - tid] : 0u;
    uint32_t total;
    const uint32_t above = block_exclusive_scan(cnt, warp_sums, &total);
    if (tid < kBins && above < remaining && above + cnt >= remaining) {
      chosen_digit = static_cast<uint32_t>(kBins - 1 - tid);
      chosen_above = above;
    }
    __syncthreads();
    prefix |= chosen_digit << shift;
    mask |= 0xffu << shift;
    remaining -= chosen_above;
    __syncthreads();  // chosen_* are rewritten by the next pass
  }
  const uint32_t threshold = prefix;
  const uint32_t need_eq = remaining;  // keys == threshold to take, lowest index first

  // Output pass in index order, chunks of kThreads * kItems (thread t holds kItems consecutive
  // elements of a chunk). Before element j, gt_before keys > T and eq_before keys == T were
  // seen; the lowest-index ties are taken, so j's output slot is
  // gt_before + min(eq_before, need_eq). One block scan of packed (gt, eq) counts per chunk.
  uint32_t gt_run = 0, eq_run = 0;  // block-uniform totals of the previous chunks
  for (int64_t c0 = 0; c0 < len; c0 += kThreads * kItems) {
    const int64_t first = c0 + static_cast<int64_t>(tid) * kItems;
    uint32_t keys[kItems];
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      keys[i] = first + i < len ? order_key(x[first + i]) : 0u;
      gt += first + i < len && keys[i] > threshold;
      eq += first + i < len && keys[i] == threshold;
    }
    uint32_t total;
    const uint32_t before = block_exclusive_scan((gt << 16) | eq, warp_sums, &total);
    uint32_t gt_before = gt_run + (before >> 16), eq_before = eq_run + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (first + i >= len) break;
      const bool is_gt = keys[i] > threshold, is_eq = keys[i] == threshold;
      if (is_gt || (is_eq && eq_before < need_eq)) {
        const uint32_t pos = gt_before + (eq_before < need_eq ? eq_before : need_eq);
        idx_out[pos] = static_cast<int32_t>(first + i);
        if (val_out) val_out[pos] = x[first + i];
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
