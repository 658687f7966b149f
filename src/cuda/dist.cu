// CUDA launchers of the distributed ops (src/core/dist_ops.h). Kernel bodies in
// dist_kernels.cuh. Every launch is on the caller's stream; nothing synchronises but sync().
#include <cuda_runtime.h>

#include "core/dist_ops.h"
#include "core/kernel_name.h"
#include "cuda/dist_kernels.cuh"

namespace dsa {
namespace distops {
namespace gpu {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

StatusCode launched(const char* name) {
  core::set_last_kernel_name(name);
  return cudaGetLastError() == cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 64 ? 65535 * 64 : b));
}

}  // namespace

StatusCode candidates(const CandidatesArgs& a) {
  const int64_t n = a.M * a.k;
  if (n == 0) return StatusCode::kOk;
  kern::CandidatesView v{a.logits.data, a.logits.dtype == DType::kBF16, a.logits.stride[0], a.local_idx, a.M, a.k,
                         a.ranks, a.rank, a.interleave, a.vals, a.pos};
  kern::dist_candidates<<<blocks_for(n, 256), 256, 0, as_stream(a.stream)>>>(v);
  return launched("dist_candidates");
}

StatusCode merge(const MergeArgs& a) {
  const int64_t n = a.M * a.ranks * a.k;
  if (n == 0) return StatusCode::kOk;
  kern::MergeView v{a.vals, a.pos, a.M, a.k, a.ranks, a.mvals, a.mpos, a.mlen};
  kern::dist_merge_len<<<blocks_for(a.M, 128), 128, 0, as_stream(a.stream)>>>(v);
  kern::dist_merge_scatter<<<blocks_for(n, 256), 256, 0, as_stream(a.stream)>>>(v);
  return launched("dist_merge_scatter");
}

StatusCode final_select(const FinalArgs& a) {
  const int64_t n = a.M * a.k;
  if (n == 0) return StatusCode::kOk;
  kern::FinalView v{a.sel, a.mvals, a.mpos, a.M, a.k, a.width, static_cast<int32_t*>(a.indices.data),
                    a.indices.stride[0], a.values.present() ? static_cast<float*>(a.values.data) : nullptr,
                    a.values.present() ? a.values.stride[0] : 0};
  kern::dist_final<<<blocks_for(n, 256), 256, 0, as_stream(a.stream)>>>(v);
  return launched("dist_final");
}

StatusCode local_indices(const LocalIndicesArgs& a) {
  const int64_t M = a.indices.shape[0], K = a.indices.shape[1];
  if (M * K == 0) return StatusCode::kOk;
  kern::LocalView v{static_cast<const int32_t*>(a.indices.data), a.indices.stride[0],
                    static_cast<int32_t*>(a.out.data), a.out.stride[0], M, K, a.ranks, a.rank, a.interleave};
  kern::dist_local_indices<<<blocks_for(M * K, 256), 256, 0, as_stream(a.stream)>>>(v);
  return launched("dist_local_indices");
}

StatusCode lse_merge(const LseMergeArgs& a) {
  const int64_t TH = a.T * a.H;
  if (TH == 0) return StatusCode::kOk;
  kern::LseMergeView v;
  v.parts = a.parts;
  v.parts_bf16 = a.part_dtype == DType::kBF16;
  v.lses = a.lses;
  v.T = a.T;
  v.H = a.H;
  v.D = a.D;
  v.ranks = a.ranks;
  v.sink = a.attn_sink.present() ? static_cast<const float*>(a.attn_sink.data) : nullptr;
  v.sink_s = a.attn_sink.present() ? a.attn_sink.stride[0] : 0;
  v.out = a.out.data;
  v.out_bf16 = a.out.dtype == DType::kBF16;
  v.out_s0 = a.out.stride[0];
  v.out_s1 = a.out.stride[1];
  v.lse = a.lse.present() ? static_cast<float*>(a.lse.data) : nullptr;
  v.lse_s0 = a.lse.present() ? a.lse.stride[0] : 0;
  v.lse_s1 = a.lse.present() ? a.lse.stride[1] : 0;
  // One block of 128 threads per (token, head); grid.x over (t, h) in chunks of 65535 rows.
  const int64_t rows = TH;
  const unsigned gx = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  const unsigned gy = static_cast<unsigned>((rows + 65534) / 65535);
  kern::dist_lse_merge<<<dim3(gx, gy), 128, 0, as_stream(a.stream)>>>(v);
  return launched("dist_lse_merge");
}

StatusCode copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return StatusCode::kOk;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)) == cudaSuccess
             ? StatusCode::kOk : StatusCode::kDeviceError;
}

StatusCode copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                   void* stream) {
  if (rows == 0 || width == 0) return StatusCode::kOk;
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, as_stream(stream)) ==
                 cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

StatusCode fill(void* dst, int byte, size_t bytes, void* stream) {
  if (bytes == 0) return StatusCode::kOk;
  return cudaMemsetAsync(dst, byte, bytes, as_stream(stream)) == cudaSuccess ? StatusCode::kOk
                                                                             : StatusCode::kDeviceError;
}

StatusCode sync(void* stream) {
  return cudaStreamSynchronize(as_stream(stream)) == cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

}  // namespace gpu
}  // namespace distops
}  // namespace dsa
