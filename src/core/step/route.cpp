// Stage: route. Once per batch, the host row tables (row_tables): for token i of sequence b,
// its sequence, cache position and visible key count; the cu_seqlens of every dense run; the
// last key tile of every row (for rows scored in tiles). Once per layer, a Route per sequence
// (route): dense when the whole context fits top-k (kv_len <= topk: the selection would be
// every key, so nothing is scored; the layer's indices, when asked for, are the identity),
// unless a full layer is told to score everything; else scored (full, mtp) or shared. An MTP
// layer routes like a full one: where kv_len <= topk its indices are the identity 0..L-1 (what
// scoring would select), written without scoring, and its attention is dense.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/mha.h"

namespace dsa {
namespace core {
namespace step {

namespace {
// Sequence b's route apart from the role's sparse kind: the same for every layer of a batch
// except a full layer with force_score, which has no dense run at all.
// Device-length batches have no dense run: their short rows get the identity from top-k.
bool dense_by_length(const Step& s, int64_t b) { return !s.device_lengths && s.kv_lens_h[b] <= s.K; }

// Core-mode plans: the MHA form for a dense sequence where its K/V fit the score region and
// the cost model prefers it (docs/mha.md). Decided once per batch so that the dense runs'
// cu_seqlens (uploaded by prepare) are split where the form changes.
bool mha_by_cost(const Step& s, int64_t b) {
  const ModelGeometry& g = s.cfg.geometry;
  return s.cfg.core_mode && dense_by_length(s, b) && s.kv_lens_h[b] <= s.plan.mha_max_context &&
         prefer_mha_form(s.q_len(b), s.kv_lens_h[b], s.H, g.qk_nope_head_dim, g.v_head_dim);
}
}  // namespace

bool served_mha(const Step& s, const Run& run) {
  if (!s.core || !run.dense) return false;
  switch (s.p.dense_form) {
    case DenseForm::kAbsorbed: return false;
    case DenseForm::kMha:
      for (int64_t b = run.b0; b < run.b1; ++b)
        if (s.kv_len(b) > s.plan.mha_max_context) return false;
      return true;
    case DenseForm::kAuto: break;
  }
  return run.mha;
}

void row_tables(Step& s) {
  const StepParams& p = s.p;
  const int64_t B = s.shape.B;
  s.device_lengths = p.device_lengths;
  if (p.device_lengths) {  // the device builds the rows (stage_metadata); nothing is dense
    for (int64_t b = 0; b < B; ++b) {
      s.state.q_lens[static_cast<size_t>(b)] = static_cast<int32_t>(p.next_n);
      s.state.mha[static_cast<size_t>(b)] = 0;
    }
    s.dense_cu_words = 0;
    return;
  }
  int64_t t = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t ql = static_cast<int32_t>(batch_q_len(p, b));
    const int32_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    s.state.q_lens[static_cast<size_t>(b)] = ql;
    s.kv_lens_h[b] = kl;
    for (int32_t i = 0; i < ql; ++i, ++t) {
      s.row_seq_h[t] = static_cast<int32_t>(b);
      s.token_pos_h[t] = kl - ql + i;
      s.row_len_h[t] = kl - ql + i + 1;
    }
  }
  for (int64_t b = 0; b < B; ++b) s.state.mha[static_cast<size_t>(b)] = mha_by_cost(s, b) ? 1 : 0;
  // cu_seqlens of each run of dense sequences of one form, a region per run (the dense
  // attends read them in the same order: for_each_run).
  int64_t at = 0;
  for (int64_t b = 0; b < B;) {
    if (!dense_by_length(s, b)) {
      ++b;
      continue;
    }
    int64_t e = b;
    int64_t rows = 0;
    const uint8_t form = s.state.mha[static_cast<size_t>(b)];
    while (e < B && dense_by_length(s, e) && s.state.mha[static_cast<size_t>(e)] == form) rows += s.q_len(e++);
    if (rows > 0) {
      int32_t* cu = s.dense_cu_h + at;
      cu[0] = 0;
      for (int64_t j = b; j < e; ++j) cu[j - b + 1] = cu[j - b] + s.q_len(j);
      at += e - b + 1;
    }
    b = e;
  }
  s.dense_cu_words = at;
  // The last tile of each row, should it be scored in tiles: its length and merge length.
  const int64_t Wt = s.plan.tile_width;
  if (Wt > 0) {
    for (int64_t r = 0; r < s.shape.T; ++r) {
      const int64_t len = s.row_len_h[r];
      const int64_t ntiles = std::max<int64_t>(1, (len + Wt - 1) / Wt);
      const int64_t last_len = len - (ntiles - 1) * Wt;
      s.tile_last_h[2 * r] = static_cast<int32_t>(last_len);
      s.tile_last_h[2 * r + 1] = static_cast<int32_t>(s.K + std::min<int64_t>(last_len, s.K));
    }
  }
}

void route(Step& s) {
  const StepParams& p = s.p;
  const bool all_scored = p.role == IndexerRole::kFull && p.force_score;
  for (int64_t b = 0; b < s.shape.B; ++b) {
    Route r;
    if (!all_scored && dense_by_length(s, b)) r = Route::kDense;  // top-k = everything
    else r = s.shape.scores ? Route::kSparseScored : Route::kSparseShared;
    s.state.route[b] = r;
    s.rep.seqs[static_cast<int>(r)] += 1;
    s.rep.rows[static_cast<int>(r)] += s.q_len(b);
  }
}

}  // namespace step
}  // namespace core
}  // namespace dsa
