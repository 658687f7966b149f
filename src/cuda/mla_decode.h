// Hopper decode attention (mla_decode.cu): which calls it takes, its workspace, its launch.
// Internal to the CUDA backend; mla_attention.cu routes dense_mla / sparse_mla here.
#pragma once
#include <cstddef>

#include "dsa/attention.h"
#include "dsa/status.h"

namespace dsa {
namespace gpu {
namespace decode {

// DSA_FORCE_KERNEL=mma_sync in the environment keeps every call on the mma.sync kernels.
bool forced_mma_sync();

// Whether the current device and the call's layout allow the Hopper kernel at all (what the
// workspace query counts, independent of the device-side lengths and of B).
bool dense_capable(const DenseMlaParams& p);
// Whether this call runs it (capable, not forced off, decode-shaped: few rows per sequence).
bool dense_chosen(const DenseMlaParams& p);
size_t dense_workspace(const DenseMlaParams& p);
// DSA_DECODE_KERNEL=split_s selects the variant of the main kernel in which both consumer
// warpgroups compute S over half the keys of each tile (read per call, by the caller, once).
bool split_s_selected();
StatusCode dense(const DenseMlaParams& p, bool split_s);
const char* dense_name(const DenseMlaParams& p, bool split_s);  // for note_kernel

bool sparse_capable(const SparseMlaParams& p);  // FP8 paged cache on sm_90a
bool sparse_chosen(const SparseMlaParams& p);
size_t sparse_workspace(const SparseMlaParams& p);
StatusCode sparse(const SparseMlaParams& p, bool split_s);
const char* sparse_name(bool split_s);

}  // namespace decode
}  // namespace gpu
}  // namespace dsa
