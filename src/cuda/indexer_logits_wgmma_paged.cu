// Instantiations of the Hopper logits kernel for the paged indexer cache
// (indexer_logits_paged): decode blocks (one sequence's next_n <= 4 rows, N = next_n x heads)
// and prefill-shaped row blocks (general form or next_n > 4: 256 / heads rows, 8 at 16 heads).
#include "cuda/hopper/hopper.cuh"
#include "cuda/indexer_logits_wgmma.h"
#include "cuda/indexer_logits_wgmma_launch.cuh"
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace logits_wg {

namespace {

// The form a decode block of n columns runs when `form` is asked. Default: four consumers with
// a copy warp per consumer group at every width (measured faster than two CTAs per SM and
// than one copy warp at every paged decode shape on the H200, docs/perf.md round 6).
DecodeForm resolve(DecodeForm form, int n) {
  if (form == DecodeForm::kDefault) form = DecodeForm::kFourWgSplit;
  if (form == DecodeForm::kTwoCtas && n > kDecodeMaxN2) return resolve(DecodeForm::kDefault, n);
  return form;
}

// A decode block of kRows rows (one sequence's next_n rows) in the form asked (the four-consumer
// form takes a 256-column block, next_n 3-4 at 64 heads, as two column halves).
template <int kHeads, int kRows>
StatusCode launch_decode(const Args& a, const PagedKeys& keys, const CUtensorMap& map, const CUtensorMap& smap, cudaStream_t s,
                         DecodeForm form) {
  constexpr int kN = kHeads * kRows;
  form = resolve(form, kN);
  if constexpr (kN <= kDecodeMaxN2)
    if (form == DecodeForm::kTwoCtas) return launch_kernel<PagedKeys, kHeads, kRows, true, false, 2>(a, keys, map, smap, s);
  if (form == DecodeForm::kFourWg) return launch_kernel<PagedKeys, kHeads, kRows, true, false, 1, 4>(a, keys, map, smap, s);
  if (form == DecodeForm::kFourWgSplit)
    return launch_kernel<PagedKeys, kHeads, kRows, true, false, 1, 4, 0, true>(a, keys, map, smap, s);
  return launch_kernel<PagedKeys, kHeads, kRows, true>(a, keys, map, smap, s);
}

template <int kHeads>
StatusCode launch_heads(Args a, const PagedKeys& keys, const CUtensorMap& map, const CUtensorMap& smap, cudaStream_t s, bool decode,
                        int64_t next_n, RowsForm rows_form, DecodeForm form) {
  if (decode) {
    a.rows_per_block = next_n;
    if (next_n == 1) return launch_decode<kHeads, 1>(a, keys, map, smap, s, form);
    if (next_n == 2) return launch_decode<kHeads, 2>(a, keys, map, smap, s, form);
    return launch_decode<kHeads, 4>(a, keys, map, smap, s, form);
  }
  if (rows_form == RowsForm::kFourWg) {
    a.rows_per_block = rows4_of(kHeads);
    return launch_kernel<PagedKeys, kHeads, rows4_of(kHeads), true, false, 1, 4>(a, keys, map, smap, s);
  }
  a.rows_per_block = prefill_rows(kHeads);
  if (rows_form == RowsForm::kOverlap)
    return launch_kernel<PagedKeys, kHeads, prefill_rows(kHeads), true, true>(a, keys, map, smap, s);
  return launch_kernel<PagedKeys, kHeads, prefill_rows(kHeads), true>(a, keys, map, smap, s);
}

}  // namespace

const char* decode_kernel_name(DecodeForm form, int64_t heads, int64_t next_n) {
  const int64_t rows = next_n <= 2 ? next_n : 4;  // next_n 3 runs the 4-row block
  switch (resolve(form, static_cast<int>(padded_heads(heads) * rows))) {
    case DecodeForm::kTwoCtas: return "indexer_logits_paged.wgmma_fp8_decode_2cta";
    case DecodeForm::kFourWg: return "indexer_logits_paged.wgmma_fp8_decode_4wg";
    case DecodeForm::kFourWgSplit: return "indexer_logits_paged.wgmma_fp8_decode_4wg_split";
    default: return "indexer_logits_paged.wgmma_fp8_decode";
  }
}

StatusCode launch_paged(const IndexerLogitsPagedParams& p, RowsForm rows_form, DecodeForm form, bool* served) {
  *served = false;
  if (p.q.shape[1] > 64 || !q_aligned(p.q) || p.cache.page_size != kTileKeys) return StatusCode::kOk;
  const int64_t bb = p.cache.block_bytes();
  if (reinterpret_cast<uintptr_t>(p.cache.data) % 16 != 0 || bb % 16 != 0 || bb < kTileKeys * (kD + 4)) return StatusCode::kOk;
  if (p.cache.num_blocks <= 0 || p.cache.num_blocks > 0x7fffffffLL || p.q.shape[0] > 0x7fffffffLL) return StatusCode::kOk;
  // Key indices of a sequence (block table columns x 64) fit int32 in the kernel's stores.
  if (p.block_table.shape[1] > 0x7fffffffLL / kTileKeys - 1) return StatusCode::kOk;
  CUtensorMap map;
  const uint64_t dims[3] = {static_cast<uint64_t>(kD), static_cast<uint64_t>(kTileKeys),
                            static_cast<uint64_t>(p.cache.num_blocks)};
  const uint64_t strides[2] = {static_cast<uint64_t>(kD), static_cast<uint64_t>(bb)};
  const uint32_t box[3] = {static_cast<uint32_t>(kD), static_cast<uint32_t>(kTileKeys), 1u};
  if (hopper::make_tensor_map(&map, p.cache.data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, dims, strides, box,
                              CU_TENSOR_MAP_SWIZZLE_128B) != StatusCode::kOk)
    return StatusCode::kOk;
  // The pages' scale runs: 64 f32 at byte 64 * 128 of each page.
  CUtensorMap smap;
  if (hopper::make_tensor_map_2d(&smap, static_cast<const uint8_t*>(p.cache.data) + kTileKeys * kD,
                                 CU_TENSOR_MAP_DATA_TYPE_FLOAT32, kTileKeys, static_cast<uint64_t>(p.cache.num_blocks),
                                 static_cast<uint64_t>(bb), kTileKeys, 1, CU_TENSOR_MAP_SWIZZLE_NONE) != StatusCode::kOk)
    return StatusCode::kOk;
  *served = true;
  Args a = base_args(p.q, p.weights, p.logits, p.col_offset);
  if (a.rows == 0 || a.width == 0) return StatusCode::kOk;
  PagedKeys keys{};
  keys.cache = static_cast<const uint8_t*>(p.cache.data);
  keys.block_bytes = bb;
  keys.num_blocks = p.cache.num_blocks;
  keys.block_table = i32_mat(p.block_table);
  keys.general = p.row_seq.present();
  if (keys.general) {
    keys.row_seq = i32_vec(p.row_seq);
    keys.row_len = i32_vec(p.row_len);
  } else {
    keys.kv_lens = i32_vec(p.kv_lens);
    keys.next_n = p.next_n;
  }
  a.tiles = keys.block_table.cols;
  const bool decode = !keys.general && p.next_n <= 4;
  const cudaStream_t s = as_stream(p.stream);
  switch (padded_heads(a.heads)) {
    case 16: return launch_heads<16>(a, keys, map, smap, s, decode, p.next_n, rows_form, form);
    case 32: return launch_heads<32>(a, keys, map, smap, s, decode, p.next_n, rows_form, form);
    default: return launch_heads<64>(a, keys, map, smap, s, decode, p.next_n, rows_form, form);
  }
}

}  // namespace logits_wg
}  // namespace gpu
}  // namespace dsa
