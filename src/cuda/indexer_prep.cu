// Launchers of the indexer preparation family: quantize_fp8, prepare_indexer_q/k.
#include <cmath>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/indexer_prep_kernels.cuh"

namespace dsa {
namespace gpu {
namespace {

constexpr int kThreads = prep::kWarpsPerBlock * kWarp;

unsigned warp_grid(int64_t items) { return grid_for(items, prep::kWarpsPerBlock, 65535LL * 4); }

prep::VecArgs common_args(const TensorDesc& src, const TensorDesc& positions, const TensorDesc& cos_sin,
                          RopeStyle rope, bool hadamard, const TensorDesc& out) {
  prep::VecArgs a{};
  a.src = static_cast<const char*>(src.data);
  a.src_bf16 = src.dtype == DType::kBF16;
  a.esize = static_cast<int64_t>(dtype_size(src.dtype));
  a.positions = idx_vec(positions);
  a.cos_sin = static_cast<const float*>(cos_sin.data);
  a.cs_stride0 = cos_sin.stride[0];
  a.max_positions = cos_sin.shape[0];
  a.interleaved = rope == RopeStyle::kInterleaved;
  a.hadamard = hadamard;
  a.inv_sqrt128 = static_cast<float>(1.0 / std::sqrt(128.0));  // the CPU's constant
  a.out = static_cast<uint8_t*>(out.data);
  return a;
}

}  // namespace

StatusCode quantize_fp8(const QuantizeFp8Params& p) {
  const int64_t R = p.x.shape[0], D = p.x.shape[1];
  if (R == 0 || D == 0) return StatusCode::kOk;
  prep::QuantArgs a{};
  a.x = static_cast<const char*>(p.x.data);
  a.x_bf16 = p.x.dtype == DType::kBF16;
  a.x_stride0 = p.x.stride[0];
  a.x_esize = static_cast<int64_t>(dtype_size(p.x.dtype));
  a.out = static_cast<uint8_t*>(p.out.data);
  a.out_stride0 = p.out.stride[0];
  a.scale = static_cast<float*>(p.scale.data);
  a.scale_stride0 = p.scale.stride[0];
  a.scale_stride1 = p.scale.stride[1];
  a.rows = R;
  a.group = p.group;
  a.groups = D / p.group;
  note_kernel("quantize_fp8.simt");
  prep::quantize_fp8_kernel<<<warp_grid(R * a.groups), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

StatusCode prepare_indexer_q(const PrepareIndexerQParams& p) {
  const int64_t T = p.q.shape[0], H = p.q.shape[1];
  if (T == 0 || H == 0) return StatusCode::kOk;
  prep::VecArgs a = common_args(p.q, p.positions, p.cos_sin, p.rope, p.hadamard, p.q_out);
  a.s0 = p.q.stride[0];
  a.s1 = p.q.stride[1];
  a.o0 = p.q_out.stride[0];
  a.o1 = p.q_out.stride[1];
  a.T = T;
  a.H = H;
  a.w = p.weights.data;
  a.w_bf16 = p.weights.dtype == DType::kBF16;
  a.w0 = p.weights.stride[0];
  a.w1 = p.weights.stride[1];
  a.gate_c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(128 * H)));
  a.w_out = static_cast<float*>(p.weights_out.data);
  a.wo0 = p.weights_out.stride[0];
  a.wo1 = p.weights_out.stride[1];
  if (p.q_scale.present()) {
    a.q_scale = static_cast<float*>(p.q_scale.data);
    a.qs0 = p.q_scale.stride[0];
    a.qs1 = p.q_scale.stride[1];
  }
  note_kernel("prepare_indexer_q.simt");
  prep::prepare_vec_kernel<true><<<warp_grid(T * H), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

StatusCode prepare_indexer_k(const PrepareIndexerKParams& p) {
  const int64_t T = p.k.shape[0];
  if (T == 0) return StatusCode::kOk;
  prep::VecArgs a = common_args(p.k, p.positions, p.cos_sin, p.rope, p.hadamard, p.k_out);
  a.s0 = p.k.stride[0];
  a.s1 = 0;
  a.o0 = p.k_out.stride[0];
  a.o1 = 0;
  a.T = T;
  a.H = 1;
  a.k_scale = static_cast<float*>(p.k_scale.data);
  a.ks0 = p.k_scale.stride[0];
  note_kernel("prepare_indexer_k.simt");
  prep::prepare_vec_kernel<false><<<warp_grid(T), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

}  // namespace gpu
}  // namespace dsa
