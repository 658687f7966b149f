// Host-side launch helpers shared by the flat and paged instantiation files of the Hopper
// logits kernel: work split, grid, shared memory, the -inf fill pass.
#pragma once
#include <cuda.h>

#include <atomic>
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "cuda/indexer_logits_wgmma.cuh"
#include "dsa/indexer.h"

namespace dsa {
namespace gpu {
namespace logits_wg {

// Heads padded to the kernel's head count (16, 32 or 64).
inline int padded_heads(int64_t h) { return h <= 16 ? 16 : h <= 32 ? 32 : 64; }

inline bool q_aligned(const TensorDesc& q) {
  return reinterpret_cast<uintptr_t>(q.data) % 16 == 0 && q.stride[0] % 16 == 0 && q.stride[1] % 16 == 0 && q.stride[2] == 1;
}

inline Args base_args(const TensorDesc& q, const TensorDesc& w, const TensorDesc& out, int64_t col_offset) {
  Args a{};
  a.q = static_cast<const uint8_t*>(q.data);
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.w = static_cast<const float*>(w.data);
  a.w0 = w.stride[0];
  a.w1 = w.stride[1];
  a.out = out.data;
  a.out0 = out.stride[0];
  a.out_bf16 = out.dtype == DType::kBF16;
  a.rows = q.shape[0];
  a.heads = q.shape[1];
  a.width = out.shape[1];
  a.col_offset = col_offset;
  return a;
}

// Splits each row block's key tiles into equal chunks so that the items of the persistent
// grid's CTAs balance: minimises (items per CTA) x (tiles per item + a per-item overhead).
inline void plan_chunks(Args* a, int sms) {
  a->row_blocks = ceil_div(a->rows, a->rows_per_block);
  if (a->tiles <= 0 || a->row_blocks <= 0) {
    a->chunk_tiles = 1;
    a->chunks = 0;
    a->items = 0;
    return;
  }
  constexpr double kItemOverhead = 3.0;  // q restage, pipeline turn, in tiles
  int64_t best = 1;
  double best_cost = -1;
  const int64_t max_c = a->tiles < 4096 ? a->tiles : 4096;
  // The smallest c of least cost over [1, max_c]. Waves never fall as c grows, so among the c
  // that share one tiles-per-chunk value the smallest costs least: only those are visited
  // (about 2 sqrt(tiles) of them instead of every c; the same answer, on every launch).
  for (int64_t c = 1; c <= max_c && a->row_blocks * c <= 0x7fffffffLL;) {  // items fit int32 (rows do)
    const int64_t per = ceil_div(a->tiles, c);
    const int64_t waves = ceil_div(a->row_blocks * c, sms);
    const double cost = static_cast<double>(waves) * (static_cast<double>(per) + kItemOverhead);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = c;
    }
    if (per == 1) break;
    c = ceil_div(a->tiles, per - 1);  // the first c with fewer tiles per chunk
  }
  a->chunk_tiles = ceil_div(a->tiles, best);
  a->chunks = ceil_div(a->tiles, a->chunk_tiles);
  a->items = a->row_blocks * a->chunks;
}

// kCtas > 1: the grid is the CTAs that are resident at once (kCtas per SM where the device
// holds that many, fewer where it does not: same work split, same arithmetic).
// kCons: consumer warpgroups (threads_of).
// kGateGroups, kSplitProducer: A/B hooks of logits_wgmma_kernel.
template <class Keys, int kHeads, int kRows, bool kEpilogue, bool kOverlap = false, int kCtas = 1, int kCons = 2,
          int kGateGroups = 0, bool kSplitProducer = false>
StatusCode launch_kernel(Args a, const Keys& keys, const CUtensorMap& map, const CUtensorMap& smap, cudaStream_t s) {
  auto kern = logits_wgmma_kernel<Keys, kHeads, kRows, kEpilogue, kOverlap, kCtas, kCons, kGateGroups, kSplitProducer>;
  constexpr int kThreadsN = threads_of(kCons);
  constexpr int smem = Smem<kHeads * kRows, kRows, stages_of(kCtas, kCons)>::kAlloc;
  static_assert(kCtas * (smem + 1024) <= 233472, "kCtas CTAs fit one SM's shared memory");
  // The shared-memory opt-in is a property of the function on a device: set once per device
  // for each instantiation (not a stream operation, so capture is unaffected), and with it the
  // CTAs per SM the device then holds.
  static std::atomic<uint64_t> opted_in{0};
  static std::atomic<int> resident{1};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return StatusCode::kDeviceError;
  }
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (!bit || !(opted_in.load(std::memory_order_acquire) & bit)) {
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
      cudaGetLastError();
      return StatusCode::kDeviceError;
    }
    int per_sm = 1;
    if (kCtas > 1) {
      // Two CTAs need the whole unified L1/shared carveout as shared memory.
      if (cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
              cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kThreadsN, smem) != cudaSuccess) {
        cudaGetLastError();
        return StatusCode::kDeviceError;
      }
      per_sm = per_sm < 1 ? 1 : per_sm > kCtas ? kCtas : per_sm;
    }
    resident.store(per_sm, std::memory_order_relaxed);  // one device kind per process in practice
    opted_in.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int slots = current_sm_count() * resident.load(std::memory_order_relaxed);
  plan_chunks(&a, slots);
  if (a.items == 0) {  // no key tile anywhere: only -inf columns (the main kernel fills them otherwise)
    if (!kEpilogue) return StatusCode::kOk;
    logits_fill_invalid_kernel<Keys><<<static_cast<unsigned>(a.rows), 256, 0, s>>>(a, keys);
    return last_launch_status();
  }
  const int64_t grid = a.items < slots ? a.items : slots;
  kern<<<static_cast<unsigned>(grid), kThreadsN, smem, s>>>(a, keys, map, smap);
  return last_launch_status();
}

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
