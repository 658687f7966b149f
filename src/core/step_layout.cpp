#include "core/step_layout.h"

#include <algorithm>

#include "core/validate.h"
#include "dsa/indexer.h"
#include "dsa/topk.h"

namespace dsa {
namespace core {
namespace {

// A never-dereferenced, aligned, non-null address for descriptors used only in size queries.
void* fake_ptr() { return reinterpret_cast<void*>(static_cast<uintptr_t>(1) << 12); }

template <typename T>
bool take(Arena& a, int64_t n, T** out, std::vector<PlanBuffer>* names, const char* name,
          const char* what) {
  const int64_t before = a.used();
  *out = a.alloc_n<T>(n);
  if (names && *out) names->push_back(PlanBuffer{name, a.used() - before, what});
  return *out != nullptr;
}

bool take_bytes(Arena& a, int64_t n, void** out, std::vector<PlanBuffer>* names, const char* name,
                const char* what) {
  const int64_t before = a.used();
  *out = a.alloc(n);
  if (names && *out) names->push_back(PlanBuffer{name, a.used() - before, what});
  return *out != nullptr;
}

}  // namespace

size_t topk_scratch_bytes(Device dev, int64_t rows, int64_t width, int64_t stride, int64_t k,
                          bool values) {
  if (rows <= 0 || width <= 0) return 0;
  TopkParams p;
  p.logits = make_tensor(fake_ptr(), DType::kF32, {rows, width}, dev);
  p.logits.stride[0] = stride;
  p.lengths = make_tensor(fake_ptr(), DType::kI32, {rows}, dev);
  p.k = k;
  p.indices = make_tensor(fake_ptr(), DType::kI32, {rows, k}, dev);
  if (values) p.values = make_tensor(fake_ptr(), DType::kF32, {rows, k}, dev);
  return topk_workspace_size(p);
}

bool layout_chunk(Arena& a, Device dev, int64_t rows, int64_t width, int64_t k, ChunkLayout* o,
                  std::vector<PlanBuffer>* names) {
  o->stride = score_stride(width);
  o->topk_ws_bytes = topk_scratch_bytes(dev, rows, width, o->stride, k, false);
  return take(a, saturating_mul(rows, o->stride), &o->scores, names, "score_chunk",
              "f32 scores [rows, width] with rows padded to 64 floats") &&
         take_bytes(a, static_cast<int64_t>(o->topk_ws_bytes), &o->topk_ws, names, "topk_scratch",
                    "backend top-k workspace (topk_workspace_size)") &&
         take(a, saturating_mul(rows, k), &o->idx, names, "index_chunk", "i32 selected positions [rows, topk]") &&
         take(a, saturating_mul(rows, k), &o->mapped, names, "mapped_index_chunk", "i32 cache slots [rows, topk]");
}

size_t fused_scratch_bytes(Device dev, int64_t rows, int64_t width, int64_t k) {
  if (rows <= 0 || width <= 0) return 0;
  IndexerTopkParams p;
  p.q = make_tensor(fake_ptr(), DType::kE4M3, {rows, 1, 128}, dev);
  p.weights = make_tensor(fake_ptr(), DType::kF32, {rows, 1}, dev);
  p.cache.data = fake_ptr();
  p.cache.num_blocks = 1;
  p.cache.device = dev;
  p.block_table = make_tensor(fake_ptr(), DType::kI32, {1, 1}, dev);
  p.row_seq = make_tensor(fake_ptr(), DType::kI32, {rows}, dev);
  p.row_len = make_tensor(fake_ptr(), DType::kI32, {rows}, dev);
  p.width = width;
  p.k = k;
  p.indices = make_tensor(fake_ptr(), DType::kI32, {rows, k}, dev);
  return indexer_topk_workspace_size(p);
}

bool layout_fused(Arena& a, Device dev, int64_t rows, int64_t width, int64_t k, FusedLayout* o,
                  std::vector<PlanBuffer>* names) {
  o->ws_bytes = fused_scratch_bytes(dev, rows, width, k);
  return take_bytes(a, static_cast<int64_t>(o->ws_bytes), &o->ws, names, "fused_select_scratch",
                    "candidate buffers of fused score-and-select (indexer_topk_workspace_size)") &&
         take(a, saturating_mul(rows, k), &o->idx, names, "index_chunk", "i32 selected positions [rows, topk]") &&
         take(a, saturating_mul(rows, k), &o->mapped, names, "mapped_index_chunk", "i32 cache slots [rows, topk]");
}

bool layout_tiled(Arena& a, Device dev, int64_t tile_width, int64_t max_tiles, int64_t k,
                  TiledLayout* o, std::vector<PlanBuffer>* names) {
  const size_t ws_tile = topk_scratch_bytes(dev, 1, tile_width, score_stride(tile_width), k, true);
  const size_t ws_merge = topk_scratch_bytes(dev, 1, 2 * k, 2 * k, k, true);
  o->topk_ws_bytes = ws_tile > ws_merge ? ws_tile : ws_merge;
  bool ok = take(a, score_stride(tile_width), &o->scores, names, "score_tile", "f32 scores of one key tile") &&
            take_bytes(a, static_cast<int64_t>(o->topk_ws_bytes), &o->topk_ws, names, "topk_scratch",
                       "backend top-k workspace, tile or merge (topk_workspace_size)");
  for (int i = 0; ok && i < 2; ++i) {
    ok = take(a, 2 * k, &o->cand_idx[i], names, "merge_candidates", "i32 [2 * topk] running | tile indices") &&
         take(a, 2 * k, &o->cand_val[i], names, "merge_values", "f32 [2 * topk] running | tile values");
  }
  return ok && take(a, k, &o->pos, names, "merge_positions", "i32 [topk] positions picked by a merge") &&
         take(a, max_tiles, &o->tile_offset, names, "tile_offsets", "i32 first key of each tile") &&
         take(a, max_tiles, &o->tile_len, names, "tile_lengths", "i32 valid keys of each tile") &&
         take(a, max_tiles, &o->merge_len, names, "merge_lengths", "i32 candidates of each merge") &&
         take(a, k, &o->idx, names, "index_chunk", "i32 selected positions [1, topk]") &&
         take(a, k, &o->mapped, names, "mapped_index_chunk", "i32 cache slots [1, topk]");
}

bool layout_shared(Arena& a, int64_t rows, int64_t k, int32_t** mapped) {
  *mapped = a.alloc_n<int32_t>(saturating_mul(rows, k));
  return *mapped != nullptr;
}

bool layout_step(Arena& a, const Plan& plan, StepLayout* o, std::vector<PlanBuffer>* names) {
  const int64_t T = plan.max_rows;
  const int64_t B = plan.config.max_seqs_per_step;
  const int64_t Hi = plan.config.geometry.index_heads;
  void* ws = nullptr;
  void* score = nullptr;
  const bool ok =
      take(a, saturating_mul(saturating_mul(T, Hi), 128), &o->index_q, names, "indexer_q", "e4m3 prepared indexer queries [rows, H_idx, 128]") &&
      take(a, saturating_mul(T, Hi), &o->index_w, names, "indexer_weights", "f32 folded gates w' [rows, H_idx]") &&
      take(a, saturating_mul(T, 128), &o->index_k, names, "indexer_k", "e4m3 prepared indexer keys [rows, 128]") &&
      take(a, T, &o->index_k_scale, names, "indexer_k_scale", "f32 key scales [rows]") &&
      take(a, T, &o->row_seq, names, "row_seq", "i32 sequence of each row") &&
      take(a, T, &o->row_len, names, "row_len", "i32 keys each row sees") &&
      take(a, T, &o->token_pos, names, "token_pos", "i32 cache position of each row") &&
      take(a, B, &o->kv_lens, names, "kv_lens", "i32 keys per sequence") &&
      take(a, saturating_add(saturating_mul(2, B), 1), &o->dense_cu, names, "dense_cu_seqlens", "i32 cu_seqlens of the dense runs") &&
      take_bytes(a, plan.attention_scratch_bytes, &ws, names, "attention_scratch",
                 "backend workspace of sparse / dense MLA") &&
      take_bytes(a, plan.score_region_bytes, &score, names, "score_region",
                 "every temporary of scoring and selection (<= score budget)");
  o->attn_ws = ws;
  o->attn_ws_bytes = plan.attention_scratch_bytes;
  o->score = score;
  o->score_bytes = plan.score_region_bytes;
  o->core_q = o->core_out = nullptr;
  o->core_dtype = core_region_dtype(plan.config.device);
  if (!ok || !plan.config.core_mode) return ok;
  const int64_t es = static_cast<int64_t>(dtype_size(o->core_dtype));
  const int64_t per_row = saturating_mul(plan.config.geometry.num_heads, es);
  return take_bytes(a, saturating_mul(saturating_mul(T, per_row), 576), &o->core_q, names, "core_absorbed_q",
                    "core mode: absorbed queries [rows, H, 576] (W_UK applied in the step)") &&
         take_bytes(a, saturating_mul(saturating_mul(T, per_row), 512), &o->core_out, names, "core_latent_out",
                    "core mode: latent attention outputs [rows, H, 512] (before W_UV)");
}

HostStaging host_staging(const Plan& plan) {
  const int64_t T = plan.max_rows, B = plan.config.max_seqs_per_step;
  HostStaging h;
  h.tile_table = 0;
  h.tile_words = 3 * std::max<int64_t>(plan.max_tiles, 1);
  h.slot_begin = h.tile_words;
  h.row_seq = 0;
  h.row_len = h.row_seq + T;
  h.token_pos = h.row_len + T;
  h.kv_lens = h.token_pos + T;
  h.dense_cu = h.kv_lens + B;
  h.tile_last = h.dense_cu + 2 * B + 1;
  h.slot_words = h.tile_last + 2 * T;
  h.slots = plan.config.device.type == DeviceType::kCUDA ? 2 : 1;
  return h;
}

}  // namespace core
}  // namespace dsa
