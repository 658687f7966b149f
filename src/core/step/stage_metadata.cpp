// Stage: stage metadata. Carves the plan's layout from the caller's workspace and uploads the
// row tables the ops read (row_seq, row_len, token_pos, kv_lens).
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
  if (!(st = s.ops.upload(s.lay.row_seq, s.row_seq_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.row_len, s.row_len_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.token_pos, s.token_pos_h, T * 4, p.stream)).ok()) return st;
  if (!(st = s.ops.upload(s.lay.kv_lens, s.kv_lens_h, B * 4, p.stream)).ok()) return st;

  s.row_seq = dev_tensor(s.lay.row_seq, DType::kI32, {T}, s.dev);
  s.row_len = dev_tensor(s.lay.row_len, DType::kI32, {T}, s.dev);
  s.token_pos = dev_tensor(s.lay.token_pos, DType::kI32, {T}, s.dev);
  s.positions = p.positions.present() ? p.positions : s.token_pos;
  s.sm_scale = p.sm_scale != 0.0f ? p.sm_scale : static_cast<float>(s.cfg.geometry.sm_scale);
  s.score_arena = Arena(s.lay.score, s.lay.score_bytes);
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
