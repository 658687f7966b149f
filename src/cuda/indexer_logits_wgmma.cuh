// Hopper (sm_90a) kernel of the indexer logits family: FP8 e4m3 wgmma, keys by TMA.
//
// Layout: keys are the M side of wgmma (A = 64 keys x 128 dims, K-major, 128-byte swizzle,
// one TMA box per tile: a row range of the flat key buffer, or one page of the paged cache),
// the row block's queries the N side (B = kRows rows x kHeads heads = kN <= 256 columns x 128
// dims, K-major, swizzled by hand into shared memory once per work item). A tile is 4 k32
// steps of m64nkNk32. Accumulator element i of a thread holds key 16 * warp + lane / 4 +
// 8 * ((i / 2) % 2) and column 8 * (i / 4) + 2 * (lane % 4) + i % 2 = row * kHeads + head, so
// the epilogue (relu, gate FMA over heads) runs in-thread over kHeads / 4 heads, then a
// transposing reduction over the 4 lanes of a quad (3 * 2 * kRows / 4 shuffles), times the
// key scale.
//
// Warp roles (128 x (1 + kCons) threads): warpgroup 0 = producer (one thread issues TMA into a
// ring guarded by full/empty mbarriers: per stage a key tile and its 64 scales, so no consumer
// ever waits on a global load), warpgroups 1..kCons = consumers taking the key tiles in turn
// (tile g to consumer g % kCons), so one's epilogue overlaps the others' MMA. setmaxnreg moves
// registers to the consumers. kCons = 2: blocks up to N = 256 columns, 224 registers a
// consumer; kCons = 4: 112 registers and 64 accumulators a consumer (a 256-column block is two
// column halves, a pair of consumers per key tile), four consumer warps on each SM
// sub-partition to hide the epilogue's latency (issue 10, round 5).
//
// Work: items (row block, key chunk), strided over a persistent grid. Within an item, the
// rows are taken in "passes" of rows sharing one sequence (paged general form; flat rows and
// decode blocks are one pass); a pass streams the key tiles of [min lo, max hi) of its rows
// within the chunk, each tile once for all its rows and heads. Columns a row does not see
// (outside [lo, hi)) are written -inf by warps 1-3 of the producer warpgroup (idle otherwise:
// rows strided over the grid, concurrently with the MMA work; a separate pass only when no
// tile is computed); the consumers write exactly the valid columns (-inf for keys on
// unresolvable pages). Every data-dependent index is clamped as in the mma.sync kernels.
#pragma once
#include <math_constants.h>

#include "cuda/hopper/hopper.cuh"
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace logits_wg {

// ---- configuration -------------------------------------------------------------------------
constexpr int kTileKeys = 64;                 // keys per tile (wgmma M), = the page size served
constexpr int kD = 128;                       // index dim (bytes per e4m3 key)
constexpr int kTileBytes = kTileKeys * kD;    // 8192
constexpr int kStages = 12;                   // TMA ring depth (96 KiB)
constexpr int kProducerRegs = 56;
constexpr int kConsumerRegs = 224;  // 128 * 56 + 256 * 224 = 64512 = 168 * 384, the CTA's registers at launch (kCons = 2)
constexpr int kMaxN = 256;                    // wgmma N limit: kRows * kHeads
// Decode blocks of N <= 64 columns run two CTAs per SM (kCtas = 2): their consumers are bound
// by the latency of one tile's chain (full wait, 4 wgmma, wait, epilogue, release), not by the
// tensor cores or the ring, so twice the consumer warpgroups per SM stream twice the tiles.
// Each CTA then has a 10-stage ring (20 per SM) and 80 registers a thread at launch (ptxas
// spills 36-240 bytes a thread at that budget, whatever the setmaxnreg split; 56 / 80 spilled
// least over the instantiations).
constexpr int stages_of(int ctas) { return ctas == 1 ? kStages : 10; }
constexpr int producer_regs(int ctas) { return ctas == 1 ? kProducerRegs : 56; }
constexpr int consumer_regs(int ctas) { return ctas == 1 ? kConsumerRegs : 80; }
constexpr int kDecodeMaxN2 = 64;              // widest decode block that runs 2 CTAs per SM
// Four consumer warpgroups (kCons = 4, one CTA per SM): 640 threads start at 96 registers
// (65536 / 640, rounded down to the allocation unit); the producer gives back to 32 and each
// consumer takes 112: 128 * 32 + 512 * 112 = 61440 = 96 * 640. 16-stage ring (128 KiB): each
// consumer holds one stage while it works, the other 12 are in flight.
constexpr int kMaxN4 = 128;                   // widest MMA of a consumer of the four-consumer form
// A four-consumer block of 256 columns is two column halves: consumers 2p and 2p + 1 take the
// same key tile (halves 0 and 1 of the block's columns, 64 accumulators each), pairs p = 0, 1
// take alternate tiles; so each key tile is read from L2 once per 256 columns, as in the
// two-consumer forms (ncu, round 5: the 128-column blocks' consumers waited on their tiles).
constexpr int halves4_of(int n) { return n > kMaxN4 ? 2 : 1; }
constexpr int threads_of(int cons) { return 128 * (1 + cons); }
constexpr int stages_of(int ctas, int cons) { return cons == 4 ? 16 : stages_of(ctas); }
// The paged four-consumer forms split 64 / 104 instead (128 * 64 + 512 * 104 = 61440): their
// producer reads the block table 32 pages at a time and its idle warps resolve rows through
// it, which at 32 registers spilled 124-224 bytes a thread (ptxas; none at 64). Their
// consumers need no more than 104: no gates in registers, and 32-64 accumulators (round 10).
constexpr int producer_regs(int ctas, int cons, bool paged) { return cons == 4 ? (paged ? 64 : 32) : producer_regs(ctas); }
constexpr int consumer_regs(int ctas, int cons, bool paged) { return cons == 4 ? (paged ? 104 : 112) : consumer_regs(ctas); }
// Rows of a four-consumer block of `heads` heads: N = 256 columns (two halves), 128 at 16 heads
// (16 rows spill, as in prefill_rows).
constexpr int rows4_of(int heads) { return heads == 16 ? 8 : 2 * kMaxN4 / heads; }
// Rows of a prefill-shaped block: N = 256 columns, except 16 heads: 8 rows, N = 128 (16 rows
// spill in the paged instantiation; 16 heads is not a model's shape).
constexpr int prefill_rows(int heads) { return heads == 16 ? 8 : kMaxN / heads; }

struct RowInfo {
  int64_t base;  // column c of the row is key j = base + c
  int64_t lo, hi;  // valid keys [lo, hi), clipped to the computed columns; lo == hi == 0 when none
  int32_t seq;   // sequence (paged) or 0 (flat); rows of one pass share it
  int32_t pad;
};

struct Args {
  const uint8_t* q; int64_t q0, q1;
  const float* w; int64_t w0, w1;
  void* out; int64_t out0; bool out_bf16;  // f32 or bf16 logits (round to nearest even)
  int64_t rows, width, heads, col_offset;
  int64_t rows_per_block, row_blocks;
  int64_t tiles;                 // key tiles of the key space (flat: ceil(N / 64); paged: max_blocks)
  int64_t chunk_tiles, chunks;   // key chunks of a row block
  int64_t items;                 // row_blocks * chunks (< 2^31: plan_chunks; the kernel counts items in int32)
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ RowInfo clip_row(int64_t base, int64_t lo, int64_t hi, int32_t seq) {
  RowInfo ri;
  ri.base = base;
  ri.seq = seq;
  ri.pad = 0;
  if (hi > lo) {
    ri.lo = lo;
    ri.hi = hi;
  } else {
    ri.lo = ri.hi = 0;
  }
  return ri;
}

// Flat key buffer (SPEC §3.4 ragged rows): row r sees keys [max(ks, 0), min(ke, N)), column c
// is key ks + col_offset + c (c in [0, W)).
struct FlatKeys {
  static constexpr bool kBlockTable = false;  // every tile resolves; no page ids to read
  I32Vec ks, ke;
  int64_t n;

  __device__ RowInfo row(int64_t r, int64_t col_offset, int64_t width) const {
    const int64_t s = ks[r], e = ke[r];
    const int64_t base = s + col_offset;
    const int64_t lo = imax(imax(s, 0), base);
    const int64_t hi = imin(imin(e, n), base + width);
    return clip_row(base, lo, hi, 0);
  }
  // The tile's page (flat: always resolvable).
  __device__ bool tile_block(int32_t, int64_t, int64_t* blk) const {
    *blk = 0;
    return true;
  }
  // Keys of tile t (rows past N are zero-filled) and their 64 scales (zero past N).
  __device__ void load(void* keys_dst, void* scales_dst, const CUtensorMap* kmap, const CUtensorMap* smap, int64_t t,
                       int64_t, uint64_t* bar) const {
    hopper::tma_load_2d(keys_dst, kmap, 0, static_cast<int32_t>(t * kTileKeys), bar);
    hopper::tma_load_1d(scales_dst, smap, static_cast<int32_t>(t * kTileKeys), bar);
  }
};

// The paged indexer cache (SPEC §4), page size 64: tile t of sequence b is page
// block_table[b][t]; its 64 keys (128 B each) then their 64 f32 scales.
struct PagedKeys {
  static constexpr bool kBlockTable = true;
  const uint8_t* cache; int64_t block_bytes, num_blocks;
  I32Mat block_table;
  I32Vec kv_lens; int64_t next_n;
  I32Vec row_seq, row_len; bool general;

  __device__ RowInfo row(int64_t r, int64_t col_offset, int64_t width) const {
    int64_t seq, len;
    if (general) {
      seq = row_seq[r];
      len = row_len[r];
    } else {
      seq = r / next_n;
      len = static_cast<int64_t>(kv_lens[seq]) - next_n + (r % next_n) + 1;
    }
    if (seq < 0 || seq >= block_table.rows) return clip_row(col_offset, 0, 0, -1);
    const int64_t cap = block_table.cols * kTileKeys;
    const int64_t hi = imin(imin(len, cap), col_offset + width);
    return clip_row(col_offset, col_offset, hi, static_cast<int32_t>(seq));
  }
  __device__ bool tile_block(int32_t seq, int64_t t, int64_t* blk) const {
    const int64_t b = block_table.at(seq, t);
    *blk = b;
    return b >= 0 && b < num_blocks;
  }
  // The page's 64 keys and, from the same page, their 64 scales.
  __device__ void load(void* keys_dst, void* scales_dst, const CUtensorMap* kmap, const CUtensorMap* smap, int64_t,
                       int64_t blk, uint64_t* bar) const {
    hopper::tma_load_3d(keys_dst, kmap, 0, 0, static_cast<int32_t>(blk), bar);
    hopper::tma_load_2d(scales_dst, smap, 0, static_cast<int32_t>(blk), bar);
  }
};

// Calls f(seq, row_mask, t0, t1) for every pass of one work item (rows sharing one sequence;
// key tiles [t0, t1) of the item's chunk, t0 < t1), in the one order that the producer and the
// consumers follow. get(i) is the RowInfo of the item's row i (< nrows). Tile indices fit int32
// (the launchers serve at most 2^31 - 1 keys, and block tables of int32 columns).
template <class GetRow, class F>
__device__ __forceinline__ void item_passes(const Args& a, int nrows, int64_t chunk, const GetRow& get, const F& f) {
  const int64_t c_lo = chunk * a.chunk_tiles;
  const int64_t c_hi = imin(c_lo + a.chunk_tiles, a.tiles);
  uint32_t done = 0;
  for (int i = 0; i < nrows; ++i) {
    if ((done >> i) & 1u) continue;
    const int32_t seq = get(i).seq;
    int64_t lo = 0, hi = 0;
    bool any = false;
    uint32_t mask = 0;
    for (int k = i; k < nrows; ++k) {
      if ((done >> k) & 1u) continue;
      const RowInfo ri = get(k);
      if (ri.seq != seq) continue;
      mask |= 1u << k;
      if (ri.hi > ri.lo) {
        lo = any ? imin(lo, ri.lo) : ri.lo;
        hi = any ? imax(hi, ri.hi) : ri.hi;
        any = true;
      }
    }
    done |= mask;
    if (!any) continue;
    const int64_t t0 = imax(lo / kTileKeys, c_lo);
    const int64_t t1 = imin((hi + kTileKeys - 1) / kTileKeys, c_hi);
    if (t0 < t1) f(seq, mask, static_cast<int32_t>(t0), static_cast<int32_t>(t1));
  }
}

// Where a consumer stores one row's logits: key j in [lo, hi) goes to element off + j of the
// output (off = row * out0 - base). Keys and tile indices fit int32 (see item_passes); int32
// keeps the consumers' stores inside their register budget.
struct RowOut {
  int64_t off;
  int32_t lo, hi;  // lo == hi when the row is not computed
};

__device__ __forceinline__ RowOut row_out(const Args& a, int64_t r, const RowInfo& ri) {
  RowOut ro;
  ro.off = r * a.out0 - ri.base;
  ro.lo = static_cast<int32_t>(ri.lo);
  ro.hi = static_cast<int32_t>(ri.hi);
  return ro;
}

// One pass of a work item as the consumers read it from shared memory (item_passes).
struct Pass {
  int32_t t0, t1;  // key tiles [t0, t1)
  uint32_t mask;   // the item's rows of the pass
};

// Output element i (f32, or bf16 rounded to nearest even).
__device__ __forceinline__ void store_logit_at(const Args& a, int64_t i, float v) {
  if (a.out_bf16) static_cast<uint16_t*>(a.out)[i] = float_to_bf16(v);
  else static_cast<float*>(a.out)[i] = v;
}
__device__ __forceinline__ void store_logit(const Args& a, int64_t r, int64_t c, float v) { store_logit_at(a, r * a.out0 + c, v); }

// -inf at the columns of row r outside its valid keys [lo, hi) (all columns when none), by
// threads t of nt. The main kernel writes exactly the other columns, so the two never overlap.
template <class Keys>
__device__ __forceinline__ void fill_invalid_row(const Args& a, const Keys& keys, int64_t r, int t, int nt) {
  const RowInfo ri = keys.row(r, a.col_offset, a.width);
  int64_t vlo = a.width, vhi = a.width;
  if (ri.hi > ri.lo) {
    vlo = ri.lo - ri.base;
    vhi = ri.hi - ri.base;
  }
  for (int64_t c = t; c < vlo; c += nt) store_logit(a, r, c, -CUDART_INF_F);
  for (int64_t c = vhi + t; c < a.width; c += nt) store_logit(a, r, c, -CUDART_INF_F);
}

// All consumer warpgroups (named barrier 1).
template <int kCons>
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kCons) : "memory");
}
// Pingpong turns of the overlap variant: named barrier 2 + c is "consumer warpgroup c may issue
// its next tile's MMA"; the other warpgroup arrives on it (128 threads) after issuing its own,
// warpgroup c syncs on it (128 threads).
__device__ __forceinline__ void turn_wait(uint32_t c) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(2u + c) : "memory");
}
__device__ __forceinline__ void turn_pass(uint32_t c) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(3u - c) : "memory");
}

// One tile's state that its epilogue needs (the overlap variant runs a tile's second half
// while the next tile is in flight, so it keeps this across tiles).
struct TileState {
  int32_t t;       // key tile
  uint32_t mask;   // rows of the pass
  bool ok;         // page resolvable (else -inf)
  float sc0, sc1;  // scales of this thread's two keys
};

// Epilogue of rows [kR0, kR0 + kNR) of a row block: acc holds exactly those rows' columns
// (fragment column 0 = row kR0, head 0). Per row: Σ_h w_h relu(acc) over this thread's heads,
// a transposing reduction over the quad, then store(row, half, sum) (half: key0 or key0 + 8).
// gate(gi) is this thread's two gates of 8-column group gi (columns 8 gi + 2 quad, + 1).
template <int kHeads, int kR0, int kNR, int R, class Gate, class Store>
__device__ __forceinline__ void epilogue_rows(const float (&acc)[R], const Gate& gate, const Store& store, int quad) {
  constexpr int kGpr = kHeads / 8;  // 8-column groups per row
  static_assert(R == kNR * kHeads / 2, "accumulator of the row range");
  // Rows in groups of kGroup (<= 4) to bound the live partial sums.
  constexpr int kGroup = kNR < 4 ? kNR : 4;
#pragma unroll
  for (int r0 = kR0; r0 < kR0 + kNR; r0 += kGroup) {
    // part[v], v = (rr - r0) * 2 + half: Σ over this thread's heads of w * relu(dot).
    constexpr int V = 2 * kGroup;
    float part[V];
#pragma unroll
    for (int v = 0; v < V; ++v) part[v] = 0.f;
#pragma unroll
    for (int gi = r0 * kGpr; gi < (r0 + kGroup) * kGpr; ++gi) {
      const int rl = gi / kGpr - r0;
      const int li = gi - kR0 * kGpr;  // the group's index in acc
      const float2 wv = gate(gi);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float p = part[rl * 2 + hf];
        p = fmaf(wv.x, fmaxf(acc[4 * li + 2 * hf], 0.f), p);
        p = fmaf(wv.y, fmaxf(acc[4 * li + 2 * hf + 1], 0.f), p);
        part[rl * 2 + hf] = p;
      }
    }
    if constexpr (V >= 4) {
      // Transposing reduction over the quad: lane (b1, b0) = (quad / 2, quad % 2)
      // ends with the full sums of v = b1 * V / 2 + b0 * V / 4 + k, k < V / 4.
      const bool b1 = (quad & 2) != 0, b0 = (quad & 1) != 0;
      float q1[V / 2];
#pragma unroll
      for (int k = 0; k < V / 2; ++k) {
        const float send = b1 ? part[k] : part[k + V / 2];
        const float keep = b1 ? part[k + V / 2] : part[k];
        q1[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
      }
#pragma unroll
      for (int k = 0; k < V / 4; ++k) {
        const float send = b0 ? q1[k] : q1[k + V / 4];
        const float keep = b0 ? q1[k + V / 4] : q1[k];
        const float sum = keep + __shfl_xor_sync(0xffffffffu, send, 1);
        const int v = (b1 ? V / 2 : 0) + (b0 ? V / 4 : 0) + k;
        store(r0 + (v >> 1), v & 1, sum);
      }
    } else {  // one row: two values; lanes 0 and 1 of each quad store
#pragma unroll
      for (int v = 0; v < V; ++v) {
        part[v] += __shfl_xor_sync(0xffffffffu, part[v], 1);
        part[v] += __shfl_xor_sync(0xffffffffu, part[v], 2);
      }
      if (quad < 2) store(r0, quad, quad == 0 ? part[0] : part[1]);
    }
  }
}

// Shared memory of one CTA (offsets from a 1024-aligned base).
template <int kN, int kRows, int kStagesN = kStages>
struct Smem {
  static constexpr int kTiles = 0;
  static constexpr int kScales = kTiles + kStagesN * kTileBytes;  // kStagesN x 64 f32
  // q is a 128-byte-swizzled wgmma operand: 1024-aligned (10 stages' scales end off it).
  static constexpr int kQ = (kScales + kStagesN * kTileKeys * 4 + 1023) / 1024 * 1024;
  static constexpr int kW = kQ + kN * kD;
  static constexpr int kRowsOff = kW + kN * 4;
  static constexpr int kPasses = kRowsOff + kRows * static_cast<int>(sizeof(RowOut));  // kRows Pass, then their count
  static constexpr int kStageOk = kPasses + (kRows + 1) * static_cast<int>(sizeof(Pass));  // kStagesN u32
  static constexpr int kBars = (kStageOk + kStagesN * 4 + 7) / 8 * 8;
  static constexpr int kBytes = kBars + 2 * kStagesN * 8;
  static constexpr int kAlloc = kBytes + 1024;  // alignment slack of the dynamic base
  static_assert(kTiles % 1024 == 0 && kTileBytes % 1024 == 0 && kQ % 1024 == 0, "swizzled operands 1024-aligned");
};

// kEpilogue = false: the MMA-only measurement variant (no logits written; the bench hook
// DSA_CUDA_LOGITS=wgmma_mma_only), to report the epilogue's share of the time.
// kOverlap: the variant whose MMA of each tile is issued in two halves so that the epilogue
// overlaps the tensor cores (DSA_CUDA_LOGITS=wgmma_overlap; prefill row blocks).
// kCtas: CTAs per SM (2: decode blocks of N <= kDecodeMaxN2, see stages_of).
// kCons: consumer warpgroups (2, or 4 for blocks of N <= kMaxN4; see threads_of).
// kGateGroups: gate groups a consumer thread keeps in registers (an A/B hook; see half_gate).
// kSplitProducer: one issuing producer warp per consumer group instead of one for all (the
// decode blocks' default since round 6, docs/perf.md: a warp then waits only on its own
// group's stages, as each math warpgroup has its own copy warp in DeepGEMM's paged kernel).
template <class Keys, int kHeads, int kRows, bool kEpilogue, bool kOverlap = false, int kCtas = 1, int kCons = 2,
          int kGateGroups = 0, bool kSplitProducer = false>
__global__ void __launch_bounds__(threads_of(kCons), kCtas)
    logits_wgmma_kernel(const Args a, const Keys keys, const __grid_constant__ CUtensorMap kmap,
                        const __grid_constant__ CUtensorMap smap) {
#if DSA_HOPPER_DEVICE
  constexpr int kN = kHeads * kRows;
  static_assert(kN % 16 == 0 && kN <= kMaxN, "wgmma N");
  static_assert(kHeads % 8 == 0 && kRows <= 16, "row block");
  static_assert(!kOverlap || (kEpilogue && kRows % 2 == 0 && kN % 32 == 0), "overlap halves: whole rows, wgmma N");
  static_assert(kCtas == 1 || (kCtas == 2 && !kOverlap && kN <= kDecodeMaxN2), "two CTAs per SM: narrow decode blocks");
  static_assert(kCons == 2 || (kCons == 4 && kCtas == 1 && !kOverlap && (kN <= kMaxN4 || kN == 2 * kMaxN4)),
                "four consumers: N <= 128 or two halves of 128, one CTA");
  // Column halves per tile (1, or 2 for a 256-column four-consumer block) and their width.
  constexpr int kHalves = kCons == 4 ? halves4_of(kN) : 1;
  constexpr int kNW = kN / kHalves;
  constexpr int kGroups = kCons / kHalves;  // consumer groups taking tiles in turn
  constexpr int kStagesN = stages_of(kCtas, kCons);
  static_assert(!kSplitProducer || kStagesN % kGroups == 0, "a split producer's stages belong to one group each");
  constexpr int kConsThreads = 128 * kCons;
  using L = Smem<kN, kRows, kStagesN>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = hopper::smem_aligned<1024>(smem_raw);
  uint8_t* tiles = smem + L::kTiles;
  float* scales = reinterpret_cast<float*>(smem + L::kScales);
  uint8_t* qs = smem + L::kQ;
  float* ws = reinterpret_cast<float*>(smem + L::kW);
  RowOut* rows_s = reinterpret_cast<RowOut*>(smem + L::kRowsOff);
  Pass* pass_s = reinterpret_cast<Pass*>(smem + L::kPasses);
  int* npass_s = reinterpret_cast<int*>(pass_s + kRows);
  // Per stage: 1 when its page resolved (loaded), 0 when not (the consumer writes -inf). The
  // producer writes it before its arrival on the stage's full barrier (a release), so the
  // consumers read it after their wait; they never touch the block table.
  uint32_t* stage_ok = reinterpret_cast<uint32_t*>(smem + L::kStageOk);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* empty = full + kStagesN;

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so that the compiler knows the warpgroup index is warp-uniform: the
  // consumers' stage indices and wgmma descriptors derived from it then live in uniform
  // registers (before round 9 the H100 SASS rebuilt them in vector registers and moved them
  // with 16 R2UR a tile, about a quarter of the tile loop's 271 instructions; docs/perf.md).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (tid == 0) {
    for (int s = 0; s < kStagesN; ++s) {
      hopper::mbar_init(&full[s], 1);
      hopper::mbar_init(&empty[s], 4 * kHalves);  // one arrival per warp of the consuming warpgroup(s)
    }
    hopper::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    hopper::regs_decrease<producer_regs(kCtas, kCons, Keys::kBlockTable)>();
    // Issuing warps: warp 0 for every tile; kSplitProducer: warp w for the tiles of consumer
    // group w (tile g goes to group g % kGroups, so stage g % kStagesN has one owner).
    constexpr int kIssuers = kSplitProducer ? kGroups : 1;
    const int pw = tid / 32;
    if (pw >= kIssuers) {  // the other warps: the -inf columns of rows blockIdx.x + k * gridDim.x
      if constexpr (kEpilogue && kIssuers < 4)
        for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x)
          fill_invalid_row(a, keys, r, tid - 32 * kIssuers, 128 - 32 * kIssuers);
      return;
    }
    // An issuing warp: lane 0 issues the copies; the warp reads the block table 32 tiles at a
    // time (lane k the page of tile tb + k), so no copy waits on a dependent global load of its
    // page id (at ~0.5 us a load, one per 8.4 KB page, a producer moves at most ~17 GB/s; ncu on
    // the H200 showed the decode consumers waiting on their tiles, docs/perf.md round 5).
    const int lane = kSplitProducer ? tid % 32 : tid;  // (tid: the default forms' code as measured)
    auto mine = [&](uint32_t gk) { return !kSplitProducer || static_cast<int>(gk % kGroups) == pw; };
    if (lane == 0) {
      hopper::prefetch_tensor_map(&kmap);
      hopper::prefetch_tensor_map(&smap);
    }
    uint32_t g = 0;
    for (int32_t item = blockIdx.x; item < static_cast<int32_t>(a.items); item += gridDim.x) {
      const int32_t rb = item % static_cast<int32_t>(a.row_blocks), chunk = item / static_cast<int32_t>(a.row_blocks);
      const int64_t row0 = rb * a.rows_per_block;
      const int nrows = static_cast<int>(imin(a.rows_per_block, a.rows - row0));
      auto get = [&](int i) { return keys.row(row0 + i, a.col_offset, a.width); };
      item_passes(a, nrows, chunk, get, [&](int32_t seq, uint32_t, int32_t t0, int32_t t1) {
        if constexpr (!Keys::kBlockTable) {  // flat keys: lane 0 alone, nothing to look up
          if (lane == 0) {
            for (int32_t t = t0; t < t1; ++t, ++g) {
              if (!mine(g)) continue;
              const uint32_t s = g % kStagesN, ph = (g / kStagesN) & 1u;
              hopper::mbar_wait_or_trap(&empty[s], ph ^ 1u);
              stage_ok[s] = 1u;
              hopper::mbar_arrive_expect_tx(&full[s], kTileBytes + kTileKeys * 4);
              keys.load(tiles + s * kTileBytes, scales + s * kTileKeys, &kmap, &smap, t, 0, &full[s]);
            }
          }
        } else {
          for (int32_t tb = t0; tb < t1; tb += 32) {
            int64_t my_blk = 0;
            const bool my_ok = tb + lane < t1 && keys.tile_block(seq, tb + lane, &my_blk);
            const uint32_t ok_bits = __ballot_sync(0xffffffffu, my_ok);
            const int32_t nt = t1 - tb < 32 ? t1 - tb : 32;
            for (int32_t k = 0; k < nt; ++k) {
              // Page ids fit int32 (the launcher serves at most 2^31 - 1 pages).
              const int32_t blk = __shfl_sync(0xffffffffu, static_cast<int32_t>(my_blk), k);
              if (lane == 0 && mine(g)) {
                const uint32_t s = g % kStagesN, ph = (g / kStagesN) & 1u;
                hopper::mbar_wait_or_trap(&empty[s], ph ^ 1u);
                const bool ok = (ok_bits >> k) & 1u;
                stage_ok[s] = ok ? 1u : 0u;
                if (ok) {
                  hopper::mbar_arrive_expect_tx(&full[s], kTileBytes + kTileKeys * 4);
                  keys.load(tiles + s * kTileBytes, scales + s * kTileKeys, &kmap, &smap, tb + k, blk, &full[s]);
                } else {
                  hopper::mbar_arrive(&full[s]);  // nothing to load: the consumer writes -inf
                }
              }
              ++g;
            }
          }
        }
      });
    }
    if constexpr (kEpilogue && kIssuers == 4)  // no warp was left idle: the -inf columns after the copies
      for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) fill_invalid_row(a, keys, r, tid, 128);
    return;
  }

  // ---- consumers ----
  hopper::regs_increase<consumer_regs(kCtas, kCons, Keys::kBlockTable)>();
  const int ctid = tid - 128;          // 0..kConsThreads-1 over the consumer warpgroups
  const uint32_t cw = wg - 1;          // consumer warpgroup index
  // Group grp takes tiles g with g % kGroups == grp; within it, column half `half`.
  const uint32_t grp = cw / kHalves, half = cw % kHalves;
  const int warp = (tid / 32) % 4, lane = tid % 32, quad = lane & 3;
  // Stage s's key tile is this descriptor moved by s tiles (the ring is 1024-aligned).
  const uint64_t desc_tiles = hopper::smem_desc(tiles, hopper::Swizzle::k128B, 16, 1024);
  // q's columns of this warpgroup's half (kNW * 128 bytes per half: 1024-aligned).
  const uint64_t desc_b0 = hopper::desc_advance(hopper::smem_desc(qs, hopper::Swizzle::k128B, 16, 1024),
                                                static_cast<int>(half) * kNW * kD);
  // Default: one m64n(kNW) accumulator (kNW = kN, or kN / 2 for a four-consumer column half).
  // Overlap: two m64n(kN/2) halves (rows [0, kRows / 2) and the rest), the same registers.
  constexpr int kHalfN = kN / 2, kHalfRows = kRows / 2;
  float acc[kOverlap ? 1 : kNW / 2];
  float accA[kOverlap ? kHalfN / 2 : 1], accB[kOverlap ? kHalfN / 2 : 1];
  (void)accA; (void)accB;
  // Overlap: warpgroup 0 has the first turn (see turn_wait).
  if constexpr (kOverlap)
    if (cw == 1) turn_pass(1);
  uint32_t g = 0;
  for (int32_t item = blockIdx.x; item < static_cast<int32_t>(a.items); item += gridDim.x) {
    const int32_t rb = item % static_cast<int32_t>(a.row_blocks), chunk = item / static_cast<int32_t>(a.row_blocks);
    const int64_t row0 = static_cast<int64_t>(rb) * a.rows_per_block;
    const int nrows = static_cast<int>(imin(a.rows_per_block, a.rows - row0));
    consumer_sync<kCons>();  // every consumer is done with the previous item's q, weights, rows
    if (ctid < kRows) rows_s[ctid] = row_out(a, row0 + ctid, ctid < nrows ? keys.row(row0 + ctid, a.col_offset, a.width) : clip_row(0, 0, 0, -2));
    // The item's passes, once (the consumers then step through their own tiles only).
    if (ctid == kConsThreads - 1) {
      int np = 0;
      item_passes(a, nrows, chunk, [&](int i) { return keys.row(row0 + i, a.col_offset, a.width); },
                  [&](int32_t, uint32_t mask, int32_t t0, int32_t t1) { pass_s[np++] = Pass{t0, t1, mask}; });
      *npass_s = np;
    }
    // q (kN x 128 e4m3) in the 128-byte-swizzled K-major layout; zero for padded heads/rows.
    // cp.async, one copy in flight a thread at a time: no loaded value passes through registers.
    // Staged through registers, the loads in flight cost the gate-register forms 120 bytes of
    // spills a thread, and the addresses of an unrolled loop 20 more (ptxas, round 10).
#pragma unroll 1
    for (int e = ctid; e < kN * 8; e += kConsThreads) {
      const int n = e / 8, c = e % 8;
      const int rr = n / kHeads, h = n % kHeads;
      const bool in = rr < nrows && h < a.heads;
      const uint8_t* src = in ? a.q + (row0 + rr) * a.q0 + h * a.q1 + 16 * c : a.q;
      cp_async16(hopper::smem_addr(qs + n * kD + ((c ^ (n % 8)) * 16)), src, in ? 16 : 0);
    }
#pragma unroll 1
    for (int n = ctid; n < kN; n += kConsThreads) {
      const int rr = n / kHeads, h = n % kHeads;
      ws[n] = (rr < nrows && h < a.heads) ? a.w[(row0 + rr) * a.w0 + h * a.w1] : 0.f;
    }
    cp_async_commit();
    cp_async_wait<0>();
    hopper::fence_async_smem();  // q's writes (cp.async, generic proxy) feed wgmma
    consumer_sync<kCons>();
    // A thread's gates: 2 a column of each 8-column group of its column half (kNW / 8 groups).
    auto gate = [&](int gi) -> float2 { return *reinterpret_cast<const float2*>(&ws[8 * gi + 2 * quad]); };
    // kGateGroups > 0: the first kGateGroups groups in registers for the whole item, the rest
    // read per tile from shared memory (kGateGroups = 0: every group per tile). Each group read
    // per tile is one shared-memory wavefront a warp: in the four-consumer form 16 a tile beside
    // the 48 of the wgmma operand reads (ncu, round 9: the L1 pipe 71% busy at 47.6% of the
    // tensor pipe, DeepGEMM's 63% at 60.2%). That form holds all 16 by default since round 10,
    // when q's staging stopped passing through registers (ptxas: 16 bytes of spills, as with
    // none; 136 before). The 224-register two-consumer forms hold 16 of their 32 when asked.
    constexpr bool kGateRegs = kEpilogue && kGateGroups > 0;
    constexpr int kRegGroups = kGateRegs ? (kGateGroups < kNW / 8 ? kGateGroups : kNW / 8) : 1;
    float gr[2 * kRegGroups];
    if constexpr (kGateRegs) {
#pragma unroll
      for (int gi = 0; gi < kRegGroups; ++gi) {
        const float2 v = gate(gi + static_cast<int>(half) * (kNW / 8));
        gr[2 * gi] = v.x;
        gr[2 * gi + 1] = v.y;
      }
    }
    // Gate pair of 8-column group gi of this warpgroup's half.
    auto half_gate = [&](int gi) -> float2 {
      if constexpr (kGateRegs)
        if (gi < kRegGroups) return make_float2(gr[2 * gi], gr[2 * gi + 1]);
      return gate(gi + static_cast<int>(half) * (kNW / 8));
    };
    (void)gr;

    const int key0 = 16 * warp + lane / 4;  // this thread's keys in a tile: key0, key0 + 8
    // The valid columns of one tile's rows (store(row, half, sum); -inf on unresolvable pages).
    auto store_tile = [&](const TileState& ts, int rr, int hf, float sum) {
      // Flat items are one pass of all their rows (one sequence), so only paged passes filter.
      if (Keys::kBlockTable && !((ts.mask >> rr) & 1u)) return;
      const RowOut ro = rows_s[rr];
      const int32_t j = ts.t * kTileKeys + key0 + 8 * hf;
      if (j < ro.lo || j >= ro.hi) return;
      store_logit_at(a, ro.off + j, ts.ok ? sum * (hf ? ts.sc1 : ts.sc0) : -CUDART_INF_F);
    };
    auto release = [&](uint32_t s) {
      __syncwarp();
      if (lane == 0) hopper::mbar_arrive(&empty[s]);  // this warp no longer reads the stage
    };
    // The pass list read by lane 0 and broadcast (every lane reads the same words): tile counts
    // and stage indices stay warp-uniform (see wg).
    const int np = __shfl_sync(0xffffffffu, *npass_s, 0);
    for (int pi = 0; pi < np; ++pi) {
      const Pass ps = pass_s[pi];
      const int32_t t0 = __shfl_sync(0xffffffffu, ps.t0, 0);
      const int32_t n = __shfl_sync(0xffffffffu, ps.t1, 0) - t0;
      const uint32_t mask = __shfl_sync(0xffffffffu, ps.mask, 0);
      // Tile j of the pass is the item's g + j in the shared order: this warpgroup takes those
      // with (g + j) % kGroups == grp.
      for (int32_t j = static_cast<int32_t>((grp + kGroups - g % kGroups) % kGroups); j < n; j += kGroups) {
        const uint32_t gk = g + static_cast<uint32_t>(j);
        const int32_t t = t0 + j;
        const uint32_t s = gk % kStagesN, ph = (gk / kStagesN) & 1u;
        // A plain wait here (the bounded one costs the 128-accumulator variants spills): a
        // producer issuing more tiles than the consumers take traps on its empty-ring wait; the
        // reverse would hang, which the shared item_passes order rules out.
        hopper::mbar_wait(&full[s], ph);
        const bool ok = !Keys::kBlockTable || stage_ok[s] != 0;  // flat tiles always load
        TileState cur{t, mask, ok, 0.f, 0.f};  // scales read before the stage is released
        if (kEpilogue && ok) {
          cur.sc0 = scales[s * kTileKeys + key0];
          cur.sc1 = scales[s * kTileKeys + key0 + 8];
        }
        const uint64_t desc_a0 = hopper::desc_advance(desc_tiles, s * kTileBytes);
        if constexpr (!kOverlap) {
          {
            hopper::wgmma_fence();
#pragma unroll
            for (int k = 0; k < kD / 32; ++k)
              hopper::wgmma_e4m3_ss<kNW>(acc, hopper::desc_advance(desc_a0, 32 * k), hopper::desc_advance(desc_b0, 32 * k),
                                         k > 0 ? 1 : 0);
            hopper::wgmma_commit();
            hopper::wgmma_wait<0>();
            hopper::fence_regs(acc);
          }
          release(s);
          if constexpr (!kEpilogue) {
            // The MMA-only variant must still use every accumulator, or ptxas (which sees no
            // trace of the empty-asm fence in the PTX) drops the wgmma whose results are never
            // read: round 6's 2.6 PFLOP/s, one GMMA a tile in the SASS instead of four. A store
            // behind a condition that never holds (width >= 0, validated) keeps them all.
            if (a.width < 0)
#pragma unroll
              for (int i = 0; i < kNW / 2; ++i) store_logit_at(a, i, acc[i]);
          }
          if constexpr (kEpilogue)
            if constexpr (kHalves == 1) {
              epilogue_rows<kHeads, 0, kRows>(acc, half_gate, [&](int rr, int hf, float sum) { store_tile(cur, rr, hf, sum); },
                                              quad);
            } else {  // this half's rows [half * kRows / 2, ...) and gates (groups offset by kNW / 8)
              const int r_off = static_cast<int>(half) * (kRows / 2);
              epilogue_rows<kHeads, 0, kRows / 2>(
                  acc, half_gate,
                  [&](int rr, int hf, float sum) { store_tile(cur, rr + r_off, hf, sum); }, quad);
            }
        } else {
          // Two halves (rows [0, kRows / 2) and the rest), committed separately: half A's
          // epilogue runs while half B is on the tensor cores. The warpgroups issue their tiles
          // in turn (pingpong: a warpgroup issues after the other has issued its previous tile),
          // so the tensor cores take one warpgroup's tile after the other's and each
          // warpgroup's epilogue overlaps the other's MMA instead of both waiting in lockstep.
          // Every wgmma and wait is unconditional (ptxas serialises all wgmma of the kernel
          // when a wait sits in a divergent path, C7518): an unresolvable page's stage (not
          // loaded) is multiplied too, and store_tile writes -inf for it.
          turn_wait(cw);
          hopper::wgmma_fence();  // the accumulators were read by the previous tile's epilogue
#pragma unroll
          for (int k = 0; k < kD / 32; ++k)
            hopper::wgmma_e4m3_ss<kHalfN>(accA, hopper::desc_advance(desc_a0, 32 * k), hopper::desc_advance(desc_b0, 32 * k),
                                          k > 0 ? 1 : 0);
          hopper::wgmma_commit();
#pragma unroll
          for (int k = 0; k < kD / 32; ++k)
            hopper::wgmma_e4m3_ss<kHalfN>(accB, hopper::desc_advance(desc_a0, 32 * k),
                                          hopper::desc_advance(desc_b0, kHalfN * kD + 32 * k), k > 0 ? 1 : 0);
          hopper::wgmma_commit();
          turn_pass(cw);
          hopper::wgmma_wait<1>();  // half A done; half B may still run
          hopper::fence_regs(accA);
          epilogue_rows<kHeads, 0, kHalfRows>(accA, half_gate, [&](int rr, int hf, float sum) { store_tile(cur, rr, hf, sum); }, quad);
          hopper::wgmma_wait<0>();
          hopper::fence_regs(accB);
          release(s);
          epilogue_rows<kHeads, kHalfRows, kHalfRows>(accB, half_gate,
                                                      [&](int rr, int hf, float sum) { store_tile(cur, rr, hf, sum); }, quad);
        }
      }
      g += static_cast<uint32_t>(n);
    }
  }
  if constexpr (kOverlap) {
    // Turns pass once per tile (and once before the first): the warpgroup whose turn would be
    // next takes the one unconsumed pass, so no named barrier is left incomplete at exit.
    if ((g & 1u) == cw) turn_wait(cw);
  }
#else
  (void)a; (void)keys; (void)kmap; (void)smap;
  __trap();
#endif
}

// The standalone -inf pass, for calls with no key tiles to compute (the main kernel is not
// launched then; otherwise its idle producer warps do fill_invalid_row).
template <class Keys>
__global__ void logits_fill_invalid_kernel(const Args a, const Keys keys) {
  fill_invalid_row(a, keys, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
