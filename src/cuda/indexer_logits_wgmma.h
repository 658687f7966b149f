// Host entry points of the Hopper logits kernels (indexer_logits_wgmma.cuh), used by the
// launcher in indexer_logits.cu. Each returns false in *served when the call's shape or
// alignment is not one the kernel serves (the launcher then takes the mma.sync kernel).
#pragma once
#include "dsa/indexer.h"
#include "dsa/status.h"

namespace dsa {
namespace gpu {
namespace logits_wg {

// mma_only: the measurement variant without the epilogue (no logits written). overlap: the
// variant that issues each tile's MMA in two halves so the epilogue runs under the tensor cores
// (prefill row blocks; paged decode blocks keep the default kernel).
StatusCode launch_flat(const IndexerLogitsParams& p, bool mma_only, bool overlap, bool* served);
// The form of the paged decode blocks (next_n <= 4, N = next_n x heads columns):
//  kSerial:  one CTA per SM, each consumer warpgroup one tile at a time (the first form);
//  kTwoCtas: the same body, two CTAs per SM (N <= 64; wider blocks take kSerial).
// kDefault is kTwoCtas (measured 10-22% faster on the H200, docs/perf.md "Indexer logits,
// round 4"). decode_kernel_name says which one a call of that shape runs.
enum class DecodeForm { kDefault, kSerial, kTwoCtas };
StatusCode launch_paged(const IndexerLogitsPagedParams& p, bool overlap, DecodeForm form, bool* served);
const char* decode_kernel_name(DecodeForm form, int64_t heads, int64_t next_n);

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
