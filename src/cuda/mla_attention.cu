// Launchers for sparse and dense MLA attention on CUDA (kernels in mla_attention_kernels.cuh).
// Arguments arrive validated (src/core/api_attention.cpp); device-resident contents (indices,
// lengths, block tables) are guarded inside the kernels instead. Nothing here allocates or
// synchronises: split-K scratch comes from the caller's workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/hopper/hopper.cuh"
#include "cuda/mla_attention_kernels.cuh"
#include "cuda/mla_attention_sm90_kernels.cuh"
#include "cuda/mla_decode.h"

namespace dsa {
namespace gpu {
namespace {

using mla::Problem;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kMinTilesPerSplit = 4;  // a split below 256 keys costs more than it gains
constexpr int64_t kMaxSplits = 64;
constexpr size_t kWorkspaceAlign = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Key-range splitting: when there are too few (token, head group) tiles to fill the device
// twice over, each tile's key list is cut into `splits` ranges of `split_keys` positions.
struct SplitPlan {
  int64_t tiles = 0;
  int32_t splits = 1;
  int32_t split_keys = 0;
  size_t workspace = 0;
  size_t ml_offset = 0;  // where the (m, l) pairs start in the workspace
};

SplitPlan plan_splits(int64_t T, int64_t H, int64_t max_keys, int device) {
  SplitPlan s;
  const int64_t groups = ceil_div(H, mla::kTileHeads);
  s.tiles = T * groups;
  const int64_t key_tiles = ceil_div(std::max<int64_t>(max_keys, 1), mla::kTileKeys);
  s.split_keys = static_cast<int32_t>(std::min<int64_t>(key_tiles * mla::kTileKeys, INT32_MAX / 2));
  if (s.tiles == 0) return s;
  const int64_t target = 2 * static_cast<int64_t>(sm_count_of(device));  // 132 (H200) when unknown
  if (s.tiles >= target || key_tiles < 2 * kMinTilesPerSplit) return s;
  int64_t want = std::min(ceil_div(target, s.tiles), key_tiles / kMinTilesPerSplit);
  want = std::min(want, kMaxSplits);
  if (want <= 1) return s;
  const int64_t tiles_per_split = ceil_div(key_tiles, want);
  s.splits = static_cast<int32_t>(ceil_div(key_tiles, tiles_per_split));
  s.split_keys = static_cast<int32_t>(tiles_per_split * mla::kTileKeys);
  if (s.splits <= 1) {
    s.splits = 1;
    return s;
  }
  const size_t rows = static_cast<size_t>(s.splits) * static_cast<size_t>(s.tiles) * mla::kTileHeads;
  const size_t o_bytes = rows * mla::kVDim * sizeof(float);
  s.ml_offset = (o_bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  s.workspace = s.ml_offset + rows * sizeof(float2);
  return s;
}

// What sparse and dense share: queries, keys, outputs.
void fill_common(Problem& pr, const TensorDesc& q, const MlaKv& kv, const TensorDesc& sink, float sm_scale,
                 const TensorDesc& out, const TensorDesc& lse) {
  pr.q = static_cast<const uint16_t*>(q.data);
  pr.q_s0 = q.stride[0];
  pr.q_s1 = q.stride[1];
  pr.q_aligned16 = aligned16(q.data) && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0;
  pr.T = static_cast<int32_t>(q.shape[0]);
  pr.H = static_cast<int32_t>(q.shape[1]);
  pr.head_groups = static_cast<int32_t>(ceil_div(q.shape[1], mla::kTileHeads));
  if (kv.flat.present()) {
    pr.kv.base = static_cast<const uint8_t*>(kv.flat.data);
    pr.kv.num_keys = kv.flat.shape[0];
    pr.kv.row_stride_bytes = kv.flat.stride[0] * 2;
    pr.kv.aligned16 = aligned16(kv.flat.data) && kv.flat.stride[0] % 8 == 0;
  } else {
    pr.kv.base = static_cast<const uint8_t*>(kv.paged.data);
    pr.kv.num_keys = kv.paged.num_slots();
    pr.kv.block_bytes = kv.paged.block_bytes();
    pr.kv.page_size = static_cast<uint32_t>(kv.paged.page_size);
    pr.kv.token_bytes = static_cast<int32_t>(kv.paged.token_bytes());
    pr.kv.aligned16 = true;  // validated: data and block stride 16-byte aligned
  }
  if (sink.present()) {
    pr.sink = static_cast<const float*>(sink.data);
    pr.sink_s = sink.stride[0];
  }
  pr.scale_log2 = sm_scale * kLog2e;
  pr.out = out.data;
  pr.out_bf16 = out.dtype == DType::kBF16;
  const int64_t per16 = pr.out_bf16 ? 8 : 4;
  pr.out_aligned16 = aligned16(out.data) && out.stride[0] % per16 == 0 && out.stride[1] % per16 == 0;
  pr.out_s0 = out.stride[0];
  pr.out_s1 = out.stride[1];
  pr.lse = static_cast<float*>(lse.data);
  pr.lse_s0 = lse.stride[0];
  pr.lse_s1 = lse.stride[1];
}

int kv_kind(const MlaKv& kv) {
  if (kv.flat.present()) return mla::kFlatBf16;
  return kv.paged.dtype == MlaCacheDtype::kFP8 ? mla::kPagedFp8 : mla::kPagedBf16;
}

using TileKernel = void (*)(Problem);

// Opting in to the large shared-memory carve-out is a property of the function, set on first
// use of each kernel on each device (the value never changes, so a race only repeats it). It
// is not a stream operation, so graph capture is unaffected.
template <bool kDense, int kKv>
bool smem_opt_in(TileKernel kernel) {
  static std::atomic<uint64_t> done_devices{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit && (done_devices.load(std::memory_order_acquire) & bit)) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mla::kSmemBytes) != cudaSuccess)
    return false;
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
  return true;
}

template <bool kDense, int kKv>
StatusCode launch_tiles(const Problem& pr, const SplitPlan& plan, cudaStream_t stream) {
  const TileKernel kernel = kDense ? mla::dense_mla_kernel<kKv> : mla::sparse_mla_kernel<kKv>;
  if (!smem_opt_in<kDense, kKv>(kernel)) {
    cudaGetLastError();
    return StatusCode::kDeviceError;
  }
  const dim3 grid(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.splits));
  if (kDense) {
    note_kernel(plan.splits > 1 ? "dense_mla.mma_sync+combine" : "dense_mla.mma_sync");
  } else {
    note_kernel(plan.splits > 1 ? "sparse_mla.mma_sync+combine" : "sparse_mla.mma_sync");
  }
  kernel<<<grid, mla::kThreads, mla::kSmemBytes, stream>>>(pr);
  if (plan.splits > 1) {
    mla::mla_combine_kernel<<<static_cast<unsigned>(plan.tiles * mla::kTileHeads), 128, 0, stream>>>(
        pr, static_cast<int>(plan.tiles));
  }
  return last_launch_status();
}

// The Hopper sparse kernels: same tiles, split plan and combine as the mma.sync one. H <= 32
// runs the transposed few-heads kernel with N = 8, 16 or 32 head columns.
template <class Kernel>
StatusCode launch_sparse_sm90(Kernel kernel, int smem_bytes, std::atomic<uint64_t>& done_devices, const char* name,
                              const char* name_split, const Problem& pr, const SplitPlan& plan, cudaStream_t stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return StatusCode::kDeviceError;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (!bit || !(done_devices.load(std::memory_order_acquire) & bit)) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) {
      cudaGetLastError();
      return StatusCode::kDeviceError;
    }
    done_devices.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.splits));
  note_kernel(plan.splits > 1 ? name_split : name);
  kernel<<<grid, mla::sm90::kThreads, smem_bytes, stream>>>(pr);
  if (plan.splits > 1) {
    mla::mla_combine_kernel<<<static_cast<unsigned>(plan.tiles * mla::kTileHeads), 128, 0, stream>>>(
        pr, static_cast<int>(plan.tiles));
  }
  return last_launch_status();
}

// kAsync: the producer releases tiles with cp.async-tracked mbarrier arrivals (the default for
// H <= 32, see sparse_async_gather; mla_attention_sm90_kernels.cuh, produce()).
template <int kKv, bool kAsync>
StatusCode launch_sparse_wgmma_as(const Problem& pr, const SplitPlan& plan, cudaStream_t stream) {
  static std::atomic<uint64_t> done64{0}, done8{0}, done16{0}, done32{0};
  namespace s9 = mla::sm90;
  const char* few = kAsync ? "sparse_mla.wgmma_bf16_few_heads_async" : "sparse_mla.wgmma_bf16_few_heads";
  const char* few_split =
      kAsync ? "sparse_mla.wgmma_bf16_few_heads_async+combine" : "sparse_mla.wgmma_bf16_few_heads+combine";
  if (pr.H <= 8)
    return launch_sparse_sm90(s9::sparse_mla_wgmma_few_heads_kernel<kKv, 8, kAsync>, s9::FewHeadsLayout<8>::kSmemBytes,
                              done8, few, few_split, pr, plan, stream);
  if (pr.H <= 16)
    return launch_sparse_sm90(s9::sparse_mla_wgmma_few_heads_kernel<kKv, 16, kAsync>,
                              s9::FewHeadsLayout<16>::kSmemBytes, done16, few, few_split, pr, plan, stream);
  if (pr.H <= 32)
    return launch_sparse_sm90(s9::sparse_mla_wgmma_few_heads_kernel<kKv, 32, kAsync>,
                              s9::FewHeadsLayout<32>::kSmemBytes, done32, few, few_split, pr, plan, stream);
  return launch_sparse_sm90(s9::sparse_mla_wgmma_kernel<kKv, kAsync>, s9::kSmemBytes, done64,
                            kAsync ? "sparse_mla.wgmma_bf16_async" : "sparse_mla.wgmma_bf16",
                            kAsync ? "sparse_mla.wgmma_bf16_async+combine" : "sparse_mla.wgmma_bf16+combine", pr,
                            plan, stream);
}

// Which producer the Hopper BF16 kernels run. Default: the async-gather one (tracked arrivals,
// two tiles in flight) for H <= 32, where it measured 28-31% faster on the H200 (docs/perf.md,
// round 3); the blocking one for H >= 64, where both ran equally fast (the consumer chain is
// the limit there). DSA_SPARSE_KERNEL=async_gather or sync_gather forces one for every H (tests,
// the bench). Read per call so tests can switch it.
bool sparse_async_gather(int64_t heads) {
  const char* v = std::getenv("DSA_SPARSE_KERNEL");
  if (v != nullptr && std::strcmp(v, "async_gather") == 0) return true;
  if (v != nullptr && std::strcmp(v, "sync_gather") == 0) return false;
  return heads <= 32;
}

template <int kKv>
StatusCode launch_sparse_wgmma(const Problem& pr, const SplitPlan& plan, cudaStream_t stream) {
  return sparse_async_gather(pr.H) ? launch_sparse_wgmma_as<kKv, true>(pr, plan, stream)
                                   : launch_sparse_wgmma_as<kKv, false>(pr, plan, stream);
}

// DSA_FORCE_KERNEL=mma_sync keeps the mma.sync kernel on sm_90a too (tests compare the two;
// read on every call so a test can switch it).
bool forced_mma_sync() {
  const char* v = std::getenv("DSA_FORCE_KERNEL");
  return v != nullptr && std::strcmp(v, "mma_sync") == 0;
}

// Which sparse kernel a call runs: wgmma on sm_90a for BF16 caches (flat or paged) with
// 16-byte-aligned queries and keys; mma.sync otherwise (other GPUs, FP8 caches, odd strides).
// `forced`: forced_mma_sync(), read once by the caller.
bool sparse_uses_wgmma(const SparseMlaParams& p, bool forced) {
  if (forced) return false;
  if (kv_kind(p.kv) == mla::kPagedFp8) return false;
  const bool q_ok = aligned16(p.q.data) && p.q.stride[0] % 8 == 0 && p.q.stride[1] % 8 == 0;
  const bool kv_ok = p.kv.flat.present() ? (aligned16(p.kv.flat.data) && p.kv.flat.stride[0] % 8 == 0) : true;
  if (!q_ok || !kv_ok) return false;
  return hopper::current_device_is_sm90a();
}

void attach_workspace(Problem& pr, const SplitPlan& plan, void* workspace) {
  pr.splits = plan.splits;
  pr.split_keys = plan.split_keys;
  if (plan.splits > 1) {
    pr.part_o = static_cast<float*>(workspace);
    pr.part_ml = reinterpret_cast<float2*>(static_cast<uint8_t*>(workspace) + plan.ml_offset);
  }
}

int device_of(const TensorDesc& q) { return q.device.index; }

SplitPlan sparse_plan(const SparseMlaParams& p) {
  return plan_splits(p.q.shape[0], p.q.shape[1], p.indices.shape[1], device_of(p.q));
}

// The most keys one sequence can have: what bounds a dense key list before the lengths
// (device data) are known.
int64_t dense_max_keys(const DenseMlaParams& p) {
  if (p.kv.flat.present()) return p.kv.flat.shape[0];
  return p.block_table.shape[1] * p.kv.paged.page_size;
}

SplitPlan dense_plan(const DenseMlaParams& p) {
  return plan_splits(p.q.shape[0], p.q.shape[1], dense_max_keys(p), device_of(p.q));
}

}  // namespace

// The workspace covers whichever kernel a call may take (the Hopper one's need does not depend
// on device lengths or on B, so the planner's query bounds every call).
size_t sparse_mla_workspace_size(const SparseMlaParams& p) {
  return std::max(sparse_plan(p).workspace, decode::sparse_workspace(p));
}

StatusCode sparse_mla(const SparseMlaParams& p) {
  const SplitPlan plan = sparse_plan(p);
  if (plan.tiles == 0) return StatusCode::kOk;
  const bool forced = forced_mma_sync();  // once per call: the environment is read once
  if (!forced && decode::sparse_capable(p)) {  // decode::sparse_chosen(p)
    const bool split_s = decode::split_s_selected();  // once: the name and the launch agree
    note_kernel(decode::sparse_name(split_s));  // sparse_mla_kernel_name(p) of such a call
    return decode::sparse(p, split_s);
  }
  if (p.indices.shape[1] > INT32_MAX / 2) return StatusCode::kUnsupported;
  Problem pr;
  fill_common(pr, p.q, p.kv, p.attn_sink, p.sm_scale, p.out, p.lse);
  pr.indices = static_cast<const int32_t*>(p.indices.data);
  pr.idx_s0 = p.indices.stride[0];
  pr.idx_s1 = p.indices.stride[1];
  pr.K = static_cast<int32_t>(p.indices.shape[1]);
  if (p.topk_length.present()) {
    pr.topk_length = static_cast<const int32_t*>(p.topk_length.data);
    pr.tl_s0 = p.topk_length.stride[0];
  }
  attach_workspace(pr, plan, p.workspace);
  const cudaStream_t stream = as_stream(p.stream);
  if (sparse_uses_wgmma(p, forced)) {
    return kv_kind(p.kv) == mla::kFlatBf16 ? launch_sparse_wgmma<mla::kFlatBf16>(pr, plan, stream)
                                           : launch_sparse_wgmma<mla::kPagedBf16>(pr, plan, stream);
  }
  switch (kv_kind(p.kv)) {
    case mla::kFlatBf16: return launch_tiles<false, mla::kFlatBf16>(pr, plan, stream);
    case mla::kPagedBf16: return launch_tiles<false, mla::kPagedBf16>(pr, plan, stream);
    default: return launch_tiles<false, mla::kPagedFp8>(pr, plan, stream);
  }
}

const char* sparse_mla_kernel_name(const SparseMlaParams& p) {
  if (decode::sparse_chosen(p)) return decode::sparse_name(decode::split_s_selected());
  if (!sparse_uses_wgmma(p, forced_mma_sync())) return "sparse_mla.mma_sync";
  if (sparse_async_gather(p.q.shape[1]))
    return p.q.shape[1] <= 32 ? "sparse_mla.wgmma_bf16_few_heads_async" : "sparse_mla.wgmma_bf16_async";
  return p.q.shape[1] <= 32 ? "sparse_mla.wgmma_bf16_few_heads" : "sparse_mla.wgmma_bf16";
}

size_t dense_mla_workspace_size(const DenseMlaParams& p) {
  return std::max(dense_plan(p).workspace, decode::dense_workspace(p));
}

StatusCode dense_mla(const DenseMlaParams& p) {
  const SplitPlan plan = dense_plan(p);
  if (plan.tiles == 0) return StatusCode::kOk;
  if (decode::dense_chosen(p)) {
    // dense_mla_kernel_name(p) of a chosen call, without deciding the choice a second time.
    const bool split_s = decode::split_s_selected();  // once: the name and the launch agree
    note_kernel(decode::dense_name(p, split_s));
    return decode::dense(p, split_s);
  }
  if (dense_max_keys(p) > INT32_MAX / 2) return StatusCode::kUnsupported;
  Problem pr;
  fill_common(pr, p.q, p.kv, p.attn_sink, p.sm_scale, p.out, p.lse);
  pr.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  pr.cu_q_s = p.cu_seqlens_q.stride[0];
  pr.B = static_cast<int32_t>(p.cu_seqlens_q.shape[0] - 1);
  if (p.kv.flat.present()) {
    pr.cu_k = static_cast<const int32_t*>(p.cu_seqlens_k.data);
    pr.cu_k_s = p.cu_seqlens_k.stride[0];
  } else {
    pr.block_table = static_cast<const int32_t*>(p.block_table.data);
    pr.bt_s0 = p.block_table.stride[0];
    pr.bt_s1 = p.block_table.stride[1];
    pr.max_blocks = static_cast<int32_t>(p.block_table.shape[1]);
    pr.kv_lens = static_cast<const int32_t*>(p.kv_lens.data);
    pr.kv_lens_s = p.kv_lens.stride[0];
  }
  attach_workspace(pr, plan, p.workspace);
  const cudaStream_t stream = as_stream(p.stream);
  switch (kv_kind(p.kv)) {
    case mla::kFlatBf16: return launch_tiles<true, mla::kFlatBf16>(pr, plan, stream);
    case mla::kPagedBf16: return launch_tiles<true, mla::kPagedBf16>(pr, plan, stream);
    default: return launch_tiles<true, mla::kPagedFp8>(pr, plan, stream);
  }
}

}  // namespace gpu
}  // namespace dsa
