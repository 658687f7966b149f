// Stage: the projections of core mode (SPEC §6), around a run's absorbed attends: the run's
// queries absorbed with W_UK into the workspace's q_abs rows (mla_absorb_q), and, after the
// attends wrote out_lat, the caller's [T, H, v] out rows up-projected with W_UV
// (mla_up_project). Rows are the same indices in both regions and in the caller's tensors.
#include "core/step/step.h"
#include "dsa/mha.h"

namespace dsa {
namespace core {
namespace step {

Status absorb_queries(Step& s, const Run& run) {
  const StepParams& p = s.p;
  const auto t0 = Clock::now();
  mark(s, Stage::kProject);
  const int64_t n = run.r1 - run.r0;
  MlaAbsorbQParams a;
  a.q_nope = rows(p.q_nope, run.r0, n);
  a.q_pe = rows(p.q_pe, run.r0, n);
  a.kv_b_proj = p.kv_b_proj;
  a.v_dim = s.cfg.geometry.v_head_dim;
  a.q_out = rows(s.q_abs, run.r0, n);
  a.stream = p.stream;
  Status st = mla_absorb_q(a);
  s.rep.ms_project += ms_since(t0);
  return st;
}

Status up_project(Step& s, const Run& run) {
  const StepParams& p = s.p;
  const auto t0 = Clock::now();
  mark(s, Stage::kProject);
  const int64_t n = run.r1 - run.r0;
  MlaUpProjectParams u;
  u.latent = rows(s.out_lat, run.r0, n);
  u.kv_b_proj = p.kv_b_proj;
  u.qk_nope = s.cfg.geometry.qk_nope_head_dim;
  u.out = rows(p.out, run.r0, n);
  u.stream = p.stream;
  Status st = mla_up_project(u);
  s.rep.ms_project += ms_since(t0);
  return st;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
