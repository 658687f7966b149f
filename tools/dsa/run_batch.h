// The mixed batch of `dsa run`, its buffers, and the one layer step (dsa::Attention) it runs,
// planned by dsa::make_plan. Setup, the step and the float64 checks (run_check.h) are separate
// so a caller can time or replace each.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "dsa/dsa.h"
#include "dsa/layer.h"
#include "dsa/planner.h"

namespace dsa_cli {

enum class SeqKind { kPrefill, kChunkedPrefill, kDecode };
const char* seq_kind_name(SeqKind k);

// One sequence of the step: q_len new tokens, kv_len tokens in the cache after the step
// (kv_len - q_len of them were cached before it).
struct SeqSpec {
  SeqKind kind = SeqKind::kPrefill;
  int q_len = 0;
  int kv_len = 0;
  bool sparse = false;  // the route SPEC §6 expects for a full layer: kv_len > topk -> sparse
};

// What `dsa run` computes. Sequences are ordered dense first, then sparse prefills, then
// decodes, so dense rows, sparse rows and decode rows are each one contiguous range.
struct BatchSpec {
  dsa::ModelGeometry geo;
  std::vector<SeqSpec> seqs;
  int page_size = 64;
  int next_n = 2;  // tokens per decode sequence
  dsa::MlaCacheDtype mla_dtype = dsa::MlaCacheDtype::kBF16;
  bool hadamard = false;
  double rope_theta = 10000.0;
  uint64_t seed = 1;
  dsa::Device device{};

  // Derived by finalize().
  int num_tokens = 0;       // new tokens T (rows of the step)
  int num_dense_rows = 0;   // rows [0, num_dense_rows) are expected on the dense route
  int num_sparse_rows = 0;  // rows [num_dense_rows, T) are expected scored (sparse route)
  int num_decode_rows = 0;  // the last num_decode_rows rows belong to decode sequences
  int num_dense_seqs = 0;
  int max_blocks = 0;       // block-table width
  int num_blocks = 0;       // pages in each cache (including spare, NaN-poisoned ones)
  int max_kv_len = 0;
  std::vector<int> row_seq;  // sequence of each new-token row
  std::vector<int> row_pos;  // position of each new-token row in its sequence

  // Routes, orders and sizes; returns "" or what is wrong with the request.
  std::string finalize();
  int64_t prefix_tokens() const;  // tokens cached before the step
};

// The default mixed batch: a short prefill (kv_len <= topk), a chunked prefill of `chunk` new
// rows over a cached prefix (kv_len = context) and `decode_seqs` decodes of next_n tokens.
BatchSpec default_batch(const dsa::ModelGeometry& geo, int context, int chunk, int short_len,
                        int decode_seqs, int next_n);

// The planner's config for this batch: the preset, the MLA cache policy, page 64, limits taken
// from the batch (tokens, sequences, longest kv_len, next_n), the given score budget, no KV sizing.
dsa::PlannerConfig plan_config(const BatchSpec& s, int64_t score_budget_bytes);

// All buffers of one run. Host copies hold the inputs (generated on the host) and, after
// download_all(), the outputs.
struct RunBuffers {
  // inputs of the step (new tokens)
  std::unique_ptr<Buffer> idx_q;        // [T, H_idx, 128] bf16
  std::unique_ptr<Buffer> idx_w;        // [T, H_idx] f32
  std::unique_ptr<Buffer> idx_k;        // [T, 128] bf16
  std::unique_ptr<Buffer> kv_c;         // [T, 512] bf16
  std::unique_ptr<Buffer> k_pe;         // [T, 64] bf16
  std::unique_ptr<Buffer> q_mla;        // [T, H, 576] bf16
  std::unique_ptr<Buffer> cos_sin;      // [max_kv_len, 64] f32
  std::vector<int32_t> q_lens, kv_lens; // [B], host memory (the step reads them there)
  // addressing and caches
  std::unique_ptr<Buffer> block_table;  // [B, max_blocks] i32
  std::unique_ptr<Buffer> idx_cache;    // num_blocks * page * 132 B
  std::unique_ptr<Buffer> mla_cache;    // num_blocks * page * token bytes
  std::vector<uint8_t> idx_cache_before, mla_cache_before;  // both caches after setup
  // outputs of the step
  std::unique_ptr<Buffer> indices;      // [T, topk] i32 request-local (StepParams::indices_out)
  std::unique_ptr<Buffer> out;          // [T, H, 512] bf16
  std::unique_ptr<Buffer> lse;          // [T, H] f32
  std::unique_ptr<Buffer> workspace;    // plan.workspace_bytes, allocated once
  // the reference's inputs to the selection check: prepare_indexer_q on every row
  std::unique_ptr<Buffer> positions;    // [T] i32
  std::unique_ptr<Buffer> q8;           // [T, H_idx, 128] e4m3
  std::unique_ptr<Buffer> w_folded;     // [T, H_idx] f32
  std::unique_ptr<Buffer> q_scale;      // [T, H_idx] f32

  size_t total_bytes = 0;               // backend memory of all buffers
};

// Allocates (the workspace at plan.workspace_bytes), fills the inputs from spec.seed, writes the
// cached prefix of every sequence into both caches (prepare_indexer_k + the two cache writes)
// and keeps a host copy of both caches. Returns "" or the error. `progress` lines go to stderr.
std::string setup_run(const BatchSpec& spec, const dsa::Plan& plan, RunBuffers* b, bool progress);

// One full-layer step over the whole batch, waited for. wall_ms: host time including the
// device synchronisation. time_stages: StepParams::time_stages (GPU ms per stage in the report
// on CUDA). Returns "" or the error.
std::string run_step(const BatchSpec& spec, RunBuffers& b, dsa::Attention& attn, dsa::StepReport* report,
                     double* wall_ms, bool time_stages = false);

// prepare_indexer_q on every row into q8 / w_folded / q_scale: the prepared queries the
// selection check scores with (rows are independent, so these are the step's own bits).
std::string prepare_reference_queries(const BatchSpec& spec, RunBuffers& b);

// Brings every output back to the host copies (no-op on the CPU).
std::string download_all(RunBuffers& b);

}  // namespace dsa_cli
