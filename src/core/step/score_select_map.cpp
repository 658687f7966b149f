// Stage: score / select / map, per chunk of sparse rows. A chunk's rows are scored by the
// layer's indexer into the score region, top-k selects each row's keys, and the selection is
// mapped to cache slots through the block table. A row too wide for the score region is scored
// in key tiles whose partial top-k are merged exactly. A fused chunk (rows the cost model sends
// to the fused path) scores and selects in one pass, writing no scores.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/indexer.h"
#include "dsa/topk.h"

namespace dsa {
namespace core {
namespace step {

Status prepare_queries(Step& s, const Run& run) {
  const StepParams& p = s.p;
  const int64_t n = run.r1 - run.r0;
  const auto tq = Clock::now();
  mark(s, Stage::kPrepare);
  PrepareIndexerQParams pq;
  pq.q = rows(p.index_q, run.r0, n);
  pq.weights = rows(p.index_w, run.r0, n);
  pq.positions = rows(s.positions, run.r0, n);
  pq.cos_sin = p.cos_sin;
  pq.rope = s.cfg.geometry.index_rope;
  pq.hadamard = p.hadamard;
  pq.q_out = dev_tensor(s.lay.index_q + run.r0 * s.Hi * kIndexHeadDim, DType::kE4M3, {n, s.Hi, kIndexHeadDim}, s.dev);
  pq.weights_out = dev_tensor(s.lay.index_w + run.r0 * s.Hi, DType::kF32, {n, s.Hi}, s.dev);
  pq.stream = p.stream;
  Status st = prepare_indexer_q(pq);
  s.rep.ms_prepare += ms_since(tq);
  return st;
}

Status score_select_map_chunk(Step& s, int64_t r0, int64_t m, int64_t width, TensorDesc* idx, TensorDesc* mapped) {
  const StepParams& p = s.p;
  ChunkLayout cl;
  if (!layout_chunk(s.score_arena, s.dev, m, width, s.K, &cl)) return internal("chunk does not fit the score region");
  // Rows with L <= topk (device_lengths decode, force_score) get the identity from top-k, which
  // reads none of their scores: they are not scored.
  // Only where such rows are common (device-length decode, force_score): elsewhere the scorer's
  // fastest kernel (wgmma on sm_90a) does not skip rows.
  Status st = score_rows(s, r0, m, cl.scores, width, cl.stride, 0, s.device_lengths || p.force_score);
  *idx = p.indices_out.present() ? rows(p.indices_out, r0, m) : dev_tensor(cl.idx, DType::kI32, {m, s.K}, s.dev);
  if (st.ok()) {
    const auto ts = Clock::now();
    TopkParams tp;
    tp.logits = dev_tensor(cl.scores, DType::kF32, {m, width}, s.dev);
    tp.logits.stride[0] = cl.stride;
    tp.lengths = rows(s.row_len, r0, m);
    tp.k = s.K;
    tp.indices = *idx;
    st = run_topk(s, tp, cl.topk_ws, cl.topk_ws_bytes);
    s.rep.ms_select += ms_since(ts);
  }
  *mapped = dev_tensor(cl.mapped, DType::kI32, {m, s.K}, s.dev);
  if (st.ok()) st = map_paged(s, *idx, r0, m, *mapped);
  return st;
}

Status fused_select_map_chunk(Step& s, int64_t r0, int64_t m, int64_t width, TensorDesc* idx, TensorDesc* mapped) {
  const StepParams& p = s.p;
  FusedLayout fl;
  if (!layout_fused(s.score_arena, s.dev, m, width, s.K, &fl)) return internal("fused chunk does not fit the score region");
  *idx = p.indices_out.present() ? rows(p.indices_out, r0, m) : dev_tensor(fl.idx, DType::kI32, {m, s.K}, s.dev);
  const auto ts = Clock::now();
  mark(s, Stage::kScore);  // scoring and selection are one stage here: its time counts as scoring
  IndexerTopkParams fp;
  paged_scorer_rows(s, r0, m, &fp);
  fp.width = width;
  fp.k = s.K;
  fp.indices = *idx;
  fp.workspace = fl.ws;
  fp.workspace_bytes = fl.ws_bytes;
  Status st = indexer_topk(fp);
  s.rep.ms_score += ms_since(ts);
  s.rep.fused_rows += m;
  *mapped = dev_tensor(fl.mapped, DType::kI32, {m, s.K}, s.dev);
  if (st.ok()) st = map_paged(s, *idx, r0, m, *mapped);
  return st;
}

Status score_tiled_row(Step& s, int64_t r0, TensorDesc* mapped) {
  const StepParams& p = s.p;
  const int64_t K = s.K, len = s.row_len_h[r0], Wt = s.plan.tile_width;
  const Device dev = s.dev;
  if (Wt <= 0) return internal("a row of " + num(len) + " keys does not fit and the plan has no tile width");
  const int64_t ntiles = (len + Wt - 1) / Wt;
  if (ntiles > s.plan.max_tiles) return internal("a row needs more tiles than the plan's max_tiles");
  TiledLayout tl;
  if (!layout_tiled(s.score_arena, dev, Wt, s.plan.max_tiles, K, &tl)) return internal("tiled row does not fit the score region");
  // Tile tables (the score region is reused between rows, so each tiled row uploads its
  // own): offsets and the full tiles from the constant table, the last tile from this row's
  // own staging words (row_tables wrote them once per batch).
  const int32_t* last = s.tile_last_h + 2 * r0;  // written by row_tables
  const size_t full = static_cast<size_t>(ntiles - 1) * 4;
  const int32_t* tile_table = s.tile_table;
  const int64_t tile_stride = s.tile_stride;
  Status st;
  mark(s, Stage::kScore);  // the tile tables feed scoring and selection
  if (!(st = s.ops.upload(tl.tile_offset, tile_table, ntiles * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(tl.tile_len, tile_table + tile_stride, full, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(tl.tile_len + ntiles - 1, last, 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(tl.merge_len, tile_table + 2 * tile_stride, full, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(tl.merge_len + ntiles - 1, last + 1, 4, p.stream)).ok()) return st;
  const TensorDesc dest = p.indices_out.present() ? rows(p.indices_out, r0, 1) : dev_tensor(tl.idx, DType::kI32, {1, K}, dev);
  int cur = 0;
  for (int64_t i = 0; i < ntiles && st.ok(); ++i) {
    st = score_rows(s, r0, 1, tl.scores, Wt, score_stride(Wt), i * Wt);
    if (!st.ok()) break;
    const auto ts = Clock::now();
    TopkParams tp;
    tp.logits = dev_tensor(tl.scores, DType::kF32, {1, Wt}, dev);
    tp.lengths = dev_tensor(tl.tile_len + i, DType::kI32, {1}, dev);
    tp.k = K;
    const bool is_last = i + 1 == ntiles;
    if (ntiles == 1) {
      tp.indices = dest;
      st = run_topk(s, tp, tl.topk_ws, tl.topk_ws_bytes);
      s.rep.ms_select += ms_since(ts);
      break;
    }
    const int64_t half = i == 0 ? 0 : K;  // tile 0 seeds the running best
    tp.indices = dev_tensor(tl.cand_idx[cur] + half, DType::kI32, {1, K}, dev);
    tp.values = dev_tensor(tl.cand_val[cur] + half, DType::kF32, {1, K}, dev);
    st = run_topk(s, tp, tl.topk_ws, tl.topk_ws_bytes);
    if (st.ok() && i > 0) {
      // Tile-local -> key index: + tile offset (a flat map with kv_start = offset).
      MapIndicesParams off;
      off.indices = tp.indices;
      off.kind = IndexMapKind::kFlat;
      off.kv_start = dev_tensor(tl.tile_offset + i, DType::kI32, {1}, dev);
      off.out = tp.indices;
      off.stream = p.stream;
      mark(s, Stage::kSelect);  // tile merges are selection
      st = map_indices(off);
      // Merge: candidates [running k | tile's best] are in ascending key order, so the
      // top-k of their values with ties to the lower position is the exact top-k so far.
      TopkParams mg;
      mg.logits = dev_tensor(tl.cand_val[cur], DType::kF32, {1, 2 * K}, dev);
      mg.lengths = dev_tensor(tl.merge_len + i, DType::kI32, {1}, dev);
      mg.k = K;
      mg.indices = dev_tensor(tl.pos, DType::kI32, {1, K}, dev);
      mg.values = dev_tensor(tl.cand_val[1 - cur], DType::kF32, {1, K}, dev);
      if (st.ok()) st = run_topk(s, mg, tl.topk_ws, tl.topk_ws_bytes);
      // Positions -> key indices: a gather, as a paged map with page size 1 over the candidates.
      MapIndicesParams gather;
      gather.indices = mg.indices;
      gather.kind = IndexMapKind::kPaged;
      gather.block_table = dev_tensor(tl.cand_idx[cur], DType::kI32, {1, 2 * K}, dev);
      gather.page_size = 1;
      gather.out = is_last ? dest : dev_tensor(tl.cand_idx[1 - cur], DType::kI32, {1, K}, dev);
      gather.stream = p.stream;
      mark(s, Stage::kSelect);
      if (st.ok()) st = map_indices(gather);
      cur = 1 - cur;
    }
    s.rep.ms_select += ms_since(ts);
    ++s.rep.score_tiles;
  }
  if (ntiles == 1) ++s.rep.score_tiles;
  *mapped = dev_tensor(tl.mapped, DType::kI32, {1, K}, dev);
  if (st.ok()) st = map_paged(s, dest, r0, 1, *mapped);
  return st;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
