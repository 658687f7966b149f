// The workspace of dense_mha_prefill (include/dsa/mha.h) and its sequence groups: shared by
// src/core/api_mha.cpp (validation, grouping, the planner's sizing) and both backends.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dsa/mha.h"
#include "dsa/types.h"

namespace dsa {
namespace core {

constexpr int64_t kMhaLatentDim = 512;
constexpr int64_t kMhaRopeDim = 64;
constexpr int64_t kMhaAlign = 256;
// cuBLAS workspace handed over with cublasSetWorkspace (its recommendation for Hopper).
constexpr int64_t kMhaCublasWorkspace = int64_t{32} << 20;

// Offsets (from the 256-aligned start of the workspace) of a group of `tokens` context tokens:
//   kv:     [tokens, H, qk_nope + v] bf16: per token and head K_nope then V (the GEMM's output
//           row c_kv · Wᵀ, HF kv_b_proj order), rounded to bf16
//   latent: [tokens, 576] gathered latents [c_kv | k_pe] (f32 on the CPU, bf16 on CUDA; FP8
//           caches dequantised, which is exact in both)
//   extra:  CPU: the weight in f32 [H (qk_nope + v), 512]; CUDA: cuBLAS's workspace
struct MhaLayout {
  int64_t kv = 0, latent = 0, extra = 0, total = 0;  // total includes kMhaAlign of slack
};
MhaLayout mha_layout(DeviceType device, int64_t H, int64_t qk_nope, int64_t v, int64_t tokens);

class ArgCheck;
// The layer's kv_b_proj weight, [H * (qk_nope + v), 512] bf16 (HF layout), for every op that
// takes it (dense_mha_prefill, the projections, the step's core mode): presence, dtype, shape
// and strides, the message stating the shape it expects. `when` qualifies "is required"
// (" in core mode"); empty for the ops.
void check_kv_b_proj(ArgCheck& c, const TensorDesc& w, int64_t H, int64_t qk_nope, int64_t v, const char* when = "");

// Whether `device` has an MHA-form kernel for (qk_nope, v): any multiples of 16 on the CPU;
// (128 | 192, 128 | 256) on CUDA (DeepSeek-V3.2 and GLM-5).
inline bool mha_geometry_supported(DeviceType device, int64_t qk_nope, int64_t v) {
  if (qk_nope <= 0 || v <= 0 || qk_nope % 16 != 0 || v % 16 != 0) return false;
  if (device == DeviceType::kCPU) return true;
  return (qk_nope == 128 || qk_nope == 192) && (v == 128 || v == 256);
}

// A group of sequences [b0, b1) whose contexts share the workspace. packed: sequence b's
// context starts at the sum of kv_len of b0 .. b-1 (host lengths known); else at (b - b0) *
// seq_stride (seq_stride = the block table's capacity). tokens: rows the group decompresses.
struct MhaGroup {
  int64_t b0 = 0, b1 = 0;
  int64_t tokens = 0;
  bool packed = true;
  int64_t seq_stride = 0;
};

}  // namespace core
}  // namespace dsa
