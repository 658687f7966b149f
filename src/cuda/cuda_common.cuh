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

// Multiprocessors of `device`, or of the current device (device.cu): read from the runtime once
// per device and kept, since a device's SM count never changes while the process runs (the
// launchers size grids and splits by it on every call). `fallback` when it cannot be read.
int sm_count_of(int device, int fallback = 132);
int current_sm_count(int fallback = 132);

}  // namespace gpu
}  // namespace dsa
