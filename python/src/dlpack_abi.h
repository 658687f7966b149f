// The DLPack C ABI (https://dmlc.github.io/dlpack/latest/c_api.html), the unversioned
// "dltensor" capsule form that every producer (numpy >= 1.22, torch, CuPy, JAX) still returns
// when __dlpack__ is called without max_version. Declared here from the published ABI so the
// module builds where no dlpack.h is installed (the GPU machine); tensor_import.cpp checks the
// layout against the system header when there is one.
#pragma once
#include <cstdint>

namespace dsa_py {
namespace dl {

enum DeviceType : int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,       // pinned host memory: readable by the CPU backend
  kCUDAManaged = 13,
};

enum TypeCode : uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kBool = 6,            // DLPack >= 1.0
  kFloat8_e4m3fn = 10,  // DLPack >= 1.1 (absent from Debian's dlpack.h 0.6)
};

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL: compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace dl
}  // namespace dsa_py
