// GPU time per stage (StepParams::time_stages): events recorded on the step's stream where the
// stage changes, each interval between two events charged to the stage that began it, summed
// per stage over the step's launches. The events are created once per Attention object, on its
// first timed step; a step that is not timed records nothing. A timed step waits for its last
// event before it reports; a step whose stream is being captured is never timed (a graph must
// not synchronise), nor is a CPU step (its host times are its device times).
#pragma once
#include "core/step/device_ops.h"
#include "dsa/layer.h"

namespace dsa {
namespace core {
namespace step {

enum class Stage : int { kCache = 0, kPrepare, kScore, kSelect, kMap, kSparse, kDense, kProject };
constexpr int kStages = 8;

class StageTimer {
 public:
  // The events in flight at once; a step with more stage changes waits for the older ones
  // (only while timed) and reuses them.
  static constexpr int kEvents = 64;

  ~StageTimer();
  // Starts timing one step (creating the events on first use); inactive when not asked.
  Status begin(const DeviceOps& ops, Device dev, void* stream, bool wanted);
  bool active() const { return active_; }
  // The stream enters `stage` here. Free when inactive; a repeated stage records nothing.
  void mark(Stage stage);
  // Ends the step: records the last event, waits for it, and fills rep.gpu_ms_*; an error of
  // recording or waiting is returned (the report then says gpu_timed = false).
  Status end(StepReport* rep);
  void cancel() { active_ = false; }

 private:
  Status harvest(int upto);  // waits for event upto and charges intervals [0, upto)

  const DeviceOps* ops_ = nullptr;
  Device dev_;
  void* stream_ = nullptr;
  void* ev_[kEvents] = {};
  Stage tag_[kEvents] = {};
  bool created_ = false;
  bool active_ = false;
  int n_ = 0;
  Status error_;
  double ms_[kStages] = {};
  double total_ = 0;
};

}  // namespace step
}  // namespace core
}  // namespace dsa
