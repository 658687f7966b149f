// Kernel bodies of the distributed ops (launchers in dist.cu). Simple one-thread-per-entry
// kernels: the work is O(M k R log k), small next to the scoring they follow.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dist_math.h"
#include "core/dist_ops.h"
#include "dsa/numerics.h"

namespace dsa {
namespace distops {
namespace kern {

struct CandidatesView {
  const void* logits;
  bool bf16;
  int64_t ls0;
  const int32_t* lidx;
  int64_t M, k;
  int ranks, rank;
  int64_t interleave;
  float* vals;
  int32_t* pos;
};

__global__ void dist_candidates(CandidatesView v) {
  const int64_t n = v.M * v.k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / v.k;
    const int32_t li = v.lidx[e];
    float val = -INFINITY;
    int32_t g = -1;
    if (li >= 0) {
      const int64_t o = i * v.ls0 + li;
      val = v.bf16 ? bf16_to_float(static_cast<const uint16_t*>(v.logits)[o]) : static_cast<const float*>(v.logits)[o];
      g = static_cast<int32_t>(global_of(li, v.ranks, v.rank, v.interleave));
    }
    v.vals[e] = val;
    v.pos[e] = g;
  }
}

struct MergeView {
  const float* vals;
  const int32_t* pos;  // [R, M, k]: each list ascending, -1 at the end
  int64_t M, k;
  int ranks;
  float* mvals;
  int32_t* mpos;
  int32_t* mlen;
};

// Valid entries of list (r, i): the first -1 (binary search; lists are valid-first).
__device__ __forceinline__ int64_t valid_count(const int32_t* list, int64_t k) {
  int64_t lo = 0, hi = k;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (list[mid] >= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
// Entries of list[0, n) below p.
__device__ __forceinline__ int64_t count_below(const int32_t* list, int64_t n, int32_t p) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (list[mid] < p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// mlen[i] = Σ_r valid_count(r, i), and the tail [mlen, R k) filled with (-inf, -1).
__global__ void dist_merge_len(MergeView v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < v.M; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t n = 0;
    for (int r = 0; r < v.ranks; ++r) n += valid_count(v.pos + (r * v.M + i) * v.k, v.k);
    v.mlen[i] = static_cast<int32_t>(n);
    const int64_t W = v.ranks * v.k;
    for (int64_t j = n; j < W; ++j) {
      v.mvals[i * W + j] = -INFINITY;
      v.mpos[i * W + j] = -1;
    }
  }
}

// Each valid candidate goes to its rank in global-position order: its index in its own list
// plus the entries of the other lists below it (positions are distinct across ranks).
__global__ void dist_merge_scatter(MergeView v) {
  const int64_t n = v.ranks * v.M * v.k;
  const int64_t W = v.ranks * v.k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int32_t p = v.pos[e];
    if (p < 0) continue;
    const int64_t j = e % v.k, ri = e / v.k, i = ri % v.M, r = ri / v.M;
    int64_t slot = j;
    for (int q = 0; q < v.ranks; ++q) {
      if (q == r) continue;
      const int32_t* list = v.pos + (q * v.M + i) * v.k;
      slot += count_below(list, valid_count(list, v.k), p);
    }
    v.mvals[i * W + slot] = v.vals[e];
    v.mpos[i * W + slot] = p;
  }
}

struct FinalView {
  const int32_t* sel;
  const float* mvals;
  const int32_t* mpos;
  int64_t M, k, width;
  int32_t* idx;
  int64_t is0;
  float* val;
  int64_t vs0;
};

__global__ void dist_final(FinalView v) {
  const int64_t n = v.M * v.k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / v.k, j = e % v.k;
    const int32_t s = v.sel[e];
    const bool ok = s >= 0 && s < v.width;
    v.idx[i * v.is0 + j] = ok ? v.mpos[i * v.width + s] : -1;
    if (v.val) v.val[i * v.vs0 + j] = ok ? v.mvals[i * v.width + s] : -INFINITY;
  }
}

struct LocalView {
  const int32_t* in;
  int64_t is0;
  int32_t* out;
  int64_t os0;
  int64_t M, K;
  int ranks, rank;
  int64_t interleave;
};

__global__ void dist_local_indices(LocalView v) {
  const int64_t n = v.M * v.K;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / v.K, j = e % v.K;
    const int32_t g = v.in[i * v.is0 + j];
    v.out[i * v.os0 + j] = (g >= 0 && owner_of(g, v.ranks, v.interleave) == v.rank)
                               ? static_cast<int32_t>(local_of(g, v.ranks, v.interleave))
                               : -1;
  }
}

struct LseMergeView {
  const void* parts;  // [R, T, H, D]
  bool parts_bf16;
  const float* lses;  // [R, T, H]
  int64_t T, H, D;
  int ranks;
  const float* sink;
  int64_t sink_s;
  void* out;
  bool out_bf16;
  int64_t out_s0, out_s1;
  float* lse;
  int64_t lse_s0, lse_s1;
};

// One block per (token, head); thread 0 computes the weights, every thread a slice of D. The
// arithmetic per element is that of the CPU backend (same weights, same fma order).
__global__ void dist_lse_merge(LseMergeView v) {
  const int64_t TH = v.T * v.H;
  const int64_t th = blockIdx.y * int64_t{65535} + blockIdx.x;
  if (th >= TH) return;
  __shared__ float w[kMaxRanks];
  __shared__ float L;
  if (threadIdx.x == 0) L = lse_merge_weights<kMaxRanks>(v.lses + th, TH, v.ranks, w);
  __syncthreads();
  const int64_t t = th / v.H, h = th % v.H;
  float f = 1.f;
  if (v.sink != nullptr && !(L == INFINITY)) f = sink_factor(L, v.sink[h * v.sink_s]);
  if (threadIdx.x == 0 && v.lse != nullptr) v.lse[t * v.lse_s0 + h * v.lse_s1] = L;
  for (int64_t d = threadIdx.x; d < v.D; d += blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < v.ranks; ++r) {
      if (w[r] == 0.f) continue;
      const int64_t src = (r * TH + th) * v.D + d;
      const float x = v.parts_bf16 ? bf16_to_float(static_cast<const uint16_t*>(v.parts)[src])
                                   : static_cast<const float*>(v.parts)[src];
      acc = fmaf(w[r], x, acc);
    }
    acc *= f;
    const int64_t o = t * v.out_s0 + h * v.out_s1 + d;
    if (v.out_bf16) static_cast<uint16_t*>(v.out)[o] = float_to_bf16(acc);
    else static_cast<float*>(v.out)[o] = acc;
  }
}

}  // namespace kern
}  // namespace distops
}  // namespace dsa
