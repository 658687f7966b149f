// Backend entry points of the distributed ops (dsa/dist.h): tier 1, validated arguments,
// bare StatusCode. CPU in src/cpu/dist.cpp, CUDA in src/cuda/dist.cu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dist_math.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {
namespace distops {

// Local top-k indices -> candidate values (logits at the index, bf16 widened) and global
// positions; -1 entries give (-inf, -1). Rows [M, k] contiguous.
struct CandidatesArgs {
  TensorDesc logits;           // [M, W] f32 / bf16
  const int32_t* local_idx;    // [M, k]
  int64_t M, k;
  int ranks, rank;
  int64_t interleave;
  float* vals;                 // [M, k]
  int32_t* pos;                // [M, k]
  void* stream;
};
// Gathered candidates [R, M, k] (each rank's row ascending in position, -1 at the end) ->
// merged rows [M, R k] in ascending position, (-inf, -1) past len [M].
struct MergeArgs {
  const float* vals;
  const int32_t* pos;
  int64_t M, k;
  int ranks;
  float* mvals;
  int32_t* mpos;
  int32_t* mlen;
  void* stream;
};
// sel [M, k] indices into the merged rows -> indices (global positions) and values.
struct FinalArgs {
  const int32_t* sel;
  const float* mvals;
  const int32_t* mpos;
  int64_t M, k, width;  // width = R k
  TensorDesc indices, values;
  void* stream;
};
struct LocalIndicesArgs {
  TensorDesc indices, out;
  int ranks, rank;
  int64_t interleave;
  void* stream;
};
// Gathered partials: out [R, T, H, D] (dtype of part_dtype), lse [R, T, H] f32.
struct LseMergeArgs {
  const void* parts;
  DType part_dtype;
  const float* lses;
  int64_t T, H, D;
  int ranks;
  TensorDesc attn_sink, out, lse;
  void* stream;
};

namespace cpu {
StatusCode candidates(const CandidatesArgs& a);
StatusCode merge(const MergeArgs& a);
StatusCode final_select(const FinalArgs& a);
StatusCode local_indices(const LocalIndicesArgs& a);
StatusCode lse_merge(const LseMergeArgs& a);
}  // namespace cpu

#if defined(DSA_WITH_CUDA)
namespace gpu {
StatusCode candidates(const CandidatesArgs& a);
StatusCode merge(const MergeArgs& a);
StatusCode final_select(const FinalArgs& a);
StatusCode local_indices(const LocalIndicesArgs& a);
StatusCode lse_merge(const LseMergeArgs& a);
// Plain copies and fills on the stream; sync waits for the stream.
StatusCode copy(void* dst, const void* src, size_t bytes, void* stream);
StatusCode copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t rows, void* stream);
StatusCode fill(void* dst, int byte, size_t bytes, void* stream);
StatusCode sync(void* stream);
}  // namespace gpu
#endif

// Device-generic helpers (CPU: memcpy / memset; CUDA: the gpu:: calls above).
StatusCode copy(Device d, void* dst, const void* src, size_t bytes, void* stream);
StatusCode copy_2d(Device d, void* dst, size_t dpitch, const void* src, size_t spitch,
                   size_t width, size_t rows, void* stream);
StatusCode fill(Device d, void* dst, int byte, size_t bytes, void* stream);
StatusCode sync(Device d, void* stream);

}  // namespace distops
}  // namespace dsa
