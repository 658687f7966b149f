// Launcher of the absorbed form's projections on CUDA (dsa/mha.h; src/core/api_mha.cpp has
// checked the arguments, bf16 inputs and row strides cuBLAS can take included):
//   mla_absorb_q:   one cublasGemmStridedBatchedEx over the heads writes q_out[..., 0:512],
//                   pe_copy_kernel writes q_out[..., 512:576];
//   mla_up_project: one cublasGemmStridedBatchedEx over the heads.
// cuBLAS is column-major: a row-major matrix X[R, C] with row stride ld is, read column-major,
// Xᵀ (C x R) with leading dimension ld, so row-major C = A·B is computed as Cᵀ = Bᵀ·Aᵀ.
// bf16 in, f32 accumulation (CUBLAS_COMPUTE_32F, reduced-precision reductions disallowed),
// one rounding to the output dtype. No cuBLAS workspace and no host synchronisation: a call
// can be captured in a CUDA graph once a first call outside capture created the handle.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/blas_handle.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/mla_project_kernels.cuh"

namespace dsa {
namespace gpu {
namespace {

using mla_proj::kLatent;

// Split-K partial sums stay f32 even where the output is bf16 (one rounding, at the end).
constexpr cublasMath_t kMath =
    static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

// A GEMM's leading dimension from a row stride: with one row any value >= `min` will do (the
// API may hand any stride for a dim of extent 1); else the stride, which src/core checked to
// be in [min, 2^31).
int lead(int64_t stride, int64_t rows, int64_t min) {
  return static_cast<int>(rows > 1 ? stride : min);
}

cudaDataType_t blas_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// A stride keeps 16-byte alignment from row to row (a dim of extent 1 has no next row).
bool keeps16(int64_t stride_elems, int64_t extent, int64_t elem_bytes) {
  return extent <= 1 || (stride_elems * elem_bytes) % 16 == 0;
}

StatusCode copy_pe(const MlaAbsorbQParams& p, cudaStream_t stream) {
  mla_proj::PeCopy a;
  a.src = static_cast<const uint16_t*>(p.q_pe.data);
  a.s0 = p.q_pe.stride[0];
  a.s1 = p.q_pe.stride[1];
  a.dst = p.q_out.data;
  a.d0 = p.q_out.stride[0];
  a.d1 = p.q_out.stride[1];
  a.T = p.q_nope.shape[0];
  a.H = p.q_nope.shape[1];
  const bool out_bf16 = p.q_out.dtype == DType::kBF16;
  const int64_t ob = out_bf16 ? 2 : 4;
  // q_out's rope part starts 512 elements (1 or 2 KiB) into a row: aligned where the row is.
  const bool vec = aligned16(a.src) && keeps16(a.s0, a.T, 2) && keeps16(a.s1, a.H, 2) && aligned16(a.dst) &&
                   keeps16(a.d0, a.T, ob) && keeps16(a.d1, a.H, ob);
  const int64_t chunks = a.T * a.H * mla_proj::kChunksPerRow;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(ceil_div(chunks, mla_proj::kCopyThreads), int64_t{1} << 16));
  const int th = mla_proj::kCopyThreads;
  if (out_bf16 && vec) mla_proj::pe_copy_kernel<uint16_t, true><<<blocks, th, 0, stream>>>(a);
  else if (out_bf16) mla_proj::pe_copy_kernel<uint16_t, false><<<blocks, th, 0, stream>>>(a);
  else if (vec) mla_proj::pe_copy_kernel<float, true><<<blocks, th, 0, stream>>>(a);
  else mla_proj::pe_copy_kernel<float, false><<<blocks, th, 0, stream>>>(a);
  return last_launch_status();
}

}  // namespace

StatusCode mla_absorb_q(const MlaAbsorbQParams& p) {
  const int64_t T = p.q_nope.shape[0], H = p.q_nope.shape[1], nope = p.q_nope.shape[2];
  if (T == 0) return StatusCode::kOk;
  if (p.q_nope.dtype != DType::kBF16 || p.q_pe.dtype != DType::kBF16) return StatusCode::kUnsupported;
  const int64_t w0 = p.kv_b_proj.stride[0];
  const cudaStream_t stream = as_stream(p.stream);
  note_kernel("mla_absorb_q.cublas");
  // Head h, column-major (m = 512, n = T, k = qk_nope):
  //   q_out[:, h, 0:512]ᵀ (512 x T, ldc = q_out.stride[0])
  //     = W_UK[h]ᵀ (512 x qk_nope: the row-major [qk_nope, 512] block at row h (qk_nope + v),
  //                 ld = kv_b_proj.stride[0], op N)
  //     · q_nope[:, h, :]ᵀ (qk_nope x T, ldb = q_nope.stride[0], op N).
  // Batch strides: (qk_nope + v) weight rows, and each tensor's head stride.
  const StatusCode st = with_blas(p.q_nope.device.index, stream, nullptr, 0, kMath, [&](cublasHandle_t h) {
    const float one = 1.f, zero = 0.f;
    return cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(kLatent), static_cast<int>(T), static_cast<int>(nope), &one,
        p.kv_b_proj.data, CUDA_R_16BF, static_cast<int>(w0), static_cast<long long>((nope + p.v_dim) * w0),
        p.q_nope.data, CUDA_R_16BF, lead(p.q_nope.stride[0], T, nope), static_cast<long long>(p.q_nope.stride[1]),
        &zero, p.q_out.data, blas_type(p.q_out.dtype), lead(p.q_out.stride[0], T, kLatent),
        static_cast<long long>(p.q_out.stride[1]), static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  if (st != StatusCode::kOk) return st;
  return copy_pe(p, stream);
}

StatusCode mla_up_project(const MlaUpProjectParams& p) {
  const int64_t T = p.latent.shape[0], H = p.latent.shape[1], v = p.out.shape[2];
  if (T == 0) return StatusCode::kOk;
  if (p.latent.dtype != DType::kBF16) return StatusCode::kUnsupported;
  const int64_t w0 = p.kv_b_proj.stride[0];
  const uint16_t* w_uv = static_cast<const uint16_t*>(p.kv_b_proj.data) + p.qk_nope * w0;
  note_kernel("mla_up_project.cublas");
  // Head h, column-major (m = v, n = T, k = 512):
  //   out[:, h, :]ᵀ (v x T, ldc = out.stride[0])
  //     = W_UV[h] (v x 512: the row-major [v, 512] block at row h (qk_nope + v) + qk_nope is,
  //               column-major, 512 x v with ld = kv_b_proj.stride[0]; op T)
  //     · latent[:, h, :]ᵀ (512 x T, ldb = latent.stride[0], op N).
  return with_blas(p.latent.device.index, as_stream(p.stream), nullptr, 0, kMath, [&](cublasHandle_t h) {
    const float one = 1.f, zero = 0.f;
    return cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(v), static_cast<int>(T), static_cast<int>(kLatent), &one, w_uv,
        CUDA_R_16BF, static_cast<int>(w0), static_cast<long long>((p.qk_nope + v) * w0), p.latent.data, CUDA_R_16BF,
        lead(p.latent.stride[0], T, kLatent), static_cast<long long>(p.latent.stride[1]), &zero, p.out.data,
        blas_type(p.out.dtype), lead(p.out.stride[0], T, v), static_cast<long long>(p.out.stride[1]),
        static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

}  // namespace gpu
}  // namespace dsa
