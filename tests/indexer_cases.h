// Indexer test inputs shared by the logits and fused score-and-select tests: quantised q/k
// rows (SPEC §3.3) and a paged indexer cache whose unused slots hold NaN.
#pragma once
#include <cstdint>
#include <vector>

#include "test_util.h"

namespace dsa_test {

constexpr int64_t kIndexDim = 128;

// Quantised indexer inputs, produced with the dsa/numerics.h conversions (SPEC §3.3).
struct QuantRows {
  std::vector<float> x;        // original f32 values [rows, heads, 128]
  std::vector<uint8_t> x8;     // e4m3
  std::vector<float> scale;    // [rows, heads]
};
QuantRows quantise(Rng& rng, int64_t rows, int64_t heads, float sd = 1.f);

struct Inputs {
  int64_t H = 0;
  QuantRows q, k;
  std::vector<float> gate;     // unfolded w
  std::vector<float> weights;  // folded w' = w * s_q
};
Inputs make_inputs(Rng& rng, int64_t M, int64_t H, int64_t N);

struct PagedCache {
  int64_t page, num_blocks, max_blocks, block_bytes;
  Guarded bytes;
  std::vector<int32_t> block_table;  // [B, max_blocks]
};

// Sequences of the given lengths in a cache whose unused slots (and pages) hold NaN; blocks
// are handed out in a shuffled order; block-table entries past a sequence's pages are -1.
// keys holds the sequences' keys back to back; *key_offset gets each sequence's first.
PagedCache make_cache(Rng& rng, const std::vector<int64_t>& lens, int64_t page, const QuantRows& keys,
                      std::vector<int64_t>* key_offset, int64_t extra_stride = 0);

}  // namespace dsa_test
