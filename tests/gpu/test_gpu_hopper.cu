// The Hopper helpers (src/cuda/hopper/hopper.cuh) against host GEMMs: TMA tile loads with
// 128-byte swizzle, wgmma descriptors (K-major and MN-major B, in-row K steps), A from
// registers, fp8 e4m3, and plain bulk copies. Each kernel is one CTA of one warpgroup.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/hopper/hopper.cuh"
#include "dsa/numerics.h"

namespace {

namespace hp = dsa::gpu::hopper;

bool have_sm90a() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  return hp::device_is_sm90a(0);
}

#define REQUIRE_SM90A() \
  do {                  \
    if (!have_sm90a()) GTEST_SKIP() << "no sm_90 device"; \
  } while (0)

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

constexpr int kM = 64;

// B_KMAJOR: B is [N, K] (K contiguous). Otherwise B is [K, N] (N contiguous, MN-major).
// K = 64 bf16 = one 128-byte swizzled row; N = 64 or 128.
template <int N, bool B_KMAJOR, bool A_REGS>
__global__ void gemm_bf16_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                                 const __nv_bfloat16* a_global, float* c) {
#if DSA_HOPPER_DEVICE
  __shared__ alignas(1024) __nv_bfloat16 sa[kM * 64];
  __shared__ alignas(1024) __nv_bfloat16 sb[N * 64];
  __shared__ alignas(8) uint64_t bar;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    hp::mbar_init(&bar, 1);
    hp::mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    hp::mbar_arrive_expect_tx(&bar, sizeof(sa) + sizeof(sb));
    hp::tma_load_2d(sa, &ma, 0, 0, &bar);
    if (B_KMAJOR) {
      hp::tma_load_2d(sb, &mb, 0, 0, &bar);
    } else {
      // [K=64 rows, N] N-contiguous: one 64-wide N block per load, each 64 rows x 128 B.
      for (int nb = 0; nb < N / 64; ++nb) hp::tma_load_2d(sb + nb * 64 * 64, &mb, nb * 64, 0, &bar);
    }
  }
  hp::mbar_wait(&bar, 0);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  uint32_t a_regs[4][4];
  if (A_REGS) {
    for (int ks = 0; ks < 4; ++ks)
      for (int j = 0; j < 4; ++j) {
        const int row = 16 * warp + lane / 4 + 8 * (j % 2), k = 16 * ks + 8 * (j / 2) + 2 * (lane % 4);
        const __nv_bfloat16 lo = a_global[row * 64 + k], hi = a_global[row * 64 + k + 1];
        a_regs[ks][j] = static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
      }
  }
  hp::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t da = hp::desc_advance(hp::smem_desc(sa, hp::Swizzle::k128B, 16, 1024), ks * 32);
    uint64_t db;
    if (B_KMAJOR) db = hp::desc_advance(hp::smem_desc(sb, hp::Swizzle::k128B, 16, 1024), ks * 32);
    else db = hp::desc_advance(hp::smem_desc(sb, hp::Swizzle::k128B, 64 * 128, 1024), ks * 16 * 128);
    if (A_REGS) hp::wgmma_bf16_rs<N, B_KMAJOR ? 0 : 1>(d, a_regs[ks], db, 1);
    else hp::wgmma_bf16_ss<N, 0, B_KMAJOR ? 0 : 1>(d, da, db, 1);
  }
  hp::wgmma_commit();
  hp::wgmma_wait<0>();
  hp::fence_regs(d);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) c[hp::acc_row(i, lane, warp) * N + hp::acc_col(i, lane)] = d[i];
#endif
}

// fp8: A [64, 128] e4m3, B [N, 128] e4m3, both K-major, K = 128 = one 128-byte row.
template <int N, bool A_REGS>
__global__ void gemm_e4m3_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                                 const uint8_t* a_global, float* c) {
#if DSA_HOPPER_DEVICE
  __shared__ alignas(1024) uint8_t sa[kM * 128];
  __shared__ alignas(1024) uint8_t sb[N * 128];
  __shared__ alignas(8) uint64_t bar;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) {
    hp::mbar_init(&bar, 1);
    hp::mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    hp::mbar_arrive_expect_tx(&bar, sizeof(sa) + sizeof(sb));
    hp::tma_load_2d(sa, &ma, 0, 0, &bar);
    hp::tma_load_2d(sb, &mb, 0, 0, &bar);
  }
  hp::mbar_wait(&bar, 0);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  uint32_t a_regs[4][4];
  if (A_REGS) {
    for (int ks = 0; ks < 4; ++ks)
      for (int j = 0; j < 4; ++j) {
        const int row = 16 * warp + lane / 4 + 8 * (j % 2), k = 32 * ks + 16 * (j / 2) + 4 * (lane % 4);
        uint32_t v = 0;
        for (int b = 0; b < 4; ++b) v |= static_cast<uint32_t>(a_global[row * 128 + k + b]) << (8 * b);
        a_regs[ks][j] = v;
      }
  }
  hp::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t da = hp::desc_advance(hp::smem_desc(sa, hp::Swizzle::k128B, 16, 1024), ks * 32);
    const uint64_t db = hp::desc_advance(hp::smem_desc(sb, hp::Swizzle::k128B, 16, 1024), ks * 32);
    if (A_REGS) hp::wgmma_e4m3_rs<N>(d, a_regs[ks], db, 1);
    else hp::wgmma_e4m3_ss<N>(d, da, db, 1);
  }
  hp::wgmma_commit();
  hp::wgmma_wait<0>();
  hp::fence_regs(d);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) c[hp::acc_row(i, lane, warp) * N + hp::acc_col(i, lane)] = d[i];
#endif
}

// Gathers rows[i] (each `row_bytes`, a multiple of 16) into shared memory with bulk copies,
// then writes them out in order.
__global__ void gather_kernel(const uint8_t* src, const int* rows, int n, int row_bytes, uint8_t* out) {
#if DSA_HOPPER_DEVICE
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    hp::mbar_init(&bar, 1);
    hp::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    hp::mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(n * row_bytes));
    for (int i = 0; i < n; ++i) hp::bulk_load(smem + i * row_bytes, src + static_cast<int64_t>(rows[i]) * row_bytes, row_bytes, &bar);
  }
  hp::mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < n * row_bytes; i += blockDim.x) out[i] = smem[i];
#endif
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = dsa::float_to_bf16(nd(rng));
  return v;
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

// Exact products of bf16 / e4m3 summed by the tensor cores: compare with a float64 sum at a
// tolerance relative to the sum of |terms|. bf16 wgmma accumulates in f32 (1e-5 holds); fp8
// wgmma accumulates with fewer mantissa bits (measured on the H200: relative errors up to
// 2e-4 of the sum of |terms| over K = 128), so fp8 gets 1e-3. A wrong layout or descriptor
// gives errors of order 1.
void expect_gemm(const std::vector<float>& c, const std::vector<double>& ref, const std::vector<double>& mag, double rel) {
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_NEAR(c[i], ref[i], rel * mag[i] + 1e-30) << "element " << i;
  }
}

template <int N, bool B_KMAJOR, bool A_REGS>
void run_bf16_case() {
  std::mt19937 rng(N * 7 + B_KMAJOR * 3 + A_REGS);
  const int K = 64;
  auto a = random_bf16(kM * K, rng), b = random_bf16(N * K, rng);  // b is [N, K] logically
  std::vector<uint16_t> b_store = b;
  if (!B_KMAJOR) {  // store as [K, N]
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) b_store[k * N + n] = b[n * K + k];
  }
  uint16_t* da = to_device(a);
  uint16_t* db = to_device(b_store);
  float* dc = nullptr;
  ASSERT_EQ(cudaMalloc(&dc, kM * N * 4), cudaSuccess);
  CUtensorMap ma, mb;
  ASSERT_EQ(hp::make_tensor_map_2d(&ma, da, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, K, kM, K * 2, 64, kM, CU_TENSOR_MAP_SWIZZLE_128B),
            dsa::StatusCode::kOk);
  if (B_KMAJOR)
    ASSERT_EQ(hp::make_tensor_map_2d(&mb, db, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, K, N, K * 2, 64, N, CU_TENSOR_MAP_SWIZZLE_128B),
              dsa::StatusCode::kOk);
  else
    ASSERT_EQ(hp::make_tensor_map_2d(&mb, db, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, N, K, N * 2, 64, K, CU_TENSOR_MAP_SWIZZLE_128B),
              dsa::StatusCode::kOk);
  gemm_bf16_kernel<N, B_KMAJOR, A_REGS><<<1, 128>>>(ma, mb, reinterpret_cast<const __nv_bfloat16*>(da), dc);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> c(kM * N);
  CUDA_OK(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref(c.size()), mag(c.size());
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0, g = 0;
      for (int k = 0; k < K; ++k) {
        const double t = double(dsa::bf16_to_float(a[m * K + k])) * dsa::bf16_to_float(b[n * K + k]);
        s += t;
        g += std::fabs(t);
      }
      ref[m * N + n] = s;
      mag[m * N + n] = g;
    }
  expect_gemm(c, ref, mag, 1e-5);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

template <int N, bool A_REGS>
void run_e4m3_case() {
  std::mt19937 rng(N * 11 + A_REGS);
  const int K = 128;
  std::uniform_int_distribution<int> byte(0, 255);
  auto rand_e4m3 = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& x : v) {
      do x = static_cast<uint8_t>(byte(rng));
      while ((x & 0x7f) == 0x7f);  // no NaN
    }
    return v;
  };
  auto a = rand_e4m3(kM * K), b = rand_e4m3(N * K);
  uint8_t* da = to_device(a);
  uint8_t* db = to_device(b);
  float* dc = nullptr;
  ASSERT_EQ(cudaMalloc(&dc, kM * N * 4), cudaSuccess);
  CUtensorMap ma, mb;
  ASSERT_EQ(hp::make_tensor_map_2d(&ma, da, CU_TENSOR_MAP_DATA_TYPE_UINT8, K, kM, K, 128, kM, CU_TENSOR_MAP_SWIZZLE_128B),
            dsa::StatusCode::kOk);
  ASSERT_EQ(hp::make_tensor_map_2d(&mb, db, CU_TENSOR_MAP_DATA_TYPE_UINT8, K, N, K, 128, N, CU_TENSOR_MAP_SWIZZLE_128B),
            dsa::StatusCode::kOk);
  gemm_e4m3_kernel<N, A_REGS><<<1, 128>>>(ma, mb, da, dc);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> c(kM * N);
  CUDA_OK(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref(c.size()), mag(c.size());
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0, g = 0;
      for (int k = 0; k < K; ++k) {
        const double t = double(dsa::e4m3_to_float(a[m * K + k])) * dsa::e4m3_to_float(b[n * K + k]);
        s += t;
        g += std::fabs(t);
      }
      ref[m * N + n] = s;
      mag[m * N + n] = g;
    }
  expect_gemm(c, ref, mag, 1e-3);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(GpuHopper, Bf16KMajorB) { REQUIRE_SM90A(); run_bf16_case<64, true, false>(); }
TEST(GpuHopper, Bf16KMajorBWide) { REQUIRE_SM90A(); run_bf16_case<256, true, false>(); }
TEST(GpuHopper, Bf16MNMajorB) { REQUIRE_SM90A(); run_bf16_case<128, false, false>(); }
TEST(GpuHopper, Bf16ARegsKMajorB) { REQUIRE_SM90A(); run_bf16_case<64, true, true>(); }
TEST(GpuHopper, Bf16ARegsMNMajorB) { REQUIRE_SM90A(); run_bf16_case<128, false, true>(); }
TEST(GpuHopper, E4m3) { REQUIRE_SM90A(); run_e4m3_case<128, false>(); }
TEST(GpuHopper, E4m3Wide) { REQUIRE_SM90A(); run_e4m3_case<256, false>(); }
TEST(GpuHopper, E4m3ARegs) { REQUIRE_SM90A(); run_e4m3_case<64, true>(); }

TEST(GpuHopper, BulkGather) {
  REQUIRE_SM90A();
  const int rows = 1000, row_bytes = 1152, n = 37;
  std::mt19937 rng(5);
  std::vector<uint8_t> src(static_cast<size_t>(rows) * row_bytes);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  std::vector<int> pick(n);
  for (auto& p : pick) p = static_cast<int>(rng() % rows);
  pick[0] = rows - 1;
  uint8_t* ds = to_device(src);
  int* dp = to_device(pick);
  uint8_t* dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dout, n * row_bytes), cudaSuccess);
  CUDA_OK(cudaFuncSetAttribute(gather_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * row_bytes));
  gather_kernel<<<1, 128, n * row_bytes>>>(ds, dp, n, row_bytes, dout);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> out(static_cast<size_t>(n) * row_bytes);
  CUDA_OK(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < row_bytes; ++j)
      ASSERT_EQ(out[i * row_bytes + j], src[static_cast<size_t>(pick[i]) * row_bytes + j]) << "row " << i << " byte " << j;
  cudaFree(ds);
  cudaFree(dp);
  cudaFree(dout);
}

}  // namespace
