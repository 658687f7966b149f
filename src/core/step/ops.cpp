// Helpers every stage shares: messages, row slices, and the op wrappers that check the
// backend's scratch against the plan's layout and add their host time to the report.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/attention.h"
#include "dsa/indexer.h"
#include "dsa/topk.h"

namespace dsa {
namespace core {
namespace step {

const char* const kOp = "attention_step";

Status invalid(const std::string& what) {
  return Status(StatusCode::kInvalidArgument, std::string(kOp) + ": " + what);
}
Status limit(const std::string& what) {
  return Status(StatusCode::kLimitExceeded, std::string(kOp) + ": " + what);
}
Status internal(const std::string& what) {
  return Status(StatusCode::kInternal, std::string(kOp) + ": " + what + " (a planner bug: please report it)");
}

std::string describe(const TensorDesc& t) {
  if (!t.present()) return "none";
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  s += std::string("] ") + dtype_name(t.dtype) + " on " + device_type_name(t.device.type);
  return s;
}

TensorDesc rows(const TensorDesc& t, int64_t r0, int64_t n) {
  TensorDesc s = t;
  if (!t.present()) return s;
  s.data = static_cast<uint8_t*>(t.data) + r0 * t.stride[0] * static_cast<int64_t>(dtype_size(t.dtype));
  s.shape[0] = n;
  return s;
}

TensorDesc dev_tensor(const void* p, DType d, std::initializer_list<int64_t> shape, Device dev) {
  return make_tensor(p, d, shape, dev);
}

Arena Step::fresh_score_arena() {
  score_high = std::max(score_high, score_arena.high_water());
  return Arena(lay.score, lay.score_bytes);
}

// Backend attention scratch against the plan's reservation (the CPU needs none: attention.h).
Status attn_ws_check(const Step& s, size_t need) {
  if (static_cast<int64_t>(need) > s.lay.attn_ws_bytes)
    return internal("attention needs " + num(static_cast<int64_t>(need)) + " bytes of workspace, the plan reserved " +
                    num(s.lay.attn_ws_bytes));
  return Status::Ok();
}

Status run_topk(Step& s, TopkParams& tp, void* ws, size_t ws_bytes) {
  tp.workspace = ws;
  tp.workspace_bytes = ws_bytes;
  tp.stream = s.p.stream;
  mark(s, Stage::kSelect);
  if (s.dev.type != DeviceType::kCPU && topk_workspace_size(tp) > ws_bytes)
    return internal("top-k needs " + num(static_cast<int64_t>(topk_workspace_size(tp))) + " bytes of scratch, the layout holds " +
                    num(static_cast<int64_t>(ws_bytes)));
  return topk(tp);
}

Status map_paged(Step& s, const TensorDesc& idx, int64_t r0, int64_t n, const TensorDesc& out) {
  const auto tm = Clock::now();
  mark(s, Stage::kMap);
  MapIndicesParams mp;
  mp.indices = idx;
  mp.row_seq = rows(s.row_seq, r0, n);
  mp.kind = IndexMapKind::kPaged;
  mp.block_table = s.p.block_table;
  mp.page_size = s.cfg.page_size;
  mp.num_blocks = s.p.mla_cache.num_blocks;  // a table entry past the cache is an error, not a silent -1
  mp.out = out;
  mp.stream = s.p.stream;
  Status st = map_indices(mp);
  s.rep.ms_map += ms_since(tm);
  return st;
}

Status score_rows(Step& s, int64_t r0, int64_t n, float* logits, int64_t width, int64_t stride, int64_t col_offset,
                  bool skip_short) {
  const auto tl = Clock::now();
  mark(s, Stage::kScore);
  IndexerLogitsPagedParams lp;
  paged_scorer_rows(s, r0, n, &lp);
  lp.col_offset = col_offset;
  lp.skip_rows_up_to = skip_short ? s.K : 0;
  lp.logits = dev_tensor(logits, DType::kF32, {n, width}, s.dev);
  lp.logits.stride[0] = stride;
  Status st = indexer_logits_paged(lp);
  s.rep.ms_score += ms_since(tl);
  return st;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
