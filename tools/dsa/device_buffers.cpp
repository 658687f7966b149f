#include "device_buffers.h"

#include <cstring>

#if defined(DSA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsa_cli {

namespace {
#if defined(DSA_WITH_CUDA)
std::string g_last_error;
bool cuda_ok(cudaError_t e) {
  if (e == cudaSuccess) return true;
  g_last_error = cudaGetErrorString(e);
  return false;
}
#endif
}  // namespace

Buffer::Buffer(dsa::Device device, size_t bytes) : device_(device), bytes_(bytes), host_(bytes ? bytes : 1) {
  if (device_.type == dsa::DeviceType::kCPU) {
    dev_ = host_.data();
    return;
  }
#if defined(DSA_WITH_CUDA)
  ok_ = cuda_ok(cudaSetDevice(device_.index)) && cuda_ok(cudaMalloc(&dev_, bytes ? bytes : 1));
  if (!ok_) dev_ = nullptr;
#else
  ok_ = false;
#endif
}

Buffer::~Buffer() {
#if defined(DSA_WITH_CUDA)
  if (device_.type == dsa::DeviceType::kCUDA && dev_) cudaFree(dev_);
#endif
}

bool Buffer::upload() {
  if (device_.type == dsa::DeviceType::kCPU) return true;
#if defined(DSA_WITH_CUDA)
  return cuda_ok(cudaMemcpy(dev_, host_.data(), bytes_, cudaMemcpyHostToDevice));
#else
  return false;
#endif
}

bool Buffer::download() {
  if (device_.type == dsa::DeviceType::kCPU) return true;
#if defined(DSA_WITH_CUDA)
  return cuda_ok(cudaMemcpy(host_.data(), dev_, bytes_, cudaMemcpyDeviceToHost));
#else
  return false;
#endif
}

bool device_sync(dsa::Device device, std::string* err) {
  if (device.type == dsa::DeviceType::kCPU) return true;
#if defined(DSA_WITH_CUDA)
  if (cuda_ok(cudaDeviceSynchronize())) return true;
  if (err) *err = g_last_error;
  return false;
#else
  if (err) *err = "CUDA backend not compiled in";
  return false;
#endif
}

std::string device_error_string() {
#if defined(DSA_WITH_CUDA)
  return g_last_error;
#else
  return "";
#endif
}

}  // namespace dsa_cli
