// Hopper (sm_90a) decode attention over paged MLA caches (SPEC §4-5): dense decode over the
// BF16 and FP8 caches and sparse decode over the FP8 cache. Launchers in mla_decode.cu.
//
// Work: a "row block" is 64 query rows that read the same keys, i.e. one wgmma m64 tile.
//   dense:  rows (token j of the sequence, head h) flattened as j * H + h; a block of 64 such
//           rows of one sequence (64 or 128 heads: half or all heads of a token; fewer heads:
//           several tokens, which share the keys up to the causal limit of each row);
//   sparse: 64 heads of one token (H < 64: the tile is padded).
// Every row block has n >= 1 key tiles of 64 keys. The scheduler kernel (on the device, from
// the device lengths: no host round trip, graph-capturable) lays all (row block, tile) pairs
// on a line and gives CTA g the range [sched_pos[g], sched_pos[g+1]); a row block cut by a
// range boundary is computed in pieces whose unnormalised partials (O, m, l) go to slots
// 2g (the first piece of CTA g) or 2g + 1 (its last), merged by decode_combine_kernel.
//
// CTA: 3 warpgroups.
//   WG2 (producer): fills a 2-stage ring of key tiles [64 keys x 576] bf16, 128-byte swizzled
//       (9 blocks of 64 keys x 128 B): BF16 cache by TMA (one thread, 3-D tensor map over
//       (576, page, num_blocks)); FP8 cache by 128 threads that gather 656-byte tokens,
//       dequantise e4m3 x scale to bf16 (exact) and store them, while the consumers multiply
//       the previous stage (tile t+1's tokens hinted into L2 and tile t+2's slots loaded while
//       tile t is dequantised). It also publishes the stage's key-valid mask.
//   WG0: S = Q K^T (m64n64, 36 k-steps), mask, online softmax (log2 units), P -> smem (bf16)
//       and registers, O[:, 0:256] += P V (A from registers).
//   WG1: O[:, 256:512] += P V (A = P from smem) after rescaling by WG0's per-row alpha.
// (The split_s variant, DSA_DECODE_KERNEL=split_s, splits S by keys between WG0 and WG1
// instead: see kSplitS below.)
// Barriers: full[s] (producer -> consumers), empty[s] (256 consumer arrivals), p_full (WG0's
// 128 arrivals: P and alpha written), p_empty (WG1's 128 arrivals: P consumed), f_full (WG0's
// 128 arrivals at the end of a piece: the per-row output factors rowf written). WG1 reads rowf
// after waiting on f_full and the named barrier 2 (both warpgroups, once per piece). The named
// barrier alone orders it (bar.sync orders the memory of its participants), but racecheck
// reported the pair as a RAW hazard (round 1): the mbarrier makes the release/acquire explicit,
// and barrier 2 keeps WG0 from completing phase k+1 before WG1 waited on phase k. Generic-proxy
// writes that wgmma reads (Q, P, the dequantised FP8 tiles, zeroed rows) are followed by
// fence.proxy.async before the barrier that publishes them.
//
// Keys that are not valid (past kv_len, bad block-table entry, invalid index, past
// topk_length) have their scores masked to -inf; their V rows are zero in shared memory
// (TMA zero-fills out-of-range boxes; rows of a loaded page past kv_len are zeroed by WG0;
// the FP8 producer writes zeros), so NaN in unused slots never reaches the output.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/hopper/hopper.cuh"
#include "cuda/mla_decode_config.h"
#include "dsa/numerics.h"

namespace dsa {
namespace gpu {
namespace mla_decode {

enum Kind : int { kDenseBf16 = 0, kDenseFp8 = 1, kSparseFp8 = 2 };

struct DecodeProblem {
  const uint16_t* q = nullptr;  // [T, H, 576] bf16
  int64_t q_s0 = 0, q_s1 = 0;
  bool q_aligned16 = true;
  int32_t T = 0, H = 0;
  // cache
  const uint8_t* cache = nullptr;
  int64_t block_bytes = 0;
  int64_t num_blocks = 0;
  int64_t num_slots = 0;
  int32_t page = 64;
  // dense
  const int32_t* cu_q = nullptr;
  int64_t cu_q_s = 0;
  const int32_t* block_table = nullptr;
  int64_t bt_s0 = 0, bt_s1 = 0;
  int32_t max_blocks = 0;
  const int32_t* kv_lens = nullptr;
  int64_t kv_lens_s = 0;
  // sparse
  const int32_t* indices = nullptr;
  int64_t idx_s0 = 0, idx_s1 = 0;
  int32_t K = 0;
  const int32_t* topk_length = nullptr;
  int64_t tl_s0 = 0;
  // outputs
  const float* sink = nullptr;
  int64_t sink_s = 0;
  float scale_log2 = 0.f;
  void* out = nullptr;
  bool out_bf16 = true;
  bool out_pairs = true;  // element pairs may be stored as one 4- or 8-byte word
  int64_t out_s0 = 0, out_s1 = 0;
  float* lse = nullptr;
  int64_t lse_s0 = 0, lse_s1 = 0;
  // schedule (caller's workspace)
  int32_t G = 1;           // CTAs of the main kernel
  int32_t units = 0;       // dense: sequences B; sparse: tokens T
  int32_t head_blocks = 1; // sparse: ceil(H / 64)
  int32_t max_rb = 0;      // row blocks the workspace holds
  int32_t* meta = nullptr;       // [0] = R (row blocks), [1] = total positions
  int32_t* sched_pos = nullptr;  // [G + 1]
  int32_t* rb_prefix = nullptr;  // [max_rb + 1]
  int32_t* rb_unit = nullptr;    // [max_rb]
  int32_t* rb_local = nullptr;   // [max_rb]
  float2* part_ml = nullptr;     // [2G][64]: (m in log2 units, l)
  float* part_o = nullptr;       // [2G][64][512]
};

constexpr float kLn2 = 0.6931471805599453f;

// ---- what a unit (sequence or token) and its row blocks cover ---------------------------------
struct UnitInfo {
  int32_t q0 = 0, q_len = 0;  // dense: first token, tokens; sparse: the token, 1
  int64_t kv_len = 0;         // dense: raw (clamped >= 0); sparse: candidate count
  int32_t rbs = 0;
};

template <bool kSparse>
__device__ __forceinline__ UnitInfo unit_info(const DecodeProblem& p, int u) {
  UnitInfo ui;
  if (kSparse) {
    int32_t n = p.K;
    if (p.topk_length != nullptr) {
      const int32_t len = p.topk_length[u * p.tl_s0];
      n = len < 0 ? 0 : (len < n ? len : n);  // device contents are not validated: clamp
    }
    ui.q0 = u;
    ui.q_len = 1;
    ui.kv_len = n;
    ui.rbs = p.head_blocks;
  } else {
    const int32_t a = p.cu_q[u * p.cu_q_s], b = p.cu_q[(u + 1) * p.cu_q_s];
    ui.q0 = a;
    ui.q_len = b > a ? b - a : 0;
    const int32_t kl = p.kv_lens[u * p.kv_lens_s];
    ui.kv_len = kl > 0 ? kl : 0;
    const int64_t rows = static_cast<int64_t>(ui.q_len) * p.H;
    const int64_t rbs = (rows + kRows - 1) / kRows;
    ui.rbs = static_cast<int32_t>(rbs < p.max_rb ? rbs : p.max_rb);
  }
  return ui;
}

// Keys a dense row sees: positions < kv_len - q_len + j + 1 (clamped to [0, kv_len]).
__device__ __forceinline__ int64_t dense_limit(const UnitInfo& ui, int64_t j) {
  int64_t L = ui.kv_len - ui.q_len + j + 1;
  if (L > ui.kv_len) L = ui.kv_len;
  return L < 0 ? 0 : L;
}

template <bool kSparse>
__device__ __forceinline__ int32_t rb_tiles(const DecodeProblem& p, const UnitInfo& ui, int i) {
  int64_t keys;
  if (kSparse) {
    keys = ui.kv_len;
  } else {
    const int64_t rows = static_cast<int64_t>(ui.q_len) * p.H;
    const int64_t last = min(static_cast<int64_t>(i + 1) * kRows, rows) - 1;
    keys = dense_limit(ui, last / p.H);
    const int64_t cap = static_cast<int64_t>(p.max_blocks) * p.page;
    if (keys > cap) keys = cap;
  }
  const int64_t n = (keys + kTileKeys - 1) / kTileKeys;
  return n < 1 ? 1 : static_cast<int32_t>(n);  // an empty row block still writes 0 / +inf
}

// Block-wide exclusive scan of one int64 per thread (kSchedThreads threads).
static_assert(kSchedThreads % 32 == 0 && kSchedThreads / 32 <= 32, "one warp scans the warp sums");
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t v, int64_t* total, int64_t* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < kSchedThreads / 32 ? s_warp[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    // inclusive over warps; only kSchedThreads / 32 entries exist (lanes past them hold the
    // total and must not store: round 1's memcheck caught lanes 16..31 writing past s_warp)
    if (lane < kSchedThreads / 32) s_warp[lane] = w;
  }
  __syncthreads();
  const int64_t before = (warp > 0 ? s_warp[warp - 1] : 0) + x - v;
  *total = s_warp[kSchedThreads / 32 - 1];
  __syncthreads();
  return before;
}

__device__ __forceinline__ int32_t block_max(int32_t v, int32_t* s_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) s_max[warp] = v;
  __syncthreads();
  int32_t m = 0;
  for (int w = 0; w < kSchedThreads / 32; ++w) m = max(m, s_max[w]);
  __syncthreads();
  return m;
}

// One CTA of kSchedThreads: row blocks, their tile prefix, and the CTA ranges.
// Row-block order: local index major (all units' block 0, then all units' block 1, ...) when
// units have at most kLocalMajorMax blocks, so that the blocks reading the same keys (the two
// head halves of a token, the tokens of a sequence) run at the same time on different SMs
// and the second read hits L2; unit major otherwise.
constexpr int kLocalMajorMax = 16;
template <bool kSparse>
__global__ void __launch_bounds__(kSchedThreads) decode_schedule_kernel(const DecodeProblem p) {
  __shared__ int64_t s_warp[kSchedThreads / 32];
  __shared__ int32_t s_max[kSchedThreads / 32];
  const int tid = threadIdx.x;
  const int U = p.units;
  const int per = (U + kSchedThreads - 1) / kSchedThreads;
  const int u0 = min(U, tid * per), u1 = min(U, u0 + per);
  int64_t my_rbs = 0;
  int32_t my_max = 0, my_lmax = 0;
  for (int u = u0; u < u1; ++u) {
    const UnitInfo ui = unit_info<kSparse>(p, u);
    my_rbs += ui.rbs;
    my_lmax = max(my_lmax, ui.rbs);
    for (int i = 0; i < ui.rbs; ++i) my_max = max(my_max, rb_tiles<kSparse>(p, ui, i));
  }
  int64_t R = 0, total = 0;
  (void)block_exclusive_scan(my_rbs, &R, s_warp);
  const int32_t max_n = block_max(my_max, s_max);
  const int32_t lmax = block_max(my_lmax, s_max);
  if (R > p.max_rb) {
    R = 0;  // only with device lengths the host could not check: compute nothing
  } else if (lmax <= kLocalMajorMax) {
    int64_t rb_base = 0, pos_base = 0;
    for (int l = 0; l < lmax; ++l) {
      int64_t cnt = 0, tiles = 0;
      for (int u = u0; u < u1; ++u) {
        const UnitInfo ui = unit_info<kSparse>(p, u);
        if (ui.rbs > l) {
          ++cnt;
          tiles += rb_tiles<kSparse>(p, ui, l);
        }
      }
      int64_t cnt_total = 0, tiles_total = 0;
      int64_t rb = rb_base + block_exclusive_scan(cnt, &cnt_total, s_warp);
      int64_t pos = pos_base + block_exclusive_scan(tiles, &tiles_total, s_warp);
      for (int u = u0; u < u1; ++u) {
        const UnitInfo ui = unit_info<kSparse>(p, u);
        if (ui.rbs <= l) continue;
        p.rb_prefix[rb] = static_cast<int32_t>(pos);
        p.rb_unit[rb] = u;
        p.rb_local[rb] = l;
        pos += rb_tiles<kSparse>(p, ui, l);
        ++rb;
      }
      rb_base += cnt_total;
      pos_base += tiles_total;
    }
    total = pos_base;
  } else {
    int64_t my_tiles = 0;
    for (int u = u0; u < u1; ++u) {
      const UnitInfo ui = unit_info<kSparse>(p, u);
      for (int i = 0; i < ui.rbs; ++i) my_tiles += rb_tiles<kSparse>(p, ui, i);
    }
    int64_t rb = block_exclusive_scan(my_rbs, &R, s_warp);
    int64_t pos = block_exclusive_scan(my_tiles, &total, s_warp);
    for (int u = u0; u < u1; ++u) {
      const UnitInfo ui = unit_info<kSparse>(p, u);
      for (int i = 0; i < ui.rbs; ++i, ++rb) {
        p.rb_prefix[rb] = static_cast<int32_t>(pos);
        p.rb_unit[rb] = u;
        p.rb_local[rb] = i;
        pos += rb_tiles<kSparse>(p, ui, i);
      }
    }
  }
  if (tid == 0) {
    p.rb_prefix[R] = static_cast<int32_t>(total);
    p.meta[0] = static_cast<int32_t>(R);
    p.meta[1] = static_cast<int32_t>(total);
  }
  __syncthreads();  // the row-block arrays are complete before the ranges read them
  const int64_t G = p.G;
  const int64_t chunk = total > 0 ? (total + G - 1) / G : 1;
  // Whole row blocks per CTA when none is much larger than a fair share (no partials);
  // otherwise equal ranges, snapped to a row-block boundary within a quarter chunk.
  const bool whole = max_n <= chunk + chunk / 8;
  for (int64_t g = tid; g <= G; g += kSchedThreads) {
    int64_t P;
    if (g == 0 || R == 0) {
      P = 0;
    } else if (g == G) {
      P = total;
    } else if (whole) {
      // first row block whose midpoint lies at or past g * total / G
      int64_t lo = 0, hi = R;  // answer in [0, R]
      while (lo < hi) {
        const int64_t mid = (lo + hi) >> 1;
        const int64_t twice_mid = static_cast<int64_t>(p.rb_prefix[mid]) + p.rb_prefix[mid + 1];
        if (twice_mid * G > 2 * g * total) hi = mid; else lo = mid + 1;
      }
      P = p.rb_prefix[lo];
    } else {
      const int64_t x = min(g * chunk, total);
      int64_t lo = 0, hi = R - 1;  // last rb with prefix <= x
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (p.rb_prefix[mid] <= x) lo = mid; else hi = mid - 1;
      }
      const int64_t a = p.rb_prefix[lo], b = p.rb_prefix[lo + 1];
      const int64_t slack = chunk / 4;
      P = (x - a <= slack) ? a : ((b - x <= slack) ? b : x);
    }
    p.sched_pos[g] = static_cast<int32_t>(P);
  }
}

// ---- pieces of a CTA's range ------------------------------------------------------------------
struct Piece {
  int32_t rb = 0, kt0 = 0, kt1 = 0, n = 0;
  int32_t unit = 0, local = 0;
  bool first = false;  // begins at the CTA's range start
};

__device__ __forceinline__ bool next_piece(const DecodeProblem& p, int32_t R, int32_t start, int32_t end,
                                           int32_t& pos, Piece& pc) {
  if (pos >= end || R <= 0) return false;
  int lo = 0, hi = R - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.rb_prefix[mid] <= pos) lo = mid; else hi = mid - 1;
  }
  const int32_t base = p.rb_prefix[lo];
  pc.rb = lo;
  pc.n = p.rb_prefix[lo + 1] - base;
  pc.kt0 = pos - base;
  pc.kt1 = min(end - base, pc.n);
  pc.unit = p.rb_unit[lo];
  pc.local = p.rb_local[lo];
  pc.first = pos == start;
  pos = base + pc.kt1;
  return pc.kt1 > pc.kt0;
}

// A query row of a piece: its token, head and key limit.
struct RowRef {
  bool valid = false;
  int32_t t = 0, h = 0;
  int64_t limit = 0;
};

template <bool kSparse>
__device__ __forceinline__ RowRef row_ref(const DecodeProblem& p, const UnitInfo& ui, int local, int r) {
  RowRef rr;
  if (kSparse) {
    rr.t = ui.q0;
    rr.h = local * kRows + r;
    rr.valid = rr.h < p.H && rr.t >= 0 && rr.t < p.T;
    rr.limit = INT64_MAX;
  } else {
    const int64_t flat = static_cast<int64_t>(local) * kRows + r;
    const int64_t j = flat / p.H;
    rr.h = static_cast<int32_t>(flat - j * p.H);
    rr.t = static_cast<int32_t>(ui.q0 + j);
    rr.valid = flat < static_cast<int64_t>(ui.q_len) * p.H && rr.t >= 0 && rr.t < p.T;
    rr.limit = dense_limit(ui, j);
  }
  return rr;
}

// The cache block holding key position `pos` of dense unit `unit` (or -1).
__device__ __forceinline__ int64_t dense_block(const DecodeProblem& p, int unit, const UnitInfo& ui, int64_t pos) {
  if (pos >= ui.kv_len) return -1;
  const int64_t col = pos / p.page;
  if (col >= p.max_blocks) return -1;
  const int64_t blk = p.block_table[unit * p.bt_s0 + col * p.bt_s1];
  return (blk >= 0 && blk < p.num_blocks) ? blk : -1;
}

// ---- shared-memory helpers --------------------------------------------------------------------
// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a 64-row x 128-byte swizzled block.
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Q rows of a piece into the K-major swizzled tile (zero for rows without a query), by kN
// threads numbered t = 0 .. kN - 1.
template <bool kSparse, int kN>
__device__ __forceinline__ void stage_q_rows(const DecodeProblem& p, const UnitInfo& ui, int local, uint8_t* sQ, int t) {
  for (int i = t; i < kRows * 72; i += kN) {
    const int r = i / 72, c = i - r * 72;
    const RowRef rr = row_ref<kSparse>(p, ui, local, r);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (rr.valid) {
      const uint16_t* src = p.q + static_cast<int64_t>(rr.t) * p.q_s0 + static_cast<int64_t>(rr.h) * p.q_s1 + c * 8;
      if (p.q_aligned16) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        v.x = src[0] | (uint32_t(src[1]) << 16);
        v.y = src[2] | (uint32_t(src[3]) << 16);
        v.z = src[4] | (uint32_t(src[5]) << 16);
        v.w = src[6] | (uint32_t(src[7]) << 16);
      }
    }
    *reinterpret_cast<uint4*>(sQ + (c >> 3) * kBlockBytes + swz(r, c & 7)) = v;
  }
}

// Rows of a loaded page past kv_len may hold NaN: zero the V part (the first 512 columns) of
// the tile's keys whose mask bit is clear, by kN threads numbered t = 0 .. kN - 1.
template <int kN>
__device__ __forceinline__ void zero_invalid_v_rows(uint8_t* tile, uint64_t mask, int t) {
  for (int i = t; i < kTileKeys * 8 * 8; i += kN) {
    const int key = i >> 6, rest = i & 63;
    if (!((mask >> key) & 1)) {
      const int kb = rest >> 3, c = rest & 7;
      *reinterpret_cast<uint4*>(tile + kb * kBlockBytes + key * 128 + c * 16) = make_uint4(0, 0, 0, 0);
    }
  }
}

__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

// Four e4m3 (low byte first) as four bf16, times a power-of-two multiplier (bf16x2 `mul`,
// both halves equal), exactly: sign | (exponent, mantissa) << 4 is a bf16 whose value is the
// e4m3 value times 2^-120 (normals and subnormals alike: both formats' subnormal steps line
// up), so one bf16 multiply by 2^120 * scale restores it. Integer ops and one mul per pair:
// no conversions (quarter rate), so the producer keeps up with the tensor cores.
__device__ __forceinline__ void e4m3x4_to_bf16x4(uint32_t w, uint32_t mul, uint32_t& lo, uint32_t& hi) {
  uint32_t a = __byte_perm(w, 0, 0x1404);  // byte 0 -> bits 8..15, byte 1 -> bits 24..31
  uint32_t b = __byte_perm(w, 0, 0x3424);  // bytes 2, 3
  a = (a & 0x80008000u) | ((a >> 4) & 0x07f007f0u);
  b = (b & 0x80008000u) | ((b >> 4) & 0x07f007f0u);
#if DSA_HOPPER_DEVICE
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(a), "r"(mul));
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(b), "r"(mul));
#else
  lo = a; hi = b; (void)mul;
#endif
}
__device__ __forceinline__ uint32_t bf16x2_splat(float v) {
  const uint32_t h = float_to_bf16(v);
  return h | (h << 16);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t m) {
#if DSA_HOPPER_DEVICE
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(m));
  return r;
#else
  (void)m;
  return a;
#endif
}

// Descriptors. K-major 128-byte-swizzled operands (Q, K for scores; P): SBO = 1024 (next 8
// rows), K steps of 16 bf16 = +32 bytes. V as the MN-major B of P·V: rows are keys (K), 128 B
// hold 64 dims (N); LBO = 8192 (next 64-dim block), SBO = 1024 (next 8 keys); a k16 step is
// 16 key rows = +2048 bytes. All of the MN-major assumptions live in v_desc().
__device__ __forceinline__ uint64_t kmajor_desc(const uint8_t* base, int kstep) {
  return hopper::desc_advance(hopper::smem_desc(base, hopper::Swizzle::k128B, 16, 1024), kstep * 32);
}
__device__ __forceinline__ uint64_t v_desc(const uint8_t* first_block, int kstep) {
  return hopper::desc_advance(hopper::smem_desc(first_block, hopper::Swizzle::k128B, kBlockBytes, 1024),
                              kstep * 16 * 128);
}

// ---- the main kernel --------------------------------------------------------------------------
// One row half (kHr: the accumulator row r_lo or r_hi) of a warpgroup's 256 output dims: the
// split-S store. A template, not a loop over the two halves: in the split instantiations
// nvcc left that loop rolled and moved o[] to local memory (560-576-byte stack frames).
template <int kHr>
__device__ __forceinline__ void store_half(const DecodeProblem& p, const float (&o)[128], const RowRef& rr,
                                           bool whole, float f, int slot, int r, int dim0, int lane) {
  if (whole) {
    if (!rr.valid) return;
    const int64_t e0 = static_cast<int64_t>(rr.t) * p.out_s0 + static_cast<int64_t>(rr.h) * p.out_s1 + dim0;
#pragma unroll
    for (int i = 2 * kHr; i < 128; i += 4) {
      const int col = hopper::acc_col(i, lane);
      const float v0 = o[i] * f, v1 = o[i + 1] * f;
      if (p.out_bf16) {
        uint16_t* dst = static_cast<uint16_t*>(p.out) + e0 + col;
        if (p.out_pairs) {
          *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v0, v1);
        } else {
          dst[0] = float_to_bf16(v0);
          dst[1] = float_to_bf16(v1);
        }
      } else {
        float* dst = static_cast<float*>(p.out) + e0 + col;
        if (p.out_pairs) {
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          dst[0] = v0;
          dst[1] = v1;
        }
      }
    }
  } else {
    float* dst = p.part_o + (static_cast<int64_t>(slot) * kRows + r) * kVDim + dim0;
#pragma unroll
    for (int i = 2 * kHr; i < 128; i += 4) {
      const int col = hopper::acc_col(i, lane);
      *reinterpret_cast<float2*>(dst + col) = make_float2(o[i], o[i + 1]);
    }
  }
}

// kSplitS (DSA_DECODE_KERNEL=split_s): the consumers split S by keys (the `if constexpr (kSplitS)`
// branch below says how); false: the path described at the top of this file.
template <int kKind, bool kSplitS = false>
__global__ void __launch_bounds__(kThreads, 1)
    decode_attn_kernel(const __grid_constant__ CUtensorMap kv_map, const DecodeProblem p) {
#if DSA_HOPPER_DEVICE
  constexpr bool kSparse = kKind == kSparseFp8;
  constexpr bool kTma = kKind == kDenseBf16;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = hopper::smem_aligned<1024>(smem_raw);
  uint8_t* sQ = smem + kSmemQ;
  uint8_t* sK = smem + kSmemK;
  uint8_t* sP = smem + kSmemP;
  float* sAlpha = reinterpret_cast<float*>(smem + kSmemAlpha);
  float* sRowF = reinterpret_cast<float*>(smem + kSmemRowF);
  uint64_t* sMask = reinterpret_cast<uint64_t*>(smem + kSmemMask);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSmemBars);
  uint64_t* full = bars;
  uint64_t* empty = bars + 2;
  uint64_t* p_full = bars + 4;
  uint64_t* p_empty = bars + 5;
  uint64_t* f_full = bars + 6;

  const int tid = threadIdx.x;
  const int wg = tid >> 7, wtid = tid & 127, lane = tid & 31, warp = (tid >> 5) & 3;
  if (tid == 0) {
    hopper::mbar_init(&full[0], kTma ? 1 : 128);
    hopper::mbar_init(&full[1], kTma ? 1 : 128);
    hopper::mbar_init(&empty[0], 256);
    hopper::mbar_init(&empty[1], 256);
    hopper::mbar_init(p_full, 128);
    hopper::mbar_init(p_empty, 128);
    hopper::mbar_init(f_full, 128);
    hopper::mbar_init_fence();
  }
  if (kTma && tid == 256) hopper::prefetch_tensor_map(&kv_map);
  __syncthreads();

  const int g = blockIdx.x;
  const int32_t R = p.meta[0];
  const int32_t start = p.sched_pos[g], end = p.sched_pos[g + 1];

  if (wg == 2) {
    // ------------------------------------------------------------------ producer
    hopper::regs_decrease<kTma ? kProducerRegsTma : kProducerRegsGather>();
    if (kTma && wtid != 0) return;
    int32_t pos = start;
    Piece pc;
    uint32_t it = 0;
    while (next_piece(p, R, start, end, pos, pc)) {
      const UnitInfo ui = unit_info<kSparse>(p, pc.unit);
      // FP8 gather: the cache slot of this thread's token (k = wtid / 2) in tile kt, or -1.
      const int gk = wtid >> 1, ghalf = wtid & 1;
      auto slot_of = [&](int32_t kt) -> int64_t {
        const int64_t kpos = static_cast<int64_t>(kt) * kTileKeys + gk;
        if (kt >= pc.kt1) return -1;
        if (kSparse) {
          if (kpos >= ui.kv_len) return -1;
          const int64_t idx = p.indices[static_cast<int64_t>(ui.q0) * p.idx_s0 + kpos * p.idx_s1];
          return (idx >= 0 && idx < p.num_slots) ? idx : -1;
        }
        const int64_t b = dense_block(p, pc.unit, ui, kpos);
        return b >= 0 ? b * p.page + kpos % p.page : -1;
      };
      // This thread's half (328 bytes) of a token into L2, one hint per 32-byte sector.
      auto prefetch_token = [&](int64_t slot) {
        if (slot < 0) return;
        const int64_t b = slot / p.page;
        const uint8_t* t = p.cache + b * p.block_bytes + (slot - b * p.page) * 656 + ghalf * 328;
#pragma unroll
        for (int o = 0; o < 328; o += 32) hopper::prefetch_l2(t + o);
        hopper::prefetch_l2(t + 327);
      };
      // Software pipeline (FP8): tile kt's tokens were hinted into L2 while tile kt - 1 was
      // dequantised, and the index (or block-table entry) of tile kt + 2 is loaded one tile
      // ahead, so the three dependent rounds of loads per token (scales and values of the two
      // 128-dim groups, k_pe) hit L2 instead of each waiting for HBM.
      int64_t slot_a = -1, slot_b = -1;
      if constexpr (!kTma) {
        slot_a = slot_of(pc.kt0);
        prefetch_token(slot_a);
        slot_b = slot_of(pc.kt0 + 1);
      }
      for (int32_t kt = pc.kt0; kt < pc.kt1; ++kt, ++it) {
        const int s = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        int64_t slot_c = -1;
        if constexpr (!kTma) {
          prefetch_token(slot_b);
          slot_c = slot_of(kt + 2);
        }
        hopper::mbar_wait(&empty[s], ph ^ 1);
        uint8_t* dst = sK + s * kKBytes;
        const int64_t pos0 = static_cast<int64_t>(kt) * kTileKeys;
        if constexpr (kTma) {
          // Pages of this tile (one when page >= 64): the valid-key mask first, then the
          // loads (out-of-range blocks, coordinate -1, are zero-filled by the copy engine).
          const int box = p.page < kTileKeys ? p.page : kTileKeys;
          const int pages = kTileKeys / box;
          uint64_t mask = 0;
          for (int j = 0; j < pages; ++j) {
            const int64_t kpos = pos0 + j * box;
            if (dense_block(p, pc.unit, ui, kpos) >= 0) {
              const int64_t left = ui.kv_len - kpos;
              const int64_t valid_n = left < box ? left : box;
              const uint64_t bits = valid_n >= 64 ? ~0ull : ((1ull << valid_n) - 1);
              mask |= bits << (j * box);
            }
          }
          sMask[s] = mask;
          hopper::mbar_arrive_expect_tx(&full[s], kKBytes);
          for (int j = 0; j < pages; ++j) {
            const int64_t kpos = pos0 + j * box;
            const int64_t b = dense_block(p, pc.unit, ui, kpos);
            const int32_t off = static_cast<int32_t>(kpos % p.page);
            for (int kb = 0; kb < kDimBlocks; ++kb)
              hopper::tma_load_3d(dst + kb * kBlockBytes + j * box * 128, &kv_map, kb * 64, off,
                                  b >= 0 ? static_cast<int32_t>(b) : -1, &full[s]);
          }
        } else {
          // 128 threads: token k = wtid / 2, half = wtid % 2 (values half*256 .. +256).
          const int k = gk, half = ghalf;
          (void)pos0;
          const int64_t slot = slot_a;
          slot_a = slot_b;
          slot_b = slot_c;
          const bool valid = slot >= 0;
          const uint32_t bal = __ballot_sync(0xffffffffu, valid);
          if (lane == 0) {
            uint32_t m16 = 0;
#pragma unroll
            for (int i = 0; i < 16; ++i) m16 |= ((bal >> (2 * i)) & 1u) << i;
            reinterpret_cast<uint16_t*>(&sMask[s])[warp] = static_cast<uint16_t>(m16);
          }
          const uint8_t* src = p.cache;
          if (valid) {
            const int64_t b = slot / p.page;
            src += b * p.block_bytes + (slot - b * p.page) * 656;
          }
#pragma unroll
          for (int grp = 0; grp < 2; ++grp) {
            uint4 raw[8];
            float scale = 0.f;
            if (valid) {
              scale = __ldg(reinterpret_cast<const float*>(src + 512) + half * 2 + grp);
#pragma unroll
              for (int u = 0; u < 8; ++u)
                raw[u] = __ldg(reinterpret_cast<const uint4*>(src + half * 256 + grp * 128 + u * 16));
            } else {
#pragma unroll
              for (int u = 0; u < 8; ++u) raw[u] = make_uint4(0, 0, 0, 0);
            }
            // 2^120 * scale in one bf16 when it fits (scale <= 2^7), else two exact steps.
            const bool one_step = scale <= 128.f;
            const uint32_t mul1 = bf16x2_splat(one_step ? scale * 0x1p120f : 0x1p120f);
            const uint32_t mul2 = bf16x2_splat(scale);
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              const int d0 = half * 256 + grp * 128 + u * 16;  // first of 16 dims
              const int kb = d0 >> 6, cc = (d0 & 63) >> 3;
              const uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
              uint32_t o[8];
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                e4m3x4_to_bf16x4(w[e], mul1, o[2 * e], o[2 * e + 1]);
                if (!one_step) {
                  o[2 * e] = bf16x2_mul(o[2 * e], mul2);
                  o[2 * e + 1] = bf16x2_mul(o[2 * e + 1], mul2);
                }
              }
              uint8_t* blkp = dst + kb * kBlockBytes;
              *reinterpret_cast<uint4*>(blkp + swz(k, cc)) = make_uint4(o[0], o[1], o[2], o[3]);
              *reinterpret_cast<uint4*>(blkp + swz(k, cc + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
            }
          }
          // k_pe: 64 bf16 at byte 528; this thread copies 4 chunks (dims 512 + half*32 ..).
#pragma unroll
          for (int w4 = 0; w4 < 4; ++w4) {
            const uint4 v = valid ? __ldg(reinterpret_cast<const uint4*>(src + 528 + half * 64 + w4 * 16))
                                  : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(dst + 8 * kBlockBytes + swz(k, half * 4 + w4)) = v;
          }
          hopper::fence_async_smem();
          hopper::mbar_arrive(&full[s]);
        }
      }
    }
    return;
  }

  // ---------------------------------------------------------------------- consumers
  hopper::regs_increase<kTma ? kConsumerRegsTma : kConsumerRegsGather>();
  int32_t pos = start;
  Piece pc;
  uint32_t it = 0, piece_no = 0;
  // This thread's two accumulator rows.
  const int r_lo = 16 * warp + (lane >> 2), r_hi = r_lo + 8;
  while (next_piece(p, R, start, end, pos, pc)) {
    const UnitInfo ui = unit_info<kSparse>(p, pc.unit);
    const RowRef rows[2] = {row_ref<kSparse>(p, ui, pc.local, r_lo), row_ref<kSparse>(p, ui, pc.local, r_hi)};
    const bool whole = pc.kt0 == 0 && pc.kt1 == pc.n;
    const int slot = pc.first ? 2 * g : 2 * g + 1;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float* rowf = sRowF + (piece_no & 1) * kRows;
    float fac[2] = {1.f, 1.f};  // kSplitS: this thread's per-row output factors

    if constexpr (kSplitS) {
      // Both warpgroups compute S, each over its own 32 keys of the tile (m64n32, half the
      // k-step chain of the default path), agree on the row maxima through shared memory,
      // write their half of P, and then each multiplies the whole P by its 256 value columns.
      // WG1 no longer idles while WG0 computes S and the softmax. Per tile: bar 3 after the
      // maxima (which also tells each warpgroup that the other's P V of the previous tile has
      // completed, so sP may be overwritten), bar 4 after P. sRowF holds [2][64] row maxima,
      // at the end of a piece the two halves' row sums (ordered by bar 4 / bar 2).
      const int kh = wg;  // key half 0..31 / 32..63 and value half 0..255 / 256..511
      const int ctid = tid;  // 0..255 over both consumer warpgroups
      float* sEx = sRowF;
      stage_q_rows<kSparse, 256>(p, ui, pc.local, sQ, ctid);
      hopper::fence_async_smem();
      named_bar_sync(1, 256);

      float m_run[2] = {-INFINITY, -INFINITY};
      float l_run[2] = {0.f, 0.f};
      for (int32_t kt = pc.kt0; kt < pc.kt1; ++kt, ++it) {
        const int s = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        uint8_t* tile = sK + s * kKBytes;
        hopper::mbar_wait(&full[s], ph);
        const uint64_t mask = sMask[s];
        if (kTma && mask != ~0ull) {
          // Rows of a loaded page past kv_len may hold NaN: zero the V part of invalid rows
          // (both warpgroups, before either reads the tile).
          zero_invalid_v_rows<256>(tile, mask, ctid);
          hopper::fence_async_smem();
          named_bar_sync(1, 256);
        }
        // S over keys kh*32 .. +32: rows of the K-major tile are 128 B, so the half starts
        // 4096 B in (four whole 1024-B swizzle atoms: same swizzle phase).
        float sc[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) sc[i] = 0.f;
        hopper::wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < kDimBlocks; ++kb)
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            hopper::wgmma_bf16_ss<32, 0, 0>(sc, kmajor_desc(sQ + kb * kBlockBytes, ks),
                                            kmajor_desc(tile + kb * kBlockBytes + kh * 32 * 128, ks), 1);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_regs(sc);
        const int64_t pos0 = static_cast<int64_t>(kt) * kTileKeys;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int col = kh * 32 + hopper::acc_col(i, lane);
          const int hr = (i >> 1) & 1;
          const bool ok = ((mask >> col) & 1) && (pos0 + col < rows[hr].limit);
          const float v = ok ? sc[i] * p.scale_log2 : -INFINITY;
          sc[i] = v;
          mx[hr] = fmaxf(mx[hr], v);
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
          mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        }
        if ((lane & 3) == 0) {
          sEx[kh * kRows + r_lo] = mx[0];
          sEx[kh * kRows + r_hi] = mx[1];
        }
        named_bar_sync(3, 256);
        float alpha[2], m_use[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r_hi : r_lo;
          // both halves read in the same order by both warpgroups: identical m, alpha
          const float m_tile = fmaxf(sEx[r], sEx[kRows + r]);
          const float m_new = fmaxf(m_run[hr], m_tile);
          m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
          alpha[hr] = exp2f(m_run[hr] - m_use[hr]);
          m_run[hr] = m_new;
          l_run[hr] *= alpha[hr];
        }
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          const int hr = (i >> 1) & 1;
          const float p0 = exp2f(sc[i] - m_use[hr]), p1 = exp2f(sc[i + 1] - m_use[hr]);
          l_run[hr] += p0 + p1;
          const int row = hopper::acc_row(i, lane, warp), col = kh * 32 + hopper::acc_col(i, lane);
          *reinterpret_cast<uint32_t*>(sP + swz(row, col >> 3) + (col & 7) * 2) = pack_bf16(p0, p1);
        }
        hopper::fence_async_smem();
        named_bar_sync(4, 256);
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        hopper::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          hopper::wgmma_bf16_ss<256, 0, 1>(o, kmajor_desc(sP, ks), v_desc(tile + kh * kVBlocksPerWg * kBlockBytes, ks), 1);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_regs(o);
        hopper::mbar_arrive(&empty[s]);
      }
      // Row sums: over the quad, then over the two key halves (sEx is free: the last tile's
      // maxima were read before bar 4).
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 1);
        l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 2);
      }
      if ((lane & 3) == 0) {
        sEx[kh * kRows + r_lo] = l_run[0];
        sEx[kh * kRows + r_hi] = l_run[1];
      }
      named_bar_sync(2, 256);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? r_hi : r_lo;
        const RowRef& rr = rows[hr];
        const float l = sEx[r] + sEx[kRows + r];
        if (whole) {
          const bool any = l != 0.f;
          const float lse = any ? (m_run[hr] + log2f(l)) * kLn2 : INFINITY;
          float f = any ? 1.f / l : 0.f;
          if (any && p.sink != nullptr && rr.valid) f /= 1.f + expf(p.sink[rr.h * p.sink_s] - lse);
          fac[hr] = f;
          if (wg == 0 && (lane & 3) == 0 && rr.valid)
            p.lse[rr.t * p.lse_s0 + static_cast<int64_t>(rr.h) * p.lse_s1] = lse;
        } else if (wg == 0 && (lane & 3) == 0) {
          p.part_ml[slot * kRows + r] = make_float2(m_run[hr], l);
        }
      }
      // sEx is next written after the next piece's bar 1, which both pass after these reads.
    } else if (wg == 0) {
      // Q rows of the piece into shared memory (zero for rows without a query).
      stage_q_rows<kSparse, 128>(p, ui, pc.local, sQ, wtid);
      hopper::fence_async_smem();
      named_bar_sync(1, 128);

      float m_run[2] = {-INFINITY, -INFINITY};
      float l_run[2] = {0.f, 0.f};
      for (int32_t kt = pc.kt0; kt < pc.kt1; ++kt, ++it) {
        const int s = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        uint8_t* tile = sK + s * kKBytes;
        hopper::mbar_wait(&full[s], ph);
        const uint64_t mask = sMask[s];
        if (kTma && mask != ~0ull) {
          // Rows of a loaded page past kv_len may hold NaN: zero the V part of invalid rows.
          zero_invalid_v_rows<128>(tile, mask, wtid);
          hopper::fence_async_smem();
          named_bar_sync(1, 128);
        }
        // S = Q K^T
        float sc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) sc[i] = 0.f;
        hopper::wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < kDimBlocks; ++kb)
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            hopper::wgmma_bf16_ss<64, 0, 0>(sc, kmajor_desc(sQ + kb * kBlockBytes, ks),
                                            kmajor_desc(tile + kb * kBlockBytes, ks), 1);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_regs(sc);
        // Mask, scale, row maxima (the 4 lanes of a quad share rows).
        const int64_t pos0 = static_cast<int64_t>(kt) * kTileKeys;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int col = hopper::acc_col(i, lane);
          const int hr = (i >> 1) & 1;
          const bool ok = ((mask >> col) & 1) && (pos0 + col < rows[hr].limit);
          const float v = ok ? sc[i] * p.scale_log2 : -INFINITY;
          sc[i] = v;
          mx[hr] = fmaxf(mx[hr], v);
        }
        float alpha[2], m_use[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
          mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
          const float m_new = fmaxf(m_run[hr], mx[hr]);
          m_use[hr] = m_new == -INFINITY ? 0.f : m_new;
          alpha[hr] = exp2f(m_run[hr] - m_use[hr]);
          m_run[hr] = m_new;
          l_run[hr] *= alpha[hr];
        }
        uint32_t pa[4][4];
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          const int hr = (i >> 1) & 1;
          const float p0 = exp2f(sc[i] - m_use[hr]), p1 = exp2f(sc[i + 1] - m_use[hr]);
          l_run[hr] += p0 + p1;
          pa[i >> 3][(i >> 1) & 3] = pack_bf16(p0, p1);
        }
        // P and alpha for WG1, once it has consumed the previous P.
        if (it > 0) hopper::mbar_wait(p_empty, (it - 1) & 1);
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          const int row = hopper::acc_row(i, lane, warp), col = hopper::acc_col(i, lane);
          *reinterpret_cast<uint32_t*>(sP + swz(row, col >> 3) + (col & 7) * 2) = pa[i >> 3][(i >> 1) & 3];
        }
        if ((lane & 3) == 0) {
          sAlpha[r_lo] = alpha[0];
          sAlpha[r_hi] = alpha[1];
        }
        hopper::fence_async_smem();
        hopper::mbar_arrive(p_full);
        // O[:, 0:256] = alpha * O + P V
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        hopper::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) hopper::wgmma_bf16_rs<256, 1>(o, pa[ks], v_desc(tile, ks), 1);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_regs(o);
        hopper::mbar_arrive(&empty[s]);
      }
      // Row sums over the quad; lse, factor, partial statistics.
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 1);
        l_run[hr] += __shfl_xor_sync(0xffffffffu, l_run[hr], 2);
      }
      float factor[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? r_hi : r_lo;
        const RowRef& rr = rows[hr];
        if (whole) {
          const bool any = l_run[hr] != 0.f;
          const float lse = any ? (m_run[hr] + log2f(l_run[hr])) * kLn2 : INFINITY;
          float f = any ? 1.f / l_run[hr] : 0.f;
          if (any && p.sink != nullptr && rr.valid) f /= 1.f + expf(p.sink[rr.h * p.sink_s] - lse);
          factor[hr] = f;
          if ((lane & 3) == 0 && rr.valid) p.lse[rr.t * p.lse_s0 + static_cast<int64_t>(rr.h) * p.lse_s1] = lse;
        } else {
          factor[hr] = 1.f;
          if ((lane & 3) == 0) p.part_ml[slot * kRows + r] = make_float2(m_run[hr], l_run[hr]);
        }
        if ((lane & 3) == 0) rowf[r] = factor[hr];
      }
      hopper::mbar_arrive(f_full);  // release: rowf of this piece for WG1
      named_bar_sync(2, 256);
      // fallthrough to the shared store below with dims 0..255
    } else {
      // WG1
      for (int32_t kt = pc.kt0; kt < pc.kt1; ++kt, ++it) {
        const int s = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        const uint8_t* tile = sK + s * kKBytes;
        hopper::mbar_wait(&full[s], ph);
        hopper::mbar_wait(p_full, it & 1);
        const float a0 = sAlpha[r_lo], a1 = sAlpha[r_hi];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= ((i >> 1) & 1) ? a1 : a0;
        hopper::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          hopper::wgmma_bf16_ss<256, 0, 1>(o, kmajor_desc(sP, ks), v_desc(tile + kVBlocksPerWg * kBlockBytes, ks), 1);
        hopper::wgmma_commit();
        hopper::wgmma_wait<0>();
        hopper::fence_regs(o);
        hopper::mbar_arrive(p_empty);
        hopper::mbar_arrive(&empty[s]);
      }
      hopper::mbar_wait(f_full, piece_no & 1);  // acquire WG0's rowf (phase k = piece k)
      named_bar_sync(2, 256);
    }

    // Store this warpgroup's 256 dims of the 64 rows.
    const int dim0 = wg * 256;
    if constexpr (kSplitS) {
      store_half<0>(p, o, rows[0], whole, fac[0], slot, r_lo, dim0, lane);
      store_half<1>(p, o, rows[1], whole, fac[1], slot, r_hi, dim0, lane);
    } else {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = hr ? r_hi : r_lo;
      const RowRef& rr = rows[hr];
      const float f = rowf[r];
      if (whole) {
        if (!rr.valid) continue;
        const int64_t e0 = static_cast<int64_t>(rr.t) * p.out_s0 + static_cast<int64_t>(rr.h) * p.out_s1 + dim0;
#pragma unroll
        for (int i = 2 * hr; i < 128; i += 4) {
          const int col = hopper::acc_col(i, lane);
          const float v0 = o[i] * f, v1 = o[i + 1] * f;
          if (p.out_bf16) {
            uint16_t* dst = static_cast<uint16_t*>(p.out) + e0 + col;
            if (p.out_pairs) {
              *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v0, v1);
            } else {
              dst[0] = float_to_bf16(v0);
              dst[1] = float_to_bf16(v1);
            }
          } else {
            float* dst = static_cast<float*>(p.out) + e0 + col;
            if (p.out_pairs) {
              *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
            } else {
              dst[0] = v0;
              dst[1] = v1;
            }
          }
        }
      } else {
        float* dst = p.part_o + (static_cast<int64_t>(slot) * kRows + r) * kVDim + dim0;
#pragma unroll
        for (int i = 2 * hr; i < 128; i += 4) {
          const int col = hopper::acc_col(i, lane);
          *reinterpret_cast<float2*>(dst + col) = make_float2(o[i], o[i + 1]);
        }
      }
    }
    }  // default store
    ++piece_no;
  }
#else
  (void)kv_map; (void)p;
  __trap();
#endif
}

// ---- merging the pieces of row blocks that range boundaries cut ----------------------------
// Block (g, y), 1 <= g < G: rows y * kCombineRows .. of the row block in which sched_pos[g]
// is the first inner boundary (a cut row block has exactly one such g). 128 threads x 4 dims
// per row, kCombineRows rows per block.
template <bool kSparse>
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const DecodeProblem p) {
  const int g = blockIdx.x;
  if (g == 0 || g >= p.G) return;
  const int32_t R = p.meta[0], total = p.meta[1];
  const int32_t P = p.sched_pos[g];
  if (P >= total || R <= 0) return;
  int lo = 0, hi = R - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.rb_prefix[mid] <= P) lo = mid; else hi = mid - 1;
  }
  const int32_t a = p.rb_prefix[lo], b = p.rb_prefix[lo + 1];
  if (P == a || p.sched_pos[g - 1] > a) return;
  const int g_first = g - 1;
  // Last CTA whose range starts inside the row block (sched_pos is nondecreasing and
  // sched_pos[g] = P < b): a binary search, not a walk of dependent loads over ~G/2 CTAs.
  int g_last = g;
  {
    int hi2 = p.G - 1;
    while (g_last < hi2) {
      const int mid = (g_last + hi2 + 1) >> 1;
      if (p.sched_pos[mid] < b) g_last = mid; else hi2 = mid - 1;
    }
  }
  const UnitInfo ui = unit_info<kSparse>(p, p.rb_unit[lo]);
  const int local = p.rb_local[lo];
  // One row per 128 threads (kCombineRows rows in parallel), 4 dims per thread. The loops over
  // the pieces are unrolled so that their loads are in flight together: a 128K-key sequence
  // cut over 132 CTAs merges ~66 pieces per row, and one dependent L2 round trip per piece
  // (round 1) made the combine cost more than the attention itself.
  const int r = blockIdx.y * kCombineRows + (threadIdx.x >> 7);
  const int d0 = (threadIdx.x & 127) * 4;
  const RowRef rr = row_ref<kSparse>(p, ui, local, r);
  if (!rr.valid) return;
  // Only slots of non-empty ranges are read (an empty range wrote nothing: initcheck), the
  // loads predicated rather than branched around; a piece without a valid key (l == 0) is
  // dropped by the selects.
  // Batches of kBatch pieces in straight-line code (indices past g_last clamped and
  // dropped), so that a batch's loads are issued before their first use.
  constexpr int kBatch = 8;
  float m = -INFINITY;
  for (int c0 = g_first; c0 <= g_last; c0 += kBatch) {
    float2 ml[kBatch];
    bool use[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = min(c0 + j, g_last);
      const int32_t sc0 = p.sched_pos[c], sc1 = p.sched_pos[c + 1];
      const int slot = sc0 >= a ? 2 * c : 2 * c + 1;
      use[j] = c0 + j <= g_last && sc0 != sc1;
      ml[j] = use[j] ? p.part_ml[slot * kRows + r] : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) m = (use[j] && ml[j].y != 0.f) ? fmaxf(m, ml[j].x) : m;
  }
  float l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int c0 = g_first; c0 <= g_last; c0 += kBatch) {
    float2 ml[kBatch];
    float4 v[kBatch];
    bool use[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = min(c0 + j, g_last);
      const int32_t sc0 = p.sched_pos[c], sc1 = p.sched_pos[c + 1];
      const int slot = sc0 >= a ? 2 * c : 2 * c + 1;
      use[j] = c0 + j <= g_last && sc0 != sc1;
      ml[j] = use[j] ? p.part_ml[slot * kRows + r] : make_float2(0.f, 0.f);
      v[j] = use[j] ? *reinterpret_cast<const float4*>(p.part_o + (static_cast<int64_t>(slot) * kRows + r) * kVDim + d0)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool u = use[j] && ml[j].y != 0.f;  // a piece without a valid key holds no partial
      const float w = u ? exp2f(ml[j].x - m) : 0.f;
      l = u ? l + ml[j].y * w : l;
      acc.x = u ? acc.x + w * v[j].x : acc.x;
      acc.y = u ? acc.y + w * v[j].y : acc.y;
      acc.z = u ? acc.z + w * v[j].z : acc.z;
      acc.w = u ? acc.w + w * v[j].w : acc.w;
    }
  }
  const bool any = l != 0.f;
  const float lse = any ? (m + log2f(l)) * kLn2 : INFINITY;
  float f = any ? 1.f / l : 0.f;
  if (any && p.sink != nullptr) f /= 1.f + expf(p.sink[rr.h * p.sink_s] - lse);
  if ((threadIdx.x & 127) == 0) p.lse[rr.t * p.lse_s0 + static_cast<int64_t>(rr.h) * p.lse_s1] = lse;
  const float v[4] = {acc.x * f, acc.y * f, acc.z * f, acc.w * f};
  const int64_t e = static_cast<int64_t>(rr.t) * p.out_s0 + static_cast<int64_t>(rr.h) * p.out_s1 + d0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (p.out_bf16)
      static_cast<uint16_t*>(p.out)[e + i] = float_to_bf16(v[i]);
    else
      static_cast<float*>(p.out)[e + i] = v[i];
  }
}

}  // namespace mla_decode
}  // namespace gpu
}  // namespace dsa
