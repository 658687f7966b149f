// Device-side helpers shared by the CUDA kernels: plain-old-data views of the params (kernels
// take these by value), warp reductions, the guarded token -> slot lookup, the shared-space
// address and the 16-byte cp.async (sm_80 and up).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dsa/cache.h"
#include "dsa/numerics.h"
#include "dsa/types.h"

namespace dsa {
namespace gpu {

constexpr int kWarp = 32;

// Loads element i of a 1-D i32 tensor with its stride.
struct I32Vec {
  const int32_t* p = nullptr;
  int64_t stride = 0;
  __device__ __forceinline__ int32_t operator[](int64_t i) const { return p[i * stride]; }
};
inline I32Vec i32_vec(const TensorDesc& t) {
  return I32Vec{static_cast<const int32_t*>(t.data), t.ndim > 0 ? t.stride[0] : 0};
}
// A vector of i32 or i64 integers (positions: engines hold either), read as i64.
struct IdxVec {
  const void* p = nullptr;
  int64_t stride = 0;
  bool wide = false;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(p)[i * stride] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i * stride]);
  }
};
inline IdxVec idx_vec(const TensorDesc& t) {
  return IdxVec{t.data, t.ndim > 0 ? t.stride[0] : 0, t.dtype == DType::kI64};
}

// A 2-D i32 table (block tables).
struct I32Mat {
  const int32_t* p = nullptr;
  int64_t rows = 0, cols = 0, s0 = 0, s1 = 0;
  __device__ __forceinline__ int32_t at(int64_t r, int64_t c) const { return p[r * s0 + c * s1]; }
};
inline I32Mat i32_mat(const TensorDesc& t) {
  if (t.ndim < 2) return I32Mat{};
  return I32Mat{static_cast<const int32_t*>(t.data), t.shape[0], t.shape[1], t.stride[0], t.stride[1]};
}

// Loads one value of an f32 or bf16 tensor as f32 (the dtype is uniform per launch).
__device__ __forceinline__ float load_f32_or_bf16(const void* base, bool bf16, int64_t offset) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(base)[offset])
              : static_cast<const float*>(base)[offset];
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Token -> cache slot (cache.h CacheSlots), with every data-dependent address guarded:
// a slot outside [0, num_slots), a sequence outside the block table, a negative position, a
// position past the table or a block-table entry outside [0, num_blocks) give -1 (skip).
struct SlotMap {
  const int64_t* slots = nullptr;  // either this ...
  int64_t slots_stride = 0;
  I32Mat block_table;              // ... or these three
  I32Vec token_seq, token_pos;
  int64_t page_size = 1;
  int64_t num_blocks = 0;

  __device__ __forceinline__ int64_t slot(int64_t t) const {
    if (slots != nullptr) {
      const int64_t s = slots[t * slots_stride];
      return (s >= 0 && s < num_blocks * page_size) ? s : -1;
    }
    const int64_t seq = token_seq[t], pos = token_pos[t];
    if (seq < 0 || seq >= block_table.rows || pos < 0) return -1;
    const int64_t col = pos / page_size;
    if (col >= block_table.cols) return -1;
    const int64_t blk = block_table.at(seq, col);
    if (blk < 0 || blk >= num_blocks) return -1;
    return blk * page_size + pos % page_size;
  }
};
inline SlotMap slot_map(const CacheSlots& w, int64_t page_size, int64_t num_blocks) {
  SlotMap m;
  if (w.slots.present()) {
    m.slots = static_cast<const int64_t*>(w.slots.data);
    m.slots_stride = w.slots.stride[0];
  } else {
    m.block_table = i32_mat(w.block_table);
    m.token_seq = i32_vec(w.token_seq);
    m.token_pos = i32_vec(w.token_pos);
  }
  m.page_size = page_size;
  m.num_blocks = num_blocks;
  return m;
}

// The shared-space address of a pointer into shared memory (what cp.async, ldmatrix, mbarrier
// and wgmma descriptors take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared (dst: a shared-space address); src_bytes 0 zero-fills the
// destination without reading. Complete after cp_async_commit and cp_async_wait<N>.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Grid size for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace gpu
}  // namespace dsa
