// The planner (SPEC §1, §6): fixes, before the KV cache is sized, the workspace that any step
// within declared limits needs, with a hard bound on every temporary of scoring and selection;
// then sizes the KV caches in what is left of the device memory.
//
// The workspace is one arena. Its "score region" (at most score_budget_bytes) holds every
// temporary of scoring and selection: the score chunk with its row padding and alignment, the
// top-k scratch (backend workspace included, via topk_workspace_size), the selected and mapped
// index chunks and, when one row of scores alone exceeds the budget, the tile and merge
// candidate buffers of key-axis tiling. A limit that cannot be served within the budget is
// refused here, with the smallest budget that works in the message (docs/planner.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsa/cache.h"
#include "dsa/geometry.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

constexpr int64_t kDefaultScoreBudgetBytes = int64_t{512} << 20;  // 512 MiB
constexpr int64_t kWorkspaceAlignment = 256;  // every arena buffer starts at a multiple of this

// How a step's scoring chunks select their keys (docs/fused_select.md).
//   kAuto:    per chunk, the cheaper path by the cost model among those the device has
//             (rows wider than Plan::fused_min_width take the fused path);
//   kUnfused: scores written to the score region, then top-k (every device);
//   kFused:   scored and selected in one pass (indexer_topk), no [rows, N] scores; refused by
//             make_plan on a device without the fused kernel.
enum class SelectPath : int32_t { kAuto = 0, kUnfused = 1, kFused = 2 };
const char* select_path_name(SelectPath s);  // "auto", "unfused", "fused"

struct PlannerConfig {
  ModelGeometry geometry;                          // a preset (geometry_preset) or custom
  MlaCacheDtype cache_dtype = MlaCacheDtype::kBF16;  // BF16 default; FP8 is an explicit policy
  int64_t page_size = kDefaultPageSize;            // one block table serves MLA and indexer caches
  int64_t max_tokens_per_step = 8192;              // new tokens (query rows) per step
  int64_t max_seqs_per_step = 256;
  int64_t max_context = 0;                         // kv_len bound; 0: geometry.max_positions
  int64_t max_next_n = 1;                          // decode tokens per sequence (MTP drafts + 1)
  int64_t score_budget_bytes = kDefaultScoreBudgetBytes;
  // Memory semantics: the KV cache gets kv_cache_fraction of (device_memory_bytes - workspace),
  // the rest being headroom for everything else on the device (activations, weights' temps).
  // memory_is_exact = true: device_memory_bytes is exactly what DSA may use (an engine that
  // budgeted its memory already): the KV gets all of (device_memory_bytes - workspace) and
  // kv_cache_fraction is ignored.
  int64_t device_memory_bytes = 0;                 // memory for workspace + KV; 0: size no KV cache
  double kv_cache_fraction = 0.9;                  // share of (memory - workspace) the KV may take
  bool memory_is_exact = false;                    // true: no fraction (kv_cache_fraction ignored)
  Device device{};
  // Steps may run in core mode (StepParams::q_nope / q_pe / kv_b_proj in, [T, H, v] out): the
  // workspace then also holds the absorbed queries [rows, H, 576] and latent outputs
  // [rows, H, 512] of the step's rows (bf16 on CUDA, f32 on the CPU). Dense rows in MHA form
  // decompress their K/V into the score region (so the score budget bounds that too).
  bool core_mode = false;
  SelectPath select = SelectPath::kAuto;
};

// One buffer of the plan: name, bytes (alignment included) and what it holds.
struct PlanBuffer {
  std::string name;
  int64_t bytes = 0;
  std::string what;
};

struct Plan {
  PlannerConfig config;        // as given, max_context resolved
  int64_t max_rows = 0;        // rows a step may hold: max(max_tokens, max_seqs * max_next_n)

  // ---- workspace ----
  int64_t workspace_bytes = 0;       // the arena a step needs (device memory)
  int64_t host_bytes = 0;            // host staging an Attention object allocates once (pinned on CUDA)
  int64_t score_budget_bytes = 0;    // the budget given
  int64_t score_region_bytes = 0;    // the arena's scoring part: <= score_budget_bytes
  int64_t min_score_budget_bytes = 0;  // the smallest budget that serves these limits
  int64_t attention_scratch_bytes = 0;  // backend workspace of sparse/dense MLA (0 on the CPU)
  int64_t core_bytes = 0;             // core mode's absorbed queries + latent outputs (0 without)
  // Core mode, MHA form: the longest dense context whose decompressed K/V fit the score region
  // (0 when none does or the device has no MHA kernel for the geometry); longer dense
  // sequences take the absorbed form.
  int64_t mha_max_context = 0;
  std::vector<PlanBuffer> buffers;        // the arena, top level; sums to workspace_bytes
  std::vector<PlanBuffer> score_buffers;  // the score region when serving rows of max_context
  int64_t tile_width = 0;   // key columns per tile for rows that do not fit whole; 0: never tiles
  int64_t max_tiles = 0;    // tiles of the longest row
  int64_t max_context_rows_per_chunk = 0;  // rows_per_chunk(max_context), kept: steps ask per layer

  // ---- the two selection paths (docs/fused_select.md) ----
  // The score region serves both: the unfused path's chunks (scores [rows, width] + top-k)
  // for rows up to unfused_max_width keys, and the fused path's (candidate buffers + indices,
  // O(rows * topk)) for rows wider than fused_min_width.
  bool fused_select = false;          // steps take the fused path where the cost model says so
  int64_t fused_min_width = 0;        // rows seeing more keys than this are fused (INT64_MAX: none)
  int64_t unfused_max_width = 0;      // the widest row the unfused path serves (max_context, or
                                      // fused_min_width when wider rows are fused)
  int64_t unfused_region_bytes = 0;   // what the unfused path needs within the budget
  int64_t fused_region_bytes = 0;     // what the fused path needs within the budget (0: unused)
  int64_t fused_max_context_rows_per_chunk = 0;  // fused_rows_per_chunk(max_context)
  // Selection memory of one chunk of max_rows rows of max_context keys, without the budget:
  // the unfused path's scores and scratch, and the fused path's (both reported by dsa plan).
  int64_t unfused_bytes_all_rows = 0;
  int64_t fused_bytes_all_rows = 0;
  std::vector<PlanBuffer> fused_buffers;  // the fused chunk of rows of max_context (when used)

  // ---- KV cache, after the reservation ----
  int64_t mla_layers = 0;          // layers with an MLA cache (main + MTP)
  int64_t indexer_layers = 0;      // layers with an indexer cache (full + MTP; shared own none)
  int64_t mla_page_bytes = 0;      // one page of one layer
  int64_t indexer_page_bytes = 0;
  int64_t kv_budget_bytes = 0;     // (device_memory - workspace) * fraction (1 with memory_is_exact)
  int64_t kv_pages = 0;            // pages per layer: every layer's caches hold this many
  int64_t kv_tokens = 0;           // kv_pages * page_size
  int64_t mla_cache_bytes = 0;     // all layers
  int64_t indexer_cache_bytes = 0; // all layers

  // Rows of one scoring chunk when every row sees context_len keys; 0 when one row does not
  // fit the score region and the row is tiled along the key axis instead.
  int64_t rows_per_chunk(int64_t context_len) const;
  // The tile width a row of context_len keys is scored with; 0: it is scored whole.
  int64_t tile_width_for(int64_t context_len) const;
  // Exact score-region bytes of an untiled chunk of `rows` rows, the longest seeing `width`
  // keys (score chunk with padding, top-k scratch, index and mapped-index chunks).
  int64_t chunk_bytes(int64_t rows, int64_t width) const;
  // Exact score-region bytes of one row scored in tiles of tile_width.
  int64_t tiled_row_bytes(int64_t tile_width) const;
  // Exact score-region bytes of a fused chunk of `rows` rows, the longest seeing `width` keys
  // (indexer_topk workspace, selected and mapped indices).
  int64_t fused_chunk_bytes(int64_t rows, int64_t width) const;
  // Rows of one fused chunk when every row sees context_len keys (>= 1 in a valid plan).
  int64_t fused_rows_per_chunk(int64_t context_len) const;
  // Whether a row of `width` keys takes the fused path in this plan's steps.
  bool takes_fused(int64_t width) const { return fused_select && width > fused_min_width; }
};

// Builds the plan or refuses limits that cannot be served (kLimitExceeded, message naming the
// smallest budget / memory that works) and malformed configs (kInvalidArgument).
Status make_plan(const PlannerConfig& config, Plan* plan);

// The workspace of dense attention in MHA form (dense_mha_prefill, include/dsa/mha.h) under a
// step's limits, for the planner to count (docs/mha.md). A sequence goes MHA form only on the
// dense route (kv_len <= topk), so one sequence's context is at most
// L = min(topk, max_context) tokens, and a step's MHA contexts sum to at most
// min(max_seqs_per_step, max_tokens_per_step) * L tokens (every sequence has a new token).
// The reservation holds groups of `group_tokens` context tokens: the whole bound when it fits
// `budget_bytes`, else as many as fit, never fewer than L (one sequence: min_bytes, which may
// exceed the budget). Batches beyond a group run in sequence groups within the same bytes.
struct MhaPrefillReservation {
  int64_t max_seq_context = 0;  // L
  int64_t batch_tokens = 0;     // the bound on a step's MHA context tokens
  int64_t group_tokens = 0;     // context tokens one group holds
  int64_t bytes = 0;            // mha_prefill_workspace_bytes(group_tokens): what to reserve
  int64_t min_bytes = 0;        // one sequence of L tokens
  int64_t batch_bytes = 0;      // batch_tokens in one group
};
// Uses config.geometry (num_heads, qk_nope_head_dim, v_head_dim, topk), config.device and the
// step limits (max_context 0: geometry.max_positions). kInvalidArgument for a geometry without
// qk_nope_head_dim / v_head_dim.
Status plan_mha_prefill(const PlannerConfig& config, int64_t budget_bytes, MhaPrefillReservation* out);

// "141GiB", "512MiB", "64KiB", "4096", "4096B", "1.5GiB" (B, KiB, MiB, GiB, TiB; case-insensitive).
Status parse_byte_size(const std::string& text, int64_t* bytes);
// 536870912 -> "512 MiB", 1536 -> "1.5 KiB", 100 -> "100 B".
std::string format_byte_size(int64_t bytes);

}  // namespace dsa
