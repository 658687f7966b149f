// Argument checking at the API boundary (tier 2 of the error model): every failure names the
// op, the argument and what was expected.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

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
  // A free-form condition: on failure "op: name: expectation".
  ArgCheck& require(bool cond, const char* name, const std::string& expectation);

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
Status pick_device(const char* op, std::initializer_list<const TensorDesc*> tensors,
                   Device* device, std::initializer_list<const Device*> extra = {});

// Turns a backend (tier 1) code into a message for `op` on `device`.
Status backend_status(const char* op, Device device, StatusCode code);

std::string device_string(Device d);

}  // namespace core
}  // namespace dsa
