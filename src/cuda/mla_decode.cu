// Launchers of the Hopper decode attention kernels (mla_decode_kernels.cuh): a scheduler
// kernel that reads the device lengths and writes per-CTA ranges into the workspace, the
// persistent attention kernel (one CTA per SM), and a combine kernel for cut row blocks.
// Three stream operations, nothing allocated, nothing synchronised: graph-capturable, and a
// replay sees lengths changed on the device between replays.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/hopper/hopper.cuh"
#include "cuda/mla_decode.h"
#include "cuda/mla_decode_kernels.cuh"

namespace dsa {
namespace gpu {
namespace decode {
namespace {

using mla_decode::DecodeProblem;
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kAlign = 256;
constexpr int64_t kMaxRowsPerSeq = 8;  // dense: average rows per sequence that count as decode
// At most this many query tokens: the planner sizes attention workspace by querying row
// counts up to 2048 (src/core/planner.cpp), and the metadata part of this kernel's need grows
// with T; larger calls have enough row blocks for the mma.sync kernels' grid anyway.
constexpr int64_t kMaxTokens = 2048;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// Workspace: [meta 2][sched_pos G+1][rb_prefix max_rb+1][rb_unit max_rb][rb_local max_rb] i32,
// then part_ml [2G][64] float2, then part_o [2G][64][512] f32.
struct Layout {
  int32_t G = 0;
  int64_t max_rb = 0;
  size_t ml_off = 0, o_off = 0, bytes = 0;
};
Layout layout(int64_t max_rb) {
  Layout l;
  l.G = current_sm_count();
  l.max_rb = max_rb;
  const size_t ints = 2 + (l.G + 1) + (max_rb + 1) + 2 * max_rb;
  l.ml_off = align_up(ints * 4);
  l.o_off = align_up(l.ml_off + size_t(2) * l.G * mla_decode::kRows * sizeof(float2));
  l.bytes = l.o_off + size_t(2) * l.G * mla_decode::kRows * mla_decode::kVDim * sizeof(float);
  return l;
}
void attach(DecodeProblem& pr, const Layout& l, void* ws) {
  int32_t* w = static_cast<int32_t*>(ws);
  pr.G = l.G;
  pr.max_rb = static_cast<int32_t>(l.max_rb);
  pr.meta = w;
  pr.sched_pos = w + 2;
  pr.rb_prefix = pr.sched_pos + (l.G + 1);
  pr.rb_unit = pr.rb_prefix + (l.max_rb + 1);
  pr.rb_local = pr.rb_unit + l.max_rb;
  pr.part_ml = reinterpret_cast<float2*>(static_cast<uint8_t*>(ws) + l.ml_off);
  pr.part_o = reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + l.o_off);
}

// Dense row blocks: sum over sequences of ceil(q_len * H / 64) <= T * H / 64 + (sequences
// with a row) <= ceil(T * H / 64) + T, whatever B is.
int64_t dense_max_rb(const DenseMlaParams& p) {
  const int64_t T = p.q.shape[0], H = p.q.shape[1];
  return ceil_div(T * H, mla_decode::kRows) + T;
}
int64_t sparse_max_rb(const SparseMlaParams& p) {
  return p.q.shape[0] * ceil_div(p.q.shape[1], mla_decode::kRows);
}

void fill_common(DecodeProblem& pr, const TensorDesc& q, const MlaCacheDesc& c, const TensorDesc& sink, float sm_scale,
                 const TensorDesc& out, const TensorDesc& lse) {
  pr.q = static_cast<const uint16_t*>(q.data);
  pr.q_s0 = q.stride[0];
  pr.q_s1 = q.stride[1];
  pr.q_aligned16 = aligned(q.data, 16) && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0;
  pr.T = static_cast<int32_t>(q.shape[0]);
  pr.H = static_cast<int32_t>(q.shape[1]);
  pr.cache = static_cast<const uint8_t*>(c.data);
  pr.block_bytes = c.block_bytes();
  pr.num_blocks = c.num_blocks;
  pr.num_slots = c.num_slots();
  pr.page = static_cast<int32_t>(c.page_size);
  if (sink.present()) {
    pr.sink = static_cast<const float*>(sink.data);
    pr.sink_s = sink.stride[0];
  }
  pr.scale_log2 = sm_scale * kLog2e;
  pr.out = out.data;
  pr.out_bf16 = out.dtype == DType::kBF16;
  pr.out_pairs = aligned(out.data, pr.out_bf16 ? 4 : 8) && out.stride[0] % 2 == 0 && out.stride[1] % 2 == 0;
  pr.out_s0 = out.stride[0];
  pr.out_s1 = out.stride[1];
  pr.lse = static_cast<float*>(lse.data);
  pr.lse_s0 = lse.stride[0];
  pr.lse_s1 = lse.stride[1];
}

using MainKernel = void (*)(CUtensorMap, DecodeProblem);

template <int kKind, bool kSplitS>
bool smem_opt_in() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return true;
  if (cudaFuncSetAttribute(mla_decode::decode_attn_kernel<kKind, kSplitS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           mla_decode::kSmemBytes) != cudaSuccess)
    return false;
  done.fetch_or(bit, std::memory_order_acq_rel);
  return true;
}

template <int kKind, bool kSplitS>
StatusCode launch_as(const DecodeProblem& pr, const CUtensorMap& map, cudaStream_t stream) {
  constexpr bool kSparse = kKind == mla_decode::kSparseFp8;
  if (!smem_opt_in<kKind, kSplitS>()) {
    cudaGetLastError();
    return StatusCode::kDeviceError;
  }
  mla_decode::decode_schedule_kernel<kSparse><<<1, mla_decode::kSchedThreads, 0, stream>>>(pr);
  mla_decode::decode_attn_kernel<kKind, kSplitS>
      <<<pr.G, mla_decode::kThreads, mla_decode::kSmemBytes, stream>>>(map, pr);
  mla_decode::decode_combine_kernel<kSparse>
      <<<dim3(pr.G, mla_decode::kRows / mla_decode::kCombineRows), mla_decode::kCombineThreads, 0, stream>>>(pr);
  return last_launch_status();
}

template <int kKind>
StatusCode launch(const DecodeProblem& pr, const CUtensorMap& map, cudaStream_t stream, bool split_s) {
  return split_s ? launch_as<kKind, true>(pr, map, stream) : launch_as<kKind, false>(pr, map, stream);
}

bool page_ok_for_tma(int64_t page) { return page == 8 || page == 16 || page == 32 || (page > 0 && page % 64 == 0); }

}  // namespace

bool forced_mma_sync() {
  const char* v = std::getenv("DSA_FORCE_KERNEL");
  return v != nullptr && std::strcmp(v, "mma_sync") == 0;
}

bool split_s_selected() {
  const char* v = std::getenv("DSA_DECODE_KERNEL");
  return v != nullptr && std::strcmp(v, "split_s") == 0;
}

bool dense_capable(const DenseMlaParams& p) {
  if (p.kv.flat.present() || !hopper::current_device_is_sm90a()) return false;
  const MlaCacheDesc& c = p.kv.paged;
  if (c.dtype == MlaCacheDtype::kBF16 && !page_ok_for_tma(c.page_size)) return false;
  if (p.q.shape[0] < 1 || p.q.shape[0] > kMaxTokens || p.q.shape[1] < 1) return false;
  const int64_t max_tiles = ceil_div(p.block_table.shape[1] * c.page_size, mla_decode::kTileKeys) + 1;
  return dense_max_rb(p) * max_tiles < (int64_t{1} << 30);
}

bool dense_chosen(const DenseMlaParams& p) {
  if (forced_mma_sync() || !dense_capable(p)) return false;
  const int64_t B = p.cu_seqlens_q.shape[0] - 1;
  return p.q.shape[0] <= kMaxRowsPerSeq * B;
}

size_t dense_workspace(const DenseMlaParams& p) { return dense_capable(p) ? layout(dense_max_rb(p)).bytes : 0; }

StatusCode dense(const DenseMlaParams& p, bool split_s) {
  const MlaCacheDesc& c = p.kv.paged;
  DecodeProblem pr;
  fill_common(pr, p.q, c, p.attn_sink, p.sm_scale, p.out, p.lse);
  pr.cu_q = static_cast<const int32_t*>(p.cu_seqlens_q.data);
  pr.cu_q_s = p.cu_seqlens_q.stride[0];
  pr.block_table = static_cast<const int32_t*>(p.block_table.data);
  pr.bt_s0 = p.block_table.stride[0];
  pr.bt_s1 = p.block_table.stride[1];
  pr.max_blocks = static_cast<int32_t>(p.block_table.shape[1]);
  pr.kv_lens = static_cast<const int32_t*>(p.kv_lens.data);
  pr.kv_lens_s = p.kv_lens.stride[0];
  pr.units = static_cast<int32_t>(p.cu_seqlens_q.shape[0] - 1);
  const Layout l = layout(dense_max_rb(p));
  attach(pr, l, p.workspace);
  const cudaStream_t stream = as_stream(p.stream);
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (c.dtype == MlaCacheDtype::kFP8) return launch<mla_decode::kDenseFp8>(pr, map, stream, split_s);
  // (576, page, num_blocks) bf16 with the block stride; a box is 64 dims x min(page, 64) tokens.
  const uint64_t dims[3] = {uint64_t(mla_decode::kDim), uint64_t(c.page_size), uint64_t(c.num_blocks)};
  const uint64_t strides[2] = {uint64_t(kMlaBf16TokenBytes), uint64_t(c.block_bytes())};
  const uint32_t box[3] = {64u, uint32_t(std::min<int64_t>(c.page_size, mla_decode::kTileKeys)), 1u};
  const StatusCode st = hopper::make_tensor_map(&map, c.data, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, dims, strides, box,
                                                CU_TENSOR_MAP_SWIZZLE_128B);
  if (st != StatusCode::kOk) return st;
  return launch<mla_decode::kDenseBf16>(pr, map, stream, split_s);
}

bool sparse_capable(const SparseMlaParams& p) {
  if (p.kv.flat.present() || p.kv.paged.dtype != MlaCacheDtype::kFP8) return false;
  if (!hopper::current_device_is_sm90a()) return false;
  if (p.q.shape[0] < 1 || p.q.shape[0] > kMaxTokens || p.q.shape[1] < 1) return false;
  const int64_t max_tiles = ceil_div(p.indices.shape[1], mla_decode::kTileKeys) + 1;
  return sparse_max_rb(p) * max_tiles < (int64_t{1} << 30);
}

bool sparse_chosen(const SparseMlaParams& p) { return !forced_mma_sync() && sparse_capable(p); }

size_t sparse_workspace(const SparseMlaParams& p) { return sparse_capable(p) ? layout(sparse_max_rb(p)).bytes : 0; }

StatusCode sparse(const SparseMlaParams& p, bool split_s) {
  DecodeProblem pr;
  fill_common(pr, p.q, p.kv.paged, p.attn_sink, p.sm_scale, p.out, p.lse);
  pr.indices = static_cast<const int32_t*>(p.indices.data);
  pr.idx_s0 = p.indices.stride[0];
  pr.idx_s1 = p.indices.stride[1];
  pr.K = static_cast<int32_t>(p.indices.shape[1]);
  if (p.topk_length.present()) {
    pr.topk_length = static_cast<const int32_t*>(p.topk_length.data);
    pr.tl_s0 = p.topk_length.stride[0];
  }
  pr.units = pr.T;
  pr.head_blocks = static_cast<int32_t>(ceil_div(p.q.shape[1], mla_decode::kRows));
  attach(pr, layout(sparse_max_rb(p)), p.workspace);
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  return launch<mla_decode::kSparseFp8>(pr, map, as_stream(p.stream), split_s);
}

}  // namespace decode

const char* dense_mla_kernel_name(const DenseMlaParams& p) {
  if (!decode::dense_chosen(p)) return "dense_mla.mma_sync";
  return decode::dense_name(p, decode::split_s_selected());
}

namespace decode {
const char* dense_name(const DenseMlaParams& p, bool split_s) {
  if (p.kv.paged.dtype == MlaCacheDtype::kFP8)
    return split_s ? "dense_mla.wgmma_splitkv_fp8_split_s" : "dense_mla.wgmma_splitkv_fp8";
  return split_s ? "dense_mla.wgmma_splitkv_split_s" : "dense_mla.wgmma_splitkv";
}
const char* sparse_name(bool split_s) {
  return split_s ? "sparse_mla.wgmma_fp8_splitkv_split_s" : "sparse_mla.wgmma_fp8_splitkv";
}
}  // namespace decode

}  // namespace gpu
}  // namespace dsa
