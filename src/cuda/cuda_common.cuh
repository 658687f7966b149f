// Helpers shared by the CUDA launchers: error mapping, stream casts, grid sizing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dsa/status.h"

namespace dsa {
namespace gpu {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The launch's own error (bad configuration) or an earlier sticky one.
inline StatusCode last_launch_status() {
  return cudaGetLastError() == cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace gpu
}  // namespace dsa
