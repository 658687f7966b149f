#include "core/validate.h"


#include "dsa/runtime.h"

namespace dsa {
namespace core {

// Plain string building, no iostreams: the library's messages must not depend on the locale
// machinery of whatever C++ runtime a host process (a Python interpreter with torch) loaded.
std::string shape_string(const TensorDesc& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string device_string(Device d) {
  std::string s = device_type_name(d.type);
  if (d.type == DeviceType::kCUDA) s += ":" + std::to_string(d.index);
  return s;
}

void ArgCheck::fail(StatusCode code, const char* name, const std::string& what) {
  if (!status_.ok()) return;
  status_ = Status(code, std::string(op_) + ": " + name + ": " + what);
}

static std::string dims_string(std::initializer_list<Dim> dims, bool labels) {
  std::string s = "[";
  bool first = true;
  for (const Dim& d : dims) {
    s += first ? "" : ", ";
    first = false;
    if (labels && d.label) s += d.label;
    else if (d.value >= 0) s += std::to_string(d.value);
    else s += "any";
  }
  return s + "]";
}

ArgCheck& ArgCheck::tensor(const TensorDesc& t, const char* name,
                           std::initializer_list<DType> dtypes,
                           std::initializer_list<Dim> dims, bool inner_contiguous) {
  if (!ok()) return *this;
  if (!t.present()) {
    fail(StatusCode::kInvalidArgument, name,
         "is required (expected a tensor of shape " + dims_string(dims, true) + ")");
    return *this;
  }
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= (d == t.dtype);
  if (!dtype_ok) {
    std::string want;  // built only on failure: a passing check allocates nothing
    for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail(StatusCode::kInvalidArgument, name,
         "expected dtype " + want + ", got " + dtype_name(t.dtype));
    return *this;
  }
  bool shape_ok = t.ndim == static_cast<int>(dims.size());
  if (shape_ok) {
    int i = 0;
    for (const Dim& d : dims) {
      if (t.shape[i] < 0 || (d.value >= 0 && t.shape[i] != d.value)) shape_ok = false;
      ++i;
    }
  }
  if (!shape_ok) {
    bool has_labels = false;
    for (const Dim& d : dims) has_labels |= d.label != nullptr;
    std::string expect = dims_string(dims, true);
    if (has_labels) expect += " = " + dims_string(dims, false);
    fail(StatusCode::kInvalidArgument, name,
         "expected shape " + expect + ", got " + shape_string(t));
    return *this;
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.stride[i] < 0) {
      fail(StatusCode::kInvalidArgument, name,
           "expected non-negative strides, got stride " + std::to_string(t.stride[i]) +
               " in dim " + std::to_string(i));
      return *this;
    }
  }
  if (inner_contiguous && t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1) {
    fail(StatusCode::kInvalidArgument, name,
         "expected the last dim to be contiguous (stride 1), got stride " +
             std::to_string(t.stride[t.ndim - 1]));
    return *this;
  }
  if (t.numel() > 0 && t.data == nullptr) {
    fail(StatusCode::kInvalidArgument, name, "data pointer is null for a non-empty tensor");
  }
  return *this;
}

ArgCheck& ArgCheck::optional(const TensorDesc& t, const char* name,
                             std::initializer_list<DType> dtypes,
                             std::initializer_list<Dim> dims, bool inner_contiguous) {
  if (!ok() || !t.present()) return *this;
  return tensor(t, name, dtypes, dims, inner_contiguous);
}

ArgCheck& ArgCheck::aligned(const TensorDesc& t, const char* name, int64_t bytes) {
  if (!ok() || !t.present() || t.numel() == 0) return *this;
  int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(bytes) != 0) {
    fail(StatusCode::kInvalidArgument, name,
         "expected the data pointer aligned to " + std::to_string(bytes) + " bytes");
    return *this;
  }
  for (int i = 0; i + 1 < t.ndim; ++i) {
    if (t.shape[i] > 1 && (t.stride[i] * es) % bytes != 0) {
      fail(StatusCode::kInvalidArgument, name,
           "expected stride of dim " + std::to_string(i) + " to be a multiple of " +
               std::to_string(bytes) + " bytes, got " + std::to_string(t.stride[i] * es));
      return *this;
    }
  }
  return *this;
}

ArgCheck& ArgCheck::mla_cache(const MlaCacheDesc& c, const char* name) {
  if (!ok()) return *this;
  if (c.data == nullptr || c.num_blocks <= 0) {
    fail(StatusCode::kInvalidArgument, name, "expected a cache with data and num_blocks > 0");
  } else if (c.page_size <= 0) {
    fail(StatusCode::kInvalidArgument, name,
         "expected page_size > 0, got " + std::to_string(c.page_size));
  } else if (c.dtype != MlaCacheDtype::kBF16 && c.dtype != MlaCacheDtype::kFP8) {
    fail(StatusCode::kInvalidArgument, name, "expected dtype bf16 or fp8");
  } else if (c.block_stride_bytes != 0 && c.block_stride_bytes < c.page_size * c.token_bytes()) {
    fail(StatusCode::kInvalidArgument, name,
         "expected block_stride_bytes 0 or >= page_size * " + std::to_string(c.token_bytes()) +
             " = " + std::to_string(c.page_size * c.token_bytes()) + ", got " +
             std::to_string(c.block_stride_bytes));
  } else if (reinterpret_cast<uintptr_t>(c.data) % 16 != 0 || c.block_bytes() % 16 != 0) {
    fail(StatusCode::kInvalidArgument, name,
         "expected data and block stride aligned to 16 bytes");
  }
  return *this;
}

ArgCheck& ArgCheck::indexer_cache(const IndexerCacheDesc& c, const char* name) {
  if (!ok()) return *this;
  if (c.data == nullptr || c.num_blocks <= 0) {
    fail(StatusCode::kInvalidArgument, name, "expected a cache with data and num_blocks > 0");
  } else if (c.page_size <= 0 || c.page_size % 4 != 0) {
    fail(StatusCode::kInvalidArgument, name,
         "expected page_size > 0 and a multiple of 4, got " + std::to_string(c.page_size));
  } else if (c.block_stride_bytes != 0 && c.block_stride_bytes < c.page_size * kIndexerTokenBytes) {
    fail(StatusCode::kInvalidArgument, name,
         "expected block_stride_bytes 0 or >= page_size * 132 = " +
             std::to_string(c.page_size * kIndexerTokenBytes) + ", got " +
             std::to_string(c.block_stride_bytes));
  } else if (reinterpret_cast<uintptr_t>(c.data) % 16 != 0 || c.block_bytes() % 16 != 0) {
    fail(StatusCode::kInvalidArgument, name,
         "expected data and block stride aligned to 16 bytes");
  }
  return *this;
}

ArgCheck& ArgCheck::require(bool cond, const char* name, const std::string& expectation) {
  if (ok() && !cond) fail(StatusCode::kInvalidArgument, name, expectation);
  return *this;
}

Status pick_device(const char* op, std::initializer_list<const TensorDesc*> tensors,
                   Device* device, std::initializer_list<const Device*> extra) {
  bool have = false;
  Device d{};
  auto see = [&](Device x) -> bool {
    if (!have) { d = x; have = true; return true; }
    return x == d;
  };
  for (const TensorDesc* t : tensors) {
    if (t == nullptr || !t->present()) continue;
    if (!see(t->device)) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": tensors are on different devices (" +
                        device_string(d) + " and " + device_string(t->device) +
                        "); expected all on one device");
    }
  }
  for (const Device* x : extra) {
    if (x == nullptr) continue;
    if (!see(*x)) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": the cache is on " + device_string(*x) +
                        " but the tensors are on " + device_string(d) +
                        "; expected all on one device");
    }
  }
  *device = d;
  if (d.type == DeviceType::kCUDA) {
    bool compiled = false;
    for (const auto& b : compiled_backends()) compiled |= (b == "cuda");
    if (!compiled) {
      return Status(StatusCode::kUnsupported,
                    std::string(op) + ": tensors are on " + device_string(d) +
                        ", but this build of DSA has only the cpu backend (rebuild with "
                        "-DDSA_CUDA=ON)");
    }
  }
  return Status::Ok();
}

Status backend_status(const char* op, Device device, StatusCode code) {
  if (code == StatusCode::kOk) return Status::Ok();
  std::string where = device_string(device);
  switch (code) {
    case StatusCode::kUnsupported:
      return Status(code, std::string(op) + ": no " + where + " kernel supports these arguments");
    case StatusCode::kWorkspaceTooSmall:
      return Status(code, std::string(op) + ": workspace: smaller than the op's workspace_size query");
    case StatusCode::kDeviceError:
      return Status(code, std::string(op) + ": the " + where + " runtime reported an error");
    case StatusCode::kInvalidArgument:
      return Status(code, std::string(op) + ": an input's contents are out of range on " + where);
    default:
      return Status(code, std::string(op) + ": internal error on " + where);
  }
}

}  // namespace core
}  // namespace dsa
