// The CUDA backend's cuBLAS handles: one per device, created on its first call and kept for
// the process (cublasCreate allocates, so the first call of an op that uses cuBLAS must run
// outside graph capture, as engines' warm-ups do). A handle's stream and workspace are set
// per call, so calls take the handles one at a time. Host code only.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>

#include "dsa/status.h"

namespace dsa {
namespace gpu {

constexpr int kMaxBlasDevices = 64;

struct BlasHandles {
  std::mutex mu;
  cublasHandle_t handle[kMaxBlasDevices] = {};
};
// Inline: one instance for every translation unit of the backend.
inline BlasHandles& blas_handles() {
  static BlasHandles b;
  return b;
}

// Runs f(handle) -> cublasStatus_t with the device's handle bound to `stream`, to the
// workspace [ws, ws + ws_bytes) and to `math` (set on every call: the handle is shared by
// ops that want different modes). ws = nullptr, ws_bytes = 0: no workspace, so cuBLAS takes
// an algorithm that needs none and allocates nothing (cublasSetStream alone would rebind its
// default pool, which allocates under capture). kDeviceError when cuBLAS fails.
template <typename F>
StatusCode with_blas(int device, cudaStream_t stream, void* ws, size_t ws_bytes, cublasMath_t math, F&& f) {
  if (device < 0 || device >= kMaxBlasDevices) return StatusCode::kUnsupported;
  BlasHandles& b = blas_handles();
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.handle[device] == nullptr) {
    if (cublasCreate(&b.handle[device]) != CUBLAS_STATUS_SUCCESS) {
      b.handle[device] = nullptr;
      return StatusCode::kDeviceError;
    }
  }
  cublasHandle_t h = b.handle[device];
  // The stream first: setting it resets the workspace.
  if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) return StatusCode::kDeviceError;
  if (cublasSetWorkspace(h, ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) return StatusCode::kDeviceError;
  if (cublasSetMathMode(h, math) != CUBLAS_STATUS_SUCCESS) return StatusCode::kDeviceError;
  return f(h) == CUBLAS_STATUS_SUCCESS ? StatusCode::kOk : StatusCode::kDeviceError;
}

}  // namespace gpu
}  // namespace dsa
