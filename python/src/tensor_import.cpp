#include "tensor_import.h"

#include <pybind11/numpy.h>

#include <cstddef>

#include "dlpack_abi.h"

#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
// Our declaration of the ABI must match the system's, field for field.
static_assert(sizeof(dsa_py::dl::Tensor) == sizeof(DLTensor), "DLTensor layout");
static_assert(offsetof(dsa_py::dl::Tensor, strides) == offsetof(DLTensor, strides), "DLTensor layout");
static_assert(offsetof(dsa_py::dl::Tensor, byte_offset) == offsetof(DLTensor, byte_offset), "DLTensor layout");
static_assert(sizeof(dsa_py::dl::ManagedTensor) == sizeof(DLManagedTensor), "DLManagedTensor layout");
static_assert(offsetof(dsa_py::dl::ManagedTensor, deleter) == offsetof(DLManagedTensor, deleter), "DLManagedTensor layout");
static_assert(static_cast<int>(dsa_py::dl::kBfloat) == static_cast<int>(kDLBfloat) &&
                  static_cast<int>(dsa_py::dl::kCUDA) == static_cast<int>(kDLCUDA),
              "DLPack codes");
#endif

namespace dsa_py {

void throw_type_error(const std::string& msg) { throw py::type_error(msg); }
void throw_value_error(const std::string& msg) { throw py::value_error(msg); }

namespace {

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__module__")).cast<std::string>() + "." +
         py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

bool is_numpy_array(py::handle obj) {
  // Only ask pybind11's numpy API (which imports numpy) once numpy is loaded: an object can
  // only be an ndarray if it is.
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static py::handle modules = py::object(py::module_::import("sys").attr("modules")).release();
  if (PyDict_GetItemString(modules.ptr(), "numpy") == nullptr) return false;
  return py::isinstance<py::array>(obj);
}

SrcType numpy_src(const py::dtype& dt, std::string* name) {
  *name = py::str(dt.attr("name")).cast<std::string>();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (*name == "bfloat16") return SrcType::kBF16;       // ml_dtypes
  if (*name == "float8_e4m3fn") return SrcType::kE4M3;  // ml_dtypes
  if (kind == 'f' && size == 4) return SrcType::kF32;
  if (kind == 'u' && size == 2) return SrcType::kU16;
  if (kind == 'u' && size == 1) return SrcType::kU8;
  if (kind == 'i' && size == 4) return SrcType::kI32;
  if (kind == 'i' && size == 8) return SrcType::kI64;
  return SrcType::kOther;
}

SrcType dlpack_src(const dl::DataType& t, std::string* name) {
  const int bits = t.bits;
  switch (t.code) {
    case dl::kInt: *name = "int" + std::to_string(bits); break;
    case dl::kUInt: *name = "uint" + std::to_string(bits); break;
    case dl::kFloat: *name = "float" + std::to_string(bits); break;
    case dl::kBfloat: *name = "bfloat" + std::to_string(bits); break;
    case dl::kBool: *name = "bool"; break;
    case dl::kFloat8_e4m3fn: *name = "float8_e4m3fn"; break;
    default: *name = "DLPack type code " + std::to_string(t.code) + " (" + std::to_string(bits) + " bits)";
  }
  if (t.lanes != 1) {
    *name += " x" + std::to_string(t.lanes) + " lanes";
    return SrcType::kOther;
  }
  if (t.code == dl::kFloat && bits == 32) return SrcType::kF32;
  if (t.code == dl::kBfloat && bits == 16) return SrcType::kBF16;
  if (t.code == dl::kFloat8_e4m3fn && bits == 8) return SrcType::kE4M3;
  if (t.code == dl::kUInt && bits == 16) return SrcType::kU16;
  if (t.code == dl::kUInt && bits == 8) return SrcType::kU8;
  if (t.code == dl::kInt && bits == 32) return SrcType::kI32;
  if (t.code == dl::kInt && bits == 64) return SrcType::kI64;
  return SrcType::kOther;
}

std::string shape_str(const Imported& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

}  // namespace

Imported Importer::raw(py::handle obj, const char* name, bool writable) {
  Imported t;
  if (obj.is_none()) throw_value_error(prefix(name) + ": is required");
  if (is_numpy_array(obj)) {
    auto arr = py::reinterpret_borrow<py::array>(obj);
    t.src = numpy_src(arr.dtype(), &t.src_name);
    t.itemsize = static_cast<int64_t>(arr.itemsize());
    const std::string order = py::str(arr.dtype().attr("byteorder")).cast<std::string>();
    if (order == ">") throw_type_error(prefix(name) + ": expected native byte order, got a big-endian " + t.src_name + " array");
    if (arr.ndim() > dsa::kMaxDims) {
      throw_value_error(prefix(name) + ": expected at most " + std::to_string(dsa::kMaxDims) +
                        " dims, got " + std::to_string(arr.ndim()));
    }
    t.ndim = static_cast<int>(arr.ndim());
    for (int i = 0; i < t.ndim; ++i) {
      t.shape[i] = static_cast<int64_t>(arr.shape(i));
      const int64_t bytes = static_cast<int64_t>(arr.strides(i));
      if (bytes % t.itemsize != 0) {
        throw_value_error(prefix(name) + ": expected strides that are whole elements, got " +
                          std::to_string(bytes) + " bytes in dim " + std::to_string(i) +
                          " for " + std::to_string(t.itemsize) + "-byte elements");
      }
      t.stride[i] = bytes / t.itemsize;
    }
    t.data = const_cast<void*>(arr.data());
    t.readonly = !arr.writeable();
    t.device = dsa::cpu_device();
    keep_.push_back(py::reinterpret_borrow<py::object>(obj));
  } else if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    py::object capsule;
    int32_t dev_type = 0;
    try {
      py::tuple dev = obj.attr("__dlpack_device__")();
      dev_type = dev[0].cast<int32_t>();
      if (dev_type == dl::kCUDA || dev_type == dl::kCUDAManaged) {
        // DLPack reserves 0; 1 names the legacy default stream.
        const uintptr_t s = stream_ == 0 ? 1 : stream_;
        capsule = obj.attr("__dlpack__")(py::arg("stream") = s);
      } else {
        capsule = obj.attr("__dlpack__")();
      }
    } catch (py::error_already_set& e) {
      throw_type_error(prefix(name) + ": could not export it through DLPack (" + e.what() + ")");
    }
    if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
      throw_type_error(prefix(name) + ": __dlpack__ returned no unconsumed \"dltensor\" capsule");
    }
    auto* mt = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    const dl::Tensor& d = mt->dl_tensor;
    t.src = dlpack_src(d.dtype, &t.src_name);
    if (d.dtype.bits % 8 != 0) throw_type_error(prefix(name) + ": unsupported dtype " + t.src_name);
    t.itemsize = (d.dtype.bits / 8) * d.dtype.lanes;
    if (d.ndim > dsa::kMaxDims) {
      throw_value_error(prefix(name) + ": expected at most " + std::to_string(dsa::kMaxDims) +
                        " dims, got " + std::to_string(d.ndim));
    }
    t.ndim = d.ndim;
    int64_t compact = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[i] = d.shape[i];
      t.stride[i] = d.strides ? d.strides[i] : compact;
      compact *= d.shape[i];
    }
    t.data = static_cast<char*>(d.data) + d.byte_offset;
    switch (dev_type == 0 ? d.device.device_type : dev_type) {
      case dl::kCPU:
      case dl::kCUDAHost: t.device = dsa::cpu_device(); break;
      case dl::kCUDA:
      case dl::kCUDAManaged: t.device = dsa::cuda_device(d.device.device_id); break;
      default:
        throw_type_error(prefix(name) + ": expected a CPU or CUDA tensor, got DLPack device type " +
                         std::to_string(d.device.device_type));
    }
    // The capsule stays unconsumed: its destructor (the producer's) releases the tensor when
    // we drop it after the call.
    keep_.push_back(capsule);
  } else {
    throw_type_error(prefix(name) + ": expected an array or tensor (numpy, torch, CuPy or any "
                     "DLPack producer), got " + type_name(obj));
  }
  // An empty tensor's strides mean nothing (numpy reports 0 for some); give it compact ones.
  bool empty = false;
  for (int i = 0; i < t.ndim; ++i) empty |= t.shape[i] == 0;
  if (empty) {
    int64_t compact = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.stride[i] = compact;
      compact *= t.shape[i] > 0 ? t.shape[i] : 1;
    }
  }
  if (writable && t.readonly) throw_value_error(prefix(name) + ": the array is read-only, but the op writes into it");
  return t;
}

dsa::TensorDesc Importer::tensor(py::handle obj, const char* name, Reinterpret how, bool writable) {
  dsa::TensorDesc d;
  if (obj.is_none()) return d;
  Imported t = raw(obj, name, writable);
  switch (t.src) {
    case SrcType::kF32: d.dtype = dsa::DType::kF32; break;
    case SrcType::kBF16: d.dtype = dsa::DType::kBF16; break;
    case SrcType::kE4M3: d.dtype = dsa::DType::kE4M3; break;
    case SrcType::kI32: d.dtype = dsa::DType::kI32; break;
    case SrcType::kI64: d.dtype = dsa::DType::kI64; break;
    case SrcType::kU8: d.dtype = how == Reinterpret::kE4M3 ? dsa::DType::kE4M3 : dsa::DType::kU8; break;
    case SrcType::kU16:
      if (how != Reinterpret::kBF16) {
        throw_type_error(prefix(name) + ": got uint16, which DSA reads as bf16 bits only where "
                         "the argument takes bf16");
      }
      d.dtype = dsa::DType::kBF16;
      break;
    case SrcType::kOther:
      throw_type_error(prefix(name) + ": unsupported dtype " + t.src_name +
                       " (DSA takes float32, bfloat16 or its uint16 bits, float8_e4m3fn or its "
                       "uint8 bits, int32, int64)");
  }
  if (t.ndim == 0) {
    throw_value_error(prefix(name) + ": expected a tensor with at least one dim, got a scalar");
  }
  d.data = t.data;
  d.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) {
    d.shape[i] = t.shape[i];
    d.stride[i] = t.stride[i];
  }
  d.device = t.device;
  return d;
}

// A cache's block stride must be positive: dsa::*CacheDesc reads 0 as "packed", so a zero
// (broadcast) or negative stride would otherwise be read as a different, larger cache.
void check_block_stride(const Imported& t, const std::string& n) {
  if (t.ndim >= 2 && t.shape[0] > 1 && t.stride[0] <= 0) {
    throw_value_error(n + ": expected a positive stride between blocks (dim 0), got " + std::to_string(t.stride[0]) +
                      " elements (a broadcast or reversed view is not a cache)");
  }
  for (int i = 1; i < t.ndim; ++i) {
    if (t.shape[i] > 1 && t.stride[i] <= 0) {
      throw_value_error(n + ": expected positive strides within a block, got " + std::to_string(t.stride[i]) +
                        " in dim " + std::to_string(i));
    }
  }
}

dsa::MlaCacheDesc Importer::mla_cache(py::handle obj, const char* name, int cache_dtype, int64_t page_size,
                                      bool writable) {
  Imported t = raw(obj, name, writable);
  dsa::MlaCacheDesc c;
  const std::string n = prefix(name);
  check_block_stride(t, n);
  if (t.ndim == 3) {
    const int64_t row_bytes = t.shape[2] * t.itemsize;
    if ((t.shape[2] > 1 && t.stride[2] != 1) || (t.shape[1] > 1 && t.stride[1] != t.shape[2])) {
      throw_value_error(n + ": expected contiguous pages ([num_blocks, page_size, token] with strides "
                        "[any, token, 1]), got strides [" + std::to_string(t.stride[0]) + ", " +
                        std::to_string(t.stride[1]) + ", " + std::to_string(t.stride[2]) + "]");
    }
    dsa::MlaCacheDtype inferred;
    if (row_bytes == dsa::kMlaBf16TokenBytes) inferred = dsa::MlaCacheDtype::kBF16;
    else if (row_bytes == dsa::kMlaFp8TokenBytes) inferred = dsa::MlaCacheDtype::kFP8;
    else {
      throw_value_error(n + ": expected " + std::to_string(dsa::kMlaBf16TokenBytes) + " bytes (bf16) or " +
                        std::to_string(dsa::kMlaFp8TokenBytes) + " bytes (fp8) per token in the last dim, got " +
                        std::to_string(t.shape[2]) + " x " + std::to_string(t.itemsize) + " bytes (shape " +
                        shape_str(t) + ")");
    }
    if (cache_dtype >= 0 && cache_dtype != static_cast<int>(inferred)) {
      throw_value_error(n + ": cache_dtype " + std::string(cache_dtype == 1 ? "fp8" : "bf16") +
                        " does not match the token width " + std::to_string(row_bytes) + " bytes of shape " + shape_str(t));
    }
    if (page_size > 0 && page_size != t.shape[1]) {
      throw_value_error(n + ": page_size " + std::to_string(page_size) + " does not match the cache's dim 1 (" +
                        std::to_string(t.shape[1]) + ")");
    }
    c.dtype = inferred;
    c.page_size = t.shape[1];
    c.block_stride_bytes = t.shape[0] > 1 ? t.stride[0] * t.itemsize : 0;
  } else if (t.ndim == 2) {
    c.dtype = cache_dtype >= 0 ? static_cast<dsa::MlaCacheDtype>(cache_dtype) : dsa::MlaCacheDtype::kBF16;
    c.page_size = page_size > 0 ? page_size : dsa::kDefaultPageSize;
    if (t.shape[1] > 1 && t.stride[1] != 1) {
      throw_value_error(n + ": expected each block contiguous (stride 1 in dim 1), got stride " + std::to_string(t.stride[1]));
    }
    const int64_t need = c.page_size * c.token_bytes();
    if (t.shape[1] * t.itemsize < need) {
      throw_value_error(n + ": expected at least page_size x " + std::to_string(c.token_bytes()) + " = " +
                        std::to_string(need) + " bytes per block, got " + std::to_string(t.shape[1] * t.itemsize));
    }
    c.block_stride_bytes = t.shape[0] > 1 ? t.stride[0] * t.itemsize : 0;
  } else {
    throw_value_error(n + ": expected a paged cache [num_blocks, page_size, token] or [num_blocks, block_bytes], got shape " +
                      shape_str(t));
  }
  if (c.block_stride_bytes != 0 && c.block_stride_bytes < c.page_size * c.token_bytes()) {
    throw_value_error(n + ": blocks overlap (stride of dim 0 is " + std::to_string(c.block_stride_bytes) + " bytes, a page needs " +
                      std::to_string(c.page_size * c.token_bytes()) + ")");
  }
  c.data = t.data;
  c.num_blocks = t.shape[0];
  c.device = t.device;
  if (c.num_blocks <= 0) throw_value_error(n + ": expected num_blocks > 0, got shape " + shape_str(t));
  return c;
}

dsa::IndexerCacheDesc Importer::indexer_cache(py::handle obj, const char* name, int64_t page_size,
                                              bool writable) {
  Imported t = raw(obj, name, writable);
  dsa::IndexerCacheDesc c;
  const std::string n = prefix(name);
  check_block_stride(t, n);
  if (t.ndim == 3) {
    if (t.shape[2] * t.itemsize != dsa::kIndexerTokenBytes) {
      throw_value_error(n + ": expected " + std::to_string(dsa::kIndexerTokenBytes) +
                        " bytes per token in the last dim, got shape " + shape_str(t));
    }
    if ((t.shape[2] > 1 && t.stride[2] != 1) || (t.shape[1] > 1 && t.stride[1] != t.shape[2])) {
      throw_value_error(n + ": expected contiguous pages ([num_blocks, page_size, 132] with strides [any, 132, 1])");
    }
    if (page_size > 0 && page_size != t.shape[1]) {
      throw_value_error(n + ": page_size " + std::to_string(page_size) + " does not match the cache's dim 1 (" +
                        std::to_string(t.shape[1]) + ")");
    }
    c.page_size = t.shape[1];
  } else if (t.ndim == 2) {
    c.page_size = page_size > 0 ? page_size : dsa::kDefaultPageSize;
    if (t.shape[1] > 1 && t.stride[1] != 1) {
      throw_value_error(n + ": expected each block contiguous (stride 1 in dim 1), got stride " + std::to_string(t.stride[1]));
    }
    if (t.shape[1] * t.itemsize < c.page_size * dsa::kIndexerTokenBytes) {
      throw_value_error(n + ": expected at least page_size x 132 = " + std::to_string(c.page_size * dsa::kIndexerTokenBytes) +
                        " bytes per block, got " + std::to_string(t.shape[1] * t.itemsize));
    }
  } else {
    throw_value_error(n + ": expected a paged cache [num_blocks, page_size, 132] or [num_blocks, block_bytes], got shape " +
                      shape_str(t));
  }
  c.block_stride_bytes = t.shape[0] > 1 ? t.stride[0] * t.itemsize : 0;
  if (c.block_stride_bytes != 0 && c.block_stride_bytes < c.page_size * dsa::kIndexerTokenBytes) {
    throw_value_error(n + ": blocks overlap (stride of dim 0 is " + std::to_string(c.block_stride_bytes) + " bytes, a page needs " +
                      std::to_string(c.page_size * dsa::kIndexerTokenBytes) + ")");
  }
  c.data = t.data;
  c.num_blocks = t.shape[0];
  c.device = t.device;
  if (c.num_blocks <= 0) throw_value_error(n + ": expected num_blocks > 0, got shape " + shape_str(t));
  return c;
}

}  // namespace dsa_py
