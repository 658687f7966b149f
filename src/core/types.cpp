#include "dsa/types.h"

#include "dsa/cache.h"

namespace dsa {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kE4M3: return "e4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kE4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* device_type_name(DeviceType type) {
  return type == DeviceType::kCUDA ? "cuda" : "cpu";
}

int64_t TensorDesc::numel() const {
  if (ndim <= 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorDesc::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] > 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

TensorDesc make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device) {
  TensorDesc t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(shape.size() > kMaxDims ? kMaxDims : shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (i >= kMaxDims) break;
    t.shape[i++] = s;
  }
  int64_t st = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = st;
    st *= t.shape[d];
  }
  return t;
}

TensorDesc make_tensor(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device) {
  return make_tensor(const_cast<void*>(data), dtype, shape, device);
}

const char* mla_cache_dtype_name(MlaCacheDtype d) {
  return d == MlaCacheDtype::kFP8 ? "fp8" : "bf16";
}

}  // namespace dsa
