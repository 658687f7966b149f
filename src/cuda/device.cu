// Device enumeration for `dsa info` and dispatch checks. Never fails for lack of a GPU.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"

namespace dsa {
namespace gpu {

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
