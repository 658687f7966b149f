// A bump allocator over caller-owned memory. Every temporary of a layer step comes from one;
// the plan computes its sizes by running the same layout code over a counting arena (no
// memory), so the bytes a step takes are the bytes the plan reserved, alignment included.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dsa/planner.h"
#include "dsa/status.h"

namespace dsa {
namespace core {

class Arena {
 public:
  static constexpr int64_t kAlign = kWorkspaceAlignment;
  static int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // Over [base, base + capacity). The first buffer starts at the first aligned address, so an
  // unaligned base costs up to kAlign - 1 bytes (the plan reserves kAlign for that).
  Arena(void* base, int64_t capacity);
  // A counting arena: hands out distinct fake, aligned, never-dereferenced addresses and only
  // measures. Used by the planner to size layouts.
  static Arena counting();

  // Aligned buffer of `bytes` (0 allowed: an aligned non-null address, no bytes); nullptr when
  // it does not fit.
  void* alloc(int64_t bytes);
  template <typename T>
  T* alloc_n(int64_t n) {
    int64_t bytes;  // n * sizeof(T), overflow-checked: an overflow is an allocation that does not fit
    if (__builtin_mul_overflow(n, static_cast<int64_t>(sizeof(T)), &bytes)) {
      failed_ = true;
      return nullptr;
    }
    return static_cast<T*>(alloc(bytes));
  }
  // A sub-arena of exactly `bytes` (rounded up) carved from this one; empty when it does not fit.
  Arena sub(int64_t bytes);

  bool failed() const { return failed_; }  // some alloc did not fit
  int64_t used() const { return offset_; }
  int64_t high_water() const { return high_water_; }
  int64_t capacity() const { return capacity_; }
  int64_t mark() const { return offset_; }
  void reset(int64_t mark) { offset_ = mark; }

 private:
  Arena() = default;
  uintptr_t begin_ = 0;   // first aligned address
  int64_t capacity_ = 0;  // bytes from begin_
  int64_t offset_ = 0;
  int64_t high_water_ = 0;
  bool failed_ = false;
};

}  // namespace core
}  // namespace dsa
