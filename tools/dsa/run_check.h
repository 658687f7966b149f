// The float64 reference of `dsa run`: after the layer step, both caches, the selection and the
// attention outputs of sampled rows are recomputed with plain double code and compared with
// what the backend produced, each against checked inputs (the selection scores the cache bytes,
// themselves checked), so a failure points at one part of the step.
#pragma once
#include <string>
#include <vector>

#include "run_batch.h"

namespace dsa_cli {

struct CheckResult {
  std::string stage;
  int rows = 0;          // rows (tokens) compared against the reference
  bool passed = true;
  double worst = 0.0;    // largest |error| / tolerance seen (<= 1 passes)
  std::string detail;    // the first mismatch, if any
};

// Every check of one step, after download_all() (and prepare_reference_queries()). `samples`
// rows per sampled check.
std::vector<CheckResult> check_step(const BatchSpec& s, RunBuffers& b, const dsa::Plan& plan,
                                    const dsa::StepReport& report, int samples);

}  // namespace dsa_cli
