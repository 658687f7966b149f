#include "core/validate.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "dsa/runtime.h"

namespace dsa {
namespace core {

// Plain string building, no iostreams: the library's messages must not depend on the locale
// machinery of whatever C++ runtime a host process (a Python interpreter with torch) loaded.
std::string shape_string(const TensorDesc& t) {
  std::string s = "[";
  for (int i = 0; i < std::min(t.ndim, kMaxDims); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool checked_add(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  return checked_mul(a, b, &r) ? r : std::numeric_limits<int64_t>::max();
}

int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r;
  return checked_add(a, b, &r) ? r : std::numeric_limits<int64_t>::max();
}

bool byte_extent(const TensorDesc& t, int64_t* lo, int64_t* hi) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  int64_t low = 0, high = 0;  // element offsets of the first and last element
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) {
      *lo = *hi = reinterpret_cast<int64_t>(t.data);
      return true;
    }
    int64_t span;
    if (!checked_mul(t.shape[i] - 1, t.stride[i], &span)) return false;
    if (span < 0) {
      if (!checked_add(low, span, &low)) return false;
    } else if (!checked_add(high, span, &high)) {
      return false;
    }
  }
  int64_t blo, bhi;
  if (!checked_mul(low, es, &blo) || !checked_mul(high, es, &bhi) || !checked_add(bhi, es, &bhi)) return false;
  const int64_t base = reinterpret_cast<int64_t>(t.data);
  if (!checked_add(base, blo, lo) || !checked_add(base, bhi, hi)) return false;
  return true;
}

bool self_overlaps(const TensorDesc& t) {
  int idx[kMaxDims];
  int n = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return false;  // no elements
    if (t.shape[i] > 1) idx[n++] = i;
  }
  for (int i = 1; i < n; ++i)  // insertion sort by |stride| (at most kMaxDims entries)
    for (int j = i; j > 0 && std::llabs(t.stride[idx[j]]) < std::llabs(t.stride[idx[j - 1]]); --j) std::swap(idx[j], idx[j - 1]);
  int64_t span = 1;  // elements spanned by the dims smaller than the current one
  for (int k = 0; k < n; ++k) {
    const int64_t s = std::llabs(t.stride[idx[k]]);
    if (s == 0 || s < span) return true;
    int64_t ext;
    if (!checked_mul(s, t.shape[idx[k]] - 1, &ext) || !checked_add(ext, span, &span)) return true;
  }
  return false;
}

bool ranges_overlap(const TensorDesc& a, const TensorDesc& b) {
  if (!a.present() || !b.present() || a.data == nullptr || b.data == nullptr) return false;
  if (a.device != b.device) return false;
  int64_t alo, ahi, blo, bhi;
  if (!byte_extent(a, &alo, &ahi) || !byte_extent(b, &blo, &bhi)) return false;  // reported elsewhere
  if (alo == ahi || blo == bhi) return false;
  return alo < bhi && blo < ahi;
}

static TensorDesc cache_view(void* data, int64_t blocks, int64_t block_bytes, Device dev) {
  TensorDesc t;
  if (data == nullptr || blocks <= 0 || block_bytes <= 0) return t;
  t.data = data;
  t.dtype = DType::kU8;
  t.ndim = 2;
  t.shape[0] = blocks;
  t.shape[1] = block_bytes;
  t.stride[0] = block_bytes;
  t.stride[1] = 1;
  t.device = dev;
  return t;
}

TensorDesc cache_bytes(const MlaCacheDesc& c) { return cache_view(c.data, c.num_blocks, c.block_bytes(), c.device); }
TensorDesc cache_bytes(const IndexerCacheDesc& c) { return cache_view(c.data, c.num_blocks, c.block_bytes(), c.device); }

std::string device_string(Device d) {
  std::string s = device_type_name(d.type);
  if (d.type == DeviceType::kCUDA) s += ":" + std::to_string(d.index);
  return s;
}

void ArgCheck::fail(StatusCode code, const char* name, const std::string& what) {
  if (!status_.ok()) return;
  status_ = Status(code, std::string(op_) + ": " + name + ": " + what);
}

static std::string stride_string(const TensorDesc& t) {
  std::string s = "[";
  for (int i = 0; i < std::min(t.ndim, kMaxDims); ++i) s += (i ? ", " : "") + std::to_string(t.stride[i]);
  return s + "]";
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
  if (t.ndim > kMaxDims) {  // a descriptor no DSA op reads (shape[] holds kMaxDims dims)
    fail(StatusCode::kInvalidArgument, name,
         "expected at most " + std::to_string(kMaxDims) + " dims, got ndim = " + std::to_string(t.ndim));
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
  int64_t numel = 1, lo = 0, hi = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (!checked_mul(numel, t.shape[i], &numel)) {
      fail(StatusCode::kInvalidArgument, name, "expected an element count that fits int64, got shape " + shape_string(t));
      return *this;
    }
  }
  if (!byte_extent(t, &lo, &hi)) {
    fail(StatusCode::kInvalidArgument, name,
         "expected shape x strides to fit the address space, got shape " + shape_string(t) + " and strides " +
             stride_string(t));
    return *this;
  }
  if (numel > 0 && t.data == nullptr) {
    fail(StatusCode::kInvalidArgument, name, "data pointer is null for a non-empty tensor");
  }
  return *this;
}

ArgCheck& ArgCheck::output(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                           std::initializer_list<Dim> dims, bool inner_contiguous) {
  tensor(t, name, dtypes, dims, inner_contiguous);
  if (ok() && self_overlaps(t)) {
    fail(StatusCode::kInvalidArgument, name,
         "expected an output whose elements do not share memory, got shape " + shape_string(t) + " with strides " +
             stride_string(t));
  }
  return *this;
}

ArgCheck& ArgCheck::optional_output(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                                    std::initializer_list<Dim> dims, bool inner_contiguous) {
  if (!ok() || !t.present()) return *this;
  return output(t, name, dtypes, dims, inner_contiguous);
}

ArgCheck& ArgCheck::disjoint(const TensorDesc& out, const char* out_name, const TensorDesc& other,
                             const char* other_name, bool alias_ok) {
  if (!ok() || !ranges_overlap(out, other)) return *this;
  if (alias_ok && out.data == other.data && out.dtype == other.dtype && out.ndim == other.ndim) {
    bool same = true;
    for (int i = 0; i < out.ndim; ++i) same &= out.shape[i] == other.shape[i] && out.stride[i] == other.stride[i];
    if (same) return *this;
  }
  fail(StatusCode::kInvalidArgument, out_name,
       std::string("expected an output that does not share memory with ") + other_name +
           (alias_ok ? " (only exact aliasing is allowed)" : ""));
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
  } else if (saturating_mul(saturating_mul(c.num_blocks, c.page_size), c.token_bytes()) == std::numeric_limits<int64_t>::max() ||
             saturating_mul(c.num_blocks, c.block_bytes()) == std::numeric_limits<int64_t>::max()) {
    fail(StatusCode::kInvalidArgument, name,
         "expected num_blocks x page_size x token bytes to fit int64, got num_blocks " + std::to_string(c.num_blocks) +
             ", page_size " + std::to_string(c.page_size));
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
  } else if (saturating_mul(saturating_mul(c.num_blocks, c.page_size), kIndexerTokenBytes) == std::numeric_limits<int64_t>::max() ||
             saturating_mul(c.num_blocks, c.block_bytes()) == std::numeric_limits<int64_t>::max()) {
    fail(StatusCode::kInvalidArgument, name,
         "expected num_blocks x page_size x 132 bytes to fit int64, got num_blocks " + std::to_string(c.num_blocks) +
             ", page_size " + std::to_string(c.page_size));
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

ArgCheck& ArgCheck::require(bool cond, const char* name, const char* expectation) {
  if (ok() && !cond) fail(StatusCode::kInvalidArgument, name, expectation);
  return *this;
}

Status pick_device(const char* op, std::initializer_list<NamedTensor> tensors,
                   Device* device, std::initializer_list<const Device*> extra) {
  bool have = false;
  Device d{};
  const char* first = nullptr;
  for (const NamedTensor& nt : tensors) {
    const TensorDesc* t = nt.t;
    if (t == nullptr || !t->present()) continue;
    if (!have) {
      d = t->device;
      have = true;
      first = nt.name;
      continue;
    }
    if (t->device != d) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": " + nt.name + ": expected on " + device_string(d) + " like " + first +
                        ", got " + device_string(t->device) + " (tensors on different devices; expected all on one device)");
    }
  }
  for (const Device* x : extra) {
    if (x == nullptr) continue;
    if (!have) {
      d = *x;
      have = true;
      continue;
    }
    if (*x != d) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(op) + ": cache: expected on " + device_string(d) + " like " +
                        (first ? first : "the tensors") + ", got " + device_string(*x) +
                        " (tensors on different devices; expected all on one device)");
    }
  }
  *device = d;
#if !defined(DSA_WITH_CUDA)
  // The build decides the backends (what compiled_backends() lists): known at compile time,
  // so no op pays for building that list.
  if (d.type == DeviceType::kCUDA) {
    return Status(StatusCode::kUnsupported,
                  std::string(op) + ": tensors are on " + device_string(d) +
                      ", but this build of DSA has only the cpu backend (rebuild with "
                      "-DDSA_CUDA=ON)");
  }
#endif
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
    case StatusCode::kOutOfMemory:
      return Status(code, std::string(op) + ": a host allocation failed on " + where + " (out of memory)");
    default:
      return Status(code, std::string(op) + ": internal error on " + where);
  }
}

}  // namespace core
}  // namespace dsa
