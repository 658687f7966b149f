// The mixed batch of `dsa run` and its stages, one function per stage, so a caller (the CLI
// today, the layer step / planner later) can run them in order or swap them out.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "dsa/dsa.h"

namespace dsa_cli {

enum class SeqKind { kPrefill, kChunkedPrefill, kDecode };
const char* seq_kind_name(SeqKind k);

// One sequence of the step: q_len new tokens, kv_len tokens in the cache after the step
// (kv_len - q_len of them were cached before it).
struct SeqSpec {
  SeqKind kind = SeqKind::kPrefill;
  int q_len = 0;
  int kv_len = 0;
  bool sparse = false;  // SPEC §6 route: kv_len > topk -> sparse, else dense
};

// What `dsa run` computes. Sequences are ordered dense first, then sparse prefills, then
// decodes, so dense rows, sparse rows and decode rows are each one contiguous range.
struct BatchSpec {
  dsa::ModelGeometry geo;
  std::vector<SeqSpec> seqs;
  int page_size = 64;
  int next_n = 2;  // draft tokens per decode sequence
  dsa::MlaCacheDtype mla_dtype = dsa::MlaCacheDtype::kBF16;
  bool hadamard = false;
  double rope_theta = 10000.0;
  uint64_t seed = 1;
  dsa::Device device{};

  // Derived by finalize().
  int num_tokens = 0;       // new tokens T (rows of the step)
  int num_dense_rows = 0;   // rows [0, num_dense_rows) go to dense MLA
  int num_sparse_rows = 0;  // rows [num_dense_rows, T) are scored and go to sparse MLA
  int num_decode_rows = 0;  // the last num_decode_rows sparse rows use the decode form
  int num_dense_seqs = 0, num_decode_seqs = 0;
  int max_blocks = 0;       // block-table width
  int num_blocks = 0;       // pages in each cache (including spare, NaN-poisoned ones)
  int max_kv_len = 0;
  int logits_width = 0;     // W of the logits buffer: the longest sparse row
  std::vector<int> seq_first_row;  // first new-token row of each sequence
  std::vector<int> row_seq;        // sequence of each new-token row
  std::vector<int> row_pos;        // position of each new-token row in its sequence

  // Routes, orders and sizes; returns "" or what is wrong with the request.
  std::string finalize();
  int64_t prefix_tokens() const;  // tokens cached before the step
};

// The default mixed batch: a short prefill (kv_len <= topk), a chunked prefill of `chunk` new
// rows over a cached prefix (kv_len = context) and `decode_seqs` decodes of next_n tokens.
BatchSpec default_batch(const dsa::ModelGeometry& geo, int context, int chunk, int short_len,
                        int decode_seqs, int next_n);

// One timed piece of work.
struct StageResult {
  std::string name;
  std::string what;     // human-readable description of the call(s)
  double ms = 0.0;
  bool ran = false;
  std::string error;    // a failed call or a device error
};

// All buffers of one run. Host copies hold the inputs (generated on the host) and, after
// download_all(), the outputs.
struct RunBuffers {
  // inputs of the step (new tokens)
  std::unique_ptr<Buffer> idx_q;        // [R, H_idx, 128] bf16 (sparse rows only)
  std::unique_ptr<Buffer> idx_w;        // [R, H_idx] f32
  std::unique_ptr<Buffer> idx_k;        // [T, 128] bf16
  std::unique_ptr<Buffer> kv_c;         // [T, 512] bf16
  std::unique_ptr<Buffer> k_pe;         // [T, 64] bf16
  std::unique_ptr<Buffer> q_mla;        // [T, H, 576] bf16
  std::unique_ptr<Buffer> positions;    // [T] i32
  std::unique_ptr<Buffer> cos_sin;      // [max_kv_len, 64] f32
  // addressing
  std::unique_ptr<Buffer> block_table;  // [B, max_blocks] i32
  std::unique_ptr<Buffer> token_seq;    // [T] i32
  std::unique_ptr<Buffer> slots;        // [T] i64
  std::unique_ptr<Buffer> kv_lens;      // [B] i32
  std::unique_ptr<Buffer> cu_seqlens_q; // [num_dense_seqs + 1] i32
  std::unique_ptr<Buffer> row_seq;      // [R] i32 (sparse rows)
  std::unique_ptr<Buffer> row_len;      // [R] i32 (sparse rows: keys each row sees)
  // caches
  std::unique_ptr<Buffer> idx_cache;    // num_blocks * page * 132 B
  std::unique_ptr<Buffer> mla_cache;    // num_blocks * page * token bytes
  // intermediates and outputs
  std::unique_ptr<Buffer> q8;           // [R, H_idx, 128] e4m3
  std::unique_ptr<Buffer> w_folded;     // [R, H_idx] f32
  std::unique_ptr<Buffer> q_scale;      // [R, H_idx] f32 (s_q, already folded into w_folded)
  std::unique_ptr<Buffer> k8;           // [T, 128] e4m3
  std::unique_ptr<Buffer> k_scale;      // [T] f32
  std::unique_ptr<Buffer> logits;       // [R, W] f32
  std::unique_ptr<Buffer> topk_idx;     // [R, topk] i32 (request-local)
  std::unique_ptr<Buffer> mapped;       // [R, topk] i32 (cache slots)
  std::unique_ptr<Buffer> out;          // [T, H, 512] bf16
  std::unique_ptr<Buffer> lse;          // [T, H] f32
  std::unique_ptr<Buffer> workspace;    // max of the ops' workspace queries

  size_t workspace_topk = 0, workspace_sparse = 0, workspace_dense = 0;
  size_t total_bytes = 0;               // backend memory of all buffers
};

// Allocates, fills the inputs from spec.seed and writes the cached prefix of every sequence
// into both caches (prepare_indexer_k + the two cache writes on the prefix tokens).
// Returns "" or the error. `progress` lines go to stderr.
std::string setup_run(const BatchSpec& spec, RunBuffers* b, bool progress);

// The stages of one DSA layer step, in order (SPEC §6).
StageResult stage_prepare_indexer_k(const BatchSpec& s, RunBuffers& b);
StageResult stage_prepare_indexer_q(const BatchSpec& s, RunBuffers& b);
StageResult stage_write_indexer_cache(const BatchSpec& s, RunBuffers& b);
StageResult stage_write_mla_cache(const BatchSpec& s, RunBuffers& b);
StageResult stage_indexer_logits(const BatchSpec& s, RunBuffers& b);
StageResult stage_topk(const BatchSpec& s, RunBuffers& b);
StageResult stage_map_indices(const BatchSpec& s, RunBuffers& b);
StageResult stage_sparse_mla(const BatchSpec& s, RunBuffers& b);
StageResult stage_dense_mla(const BatchSpec& s, RunBuffers& b);

using StageFn = StageResult (*)(const BatchSpec&, RunBuffers&);
struct StageEntry {
  const char* name;
  StageFn fn;
};
// The step in order.
const std::vector<StageEntry>& step_stages();

// Brings every output back to the host copies (no-op on the CPU).
std::string download_all(RunBuffers& b);

}  // namespace dsa_cli
