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
StatusCode launch_paged(const IndexerLogitsPagedParams& p, bool overlap, bool* served);

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
