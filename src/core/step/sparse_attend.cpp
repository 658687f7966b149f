// Stage: sparse attend. Sparse MLA of rows [r0, r0 + n) over their mapped cache slots.
#include "core/step/step.h"
#include "dsa/attention.h"

namespace dsa {
namespace core {
namespace step {

Status sparse_attend(Step& s, int64_t r0, int64_t n, const TensorDesc& mapped) {
  const StepParams& p = s.p;
  const auto ts = Clock::now();
  mark(s, Stage::kSparse);
  SparseMlaParams sp;
  sp.q = rows(s.q_abs, r0, n);
  sp.kv.paged = p.mla_cache;
  sp.indices = mapped;
  sp.attn_sink = p.attn_sink;
  sp.sm_scale = s.sm_scale;
  sp.out = rows(s.out_lat, r0, n);
  sp.lse = rows(p.lse, r0, n);
  sp.workspace = s.lay.attn_ws;
  sp.workspace_bytes = static_cast<size_t>(s.lay.attn_ws_bytes);
  sp.stream = p.stream;
  Status st = s.dev.type != DeviceType::kCPU ? attn_ws_check(s, sparse_mla_workspace_size(sp)) : Status::Ok();
  if (st.ok()) st = sparse_mla(sp);
  s.rep.ms_sparse += ms_since(ts);
  return st;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
