// CPU indexer logits (SPEC §3.4): I[i, j] = Σ_h w'[i,h] · relu(q8[i,h] · k8[j]) · s_k[j].
//
// The scoring core (tiles of rows sharing keys, 64-key blocks, the outer-product micro-kernel)
// is in indexer_score.h, shared with the fused score-and-select. Each column's arithmetic never
// depends on the tile, the block or the column position, so tiled (col_offset) and untiled
// runs, and runs on any thread count, are bit-identical. Keys past a tile's longest row are
// never read (the block is padded with zeros).
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/indexer_score.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

using score::FlatKeys;
using score::kKeyBlock;
using score::kTileRows;
using score::PagedKeys;
using score::Scratch;
using score::Tile;

constexpr int64_t kChunkCols = 512;  // columns per work item (a multiple of kKeyBlock)

// Columns [c0, c1) of one tile; the last chunk of a tile also owns the -inf tail up to W.
template <typename Keys>
void run_chunk(const Tile& t, int64_t c0, int64_t c1, const Keys& keys, const TensorDesc& qd,
               const TensorDesc& wd, const TensorDesc& out, Scratch& sc) {
  const int64_t H = qd.shape[1];
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t compute_end = std::min(c1, t.ncols);
  if (compute_end > c0) score::load_queries(t, qd, wd, sc);
  for (int64_t b0 = c0; b0 < compute_end; b0 += kKeyBlock) {
    const int64_t nk = std::min<int64_t>(kKeyBlock, compute_end - b0);
    score::score_keys(t, b0, nk, keys, H, sc);
    for (int r = 0; r < t.rows; ++r) {
      const float* srow = sc.s.data() + r * kKeyBlock;
      const int64_t valid_end = std::min(nk, std::max<int64_t>(t.nvalid[r] - b0, 0));
      if (out.dtype == DType::kBF16) {
        uint16_t* orow = out.ptr<uint16_t>() + t.row[r] * out.stride[0];
        for (int64_t c = 0; c < valid_end; ++c) orow[b0 + c] = float_to_bf16(srow[c]);
        for (int64_t c = valid_end; c < nk; ++c) orow[b0 + c] = float_to_bf16(ninf);
      } else {
        float* orow = out.ptr<float>() + t.row[r] * out.stride[0];
        for (int64_t c = 0; c < valid_end; ++c) orow[b0 + c] = srow[c];
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
  std::vector<Tile> tiles;
  for (int64_t r = 0; r < R; ++r) {
    int64_t seq, len;
    score::paged_row(p, r, &seq, &len);
    if (p.skip_rows_up_to > 0 && len <= p.skip_rows_up_to) continue;  // skipped: its logits row is left as it was
    if (tiles.empty() || tiles.back().rows == kTileRows || tiles.back().seq != seq)
      tiles.push_back(Tile{{}, {}, 0, seq, p.col_offset, 0});
    Tile& t = tiles.back();
    t.row[t.rows] = r;
    t.nvalid[t.rows] = clamp_cols(len - p.col_offset, W);
    t.ncols = std::max(t.ncols, t.nvalid[t.rows]);
    ++t.rows;
  }
  const PagedKeys keys = score::paged_keys(p);
  return run_tiles(tiles, keys, p.q, p.weights, p.logits);
}

}  // namespace cpu
}  // namespace dsa
