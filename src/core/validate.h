// Argument checking at the API boundary (tier 2 of the error model): every failure names the
// op, the argument and what was expected.
#pragma once
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>
#include <utility>

#include "dsa/cache.h"
#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {
namespace core {

// One expected dimension: a value (-1: any) and an optional symbolic name for messages.
struct Dim {
  int64_t value = -1;
  const char* label = nullptr;
  Dim(int64_t v) : value(v) {}                      // NOLINT: implicit by design
  Dim(int64_t v, const char* l) : value(v), label(l) {}
  Dim(const char* l) : value(-1), label(l) {}       // NOLINT
};

std::string shape_string(const TensorDesc& t);

// Overflow-checked size arithmetic: every product or sum of sizes (elements, bytes, rows)
// that user values reach goes through these. They return false (and leave *out alone) when
// the exact result does not fit int64.
bool checked_mul(int64_t a, int64_t b, int64_t* out);
bool checked_add(int64_t a, int64_t b, int64_t* out);
// a * b, saturating at INT64_MAX for non-negative inputs (sizes compared against limits).
int64_t saturating_mul(int64_t a, int64_t b);
int64_t saturating_add(int64_t a, int64_t b);

// The byte range [lo, hi) a strided tensor touches (empty: lo == hi). False when the extent
// overflows int64.
bool byte_extent(const TensorDesc& t, int64_t* lo, int64_t* hi);
// True when two elements of t share memory (a zero stride on a dim of extent > 1, or strides
// that interleave). Sufficient test: strides sorted by size, each >= the span of the smaller ones.
bool self_overlaps(const TensorDesc& t);
// True when the byte ranges of a and b intersect (both present and non-empty).
bool ranges_overlap(const TensorDesc& a, const TensorDesc& b);

// Runs f(), turning an exception that escaped it into a status (std::bad_alloc:
// kOutOfMemory; anything else: kInternal) that names `op`. The API boundary's last guard.
template <typename F>
Status guarded(const char* op, F&& f);

// Collects the first failure; later checks are skipped once one failed.
class ArgCheck {
 public:
  explicit ArgCheck(const char* op) : op_(op) {}

  // A required tensor: dtype in `dtypes`, ndim == dims.size(), each dim matching, the last dim
  // contiguous (stride 1) when inner_contiguous, non-negative strides, non-null data when it
  // has elements.
  ArgCheck& tensor(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                   std::initializer_list<Dim> dims, bool inner_contiguous = true);
  // The same, but a tensor that is not present passes.
  ArgCheck& optional(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                     std::initializer_list<Dim> dims, bool inner_contiguous = true);
  // data pointer aligned to `bytes` and every stride but the last a multiple of bytes/elem.
  ArgCheck& aligned(const TensorDesc& t, const char* name, int64_t bytes);
  ArgCheck& mla_cache(const MlaCacheDesc& c, const char* name);
  ArgCheck& indexer_cache(const IndexerCacheDesc& c, const char* name);
  // An output tensor: as tensor(), and no two of its elements may share memory (a zero stride
  // on a dim of extent > 1, or strides that interleave).
  ArgCheck& output(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                   std::initializer_list<Dim> dims, bool inner_contiguous = true);
  ArgCheck& optional_output(const TensorDesc& t, const char* name, std::initializer_list<DType> dtypes,
                            std::initializer_list<Dim> dims, bool inner_contiguous = true);
  // An output must not share memory with another argument (an input or another output).
  // Exact aliasing (same data, shape and strides) passes when `alias_ok` (ops documented to
  // work in place).
  ArgCheck& disjoint(const TensorDesc& out, const char* out_name, const TensorDesc& other,
                     const char* other_name, bool alias_ok = false);
  // A free-form condition: on failure "op: name: expectation".
  ArgCheck& require(bool cond, const char* name, const std::string& expectation);
  // The same for a literal expectation, and for one built by `what()` (a callable returning
  // std::string): the message is made only when the check fails, so a passing op allocates
  // nothing (these checks run on every launch of a layer step).
  ArgCheck& require(bool cond, const char* name, const char* expectation);
  template <typename F, typename = decltype(std::string(std::declval<F&>()()))>
  ArgCheck& require(bool cond, const char* name, F&& what) {
    if (ok() && !cond) fail(StatusCode::kInvalidArgument, name, what());
    return *this;
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const char* op() const { return op_; }

 private:
  void fail(StatusCode code, const char* name, const std::string& what);
  const char* op_;
  Status status_;
};

// Every present tensor must be on one device; that device picks the backend. Fails with
// kUnsupported when the device's backend is not compiled in or the device is not there.
struct NamedTensor {
  const TensorDesc* t;
  const char* name;
};
Status pick_device(const char* op, std::initializer_list<NamedTensor> tensors,
                   Device* device, std::initializer_list<const Device*> extra = {});

// Turns a backend (tier 1) code into a message for `op` on `device`.
Status backend_status(const char* op, Device device, StatusCode code);

std::string device_string(Device d);

// The bytes of a paged cache as a [num_blocks, block_bytes] u8 tensor (for overlap checks).
TensorDesc cache_bytes(const MlaCacheDesc& c);
TensorDesc cache_bytes(const IndexerCacheDesc& c);

template <typename F>
Status guarded(const char* op, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kOutOfMemory, std::string(op) + ": a host allocation failed (out of memory)");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string(op) + ": unexpected exception: " + e.what() +
                                             " (a bug in DSA: please report it)");
  } catch (...) {
    return Status(StatusCode::kInternal, std::string(op) + ": unexpected exception (a bug in DSA: please report it)");
  }
}

}  // namespace core
}  // namespace dsa
