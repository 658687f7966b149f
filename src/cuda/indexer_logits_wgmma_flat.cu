// Instantiations of the Hopper logits kernel for the flat key buffer (indexer_logits).
#include <cstdlib>
#include <cstring>

#include "cuda/hopper/hopper.cuh"
#include "cuda/indexer_logits_wgmma.h"
#include "cuda/indexer_logits_wgmma_launch.cuh"
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace logits_wg {

int flat_gate_groups() {
  const char* v = std::getenv("DSA_CUDA_LOGITS_GATES");
  if (v == nullptr) return -1;
  return std::strcmp(v, "16") == 0 ? 16 : std::strcmp(v, "8") == 0 ? 8 : std::strcmp(v, "smem") == 0 ? 0 : -1;
}

namespace {

// One head count's row blocks in the form asked (mma_only: without the epilogue; the dispatcher
// never asks it of 16 heads, so those instantiations are not built).
template <int kHeads>
StatusCode launch_flat_heads(Args a, const FlatKeys& keys, const CUtensorMap& map, const CUtensorMap& smap, cudaStream_t s,
                             bool mma_only, RowsForm form) {
  if (form == RowsForm::kFourWg) {  // four consumer warpgroups (issue 10, round 5)
    a.rows_per_block = rows4_of(kHeads);
    if constexpr (kHeads > 16)
      if (mma_only) return launch_kernel<FlatKeys, kHeads, rows4_of(kHeads), false, false, 1, 4>(a, keys, map, smap, s);
    // Default: every gate group of a thread's column half in registers (16; round 10).
    switch (flat_gate_groups()) {
      case 0: return launch_kernel<FlatKeys, kHeads, rows4_of(kHeads), true, false, 1, 4>(a, keys, map, smap, s);
      case 8: return launch_kernel<FlatKeys, kHeads, rows4_of(kHeads), true, false, 1, 4, 8>(a, keys, map, smap, s);
      default: break;
    }
    return launch_kernel<FlatKeys, kHeads, rows4_of(kHeads), true, false, 1, 4, 16>(a, keys, map, smap, s);
  }
  a.rows_per_block = prefill_rows(kHeads);
  if constexpr (kHeads > 16)
    if (mma_only) return launch_kernel<FlatKeys, kHeads, prefill_rows(kHeads), false>(a, keys, map, smap, s);
  // DSA_CUDA_LOGITS_GATES (8 or 16) in the two-consumer forms: 16 gate groups a thread in
  // registers (of 32 in a 256-column block; ptxas: no spills at 224 registers, 20 and more spill).
  if (form == RowsForm::kOverlap) {  // the epilogue under the tensor cores (round 3)
    if (flat_gate_groups() > 0)
      return launch_kernel<FlatKeys, kHeads, prefill_rows(kHeads), true, true, 1, 2, 16>(a, keys, map, smap, s);
    return launch_kernel<FlatKeys, kHeads, prefill_rows(kHeads), true, true>(a, keys, map, smap, s);
  }
  if (flat_gate_groups() > 0)
    return launch_kernel<FlatKeys, kHeads, prefill_rows(kHeads), true, false, 1, 2, 16>(a, keys, map, smap, s);
  return launch_kernel<FlatKeys, kHeads, prefill_rows(kHeads), true>(a, keys, map, smap, s);
}

}  // namespace

StatusCode launch_flat(const IndexerLogitsParams& p, bool mma_only, RowsForm form, bool* served) {
  *served = false;
  const int64_t n = p.k.shape[0];
  // Key indices (and the last tile's, n + 63) fit int32 in the kernel's stores.
  if (p.q.shape[1] > 64 || n <= 0 || n > 0x7fffffffLL - kTileKeys || !q_aligned(p.q)) return StatusCode::kOk;
  if (reinterpret_cast<uintptr_t>(p.k.data) % 16 != 0 || p.k.stride[0] % 16 != 0 || p.k.stride[1] != 1) return StatusCode::kOk;
  if (p.q.shape[0] > 0x7fffffffLL) return StatusCode::kOk;
  CUtensorMap map;
  if (hopper::make_tensor_map_2d(&map, p.k.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, kD, static_cast<uint64_t>(n),
                                 static_cast<uint64_t>(p.k.stride[0]), kD, kTileKeys,
                                 CU_TENSOR_MAP_SWIZZLE_128B) != StatusCode::kOk)
    return StatusCode::kOk;
  // Scales by TMA too: contiguous and 16-byte aligned (else the mma.sync kernel serves).
  CUtensorMap smap;
  if (p.k_scale.stride[0] != 1 || reinterpret_cast<uintptr_t>(p.k_scale.data) % 16 != 0) return StatusCode::kOk;
  {
    const uint64_t dims[1] = {static_cast<uint64_t>(n)};
    const uint32_t box[1] = {static_cast<uint32_t>(kTileKeys)};
    if (hopper::make_tensor_map(&smap, p.k_scale.data, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, dims, nullptr, box,
                                CU_TENSOR_MAP_SWIZZLE_NONE) != StatusCode::kOk)
      return StatusCode::kOk;
  }
  *served = true;
  Args a = base_args(p.q, p.weights, p.logits, p.col_offset);
  if (a.rows == 0 || a.width == 0) return StatusCode::kOk;
  FlatKeys keys{};
  keys.ks = i32_vec(p.ks);
  keys.ke = i32_vec(p.ke);
  keys.n = n;
  a.tiles = ceil_div(n, kTileKeys);
  const cudaStream_t s = as_stream(p.stream);
  const int hp = padded_heads(a.heads);
  // The MMA-only hook times 16-head calls on the 32-head kernel (as it always has).
  switch (mma_only && hp == 16 ? 32 : hp) {
    case 16: return launch_flat_heads<16>(a, keys, map, smap, s, mma_only, form);
    case 32: return launch_flat_heads<32>(a, keys, map, smap, s, mma_only, form);
    default: return launch_flat_heads<64>(a, keys, map, smap, s, mma_only, form);
  }
}

const char* rows_kernel_name(bool paged, RowsForm form) {
  switch (form) {
    case RowsForm::kFourWg:
      if (paged) return "indexer_logits_paged.wgmma_fp8_rows_4wg";
      switch (flat_gate_groups()) {
        case 0: return "indexer_logits.wgmma_fp8_4wg_gates_smem";
        case 8: return "indexer_logits.wgmma_fp8_4wg_gates8";
        default: return "indexer_logits.wgmma_fp8_4wg";
      }
    case RowsForm::kOverlap:
      if (paged) return "indexer_logits_paged.wgmma_fp8_rows_overlap";
      return flat_gate_groups() > 0 ? "indexer_logits.wgmma_fp8_overlap_gates16" : "indexer_logits.wgmma_fp8_overlap";
    default:
      if (paged) return "indexer_logits_paged.wgmma_fp8_rows";
      return flat_gate_groups() > 0 ? "indexer_logits.wgmma_fp8_gates16" : "indexer_logits.wgmma_fp8";
  }
}

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
