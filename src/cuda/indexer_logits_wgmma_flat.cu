// Instantiations of the Hopper logits kernel for the flat key buffer (indexer_logits).
#include "cuda/hopper/hopper.cuh"
#include "cuda/indexer_logits_wgmma.h"
#include "cuda/indexer_logits_wgmma_launch.cuh"
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace logits_wg {

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
  if (mma_only && form == RowsForm::kFourWg) {  // the default form without its epilogue
    if (hp <= 32) {
      a.rows_per_block = rows4_of(32);
      return launch_kernel<FlatKeys, 32, rows4_of(32), false, false, 1, 4>(a, keys, map, smap, s);
    }
    a.rows_per_block = rows4_of(64);
    return launch_kernel<FlatKeys, 64, rows4_of(64), false, false, 1, 4>(a, keys, map, smap, s);
  }
  if (mma_only) {  // the serial form without its epilogue
    if (hp <= 32) {
      a.rows_per_block = 8;
      return launch_kernel<FlatKeys, 32, 8, false>(a, keys, map, smap, s);
    }
    a.rows_per_block = 4;
    return launch_kernel<FlatKeys, 64, 4, false>(a, keys, map, smap, s);
  }
  if (form == RowsForm::kFourWg) {  // four consumer warpgroups, 128 columns (issue 10, round 5)
    switch (hp) {
      case 16: a.rows_per_block = rows4_of(16); return launch_kernel<FlatKeys, 16, rows4_of(16), true, false, 1, 4>(a, keys, map, smap, s);
      case 32: a.rows_per_block = rows4_of(32); return launch_kernel<FlatKeys, 32, rows4_of(32), true, false, 1, 4>(a, keys, map, smap, s);
      default: a.rows_per_block = rows4_of(64); return launch_kernel<FlatKeys, 64, rows4_of(64), true, false, 1, 4>(a, keys, map, smap, s);
    }
  }
  if (form == RowsForm::kOverlap) {  // the epilogue under the tensor cores (round 3)
    switch (hp) {
      case 16: a.rows_per_block = prefill_rows(16); return launch_kernel<FlatKeys, 16, prefill_rows(16), true, true>(a, keys, map, smap, s);
      case 32: a.rows_per_block = 8; return launch_kernel<FlatKeys, 32, 8, true, true>(a, keys, map, smap, s);
      default: a.rows_per_block = 4; return launch_kernel<FlatKeys, 64, 4, true, true>(a, keys, map, smap, s);
    }
  }
  switch (hp) {
    case 16: a.rows_per_block = prefill_rows(16); return launch_kernel<FlatKeys, 16, prefill_rows(16), true>(a, keys, map, smap, s);
    case 32: a.rows_per_block = 8; return launch_kernel<FlatKeys, 32, 8, true>(a, keys, map, smap, s);
    default: a.rows_per_block = 4; return launch_kernel<FlatKeys, 64, 4, true>(a, keys, map, smap, s);
  }
}

const char* rows_kernel_name(bool paged, RowsForm form) {
  switch (form) {
    case RowsForm::kFourWg: return paged ? "indexer_logits_paged.wgmma_fp8_rows_4wg" : "indexer_logits.wgmma_fp8_4wg";
    case RowsForm::kOverlap: return paged ? "indexer_logits_paged.wgmma_fp8_rows_overlap" : "indexer_logits.wgmma_fp8_overlap";
    default: return paged ? "indexer_logits_paged.wgmma_fp8_rows" : "indexer_logits.wgmma_fp8";
  }
}

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
