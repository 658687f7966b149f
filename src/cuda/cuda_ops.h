// The CUDA backend's entry points (tier 1: arguments are already validated by src/core; each
// launches on p.stream, never synchronises the host, never allocates, and returns a code).
// Compiled only with -DDSA_CUDA=ON (DSA_WITH_CUDA defined). One launcher file per op family
// in src/cuda/, kernel bodies in *_kernels.cuh beside it.
#pragma once
#include <cstddef>
#include <vector>

#include "core/mha_layout.h"
#include "dsa/attention.h"
#include "dsa/cache.h"
#include "dsa/indexer.h"
#include "dsa/runtime.h"
#include "dsa/topk.h"

namespace dsa {
namespace gpu {

std::vector<DeviceInfo> list_devices();  // empty without a driver or device; never throws

StatusCode quantize_fp8(const QuantizeFp8Params& p);
StatusCode prepare_indexer_q(const PrepareIndexerQParams& p);
StatusCode prepare_indexer_k(const PrepareIndexerKParams& p);
StatusCode write_indexer_cache(const WriteIndexerCacheParams& p);
StatusCode write_mla_cache(const WriteMlaCacheParams& p);
StatusCode read_mla_cache(const ReadMlaCacheParams& p);
StatusCode read_indexer_cache(const ReadIndexerCacheParams& p);
StatusCode indexer_logits(const IndexerLogitsParams& p);
StatusCode indexer_logits_paged(const IndexerLogitsPagedParams& p);
size_t topk_workspace_size(const TopkParams& p);
StatusCode topk(const TopkParams& p);
StatusCode map_indices(const MapIndicesParams& p);
size_t sparse_mla_workspace_size(const SparseMlaParams& p);
StatusCode sparse_mla(const SparseMlaParams& p);
// The kernel sparse_mla(p) runs on the current device: "sparse_mla.wgmma_bf16" (sm_90a, BF16
// cache, H > 32), "sparse_mla.wgmma_bf16_few_heads" (the same, H <= 32) or
// "sparse_mla.mma_sync"; DSA_FORCE_KERNEL=mma_sync forces the last.
const char* sparse_mla_kernel_name(const SparseMlaParams& p);
size_t dense_mla_workspace_size(const DenseMlaParams& p);
StatusCode dense_mla(const DenseMlaParams& p);
// mha_prefill.cu
StatusCode dense_mha_prefill_group(const DenseMhaPrefillParams& p, const core::MhaGroup& g);
// mla_project.cu: the absorbed form's projections, one batched cuBLAS GEMM over the heads
// each (bf16 in; bf16 or f32 out); absorb also copies q_pe into q_out[..., 512:576].
StatusCode mla_absorb_q(const MlaAbsorbQParams& p);
StatusCode mla_up_project(const MlaUpProjectParams& p);
// Internal (tests, bench): run the portable attention kernel even on sm_90a. Also set by
// the environment variable DSA_MHA_KERNEL=portable (read once).
void set_mha_force_portable(bool on);
// Internal (tests, bench): the attention kernel, 0 the default (the serial Hopper kernel on
// sm_90a), 1 portable, 2 serial Hopper, 3 pipelined Hopper (S of tile t+1 issued before the
// softmax of tile t; opt-in), 4 pipelined with the warpgroups' GEMMs in turns (ping-pong,
// opt-in); DSA_MHA_KERNEL=portable|wgmma_serial|wgmma_pipe|wgmma_pingpong (read once).
void set_mha_kernel(int mode);
// Internal (bench): which stages a dense_mha_prefill call runs, bit 0 the gather and the
// decompression GEMM, bit 1 the attention (default 3). 2 re-times the attention over the
// K/V an earlier full call left in the same workspace.
void set_mha_stages(int mask);
// The kernel a call takes (for benchmarks): "dense_mla.wgmma_splitkv", "dense_mla.wgmma_splitkv_fp8",
// "sparse_mla.wgmma_fp8_splitkv" on sm_90a, else "*.mma_sync" (also with DSA_FORCE_KERNEL=mma_sync).
const char* dense_mla_kernel_name(const DenseMlaParams& p);
const char* sparse_mla_kernel_name(const SparseMlaParams& p);

}  // namespace gpu
}  // namespace dsa
