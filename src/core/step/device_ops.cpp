// device_ops(dev) and the reference loop of the decode row tables.
#include "core/step/device_ops.h"

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

}  // namespace step
}  // namespace core
}  // namespace dsa
