// Helpers shared by the CUDA launchers: error mapping, stream casts, grid sizing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/kernel_name.h"
#include "dsa/status.h"

namespace dsa {
namespace gpu {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The launch's own error (bad configuration) or an earlier sticky one.
inline StatusCode last_launch_status() {
  return cudaGetLastError() == cudaSuccess ? StatusCode::kOk : StatusCode::kDeviceError;
}

// Every launcher names the kernel it launches (dsa::last_kernel_name) with a stable literal,
// "<op>.<variant>", set just before the launch.
inline void note_kernel(const char* name) { core::set_last_kernel_name(name); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace gpu
}  // namespace dsa
