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

// kPipe: the pipelined consumer loop (S of the next tile issued before this tile's softmax),
// which holds two stages per warpgroup at a time and so takes as many stages as fit (<= 4).
template <int kNope, int kV, bool kPipe = false>
struct HopCfg {
  static constexpr int kQk = kNope + kRopeElems;
  static constexpr int kQkBlocks = kQk / 64;   // 128-byte K blocks of q/k
  static constexpr int kVBlocks = kV / 64;
  static constexpr int kTileBytes = 64 * 128;  // 64 rows x 128 B
  static constexpr int kQBytes = kHopRows * kQk * 2;
  static constexpr int kKBytes = kQkBlocks * kTileBytes;
  static constexpr int kVBytes = kVBlocks * kTileBytes;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kFitStages = (kHopSmemLimit - kQBytes - 2048) / kStageBytes;
  static constexpr int kStages = kPipe ? (kFitStages < 4 ? kFitStages : 4) : ((kQk + kV) <= 320 ? 3 : 2);
  static constexpr int kSmemQ = 0;
  static constexpr int kSmemStages = kSmemQ + kQBytes;
  static constexpr int kSmemBars = kSmemStages + kStages * kStageBytes;
  static constexpr int kSmemBytes = kSmemBars + 2 * kStages * 8 + 1024;  // + alignment slack
  static_assert(kQk % 64 == 0 && kV % 64 == 0, "64-wide blocks");
  static_assert(kStages >= 2, "two stages at least");
  static_assert(kSmemBytes <= kHopSmemLimit, "shared memory");
};

__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.sync / bar.arrive (arrive: the other side of a bar.sync of the same count, no wait) when
// on: predicated rather than branched, so no branch lands inside a wgmma pipeline stage.
__device__ __forceinline__ void named_sync_if(bool on, int id, int threads) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p bar.sync %1, %2;\n}\n" ::"r"(static_cast<uint32_t>(on)),
      "r"(id), "r"(threads)
      : "memory");
}

__device__ __forceinline__ void named_arrive_if(bool on, int id, int threads) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p bar.arrive %1, %2;\n}\n" ::"r"(static_cast<uint32_t>(on)),
      "r"(id), "r"(threads)
      : "memory");
}

// Named barriers of the ping-pong schedule: warpgroup w waits on kPingBar + w for its turn.
constexpr int kPingBar = 3;  // 1, 2: the warpgroups' Q barriers

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

// S = Q·Kᵀ of one 64-key tile into sc: issued and committed, not waited (the caller fences).
template <int kQkBlocks>
__device__ __forceinline__ void issue_scores(float (&sc)[32], const uint8_t* qs, const uint8_t* kst) {
  namespace hp = hopper;
#pragma unroll
  for (int kb = 0; kb < kQkBlocks; ++kb) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint64_t da = hp::desc_advance(hp::smem_desc(qs + kb * 8192, hp::Swizzle::k128B, 16, 1024), ks * 32);
      const uint64_t db = hp::desc_advance(hp::smem_desc(kst + kb * 8192, hp::Swizzle::k128B, 16, 1024), ks * 32);
      hp::wgmma_bf16_ss<64, 0, 0>(sc, da, db, (kb | ks) != 0 ? 1 : 0);
    }
  }
  hp::wgmma_commit();
}

// O += P·V of one tile (P as bf16 A fragments): issued and committed, not waited.
template <int kV>
__device__ __forceinline__ void issue_pv(float (&o)[kV / 2], const uint32_t (&pa)[4][4], const uint8_t* vst) {
  namespace hp = hopper;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t db = hp::desc_advance(hp::smem_desc(vst, hp::Swizzle::k128B, 8192, 1024), ks * 16 * 128);
    hp::wgmma_bf16_rs<kV, 1>(o, pa[ks], db, 1);
  }
  hp::wgmma_commit();
}

// Online softmax state of a thread's two rows (lo: row_lo, hi: row_lo + 8).
struct SoftmaxRows {
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
};

// One tile's scores (sc, complete) to P: scale, mask (only tiles crossing the warpgroup's
// first row's diagonal), row maxima across the 4 lanes of a row, exponentials, row sums; P to
// bf16 A fragments in pa; a_lo / a_hi the factors that rescale O to the new maxima.
__device__ __forceinline__ void softmax_tile(float (&sc)[32], uint32_t (&pa)[4][4], SoftmaxRows& st, float& a_lo,
                                             float& a_hi, int k0, int prefix, int wg_row0, int row_lo, int row_hi,
                                             float scale, int lane) {
  namespace hp = hopper;
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
  const float mn_lo = fmaxf(st.m_lo, mx_lo), mn_hi = fmaxf(st.m_hi, mx_hi);
  a_lo = exp2f(st.m_lo - mn_lo);
  a_hi = exp2f(st.m_hi - mn_hi);
  st.m_lo = mn_lo;
  st.m_hi = mn_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const bool hi = (i >> 1) & 1;
    const float e = exp2f(sc[i] - (hi ? mn_hi : mn_lo));
    sc[i] = e;
    if (hi) sum_hi += e;
    else sum_lo += e;
  }
  st.l_lo = st.l_lo * a_lo + sum_lo;
  st.l_hi = st.l_hi * a_hi + sum_hi;
  // k-step ks covers keys 16 ks .. +16; register j holds accumulator elements
  // 8 ks + 4 (j / 2) + 2 (j % 2) + {0, 1}.
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i0 = 8 * ks + 4 * (j >> 1) + 2 * (j & 1);
      pa[ks][j] = pack_bf16(sc[i0], sc[i0 + 1]);
    }
}

template <int R>
__device__ __forceinline__ void rescale_o(float (&o)[R], float a_lo, float a_hi) {
#pragma unroll
  for (int i = 0; i < R; ++i) o[i] *= ((i >> 1) & 1) ? a_hi : a_lo;
}

// kPing (on top of kPipe): the two consumer warpgroups take turns issuing their GEMMs (named
// barriers), so one warpgroup's softmax runs while the other's GEMMs hold the tensor cores;
// and a 1-D grid whose launch order is heaviest query block first across all heads and
// sequences (block i: head i % H, sequence (i / H) % nb, block rank from the end i / (H nb)).
template <int kNope, int kV, bool kPipe, bool kPing = false>
__global__ void __launch_bounds__(kHopThreads, 1)
    mha_attn_hopper_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap pe_map,
                           const Problem p) {
#if DSA_HOPPER_DEVICE
  using C = HopCfg<kNope, kV, kPipe>;  // kPing uses the pipelined loop's stages
  namespace hp = hopper;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = hopper::smem_aligned<1024>(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kSmemBars);
  uint64_t* empty = full + C::kStages;

  static_assert(!kPing || (kPipe && kHopConsumers == 2), "ping-pong: pipelined loop, two warpgroups");
  int h, seq, rank;
  if constexpr (kPing) {
    const int i = static_cast<int>(blockIdx.x);
    h = i % p.H;
    seq = (i / p.H) % p.nb;
    rank = i / (p.H * p.nb);
  } else {
    h = blockIdx.y;
    seq = blockIdx.z;
    rank = blockIdx.x;
  }
  const Seq sq = load_seq(p, seq);  // every thread (block reduction)
  const int nqb = (sq.q_len + kHopRows - 1) / kHopRows;
  const int qb = nqb - 1 - rank;  // heaviest blocks first
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
  SoftmaxRows st;
  const float scale = p.scale_log2;
  auto kstage = [&](int t) -> const uint8_t* { return smem + C::kSmemStages + (t % C::kStages) * C::kStageBytes; };
  auto wait_full = [&](int t) { hp::mbar_wait(&full[t % C::kStages], static_cast<uint32_t>(t / C::kStages) & 1u); };
  auto release = [&](int t) {  // this warp no longer reads tile t's stage
    __syncwarp();
    if (lane == 0) hp::mbar_arrive(&empty[t % C::kStages]);
  };
  const int my_tiles = min(wg_tiles, n_tiles);

  // Ping-pong turns. A warpgroup's GEMM issues (pipelined loop: S(0), one per step, the last
  // P·V: my_tiles + 1 of them) are turns; both warpgroups take the same number E of turns (the
  // one with fewer tiles takes empty ones at the end), so every bar.sync of warpgroup w on
  // kPingBar + w (128 threads) meets exactly one bar.arrive of the other (128): warpgroup 1
  // arrives once before warpgroup 0's first turn and after each of its turns but the last,
  // warpgroup 0 after each of its turns. Strict alternation, none left pending at exit.
  // Only in blocks where both warpgroups have rows: then their tile counts differ by at most
  // one (64 rows = 64 keys), warpgroup 0's trailing stage (released below without a turn) and
  // its one empty turn come after its real turns, and every full[] wait is met by releases of
  // tiles two turns back (kStages >= 2). With warpgroup 1 idle (rows <= 64) it would release
  // all stages in its trailing loop before any turn, while warpgroup 0 waits on its turns for
  // those stages: a deadlock, so such blocks (a sequence's last) run the plain pipelined loop.
  const bool ping = kPing && rows > kHopRowsPerWg;
  auto tiles_of = [&](int w) {
    const int wr = min(kHopRowsPerWg, rows - kHopRowsPerWg * w);
    const int keys = wr > 0 ? prefix + r0 + kHopRowsPerWg * w + wr : 0;
    return min((keys + kHopKeys - 1) / kHopKeys, n_tiles);
  };
  const int e0 = tiles_of(0) > 0 ? tiles_of(0) + 1 : 0, e1 = tiles_of(1) > 0 ? tiles_of(1) + 1 : 0;
  const int n_turns = max(e0, e1);
  int turn = 0;
  auto take_turn = [&]() {
    if constexpr (kPing) named_sync_if(ping, kPingBar + wg, 256);
  };
  auto pass_turn = [&]() {
    if constexpr (kPing) {
      named_arrive_if(ping && (wg == 0 || turn < n_turns - 1), kPingBar + (wg ^ 1), 256);
      ++turn;
    }
  };
  if constexpr (kPing) {
    named_arrive_if(ping && wg == 1, kPingBar, 256);
  }

  if constexpr (!kPipe) {
    // Serial: S(t), softmax(t), P·V(t), each waited before the next.
    for (int t = 0; t < n_tiles; ++t) {
      wait_full(t);
      if (t < my_tiles) {
        float sc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) sc[i] = 0.f;
        hp::wgmma_fence();
        issue_scores<C::kQkBlocks>(sc, qs, kstage(t));
        hp::wgmma_wait<0>();
        hp::fence_regs(sc);
        uint32_t pa[4][4];
        float a_lo, a_hi;
        softmax_tile(sc, pa, st, a_lo, a_hi, t * kHopKeys, prefix, wg_row0, row_lo, row_hi, scale, lane);
        rescale_o(o, a_lo, a_hi);
        hp::wgmma_fence();
        issue_pv<kV>(o, pa, kstage(t) + C::kKBytes);
        hp::wgmma_wait<0>();
        hp::fence_regs(o);
      }
      release(t);
    }
  } else {
    // Pipelined: while P·V(t) runs on the tensor cores, S(t+1) (issued just before it) is
    // waited and softmax(t+1) computed; O is rescaled to tile t+1's maxima once P·V(t) is done
    // (O then holds Σ_{<=t} P·V relative to m(t+1), as the serial loop has it). A warpgroup
    // holds tiles t and t+1 at once; stages are released in tile order, as in the serial loop.
    if (my_tiles > 0) {
      float sc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) sc[i] = 0.f;
      uint32_t pa[4][4];
      {
        wait_full(0);
        take_turn();
        hp::wgmma_fence();
        issue_scores<C::kQkBlocks>(sc, qs, kstage(0));
        pass_turn();
        hp::wgmma_wait<0>();
        hp::fence_regs(sc);
        float a_lo, a_hi;  // O is zero: nothing to rescale
        softmax_tile(sc, pa, st, a_lo, a_hi, 0, prefix, wg_row0, row_lo, row_hi, scale, lane);
      }
      // Every register a wgmma of the next pipeline stage reads (O, P, S) is finished before
      // its wgmma.fence (fence_regs pins the rescale above it), and P alternates between two
      // register sets instead of being copied: a copy lands between the stage's wgmmas and
      // ptxas serializes the pipeline (C7513). ptxas 13: no C7513, 0 spills. Opt-in for now
      // (DSA_MHA_KERNEL=wgmma_pipe) until the H200 has checked it.
      auto pin = [&]() {
        hp::fence_regs(o);
        hp::fence_regs(sc);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) hp::fence_regs(pa[ks]);
      };
      uint32_t pb[4][4];
      // One step: P(t) in cur, P(t+1) into nxt (no register copy: the two alternate).
      auto step = [&](int t, uint32_t (&cur)[4][4], uint32_t (&nxt)[4][4]) {
        wait_full(t + 1);
        hp::fence_regs(o);
        hp::fence_regs(sc);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) hp::fence_regs(cur[ks]);
        take_turn();
        hp::wgmma_fence();
        issue_scores<C::kQkBlocks>(sc, qs, kstage(t + 1));
        issue_pv<kV>(o, cur, kstage(t) + C::kKBytes);
        pass_turn();
        hp::wgmma_wait<1>();  // S(t+1) complete; P·V(t) may still run
        hp::fence_regs(sc);
        float a_lo, a_hi;
        softmax_tile(sc, nxt, st, a_lo, a_hi, (t + 1) * kHopKeys, prefix, wg_row0, row_lo, row_hi, scale, lane);
        hp::wgmma_wait<0>();
        hp::fence_regs(o);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) hp::fence_regs(cur[ks]);  // cur stayed in place until P·V(t) completed
        rescale_o(o, a_lo, a_hi);
        release(t);
      };
      int t0 = 0;
      for (; t0 + 2 < my_tiles; t0 += 2) {
        step(t0, pa, pb);
        step(t0 + 1, pb, pa);
      }
      if (t0 + 1 < my_tiles) {
        step(t0, pa, pb);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
          for (int j = 0; j < 4; ++j) pa[ks][j] = pb[ks][j];
      }
      const int t = my_tiles - 1;
      pin();
      take_turn();
      hp::wgmma_fence();
      issue_pv<kV>(o, pa, kstage(t) + C::kKBytes);
      pass_turn();
      hp::wgmma_wait<0>();
      hp::fence_regs(o);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) hp::fence_regs(pa[ks]);
      release(t);
    }
    for (int t = max(my_tiles, 0); t < n_tiles; ++t) {  // tiles past this warpgroup's horizon
      wait_full(t);
      release(t);
    }
    if (ping) {
      while (turn < n_turns) {  // empty turns keep the alternation in step (see above)
        take_turn();
        pass_turn();
      }
    }
  }

  if (wg_rows <= 0) return;
  float l_lo = st.l_lo, l_hi = st.l_hi;
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
    const float f = finish_factor(p, h, half ? st.m_hi : st.m_lo, half ? l_hi : l_lo, &lse);
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
template <int kNope, int kV, bool kPipe, bool kPing = false>
StatusCode launch_hopper(const Problem& pr, int64_t max_q, cudaStream_t stream) {
  using C = HopCfg<kNope, kV, kPipe>;
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
    if (cudaFuncSetAttribute(mha_attn_hopper_kernel<kNope, kV, kPipe, kPing>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             C::kSmemBytes) != cudaSuccess) {
      cudaGetLastError();
      return StatusCode::kDeviceError;
    }
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int64_t qbs = ceil_div(max_q, kHopRows);
  dim3 grid(static_cast<unsigned>(qbs), static_cast<unsigned>(pr.H), static_cast<unsigned>(pr.nb));
  if (kPing) {
    const int64_t blocks = qbs * pr.H * pr.nb;
    if (blocks > 0x7fffffff) return StatusCode::kUnsupported;
    grid = dim3(static_cast<unsigned>(blocks), 1, 1);
  }
  mha_attn_hopper_kernel<kNope, kV, kPipe, kPing><<<grid, kHopThreads, C::kSmemBytes, stream>>>(kv_map, pe_map, pr);
  return last_launch_status();
}

}  // namespace mha
}  // namespace gpu
}  // namespace dsa
