// Stage: route. A Route per sequence (SPEC §6) and the host row tables: for token i of
// sequence b, its sequence, cache position and visible key count.
#include "core/step/step.h"

namespace dsa {
namespace core {
namespace step {

void route(Step& s) {
  const StepParams& p = s.p;
  int64_t t = 0;
  for (int64_t b = 0; b < s.shape.B; ++b) {
    const int32_t ql = s.q_len(b);
    const int32_t kl = s.kv_len(b);
    s.kv_lens_h[b] = kl;
    Route r;
    if (p.role == IndexerRole::kMtp) r = Route::kSparseScored;  // its indices are consumed
    else if (kl <= s.K && !(p.role == IndexerRole::kFull && p.force_score)) r = Route::kDense;  // top-k = everything
    else r = s.shape.scores ? Route::kSparseScored : Route::kSparseShared;
    s.state.route[b] = r;
    s.rep.seqs[static_cast<int>(r)] += 1;
    s.rep.rows[static_cast<int>(r)] += ql;
    for (int32_t i = 0; i < ql; ++i, ++t) {
      s.row_seq_h[t] = static_cast<int32_t>(b);
      s.token_pos_h[t] = kl - ql + i;
      s.row_len_h[t] = kl - ql + i + 1;
    }
  }
}

}  // namespace step
}  // namespace core
}  // namespace dsa
