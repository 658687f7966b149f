// The selection cost model (docs/fused_select.md): per row of W keys (W > topk), which of the
// two selection paths is cheaper on a device. Scoring costs the same on both, so only what
// differs is modelled:
//   unfused: the scores written and read back plus the top-k pass over them:
//            W * unfused_ns_per_key + unfused_ns_per_row
//   fused:   W * fused_ns_per_key (the admission test) + admitted(W) * fused_ns_per_admitted
//            (a word into the candidate buffer, and its share of the compactions)
// where admitted(W) = min(W, 2k + 64 + k ln(W / (2k + 64))): a key in random order enters
// when it beats the k-th best so far. The constants are measured (docs/fused_select.md says
// where); a device without the fused kernel never takes the fused path.
#pragma once
#include <cstdint>

#include "dsa/types.h"

namespace dsa {
namespace core {

struct SelectCostModel {
  bool fused_available = false;
  double unfused_ns_per_key = 0, unfused_ns_per_row = 0;
  double fused_ns_per_key = 0, fused_ns_per_admitted = 0;
};
SelectCostModel select_cost_model(DeviceType device);

double admitted_keys(int64_t width, int64_t k);
double unfused_row_ns(const SelectCostModel& m, int64_t width, int64_t k);
double fused_row_ns(const SelectCostModel& m, int64_t width, int64_t k);
// The widest row the model gives to the unfused path: rows wider than this are cheaper fused
// (the crossover). INT64_MAX when the fused path is unavailable or never cheaper up to 2^31.
int64_t fused_crossover_width(const SelectCostModel& m, int64_t k);

}  // namespace core
}  // namespace dsa
