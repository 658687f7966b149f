#include "core/select_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsa/indexer.h"

namespace dsa {
namespace core {

SelectCostModel select_cost_model(DeviceType device) {
  SelectCostModel m;
  m.fused_available = indexer_topk_available(device);
  if (device == DeviceType::kCPU) {
    // Fitted to indexer_topk against indexer_logits_paged + topk at one index head (where
    // scoring is smallest, so the selection costs show), 64 rows of 4096 to 131072 keys, on
    // the 2-core development machine: per row and thread (docs/fused_select.md).
    m.unfused_ns_per_key = 2.3;
    m.unfused_ns_per_row = 3000;
    m.fused_ns_per_key = 1.33;
    m.fused_ns_per_admitted = 3.76;
  }
  // CUDA has no fused kernel yet, so nothing is compared there and no constants are set.
  return m;
}

double admitted_keys(int64_t width, int64_t k) {
  const double w = static_cast<double>(width), warm = 2.0 * static_cast<double>(k) + 64.0;
  if (w <= warm) return w;
  return std::min(w, warm + static_cast<double>(k) * std::log(w / warm));
}

double unfused_row_ns(const SelectCostModel& m, int64_t width, int64_t) {
  return static_cast<double>(width) * m.unfused_ns_per_key + m.unfused_ns_per_row;
}

double fused_row_ns(const SelectCostModel& m, int64_t width, int64_t k) {
  return static_cast<double>(width) * m.fused_ns_per_key + admitted_keys(width, k) * m.fused_ns_per_admitted;
}

int64_t fused_crossover_width(const SelectCostModel& m, int64_t k) {
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  if (!m.fused_available) return kNever;
  // The difference is not monotone in W (the unfused per-row cost favours the fused path on
  // very short rows, the fused buffer's warm-up disfavours it next), so the crossover is the
  // widest losing point of a grid of 16 widths an octave, k to 2^31: every wider row wins.
  const double top = static_cast<double>(std::numeric_limits<int32_t>::max());
  int64_t last_loss = 0;
  for (double w = static_cast<double>(k) + 1; w <= top; w *= std::exp2(1.0 / 16)) {
    const int64_t wi = static_cast<int64_t>(w);
    if (fused_row_ns(m, wi, k) > unfused_row_ns(m, wi, k)) last_loss = wi;
  }
  if (last_loss == 0) return k;  // every scored row is cheaper fused
  return last_loss;
}

}  // namespace core
}  // namespace dsa
