// Top-k selection (SPEC §3.5) and index mapping (SPEC §3.6).
#pragma once
#include <cstddef>
#include <cstdint>

#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

// For each row i, the k best of logits[i, 0:lengths[i]].
//  * lengths[i] <= k: indices 0 .. lengths[i]-1, then -1 (every key is selected; no scoring
//    result is read).
//  * otherwise the k largest values; ties at the k-th value go to the lower index; NaN ranks
//    below every number (-inf included).
//  * Output order: ascending index within each row (deterministic on every backend), then
//    -1 padding. values (optional, f32) holds logits[i, indices[i, j]] (bf16 widened) and
//    -inf at -1 entries.
//  NaN logits are never chosen over a number: a NaN is selected only when fewer than k
//  numbers are in the row (then the lowest-index NaNs fill the rest, like any tie).
// k must be a positive multiple of 64 (up to 16384 is supported); lengths[i] <= W.
struct TopkParams {
  TensorDesc logits;   // [M, W] f32 or bf16, last dim contiguous (bf16 ranks as its exact f32 value)
  TensorDesc lengths;  // [M] i32
  int64_t k = 2048;
  TensorDesc indices;  // [M, k] i32
  TensorDesc values;   // optional [M, k] f32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
// Scratch the op needs for these params: on the CPU 8 bytes per logits column for each of
// min(M, hardware threads) row slots (0 when W <= k: such rows read no score; given less, but
// at least one slot, it runs on fewer threads); on CUDA 0 unless rows may be split over
// several blocks (W > 131072, or W >= 2 * max(4k, 16384) when few rows leave SMs idle): then
// 8 bytes per k slots of each such block (a bound: max(M * ceil(W / 131072),
// min(2 * SMs, M * segments allowed))), plus 256. Non-decreasing in M and W.
size_t topk_workspace_size(const TopkParams& p);
Status topk(const TopkParams& p);

// Map request-local key positions to cache addresses. Row i belongs to sequence
// row_seq[i] when row_seq is given, else to sequence i / rows_per_seq.
//   Flat:  out = kv_start[b] + j.
//   Paged: out = block_table[b][j / page_size] * page_size + j % page_size.
// Entries < 0 stay -1; j past the block table (j >= max_blocks * page_size) or a negative
// block-table entry give -1 too (an invalid index, SPEC §5). out may alias indices.
// For host tensors, an address that does not fit int32 (kv_start[b] + j, or
// block * page_size + j % page_size) is kInvalidArgument, and so is a block-table entry the
// indices use that is >= num_blocks when num_blocks > 0 (the cache the addresses are for).
// On CUDA such addresses give -1.
enum class IndexMapKind : int32_t { kFlat = 0, kPaged = 1 };
struct MapIndicesParams {
  TensorDesc indices;      // [M, k] i32, last dim contiguous
  TensorDesc row_seq;      // optional [M] i32
  int64_t rows_per_seq = 1;
  IndexMapKind kind = IndexMapKind::kFlat;
  TensorDesc kv_start;     // flat: [B] i32
  TensorDesc block_table;  // paged: [B, max_blocks] i32
  int64_t page_size = 64;
  int64_t num_blocks = 0;  // paged: the cache's page count, to check the table against (0: unchecked)
  TensorDesc out;          // [M, k] i32
  void* stream = nullptr;
};
Status map_indices(const MapIndicesParams& p);

}  // namespace dsa
