// Host entry points of the Hopper logits kernels (indexer_logits_wgmma.cuh), used by the
// launcher in indexer_logits.cu. Each returns false in *served when the call's shape or
// alignment is not one the kernel serves (the launcher then takes the mma.sync kernel).
#pragma once
#include "dsa/indexer.h"
#include "dsa/status.h"

namespace dsa {
namespace gpu {
namespace logits_wg {

// The form of the prefill-shaped row blocks (flat keys; paged general form or next_n > 4):
//  kFourWg:  four consumer warpgroups of 64 accumulators; blocks of 256 columns are two column
//            halves, a pair of consumers per key tile (the default since round 5, docs/perf.md);
//  kOverlap: two consumer warpgroups, blocks of 256 columns, each tile's MMA in two halves so
//            the epilogue runs under the tensor cores (the default of rounds 3-4);
//  kSerial:  two consumer warpgroups, 256 columns, the epilogue after each tile's MMA.
enum class RowsForm { kFourWg, kOverlap, kSerial };
// mma_only: the measurement variant without the epilogue (no logits written): of the
// four-consumer form when form is kFourWg, else of the two-consumer serial form.
StatusCode launch_flat(const IndexerLogitsParams& p, bool mma_only, RowsForm form, bool* served);
const char* rows_kernel_name(bool paged, RowsForm form);
// Gate registers of the flat forms, DSA_CUDA_LOGITS_GATES: the four-consumer form keeps every
// 8-column gate group of a thread (16) in registers for the whole item by default (round 10,
// docs/perf.md), "8" half of them, "smem" none (read per tile from shared memory; kernel names
// end "_gates8" / "_gates_smem"). The two-consumer forms read theirs from shared memory unless
// the variable is 8 or 16: then 16 of their 32 groups ("_gates16", an A/B hook of round 6).
// Returns 16, 8, 0 ("smem") or -1 (unset or other values).
int flat_gate_groups();
// The form of the paged decode blocks (next_n <= 4, N = next_n x heads columns):
//  kSerial:  one CTA per SM, two consumer warpgroups, each one tile at a time (the first form);
//  kTwoCtas: the same body, two CTAs per SM (N <= 64; wider blocks take the default form);
//  kFourWg:  one CTA per SM, four consumer warpgroups (256 columns as two halves);
//  kFourWgSplit: kFourWg with one copy-issuing producer warp per consumer group.
// kDefault: kFourWgSplit at every width (docs/perf.md round 6; rounds 4-5 ran kTwoCtas for
// N <= 64, kFourWg above). decode_kernel_name says which one a call of that shape runs.
enum class DecodeForm { kDefault, kSerial, kTwoCtas, kFourWg, kFourWgSplit };
StatusCode launch_paged(const IndexerLogitsPagedParams& p, RowsForm rows_form, DecodeForm form, bool* served);
const char* decode_kernel_name(DecodeForm form, int64_t heads, int64_t next_n);

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
