// Float64 oracle for sparse and dense MLA attention (SPEC §5) and for decoding MLA cache
// bytes (SPEC §4). Written from the spec alone: plain loops, double arithmetic.
#pragma once
#include <cstdint>
#include <vector>

#include "oracle/oracle_numerics.h"

namespace oracle {

constexpr int kMlaDim = 576;
constexpr int kMlaVDim = 512;

// Format decoding (e4m3_value, bf16_value) comes from oracle/oracle_numerics.h.

// Every slot of a paged MLA cache as doubles: [num_blocks * page_size][576].
// fp8 = false: BF16 layout (1152 B/token); true: FP8 layout (656 B/token).
std::vector<double> decode_mla_cache(const void* data, bool fp8, int64_t num_blocks,
                                     int64_t page_size, int64_t block_stride_bytes);

struct MlaResult {
  std::vector<double> out;  // [T][H][512]
  std::vector<double> lse;  // [T][H], +inf for rows without a valid key
  // Conditioning, for tolerances: Σ p |v| / Σ p per output element (times the sink factor),
  // and sm_scale · max_j Σ_d |q_d k_d| per row (the size of the scores' rounding).
  std::vector<double> out_scale;    // [T][H][512]
  std::vector<double> score_scale;  // [T][H]
};

// keys: [num_keys][576]. indices: [T][K]. topk_length: empty or [T]. sink: empty or [H].
MlaResult sparse_mla(const std::vector<double>& q, int64_t T, int64_t H,
                     const std::vector<double>& keys, int64_t num_keys,
                     const std::vector<int32_t>& indices, int64_t K,
                     const std::vector<int32_t>& topk_length, const std::vector<double>& sink,
                     double sm_scale);

// Dense causal varlen: key j of sequence b is keys[cu_k[b] + j] (flat, cu_k given) or
// keys[block_table[b][j / page] * page + j % page] (paged, kv_lens and block_table given).
MlaResult dense_mla(const std::vector<double>& q, int64_t T, int64_t H,
                    const std::vector<double>& keys, const std::vector<int32_t>& cu_q,
                    const std::vector<int32_t>& cu_k, const std::vector<int32_t>& block_table,
                    int64_t max_blocks, const std::vector<int32_t>& kv_lens, int64_t page,
                    const std::vector<double>& sink, double sm_scale);

}  // namespace oracle
