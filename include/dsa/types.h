// Element types, devices and tensor descriptors. Framework-free: a TensorDesc is a pointer,
// a dtype, a shape and int64 strides (in elements), nothing more. DSA never owns tensor memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace dsa {

enum class DType : int32_t {
  kF32 = 0,
  kBF16,   // bfloat16, stored as uint16
  kE4M3,   // FP8 E4M3 "fn": max 448, no infinities, one NaN pattern per sign
  kI32,
  kI64,
  kU8,
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline Device cpu_device() { return Device{DeviceType::kCPU, 0}; }
inline Device cuda_device(int index = 0) { return Device{DeviceType::kCUDA, index}; }
const char* device_type_name(DeviceType type);

constexpr int kMaxDims = 4;

// A strided view of memory the caller owns. `ndim == 0` means "not given" (optional inputs).
// Strides are in elements, may be any non-negative value; each op documents which
// dimension must be contiguous (usually the last).
struct TensorDesc {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};
  Device device{};

  bool present() const { return ndim > 0; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Element pointer arithmetic; `T` must match the dtype's storage size.
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

// A contiguous (row-major) descriptor over `data`.
TensorDesc make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device = Device{});
TensorDesc make_tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device = Device{});

}  // namespace dsa
