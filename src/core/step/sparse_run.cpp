// Stage driver: a run of sparse sequences, chunk by chunk so that one chunk's scores fit the
// plan's score region: shared layers map the last full layer's indices; scoring layers prepare
// their indexer queries once per run, then per chunk score -> select -> map -> sparse attend.
#include <algorithm>
#include <vector>

#include "core/step/step.h"

namespace dsa {
namespace core {
namespace step {
namespace {

Status shared_run(Step& s, const Run& run) {
  const int64_t K = s.K;
  const int64_t per = max_rows_fitting(s, [&](int64_t r) {
    Arena a = Arena::counting();
    int32_t* m;
    layout_shared(a, r, K, &m);
    return a.used();
  });
  Status st;
  for (int64_t r0 = run.r0; r0 < run.r1 && st.ok(); r0 += per) {
    const int64_t m = std::min(per, run.r1 - r0);
    s.score_arena = s.fresh_score_arena();
    int32_t* mapped;
    if (!layout_shared(s.score_arena, m, K, &mapped)) return internal("shared chunk does not fit the score region");
    const TensorDesc md = dev_tensor(mapped, DType::kI32, {m, K}, s.dev);
    st = map_paged(s, rows(s.p.indices_in, r0, m), r0, m, md);
    if (st.ok()) st = sparse_attend(s, r0, m, md);
    ++s.rep.score_chunks;
  }
  return st;
}

// The greedy chunk from row r0: the most rows m (with `width` their widest row) whose exact
// layout fits the score region, 0 when row r0 alone does not fit. The chunk takes one selection
// path, the one its first scored row's width takes (Plan::takes_fused), and stops before the
// first scored row that takes the other. chunk_bytes grows with rows and width, and a prefix's
// widest row only grows with it, so the answer is found by galloping then bisecting: O(log m)
// layouts per chunk instead of one per row (a layout costs about a microsecond of host time;
// an 8192-row prefill chunk spent milliseconds on them).
int64_t chunk_rows(const Step& s, int64_t r0, int64_t r1, bool* fused, int64_t* width) {
  const Plan& plan = s.plan;
  if (s.device_lengths) {  // every row is max_context wide: the plan's constant
    *width = s.cfg.max_context;
    *fused = plan.takes_fused(*width);
    return std::min(r1 - r0, *fused ? plan.fused_max_context_rows_per_chunk : plan.max_context_rows_per_chunk);
  }
  // Rows of <= topk keys read no score on either path (their selection is the identity): they
  // join the chunk of the rows around them. The path is the first scored row's.
  const int64_t K = s.K;
  int64_t n = r1 - r0;  // rows from r0 on one path
  int first = -1;       // that path: -1 not yet known, 0 unfused, 1 fused
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t w = s.row_width(r);
    if (w <= K) continue;
    const int path = plan.takes_fused(w) ? 1 : 0;
    if (first < 0) first = path;
    if (path != first) {
      n = r - r0;
      break;
    }
  }
  *fused = first == 1;
  int64_t scanned = 0, wmax = 0;  // rows [r0, r0 + scanned) seen, their widest
  std::vector<int64_t>& pre = s.state.chunk_widths;  // pre[i]: widest of rows [r0, r0 + i + 1)
  pre.clear();
  auto widest = [&](int64_t m) {  // the widest of the first m rows (m >= 1)
    while (scanned < m) {
      wmax = std::max<int64_t>(wmax, s.row_width(r0 + scanned));
      pre.push_back(wmax);
      ++scanned;
    }
    return pre[static_cast<size_t>(m - 1)];
  };
  const bool is_fused = *fused;
  const auto fits = [&](int64_t m) {
    const int64_t w = widest(m);
    return (is_fused ? plan.fused_chunk_bytes(m, w) : plan.chunk_bytes(m, w)) <= s.lay.score_bytes;
  };
  if (n <= 0 || !fits(1)) return 0;
  int64_t lo = 1, hi = 2;  // fits(lo); the answer is in [lo, hi) once !fits(hi) or hi > n
  while (hi <= n && fits(hi)) {
    lo = hi;
    hi = std::min<int64_t>(2 * hi, n + 1);
    if (lo == n) break;
  }
  hi = std::min<int64_t>(hi, n + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid; else hi = mid;
  }
  *width = widest(lo);
  return lo;
}

}  // namespace

Status sparse_run(Step& s, const Run& run) {
  if (!s.shape.scores) return shared_run(s, run);
  Status st = prepare_queries(s, run);
  if (!st.ok()) return st;
  int64_t r0 = run.r0;
  while (r0 < run.r1 && st.ok()) {
    // Greedy chunk: the most rows whose exact layout fits the score region.
    int64_t width = 0;
    bool fused = false;
    const int64_t m = chunk_rows(s, r0, run.r1, &fused, &width);
    s.score_arena = s.fresh_score_arena();
    TensorDesc idx, mapped;
    if (m > 0) {
      st = fused ? fused_select_map_chunk(s, r0, m, width, &idx, &mapped)
                 : score_select_map_chunk(s, r0, m, width, &idx, &mapped);
      if (fused) ++s.rep.fused_chunks;
      if (st.ok()) st = sparse_attend(s, r0, m, mapped);
      ++s.rep.score_chunks;
      r0 += m;
      continue;
    }
    // One row alone does not fit: score it in key tiles, merging partial top-k exactly (the
    // plan fits one fused row of max_context, so only the unfused path gets here).
    if (fused) return internal("a fused row of " + num(width) + " keys does not fit the score region");
    if (s.device_lengths) return internal("a device_lengths row of max_context keys does not fit the score region");
    st = score_tiled_row(s, r0, &mapped);
    if (st.ok()) st = sparse_attend(s, r0, 1, mapped);
    ++s.rep.tiled_rows;
    r0 += 1;
  }
  return st;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
