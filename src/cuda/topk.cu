// Launchers of top-k selection and index mapping.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/hopper/hopper.cuh"
#include "cuda/topk_cluster_kernels.cuh"
#include "cuda/topk_internal.h"
#include "cuda/topk_kernels.cuh"
#include "cuda/topk_radix_kernels.cuh"

namespace dsa {
namespace gpu {

namespace {

// DSA_CUDA_TOPK (for A/B runs and diagnosis): legacy selects the three-pass kernel for f32
// logits; fused_split runs split rows in one launch (segments, then the row's last block
// merges) instead of the segments and merge launches; cluster takes the cluster kernel for
// every row width it serves (<= 262144) whatever the row count, no_cluster never;
// no_floor runs the cluster kernel without its sample round; no_prefetch streams rows and
// segments without the bulk L2 prefetch. DSA_CUDA_TOPK_LIST=off makes the cluster kernel count
// every bin down to one key value (round 6's form) instead of settling a bin of <= 32 keys from
// the short list.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
bool topk_env_is(const char* value) { return env_is("DSA_CUDA_TOPK", value); }
bool legacy_forced() { return topk_env_is("legacy"); }
bool fused_split_forced() { return topk_env_is("fused_split"); }

// Resident blocks the split aims at: two per SM of the current device.
int64_t block_slots() { return 2 * static_cast<int64_t>(current_sm_count()); }

// Rows longer than kMaxRun must split; rows may split into runs of >= max(4k, 16384) keys
// (shorter runs gain nothing) while the merge list (segs * k slots) stays one run.
int64_t forced_segs(int64_t W) { return W > 0 ? ceil_div(W, topk_radix::kMaxRun) : 1; }
int64_t most_segs(int64_t W, int64_t k) {
  const int64_t by_len = W / std::max<int64_t>(4 * k, 16384), by_merge = topk_radix::kMaxRun / k;
  return std::max<int64_t>(1, std::min(by_len, by_merge));
}

enum class Path { kLegacy, kRows, kSplit, kFusedSplit, kCluster };
struct Split {
  Path path;
  int64_t segs, seg;
};

// The dynamic shared memory of the streaming kernels exceeds 48 KiB: opt in once per kernel and
// device (not a stream operation, so graph capture is unaffected).
template <int kId>
bool smem_opt_in(const void* kernel, int bytes = topk_radix::smem_bytes(16384)) {
  static std::atomic<uint64_t> done_devices{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit && (done_devices.load(std::memory_order_acquire) & bit)) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    return false;
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
  return true;
}

// The cluster kernel (sm_90): a cluster of C <= 8 CTAs of m keys a thread per row, for rows
// up to 262144 keys (few rows: decode, small chunks). A CTA's time is mostly fixed latency
// (loads, cluster barriers, remote histogram reads), so the shape is the largest C whose M
// clusters all fit at once (one wave), else the fewest waves; the clusters that fit come from
// the occupancy calculator (clusters are placed within a GPC, so "CTAs per SM x SMs / C"
// overstates them: 62 clusters of 4 CTAs fit on the H200, not 66). Chosen while that is at
// most two waves; more rows stream one block per row. DSA_CUDA_TOPK_CTAS=C forces C (A/B runs).
struct ClusterShape {
  int64_t ctas = 0, keys = 0;  // C, m; ctas 0: the cluster kernel does not serve the shape
};

// Keys a thread for rows of W keys over C CTAs: a power of two, at least 8.
int64_t cluster_keys(int64_t W, int64_t C) {
  int64_t m = 8;
  while (m * topk_cluster::kThreads * C < W) m *= 2;
  return m;
}

// Chunks of m = 64 keys a thread run as 1024 threads of 32 (measured faster than 512 threads
// of 64 on the H200, docs/perf.md round 6); DSA_CUDA_TOPK_WIDE=512 forces the 512-thread form
// for A/B runs. The variable is read only for those chunks.
bool wide1024_for(int64_t m) { return m == topk_cluster::kMaxKeys && !env_is("DSA_CUDA_TOPK_WIDE", "512"); }

template <class T>
const void* cluster_kernel(int64_t m, bool wide1024) {
  namespace c = topk_cluster;
  if (m != c::kMaxKeys) return reinterpret_cast<const void*>(&c::topk_cluster_kernel<T, c::kThreads, 32>);
  return wide1024 ? reinterpret_cast<const void*>(&c::topk_cluster_kernel<T, c::kWideThreads, 32>)
                  : reinterpret_cast<const void*>(&c::topk_cluster_kernel<T, c::kThreads, 64>);
}

// Every form of the cluster kernel takes up to keys_bytes(kMaxKeys) of dynamic shared memory
// (ids kId, kId + 10 and kId + 20: the smem_opt_in ids of the dtype's cluster kernels).
template <class T, int kId>
bool cluster_opt_in() {
  const int bytes = topk_cluster::keys_bytes(topk_cluster::kMaxKeys);
  return smem_opt_in<kId>(cluster_kernel<T>(topk_cluster::kMaxKeys, false), bytes) &&
         smem_opt_in<kId + 10>(cluster_kernel<T>(topk_cluster::kMaxKeys / 2, false), bytes) &&
         smem_opt_in<kId + 20>(cluster_kernel<T>(topk_cluster::kMaxKeys, true), bytes);
}

// The launch configuration of M rows in clusters of C CTAs with m keys a thread (the attribute
// lives with the configuration that points at it).
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  ClusterLaunch(int64_t M, int64_t C, int64_t m, bool wide1024, cudaStream_t s) {
    cfg.gridDim = dim3(static_cast<unsigned>(M * C));
    cfg.blockDim = dim3(static_cast<unsigned>(topk_cluster::block_threads(static_cast<int>(m), wide1024)));
    cfg.dynamicSmemBytes = static_cast<size_t>(topk_cluster::keys_bytes(static_cast<int>(m)));
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(C);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg.attrs points into this object
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Clusters of C CTAs with m keys a thread that fit on the current device at once; 0 when the
// runtime refuses the configuration. Cached per (device, dtype, C, m, form): a host query per
// shape.
template <class T, int kId>
int64_t clusters_at_once(int64_t C, int64_t m) {
  static std::mutex mu;
  static std::map<std::tuple<int, int64_t, int64_t, bool>, int64_t> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const bool wide1024 = wide1024_for(m);
  const auto key = std::make_tuple(device, C, m, wide1024);
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  if (!cluster_opt_in<T, kId>()) return 0;
  const ClusterLaunch launch(64, C, m, wide1024, nullptr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, cluster_kernel<T>(m, wide1024), &launch.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = n;
  return n;
}

template <class T, int kId>
ClusterShape cluster_shape_for(int64_t M, int64_t W, int64_t c_min, bool forced) {
  if (const char* v = std::getenv("DSA_CUDA_TOPK_CTAS")) {
    const int64_t C = std::atoll(v);
    if (C >= c_min && C <= topk_cluster::kMaxCtas) return {C, cluster_keys(W, C)};
  }
  ClusterShape best;
  int64_t best_waves = 0;
  for (int64_t m = topk_cluster::kMaxKeys; m >= 8; m /= 2) {
    const int64_t C = ceil_div(W, topk_cluster::kThreads * m);
    if (C > topk_cluster::kMaxCtas || (m < 16 && C > 1)) break;  // no CTAs of fewer than 16 keys a thread
    const int64_t at_once = clusters_at_once<T, kId>(C, m);
    if (at_once <= 0) continue;
    const int64_t waves = ceil_div(M, at_once);
    // Fewer waves; in one wave the most CTAs; the same CTAs with less padding.
    if (best.ctas == 0 || waves < best_waves || (waves == best_waves && (waves == 1 || C == best.ctas))) {
      best = {C, m};
      best_waves = waves;
    }
  }
  if (!forced && best_waves > 2) return {};
  return best;
}

ClusterShape cluster_shape(int64_t M, int64_t W, int64_t k, DType dtype) {
  if (W <= k || W > topk_cluster::kMaxWidth || topk_env_is("no_cluster")) return {};
  if (!hopper::current_device_is_sm90a()) return {};
  const bool forced = topk_env_is("cluster");
  const int64_t c_min = ceil_div(W, topk_cluster::kThreads * topk_cluster::kMaxKeys);
  if (!forced && M * c_min > 2 * block_slots()) return {};  // spares the occupancy queries for many rows
  // smem_opt_in ids: kId + 4 of radix_topk's dtype ranges (f32 0-4, bf16 5-9), and + 10 of it.
  return dtype == DType::kBF16 ? cluster_shape_for<uint16_t, 9>(M, W, c_min, forced)
                               : cluster_shape_for<float, 4>(M, W, c_min, forced);
}

Split choose(const TopkParams& p) {
  const int64_t M = p.logits.shape[0], W = p.logits.shape[1], k = p.k;
  if (legacy_forced() && p.logits.dtype == DType::kF32) return {Path::kLegacy, 1, W};
  if (!fused_split_forced()) {
    const ClusterShape cs = cluster_shape(M, W, k, p.logits.dtype);
    if (cs.ctas > 0) return {Path::kCluster, cs.ctas, cs.keys * topk_cluster::kThreads};
  }
  const int64_t fill = std::max<int64_t>(1, block_slots() / std::max<int64_t>(M, 1));
  int64_t segs = std::max(forced_segs(W), std::min(fill, most_segs(W, k)));
  if (W <= k || segs <= 1) return {Path::kRows, 1, W};
  const int64_t seg = ceil_div(ceil_div(W, segs), 64) * 64;  // keeps 16-byte alignment
  segs = ceil_div(W, seg);
  if (segs <= 1) return {Path::kRows, 1, W};
  return {fused_split_forced() ? Path::kFusedSplit : Path::kSplit, segs, seg};
}

// The slot lists (blocks * k values and positions), then one done-counter per row (the fused
// split's; counted for both split paths so the size does not depend on the environment), and
// the 256-byte alignment slack.
size_t split_bytes(int64_t blocks, int64_t k, int64_t rows) {
  return static_cast<size_t>(blocks * k) * 8 + static_cast<size_t>(rows) * 4 + 256;
}

StatusCode legacy_topk(const TopkParams& p) {
  const int64_t M = p.logits.shape[0];
  topk_detail::TopkArgs a{};
  a.logits = static_cast<const float*>(p.logits.data);
  a.l0 = p.logits.stride[0];
  a.lengths = i32_vec(p.lengths);
  a.width = p.logits.shape[1];
  a.k = p.k;
  a.indices = static_cast<int32_t*>(p.indices.data);
  a.i0 = p.indices.stride[0];
  if (p.values.present()) {
    a.values = static_cast<float*>(p.values.data);
    a.v0 = p.values.stride[0];
  }
  note_kernel("topk.radix12");
  topk_detail::topk_row_kernel<<<static_cast<unsigned>(M), topk_detail::kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

// kId..kId + 4 and kId + 14: the smem_opt_in ids of this dtype's rows, segments, merge, fused and cluster
// kernels.
template <class T, int kId>
StatusCode radix_topk(const TopkParams& p, const Split& sp) {
  namespace r = topk_radix;
  const int64_t M = p.logits.shape[0];
  r::Args a{};
  a.logits = p.logits.data;
  a.l0 = p.logits.stride[0];
  a.lengths = i32_vec(p.lengths);
  a.width = p.logits.shape[1];
  a.k = p.k;
  a.indices = static_cast<int32_t*>(p.indices.data);
  a.i0 = p.indices.stride[0];
  if (p.values.present()) {
    a.values = static_cast<float*>(p.values.data);
    a.v0 = p.values.stride[0];
  }
  a.segs = sp.segs;
  a.seg = sp.seg;
  a.prefetch = hopper::current_device_is_sm90a() && !topk_env_is("no_prefetch");
  a.sample_floor = !topk_env_is("no_floor");
  a.short_list = !env_is("DSA_CUDA_TOPK_LIST", "off");
  const int smem = r::smem_bytes(p.k);
  const cudaStream_t s = as_stream(p.stream);
  if (sp.path == Path::kCluster) {
    if (M * sp.segs > 0x7fffffffLL) return StatusCode::kUnsupported;
    const int64_t m = sp.seg / topk_cluster::kThreads;
    const bool wide1024 = wide1024_for(m);
    const ClusterLaunch launch(M, sp.segs, m, wide1024, s);
    if (!cluster_opt_in<T, kId + 4>()) return StatusCode::kDeviceError;
    note_kernel(wide1024 ? "topk.cluster_1024" : "topk.cluster");
    void* args[] = {&a};
    if (cudaLaunchKernelExC(&launch.cfg, cluster_kernel<T>(m, wide1024), args) != cudaSuccess) {
      (void)cudaGetLastError();  // a refused configuration is this call's error, not a sticky one
      return StatusCode::kDeviceError;
    }
    return last_launch_status();
  }
  if (sp.path == Path::kRows) {
    if (!smem_opt_in<kId>(reinterpret_cast<const void*>(&r::topk_rows_kernel<T>))) return StatusCode::kDeviceError;
    note_kernel("topk.stream_rows");
    r::topk_rows_kernel<T><<<static_cast<unsigned>(M), r::kThreads, smem, s>>>(a);
    return last_launch_status();
  }
  const int64_t blocks = M * sp.segs;
  if (blocks > 0x7fffffffLL) return StatusCode::kUnsupported;
  // The merge is one block's run (its position bitmap holds kMaxRun slots): rows wider than
  // kMaxRun * kMaxRun / k (over 1M keys at k = 16384) are not supported.
  if (sp.segs * p.k > r::kMaxRun) return StatusCode::kUnsupported;
  if (p.workspace_bytes < split_bytes(blocks, p.k, M) || p.workspace == nullptr) return StatusCode::kWorkspaceTooSmall;
  const uintptr_t base = (reinterpret_cast<uintptr_t>(p.workspace) + 255u) & ~static_cast<uintptr_t>(255u);
  a.ws_val = reinterpret_cast<float*>(base);
  a.ws_idx = reinterpret_cast<int32_t*>(a.ws_val + blocks * p.k);
  if (sp.path == Path::kFusedSplit) {
    if (!smem_opt_in<kId + 3>(reinterpret_cast<const void*>(&r::topk_fused_split_kernel<T>)))
      return StatusCode::kDeviceError;
    // The caller's workspace holds anything: the row counters are zeroed here (a memset node
    // under graph capture) rather than trusted to be left zero by the previous run.
    unsigned* row_done = reinterpret_cast<unsigned*>(a.ws_idx + blocks * p.k);
    if (cudaMemsetAsync(row_done, 0, static_cast<size_t>(M) * sizeof(unsigned), s) != cudaSuccess)
      return StatusCode::kDeviceError;
    note_kernel("topk.fused_split");
    r::topk_fused_split_kernel<T><<<static_cast<unsigned>(blocks), r::kThreads, smem, s>>>(a, row_done);
    return last_launch_status();
  }
  if (!smem_opt_in<kId + 1>(reinterpret_cast<const void*>(&r::topk_segments_kernel<T>)) ||
      !smem_opt_in<kId + 2>(reinterpret_cast<const void*>(&r::topk_merge_kernel<T>)))
    return StatusCode::kDeviceError;
  note_kernel("topk.stream_split");  // segments, then the merge
  r::topk_segments_kernel<T><<<static_cast<unsigned>(blocks), r::kThreads, smem, s>>>(a);
  r::topk_merge_kernel<T><<<static_cast<unsigned>(M), r::kThreads, smem, s>>>(a);
  return last_launch_status();
}

}  // namespace

// Split rows keep per-segment winners, (f32 value, i32 position) per slot: M * segs blocks
// of k slots, at most max(M * forced_segs, min(block_slots, M * most_segs)) (a split beyond
// the forced one only fills idle slots), a bound non-decreasing in M and W.
size_t topk_workspace_size(const TopkParams& p) {
  const int64_t M = p.logits.shape[0], W = p.logits.shape[1], k = p.k;
  if (M <= 0 || W <= k) return 0;
  if (std::max(forced_segs(W), most_segs(W, k)) <= 1) return 0;
  return split_bytes(std::max(M * forced_segs(W), std::min(block_slots(), M * most_segs(W, k))), k, M);
}

const char* topk_kernel_name(const TopkParams& p) {
  const Split sp = choose(p);
  switch (sp.path) {
    case Path::kLegacy: return "topk.radix12";
    case Path::kRows: return "topk.stream_rows";
    case Path::kFusedSplit: return "topk.fused_split";
    case Path::kCluster:
      return wide1024_for(sp.seg / topk_cluster::kThreads) ? "topk.cluster_1024" : "topk.cluster";
    default: return "topk.stream_split";
  }
}

// One of the kernels' debug counters, after the work in flight.
static StatusCode read_counter(const unsigned long long& symbol, unsigned long long* out) {
  if (cudaDeviceSynchronize() != cudaSuccess) return StatusCode::kDeviceError;
  return cudaMemcpyFromSymbol(out, symbol, sizeof(*out)) == cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

StatusCode topk_fallback_count(unsigned long long* out) { return read_counter(topk_radix::g_topk_fallbacks, out); }

StatusCode topk_short_list_count(unsigned long long* out) { return read_counter(topk_radix::g_topk_short_lists, out); }

StatusCode topk(const TopkParams& p) {
  const int64_t M = p.logits.shape[0];
  if (M == 0) return StatusCode::kOk;
  if (M > 0x7fffffffLL) return StatusCode::kUnsupported;
  const Split sp = choose(p);
  if (sp.path == Path::kLegacy) return legacy_topk(p);
  if (p.logits.dtype == DType::kBF16) return radix_topk<uint16_t, 5>(p, sp);  // ids 5-9: f32 takes 0-4
  return radix_topk<float, 0>(p, sp);
}

StatusCode map_indices(const MapIndicesParams& p) {
  const int64_t M = p.indices.shape[0], K = p.indices.shape[1];
  if (M == 0 || K == 0) return StatusCode::kOk;
  topk_detail::MapArgs a{};
  a.in = static_cast<const int32_t*>(p.indices.data);
  a.in0 = p.indices.stride[0];
  a.out = static_cast<int32_t*>(p.out.data);
  a.out0 = p.out.stride[0];
  a.rows = M;
  a.k = K;
  a.has_row_seq = p.row_seq.present();
  if (a.has_row_seq) a.row_seq = i32_vec(p.row_seq);
  a.rows_per_seq = p.rows_per_seq > 0 ? p.rows_per_seq : 1;
  a.paged = p.kind == IndexMapKind::kPaged;
  if (a.paged) {
    a.block_table = i32_mat(p.block_table);
    a.num_seqs = p.block_table.shape[0];
    a.page_size = p.page_size;
  } else {
    a.kv_start = i32_vec(p.kv_start);
    a.num_seqs = p.kv_start.shape[0];
  }
  constexpr int kThreads = 256;
  note_kernel("map_indices.simt");
  topk_detail::map_indices_kernel<<<grid_for(M * K, kThreads), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

}  // namespace gpu
}  // namespace dsa
