// The float64 reference of `dsa run`: for sampled rows of every stage, recompute the stage
// from its inputs with plain double code and compare with what the backend produced. Each
// stage is checked against the backend's own inputs to that stage (the previous stage's
// outputs, themselves checked), so a failure points at one stage.
#pragma once
#include <string>
#include <vector>

#include "run_batch.h"

namespace dsa_cli {

struct CheckResult {
  std::string stage;
  int rows = 0;          // sampled rows (tokens) compared against the reference
  bool passed = true;
  double worst = 0.0;    // largest |error| / tolerance seen (<= 1 passes)
  std::string detail;    // the first mismatch, if any
};

// Checks `stage` (a name from step_stages()) after download_all(). `samples` rows per stage.
CheckResult check_stage(const std::string& stage, const BatchSpec& s, RunBuffers& b, int samples);

}  // namespace dsa_cli
