// device_ops(dev) and the reference loop of the decode row tables.
#include "core/step/device_ops.h"

#include <cstring>
#include <limits>

#include "core/dispatch.h"

namespace dsa {
namespace core {
namespace step {

const DeviceOps& device_ops(Device dev) { return step_backend(dev.type); }

void decode_rows_host(const DecodeRowsArgs& a) {
  for (int64_t b = 0; b < a.B; ++b) {
    int64_t kv = a.kv_lens[b * a.kv_stride];
    kv = kv < a.next_n ? a.next_n : (kv > a.cap ? a.cap : kv);
    a.kv_lens_out[b] = static_cast<int32_t>(kv);
    for (int64_t i = 0; i < a.next_n; ++i) {
      const int64_t r = b * a.next_n + i;
      a.row_seq[r] = static_cast<int32_t>(b);
      a.token_pos[r] = static_cast<int32_t>(kv - a.next_n + i);
      a.row_len[r] = static_cast<int32_t>(kv - a.next_n + i + 1);
    }
  }
}

void mask_padded_host(const MaskPaddedArgs& a) {
  for (int64_t t = 0; t < a.T; ++t) {
    if (a.slots[t * a.slot_stride] >= 0) continue;
    for (int64_t h = 0; h < a.H; ++h) {
      std::memset(a.out + (t * a.out_s0 + h * a.out_s1) * a.out_es, 0, static_cast<size_t>(a.D * a.out_es));
      a.lse[t * a.lse_s0 + h * a.lse_s1] = std::numeric_limits<float>::infinity();
    }
    for (int64_t j = 0; a.ind && j < a.K; ++j) a.ind[t * a.ind_s0 + j * a.ind_s1] = -1;
  }
}

}  // namespace step
}  // namespace core
}  // namespace dsa
