// What an Attention object keeps between steps (host staging and its slots), and the slot a
// step takes. Device details go through DeviceOps.
#include <algorithm>
#include <exception>
#include <string>

#include "core/step/step.h"

namespace dsa {
namespace core {
namespace step {

Status StepState::init(const Plan& plan) {
  ops = &device_ops(plan.config.device);
  device = plan.config.device;
  hs = host_staging(plan);
  // A plan may declare more sequences than the host can hold routes for: a status, never an
  // exception out of the constructor.
  try {
    route.resize(static_cast<size_t>(plan.config.max_seqs_per_step));
    q_lens.resize(static_cast<size_t>(plan.config.max_seqs_per_step));
    mha.resize(static_cast<size_t>(plan.config.max_seqs_per_step));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
    return Status(StatusCode::kOutOfMemory, "attention_step: plan.config.max_seqs_per_step: cannot allocate the routes of " +
                                                std::to_string(plan.config.max_seqs_per_step) + " sequences");
  }
  const size_t bytes = static_cast<size_t>(hs.total_words()) * sizeof(int32_t);
  void* mem = nullptr;
  Status st = ops->alloc_staging(device, bytes, &mem);
  if (!st.ok()) return st;
  staging = static_cast<int32_t*>(mem);
  if (ops->queued()) {
    for (int i = 0; i < hs.slots; ++i) {
      if (!(st = ops->create_event(device, false, &slot_done[i])).ok()) return st;
    }
  }
  // Tile table, constant for the plan: every tile but a row's last is full.
  const int64_t mt = std::max<int64_t>(plan.max_tiles, 1), Wt = plan.tile_width, K = plan.config.geometry.topk;
  int32_t* tt = staging + hs.tile_table;
  for (int64_t i = 0; i < mt; ++i) {
    tt[i] = static_cast<int32_t>(i * Wt);
    tt[mt + i] = static_cast<int32_t>(Wt);
    tt[2 * mt + i] = static_cast<int32_t>(K + std::min(Wt, K));
  }
  return Status::Ok();
}

StepState::~StepState() {
  if (ops == nullptr) return;
  // The last eager steps' copies may still read the staging.
  for (int i = 0; i < 2; ++i) {
    if (slot_done[i] && slot_pending[i]) ops->wait_event(slot_done[i]);
  }
  for (void*& ev : slot_done) {
    ops->destroy_event(ev);
    ev = nullptr;
  }
  ops->free_staging(staging);
  staging = nullptr;
}

Status acquire_slot(Step& s) {
  StepState& st = s.state;
  const HostStaging& hs = st.hs;
  if (s.ops.queued()) {
    Status c = s.ops.capturing(s.p.stream, &s.capturing);
    if (!c.ok()) return c;
    s.slot = st.next_slot;
    st.next_slot = (st.next_slot + 1) % hs.slots;
    // The step two before may still have copies queued from this slot (never while capturing:
    // a capture begins after the object's eager steps completed, layer.h).
    if (!s.capturing && st.slot_pending[s.slot]) {
      if (!(c = s.ops.wait_event(st.slot_done[s.slot])).ok()) return c;
      st.slot_pending[s.slot] = false;
    }
  }
  point_at_slot(s);
  return Status::Ok();
}

void point_at_slot(Step& s) {
  const StepState& st = s.state;
  const HostStaging& hs = st.hs;
  int32_t* const stage = st.staging + hs.slot_begin + s.slot * hs.slot_words;
  s.row_seq_h = stage + hs.row_seq;
  s.row_len_h = stage + hs.row_len;
  s.token_pos_h = stage + hs.token_pos;
  s.kv_lens_h = stage + hs.kv_lens;
  s.dense_cu_h = stage + hs.dense_cu;
  s.tile_last_h = stage + hs.tile_last;
  s.tile_table = st.staging + hs.tile_table;
  s.tile_stride = hs.tile_words / 3;
}

void keep_prepared(Step& s) {
  Prepared& pr = s.state.prepared;
  pr.valid = true;
  pr.B = s.shape.B;
  pr.T = s.shape.T;
  pr.slot = s.slot;
  pr.lay = s.lay;
  pr.score_offset = s.score_offset;
  pr.workspace = s.p.workspace;
  pr.workspace_bytes = s.p.workspace_bytes;
  pr.block_table = s.p.block_table.data;
  pr.positions = s.p.positions.data;
  pr.device_lengths = s.p.device_lengths;
  pr.next_n = s.p.next_n;
  pr.kv_lens = s.p.kv_lens.data;
}

Status use_prepared(Step& s) {
  const Prepared& pr = s.state.prepared;  // s.capturing: set on entry (Attention::enter)
  s.slot = pr.slot;
  point_at_slot(s);
  s.lay = pr.lay;
  s.score_offset = pr.score_offset;
  s.device_lengths = pr.device_lengths;
  const int64_t T = pr.T;
  s.row_seq = dev_tensor(s.lay.row_seq, DType::kI32, {T}, s.dev);
  s.row_len = dev_tensor(s.lay.row_len, DType::kI32, {T}, s.dev);
  s.token_pos = dev_tensor(s.lay.token_pos, DType::kI32, {T}, s.dev);
  s.positions = s.p.positions.present() ? s.p.positions : s.token_pos;
  s.sm_scale = s.p.sm_scale != 0.0f ? s.p.sm_scale : static_cast<float>(s.cfg.geometry.sm_scale);
  s.score_arena = Arena(s.lay.score, s.lay.score_bytes);
  s.score_high = 0;
  s.dense_cu_at = 0;
  // What the absorbed attends read and write: the caller's q / out (latent mode), or the
  // workspace's absorbed queries and latent outputs around the projections (core mode).
  s.core = s.p.q_nope.present();
  if (s.core) {
    s.q_abs = dev_tensor(s.lay.core_q, s.lay.core_dtype, {T, s.H, kQkDim}, s.dev);
    s.out_lat = dev_tensor(s.lay.core_out, s.lay.core_dtype, {T, s.H, kLatentDim}, s.dev);
  } else {
    s.q_abs = s.p.q;
    s.out_lat = s.p.out;
  }
  return Status::Ok();
}

void release_slot(Step& s) {
  StepState& st = s.state;
  if (s.ops.queued() && !s.capturing && st.slot_done[s.slot] &&
      s.ops.record_event(st.slot_done[s.slot], s.p.stream).ok())
    st.slot_pending[s.slot] = true;
}

}  // namespace step
}  // namespace core
}  // namespace dsa
