// Turning Python array objects into dsa::TensorDesc without copying: numpy arrays through
// their buffer description, everything else (torch, CuPy, JAX, ...) through DLPack.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsa/cache.h"
#include "dsa/types.h"

namespace dsa_py {

namespace py = pybind11;

// How integer storage is read where the op expects a float format that the caller's
// framework may lack: uint16 as bf16 bits, uint8 as e4m3 bits.
enum class Reinterpret { kNone, kBF16, kE4M3 };

// Element formats a framework hands over, before they are mapped onto dsa::DType.
enum class SrcType { kF32, kBF16, kE4M3, kU16, kU8, kI32, kI64, kOther };

// An imported view: the descriptor plus the Python objects that keep its memory alive
// (a numpy array or a DLPack capsule) for as long as the call runs.
struct Imported {
  void* data = nullptr;
  SrcType src = SrcType::kOther;
  std::string src_name;  // "float64", ... for messages
  int64_t itemsize = 0;
  int ndim = 0;
  int64_t shape[dsa::kMaxDims] = {0, 0, 0, 0};
  int64_t stride[dsa::kMaxDims] = {0, 0, 0, 0};  // in elements
  dsa::Device device{};
  bool readonly = false;
};

class Importer {
 public:
  // stream: the CUDA stream the op will run on (0: legacy default); passed to producers'
  // __dlpack__ so they order their pending work before it.
  // op: the op's name, which every message starts with.
  Importer(const char* op, uintptr_t stream) : op_(op), stream_(stream) {}

  // Raw import: any element type. Raises TypeError/ValueError naming `name`.
  Imported raw(py::handle obj, const char* name, bool writable = false);
  // A tensor argument of an op: None gives a "not given" descriptor.
  dsa::TensorDesc tensor(py::handle obj, const char* name, Reinterpret how = Reinterpret::kNone,
                         bool writable = false);
  // A paged MLA cache tensor: [num_blocks, page_size, token_bytes / itemsize] (any element
  // type; 576 bf16/uint16, 1152 uint8 or 656 uint8 per token), or [num_blocks, bytes] with
  // page_size given. cache_dtype: -1 infer from the token width, else dsa::MlaCacheDtype.
  dsa::MlaCacheDesc mla_cache(py::handle obj, const char* name, int cache_dtype, int64_t page_size,
                              bool writable = false);
  // A paged indexer K cache: [num_blocks, page_size, 132] uint8 or [num_blocks, bytes].
  dsa::IndexerCacheDesc indexer_cache(py::handle obj, const char* name, int64_t page_size,
                                      bool writable = false);

  const char* op() const { return op_; }

 private:
  std::string prefix(const char* name) const { return std::string(op_) + ": " + name; }
  const char* op_;
  uintptr_t stream_;
  std::vector<py::object> keep_;
};

[[noreturn]] void throw_type_error(const std::string& msg);
[[noreturn]] void throw_value_error(const std::string& msg);

}  // namespace dsa_py
