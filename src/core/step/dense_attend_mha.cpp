// Stage: dense attend in MHA form (core mode). One run of dense sequences whose cost model
// prefers it: their contexts' latents are decompressed with kv_b_proj into the score region
// (the budget bounds them; the op runs sequence groups that fit) and attended per head with
// q/k of qk_nope + 64 and v of v_head_dim, straight into the caller's [T, H, v] out.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/mha.h"

namespace dsa {
namespace core {
namespace step {

Status dense_attend_mha(Step& s, const Run& run) {
  const StepParams& p = s.p;
  const auto td = Clock::now();
  mark(s, Stage::kDense);
  const int64_t nb = run.b1 - run.b0, n = run.r1 - run.r0;
  const DenseRunTables t = dense_run_tables(s, run);
  DenseMhaPrefillParams mp;
  mp.q_nope = rows(p.q_nope, run.r0, n);
  mp.q_pe = rows(p.q_pe, run.r0, n);
  mp.cache = p.mla_cache;
  mp.block_table = t.block_table;  // with host lengths the op gathers no further than them
  mp.kv_lens = t.kv_lens;
  mp.kv_lens_host = make_tensor(s.kv_lens_h + run.b0, DType::kI32, {nb}, cpu_device());
  mp.cu_seqlens_q = t.cu_seqlens;
  mp.kv_b_proj = p.kv_b_proj;
  mp.attn_sink = p.attn_sink;
  mp.sm_scale = s.sm_scale;
  mp.out = rows(p.out, run.r0, n);
  mp.lse = rows(p.lse, run.r0, n);
  mp.workspace = s.lay.score;  // the whole score region: nothing else is live during the op
  mp.workspace_bytes = static_cast<size_t>(s.lay.score_bytes);
  mp.stream = p.stream;
  const MhaWorkspaceSize need = dense_mha_prefill_workspace_size(mp);
  if (need.min_bytes > mp.workspace_bytes)
    return internal("an MHA-form sequence needs " + num(static_cast<int64_t>(need.min_bytes)) +
                    " bytes of workspace, the score region holds " + num(static_cast<int64_t>(mp.workspace_bytes)));
  s.score_high = std::max<int64_t>(s.score_high, static_cast<int64_t>(std::min(need.batch_bytes, mp.workspace_bytes)));
  Status st = dense_mha_prefill(mp);
  s.rep.ms_dense += ms_since(td);
  s.rep.mha_seqs += nb;
  s.rep.mha_rows += n;
  if (!st.ok() || !p.indices_out.present()) return st;
  return identity_indices(s, run);
}

}  // namespace step
}  // namespace core
}  // namespace dsa
