// Stage driver: a run of sparse sequences, chunk by chunk so that one chunk's scores fit the
// plan's score region: shared layers map the last full layer's indices; scoring layers prepare
// their indexer queries once per run, then per chunk score -> select -> map -> sparse attend.
#include <algorithm>

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

}  // namespace

Status sparse_run(Step& s, const Run& run) {
  if (!s.shape.scores) return shared_run(s, run);
  Status st = prepare_queries(s, run);
  if (!st.ok()) return st;
  int64_t r0 = run.r0;
  while (r0 < run.r1 && st.ok()) {
    // Greedy chunk: add rows while the chunk's exact layout fits the score region.
    int64_t m = 0, width = 0;
    while (r0 + m < run.r1) {
      const int64_t w2 = std::max<int64_t>(width, s.row_width(r0 + m));
      if (s.plan.chunk_bytes(m + 1, w2) > s.lay.score_bytes) break;
      width = w2;
      ++m;
    }
    s.score_arena = s.fresh_score_arena();
    TensorDesc idx, mapped;
    if (m > 0) {
      st = score_select_map_chunk(s, r0, m, width, &idx, &mapped);
      if (st.ok()) st = sparse_attend(s, r0, m, mapped);
      ++s.rep.score_chunks;
      r0 += m;
      continue;
    }
    // One row alone does not fit: score it in key tiles, merging partial top-k exactly.
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
