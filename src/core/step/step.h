// The layer step as a pipeline of named stages (SPEC §6). Attention::step (core/layer_step.cpp)
// reads as the pipeline; each stage below lives in its own translation unit of this folder:
//
//   validate        validate.cpp         the batch and the layer's tensors against the plan
//   route           route.cpp            a Route per sequence, the host row tables
//   stage_metadata  stage_metadata.cpp   the workspace layout, row tables uploaded
//   write_caches    write_caches.cpp     MLA latent and indexer key caches, every token
//   dense_attend    dense_attend.cpp     dense causal MLA of a dense run (+ identity indices)
//   dense_attend_mha dense_attend_mha.cpp core mode: a dense run in MHA form (dense_mha_prefill)
//   absorb_queries / up_project (project.cpp): core mode, W_UK before and W_UV after a run's
//                   absorbed attends
//   sparse_run      sparse_run.cpp       a sparse run chunk by chunk:
//     score_select_map_chunk / score_tiled_row (score_select_map.cpp): score, top-k, map
//     fused_select_map_chunk (score_select_map.cpp): score and select in one pass, map
//     sparse_attend (sparse_attend.cpp): sparse MLA over a chunk's mapped indices
//
// Shared helpers (row slices, op wrappers that time and check scratch) are in ops.cpp. Device
// bookkeeping (staging memory, uploads, events, capture status) goes through DeviceOps
// (device_ops.h), implemented per backend.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/step/device_ops.h"
#include "core/step/stage_timer.h"
#include "core/step_layout.h"
#include "dsa/layer.h"
#include "dsa/topk.h"

namespace dsa {
namespace core {
namespace step {

extern const char* const kOp;  // "attention_step": the prefix of every message of a step

Status invalid(const std::string& what);
Status limit(const std::string& what);
Status internal(const std::string& what);
inline std::string num(int64_t v) { return std::to_string(v); }

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The batch's query lengths: q_lens [B] i32, or cu_seqlens [B + 1] i32/i64 (validated first).
inline int64_t cu_at(const TensorDesc& c, int64_t i) {
  return c.dtype == DType::kI64 ? c.ptr<const int64_t>()[i * c.stride[0]] : c.ptr<const int32_t>()[i * c.stride[0]];
}
inline int64_t batch_size(const StepParams& p) {
  return p.cu_seqlens.present() ? p.cu_seqlens.shape[0] - 1 : p.q_lens.shape[0];
}
inline int64_t batch_q_len(const StepParams& p, int64_t b) {
  if (p.cu_seqlens.present()) return cu_at(p.cu_seqlens, b + 1) - cu_at(p.cu_seqlens, b);
  return p.q_lens.ptr<const int32_t>()[b * p.q_lens.stride[0]];
}
// "[2, 3] i64 on cuda:0", "none": what an argument was.
std::string describe(const TensorDesc& t);

// Rows [r0, r0 + n) of a tensor (strides kept).
TensorDesc rows(const TensorDesc& t, int64_t r0, int64_t n);
TensorDesc dev_tensor(const void* p, DType d, std::initializer_list<int64_t> shape, Device dev);

// The batch as validated: sizes and what the role implies.
struct BatchShape {
  int64_t B = 0, T = 0;
  bool scores = false;  // full and mtp layers score (shared layers reuse indices_in)
};

// What the host read from an eager step's device-resident inputs before anything was written
// (check_device_inputs): once per batch, then each layer compares its own caches against it.
struct DeviceInputFacts {
  bool block_table = false;  // the covered block-table entries were read (all >= 0)
  int64_t max_page = -1, page_b = 0, page_j = 0;  // their largest, and where it is
  bool positions = false;  // device positions were read (all >= 0)
  int64_t max_pos = -1, pos_t = 0;
  const void* slot_mapping = nullptr;  // the device slot mapping last checked for this batch
};

// What prepare() leaves for the runs of one step's layers: the batch, its staging slot (host
// row tables, written once by prepare) and where its metadata lives in the workspace.
struct Prepared {
  bool valid = false;
  int64_t B = 0, T = 0;
  int slot = 0;
  StepLayout lay;
  int64_t score_offset = 0;
  const void* workspace = nullptr;
  size_t workspace_bytes = 0;
  const void* block_table = nullptr;
  const void* positions = nullptr;
  bool device_lengths = false;  // a graph-stable decode batch: row tables built on the device
  int64_t next_n = 0;
  const void* kv_lens = nullptr;
  DeviceInputFacts facts;  // the batch's device-resident inputs (checked at prepare)
};

// What an Attention object keeps between steps: host staging, its slots and their events.
struct StepState {
  const DeviceOps* ops = nullptr;
  Device device;
  HostStaging hs;
  int32_t* staging = nullptr;  // hs layout, plan.host_bytes (pinned on CUDA)
  int next_slot = 0;
  void* slot_done[2] = {nullptr, nullptr};  // a slot's last eager copies
  bool slot_pending[2] = {false, false};
  std::vector<Route> route;
  std::vector<int32_t> q_lens;  // [max_seqs] the prepared batch's q_lens
  // [max_seqs] core-mode plans: the prepared batch's dense sequences the cost model sends to
  // the MHA form (dense runs are split where it changes; row_tables).
  std::vector<uint8_t> mha;
  std::vector<int64_t> chunk_widths;  // sparse_run's chunk search (capacity kept between steps)
  Prepared prepared;
  StageTimer timer;  // StepParams::time_stages

  Status init(const Plan& plan);
  ~StepState();
};

// One step in flight: what every stage reads and writes.
struct Step {
  Step(const Plan& plan, const StepParams& p, StepState& state, StepReport& rep)
      : plan(plan), p(p), state(state), rep(rep), cfg(plan.config), dev(plan.config.device),
        K(plan.config.geometry.topk), H(plan.config.geometry.num_heads), Hi(plan.config.geometry.index_heads),
        ops(*state.ops) {}
  const Plan& plan;
  const StepParams& p;
  StepState& state;
  StepReport& rep;
  const PlannerConfig& cfg;
  const Device dev;
  const int64_t K, H, Hi;
  const DeviceOps& ops;
  BatchShape shape;

  // This step's staging slot (host metadata).
  int slot = 0;
  bool capturing = false;
  int32_t* row_seq_h = nullptr;
  int32_t* row_len_h = nullptr;
  int32_t* token_pos_h = nullptr;
  int32_t* kv_lens_h = nullptr;
  int32_t* dense_cu_h = nullptr;
  int32_t* tile_last_h = nullptr;
  const int32_t* tile_table = nullptr;
  int64_t tile_stride = 0;

  // The workspace.
  StepLayout lay;
  int64_t score_offset = 0;
  TensorDesc row_seq, row_len, token_pos, positions;
  float sm_scale = 0.0f;
  Arena score_arena{nullptr, 0};
  int64_t score_high = 0;
  int64_t dense_cu_at = 0;  // next dense run's dense_cu region
  int64_t dense_cu_words = 0;  // dense_cu words of the batch's dense runs
  bool device_lengths = false;  // the batch's lengths live on the device (StepParams::device_lengths)
  // Core mode (StepParams::q_nope given): the absorbed attends read q_abs and write out_lat,
  // workspace regions between the projections; in latent mode they are p.q and p.out.
  bool core = false;
  TensorDesc q_abs, out_lat;

  // The key width a row is scored with: its own length, or the plan's max_context when the
  // lengths are on the device (chunking then depends only on B and next_n).
  int64_t row_width(int64_t r) const { return device_lengths ? cfg.max_context : row_len_h[r]; }

  // The prepared batch (staged by row_tables).
  int32_t q_len(int64_t b) const { return state.q_lens[static_cast<size_t>(b)]; }
  int32_t kv_len(int64_t b) const { return kv_lens_h[b]; }
  // A fresh view of the score region (chunks reuse it), keeping the high-water mark.
  Arena fresh_score_arena();
};

// A run of consecutive sequences on one route: sequences [b0, b1), rows [r0, r1). mha: a
// dense run the cost model sends to the MHA form (core-mode plans; StepState::mha).
struct Run {
  int64_t b0, b1, r0, r1;
  bool dense;
  bool mha;
};
// fn(const Run&) -> Status for each non-empty run, in batch order; stops at the first error.
template <typename F>
Status for_each_run(const Step& s, F&& fn) {
  const int64_t B = s.shape.B;
  int64_t b = 0, r = 0;
  while (b < B) {
    const bool dense = s.state.route[b] == Route::kDense;
    const bool mha = dense && s.state.mha[static_cast<size_t>(b)];
    Run run{b, b, r, r, dense, mha};
    while (run.b1 < B && (s.state.route[run.b1] == Route::kDense) == dense &&
           (dense && s.state.mha[static_cast<size_t>(run.b1)]) == mha) {
      run.r1 += s.q_len(run.b1);
      ++run.b1;
    }
    b = run.b1;
    r = run.r1;
    if (run.r1 > run.r0) {
      Status st = fn(run);
      if (!st.ok()) return st;
    }
  }
  return Status::Ok();
}

// The stream enters `stage` (StageTimer; free unless this step is timed).
inline void mark(Step& s, Stage stage) { s.state.timer.mark(stage); }

// ---- the stages ----
// validate: the whole step (batch and layer) against the plan; validate_batch: only the batch
// fields prepare() reads; matches_prepared: a run's batch fields against the prepared batch.
Status validate(const Plan& plan, const StepParams& p, BatchShape* out);
Status validate_batch(const Plan& plan, const StepParams& p, BatchShape* out);
Status matches_prepared(const Step& s);
// Eager steps (host lengths, not capturing) on a queued backend: reads the batch's device-
// resident block table, positions and slot mapping once (what *facts lacks) and refuses bad
// contents before anything is written; check_device_facts then holds this layer's caches and
// cos_sin against what was read. Captured and device_lengths steps read nothing here.
Status check_device_inputs(Step& s, DeviceInputFacts* facts);
Status check_device_facts(const Step& s, const DeviceInputFacts& facts);
// Once per batch (prepare):
Status acquire_slot(Step& s);    // this step's staging slot (waits for the step two before)
void point_at_slot(Step& s);     // the staging pointers of s.slot
void release_slot(Step& s);      // marks the slot's copies (every exit once copies may be queued)
void row_tables(Step& s);        // host row tables, dense runs' cu_seqlens, tiled rows' last tiles
Status stage_metadata(Step& s);  // the workspace layout; row tables uploaded
void keep_prepared(Step& s);     // what the runs reuse
// Once per layer (run):
Status use_prepared(Step& s);    // the prepared batch's slot and layout for this layer
void route(Step& s);             // a Route per sequence for this layer's role
Status write_caches(Step& s);
// A dense run's device tables: its cu_seqlens region (the next one, in batch order), its block
// table rows trimmed to the pages its contexts use, its kv_lens.
struct DenseRunTables {
  TensorDesc cu_seqlens, block_table, kv_lens;
};
DenseRunTables dense_run_tables(Step& s, const Run& run);
Status dense_attend(Step& s, const Run& run);      // absorbed form (dense_mla)
// Core mode: whether a dense run takes the MHA form (the cost model's split, dense_form) and
// its attention in that form (dense_mha_prefill; decompressed K/V in the score region).
bool served_mha(const Step& s, const Run& run);
Status dense_attend_mha(Step& s, const Run& run);
// Rows of a dense run get the identity selection 0..L-1 in indices_out (no scores read).
Status identity_indices(Step& s, const Run& run);
// Core mode, around the absorbed attends of a run: q_abs rows from q_nope / q_pe (W_UK), and
// out rows from out_lat (W_UV).
Status absorb_queries(Step& s, const Run& run);
Status up_project(Step& s, const Run& run);
Status sparse_run(Step& s, const Run& run);
Status prepare_queries(Step& s, const Run& run);
// Scores rows [r0, r0 + m) (widest row `width`) in one chunk, selects and maps; *mapped gets
// the chunk's cache slots, *idx the selection (indices_out rows when present).
Status score_select_map_chunk(Step& s, int64_t r0, int64_t m, int64_t width, TensorDesc* idx, TensorDesc* mapped);
// The same through the fused path (indexer_topk): no scores are written.
Status fused_select_map_chunk(Step& s, int64_t r0, int64_t m, int64_t width, TensorDesc* idx, TensorDesc* mapped);
// One row too wide for a chunk: scored in key tiles, partial top-k merged exactly, mapped.
Status score_tiled_row(Step& s, int64_t r0, TensorDesc* mapped);
Status sparse_attend(Step& s, int64_t r0, int64_t n, const TensorDesc& mapped);
// Padded tokens' rows (slot_mapping -1): out 0, lse +inf, indices_out -1 (write_caches.cpp).
Status mask_padded(Step& s);

// ---- op wrappers (ops.cpp): each adds its host time to the report ----
Status run_topk(Step& s, TopkParams& tp, void* ws, size_t ws_bytes);
Status map_paged(Step& s, const TensorDesc& idx, int64_t r0, int64_t n, const TensorDesc& out);
// skip_short: rows with L <= topk are not scored (top-k reads none of their scores).
Status score_rows(Step& s, int64_t r0, int64_t n, float* logits, int64_t width, int64_t stride, int64_t col_offset,
                  bool skip_short = false);
Status attn_ws_check(const Step& s, size_t need);
// The inputs of rows [r0, r0 + n) for a paged scorer (IndexerLogitsPagedParams,
// IndexerTopkParams): the prepared queries and gates, the layer's indexer cache, the batch's
// block table and row tables (general form), the stream.
template <typename P>
void paged_scorer_rows(const Step& s, int64_t r0, int64_t n, P* p) {
  p->q = dev_tensor(s.lay.index_q + r0 * s.Hi * kIndexHeadDim, DType::kE4M3, {n, s.Hi, kIndexHeadDim}, s.dev);
  p->weights = dev_tensor(s.lay.index_w + r0 * s.Hi, DType::kF32, {n, s.Hi}, s.dev);
  p->cache = s.p.index_cache;
  p->block_table = s.p.block_table;
  p->row_seq = rows(s.row_seq, r0, n);
  p->row_len = rows(s.row_len, r0, n);
  p->stream = s.p.stream;
}
// The largest row count in [1, T] whose layout (bytes_of(rows)) fits the score region.
template <typename F>
int64_t max_rows_fitting(const Step& s, F&& bytes_of) {
  int64_t lo = 1, hi = std::max<int64_t>(s.shape.T, 1);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (bytes_of(mid) <= s.lay.score_bytes) lo = mid; else hi = mid - 1;
  }
  return lo;  // the plan guarantees one row fits
}

}  // namespace step
}  // namespace core
}  // namespace dsa
