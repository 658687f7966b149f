// Device enumeration for `dsa info` and dispatch checks. Never fails for lack of a GPU.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"

namespace dsa {
namespace gpu {
namespace {
constexpr int kCachedDevices = 64;
std::atomic<int> g_sm_count[kCachedDevices];  // 0: not read yet (static storage: zeroed)
}  // namespace

int sm_count_of(int device, int fallback) {
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    const int n = g_sm_count[device].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return fallback;  // not kept: a later call asks again
  }
  if (cached) g_sm_count[device].store(n, std::memory_order_relaxed);  // racing writers store the same value
  return n;
}

int current_sm_count(int fallback) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return fallback;
  }
  return sm_count_of(device, fallback);
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear: no driver or no device is not an error here
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.device = cuda_device(i);
    d.name = prop.name;
    d.compute_capability = prop.major * 10 + prop.minor;
    d.multiprocessors = prop.multiProcessorCount;
    d.memory_bytes = prop.totalGlobalMem;
    out.push_back(d);
  }
  return out;
}

}  // namespace gpu
}  // namespace dsa
