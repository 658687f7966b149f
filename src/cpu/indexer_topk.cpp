// CPU fused score-and-select (docs/fused_select.md): the paged indexer logits of each row,
// scored 64 keys at a time by the same core as indexer_logits (indexer_score.h, so every score
// is bit-identical to the unfused path's), go straight into a bounded candidate buffer; the
// [R, width] scores are never written.
//
// A candidate is one 64-bit word, (order_key(score) << 32) | (2^32 - 1 - j): larger words rank
// higher, and equal scores rank the lower key index j higher, which is SPEC §3.5's order
// exactly. Each row's buffer holds 2k + 64 words. A row admits every word above its threshold
// (0 at first: every real word is > 0); when a block could overflow the buffer, the buffer is
// compacted to its k best (the k-th best found by a radix select on a copy, then the buffer
// filtered in place, so it stays in key order) and the threshold becomes the k-th best word.
// Blocks whose best key cannot beat the threshold are skipped after one vectorised max.
// The row's answer is the same filter at the end: ascending indices with no sort. Keys are
// visited in ascending j, so a later key that ties the threshold's score has a larger j and
// ranks below it: dropping it is exact. The overflow is thus handled in place, never by a
// second scoring pass.
//
// Work items are (tile of up to 16 rows of one sequence, key segment). One segment covers a
// row unless few tiles would leave threads idle; then rows are split into S segments, each
// segment's k best go to the workspace, and a merge pass takes each row's k best of them.
#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/indexer_score.h"
#include "cpu/parallel.h"
#include "cpu/select_key.h"

namespace dsa {
namespace cpu {
namespace {

using score::kKeyBlock;
using score::kTileRows;
using score::PagedKeys;
using score::Scratch;
using score::Tile;

std::atomic<uint64_t> g_compactions{0};

// The shortest segment a row is split into: each segment costs a merge of k words.
int64_t min_segment(int64_t k) { return std::max<int64_t>(16384, 4 * k); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Key segments per row for R rows of at most `width` keys: 1 while the rows alone give every
// thread two tiles, else enough segments for that, each at least min_segment(k) keys.
int64_t segments_for_tiles(int64_t tiles, int64_t width, int64_t k) {
  const int64_t want = 2 * max_slots();
  if (tiles >= want) return 1;
  return std::max<int64_t>(1, std::min(ceil_div(want, tiles), width / min_segment(k)));
}
int64_t segments(int64_t R, int64_t width, int64_t k) {
  return segments_for_tiles(ceil_div(R, kTileRows), width, k);  // the fewest tiles R rows can form
}

int64_t segment_width(int64_t width, int64_t S) { return ceil_div(ceil_div(width, S), kKeyBlock) * kKeyBlock; }

int64_t buffer_words(int64_t k) { return 2 * k + kKeyBlock; }
// A slot: 16 row buffers and one copy for finding a k-th best without reordering a buffer.
int64_t slot_words(int64_t k) { return (kTileRows + 1) * buffer_words(k); }
int64_t slot_bytes(int64_t k) { return slot_words(k) * 8; }

inline uint64_t pack(uint32_t key, int64_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}
inline int32_t index_of(uint64_t w) { return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(w)); }

// The k-th best of buf[0, n) (n > k), buf left in its order: a radix select on the words'
// top two 11-bit digits (a histogram pass over buf, one over the first digit's survivors
// gathered in tmp), then nth_element over the few words left in the chosen bucket.
uint64_t kth_best(const uint64_t* buf, int64_t n, int64_t k, uint64_t* tmp) {
  uint32_t hist[2048];
  int64_t need = k;  // the need-th best of the words still in play
  auto pick = [&]() {  // the bucket holding the need-th best; need becomes its rank inside
    int d = 2047;
    for (; static_cast<int64_t>(hist[d]) < need; --d) need -= hist[d];
    return static_cast<uint64_t>(d);
  };
  std::fill(hist, hist + 2048, 0u);
  for (int64_t i = 0; i < n; ++i) ++hist[buf[i] >> 53];
  const uint64_t d1 = pick();
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    tmp[m] = buf[i];
    m += (buf[i] >> 53) == d1;
  }
  std::fill(hist, hist + 2048, 0u);
  for (int64_t i = 0; i < m; ++i) ++hist[(tmp[i] >> 42) & 2047];
  const uint64_t d2 = pick();
  int64_t c = 0;
  for (int64_t i = 0; i < m; ++i) {
    tmp[c] = tmp[i];
    c += ((tmp[i] >> 42) & 2047) == d2;
  }
  std::nth_element(tmp, tmp + (need - 1), tmp + c, [](uint64_t a, uint64_t b) { return a > b; });
  return tmp[need - 1];
}

// Keeps the words >= kth (exactly k: words are distinct) in their order; returns k.
int64_t keep_from(uint64_t* buf, int64_t n, uint64_t kth) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    buf[m] = buf[i];
    m += buf[i] >= kth;
  }
  return m;
}

// The k best words of buf[0, n) (n >= k, in ascending key order) as ascending key indices.
void emit_ordered(const uint64_t* buf, int64_t n, int64_t k, uint64_t* tmp, int32_t* out) {
  const uint64_t kth = n > k ? kth_best(buf, n, k, tmp) : 0;
  int64_t m = 0;
  for (int64_t i = 0; i < n && m < k; ++i) {  // m < k: the row's last write is out[k - 1]
    out[m] = index_of(buf[i]);
    m += buf[i] >= kth;
  }
}

// The merge's k best of n words in any order (buf is scratch): sorted key indices.
void emit_unordered(uint64_t* buf, int64_t n, int64_t k, int32_t* out) {
  std::nth_element(buf, buf + (k - 1), buf + n, [](uint64_t a, uint64_t b) { return a > b; });
  for (int64_t i = 0; i < k; ++i) out[i] = index_of(buf[i]);
  std::sort(out, out + k);
}

void identity(int64_t len, int64_t k, int32_t* out) {
  for (int64_t j = 0; j < k; ++j) out[j] = j < len ? static_cast<int32_t>(j) : -1;
}

struct Item {
  int64_t tile, c0, c1, seg;
};

}  // namespace

uint64_t indexer_topk_compactions() { return g_compactions.load(std::memory_order_relaxed); }

// Slots for at most R * (the most segments any R gives) items, and the largest merge region
// of any row count up to R: both non-decreasing in R and width (segments fall as rows grow,
// so the merge region of R rows alone is not).
size_t indexer_topk_workspace_size(const IndexerTopkParams& p) {
  const int64_t R = p.q.shape[0], width = p.width, k = p.k;
  if (R <= 0 || width <= k) return 0;  // rows of <= k keys read no key
  const int64_t most_segments = segments_for_tiles(1, width, k);
  const int64_t slots = std::min(R * most_segments, max_slots());
  int64_t merge_words = 0;
  for (int64_t t = 1; t <= ceil_div(R, kTileRows); ++t) {
    const int64_t S = segments_for_tiles(t, width, k);
    if (S == 1) break;  // more tiles never split again
    merge_words = std::max(merge_words, std::min(R, t * kTileRows) * S * k);
  }
  return static_cast<size_t>(slots * slot_bytes(k) + merge_words * 8);
}

StatusCode indexer_topk(const IndexerTopkParams& p) {
  const int64_t R = p.q.shape[0], k = p.k, H = p.q.shape[1];
  if (R == 0) return StatusCode::kOk;
  std::vector<int64_t> len(static_cast<size_t>(R));
  std::vector<Tile> tiles;
  for (int64_t r = 0; r < R; ++r) {
    int64_t seq, L;
    score::paged_row(p, r, &seq, &L);
    len[static_cast<size_t>(r)] = L;
    int32_t* out = p.indices.ptr<int32_t>() + r * p.indices.stride[0];
    if (L <= k) {  // every key is selected: nothing is scored
      identity(L, k, out);
      continue;
    }
    if (tiles.empty() || tiles.back().rows == kTileRows || tiles.back().seq != seq)
      tiles.push_back(Tile{{}, {}, 0, seq, 0, 0});
    Tile& t = tiles.back();
    t.row[t.rows] = r;
    t.nvalid[t.rows] = L;
    t.ncols = std::max(t.ncols, L);
    ++t.rows;
  }
  if (tiles.empty()) return StatusCode::kOk;

  const int64_t S = segments(R, p.width, k);
  const int64_t seg_w = segment_width(p.width, S);
  std::vector<Item> items;
  for (size_t ti = 0; ti < tiles.size(); ++ti)
    for (int64_t s = 0; s * seg_w < tiles[ti].ncols; ++s)
      items.push_back({static_cast<int64_t>(ti), s * seg_w, std::min((s + 1) * seg_w, tiles[ti].ncols), s});
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t slots = std::min(n_items, max_slots());
  if (p.workspace_bytes < cpu::indexer_topk_workspace_size(p)) return StatusCode::kWorkspaceTooSmall;
  uint64_t* ws = static_cast<uint64_t*>(p.workspace);
  const int64_t cap = buffer_words(k);
  uint64_t* merge = ws + slots * slot_words(k);  // [R][S][k] words when S > 1
  const PagedKeys keys = score::paged_keys(p);

  StatusCode st = parallel_for(slots, 1, [&](int64_t b, int64_t e) {
    thread_local Scratch sc;
    uint64_t compactions = 0;
    for (int64_t slot = b; slot < e; ++slot) {
      uint64_t* bufs = ws + slot * slot_words(k);
      uint64_t* tmp = bufs + kTileRows * cap;
      for (int64_t i = slot; i < n_items; i += slots) {  // strided: tiles of one sequence spread out
        const Item& it = items[static_cast<size_t>(i)];
        const Tile& t = tiles[static_cast<size_t>(it.tile)];
        int64_t n[kTileRows] = {};
        uint64_t thr[kTileRows] = {};
        score::load_queries(t, p.q, p.weights, sc);
        for (int64_t b0 = it.c0; b0 < it.c1; b0 += kKeyBlock) {
          const int64_t nk = std::min<int64_t>(kKeyBlock, it.c1 - b0);
          score::score_keys(t, b0, nk, keys, H, sc);
          for (int r = 0; r < t.rows; ++r) {
            const int64_t valid = std::min(nk, t.nvalid[r] - b0);
            if (valid <= 0) continue;
            uint64_t* buf = bufs + r * cap;
            if (n[r] + valid > cap) {  // compact to the k best, in order
              thr[r] = kth_best(buf, n[r], k, tmp);
              n[r] = keep_from(buf, n[r], thr[r]);
              ++compactions;
            }
            const float* srow = sc.s.data() + r * kKeyBlock;
            // Once the buffer is warm most blocks hold no key above the threshold: test the
            // block's best key first (vectorised), admit one by one only when it beats it.
            const uint32_t th_key = static_cast<uint32_t>(thr[r] >> 32);
            uint32_t best = 0;
            for (int64_t c = 0; c < valid; ++c) best = std::max(best, order_key(srow[c]));
            if (thr[r] != 0 && best < th_key) continue;
            int64_t m = n[r];
            const uint64_t th = thr[r];
            for (int64_t c = 0; c < valid; ++c) {  // branch-free: write, advance when admitted
              const uint64_t w = pack(order_key(srow[c]), b0 + c);
              buf[m] = w;
              m += w > th;
            }
            n[r] = m;
          }
        }
        for (int r = 0; r < t.rows; ++r) {
          uint64_t* buf = bufs + r * cap;
          if (S == 1) {  // the segment is the whole row
            emit_ordered(buf, n[r], k, tmp, p.indices.ptr<int32_t>() + t.row[r] * p.indices.stride[0]);
            continue;
          }
          if (n[r] > k) n[r] = keep_from(buf, n[r], kth_best(buf, n[r], k, tmp));
          uint64_t* dst = merge + (t.row[r] * S + it.seg) * k;
          const int64_t kept = std::min(n[r], k);
          std::copy(buf, buf + kept, dst);
          std::fill(dst + kept, dst + k, uint64_t{0});  // below every real word
        }
      }
    }
    g_compactions.fetch_add(compactions, std::memory_order_relaxed);
  });
  if (st != StatusCode::kOk || S == 1) return st;
  // Merge: a row's segments that hold keys (those below its length) were all written above.
  return parallel_for(R, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t L = len[static_cast<size_t>(r)];
      if (L <= k) continue;
      const int64_t segs = ceil_div(L, seg_w);
      emit_unordered(merge + r * S * k, segs * k, k, p.indices.ptr<int32_t>() + r * p.indices.stride[0]);
    }
  });
}

}  // namespace cpu
}  // namespace dsa
