// Internal hooks of the CUDA top-k for the bench and the GPU tests (not part of the public API).
#pragma once
#include "dsa/status.h"
#include "dsa/topk.h"

namespace dsa {
namespace gpu {

// Which kernel topk(p) runs for these params, the name dsa::last_kernel_name reports after it:
// "topk.stream_rows" (one block per row), "topk.stream_split" (rows split over several blocks,
// then a per-row merge), "topk.cluster" / "topk.cluster_1024" (sm_90: a thread-block cluster
// per row, few rows of at most 262144 keys; _1024 where its CTAs hold 64 keys a thread, as
// 1024 threads of 32), "topk.fused_split" (the same split in one launch, the row's last block
// merging; chosen by DSA_CUDA_TOPK=fused_split) or "topk.radix12" (the previous three-pass
// kernel, f32 only, chosen by DSA_CUDA_TOPK=legacy).
const char* topk_kernel_name(const TopkParams& p);

// Blocks of the streaming kernels that took the exact fallback (candidate list overflowed or
// underfilled) since the process started, summed over launches. Synchronises the device.
StatusCode topk_fallback_count(unsigned long long* out);

// Rows of the cluster kernel whose last bin (at most 32 keys) was settled from the cluster's
// short list instead of one more counting pass, since the process started. Synchronises.
StatusCode topk_short_list_count(unsigned long long* out);

}  // namespace gpu
}  // namespace dsa
