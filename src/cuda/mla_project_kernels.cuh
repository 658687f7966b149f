// Kernel of the absorbed form's projections (src/cuda/mla_project.cu): the q_pe copy into
// q_out[t, h, 512:576]. The GEMMs themselves are cuBLAS's.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsa {
namespace gpu {
namespace mla_proj {

constexpr int kLatent = 512, kRope = 64, kChunk = 8;  // a chunk: 8 bf16, one 16-byte load
constexpr int kChunksPerRow = kRope / kChunk;
constexpr int kCopyThreads = 256;

// q_pe [T, H, 64] bf16 -> q_out[t, h, 512 + r] (bf16 or f32). Element strides.
struct PeCopy {
  const uint16_t* src = nullptr;
  int64_t s0 = 0, s1 = 0;
  void* dst = nullptr;
  int64_t d0 = 0, d1 = 0;
  int64_t T = 0;
  int64_t H = 0;
};

// bf16 -> f32 is exact: the 16 bits become the high half.
__device__ __forceinline__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// One thread per chunk, grid-stride. kVec: both sides' rows start 16-byte aligned (checked by
// the launcher), so a chunk is one 16-byte load and one (bf16) or two (f32) 16-byte stores.
template <typename Out, bool kVec>
__global__ void __launch_bounds__(kCopyThreads) pe_copy_kernel(PeCopy a) {
  const int64_t chunks = a.T * a.H * kChunksPerRow;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += step) {
    const int64_t row = i / kChunksPerRow;
    const int c = static_cast<int>(i % kChunksPerRow) * kChunk;
    const int64_t t = row / a.H, h = row % a.H;
    const uint16_t* s = a.src + t * a.s0 + h * a.s1 + c;
    Out* d = static_cast<Out*>(a.dst) + t * a.d0 + h * a.d1 + kLatent + c;
    if constexpr (kVec) {
      const uint4 v = *reinterpret_cast<const uint4*>(s);
      if constexpr (sizeof(Out) == 2) {
        *reinterpret_cast<uint4*>(d) = v;
      } else {
        // Little-endian: element 2k is the low half of word k.
        const float4 lo = make_float4(bf16_bits_to_float(v.x & 0xFFFFu), bf16_bits_to_float(v.x >> 16),
                                      bf16_bits_to_float(v.y & 0xFFFFu), bf16_bits_to_float(v.y >> 16));
        const float4 hi = make_float4(bf16_bits_to_float(v.z & 0xFFFFu), bf16_bits_to_float(v.z >> 16),
                                      bf16_bits_to_float(v.w & 0xFFFFu), bf16_bits_to_float(v.w >> 16));
        reinterpret_cast<float4*>(d)[0] = lo;
        reinterpret_cast<float4*>(d)[1] = hi;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        if constexpr (sizeof(Out) == 2) d[k] = s[k];
        else d[k] = bf16_bits_to_float(s[k]);
      }
    }
  }
}

}  // namespace mla_proj
}  // namespace gpu
}  // namespace dsa
