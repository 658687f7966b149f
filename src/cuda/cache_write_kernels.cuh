// Kernel bodies of the cache family (SPEC §4): one warp per token. Caches are 16-byte
// aligned with 16-byte block strides (validated), and every per-token field offset is a
// multiple of 4, so scales are stored as f32 and BF16 as u16 directly. Input tensors carry no
// alignment promise, so their e4m3 bytes are read one by one.
#pragma once
#include "cuda/ops_common.cuh"

namespace dsa {
namespace gpu {
namespace cache {

constexpr int kWarpsPerBlock = 8;

struct IndexerWriteArgs {
  const uint8_t* k; int64_t k0;
  const float* k_scale; int64_t ks0;
  SlotMap where;
  uint8_t* cache; int64_t block_bytes, page_size;
  int64_t T;
};

__global__ void write_indexer_cache_kernel(IndexerWriteArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; t < a.T; t += warps) {
    const int64_t slot = a.where.slot(t);
    if (slot < 0) continue;
    const int64_t blk = slot / a.page_size, off = slot % a.page_size;
    uint8_t* page = a.cache + blk * a.block_bytes;
    const uint8_t* src = a.k + t * a.k0;
    const int d = lane * 4;
    const uint32_t word = static_cast<uint32_t>(src[d]) | (static_cast<uint32_t>(src[d + 1]) << 8) |
                          (static_cast<uint32_t>(src[d + 2]) << 16) | (static_cast<uint32_t>(src[d + 3]) << 24);
    reinterpret_cast<uint32_t*>(page + off * 128)[lane] = word;
    if (lane == 0) reinterpret_cast<float*>(page + a.page_size * 128)[off] = a.k_scale[t * a.ks0];
  }
}

struct MlaWriteArgs {
  const void* kv_c; bool kv_bf16; int64_t kv0;
  const void* k_pe; bool pe_bf16; int64_t pe0;
  SlotMap where;
  uint8_t* cache; int64_t block_bytes, page_size;
  bool fp8;
  int64_t T;
};

__global__ void write_mla_cache_kernel(MlaWriteArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t token_bytes = a.fp8 ? kMlaFp8TokenBytes : kMlaBf16TokenBytes;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; t < a.T; t += warps) {
    const int64_t slot = a.where.slot(t);
    if (slot < 0) continue;
    uint8_t* tok = a.cache + (slot / a.page_size) * a.block_bytes + (slot % a.page_size) * token_bytes;
    const int64_t kv_off = t * a.kv0, pe_off = t * a.pe0;
    if (!a.fp8) {
      uint16_t* dst = reinterpret_cast<uint16_t*>(tok);
      for (int i = lane; i < 512; i += kWarp) dst[i] = float_to_bf16(load_f32_or_bf16(a.kv_c, a.kv_bf16, kv_off + i));
      for (int i = lane; i < 64; i += kWarp) dst[512 + i] = float_to_bf16(load_f32_or_bf16(a.k_pe, a.pe_bf16, pe_off + i));
      continue;
    }
    float* scales = reinterpret_cast<float*>(tok + kMlaFp8ScaleOffset);
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) {
      float v[4];
      float amax = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        v[q] = round_to_bf16(load_f32_or_bf16(a.kv_c, a.kv_bf16, kv_off + tile * 128 + lane + q * kWarp));
        amax = fmaxf(amax, fabsf(v[q]));
      }
      amax = warp_max(amax);
      const float s = ue8m0_scale(amax);
      const float inv = 1.0f / s;
#pragma unroll
      for (int q = 0; q < 4; ++q) tok[tile * 128 + lane + q * kWarp] = quantize_e4m3(v[q], inv);
      if (lane == 0) scales[tile] = s;
    }
    uint16_t* pe = reinterpret_cast<uint16_t*>(tok + kMlaFp8RopeOffset);
    for (int i = lane; i < 64; i += kWarp) pe[i] = float_to_bf16(load_f32_or_bf16(a.k_pe, a.pe_bf16, pe_off + i));
  }
}

struct MlaReadArgs {
  const uint8_t* cache; int64_t block_bytes, page_size, num_blocks;
  bool fp8;
  const int64_t* slots; int64_t slots0;
  float* out; int64_t out0;
  int64_t T;
};

// An invalid slot (-1, or outside the cache) leaves its output row untouched, as on the CPU.
__global__ void read_mla_cache_kernel(MlaReadArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t token_bytes = a.fp8 ? kMlaFp8TokenBytes : kMlaBf16TokenBytes;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; t < a.T; t += warps) {
    const int64_t slot = a.slots[t * a.slots0];
    float* dst = a.out + t * a.out0;
    if (slot < 0 || slot >= a.num_blocks * a.page_size) continue;
    const uint8_t* tok = a.cache + (slot / a.page_size) * a.block_bytes + (slot % a.page_size) * token_bytes;
    if (!a.fp8) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(tok);
      for (int i = lane; i < 576; i += kWarp) dst[i] = bf16_to_float(src[i]);
      continue;
    }
    const float* scales = reinterpret_cast<const float*>(tok + kMlaFp8ScaleOffset);
    for (int i = lane; i < 512; i += kWarp) dst[i] = e4m3_to_float(tok[i]) * scales[i / 128];
    const uint16_t* pe = reinterpret_cast<const uint16_t*>(tok + kMlaFp8RopeOffset);
    for (int i = lane; i < 64; i += kWarp) dst[512 + i] = bf16_to_float(pe[i]);
  }
}

struct IndexerReadArgs {
  const uint8_t* cache; int64_t block_bytes, page_size, num_blocks;
  const int64_t* slots; int64_t slots0;
  uint8_t* k; int64_t k0;
  float* k_scale; int64_t ks0;
  int64_t T;
};

// A warp per token: 128 key bytes (4 per lane) and the scale. Invalid slots: rows untouched.
__global__ void read_indexer_cache_kernel(IndexerReadArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; t < a.T; t += warps) {
    const int64_t slot = a.slots[t * a.slots0];
    if (slot < 0 || slot >= a.num_blocks * a.page_size) continue;
    const uint8_t* blk = a.cache + (slot / a.page_size) * a.block_bytes;
    const int64_t off = slot % a.page_size;
    for (int i = lane; i < 128; i += kWarp) a.k[t * a.k0 + i] = blk[off * 128 + i];
    if (lane == 0) a.k_scale[t * a.ks0] = reinterpret_cast<const float*>(blk + a.page_size * 128)[off];
  }
}

}  // namespace cache
}  // namespace gpu
}  // namespace dsa
