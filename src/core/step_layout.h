// The workspace layout of a layer step, shared by the planner (over a counting arena, to size
// it) and the step (over the caller's workspace, to carve it): one code path, so the bytes a
// step takes are exactly the bytes the plan reserved.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "dsa/planner.h"
#include "dsa/types.h"

namespace dsa {
namespace core {

// Score rows are padded to a multiple of this many floats (256 B: aligned row starts).
constexpr int64_t kScoreRowAlign = 64;
inline int64_t score_stride(int64_t width) {
  return (width + kScoreRowAlign - 1) / kScoreRowAlign * kScoreRowAlign;
}

// Backend scratch of top-k over logits [rows, width] (row stride `stride`), for `dev`.
size_t topk_scratch_bytes(Device dev, int64_t rows, int64_t width, int64_t stride, int64_t k,
                          bool values);

// An untiled scoring chunk: rows x width scores, top-k scratch, selected and mapped indices.
struct ChunkLayout {
  float* scores = nullptr;  // [rows, stride]
  int64_t stride = 0;
  void* topk_ws = nullptr;
  size_t topk_ws_bytes = 0;
  int32_t* idx = nullptr;     // [rows, k] request-local selection
  int32_t* mapped = nullptr;  // [rows, k] cache slots
};
bool layout_chunk(Arena& a, Device dev, int64_t rows, int64_t width, int64_t k, ChunkLayout* out,
                  std::vector<PlanBuffer>* names = nullptr);

// A fused chunk: the indexer_topk workspace, selected and mapped indices.
struct FusedLayout {
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int32_t* idx = nullptr;     // [rows, k]
  int32_t* mapped = nullptr;  // [rows, k]
};
size_t fused_scratch_bytes(Device dev, int64_t rows, int64_t width, int64_t k);
bool layout_fused(Arena& a, Device dev, int64_t rows, int64_t width, int64_t k, FusedLayout* out,
                  std::vector<PlanBuffer>* names = nullptr);

// One row scored in tiles of tile_width keys, partial top-k merged in two candidate rows.
struct TiledLayout {
  float* scores = nullptr;  // [1, tile_width]
  void* topk_ws = nullptr;
  size_t topk_ws_bytes = 0;
  int32_t* cand_idx[2] = {nullptr, nullptr};  // [1, 2k]: running best | this tile's best
  float* cand_val[2] = {nullptr, nullptr};
  int32_t* pos = nullptr;          // [1, k] positions chosen in a candidate row
  int32_t* tile_offset = nullptr;  // [max_tiles] first key of each tile
  int32_t* tile_len = nullptr;     // [max_tiles] valid keys of each tile
  int32_t* merge_len = nullptr;    // [max_tiles] k + tile_len
  int32_t* idx = nullptr;          // [1, k]
  int32_t* mapped = nullptr;       // [1, k]
};
bool layout_tiled(Arena& a, Device dev, int64_t tile_width, int64_t max_tiles, int64_t k,
                  TiledLayout* out, std::vector<PlanBuffer>* names = nullptr);

// A shared layer's chunk: only the mapped indices.
bool layout_shared(Arena& a, int64_t rows, int64_t k, int32_t** mapped);

// The whole arena of a step.
struct StepLayout {
  uint8_t* index_q = nullptr;      // [max_rows, H_idx, 128] e4m3
  float* index_w = nullptr;        // [max_rows, H_idx] folded gates
  uint8_t* index_k = nullptr;      // [max_rows, 128] e4m3
  float* index_k_scale = nullptr;  // [max_rows]
  int32_t* row_seq = nullptr;      // [max_rows]
  int32_t* row_len = nullptr;      // [max_rows]
  int32_t* token_pos = nullptr;    // [max_rows]
  int32_t* kv_lens = nullptr;      // [max_seqs]
  int32_t* dense_cu = nullptr;     // [2 * max_seqs + 1]: cu_seqlens of each dense run
  void* attn_ws = nullptr;
  int64_t attn_ws_bytes = 0;
  void* score = nullptr;           // the score region
  int64_t score_bytes = 0;
  // Core-mode plans: absorbed queries [max_rows, H, 576] and latent outputs [max_rows, H, 512],
  // in core_dtype (bf16 on CUDA, f32 on the CPU); null otherwise.
  void* core_q = nullptr;
  void* core_out = nullptr;
  DType core_dtype = DType::kF32;
};
// The element type of the core-mode regions on `dev`: what the absorbed kernels read there.
inline DType core_region_dtype(Device dev) { return dev.type == DeviceType::kCPU ? DType::kF32 : DType::kBF16; }
bool layout_step(Arena& a, const Plan& plan, StepLayout* out, std::vector<PlanBuffer>* names = nullptr);

// The host staging of an Attention object, in i32 words (pinned memory on CUDA). Every upload
// of one step reads its own region, written once per step and never rewritten while the step's
// copies may be pending (or, under graph capture, while the graph replays them):
//   tile_table: [3 * max(max_tiles, 1)] filled at construction: tile offsets i * tile_width,
//               full tile lengths tile_width, full merge lengths topk + min(tile_width, topk).
//   per slot:   row_seq [max_rows] | row_len [max_rows] | token_pos [max_rows] |
//               kv_lens [max_seqs] | dense_cu [2 * max_seqs + 1] (one region per dense run) |
//               tile_last [2 * max_rows] (last tile's length and merge length, per tiled row).
// CUDA keeps two slots, used by alternate steps, so the host may prepare one step while the
// previous one's copies are still queued.
struct HostStaging {
  int64_t tile_table = 0, tile_words = 0;
  int64_t slot_begin = 0, slot_words = 0;
  int64_t row_seq = 0, row_len = 0, token_pos = 0, kv_lens = 0, dense_cu = 0, tile_last = 0;  // in a slot
  int slots = 1;
  int64_t total_words() const { return slot_begin + slots * slot_words; }
};
HostStaging host_staging(const Plan& plan);

}  // namespace core
}  // namespace dsa
