#include "core/step/stage_timer.h"

#include <algorithm>
#include <utility>

namespace dsa {
namespace core {
namespace step {

StageTimer::~StageTimer() {
  if (!created_) return;
  for (void*& e : ev_) {
    ops_->destroy_event(e);
    e = nullptr;
  }
}

Status StageTimer::begin(const DeviceOps& ops, Device dev, void* stream, bool wanted) {
  active_ = false;
  if (!wanted) return Status::Ok();
  if (!created_) {
    ops_ = &ops;
    dev_ = dev;
    created_ = true;  // the destructor frees whatever was created
    for (void*& e : ev_) {
      Status st = ops.create_event(dev, true, &e);
      if (!st.ok()) return st;
    }
  }
  stream_ = stream;
  n_ = 0;
  error_ = Status::Ok();
  std::fill(ms_, ms_ + kStages, 0.0);
  total_ = 0;
  active_ = true;
  return Status::Ok();
}

Status StageTimer::harvest(int upto) {
  Status st = ops_->wait_event(ev_[upto]);
  for (int i = 0; i < upto && st.ok(); ++i) {
    float ms = 0;
    st = ops_->elapsed_ms(ev_[i], ev_[i + 1], &ms);
    ms_[static_cast<int>(tag_[i])] += ms;
    total_ += ms;
  }
  return st;
}

void StageTimer::mark(Stage stage) {
  if (!active_ || !error_.ok()) return;
  if (n_ > 0 && tag_[n_ - 1] == stage) return;
  if (n_ == kEvents) {
    // Charge what is recorded, keep the last event as the new first.
    error_ = harvest(n_ - 1);
    if (!error_.ok()) return;
    std::swap(ev_[0], ev_[n_ - 1]);
    tag_[0] = tag_[n_ - 1];
    n_ = 1;
  }
  error_ = ops_->record_event(ev_[n_], stream_);
  tag_[n_] = stage;
  ++n_;
}

Status StageTimer::end(StepReport* rep) {
  if (!active_) return Status::Ok();
  active_ = false;
  if (!error_.ok()) return error_;
  if (n_ == 0) {
    rep->gpu_timed = true;  // nothing was launched
    return Status::Ok();
  }
  if (n_ == kEvents) {
    if (!(error_ = harvest(n_ - 1)).ok()) return error_;
    std::swap(ev_[0], ev_[n_ - 1]);
    tag_[0] = tag_[n_ - 1];
    n_ = 1;
  }
  if (!(error_ = ops_->record_event(ev_[n_], stream_)).ok()) return error_;
  if (!(error_ = harvest(n_)).ok()) return error_;
  rep->gpu_timed = true;
  rep->gpu_ms_cache = ms_[static_cast<int>(Stage::kCache)];
  rep->gpu_ms_prepare = ms_[static_cast<int>(Stage::kPrepare)];
  rep->gpu_ms_score = ms_[static_cast<int>(Stage::kScore)];
  rep->gpu_ms_select = ms_[static_cast<int>(Stage::kSelect)];
  rep->gpu_ms_map = ms_[static_cast<int>(Stage::kMap)];
  rep->gpu_ms_sparse = ms_[static_cast<int>(Stage::kSparse)];
  rep->gpu_ms_dense = ms_[static_cast<int>(Stage::kDense)];
  rep->gpu_ms_project = ms_[static_cast<int>(Stage::kProject)];
  rep->gpu_ms_total = total_;
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
