// The CPU backend's entry points (tier 1: arguments are already validated by src/core; each
// returns only a code). One implementation file per op family in src/cpu/.
#pragma once
#include "core/mha_layout.h"
#include "dsa/attention.h"
#include "dsa/cache.h"
#include "dsa/indexer.h"
#include "dsa/mha.h"
#include "dsa/topk.h"

namespace dsa {
namespace cpu {

// indexer_prep.cpp
StatusCode quantize_fp8(const QuantizeFp8Params& p);
StatusCode prepare_indexer_q(const PrepareIndexerQParams& p);
StatusCode prepare_indexer_k(const PrepareIndexerKParams& p);
// cache_write.cpp
StatusCode write_indexer_cache(const WriteIndexerCacheParams& p);
StatusCode write_mla_cache(const WriteMlaCacheParams& p);
StatusCode read_mla_cache(const ReadMlaCacheParams& p);
StatusCode read_indexer_cache(const ReadIndexerCacheParams& p);
// indexer_logits.cpp
StatusCode indexer_logits(const IndexerLogitsParams& p);
StatusCode indexer_logits_paged(const IndexerLogitsPagedParams& p);
// topk.cpp: scratch of 8 bytes per column for each of up to hardware-thread-count row slots
size_t topk_workspace_size(const TopkParams& p);      // all slots
size_t topk_min_workspace_size(const TopkParams& p);  // one slot: the least that works
StatusCode topk(const TopkParams& p);
StatusCode map_indices(const MapIndicesParams& p);
int64_t max_slots();  // worker slots of the scratch-carving ops: the hardware threads
// indexer_topk.cpp: fused score-and-select (scratch: indexer_topk_workspace_size, exact)
size_t indexer_topk_workspace_size(const IndexerTopkParams& p);
StatusCode indexer_topk(const IndexerTopkParams& p);
uint64_t indexer_topk_compactions();  // buffers compacted so far (tests: the overflow path ran)
// mla_attention.cpp
StatusCode sparse_mla(const SparseMlaParams& p);
StatusCode dense_mla(const DenseMlaParams& p);
// mha_prefill.cpp: one sequence group (src/core/api_mha.cpp makes the groups)
StatusCode dense_mha_prefill_group(const DenseMhaPrefillParams& p, const core::MhaGroup& g);
bool mha_uses_blas();  // decompression through the BLAS found at build time
// mla_project.cpp: the absorbed form's per-head projections
StatusCode mla_absorb_q(const MlaAbsorbQParams& p);
StatusCode mla_up_project(const MlaUpProjectParams& p);
void set_mha_blas(bool on);  // internal (tests, timing): false = our own GEMM loop

}  // namespace cpu
}  // namespace dsa
