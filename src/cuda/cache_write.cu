// Launchers of the cache family: write_indexer_cache, write_mla_cache, read_mla_cache,
// read_indexer_cache.
#include "cuda/cache_write_kernels.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"

namespace dsa {
namespace gpu {
namespace {
constexpr int kThreads = cache::kWarpsPerBlock * kWarp;
unsigned warp_grid(int64_t items) { return grid_for(items, cache::kWarpsPerBlock, 65535LL * 4); }
int64_t tokens_of(const CacheSlots& w, const TensorDesc& fallback) {
  if (w.slots.present()) return w.slots.shape[0];
  if (w.token_seq.present()) return w.token_seq.shape[0];
  return fallback.shape[0];
}
}  // namespace

StatusCode write_indexer_cache(const WriteIndexerCacheParams& p) {
  const int64_t T = p.k.shape[0];
  if (T == 0 || tokens_of(p.where, p.k) == 0) return StatusCode::kOk;
  cache::IndexerWriteArgs a{};
  a.k = static_cast<const uint8_t*>(p.k.data);
  a.k0 = p.k.stride[0];
  a.k_scale = static_cast<const float*>(p.k_scale.data);
  a.ks0 = p.k_scale.stride[0];
  a.where = slot_map(p.where, p.cache.page_size, p.cache.num_blocks);
  a.cache = static_cast<uint8_t*>(p.cache.data);
  a.block_bytes = p.cache.block_bytes();
  a.page_size = p.cache.page_size;
  a.T = T;
  note_kernel("cache.write_indexer");
  cache::write_indexer_cache_kernel<<<warp_grid(T), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

StatusCode write_mla_cache(const WriteMlaCacheParams& p) {
  const int64_t T = p.kv_c.shape[0];
  if (T == 0 || tokens_of(p.where, p.kv_c) == 0) return StatusCode::kOk;
  cache::MlaWriteArgs a{};
  a.kv_c = p.kv_c.data;
  a.kv_bf16 = p.kv_c.dtype == DType::kBF16;
  a.kv0 = p.kv_c.stride[0];
  a.k_pe = p.k_pe.data;
  a.pe_bf16 = p.k_pe.dtype == DType::kBF16;
  a.pe0 = p.k_pe.stride[0];
  a.where = slot_map(p.where, p.cache.page_size, p.cache.num_blocks);
  a.cache = static_cast<uint8_t*>(p.cache.data);
  a.block_bytes = p.cache.block_bytes();
  a.page_size = p.cache.page_size;
  a.fp8 = p.cache.dtype == MlaCacheDtype::kFP8;
  a.T = T;
  note_kernel("cache.write_mla");
  cache::write_mla_cache_kernel<<<warp_grid(T), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

StatusCode read_mla_cache(const ReadMlaCacheParams& p) {
  const int64_t T = p.slots.shape[0];
  if (T == 0) return StatusCode::kOk;
  cache::MlaReadArgs a{};
  a.cache = static_cast<const uint8_t*>(p.cache.data);
  a.block_bytes = p.cache.block_bytes();
  a.page_size = p.cache.page_size;
  a.num_blocks = p.cache.num_blocks;
  a.fp8 = p.cache.dtype == MlaCacheDtype::kFP8;
  a.slots = static_cast<const int64_t*>(p.slots.data);
  a.slots0 = p.slots.stride[0];
  a.out = static_cast<float*>(p.out.data);
  a.out0 = p.out.stride[0];
  a.T = T;
  note_kernel("cache.read_mla");
  cache::read_mla_cache_kernel<<<warp_grid(T), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

StatusCode read_indexer_cache(const ReadIndexerCacheParams& p) {
  const int64_t T = p.slots.shape[0];
  if (T == 0) return StatusCode::kOk;
  cache::IndexerReadArgs a{};
  a.cache = static_cast<const uint8_t*>(p.cache.data);
  a.block_bytes = p.cache.block_bytes();
  a.page_size = p.cache.page_size;
  a.num_blocks = p.cache.num_blocks;
  a.slots = static_cast<const int64_t*>(p.slots.data);
  a.slots0 = p.slots.stride[0];
  a.k = static_cast<uint8_t*>(p.k.data);
  a.k0 = p.k.stride[0];
  a.k_scale = static_cast<float*>(p.k_scale.data);
  a.ks0 = p.k_scale.stride[0];
  a.T = T;
  note_kernel("cache.read_indexer");
  cache::read_indexer_cache_kernel<<<warp_grid(T), kThreads, 0, as_stream(p.stream)>>>(a);
  return last_launch_status();
}

}  // namespace gpu
}  // namespace dsa
