// Helpers for the GPU suites: device detection (every test skips cleanly without a device),
// an RAII device buffer with host round trips, and descriptors over device memory.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dsa/dsa.h"
#include "test_util.h"

namespace dsa_gpu_test {

// Sets an environment variable (a kernel-choice hook) for the scope; unset at its end.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

inline bool have_gpu() {
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

// Compute capability 9.0 (H100/H200): where the sm_90a kernels run and the launchers choose them.
inline bool device_is_sm90() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}

#define DSA_REQUIRE_GPU()                                          \
  do {                                                             \
    if (!::dsa_gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define DSA_CUDA_OK(expr)                                                    \
  do {                                                                       \
    cudaError_t _e = (expr);                                                 \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e);   \
  } while (0)

// Device memory owned by the test. Copies are synchronous (tests only; the ops under test
// never synchronise).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, int fill = 0) { reset(bytes, fill); }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) {
    reset(host.size() * sizeof(T));
    upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_; bytes_ = o.bytes_;
      o.ptr_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void reset(size_t bytes, int fill = 0) {
    release();
    bytes_ = bytes;
    if (bytes == 0) return;
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      bytes_ = 0;
      ADD_FAILURE() << "cudaMalloc(" << bytes << ") failed";
      return;
    }
    cudaMemset(ptr_, fill, bytes);
  }
  void* data() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

  template <typename T>
  void upload(const std::vector<T>& host) {
    EXPECT_LE(host.size() * sizeof(T), bytes_);
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  void upload_bytes(const void* src, size_t n) {
    EXPECT_LE(n, bytes_);
    if (n) {
      EXPECT_EQ(cudaMemcpy(ptr_, src, n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  template <typename T>
  std::vector<T> download(size_t count = SIZE_MAX) const {
    if (count == SIZE_MAX) count = bytes_ / sizeof(T);
    std::vector<T> host(count);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (count) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A contiguous descriptor over device memory (CUDA device 0).
inline dsa::TensorDesc dev_tensor(const DeviceBuffer& b, dsa::DType dtype, std::initializer_list<int64_t> shape) {
  return dsa::make_tensor(b.data(), dtype, shape, dsa::cuda_device(0));
}

// Waits for the device and reports any sticky error (kernels are asynchronous).
inline ::testing::AssertionResult device_clean() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "device error: " << cudaGetErrorString(e);
  e = cudaGetLastError();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "device error: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Same bytes, reporting the first difference.
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& got, const std::vector<T>& ref, const char* what) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(T)) != 0) {
      ::testing::AssertionResult r = ::testing::AssertionFailure();
      r << what << ": first difference at element " << i;
      if constexpr (std::is_floating_point<T>::value) r << ": " << got[i] << " vs " << ref[i];
      else r << ": " << static_cast<int64_t>(got[i]) << " vs " << static_cast<int64_t>(ref[i]);
      return r;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dsa_gpu_test
