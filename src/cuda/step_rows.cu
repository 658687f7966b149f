// The row tables of a graph-stable decode batch (core/step/device_ops.h, DecodeRowsArgs), built
// on the device from the device kv_lens so that a captured step serves every later decode step
// of its batch size. One thread per row; the same arithmetic as decode_rows_host.
#include <cuda_runtime.h>

#include <string>

#include "core/step/device_ops.h"

namespace dsa {
namespace gpu {
namespace {

constexpr int kRowsThreads = 128;

__global__ void __launch_bounds__(kRowsThreads) decode_rows_kernel(core::step::DecodeRowsArgs a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsThreads + threadIdx.x;
  if (r >= a.B * a.next_n) return;
  const int64_t b = r / a.next_n, i = r % a.next_n;
  int64_t kv = a.kv_lens[b * a.kv_stride];
  kv = kv < a.next_n ? a.next_n : (kv > a.cap ? a.cap : kv);
  if (i == 0) a.kv_lens_out[b] = static_cast<int32_t>(kv);
  a.row_seq[r] = static_cast<int32_t>(b);
  a.token_pos[r] = static_cast<int32_t>(kv - a.next_n + i);
  a.row_len[r] = static_cast<int32_t>(kv - a.next_n + i + 1);
}

}  // namespace

Status launch_decode_rows(const core::step::DecodeRowsArgs& a, void* stream) {
  const int64_t rows = a.B * a.next_n;
  if (rows == 0) return Status::Ok();
  const unsigned blocks = static_cast<unsigned>((rows + kRowsThreads - 1) / kRowsThreads);
  decode_rows_kernel<<<blocks, kRowsThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status(StatusCode::kDeviceError, std::string("attention_step: decode row tables: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace gpu
}  // namespace dsa
