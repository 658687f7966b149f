// Hopper (sm_90a) attention kernel of the MHA-form prefill (SPEC §5b).
//
// Block: one head h of one sequence, 128 query rows (two consumer warpgroups of 64 rows) and
// one producer warpgroup: 384 threads; setmaxnreg gives the consumers 240 registers (O of
// 64 x 256 f32 is 128 per thread) and the producer 24.
//  * producer (warpgroup 2, one lane): streams key tiles of 64 keys through a kStages-deep ring of
//    shared-memory stages with TMA: K_nope (qk_nope/64 boxes) and V (v/64 boxes) from the
//    decompressed kv buffer [rows][H][qk_nope + v] (3-D map: dims {qk_nope + v, H, rows}) and
//    k_pe (one box) from the gathered latent rows [rows][576] (2-D map, columns 512..575).
//    Stage s is refilled after all 8 consumer warps arrived on empty[s]; the copy engine
//    completes full[s] (expect_tx of the stage's bytes).
//  * consumers: Q (bf16, 128-byte swizzle, written by the warpgroup itself), then per tile
//    S = Q·Kᵀ (wgmma m64n64k16, both operands in shared memory, K-major), scale and causal
//    mask in registers, online softmax (log2 domain, f32, row max across the 4 lanes of a row),
//    P to bf16 A fragments in registers, O += P·V (wgmma m64n{v}k16, V MN-major).
// Causal block skipping: a block loads only tiles below its last row's horizon
// (prefix + last row + 1 keys), a warpgroup computes only tiles below its own, and only tiles
// that cross a row's diagonal are masked. Keys past the context are never selected by the
// mask; the rows after a sequence in the workspace are the next sequence's (finite) keys, the
// rows past the group are outside the tensor map (TMA zero-fill), and in strided groups the
// gather zero-fills each sequence's padding rows, so 0 · NaN cannot arise in P·V.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "cuda/hopper/hopper.cuh"
#include "cuda/mha_prefill_kernels.cuh"
#include "dsa/status.h"

namespace dsa {
namespace gpu {
namespace mha {

template <int kNope, int kV>
struct HopCfg {
  static constexpr int kQk = kNope + kRopeElems;
  static constexpr int kQkBlocks = kQk / 64;   // 128-byte K blocks of q/k
  static constexpr int kVBlocks = kV / 64;
  static constexpr int kStages = (kQk + kV) <= 320 ? 3 : 2;
  static constexpr int kTileBytes = 64 * 128;  // 64 rows x 128 B
  static constexpr int kQBytes = kHopRows * kQk * 2;
  static constexpr int kKBytes = kQkBlocks * kTileBytes;
  static constexpr int kVBytes = kVBlocks * kTileBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kSmemQ = 0;
  static constexpr int kSmemStages = kSmemQ + kQBytes;
  static constexpr int kSmemBars = kSmemStages + kStages * kStageBytes;
  static constexpr int kSmemBytes = kSmemBars + 2 * kStages * 8 + 1024;  // + alignment slack
  static_assert(kQk % 64 == 0 && kV % 64 == 0, "64-wide blocks");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

template <int kNope, int kV>
__global__ void __launch_bounds__(kHopThreads, 1)
    mha_attn_hopper_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap pe_map,
                           const Problem p) {
#if DSA_HOPPER_DEVICE
  using C = HopCfg<kNope, kV>;
  namespace hp = hopper;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kSmemBars);
  uint64_t* empty = full + C::kStages;

  const int h = blockIdx.y;
  const Seq sq = load_seq(p, blockIdx.z);  // every thread (block reduction)
  const int nqb = (sq.q_len + kHopRows - 1) / kHopRows;
  const int qb = nqb - 1 - static_cast<int>(blockIdx.x);  // heaviest blocks first
  if (!sq.rows_ok || qb < 0) return;
  const int r0 = qb * kHopRows;
  if (!sq.ok) {
    poison_rows(p, sq, h, r0, kHopRows);
    return;
  }
  const int rows = min(kHopRows, sq.q_len - r0);
  const int prefix = sq.kv_len - sq.q_len;
  const int n_keys = prefix + r0 + rows;  // <= kv_len
  const int n_tiles = (n_keys + kHopKeys - 1) / kHopKeys;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      hp::mbar_init(&full[s], 1);
      hp::mbar_init(&empty[s], 4 * kHopConsumers);
    }
    hp::mbar_init_fence();
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp >= 4 * kHopConsumers) {
    // ---- producer ----
    hp::regs_decrease<kHopProducerRegs>();
    if (warp == 4 * kHopConsumers && lane == 0) {
      hp::prefetch_tensor_map(&kv_map);
      hp::prefetch_tensor_map(&pe_map);
      const int row0 = static_cast<int>(sq.ctx0);
      for (int t = 0; t < n_tiles; ++t) {
        const int s = t % C::kStages;
        const uint32_t phase = static_cast<uint32_t>(t / C::kStages) & 1u;
        hp::mbar_wait(&empty[s], phase ^ 1u);  // a fresh barrier passes the "previous" phase
        uint8_t* kst = smem + C::kSmemStages + s * C::kStageBytes;
        uint8_t* vst = kst + C::kKBytes;
        hp::mbar_arrive_expect_tx(&full[s], C::kStageBytes);
        const int key_row = row0 + t * kHopKeys;
#pragma unroll
        for (int kb = 0; kb < kNope / 64; ++kb) hp::tma_load_3d(kst + kb * C::kTileBytes, &kv_map, 64 * kb, h, key_row, &full[s]);
        hp::tma_load_2d(kst + (kNope / 64) * C::kTileBytes, &pe_map, 512, key_row, &full[s]);
#pragma unroll
        for (int vb = 0; vb < C::kVBlocks; ++vb)
          hp::tma_load_3d(vst + vb * C::kTileBytes, &kv_map, kNope + 64 * vb, h, key_row, &full[s]);
      }
    }
    return;
  }

  // ---- consumers ----
  hp::regs_increase<kHopConsumerRegs>();
  const int wg = warp >> 2, wwarp = warp & 3;  // warpgroup, warp within it
  const int wg_row0 = r0 + kHopRowsPerWg * wg;  // first row (sequence-local) of this warpgroup
  uint8_t* qs = smem + C::kSmemQ + wg * (kHopRowsPerWg * C::kQk * 2);
  {
    // Q rows of this warpgroup into the K-major 128-byte-swizzled layout: block kb of 64
    // columns is 64 rows x 128 B; 16-byte chunk c of row r lives at chunk c ^ (r % 8).
    constexpr int kChunks = C::kQk / 8;
    for (int i = threadIdx.x - 128 * wg; i < kHopRowsPerWg * kChunks; i += 128) {
      const int r = i / kChunks, c = i % kChunks;
      uint4 x = make_uint4(0, 0, 0, 0);
      const int row = wg_row0 + r;
      if (row < sq.q_len) {
        const int64_t t = sq.q0 + row;
        const uint16_t* src = c * 8 < kNope ? p.q_nope + t * p.qn_s0 + static_cast<int64_t>(h) * p.qn_s1 + c * 8
                                            : p.q_pe + t * p.qp_s0 + static_cast<int64_t>(h) * p.qp_s1 + (c * 8 - kNope);
        x = *reinterpret_cast<const uint4*>(src);
      }
      const int kb = c / 8, cc = c % 8;
      *reinterpret_cast<uint4*>(qs + kb * C::kTileBytes + r * 128 + ((cc ^ (r & 7)) * 16)) = x;
    }
    hp::fence_async_smem();
    named_barrier(1 + wg, 128);
  }

  // This warpgroup's rows see keys < prefix + row + 1: tiles below its last row's horizon.
  const int wg_rows = min(kHopRowsPerWg, rows - kHopRowsPerWg * wg);  // may be <= 0
  const int wg_keys = wg_rows > 0 ? prefix + wg_row0 + wg_rows : 0;
  const int wg_tiles = (wg_keys + kHopKeys - 1) / kHopKeys;
  const int row_lo = wg_row0 + 16 * wwarp + (lane >> 2);  // sequence-local rows of this thread
  const int row_hi = row_lo + 8;

  float o[kV / 2];
#pragma unroll
  for (int i = 0; i < kV / 2; ++i) o[i] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  const float scale = p.scale_log2;

  for (int t = 0; t < n_tiles; ++t) {
    const int s = t % C::kStages;
    const uint32_t phase = static_cast<uint32_t>(t / C::kStages) & 1u;
    hp::mbar_wait(&full[s], phase);
    if (t < wg_tiles) {
      const uint8_t* kst = smem + C::kSmemStages + s * C::kStageBytes;
      const uint8_t* vst = kst + C::kKBytes;
      float sc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) sc[i] = 0.f;
      hp::wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < C::kQkBlocks; ++kb) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          const uint64_t da = hp::desc_advance(hp::smem_desc(qs + kb * C::kTileBytes, hp::Swizzle::k128B, 16, 1024), ks * 32);
          const uint64_t db = hp::desc_advance(hp::smem_desc(kst + kb * C::kTileBytes, hp::Swizzle::k128B, 16, 1024), ks * 32);
          hp::wgmma_bf16_ss<64, 0, 0>(sc, da, db, (kb | ks) != 0 ? 1 : 0);
        }
      }
      hp::wgmma_commit();
      hp::wgmma_wait<0>();
      hp::fence_regs(sc);

      // Scale, mask (only tiles crossing this warpgroup's first row's diagonal), row maxima.
      const int k0 = t * kHopKeys;
      const bool diag = k0 + kHopKeys - 1 > prefix + wg_row0;
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int key = k0 + hp::acc_col(i, lane);
        const bool hi = (i >> 1) & 1;
        float x = sc[i] * scale;
        if (diag && key > prefix + (hi ? row_hi : row_lo)) x = -INFINITY;
        sc[i] = x;
        if (hi) mx_hi = fmaxf(mx_hi, x);
        else mx_lo = fmaxf(mx_lo, x);
      }
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
      // Tile 0 holds key 0, which every row sees: m is finite from the first tile on, and a
      // later tile entirely past a row's keys gives mx = -inf, m_new = m, alpha = 1, p = 0.
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      const float a_lo = exp2f(m_lo - mn_lo), a_hi = exp2f(m_hi - mn_hi);
      m_lo = mn_lo;
      m_hi = mn_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const bool hi = (i >> 1) & 1;
        const float e = exp2f(sc[i] - (hi ? mn_hi : mn_lo));
        sc[i] = e;
        if (hi) sum_hi += e;
        else sum_lo += e;
      }
      l_lo = l_lo * a_lo + sum_lo;
      l_hi = l_hi * a_hi + sum_hi;
#pragma unroll
      for (int i = 0; i < kV / 2; ++i) o[i] *= ((i >> 1) & 1) ? a_hi : a_lo;

      // P (bf16) as the A operand: k-step ks covers keys 16 ks .. +16; register j holds
      // accumulator elements 8 ks + 4 (j / 2) + 2 (j % 2) + {0, 1}.
      uint32_t pa[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i0 = 8 * ks + 4 * (j >> 1) + 2 * (j & 1);
          pa[ks][j] = pack_bf16(sc[i0], sc[i0 + 1]);
        }
      hp::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint64_t db = hp::desc_advance(hp::smem_desc(vst, hp::Swizzle::k128B, C::kTileBytes, 1024), ks * 16 * 128);
        hp::wgmma_bf16_rs<kV, 1>(o, pa[ks], db, 1);
      }
      hp::wgmma_commit();
      hp::wgmma_wait<0>();
      hp::fence_regs(o);
    }
    // This warp no longer reads stage s.
    __syncwarp();
    if (lane == 0) hp::mbar_arrive(&empty[s]);
  }

  if (wg_rows <= 0) return;
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half ? row_hi : row_lo;
    if (row >= sq.q_len || row < wg_row0 || row >= wg_row0 + wg_rows) continue;
    const int64_t t = sq.q0 + row;
    float lse;
    const float f = finish_factor(p, h, half ? m_hi : m_lo, half ? l_hi : l_lo, &lse);
    const int64_t base = t * p.out_s0 + static_cast<int64_t>(h) * p.out_s1;
#pragma unroll
    for (int i = 0; i < kV / 2; i += 4) {
      // Elements i + 2 half, i + 2 half + 1: columns c, c + 1 of this row.
      const int e = i + 2 * half;
      const int col = hp::acc_col(e, lane);
      if (p.out_bf16) {
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out) + base + col) = pack_bf16(o[e] * f, o[e + 1] * f);
      } else {
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + base + col) = make_float2(o[e] * f, o[e + 1] * f);
      }
    }
    if ((lane & 3) == 0) p.lse[t * p.lse_s0 + static_cast<int64_t>(h) * p.lse_s1] = lse;
  }
#else
  (void)kv_map;
  (void)pe_map;
  (void)p;
  __trap();
#endif
}

// Tensor maps over this group's workspace buffers and the launch. kUnsupported when the
// driver cannot encode the maps (the launcher then runs the portable kernel).
template <int kNope, int kV>
StatusCode launch_hopper(const Problem& pr, int64_t max_q, cudaStream_t stream) {
  using C = HopCfg<kNope, kV>;
  CUtensorMap kv_map, pe_map;
  const uint64_t row_elems = static_cast<uint64_t>(pr.H) * (kNope + kV);
  const uint64_t dims[3] = {static_cast<uint64_t>(kNope + kV), static_cast<uint64_t>(pr.H),
                            static_cast<uint64_t>(pr.capacity)};
  const uint64_t strides[2] = {static_cast<uint64_t>(kNope + kV) * 2, row_elems * 2};
  const uint32_t box[3] = {64, 1, kHopKeys};
  if (hopper::make_tensor_map(&kv_map, pr.kv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, dims, strides, box,
                              CU_TENSOR_MAP_SWIZZLE_128B) != StatusCode::kOk)
    return StatusCode::kUnsupported;
  if (hopper::make_tensor_map_2d(&pe_map, pr.latent, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRowElems,
                                 static_cast<uint64_t>(pr.capacity), kRowElems * 2, 64, kHopKeys,
                                 CU_TENSOR_MAP_SWIZZLE_128B) != StatusCode::kOk)
    return StatusCode::kUnsupported;
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return StatusCode::kDeviceError;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (!(bit && (done.load(std::memory_order_acquire) & bit))) {
    if (cudaFuncSetAttribute(mha_attn_hopper_kernel<kNope, kV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             C::kSmemBytes) != cudaSuccess) {
      cudaGetLastError();
      return StatusCode::kDeviceError;
    }
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(max_q, kHopRows)), static_cast<unsigned>(pr.H),
                  static_cast<unsigned>(pr.nb));
  mha_attn_hopper_kernel<kNope, kV><<<grid, kHopThreads, C::kSmemBytes, stream>>>(kv_map, pe_map, pr);
  return last_launch_status();
}

}  // namespace mha
}  // namespace gpu
}  // namespace dsa
