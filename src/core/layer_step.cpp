// One step of a DSA layer (SPEC §6) on top of the public ops, as its pipeline of stages; each
// stage is a function of src/core/step/ (step.h lists them). Every device temporary comes from
// the plan's arena layout (core/step_layout.h); host metadata lives in buffers the Attention
// object allocated at construction. See docs/planner.md.
//
//   prepare (once per batch):  validate_batch, acquire_slot, row_tables, stage_metadata
//   run (once per layer):      validate, use_prepared, route, write_caches, [core mode:
//                              absorb_queries per absorbed run], dense_attend (or
//                              dense_attend_mha) per dense run, sparse_run per sparse run,
//                              [core mode: up_project per absorbed run]
//   step:                      validate, then prepare's and run's stages
#include <algorithm>
#include <new>

#include "core/step/step.h"
#include "dsa/layer.h"

namespace dsa {
namespace st = core::step;
namespace {

// Marks, on every exit, the point after this call's last copy from its staging slot, and
// drops an unfinished timing.
struct SlotRelease {
  st::Step& s;
  bool armed = false;
  ~SlotRelease() {
    s.state.timer.cancel();
    if (armed) st::release_slot(s);
  }
};

// The batch's host work and uploads (after validation).
Status prepare_batch(st::Step& s, SlotRelease& release) {
  s.state.prepared.valid = false;
  Status status = st::acquire_slot(s);
  if (!status.ok()) return status;
  release.armed = true;
  st::row_tables(s);
  if (!(status = st::stage_metadata(s)).ok()) return status;
  st::keep_prepared(s);
  return Status::Ok();
}

// One layer over the prepared batch (after validation).
Status run_layer(st::Step& s, SlotRelease& release, bool check_batch) {
  Status status = st::use_prepared(s);
  if (!status.ok()) return status;
  if (check_batch && !(status = st::matches_prepared(s)).ok()) return status;
  release.armed = true;
  st::route(s);
  if (s.shape.T == 0) return Status::Ok();
  if (!(status = st::write_caches(s)).ok()) return status;
  // Core mode: every run that attends in absorbed form gets its queries absorbed first and
  // its latent outputs up-projected last; MHA-form runs write out directly.
  const auto absorbed = [&](const st::Run& run) { return s.core && !st::served_mha(s, run); };
  status = st::for_each_run(s, [&](const st::Run& run) { return absorbed(run) ? st::absorb_queries(s, run) : Status::Ok(); });
  if (!status.ok()) return status;
  status = st::for_each_run(s, [&](const st::Run& run) {
    if (!run.dense) return Status::Ok();
    return st::served_mha(s, run) ? st::dense_attend_mha(s, run) : st::dense_attend(s, run);
  });
  if (!status.ok()) return status;
  status = st::for_each_run(s, [&](const st::Run& run) { return run.dense ? Status::Ok() : st::sparse_run(s, run); });
  if (!status.ok()) return status;
  status = st::for_each_run(s, [&](const st::Run& run) { return absorbed(run) ? st::up_project(s, run) : Status::Ok(); });
  if (!status.ok() || !s.p.slot_mapping.present()) return status;
  return st::mask_padded(s);
}

// The report of a call that got past validation: high-water marks, GPU stage times (waiting
// for the last event when timed), host times.
Status finish(st::Step& s, Status r, st::Clock::time_point t_begin, StepReport* report) {
  StepReport& rep = s.rep;
  s.score_high = std::max(s.score_high, s.score_arena.high_water());
  rep.score_high_water_bytes = s.score_high;
  rep.workspace_high_water_bytes = s.score_offset + s.score_high;
  rep.host_us = st::ms_since(t_begin) * 1e3;
  if (r.ok()) r = s.state.timer.end(&rep);
  else s.state.timer.cancel();
  rep.ms_total = st::ms_since(t_begin);
  if (report) *report = rep;
  return r;
}

// One prefix per entry point: every refusal of step / prepare / run reads "attention_step: ...",
// including one an inner op (a cache write, the scorer) returned under its own name.
Status one_prefix(Status st) {
  if (st.ok()) return st;
  const std::string prefix = std::string(st::kOp) + ": ";
  if (st.message().compare(0, prefix.size(), prefix) == 0) return st;
  return Status(st.code(), prefix + st.message());
}

}  // namespace

const char* dense_form_name(DenseForm f) {
  switch (f) {
    case DenseForm::kAuto: return "auto";
    case DenseForm::kMha: return "mha";
    case DenseForm::kAbsorbed: return "absorbed";
  }
  return "unknown";
}

const char* route_name(Route r) {
  switch (r) {
    case Route::kDense: return "dense";
    case Route::kSparseScored: return "sparse";
    case Route::kSparseShared: return "shared";
  }
  return "unknown";
}

Attention::Attention(const Plan& plan) : plan_(plan), state_(new (std::nothrow) st::StepState) {
  status_ = state_ ? state_->init(plan_)
                   : Status(StatusCode::kOutOfMemory, "attention_step: cannot allocate the step state");
}

Status Attention::create(const Plan& plan, std::unique_ptr<Attention>* out) {
  if (out == nullptr) return st::invalid("create: out: expected a non-null std::unique_ptr<Attention>*");
  std::unique_ptr<Attention> a(new (std::nothrow) Attention(plan));
  if (!a) return Status(StatusCode::kOutOfMemory, "attention_step: create: cannot allocate the Attention object");
  if (!a->status().ok()) return a->status();
  *out = std::move(a);
  return Status::Ok();
}

Attention::~Attention() = default;

Status Attention::step(const StepParams& p, StepReport* report) { return one_prefix(enter(Call::kStep, p, report)); }
Status Attention::prepare(const StepParams& p, StepReport* report) {
  return one_prefix(enter(Call::kPrepare, p, report));
}
Status Attention::run(const StepParams& p, StepReport* report) { return one_prefix(enter(Call::kRun, p, report)); }

// step = prepare's stages then run's, over one validation; prepare validates only the batch
// fields; run validates the whole step and holds it against the prepared batch.
Status Attention::enter(Call call, const StepParams& p, StepReport* report) {
  if (!status_.ok()) return status_;
  const auto t_begin = st::Clock::now();
  StepReport rep;
  rep.workspace_plan_bytes = plan_.workspace_bytes;
  rep.score_budget_bytes = plan_.score_budget_bytes;
  st::Step s(plan_, p, *state_, rep);
  if (call == Call::kPrepare) state_->prepared.valid = false;
  Status status = call == Call::kPrepare ? st::validate_batch(plan_, p, &s.shape) : st::validate(plan_, p, &s.shape);
  if (!status.ok()) return status;
  SlotRelease release{s};
  if (s.ops.queued() && !(status = s.ops.capturing(p.stream, &s.capturing)).ok()) return status;
  // Device-resident inputs of an eager step, read back and checked before anything is written:
  // once per batch (step, prepare; run only what prepare did not see), then each layer's caches
  // against what was read (step, run: prepare has no caches).
  st::DeviceInputFacts fresh;
  const bool reuse = call == Call::kRun;
  st::DeviceInputFacts& facts = reuse ? state_->prepared.facts : fresh;
  if (!reuse || state_->prepared.valid) {  // an unprepared run is refused by run_layer
    if (!(status = st::check_device_inputs(s, &facts)).ok()) return status;
    if (call != Call::kPrepare && !(status = st::check_device_facts(s, facts)).ok()) return status;
  }
  // GPU stage times: only when asked, on a queued backend, outside capture.
  if (!(status = state_->timer.begin(s.ops, s.dev, p.stream, p.time_stages && s.ops.queued() && !s.capturing)).ok())
    return status;
  if (call != Call::kRun) {
    status = prepare_batch(s, release);
    if (status.ok()) state_->prepared.facts = fresh;
    if (call == Call::kPrepare) s.score_offset = state_->prepared.score_offset;
  }
  if (call != Call::kPrepare && status.ok()) status = run_layer(s, release, call == Call::kRun);
  return finish(s, status, t_begin, report);
}

}  // namespace dsa
