// Float64 oracle for dense attention in MHA form (SPEC §5b). Written from the spec alone.
#pragma once
#include <cstdint>
#include <vector>

namespace oracle {

struct MhaResult {
  std::vector<double> out;          // [T][H][v]
  std::vector<double> lse;          // [T][H]
  std::vector<double> out_scale;    // Σ p |v| / Σ p per output element (conditioning)
  std::vector<double> score_scale;  // sm_scale · max_j Σ_d |q_d k_d| per row
};

// Decompresses with w [H·(qk_nope + v)][512] (HF kv_b_proj rows) and attends causally.
// latents: [slots][576] decoded cache (decode_mla_cache); key j of sequence b is slot
// block_table[b][j / page] * page + j % page. q_nope [T][H][qk_nope], q_pe [T][H][64].
// round_kv: round the decompressed K_nope and V to bf16 first (what the op computes).
MhaResult dense_mha(const std::vector<double>& q_nope, const std::vector<double>& q_pe, int64_t T, int64_t H,
                    int64_t qk_nope, int64_t v, const std::vector<double>& w, const std::vector<double>& latents,
                    const std::vector<int32_t>& cu_q, const std::vector<int32_t>& block_table, int64_t max_blocks,
                    const std::vector<int32_t>& kv_lens, int64_t page, const std::vector<double>& sink,
                    double sm_scale, bool round_kv);

// Nearest bf16 value of x (round to nearest even), as a double.
double round_bf16(double x);

}  // namespace oracle
