// Several GPUs (docs/distributed.md): a small communicator interface (NCCL, or an in-process
// group of simulated ranks for tests), a context-parallel prefill step, an exact distributed
// top-k over a KV cache sharded by token index, and the partial-attention merge by lse.
// Free of NCCL types: an engine hands its ncclComm_t over as an opaque pointer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dsa/layer.h"
#include "dsa/planner.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {
namespace dist {

enum class ReduceOp : int32_t { kSum = 0, kMax = 1 };

// The collectives the distributed ops use. Every rank of the group calls the same collectives
// in the same order with the same sizes. Buffers live on device() (host memory for a CPU
// group); `stream` is the cudaStream_t the collective is ordered on (ignored on the CPU).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  // recv [size() * bytes] receives rank r's `bytes` bytes at offset r * bytes. In place when
  // send == recv + rank() * bytes.
  virtual Status all_gather(const void* send, void* recv, size_t bytes, void* stream) = 0;
  // Element-wise reduction of `count` f32 values; every rank gets the same result.
  virtual Status all_reduce_f32(const float* send, float* recv, size_t count, ReduceOp op,
                                void* stream) = 0;
  // Collectives between group_start and group_end may be fused (ncclGroupStart/End).
  virtual Status group_start() { return Status::Ok(); }
  virtual Status group_end() { return Status::Ok(); }
};

// R ranks simulated in one process, for tests and single-GPU development. Each communicator
// must be driven from its own thread: a collective blocks until every rank of the group has
// called it. Buffers on `device` (CPU: host memory; CUDA: one device, copies on the callers'
// streams, each rank's stream synchronised at the collective).
Status make_local_group(int ranks, Device device,
                        std::vector<std::unique_ptr<Communicator>>* out);

// True when the library was built with NCCL (DSA_NCCL).
bool nccl_available();
// Wraps an engine's communicator. nccl_comm is its ncclComm_t (not owned); device its CUDA
// ordinal. kUnsupported when built without NCCL.
Status make_nccl_communicator(void* nccl_comm, int device_index,
                              std::unique_ptr<Communicator>* out);

// ---------------------------------------------------------------------------------------
// Context-parallel prefill (SGLang-style CP, "zigzag" in-sequence split).
//
// Sharding: the q_len new tokens of every sequence are cut into 2R contiguous chunks of
// near-equal size (the first q_len % 2R chunks one token longer); rank r serves chunks r and
// 2R-1-r, so every rank gets one early (cheap) and one late (costly) chunk of the causal
// triangle. Exception, so that a rank's piece is routed as the whole sequence would be: for a
// sequence with kv_len > topk, the leading chunks whose last key position is < topk join the
// first chunk that ends past it, on rank 0. Chunks of zero tokens are dropped (a rank may
// serve nothing). A rank's rows ("local rows") are its pieces in (sequence, chunk) order.
//
// Every rank holds a full replica of the caches of the step's sequences: the step all-gathers
// the new tokens' indexer keys (FP8 + scale) and MLA latents and writes the other ranks'
// tokens into its caches, then runs the ordinary Attention::step on its own rows (each piece
// is a chunked prefill: q_len = piece length, kv_len = its last position + 1).

// One piece: tokens [q_begin, q_begin + q_len) of sequence `seq`'s new tokens.
struct CpPiece {
  int32_t seq = 0;
  int32_t q_begin = 0;
  int32_t q_len = 0;
  int32_t kv_len = 0;  // the step's kv_len for the piece: its last position + 1
};
// The pieces of rank `rank` for a batch (q_lens, kv_lens: [B] host i32), in local-row order.
Status cp_shard(const int32_t* q_lens, const int32_t* kv_lens, int64_t B, int64_t topk,
                int ranks, int rank, std::vector<CpPiece>* pieces);

// The per-rank planner config for a global one: the same limits, max_seqs_per_step doubled
// (at most two pieces of a sequence per rank). Plan each rank's Attention with it.
PlannerConfig cp_rank_config(const PlannerConfig& global, int ranks);

struct CpStepParams {
  StepParams step;   // the rank's step: inputs, out, lse, indices over its LOCAL rows
                     // (kv_c, k_pe, q, index_* , positions, out, lse, indices_*: [T_local, ...]);
                     // block_table [B, max_blocks] of the global batch; q_lens / kv_lens are
                     // ignored (below); workspace = the Attention plan's workspace
  TensorDesc q_lens;   // [B] i32 host: the global batch
  TensorDesc kv_lens;  // [B] i32 host
  void* cp_workspace = nullptr;     // >= cp_workspace_size
  size_t cp_workspace_bytes = 0;
};

// Bytes of the gather buffers and metadata of a CP step within the plan's limits (plan: the
// rank's plan from cp_rank_config): R * max_tokens_per_step rows of 132 B of indexer key and
// 576 f32 of latent (a bound for bf16 inputs too), plus per-token and per-piece metadata.
int64_t cp_workspace_size(const Plan& rank_plan, int ranks);

// One object per rank and layer stack; keeps host metadata buffers sized at construction.
// Not re-entrant. CUDA: eager only (metadata goes up with cudaMemcpyAsync from ordinary host
// memory, so it cannot be captured into a graph).
class ContextParallel {
 public:
  ContextParallel(const Plan& rank_plan, Communicator* comm);
  Status status() const { return status_; }
  // The gather and cache writes, then attn.step on this rank's rows. Every rank calls it for
  // every layer (a rank without rows still joins the gather). role kShared: nothing to gather
  // for the indexer (shared layers own no indexer cache); only latents travel.
  Status step(Attention& attn, const CpStepParams& p, StepReport* report = nullptr);
  // This rank's pieces of the last step.
  const std::vector<CpPiece>& pieces() const { return pieces_; }

 private:
  Plan plan_;
  Communicator* comm_;
  Status status_;
  std::vector<CpPiece> pieces_;
  std::vector<std::vector<CpPiece>> all_pieces_;
  std::vector<int32_t> h_q_lens_, h_kv_lens_, h_token_seq_, h_token_pos_;
  std::vector<int32_t> h_in_q_, h_in_kv_;
  std::vector<int64_t> h_rows_;
};

// ---------------------------------------------------------------------------------------
// Exact distributed top-k (vLLM DCP style): the keys of every row are sharded by token index
// across the R ranks of `comm` in runs of `interleave` tokens: global position g lives on rank
// (g / I) % R at local index (g / (I R)) I + g % I. Each rank selects its local top-k (with
// values and global positions); the candidates are all-gathered, merged in global-position
// order, and the global top-k is selected among them. The result is identical, on every
// rank, to topk() of the unsharded row (SPEC §3.5: ties at the k-th value to the lower
// position, NaN below every number, rows of L <= k keys give 0 .. L-1, -1 fill).
struct DistTopkParams {
  TensorDesc logits;    // [M, W_local] f32 or bf16: row i's scores of this rank's keys (local index)
  TensorDesc lengths;   // [M] i32: keys of row i on this rank (<= W_local)
  int64_t k = 2048;     // a positive multiple of 64, as topk
  int64_t interleave = 1;
  TensorDesc indices;   // [M, k] i32: global positions, ascending, -1 padded
  TensorDesc values;    // optional [M, k] f32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
// Local candidates [M, k], gathered candidates [R, M, k] and merged rows [M, R k] (values and
// positions each), the selection [M, k] and the larger of the two topk() workspaces.
size_t dist_topk_workspace_size(const DistTopkParams& p, int ranks);
Status dist_topk(const DistTopkParams& p, Communicator& comm);

// Global positions of a selection -> this rank's local key positions (-1 where another rank
// owns the key, or where the entry is -1): the indices a rank's partial sparse attention
// reads (map them to cache slots with map_indices over the rank's own block table).
struct DcpLocalIndicesParams {
  TensorDesc indices;   // [M, k] i32 global positions
  int64_t interleave = 1;
  TensorDesc out;       // [M, k] i32 (may alias indices)
  void* stream = nullptr;
};
Status dcp_local_indices(const DcpLocalIndicesParams& p, int ranks, int rank);

// ---------------------------------------------------------------------------------------
// Partial-attention merge by lse. Rank r holds out_r, lse_r of attention over its own keys
// (lse_r = +inf: no valid key, out_r = 0; computed WITHOUT the sink). The merge gives, on
// every rank, lse = ln Σ_r exp(lse_r) over ranks with lse_r != +inf, and
// out = Σ_r exp(lse_r - lse) out_r (ranks in order 0 .. R-1, f32); no rank with a key:
// out = 0, lse = +inf. The sink, when given, is applied once, after the merge:
// out *= exp(lse) / (exp(lse) + exp(sink[h])).
struct LseMergeParams {
  TensorDesc out_partial;  // [T, H, D] f32 or bf16, contiguous (D <= 1024)
  TensorDesc lse_partial;  // [T, H] f32, contiguous
  TensorDesc attn_sink;    // optional [H] f32
  TensorDesc out;          // [T, H, D] f32 or bf16
  TensorDesc lse;          // optional [T, H] f32: merged, without the sink
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
// R * T * H * (D * elem(out_partial) + 4) bytes: the gathered partials.
size_t lse_merge_workspace_size(const LseMergeParams& p, int ranks);
Status lse_merge(const LseMergeParams& p, Communicator& comm);

}  // namespace dist
}  // namespace dsa
