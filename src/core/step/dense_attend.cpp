// Stage: dense attend. One run of dense sequences (kv_len <= topk: top-k would select every
// key) through dense causal MLA; when the layer's indices are consumed (indices_out), the run's
// rows also get the exact selection 0..L-1.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/attention.h"
#include "dsa/topk.h"

namespace dsa {
namespace core {
namespace step {

// Top-k of a row with L <= topk reads no score: it fills the identity through the ordinary op.
Status identity_indices(Step& s, const Run& run) {
  // Identity rows have L <= min(topk, max_context) keys: no wider than a scored chunk's rows.
  const int64_t K = s.K;
  const int64_t id_width = std::min<int64_t>(K, s.cfg.max_context);
  const int64_t per = max_rows_fitting(s, [&](int64_t r) { return s.plan.chunk_bytes(r, id_width); });
  Status st;
  for (int64_t r0 = run.r0; r0 < run.r1 && st.ok(); r0 += per) {
    const int64_t m = std::min(per, run.r1 - r0);
    s.score_arena = s.fresh_score_arena();
    ChunkLayout cl;
    if (!layout_chunk(s.score_arena, s.dev, m, id_width, K, &cl)) return internal("identity chunk does not fit the score region");
    const auto ts = Clock::now();
    TopkParams tp;
    tp.logits = dev_tensor(cl.scores, DType::kF32, {m, id_width}, s.dev);
    tp.logits.stride[0] = cl.stride;
    tp.lengths = rows(s.row_len, r0, m);
    tp.k = K;
    tp.indices = rows(s.p.indices_out, r0, m);
    st = run_topk(s, tp, cl.topk_ws, cl.topk_ws_bytes);
    s.rep.ms_select += ms_since(ts);
  }
  return st;
}

DenseRunTables dense_run_tables(Step& s, const Run& run) {
  const int64_t nb = run.b1 - run.b0;
  int64_t run_max_kv = 0;
  for (int64_t b = run.b0; b < run.b1; ++b) run_max_kv = std::max<int64_t>(run_max_kv, s.kv_len(b));
  DenseRunTables t;
  // The run's cu_seqlens, uploaded by stage_metadata (a region per dense run, in batch order).
  t.cu_seqlens = dev_tensor(s.lay.dense_cu + s.dense_cu_at, DType::kI32, {nb + 1}, s.dev);
  s.dense_cu_at += nb + 1;
  t.block_table = rows(s.p.block_table, run.b0, nb);
  // Only the pages dense keys can use (kv_len <= topk): the kernels size their key split by
  // the block table's width, and a batch-wide width would launch empty splits.
  t.block_table.shape[1] = std::min<int64_t>(t.block_table.shape[1],
                                             std::max<int64_t>(1, (run_max_kv + s.cfg.page_size - 1) / s.cfg.page_size));
  t.kv_lens = dev_tensor(s.lay.kv_lens + run.b0, DType::kI32, {nb}, s.dev);
  return t;
}

Status dense_attend(Step& s, const Run& run) {
  const StepParams& p = s.p;
  const auto td = Clock::now();
  mark(s, Stage::kDense);
  const int64_t n = run.r1 - run.r0;
  const DenseRunTables t = dense_run_tables(s, run);
  Status st;
  DenseMlaParams dp;
  dp.q = rows(s.q_abs, run.r0, n);
  dp.kv.paged = p.mla_cache;
  dp.cu_seqlens_q = t.cu_seqlens;
  dp.block_table = t.block_table;
  dp.kv_lens = t.kv_lens;
  dp.attn_sink = p.attn_sink;
  dp.sm_scale = s.sm_scale;
  dp.out = rows(s.out_lat, run.r0, n);
  dp.lse = rows(p.lse, run.r0, n);
  dp.workspace = s.lay.attn_ws;
  dp.workspace_bytes = static_cast<size_t>(s.lay.attn_ws_bytes);
  dp.stream = p.stream;
  st = s.dev.type != DeviceType::kCPU ? attn_ws_check(s, dense_mla_workspace_size(dp)) : Status::Ok();
  if (st.ok()) st = dense_mla(dp);
  s.rep.ms_dense += ms_since(td);
  if (!st.ok() || !p.indices_out.present()) return st;
  return identity_indices(s, run);
}

}  // namespace step
}  // namespace core
}  // namespace dsa
