// The row tables of a graph-stable decode batch (core/step/device_ops.h, DecodeRowsArgs), built
// on the device from the device kv_lens so that a captured step serves every later decode step
// of its batch size. One thread per row; the same arithmetic as decode_rows_host. Also the
// rows of padded tokens (slot_mapping -1) after a step (mask_padded_host's rule).
#include <cuda_runtime.h>
#include <math_constants.h>

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

// One block per token; blocks of real tokens (slot >= 0) return at once.
__global__ void __launch_bounds__(kRowsThreads) mask_padded_kernel(core::step::MaskPaddedArgs a) {
  const int64_t t = blockIdx.x;
  if (a.slots[t * a.slot_stride] >= 0) return;
  for (int64_t e = threadIdx.x; e < a.H * a.D; e += kRowsThreads) {
    const int64_t h = e / a.D, d = e % a.D;
    uint8_t* p = a.out + (t * a.out_s0 + h * a.out_s1 + d) * a.out_es;
    if (a.out_es == 4) *reinterpret_cast<float*>(p) = 0.0f;
    else *reinterpret_cast<uint16_t*>(p) = 0;  // bf16 +0
  }
  for (int64_t h = threadIdx.x; h < a.H; h += kRowsThreads) a.lse[t * a.lse_s0 + h * a.lse_s1] = CUDART_INF_F;
  if (a.ind != nullptr)
    for (int64_t j = threadIdx.x; j < a.K; j += kRowsThreads) a.ind[t * a.ind_s0 + j * a.ind_s1] = -1;
}

}  // namespace

Status launch_mask_padded(const core::step::MaskPaddedArgs& a, void* stream) {
  if (a.T == 0) return Status::Ok();
  mask_padded_kernel<<<static_cast<unsigned>(a.T), kRowsThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status(StatusCode::kDeviceError, std::string("attention_step: padded-token rows: ") + cudaGetErrorString(e));
  return Status::Ok();
}

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
