// Dense causal attention in MHA form over the paged latent cache (SPEC §5b): short prefills.
//
// The layer's kv_b_proj weight W [H·(qk_nope + v), 512] (bf16, HF layout: per head h, rows
// h·(qk_nope+v) .. +qk_nope are W_UK[h], the next v rows W_UV[h]) decompresses every context
// token j of a sequence once per head:
//   k[j, h] = [W_UK[h]·c_kv[j] (qk_nope) | k_pe[j] (64)],   v[j, h] = W_UV[h]·c_kv[j] (v)
// rounded to bf16 (as engines do). Each query is [q_nope[t, h] | q_pe[t, h]] and
//   out[t, h] = Σ_{j < L_t} softmax_j(sm_scale · q[t, h]·k[j, h]) · v[j, h]
//   lse[t, h] = ln Σ_{j < L_t} exp(sm_scale · q[t, h]·k[j, h])
// with L_t = kv_len - q_len + i + 1 for the i-th new token of its sequence (causal, prefix
// offsets, as dense_mla). Optional attn_sink [H] as in SPEC §5. Equals dense_mla with
// q_abs = [W_UK[h]ᵀ q_nope | q_pe] followed by out = W_UV[h]·out_latent, up to rounding.
//
// Workspace: the decompressed K/V of the batch's contexts live in the caller's workspace
// (never allocated). When the workspace holds less than the whole batch, the op runs the
// batch in sequence groups, each group's contexts decompressed into the same space; results
// are identical to one group. The least workspace that works holds one sequence's context.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dsa/cache.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

struct DenseMhaPrefillParams {
  TensorDesc q_nope;        // [T, H, qk_nope] bf16 (f32 on the CPU too), last dim contiguous
  TensorDesc q_pe;          // [T, H, 64], dtype of q_nope, last dim contiguous
  MlaCacheDesc cache;       // paged latent cache, BF16 or FP8 layout (SPEC §4)
  TensorDesc block_table;   // [B, max_blocks] i32
  TensorDesc kv_lens;       // [B] i32, on the device of the tensors
  TensorDesc cu_seqlens_q;  // [B + 1] i32, on the device of the tensors
  // Optional host (CPU) copies of kv_lens / cu_seqlens_q for a CUDA call: with them, groups
  // are packed by the real context lengths; without them, every sequence is budgeted at the
  // block table's capacity (max_blocks * page_size tokens). Ignored on the CPU.
  TensorDesc kv_lens_host;
  TensorDesc kv_b_proj;     // [H * (qk_nope + v), 512] bf16, last dim contiguous
  TensorDesc attn_sink;     // optional [H] f32
  float sm_scale = 0.0f;
  TensorDesc out;           // [T, H, v] bf16 or f32, last dim contiguous
  TensorDesc lse;           // [T, H] f32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};

struct MhaWorkspaceSize {
  size_t min_bytes = 0;    // one sequence (the batch's longest context): the least that works
  size_t batch_bytes = 0;  // every sequence of the batch in one group
};
// Zero sizes when the params do not validate (the op itself reports why).
MhaWorkspaceSize dense_mha_prefill_workspace_size(const DenseMhaPrefillParams& p);
Status dense_mha_prefill(const DenseMhaPrefillParams& p);

// Bytes of workspace a group of `context_tokens` context tokens needs on `device` for heads
// H, qk_nope and v (decompressed K/V and the gathered latents; on CUDA plus the GEMM scratch
// given to cuBLAS; on the CPU plus the weight in f32). The planner's sizing function.
int64_t mha_prefill_workspace_bytes(Device device, int64_t num_heads, int64_t qk_nope, int64_t v_dim,
                                    int64_t context_tokens);

// FLOP cost model of the two forms of dense attention for one sequence of q_len new tokens
// and kv_len keys (SPEC §5b; docs/mha.md): MHA pays 2·512·H·(qk_nope + v) per key once plus
// 2·H·(qk_nope + 64 + v) per causal (query, key) pair; absorbed pays 2·H·(576 + 512) per pair
// plus absorbing q (2·H·qk_nope·512 per query) and up-projecting out (2·H·v·512 per query).
struct MhaCost {
  double mha_flops = 0;
  double absorbed_flops = 0;
};
MhaCost mha_form_cost(int64_t q_len, int64_t kv_len, int64_t num_heads, int64_t qk_nope, int64_t v_dim);
// True when the MHA form is cheaper (a 2048-token prompt: yes; a decode of next_n 2: no).
bool prefer_mha_form(int64_t q_len, int64_t kv_len, int64_t num_heads, int64_t qk_nope, int64_t v_dim);

// The two per-head projections of the absorbed form (SPEC §5b, §6 core mode), with the
// kv_b_proj layout above:
//   absorb:     q_out[t, h] = [W_UK[h]ᵀ·q_nope[t, h] (512) | q_pe[t, h] (64)]     [T, H, 576]
//   up-project: out[t, h]   = W_UV[h]·latent[t, h]                          (v)    [T, H, v]
// f32 accumulation; the output dtype's rounding once at the end. CPU: bf16 or f32 in and out.
// CUDA: one batched cuBLAS GEMM over the heads, bf16 inputs, bf16 or f32 outputs (f32 inputs
// are kUnsupported), row strides (stride[0]) of at least the row's width below 2^31; it
// allocates and synchronises nothing, so it can be captured in a CUDA graph once a first call
// outside capture has created the device's cuBLAS handle.
struct MlaAbsorbQParams {
  TensorDesc q_nope;     // [T, H, qk_nope] bf16 or f32, last dim contiguous
  TensorDesc q_pe;       // [T, H, 64], dtype of q_nope, last dim contiguous
  TensorDesc kv_b_proj;  // [H * (qk_nope + v), 512] bf16, last dim contiguous
  int64_t v_dim = 0;     // v of the weight (its rows per head are qk_nope + v_dim)
  TensorDesc q_out;      // [T, H, 576] bf16 or f32, last dim contiguous
  void* stream = nullptr;
};
Status mla_absorb_q(const MlaAbsorbQParams& p);

struct MlaUpProjectParams {
  TensorDesc latent;     // [T, H, 512] bf16 or f32, last dim contiguous
  TensorDesc kv_b_proj;  // [H * (qk_nope + v), 512] bf16, last dim contiguous
  int64_t qk_nope = 0;   // qk_nope of the weight
  TensorDesc out;        // [T, H, v] bf16 or f32, last dim contiguous
  void* stream = nullptr;
};
Status mla_up_project(const MlaUpProjectParams& p);

}  // namespace dsa
