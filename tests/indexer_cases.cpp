#include "indexer_cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dsa/dsa.h"

namespace dsa_test {
namespace {
constexpr int64_t D = kIndexDim;
}  // namespace

using namespace dsa;

QuantRows quantise(Rng& rng, int64_t rows, int64_t heads, float sd) {
  QuantRows r;
  r.x = dsa_test::random_floats(rng, static_cast<size_t>(rows * heads * D), sd);
  r.x8.resize(r.x.size());
  r.scale.resize(static_cast<size_t>(rows * heads));
  for (int64_t v = 0; v < rows * heads; ++v) {
    float amax = 0;
    for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(round_to_bf16(r.x[v * D + d])));
    const float s = ue8m0_scale(amax);
    r.scale[v] = s;
    for (int64_t d = 0; d < D; ++d) r.x8[v * D + d] = quantize_e4m3(round_to_bf16(r.x[v * D + d]), 1.f / s);
  }
  return r;
}

Inputs make_inputs(Rng& rng, int64_t M, int64_t H, int64_t N) {
  Inputs in;
  in.H = H;
  in.q = quantise(rng, M, H);
  in.k = quantise(rng, N, 1);
  in.gate = dsa_test::random_floats(rng, static_cast<size_t>(M * H));
  in.weights.resize(in.gate.size());
  for (size_t i = 0; i < in.gate.size(); ++i) in.weights[i] = in.gate[i] * in.q.scale[i];
  return in;
}

PagedCache make_cache(Rng& rng, const std::vector<int64_t>& lens, int64_t page, const QuantRows& keys,
                      std::vector<int64_t>* key_offset, int64_t extra_stride) {
  PagedCache c;
  c.page = page;
  c.max_blocks = 1;
  int64_t used = 0;
  for (int64_t l : lens) {
    c.max_blocks = std::max(c.max_blocks, (l + page - 1) / page + 1);
    used += (l + page - 1) / page;
  }
  c.num_blocks = used + 3;
  c.block_bytes = page * kIndexerTokenBytes + extra_stride;
  c.bytes = Guarded(static_cast<size_t>(c.num_blocks * c.block_bytes));
  c.bytes.fill(0x7f);  // e4m3 NaN, and the f32 scale 0x7f7f7f7f... is a huge number; make it NaN:
  for (int64_t b = 0; b < c.num_blocks; ++b)
    for (int64_t t = 0; t < page; ++t) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(c.bytes.as<uint8_t>() + b * c.block_bytes + page * D + t * 4, &nan, 4);
    }
  std::vector<int32_t> order(static_cast<size_t>(c.num_blocks));
  for (int64_t b = 0; b < c.num_blocks; ++b) order[b] = static_cast<int32_t>(b);
  std::shuffle(order.begin(), order.end(), rng.gen);
  c.block_table.assign(static_cast<size_t>(lens.size() * c.max_blocks), -1);
  size_t next = 0;
  int64_t off = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    key_offset->push_back(off);
    for (int64_t j = 0; j < lens[s]; ++j) {
      if (j % page == 0) c.block_table[s * c.max_blocks + j / page] = order[next++];
      uint8_t* base = c.bytes.as<uint8_t>() + c.block_table[s * c.max_blocks + j / page] * c.block_bytes;
      std::memcpy(base + (j % page) * D, &keys.x8[(off + j) * D], D);
      std::memcpy(base + page * D + (j % page) * 4, &keys.scale[off + j], 4);
    }
    off += lens[s];
  }
  return c;
}

}  // namespace dsa_test
