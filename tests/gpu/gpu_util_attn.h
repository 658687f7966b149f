// Device helpers for the GPU attention suite: device detection and an RAII device buffer.
// (Kept apart from the other GPU suites' helpers so the branches merge without a clash.)
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsa_gpu_attn {

inline bool gpu_present() {
  static const bool present = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return present;
}

// Device memory owned by a test; copies are synchronous (the ops under test never are).
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { alloc(bytes); }
  template <typename T>
  explicit DevBuf(const std::vector<T>& host) {
    alloc(host.size() * sizeof(T));
    if (ptr_ && !host.empty()) ok_ = cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (ptr_) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool ok() const { return ok_; }
  void fill(int byte) { ok_ = ok_ && cudaMemset(ptr_, byte, bytes_) == cudaSuccess; }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> h(bytes_ / sizeof(T));
    if (ptr_ && !h.empty() && cudaMemcpy(h.data(), ptr_, h.size() * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      h.clear();
    return h;
  }

 private:
  void alloc(size_t bytes) {
    bytes_ = bytes;
    if (bytes == 0) return;
    ok_ = cudaMalloc(&ptr_, bytes) == cudaSuccess;
    if (!ok_) ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool ok_ = true;
};

}  // namespace dsa_gpu_attn

#define DSA_ATTN_REQUIRE_GPU()                                                 \
  do {                                                                         \
    if (!::dsa_gpu_attn::gpu_present()) GTEST_SKIP() << "no CUDA device";      \
  } while (0)
