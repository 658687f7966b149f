// Paged cache layouts (SPEC §4) and the ops that write new tokens into them.
// The bytes are the contract: engines share these buffers with their own kernels.
#pragma once
#include <cstdint>

#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

// MLA latent cache, one token:
//   BF16 (default): 576 x bf16 = [c_kv 512 | k_pe 64]                         1152 B
//   FP8 (explicit): [512 x e4m3][4 x f32 scale (one per 128, power of two)][64 x bf16 k_pe]  656 B
enum class MlaCacheDtype : int32_t { kBF16 = 0, kFP8 = 1 };
constexpr int64_t kMlaBf16TokenBytes = 1152;
constexpr int64_t kMlaFp8TokenBytes = 656;
constexpr int64_t kMlaFp8ScaleOffset = 512;   // byte offset of the 4 f32 scales
constexpr int64_t kMlaFp8RopeOffset = 528;    // byte offset of the 64 bf16 k_pe values
constexpr int64_t kMlaFp8TileSize = 128;      // values per scale
inline int64_t mla_token_bytes(MlaCacheDtype d) {
  return d == MlaCacheDtype::kFP8 ? kMlaFp8TokenBytes : kMlaBf16TokenBytes;
}
const char* mla_cache_dtype_name(MlaCacheDtype d);

// Indexer K cache: pages of `page_size` tokens (64 by default); a page is
// [page_size x 128 e4m3][page_size x f32 scale]  (8448 B for 64 tokens): 132 B per token.
constexpr int64_t kIndexerTokenBytes = 132;
constexpr int64_t kDefaultPageSize = 64;

// A paged MLA cache: `num_blocks` pages of `page_size` tokens, token stride
// mla_token_bytes(dtype). block_stride_bytes == 0 means page_size * token bytes.
// Slot s (an "address") is token s % page_size of block s / page_size.
struct MlaCacheDesc {
  void* data = nullptr;       // [num_blocks, block_stride_bytes] bytes
  MlaCacheDtype dtype = MlaCacheDtype::kBF16;
  int64_t num_blocks = 0;
  int64_t page_size = kDefaultPageSize;
  int64_t block_stride_bytes = 0;
  Device device{};

  bool present() const { return data != nullptr && num_blocks > 0; }
  int64_t token_bytes() const { return mla_token_bytes(dtype); }
  int64_t block_bytes() const { return block_stride_bytes ? block_stride_bytes : page_size * token_bytes(); }
  int64_t num_slots() const { return num_blocks * page_size; }
};

// A paged indexer K cache. block_stride_bytes == 0 means page_size * 132.
struct IndexerCacheDesc {
  void* data = nullptr;       // [num_blocks, block_stride_bytes] bytes
  int64_t num_blocks = 0;
  int64_t page_size = kDefaultPageSize;
  int64_t block_stride_bytes = 0;
  Device device{};

  bool present() const { return data != nullptr && num_blocks > 0; }
  int64_t block_bytes() const { return block_stride_bytes ? block_stride_bytes : page_size * kIndexerTokenBytes; }
  int64_t num_slots() const { return num_blocks * page_size; }
};

// Where each new token goes. Either
//   slots [T] i64: cache slot per token (block * page_size + offset); -1 = skip the token;
// or, when `slots` is not given,
//   block_table [B, max_blocks] i32, token_seq [T] i32 (sequence of each token) and
//   token_pos [T] i32 (position of the token in its sequence): slot =
//   block_table[seq][pos / page_size] * page_size + pos % page_size.
struct CacheSlots {
  TensorDesc slots;
  TensorDesc block_table;
  TensorDesc token_seq;
  TensorDesc token_pos;
};

// Write prepared indexer keys (see prepare_indexer_k) into the paged indexer cache.
struct WriteIndexerCacheParams {
  TensorDesc k;        // [T, 128] e4m3
  TensorDesc k_scale;  // [T] f32
  CacheSlots where;
  IndexerCacheDesc cache;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};
Status write_indexer_cache(const WriteIndexerCacheParams& p);

// Write MLA latents into the paged MLA cache in the cache's dtype. Inputs are rounded to
// BF16 first (f32 inputs); the FP8 layout quantises each 128-value tile of c_kv with its
// own ue8m0 scale (SPEC §3.3 formula), k_pe stays BF16.
struct WriteMlaCacheParams {
  TensorDesc kv_c;  // [T, 512] bf16 or f32, last dim contiguous
  TensorDesc k_pe;  // [T, 64]  bf16 or f32, last dim contiguous
  CacheSlots where;
  MlaCacheDesc cache;
  void* stream = nullptr;
};
Status write_mla_cache(const WriteMlaCacheParams& p);

// Read tokens back out of an MLA cache as f32 [T, 576] (dequantising FP8): for tests,
// debugging and engines that need the latents in plain form. slots [T] i64 as above.
struct ReadMlaCacheParams {
  MlaCacheDesc cache;
  TensorDesc slots;  // [T] i64
  TensorDesc out;    // [T, 576] f32
  void* stream = nullptr;
};
Status read_mla_cache(const ReadMlaCacheParams& p);

// Read indexer keys back out of an indexer cache (the inverse of write_indexer_cache): the FP8
// key and its f32 scale of each slot, as written. slots [T] i64; rows of -1 slots (and, on the
// device, of slots outside the cache) are left untouched.
struct ReadIndexerCacheParams {
  IndexerCacheDesc cache;
  TensorDesc slots;    // [T] i64
  TensorDesc k;        // [T, 128] e4m3, last dim contiguous
  TensorDesc k_scale;  // [T] f32
  void* stream = nullptr;
};
Status read_indexer_cache(const ReadIndexerCacheParams& p);

}  // namespace dsa
