// CPU indexer logits (SPEC §3.4): I[i, j] = Σ_h w'[i,h] · relu(q8[i,h] · k8[j]) · s_k[j].
//
// Rows that read the same keys (a run of rows with one ks, or of one sequence in the paged
// form) form a tile of up to 16 rows. Per block of 64 keys the keys are dequantised once into
// a transposed f32 block Kt[128][64] (256-entry lookup table); then the tile's (row, head)
// pairs are scored against the block with an outer-product micro-kernel: broadcast q[p][d]
// times Kt[d][0:64] for 6 pairs at a time, 6 x 64 accumulators in vector registers, so even a
// lone decode row reuses each key load 6x. Each column's arithmetic (d order, then h order,
// then the key scale) never depends on the tile, the block or the column position, so tiled
// (col_offset) and untiled runs, and runs on any thread count, are bit-identical. Keys past a
// tile's longest row are never read (the block is padded with zeros).
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

constexpr int kDim = 128;
constexpr int kTileRows = 16;
constexpr int kKeyBlock = 64;
constexpr int64_t kChunkCols = 512;  // columns per work item (a multiple of kKeyBlock)

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
const E4m3Table& e4m3_table() {
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

void score_block(const float* q, const float* w, int64_t pairs, int64_t H, const float* kt, float* s) {
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

// Columns [c0, c1) of one tile; the last chunk of a tile also owns the -inf tail up to W.
template <typename Keys>
void run_chunk(const Tile& t, int64_t c0, int64_t c1, const Keys& keys, const TensorDesc& qd,
               const TensorDesc& wd, const TensorDesc& out, Scratch& sc) {
  const float* lut = e4m3_table().v;
  const int64_t H = qd.shape[1];
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t compute_end = std::min(c1, t.ncols);
  if (compute_end > c0) {
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
  for (int64_t b0 = c0; b0 < compute_end; b0 += kKeyBlock) {
    const int64_t nk = std::min<int64_t>(kKeyBlock, compute_end - b0);
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
      const float* srow = sc.s.data() + r * kKeyBlock;
      const int64_t valid_end = std::min(nk, std::max<int64_t>(t.nvalid[r] - b0, 0));
      if (out.dtype == DType::kBF16) {
        uint16_t* orow = out.ptr<uint16_t>() + t.row[r] * out.stride[0];
        for (int64_t c = 0; c < valid_end; ++c) orow[b0 + c] = float_to_bf16(srow[c] * sc.ks[c]);
        for (int64_t c = valid_end; c < nk; ++c) orow[b0 + c] = float_to_bf16(ninf);
      } else {
        float* orow = out.ptr<float>() + t.row[r] * out.stride[0];
        for (int64_t c = 0; c < valid_end; ++c) orow[b0 + c] = srow[c] * sc.ks[c];
        for (int64_t c = valid_end; c < nk; ++c) orow[b0 + c] = ninf;
      }
    }
  }
  const int64_t tail = std::max(c0, compute_end);
  for (int r = 0; r < t.rows; ++r) {
    if (out.dtype == DType::kBF16) {
      uint16_t* orow = out.ptr<uint16_t>() + t.row[r] * out.stride[0];
      for (int64_t c = tail; c < c1; ++c) orow[c] = float_to_bf16(ninf);
    } else {
      float* orow = out.ptr<float>() + t.row[r] * out.stride[0];
      for (int64_t c = tail; c < c1; ++c) orow[c] = ninf;
    }
  }
}

template <typename Keys>
StatusCode run_tiles(const std::vector<Tile>& tiles, const Keys& keys, const TensorDesc& q,
               const TensorDesc& w, const TensorDesc& out) {
  const int64_t W = out.shape[1];
  struct Item { int64_t tile, c0, c1; };
  std::vector<Item> items;
  for (size_t ti = 0; ti < tiles.size(); ++ti) {
    const int64_t computed = std::min(W, tiles[ti].ncols);
    int64_t c0 = 0;
    do {
      int64_t c1 = c0 + kChunkCols;
      if (c1 >= computed) c1 = W;  // the last chunk takes the -inf tail
      items.push_back({static_cast<int64_t>(ti), c0, c1});
      c0 = c1;
    } while (c0 < W);
  }
  return parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    thread_local Scratch sc;
    for (int64_t i = b; i < e; ++i)
      run_chunk(tiles[items[i].tile], items[i].c0, items[i].c1, keys, q, w, out, sc);
  });
}

int64_t clamp_cols(int64_t valid_keys_from_col0, int64_t W) {
  return std::min(std::max<int64_t>(valid_keys_from_col0, 0), W);
}

}  // namespace

StatusCode indexer_logits(const IndexerLogitsParams& p) {
  const int64_t M = p.q.shape[0], W = p.logits.shape[1];
  if (M == 0 || W == 0) return StatusCode::kOk;
  const int32_t* ks = p.ks.ptr<const int32_t>();
  const int32_t* ke = p.ke.ptr<const int32_t>();
  std::vector<Tile> tiles;
  for (int64_t i = 0; i < M; ++i) {
    const int64_t s = ks[i * p.ks.stride[0]], e = ke[i * p.ke.stride[0]];
    const int64_t base = s + p.col_offset;
    if (tiles.empty() || tiles.back().rows == kTileRows || tiles.back().base_j != base)
      tiles.push_back(Tile{{}, {}, 0, 0, base, 0});
    Tile& t = tiles.back();
    t.row[t.rows] = i;
    t.nvalid[t.rows] = clamp_cols(e - base, W);
    t.ncols = std::max(t.ncols, t.nvalid[t.rows]);
    ++t.rows;
  }
  FlatKeys keys{p.k.ptr<const uint8_t>(), p.k.stride[0], p.k_scale.ptr<const float>(), p.k_scale.stride[0]};
  return run_tiles(tiles, keys, p.q, p.weights, p.logits);
}

StatusCode indexer_logits_paged(const IndexerLogitsPagedParams& p) {
  const int64_t R = p.q.shape[0], W = p.logits.shape[1];
  if (R == 0 || W == 0) return StatusCode::kOk;
  const bool general = p.row_seq.present();
  std::vector<Tile> tiles;
  for (int64_t r = 0; r < R; ++r) {
    int64_t seq, len;
    if (general) {
      seq = p.row_seq.ptr<const int32_t>()[r * p.row_seq.stride[0]];
      len = p.row_len.ptr<const int32_t>()[r * p.row_len.stride[0]];
    } else {
      seq = r / p.next_n;
      len = p.kv_lens.ptr<const int32_t>()[seq * p.kv_lens.stride[0]] - p.next_n + r % p.next_n + 1;
    }
    if (p.skip_rows_up_to > 0 && len <= p.skip_rows_up_to) continue;  // skipped: its logits row is left as it was
    if (tiles.empty() || tiles.back().rows == kTileRows || tiles.back().seq != seq)
      tiles.push_back(Tile{{}, {}, 0, seq, p.col_offset, 0});
    Tile& t = tiles.back();
    t.row[t.rows] = r;
    t.nvalid[t.rows] = clamp_cols(len - p.col_offset, W);
    t.ncols = std::max(t.ncols, t.nvalid[t.rows]);
    ++t.rows;
  }
  PagedKeys keys{static_cast<const uint8_t*>(p.cache.data), p.cache.block_bytes(), p.cache.page_size,
                 p.block_table.ptr<const int32_t>(), p.block_table.stride[0], p.block_table.stride[1]};
  return run_tiles(tiles, keys, p.q, p.weights, p.logits);
}

}  // namespace cpu
}  // namespace dsa
