// Float64 oracle for indexer logits, top-k and index mapping (SPEC §3.4-3.6).
#pragma once
#include <cstdint>
#include <vector>

namespace oracle {

// Flat logits: out[i*W + c] for key j = ks[i] + col_offset + c; -inf where j >= ke[i].
// q8 [M, H, 128], w [M, H], k8 [N, 128], k_scale [N]; all contiguous.
std::vector<double> indexer_logits(const std::vector<uint8_t>& q8, const std::vector<float>& w,
                                   const std::vector<uint8_t>& k8, const std::vector<float>& k_scale,
                                   const std::vector<int32_t>& ks, const std::vector<int32_t>& ke,
                                   int64_t H, int64_t col_offset, int64_t W);

// The same score on unquantised inputs: Σ_h w[i,h] · relu(q[i,h] · k[j]), no scales.
std::vector<double> indexer_logits_exact(const std::vector<float>& q, const std::vector<float>& w,
                                         const std::vector<float>& k, const std::vector<int32_t>& ks,
                                         const std::vector<int32_t>& ke, int64_t H, int64_t W);

// Paged logits: row r of sequence seq[r] sees keys j < len[r]; column c is key col_offset + c.
// cache bytes laid out as SPEC §4 pages of `page` tokens, block stride block_bytes.
std::vector<double> indexer_logits_paged(const std::vector<uint8_t>& q8, const std::vector<float>& w,
                                         const uint8_t* cache, int64_t block_bytes, int64_t page,
                                         const std::vector<int32_t>& block_table, int64_t max_blocks,
                                         const std::vector<int32_t>& seq, const std::vector<int32_t>& len,
                                         int64_t H, int64_t col_offset, int64_t W);

// Top-k of one row x[0:len]: ascending indices then -1 padding to k. NaN lowest, ties -> lower index.
std::vector<int32_t> topk_row(const float* x, int64_t len, int64_t k);

// One mapped index per SPEC §3.6 and topk.h: flat start + j; paged via the block-table row.
int32_t map_flat(int64_t start, int64_t j);
int32_t map_paged(const int32_t* bt_row, int64_t max_blocks, int64_t page, int64_t j);

}  // namespace oracle
