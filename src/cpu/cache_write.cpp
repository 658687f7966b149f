// CPU cache writes and reads (SPEC §4). Tokens are independent (engines never give two tokens
// one slot), so threads split them; slot -1 skips a token.
#include <cmath>
#include <cstring>

#include "cpu/cpu_ops.h"
#include "cpu/fp8_block.h"
#include "cpu/parallel.h"
#include "dsa/geometry.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

// The cache slot of token t, or -1 to skip it (validated by src/core).
inline int64_t slot_of(const CacheSlots& w, int64_t t, int64_t page_size) {
  if (w.slots.present()) return w.slots.ptr<const int64_t>()[t * w.slots.stride[0]];
  const int64_t b = w.token_seq.ptr<const int32_t>()[t * w.token_seq.stride[0]];
  const int64_t j = w.token_pos.ptr<const int32_t>()[t * w.token_pos.stride[0]];
  const int64_t blk = w.block_table.ptr<const int32_t>()[b * w.block_table.stride[0] +
                                                         (j / page_size) * w.block_table.stride[1]];
  return blk * page_size + j % page_size;
}

// n values (f32 or bf16) as floats.
inline void load_f32(const void* src, DType dtype, int64_t n, float* __restrict dst) {
  if (dtype == DType::kBF16) {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

inline void store_bf16(const void* src, DType dtype, int64_t n, uint16_t* __restrict dst) {
  if (dtype == DType::kBF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 2);
  } else {
    const float* __restrict s = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(s[i]);
  }
}

const int64_t kTokenGrain = 64;

}  // namespace

StatusCode write_indexer_cache(const WriteIndexerCacheParams& p) {
  const int64_t T = p.k.shape[0];
  const int64_t page = p.cache.page_size, block_bytes = p.cache.block_bytes();
  uint8_t* base = static_cast<uint8_t*>(p.cache.data);
  const uint8_t* k = p.k.ptr<const uint8_t>();
  const float* ks = p.k_scale.ptr<const float>();
  return parallel_for(T, kTokenGrain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = slot_of(p.where, t, page);
      if (slot < 0) continue;
      uint8_t* blk = base + (slot / page) * block_bytes;
      const int64_t off = slot % page;
      // Page layout: [page x 128 e4m3][page x f32 scale].
      std::memcpy(blk + off * kIndexHeadDim, k + t * p.k.stride[0], kIndexHeadDim);
      std::memcpy(blk + page * kIndexHeadDim + off * 4, ks + t * p.k_scale.stride[0], 4);
    }
  });
}

StatusCode write_mla_cache(const WriteMlaCacheParams& p) {
  const int64_t T = p.kv_c.shape[0];
  const int64_t page = p.cache.page_size, block_bytes = p.cache.block_bytes();
  const int64_t token_bytes = p.cache.token_bytes();
  const bool fp8 = p.cache.dtype == MlaCacheDtype::kFP8;
  uint8_t* base = static_cast<uint8_t*>(p.cache.data);
  const int64_t es_c = static_cast<int64_t>(dtype_size(p.kv_c.dtype));
  const int64_t es_r = static_cast<int64_t>(dtype_size(p.k_pe.dtype));
  const char* kv = static_cast<const char*>(p.kv_c.data);
  const char* pe = static_cast<const char*>(p.k_pe.data);
  return parallel_for(T, kTokenGrain, [&](int64_t b, int64_t e) {
    alignas(64) float tile[kMlaFp8TileSize];
    alignas(64) uint16_t rope[kRopeDim];
    alignas(64) uint8_t codes[kMlaFp8TileSize];
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = slot_of(p.where, t, page);
      if (slot < 0) continue;
      uint8_t* dst = base + (slot / page) * block_bytes + (slot % page) * token_bytes;
      const char* src_c = kv + t * p.kv_c.stride[0] * es_c;
      const char* src_r = pe + t * p.k_pe.stride[0] * es_r;
      if (!fp8) {
        // [c_kv 512 | k_pe 64] x bf16. Go through a local buffer: the cache need not be 2-aligned.
        alignas(64) uint16_t row[kQkDim];
        store_bf16(src_c, p.kv_c.dtype, kLatentDim, row);
        store_bf16(src_r, p.k_pe.dtype, kRopeDim, row + kLatentDim);
        std::memcpy(dst, row, sizeof(row));
        continue;
      }
      // [512 e4m3][4 f32 scale][64 bf16 k_pe]: each 128-value tile has its own ue8m0 scale.
      for (int64_t g = 0; g < kLatentDim / kMlaFp8TileSize; ++g) {
        load_f32(src_c + g * kMlaFp8TileSize * es_c, p.kv_c.dtype, kMlaFp8TileSize, tile);
        const float s = ue8m0_scale(round_bf16_and_amax(tile, kMlaFp8TileSize));
        quantize_block(tile, kMlaFp8TileSize, 1.0f / s, codes);  // 1 / s exact: s is a power of two
        std::memcpy(dst + g * kMlaFp8TileSize, codes, sizeof(codes));
        std::memcpy(dst + kMlaFp8ScaleOffset + g * 4, &s, 4);
      }
      store_bf16(src_r, p.k_pe.dtype, kRopeDim, rope);
      std::memcpy(dst + kMlaFp8RopeOffset, rope, sizeof(rope));
    }
  });
}

StatusCode read_indexer_cache(const ReadIndexerCacheParams& p) {
  const int64_t T = p.slots.shape[0];
  const int64_t page = p.cache.page_size, block_bytes = p.cache.block_bytes();
  const uint8_t* base = static_cast<const uint8_t*>(p.cache.data);
  const int64_t* slots = p.slots.ptr<const int64_t>();
  uint8_t* k = p.k.ptr<uint8_t>();
  float* ks = p.k_scale.ptr<float>();
  return parallel_for(T, kTokenGrain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = slots[t * p.slots.stride[0]];
      if (slot < 0) continue;
      const uint8_t* blk = base + (slot / page) * block_bytes;
      const int64_t off = slot % page;
      std::memcpy(k + t * p.k.stride[0], blk + off * kIndexHeadDim, kIndexHeadDim);
      std::memcpy(&ks[t * p.k_scale.stride[0]], blk + page * kIndexHeadDim + off * 4, 4);
    }
  });
}

StatusCode read_mla_cache(const ReadMlaCacheParams& p) {
  const int64_t T = p.slots.shape[0];
  const int64_t page = p.cache.page_size, block_bytes = p.cache.block_bytes();
  const int64_t token_bytes = p.cache.token_bytes();
  const bool fp8 = p.cache.dtype == MlaCacheDtype::kFP8;
  const uint8_t* base = static_cast<const uint8_t*>(p.cache.data);
  const int64_t* slots = p.slots.ptr<const int64_t>();
  float* out = p.out.ptr<float>();
  return parallel_for(T, kTokenGrain, [&](int64_t b, int64_t e) {
    alignas(64) uint16_t row[kQkDim];
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = slots[t * p.slots.stride[0]];
      if (slot < 0) continue;
      const uint8_t* src = base + (slot / page) * block_bytes + (slot % page) * token_bytes;
      float* __restrict o = out + t * p.out.stride[0];
      if (!fp8) {
        std::memcpy(row, src, sizeof(row));
        for (int i = 0; i < kQkDim; ++i) o[i] = bf16_to_float(row[i]);
        continue;
      }
      for (int64_t g = 0; g < kLatentDim / kMlaFp8TileSize; ++g) {
        float s;
        std::memcpy(&s, src + kMlaFp8ScaleOffset + g * 4, 4);
        const uint8_t* q = src + g * kMlaFp8TileSize;
        for (int64_t i = 0; i < kMlaFp8TileSize; ++i) o[g * kMlaFp8TileSize + i] = e4m3_to_float(q[i]) * s;
      }
      std::memcpy(row, src + kMlaFp8RopeOffset, kRopeDim * 2);
      for (int i = 0; i < kRopeDim; ++i) o[kLatentDim + i] = bf16_to_float(row[i]);
    }
  });
}

}  // namespace cpu
}  // namespace dsa
