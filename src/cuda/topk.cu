// Launchers of top-k selection and index mapping.
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/topk_kernels.cuh"

namespace dsa {
namespace gpu {

size_t topk_workspace_size(const TopkParams&) { return 0; }  // one block per row, no scratch

StatusCode topk(const TopkParams& p) {
  const int64_t M = p.logits.shape[0];
  if (M == 0) return StatusCode::kOk;
  if (M > 0x7fffffffLL) return StatusCode::kUnsupported;
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
