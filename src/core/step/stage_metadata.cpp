// Stage: stage metadata. Carves the plan's layout from the caller's workspace and uploads the
// row tables the ops read (row_seq, row_len, token_pos, kv_lens, the dense runs' cu_seqlens),
// once per batch: every layer's run reads them there.
#include <algorithm>

#include "core/step/step.h"

namespace dsa {
namespace core {
namespace step {

Status stage_metadata(Step& s) {
  const StepParams& p = s.p;
  const int64_t B = s.shape.B, T = s.shape.T;
  Arena arena(p.workspace, static_cast<int64_t>(p.workspace_bytes));
  if (!layout_step(arena, s.plan, &s.lay)) return internal("the step layout does not fit plan.workspace_bytes");
  s.score_offset = static_cast<int64_t>(static_cast<uint8_t*>(s.lay.score) - static_cast<uint8_t*>(p.workspace));
  Status st;
  mark(s, Stage::kPrepare);  // metadata uploads count as preparation
  if (p.device_lengths) {
    // Built on the device from the device kv_lens, inside the step (and any graph captured
    // from it): nothing is staged on the host.
    DecodeRowsArgs a;
    a.kv_lens = p.kv_lens.ptr<const int32_t>();
    a.kv_stride = p.kv_lens.stride[0];
    a.B = B;
    a.next_n = p.next_n;
    a.cap = std::min<int64_t>(s.cfg.max_context, p.block_table.shape[1] * s.cfg.page_size);
    a.row_seq = s.lay.row_seq;
    a.row_len = s.lay.row_len;
    a.token_pos = s.lay.token_pos;
    a.kv_lens_out = s.lay.kv_lens;
    return s.ops.decode_rows(a, p.stream);
  }
  if (!(st = s.ops.upload(s.lay.row_seq, s.row_seq_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.row_len, s.row_len_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.token_pos, s.token_pos_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.kv_lens, s.kv_lens_h, B * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.dense_cu, s.dense_cu_h, s.dense_cu_words * 4, p.stream)).ok()) return st;
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
