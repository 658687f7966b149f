// The lightning indexer (SPEC §3): preparation of q and k, and the FP8 logits.
#pragma once
#include <cstdint>

#include "dsa/cache.h"
#include "dsa/geometry.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

// Per-group FP8 quantisation (SPEC §3.3): each run of `group` values along the last dim gets
// s = ue8m0_scale(amax) and x8 = e4m3(clamp(x / s, ±448)). Inputs are rounded to BF16 first.
struct QuantizeFp8Params {
  TensorDesc x;      // [R, D] f32 or bf16, last dim contiguous; D % group == 0
  TensorDesc out;    // [R, D] e4m3
  TensorDesc scale;  // [R, D / group] f32
  int64_t group = 128;
  void* stream = nullptr;
};
Status quantize_fp8(const QuantizeFp8Params& p);

// RoPE tables: cos_sin [max_positions, 64] f32 = [cos 32 | sin 32] per position (the
// convention of vLLM's cos_sin_cache); the model's own frequencies (YaRN and all) live there.
// Pair i (i < 32) of a 64-dim rope part rotates by (cos[i], sin[i]).

// Indexer queries: RoPE on dims 0..63 → optional Hadamard-128 → BF16 → FP8 with one scale per
// (token, head); the scale is folded into the gate:
//   weights_out[t, h] = fl(weights[t, h] * c) * s_q[t, h],  c = fl(1 / sqrt(128 * H_idx)).
struct PrepareIndexerQParams {
  TensorDesc q;            // [T, H_idx, 128] f32 or bf16, last dim contiguous
  TensorDesc weights;      // [T, H_idx] f32 or bf16: the per-head gate w
  TensorDesc positions;    // [T] i32 or i64
  TensorDesc cos_sin;      // [max_positions, 64] f32
  RopeStyle rope = RopeStyle::kHalfSplit;
  bool hadamard = false;
  TensorDesc q_out;        // [T, H_idx, 128] e4m3
  TensorDesc weights_out;  // [T, H_idx] f32: the folded gate w'
  TensorDesc q_scale;      // optional [T, H_idx] f32: s_q (already folded into weights_out)
  void* stream = nullptr;
};
Status prepare_indexer_q(const PrepareIndexerQParams& p);

// Indexer keys (after the model's LayerNorm): RoPE → optional Hadamard → BF16 → FP8, one
// scale per token. Feed the result to write_indexer_cache.
struct PrepareIndexerKParams {
  TensorDesc k;          // [T, 128] f32 or bf16, last dim contiguous
  TensorDesc positions;  // [T] i32 or i64
  TensorDesc cos_sin;    // [max_positions, 64] f32
  RopeStyle rope = RopeStyle::kHalfSplit;
  bool hadamard = false;
  TensorDesc k_out;      // [T, 128] e4m3
  TensorDesc k_scale;    // [T] f32
  void* stream = nullptr;
};
Status prepare_indexer_k(const PrepareIndexerKParams& p);

// Ragged prefill logits (SPEC §3.4) against a flat key buffer:
//   logits[i, c] = Σ_h weights[i, h] · relu(q[i, h] · k[j]) · k_scale[j],  j = ks[i] + col_offset + c
// for j < ke[i]; columns with j >= ke[i] hold -inf. Rows index keys [ks[i], ke[i]) of k, so a
// row of a sequence whose keys start at kv_start sees request-local column j - kv_start when
// ks[i] = kv_start. col_offset (>= 0) lets a caller compute one tile of columns at a time:
// keys past column W - 1 are simply not computed (a row may see more keys than W), and a tile
// is bit-identical to the same columns of an untiled call. Dot products accumulate in f32.
// logits may be bf16 (half the score memory): each value is the f32 result rounded to nearest
// even (-inf stays -inf), on every backend.
struct IndexerLogitsParams {
  TensorDesc q;        // [M, H_idx, 128] e4m3, last dim contiguous
  TensorDesc weights;  // [M, H_idx] f32 (folded gates w')
  TensorDesc k;        // [N, 128] e4m3, last dim contiguous
  TensorDesc k_scale;  // [N] f32
  TensorDesc ks;       // [M] i32, 0 <= ks[i] <= ke[i] <= N
  TensorDesc ke;       // [M] i32
  int64_t col_offset = 0;
  TensorDesc logits;   // [M, W] f32 or bf16, last dim contiguous
  void* stream = nullptr;
};
Status indexer_logits(const IndexerLogitsParams& p);

// Paged logits against the indexer K cache, for decode rows (next_n >= 1 tokens per sequence)
// and, through row_seq / row_len, for any rows (chunked prefill over a cached prefix).
//   Decode form: row r = b * next_n + i of sequence b sees keys j < L = kv_lens[b] - next_n + i + 1
//   (next_n <= kv_lens[b] <= max_blocks * page_size).
//   General form (row_seq and row_len given): row r belongs to sequence row_seq[r] and sees
//   keys j < row_len[r]; kv_lens and next_n are then unused.
// Key j of sequence b sits at slot block_table[b][j / page] * page + j % page.
// logits[r, c] = score of key j = col_offset + c; columns with j >= L hold -inf. Only the
// block-table entries of pages holding computed keys are read (they must be in [0, num_blocks)).
// skip_rows_up_to (>= 0; 0: off): rows whose L <= skip_rows_up_to are not computed: their logits
// rows are left as they were and none of their keys or block-table entries is read (pass topk
// when the logits only feed top-k, which reads no score of a row with L <= k).
struct IndexerLogitsPagedParams {
  TensorDesc q;            // [R, H_idx, 128] e4m3
  TensorDesc weights;      // [R, H_idx] f32
  IndexerCacheDesc cache;
  TensorDesc block_table;  // [B, max_blocks] i32
  TensorDesc kv_lens;      // [B] i32: tokens in the cache after this step (decode form)
  int64_t next_n = 1;      // decode form: R == B * next_n
  TensorDesc row_seq;      // optional [R] i32 (general form)
  TensorDesc row_len;      // optional [R] i32 (general form)
  int64_t col_offset = 0;
  int64_t skip_rows_up_to = 0;  // rows with L <= this are skipped (logits rows untouched)
  TensorDesc logits;       // [R, W] f32 or bf16, last dim contiguous
  void* stream = nullptr;
};
Status indexer_logits_paged(const IndexerLogitsPagedParams& p);

// Score and select in one pass (docs/fused_select.md): the paged logits of
// IndexerLogitsPagedParams (decode or general form, col_offset 0) and, per row, the top-k of
// SPEC §3.5 over them, without writing the [R, width] scores: each row keeps a bounded set of
// candidates (the best k so far and those above their threshold). The selection is the set the
// unfused path (indexer_logits_paged, then topk) gives on the same inputs, ties to the lower
// index; indices come in ascending order, then -1. Rows with L <= k get 0 .. L-1 and read no
// key. No values are returned (the step maps indices only).
// Backends: the CPU. On CUDA the call is kUnsupported (no fused kernel yet): use
// indexer_logits_paged + topk, which indexer_topk_available() lets a caller decide up front.
struct IndexerTopkParams {
  TensorDesc q;            // [R, H_idx, 128] e4m3
  TensorDesc weights;      // [R, H_idx] f32 (folded gates w')
  IndexerCacheDesc cache;
  TensorDesc block_table;  // [B, max_blocks] i32
  TensorDesc kv_lens;      // [B] i32 (decode form)
  int64_t next_n = 1;      // decode form: R == B * next_n
  TensorDesc row_seq;      // optional [R] i32 (general form)
  TensorDesc row_len;      // optional [R] i32 (general form)
  int64_t width = 0;       // a bound on every row's key count L (sizes the workspace)
  int64_t k = 2048;        // a positive multiple of 64 up to 16384
  TensorDesc indices;      // [R, k] i32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
// Scratch for these params (exact; the op needs all of it): on the CPU, per worker slot
// (at most the hardware threads) 17 buffers of 2k + 64 eight-byte candidates (16 rows and a
// copy), and, when few rows leave threads idle and rows are split into key segments, k
// candidates per (row, segment). Non-decreasing in R and width; 0 when width <= k and for
// malformed params or a device without the kernel.
size_t indexer_topk_workspace_size(const IndexerTopkParams& p);
Status indexer_topk(const IndexerTopkParams& p);
// Whether a device type has the fused kernel (the planner's and the step's choice).
bool indexer_topk_available(DeviceType device);

}  // namespace dsa
