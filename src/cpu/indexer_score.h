// The CPU indexer's scoring core (SPEC §3.4), shared by the logits (indexer_logits.cpp) and the
// fused score-and-select (indexer_topk.cpp), so both compute bit-identical scores.
//
// Rows that read the same keys (a run of rows with one ks, or of one sequence in the paged
// form) form a tile of up to 16 rows. Per block of 64 keys the keys are dequantised once into
// a transposed f32 block Kt[128][64] (256-entry lookup table); then the tile's (row, head)
// pairs are scored against the block with an outer-product micro-kernel: broadcast q[p][d]
// times Kt[d][0:64] for 6 pairs at a time, 6 x 64 accumulators in vector registers, so even a
// lone decode row reuses each key load 6x. Each column's arithmetic (d order, then h order,
// then the key scale) never depends on the tile, the block or the column position.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dsa/numerics.h"
#include "dsa/types.h"

namespace dsa {
namespace cpu {
namespace score {

constexpr int kDim = 128;
constexpr int kTileRows = 16;
constexpr int kKeyBlock = 64;

typedef float v16f __attribute__((vector_size(64)));
constexpr int kVecs = kKeyBlock / 16;

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }

struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3_to_float(static_cast<uint8_t>(i));
  }
};
inline const E4m3Table& e4m3_table() {
  static const E4m3Table t;
  return t;
}

// Rows sharing one key sequence. Row r's valid columns are [0, nvalid[r]).
struct Tile {
  int64_t row[kTileRows];
  int64_t nvalid[kTileRows];
  int rows;
  int64_t seq;     // paged: sequence; flat: unused
  int64_t base_j;  // key index of column 0
  int64_t ncols;   // max nvalid
};

struct FlatKeys {
  const uint8_t* k;
  int64_t k_stride;
  const float* scale;
  int64_t scale_stride;
  const uint8_t* key(const Tile&, int64_t j) const { return k + j * k_stride; }
  float key_scale(const Tile&, int64_t j) const { return scale[j * scale_stride]; }
};

struct PagedKeys {
  const uint8_t* cache;
  int64_t block_bytes;
  int64_t page;
  const int32_t* bt;
  int64_t bt_s0, bt_s1;
  const uint8_t* block(const Tile& t, int64_t j) const {
    return cache + static_cast<int64_t>(bt[t.seq * bt_s0 + (j / page) * bt_s1]) * block_bytes;
  }
  const uint8_t* key(const Tile& t, int64_t j) const { return block(t, j) + (j % page) * kDim; }
  float key_scale(const Tile& t, int64_t j) const {
    float s;
    std::memcpy(&s, block(t, j) + page * kDim + (j % page) * 4, 4);
    return s;
  }
};

struct Scratch {
  std::vector<float> q;   // [kTileRows][H][128]
  std::vector<float> w;   // [kTileRows][H]
  std::vector<float> kt;  // [128][64]
  std::vector<float> ks;  // [64]
  std::vector<float> s;   // [kTileRows][64]
};

// Scores every (row, head) pair of the tile against the key block, kPairs pairs at a time
// (pair p = r * H + h, so q and w are indexed by p directly):
//   s[r][0:64] += w[p] · relu(q[p] · Kt)
// Each pair's dot runs over d in order, and row r's pairs are added in ascending h, whatever
// the grouping, so the result never depends on the tile's row count.
constexpr int kPairs = 6;

template <int P>
void score_pairs(const float* __restrict q, const float* __restrict w, const float* __restrict kt,
                 float* __restrict s, int64_t first, int64_t H) {
  const v16f zero = {};
  v16f acc[P][kVecs];
  for (int i = 0; i < P; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = zero;
  const float* qp = q + first * kDim;
  for (int d = 0; d < kDim; ++d) {
    v16f kv[kVecs];
    for (int v = 0; v < kVecs; ++v) kv[v] = load16(kt + d * kKeyBlock + v * 16);
    for (int i = 0; i < P; ++i) {
      const float qd = qp[i * kDim + d];
      for (int v = 0; v < kVecs; ++v) acc[i][v] += qd * kv[v];
    }
  }
  for (int i = 0; i < P; ++i) {
    const int64_t pair = first + i;
    float* srow = s + (pair / H) * kKeyBlock;
    const float wp = w[pair];
    for (int v = 0; v < kVecs; ++v) {
      v16f sv = load16(srow + v * 16);
      sv += wp * (acc[i][v] > zero ? acc[i][v] : zero);
      store16(srow + v * 16, sv);
    }
  }
}

inline void score_block(const float* q, const float* w, int64_t pairs, int64_t H, const float* kt, float* s) {
  int64_t p = 0;
  for (; p + kPairs <= pairs; p += kPairs) score_pairs<kPairs>(q, w, kt, s, p, H);
  switch (pairs - p) {
    case 5: score_pairs<5>(q, w, kt, s, p, H); break;
    case 4: score_pairs<4>(q, w, kt, s, p, H); break;
    case 3: score_pairs<3>(q, w, kt, s, p, H); break;
    case 2: score_pairs<2>(q, w, kt, s, p, H); break;
    case 1: score_pairs<1>(q, w, kt, s, p, H); break;
    default: break;
  }
}

// Row r of a paged scorer's params (IndexerLogitsPagedParams, IndexerTopkParams): its sequence
// and key count, from row_seq / row_len (general form) or kv_lens and next_n (decode form).
template <typename P>
void paged_row(const P& p, int64_t r, int64_t* seq, int64_t* len) {
  if (p.row_seq.present()) {
    *seq = p.row_seq.template ptr<const int32_t>()[r * p.row_seq.stride[0]];
    *len = p.row_len.template ptr<const int32_t>()[r * p.row_len.stride[0]];
  } else {
    *seq = r / p.next_n;
    *len = p.kv_lens.template ptr<const int32_t>()[*seq * p.kv_lens.stride[0]] - p.next_n + r % p.next_n + 1;
  }
}

// The paged indexer cache of such params, as the scoring core reads it.
template <typename P>
PagedKeys paged_keys(const P& p) {
  return PagedKeys{static_cast<const uint8_t*>(p.cache.data), p.cache.block_bytes(), p.cache.page_size,
                   p.block_table.template ptr<const int32_t>(), p.block_table.stride[0], p.block_table.stride[1]};
}

// Loads the tile's queries (dequantised) and gates into the scratch.
inline void load_queries(const Tile& t, const TensorDesc& qd, const TensorDesc& wd, Scratch& sc) {
  const float* lut = e4m3_table().v;
  const int64_t H = qd.shape[1];
  sc.q.resize(static_cast<size_t>(kTileRows * H * kDim));
  sc.w.resize(static_cast<size_t>(kTileRows * H));
  sc.kt.resize(kDim * kKeyBlock);
  sc.ks.resize(kKeyBlock);
  sc.s.resize(kTileRows * kKeyBlock);
  for (int r = 0; r < t.rows; ++r) {
    const uint8_t* qrow = qd.ptr<const uint8_t>() + t.row[r] * qd.stride[0];
    const float* wrow = wd.ptr<const float>() + t.row[r] * wd.stride[0];
    for (int64_t h = 0; h < H; ++h) {
      const uint8_t* qh = qrow + h * qd.stride[1];
      float* dst = sc.q.data() + (r * H + h) * kDim;
      for (int d = 0; d < kDim; ++d) dst[d] = lut[qh[d]];
      sc.w[r * H + h] = wrow[h * wd.stride[1]];
    }
  }
}

// Scores keys [b0, b0 + nk) of the tile (column b0 is key t.base_j + b0; nk <= 64) for every
// row: sc.s[r * 64 + c] = the score of column b0 + c (load_queries first). Columns past nk are
// scored against zero keys and mean nothing.
template <typename Keys>
void score_keys(const Tile& t, int64_t b0, int64_t nk, const Keys& keys, int64_t H, Scratch& sc) {
  const float* lut = e4m3_table().v;
  float* kt = sc.kt.data();
  for (int64_t c = 0; c < nk; ++c) {
    const uint8_t* kp = keys.key(t, t.base_j + b0 + c);
    for (int d = 0; d < kDim; ++d) kt[d * kKeyBlock + c] = lut[kp[d]];
    sc.ks[c] = keys.key_scale(t, t.base_j + b0 + c);
  }
  for (int64_t c = nk; c < kKeyBlock; ++c) {  // unread keys: zeros, never NaN from the cache
    for (int d = 0; d < kDim; ++d) kt[d * kKeyBlock + c] = 0.f;
    sc.ks[c] = 0.f;
  }
  std::fill(sc.s.begin(), sc.s.end(), 0.f);
  score_block(sc.q.data(), sc.w.data(), t.rows * H, H, kt, sc.s.data());
  for (int r = 0; r < t.rows; ++r) {
    float* srow = sc.s.data() + r * kKeyBlock;
    for (int64_t c = 0; c < nk; ++c) srow[c] *= sc.ks[c];
  }
}

}  // namespace score
}  // namespace cpu
}  // namespace dsa
