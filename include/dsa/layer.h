// One step of a DSA layer (SPEC §6): cache writes, per-sequence routing, and the sparse path
// pipelined per chunk of query rows (score -> select -> map -> attend) inside a workspace whose
// size the planner fixed. A step allocates nothing: device temporaries come from the caller's
// workspace, host metadata from buffers the Attention object allocated at construction (pinned
// on CUDA, where a step can be captured in a CUDA graph: see Attention).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dsa/cache.h"
#include "dsa/geometry.h"
#include "dsa/planner.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {
namespace core {
namespace step {
struct StepState;
}
}  // namespace core

// How one sequence of a step is served.
enum class Route : int32_t {
  kDense = 0,         // dense causal MLA; never scored (kv_len <= topk)
  kSparseScored = 1,  // scored by this layer's indexer: score -> top-k -> map -> sparse MLA
  kSparseShared = 2,  // a shared layer: the last full layer's indices -> map -> sparse MLA
};
const char* route_name(Route r);

// Core mode: which form a dense sequence's attention takes (SPEC §5b, §6).
enum class DenseForm : int32_t {
  kAuto = 0,      // the cost model's choice per sequence (prefer_mha_form), MHA only where its
                  // decompressed K/V fit the score region and the device has the MHA kernel
  kMha = 1,       // MHA wherever it fits and is supported (else absorbed)
  kAbsorbed = 2,  // always absorbed (as latent mode, with the projections around it)
};
const char* dense_form_name(DenseForm f);

struct StepParams {
  IndexerRole role = IndexerRole::kFull;

  // The batch. B sequences; sequence b has q_lens[b] new tokens (a prefill, a chunk of one, or
  // decode with next_n tokens) and kv_lens[b] tokens in the cache after the step; its new token
  // i sits at position kv_lens[b] - q_lens[b] + i and sees keys 0 .. that position. Tokens are
  // ordered by sequence: T = Σ q_lens.
  TensorDesc q_lens;       // [B] i32, host memory (or cu_seqlens)
  TensorDesc cu_seqlens;   // alternative to q_lens: [B + 1] i32/i64, host memory, 0 = cu[0] <= cu[1] <= ...;
                           // q_len[b] = cu[b + 1] - cu[b] (vLLM query_start_loc, host copy;
                           // SGLang extend_start_loc with extend_seq_lens appended)
  TensorDesc kv_lens;      // [B] i32, host memory (device memory with device_lengths, below)
  TensorDesc block_table;  // [B, max_blocks] i32 on the device: pages of both caches
  TensorDesc positions;    // optional [T] i32 or i64 on the device: RoPE positions (default: cache positions)

  // Graph-stable decode. With device_lengths, the batch is B decode sequences of next_n tokens
  // each (T = B * next_n, q_lens / cu_seqlens not given) and kv_lens is a [B] i32 tensor on the
  // plan's device, read by the device when the step runs: the row tables are built by a small
  // kernel inside the step, every row goes down the scored pipeline in chunks of the plan's
  // max_context width (so the work decomposition depends only on B and next_n), and rows with
  // kv_len <= topk get the identity selection without being scored (sparse attention over it
  // is dense attention, SPEC §2). One graph captured at batch size B therefore serves every
  // later decode step of that size: update kv_lens, block_table, positions and the inputs in
  // place between replays. The engine keeps next_n <= kv_lens[b] <= min(max_context,
  // max_blocks * page_size) (values outside are clamped to it on the device, so a bad length
  // computes garbage but stays in bounds; on the CPU, where kv_lens is host memory, they are
  // checked like host-planned lengths). Shared layers read indices_in on every row. Needs a
  // plan that scores a max_context row whole (Plan::rows_per_chunk(max_context) >= 1).
  // Prefill and mixed batches stay host-planned (device_lengths = false).
  bool device_lengths = false;
  int64_t next_n = 0;      // device_lengths: tokens per sequence, 1 .. plan max_next_n

  // Optional [T] i64 cache slot per token (vLLM slot_mapping, SGLang out_cache_loc), on the
  // plan's device, the same for every layer of a step. A slot >= 0 must be the token's slot in
  // the block table (block_table[seq][pos / page] * page + pos % page: attention reads keys
  // through the block table); -1 marks a padded token: it is written to neither cache and its
  // output rows are defined as out = 0, lse = +inf, indices_out = -1. A sequence is padded
  // whole or not at all (padding is sequences of their own: a real row must share no key tile
  // with an unwritten slot); its block-table row must still name valid pages (they are read,
  // never written). Host-resident slot mappings, and device-resident ones of an eager CUDA step,
  // are checked against all of this before anything is written; in a captured step they are
  // the engine's to keep.
  TensorDesc slot_mapping;

  // The new tokens' inputs.
  TensorDesc kv_c;         // [T, 512] bf16/f32: MLA latent
  TensorDesc k_pe;         // [T, 64] bf16/f32: rope(k_pe)
  TensorDesc q;            // [T, H, 576] bf16 (f32 on the CPU too): absorbed queries (latent mode)
  TensorDesc index_q;      // [T, H_idx, 128] f32/bf16 (full, mtp)
  TensorDesc index_k;      // [T, 128] f32/bf16 (full, mtp)
  TensorDesc index_w;      // [T, H_idx] f32/bf16 gates (full, mtp)
  TensorDesc cos_sin;      // [max_positions, 64] f32 (full, mtp)
  bool hadamard = false;   // Hadamard-128 on indexer q and k before FP8
  TensorDesc attn_sink;    // optional [H] f32
  float sm_scale = 0.0f;   // 0: the plan geometry's sm_scale

  MlaCacheDesc mla_cache;        // written for every token
  IndexerCacheDesc index_cache;  // full, mtp: written for every token; same page size as MLA

  // Indices are request-local key positions [T, topk] i32, ascending, -1 padded.
  TensorDesc indices_in;   // shared layers: the last full layer's indices (rows of sparse seqs read)
  TensorDesc indices_out;  // optional (full, mtp): this layer's selection; dense rows get 0..L-1
  bool force_score = false;  // full: score every sequence (its indices feed a consumer)

  TensorDesc out;          // [T, H, 512] bf16/f32 (latent mode); [T, H, v_head_dim] (core mode)
  TensorDesc lse;          // [T, H] f32

  // Core mode (SPEC §6; needs a plan made with PlannerConfig::core_mode): instead of q, the
  // un-absorbed query and the layer's kv_b_proj; out is then [T, H, v_head_dim], the input of
  // o_proj. Sparse and decode rows are absorbed with W_UK inside the step, attend in absorbed
  // form and are up-projected with W_UV; dense rows (kv_len <= topk) take the MHA form or the
  // absorbed form per sequence, whichever the cost model (prefer_mha_form, docs/mha.md) says is
  // cheaper (dense_form overrides it). Both modes compute the same function.
  TensorDesc q_nope;       // [T, H, qk_nope_head_dim] bf16 (f32 on the CPU too)
  TensorDesc q_pe;         // [T, H, 64], dtype of q_nope: rope(q_pe)
  TensorDesc kv_b_proj;    // [H * (qk_nope_head_dim + v_head_dim), 512] bf16 (HF kv_b_proj.weight)
  DenseForm dense_form = DenseForm::kAuto;

  void* workspace = nullptr;   // >= plan.workspace_bytes on the plan's device
  size_t workspace_bytes = 0;
  void* stream = nullptr;

  // GPU time per stage (StepReport::gpu_ms_*): on CUDA, events are recorded on the stream
  // between stages and the step waits for the last one before it returns the report. Off by
  // default and free when off; ignored while the stream is being captured (a graph must not
  // synchronise) and on the CPU (where the host times are the device times).
  bool time_stages = false;
};

struct StepReport {
  int64_t seqs[3] = {0, 0, 0};   // sequences per Route
  int64_t rows[3] = {0, 0, 0};   // query rows per Route
  int64_t mha_seqs = 0, mha_rows = 0;  // core mode: dense sequences / rows served in MHA form
  int64_t score_chunks = 0;      // untiled scoring (or mapping, shared) chunks, fused ones included
  int64_t fused_chunks = 0, fused_rows = 0;  // chunks / rows that scored and selected in one pass
  int64_t tiled_rows = 0;        // rows scored in key-axis tiles
  int64_t score_tiles = 0;       // tiles over all tiled rows
  int64_t workspace_high_water_bytes = 0;  // arena high-water mark (alignment included)
  int64_t score_high_water_bytes = 0;      // high-water of the score region
  int64_t workspace_plan_bytes = 0;        // plan.workspace_bytes
  int64_t score_budget_bytes = 0;          // plan.score_budget_bytes
  // Host wall time per stage in ms (on CUDA: time to enqueue).
  // ms_project: core mode's W_UK absorb and W_UV up-projection; ms_dense includes MHA form;
  // ms_score includes the fused chunks' selection (one pass).
  double ms_cache = 0, ms_prepare = 0, ms_score = 0, ms_select = 0, ms_map = 0, ms_sparse = 0,
         ms_dense = 0, ms_project = 0, ms_total = 0;
  // Host microseconds of this call (step, prepare or run) from entry to return, less the wait
  // of a timed step: for run(), the per-layer host cost of a step.
  double host_us = 0;
  // GPU time per stage in ms, summed over the step's launches of that stage (StepParams::
  // time_stages on CUDA; gpu_timed says whether these were measured). gpu_ms_total is the
  // first event to the last, so it includes gaps between stages.
  bool gpu_timed = false;
  double gpu_ms_cache = 0, gpu_ms_prepare = 0, gpu_ms_score = 0, gpu_ms_select = 0, gpu_ms_map = 0,
         gpu_ms_sparse = 0, gpu_ms_dense = 0, gpu_ms_project = 0, gpu_ms_total = 0;
};

// Not re-entrant: one step at a time per object (its host staging is reused by every step).
//
// CUDA: a step allocates nothing and makes no synchronising call (the one wait of eager steps,
// below, is skipped under capture), so it can be captured into a CUDA graph
// (cudaStreamBeginCapture on p.stream, any capture mode) and replayed. Per-step metadata is
// copied with cudaMemcpyAsync from pinned host staging the object allocated at construction;
// every copy of one step reads its own region of it.
//   * A host-planned step replays exactly the batch it captured: routing, chunking and tiling
//     are decided on the host at capture time, and the graph reads the metadata that step wrote
//     into this object's staging. Replays recompute from the inputs' current contents (caches,
//     q, ...) at the same addresses; a different batch needs another capture. A decode step in
//     the graph-stable form (StepParams::device_lengths) reads its lengths on the device: one
//     capture per batch size serves every later decode step of that size.
//   * While a graph captured from it may be replayed, the object must run no other step (that
//     would rewrite the staging the graph reads): one Attention object per captured graph,
//     which is how engines capture per batch shape. Destroy the object only after the graph.
//   * Begin a capture only once the object's earlier eager steps have completed (for example
//     after synchronising their stream), since the capture reuses their staging.
//   * Eager steps alternate between two staging slots; before rewriting a slot, a step waits
//     for the copies of the step two before it (a cudaEventSynchronize that in practice never
//     blocks; never done while capturing).
class Attention {
 public:
  // Keeps a copy of the plan and allocates the host staging it needs (plan.host_bytes; pinned
  // memory when the plan's device is CUDA). Failure is reported by status(); a step of an
  // object whose construction failed returns that status.
  explicit Attention(const Plan& plan);
  // The same, handing out the object only when construction succeeded.
  static Status create(const Plan& plan, std::unique_ptr<Attention>* out);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  const Plan& plan() const { return plan_; }
  Status status() const { return status_; }
  // One step; the report is optional. Steps beyond the plan's limits fail with kLimitExceeded
  // naming the limit; nothing else allocates or exceeds the plan's workspace.
  Status step(const StepParams& p, StepReport* report = nullptr);

  // Plan once per step, run per layer: step(p) is prepare(p) then run(p), split so that the
  // layers of one model step share the batch's host work.
  //   prepare(p) reads only the batch fields of p (q_lens, kv_lens, block_table, positions,
  //     workspace, stream): validates them against the plan, builds the row tables and uploads
  //     them into p.workspace, once per batch.
  //   run(p) runs one layer (role, caches, the layer's tensors, indices, outputs) over the
  //     prepared batch. Its batch fields must be prepare's: the same q_lens and kv_lens values,
  //     the same block_table, positions and workspace (where the batch's metadata lives), on
  //     the same stream; run fails naming the field otherwise. Every layer of a step therefore
  //     shares one workspace, used by one layer at a time.
  // A run reads the metadata its prepare uploaded: the next prepare (or step) of this object
  // starts the next batch. Under graph capture, capture a prepare together with its runs.
  Status prepare(const StepParams& p, StepReport* report = nullptr);
  Status run(const StepParams& p, StepReport* report = nullptr);

 private:
  // The one body of step / prepare / run (src/core/layer_step.cpp); the public calls give every
  // refusal one prefix, "attention_step:".
  enum class Call { kStep, kPrepare, kRun };
  Status enter(Call call, const StepParams& p, StepReport* report);

  Plan plan_;
  Status status_;
  std::unique_ptr<core::step::StepState> state_;  // host staging, slots, events (src/core/step/)
};

}  // namespace dsa
