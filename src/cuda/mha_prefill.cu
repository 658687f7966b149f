// Launcher of dense attention in MHA form on CUDA (SPEC §5b), one sequence group per call
// (src/core/api_mha.cpp makes the groups and checks the workspace):
//  1. mha_gather_kernel: the group's latents -> workspace [rows][576] bf16 (FP8 dequantised),
//  2. cuBLAS: kv[rows][H (qk_nope + v)] = latent[:, 0:512] · kv_b_projᵀ (bf16 in, f32
//     accumulate, bf16 out): K_nope and V of every head in kv_b_proj's row order,
//  3. attention: the Hopper kernel (wgmma, TMA) on sm_90a, else the portable kernel.
// The attention kernel reads K_nope / V from the GEMM's output and k_pe from the gathered
// latent rows, both plain row-major matrices that TMA can tile directly; it never touches the
// paged or FP8 layouts. Nothing allocates or synchronises: cuBLAS gets its workspace from ours
// (cublasSetWorkspace) and one handle per device (cuda/blas_handle.h), created on the first
// call and reused; run the first call outside graph capture (as the engines' warm-up does).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda/blas_handle.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/hopper/hopper.cuh"
#include "cuda/mha_prefill_hopper.cuh"
#include "cuda/mha_prefill_kernels.cuh"

namespace dsa {
namespace gpu {
namespace {

// Attention kernel choice: -1 read DSA_MHA_KERNEL once; 0 default (the serial Hopper
// kernel); 1 portable; 2 serial Hopper; 3 pipelined Hopper; 4 pipelined with the two
// warpgroups' GEMMs in turns (ping-pong) and heaviest-first 1-D grid (3 and 4 opt-in until
// checked on the H200, docs/perf.md).
std::atomic<int> g_kernel{-1};
std::atomic<int> g_stages{3};

int kernel_mode() {
  int v = g_kernel.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("DSA_MHA_KERNEL");
    v = 0;
    if (e != nullptr && std::strcmp(e, "portable") == 0) v = 1;
    if (e != nullptr && std::strcmp(e, "wgmma_serial") == 0) v = 2;
    if (e != nullptr && std::strcmp(e, "wgmma_pipe") == 0) v = 3;
    if (e != nullptr && std::strcmp(e, "wgmma_pingpong") == 0) v = 4;
    int expected = -1;
    g_kernel.compare_exchange_strong(expected, v);
    v = g_kernel.load();
  }
  return v;
}

StatusCode gemm(int device, cudaStream_t stream, void* ws, size_t ws_bytes, int N, int M, const uint16_t* w,
                int64_t ldw, const uint16_t* latent, uint16_t* out) {
  return with_blas(device, stream, ws, ws_bytes, CUBLAS_DEFAULT_MATH, [&](cublasHandle_t h) {
    const float one = 1.f, zero = 0.f;
    // Column-major view: kvᵀ (N x M) = W (N x 512, stored as 512 x N: op T) · latentᵀ (512 x M, ld 576).
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, 512, &one, w, CUDA_R_16BF, static_cast<int>(ldw), latent,
                        CUDA_R_16BF, mha::kRowElems, &zero, out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
}

// Opting in to more than 48 KiB of shared memory, once per kernel (one instantiation of this
// template each) and device; a repeat is harmless. Not a stream operation (graph capture is
// unaffected).
template <int kNope, int kV>
bool portable_smem_opt_in(int bytes) {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return true;
  if (cudaFuncSetAttribute(mha::mha_attn_portable_kernel<kNope, kV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           bytes) != cudaSuccess)
    return false;
  done.fetch_or(bit, std::memory_order_acq_rel);
  return true;
}

template <int kNope, int kV>
StatusCode launch_portable(const mha::Problem& pr, int q_blocks, cudaStream_t stream) {
  constexpr int smem = mha::portable_smem_bytes<kNope, kV>();
  if (!portable_smem_opt_in<kNope, kV>(smem)) {
    cudaGetLastError();
    return StatusCode::kDeviceError;
  }
  const dim3 grid(static_cast<unsigned>(q_blocks), static_cast<unsigned>(pr.H), static_cast<unsigned>(pr.nb));
  mha::mha_attn_portable_kernel<kNope, kV><<<grid, mha::kPortThreads, smem, stream>>>(pr);
  return last_launch_status();
}

template <int kNope, int kV>
StatusCode launch_attention(const mha::Problem& pr, int64_t max_q, cudaStream_t stream) {
  const int mode = kernel_mode();
  if (mode != 1 && hopper::current_device_is_sm90a()) {
    // Both geometries (qk 192 / v 128, qk 256 / v 256) fit every Hopper variant.
    StatusCode st;
    const char* name;
    if (mode == 4) {
      st = mha::launch_hopper<kNope, kV, true, true>(pr, max_q, stream);
      name = "dense_mha_prefill.wgmma_pingpong";
    } else if (mode == 3) {
      st = mha::launch_hopper<kNope, kV, true>(pr, max_q, stream);
      name = "dense_mha_prefill.wgmma_pipe";
    } else {
      st = mha::launch_hopper<kNope, kV, false>(pr, max_q, stream);
      name = "dense_mha_prefill.wgmma";
    }
    if (st != StatusCode::kUnsupported) {
      note_kernel(name);
      return st;
    }
  }
  note_kernel("dense_mha_prefill.simt");
  const int64_t q_blocks = ceil_div(max_q, mha::kPortRows);
  return launch_portable<kNope, kV>(pr, static_cast<int>(q_blocks), stream);
}

}  // namespace

void set_mha_force_portable(bool on) { g_kernel.store(on ? 1 : 0); }
void set_mha_kernel(int mode) { g_kernel.store(mode >= 0 && mode <= 4 ? mode : 0); }
void set_mha_stages(int mask) { g_stages.store(mask & 3); }

StatusCode dense_mha_prefill_group(const DenseMhaPrefillParams& p, const core::MhaGroup& g) {
  const int64_t H = p.q_nope.shape[1], nope = p.q_nope.shape[2], v = p.out.shape[2];
  const int64_t N = H * (nope + v);
  if (g.tokens <= 0 || g.b1 <= g.b0) return StatusCode::kOk;
  if (g.tokens > INT32_MAX || N > INT32_MAX || p.q_nope.shape[0] > INT32_MAX) return StatusCode::kUnsupported;
  const core::MhaLayout lay = core::mha_layout(DeviceType::kCUDA, H, nope, v, g.tokens);
  uint8_t* base = static_cast<uint8_t*>(p.workspace);
  base += (core::kMhaAlign - reinterpret_cast<uintptr_t>(base) % core::kMhaAlign) % core::kMhaAlign;

  mha::Problem pr;
  pr.b0 = static_cast<int32_t>(g.b0);
  pr.nb = static_cast<int32_t>(g.b1 - g.b0);
  pr.capacity = g.tokens;
  pr.packed = g.packed ? 1 : 0;
  pr.seq_stride = g.seq_stride;
  pr.T = static_cast<int32_t>(p.q_nope.shape[0]);
  pr.kv_lens = static_cast<const int32_t*>(p.kv_lens.data);
  pr.kv_lens_s = p.kv_lens.stride[0];
  pr.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  pr.cu_q_s = p.cu_seqlens_q.stride[0];
  pr.block_table = static_cast<const int32_t*>(p.block_table.data);
  pr.bt_s0 = p.block_table.stride[0];
  pr.bt_s1 = p.block_table.stride[1];
  pr.max_blocks = static_cast<int32_t>(p.block_table.shape[1]);
  pr.cache = static_cast<const uint8_t*>(p.cache.data);
  pr.block_bytes = p.cache.block_bytes();
  pr.num_blocks = p.cache.num_blocks;
  pr.page = static_cast<int32_t>(p.cache.page_size);
  pr.token_bytes = static_cast<int32_t>(p.cache.token_bytes());
  pr.fp8 = p.cache.dtype == MlaCacheDtype::kFP8 ? 1 : 0;
  pr.kv = reinterpret_cast<uint16_t*>(base + lay.kv);
  pr.latent = reinterpret_cast<uint16_t*>(base + lay.latent);
  pr.q_nope = static_cast<const uint16_t*>(p.q_nope.data);
  pr.qn_s0 = p.q_nope.stride[0];
  pr.qn_s1 = p.q_nope.stride[1];
  pr.q_pe = static_cast<const uint16_t*>(p.q_pe.data);
  pr.qp_s0 = p.q_pe.stride[0];
  pr.qp_s1 = p.q_pe.stride[1];
  pr.out = p.out.data;
  pr.out_bf16 = p.out.dtype == DType::kBF16 ? 1 : 0;
  pr.out_s0 = p.out.stride[0];
  pr.out_s1 = p.out.stride[1];
  pr.lse = static_cast<float*>(p.lse.data);
  pr.lse_s0 = p.lse.stride[0];
  pr.lse_s1 = p.lse.stride[1];
  if (p.attn_sink.present()) {
    pr.sink = static_cast<const float*>(p.attn_sink.data);
    pr.sink_s = p.attn_sink.stride[0];
  }
  pr.H = static_cast<int32_t>(H);
  pr.nope = static_cast<int32_t>(nope);
  pr.v = static_cast<int32_t>(v);
  pr.scale_log2 = p.sm_scale * 1.4426950408889634f;

  // The longest context (and so the most queries) of one sequence in this group.
  int64_t max_ctx = g.packed ? 0 : g.seq_stride;
  if (g.packed) {
    for (int64_t b = g.b0; b < g.b1; ++b)
      max_ctx = std::max<int64_t>(max_ctx, static_cast<const int32_t*>(p.kv_lens_host.data)[b * p.kv_lens_host.stride[0]]);
  }
  if (max_ctx == 0) return StatusCode::kOk;
  const cudaStream_t stream = as_stream(p.stream);
  const int stages = g_stages.load(std::memory_order_relaxed);
  if (stages & 1) {
    const dim3 ggrid(static_cast<unsigned>(ceil_div(max_ctx, mha::kGatherTokens)), static_cast<unsigned>(pr.nb));
    mha::mha_gather_kernel<<<ggrid, mha::kGatherThreads, 0, stream>>>(pr);
    StatusCode st = last_launch_status();
    if (st != StatusCode::kOk) return st;
    st = gemm(p.q_nope.device.index, stream, base + lay.extra, static_cast<size_t>(core::kMhaCublasWorkspace),
              static_cast<int>(N), static_cast<int>(g.tokens), static_cast<const uint16_t*>(p.kv_b_proj.data),
              p.kv_b_proj.stride[0], pr.latent, pr.kv);
    if (st != StatusCode::kOk) return st;
  }
  if (!(stages & 2)) return StatusCode::kOk;
  // A query block per kPortRows / kHopRows of the longest q_len (<= its kv_len).
  if (nope == 128 && v == 128) return launch_attention<128, 128>(pr, max_ctx, stream);
  if (nope == 128 && v == 256) return launch_attention<128, 256>(pr, max_ctx, stream);
  if (nope == 192 && v == 128) return launch_attention<192, 128>(pr, max_ctx, stream);
  if (nope == 192 && v == 256) return launch_attention<192, 256>(pr, max_ctx, stream);
  return StatusCode::kUnsupported;
}

}  // namespace gpu
}  // namespace dsa
