// Float64 oracle for the indexer preparation and cache-write family (SPEC §3.1-3, §4).
#pragma once
#include <cstdint>
#include <vector>

namespace oracle {

// RoPE on dims 0..63 of a 128-vector in double. cos_sin_row = [cos 32 | sin 32].
// half_split: pairs (i, i + 32); else interleaved pairs (2i, 2i + 1).
void rope(double* x, const float* cos_sin_row, bool half_split);
// y = H x / sqrt(128) with H[i][j] = (-1)^popcount(i & j) (Sylvester order), by the matrix.
void hadamard128(const double* x, double* y);
// The pre-rounding value of the pipeline: RoPE, then optionally Hadamard.
std::vector<double> prep_vector(const std::vector<double>& x, const float* cos_sin_row,
                                bool half_split, bool hadamard);
// SPEC §3.3 on values already representable (the caller rounds to BF16): scale and codes.
double quantize_group(const double* v, int64_t n, uint8_t* codes);
// c = fl(1 / sqrt(128 * H_idx)).
float gate_constant(int64_t heads);

// One MLA cache token's bytes from kv_c (512) and k_pe (64) values (rounded to BF16 here).
std::vector<uint8_t> mla_token_bytes(const double* kv_c, const double* k_pe, bool fp8);
// The f32 values read_mla_cache must return for a token written from kv_c / k_pe.
std::vector<double> mla_token_values(const double* kv_c, const double* k_pe, bool fp8);

}  // namespace oracle
