// One step of a DSA layer (SPEC §6) on top of the public ops, as its pipeline of stages; each
// stage is a function of src/core/step/ (step.h lists them). Every device temporary comes from
// the plan's arena layout (core/step_layout.h); host metadata lives in buffers the Attention
// object allocated at construction. See docs/planner.md.
#include <algorithm>

#include "core/step/step.h"
#include "dsa/layer.h"

namespace dsa {

const char* route_name(Route r) {
  switch (r) {
    case Route::kDense: return "dense";
    case Route::kSparseScored: return "sparse";
    case Route::kSparseShared: return "shared";
  }
  return "unknown";
}

Attention::Attention(const Plan& plan) : plan_(plan), state_(new core::step::StepState) {
  status_ = state_->init(plan_);
}

Status Attention::create(const Plan& plan, std::unique_ptr<Attention>* out) {
  if (out == nullptr) return core::step::invalid("create: out: expected a non-null std::unique_ptr<Attention>*");
  std::unique_ptr<Attention> a(new Attention(plan));
  if (!a->status().ok()) return a->status();
  *out = std::move(a);
  return Status::Ok();
}

Attention::~Attention() = default;

Status Attention::step(const StepParams& p, StepReport* report) {
  namespace st = core::step;
  if (!status_.ok()) return status_;
  const auto t_begin = st::Clock::now();
  StepReport rep;
  rep.workspace_plan_bytes = plan_.workspace_bytes;
  rep.score_budget_bytes = plan_.score_budget_bytes;
  st::Step s(plan_, p, *state_, rep);

  Status status = st::validate(plan_, p, &s.shape);
  if (!status.ok()) return status;
  if (!(status = st::acquire_slot(s)).ok()) return status;
  // Marks, on every exit from here, the point after this step's last copy from its slot.
  struct SlotRelease {
    st::Step& s;
    ~SlotRelease() {
      s.state.timer.cancel();  // an early exit reports no GPU times
      st::release_slot(s);
    }
  } release{s};
  // GPU stage times: only when asked, on a queued backend, outside capture.
  if (!(status = state_->timer.begin(s.ops, s.dev, p.stream, p.time_stages && s.ops.queued() && !s.capturing)).ok())
    return status;

  st::route(s);
  if (!(status = st::stage_metadata(s)).ok()) return status;
  auto finish = [&](Status r) {
    s.score_high = std::max(s.score_high, s.score_arena.high_water());
    rep.score_high_water_bytes = s.score_high;
    rep.workspace_high_water_bytes = s.score_offset + s.score_high;
    if (r.ok()) r = state_->timer.end(&rep);  // waits for the last event when timed
    else state_->timer.cancel();
    rep.ms_total = st::ms_since(t_begin);
    if (report) *report = rep;
    return r;
  };
  if (s.shape.T == 0) return finish(Status::Ok());

  if (!(status = st::write_caches(s)).ok()) return status;
  status = st::for_each_run(s, [&](const st::Run& run) { return run.dense ? st::dense_attend(s, run) : Status::Ok(); });
  if (!status.ok()) return finish(status);
  status = st::for_each_run(s, [&](const st::Run& run) { return run.dense ? Status::Ok() : st::sparse_run(s, run); });
  return finish(status);
}

}  // namespace dsa
