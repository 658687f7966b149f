// Sparse and dense MLA attention in absorbed (MQA) form (SPEC §5).
// Each query head is a 576-vector [q_nope·W_UK (512) | rope(q_pe) (64)]; every key is the
// shared latent [c_kv 512 | k_pe 64] and its value is c_kv (the first 512 dims).
//   out[t, h] = Σ_j softmax_j(sm_scale · q[t, h] · kv[j]) · kv[j][0:512]
//   lse[t, h] = ln Σ_j exp(sm_scale · q[t, h] · kv[j])       (natural log, no sink)
// A row with no valid key returns out = 0 and lse = +inf. With attn_sink [H], the output is
// multiplied by exp(lse) / (exp(lse) + exp(sink[h])). Scores and accumulation are f32; FP8
// caches dequantise as e4m3 · scale per 128-value tile (exact in f32).
#pragma once
#include <cstddef>
#include <cstdint>

#include "dsa/cache.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

// The keys: either a flat buffer or a paged MLA cache (exactly one given).
struct MlaKv {
  TensorDesc flat;     // [S, 576] bf16 (f32 on the CPU too), last dim contiguous
  MlaCacheDesc paged;  // BF16 or FP8 layout
};

// Sparse: S_t = the valid entries of indices[t, :]. An index is invalid if < 0, >= the key
// count (S for flat, num_blocks * page_size for paged: indices are cache slots), or at
// position >= topk_length[t]. Invalid indices and unused cache slots (which may hold NaN) never
// reach the output. Prefill and decode alike: decode rows are just rows.
struct SparseMlaParams {
  TensorDesc q;            // [T, H, 576] bf16 (f32 on the CPU too), last dim contiguous
  MlaKv kv;
  TensorDesc indices;      // [T, K] i32: key rows (flat) or cache slots (paged)
  TensorDesc topk_length;  // optional [T] i32
  TensorDesc attn_sink;    // optional [H] f32
  float sm_scale = 0.0f;
  TensorDesc out;          // [T, H, 512] bf16 or f32, last dim contiguous
  TensorDesc lse;          // [T, H] f32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
size_t sparse_mla_workspace_size(const SparseMlaParams& p);
Status sparse_mla(const SparseMlaParams& p);

// Dense causal varlen attention with prefix offsets. Sequence b has q_len = cu_seqlens_q[b+1]
// - cu_seqlens_q[b] new tokens and kv_len keys in all; its query i sees keys
// 0 .. kv_len - q_len + i. Keys come from
//   flat:  rows cu_seqlens_k[b] .. cu_seqlens_k[b+1] of kv.flat (kv_len = their count), or
//   paged: key j at slot block_table[b][j / page] * page + j % page, kv_len = kv_lens[b].
// Requires q_len <= kv_len for every sequence.
struct DenseMlaParams {
  TensorDesc q;             // [T, H, 576] bf16 (f32 on the CPU too)
  MlaKv kv;
  TensorDesc cu_seqlens_q;  // [B + 1] i32
  TensorDesc cu_seqlens_k;  // flat: [B + 1] i32
  TensorDesc block_table;   // paged: [B, max_blocks] i32
  TensorDesc kv_lens;       // paged: [B] i32
  TensorDesc attn_sink;     // optional [H] f32
  float sm_scale = 0.0f;
  TensorDesc out;           // [T, H, 512] bf16 or f32
  TensorDesc lse;           // [T, H] f32
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
};
size_t dense_mla_workspace_size(const DenseMlaParams& p);
Status dense_mla(const DenseMlaParams& p);

}  // namespace dsa
