#include "core/arena.h"

#include <limits>

namespace dsa {
namespace core {

Arena::Arena(void* base, int64_t capacity) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  const uintptr_t aligned = (b + kAlign - 1) / kAlign * kAlign;
  const int64_t skip = static_cast<int64_t>(aligned - b);
  begin_ = aligned;
  capacity_ = (base == nullptr || capacity < skip) ? 0 : capacity - skip;
}

Arena Arena::counting() {
  Arena a;
  a.begin_ = static_cast<uintptr_t>(kAlign) << 4;  // fake, aligned, non-null
  a.capacity_ = std::numeric_limits<int64_t>::max() / 4;
  return a;
}

void* Arena::alloc(int64_t bytes) {
  if (bytes < 0 || failed_) {
    failed_ = true;
    return nullptr;
  }
  // Compared before rounding: a saturated (overflowed) size must fail, not wrap in round_up.
  if (bytes > capacity_ - offset_) {
    failed_ = true;
    return nullptr;
  }
  const int64_t size = round_up(bytes);
  if (size > capacity_ - offset_) {
    failed_ = true;
    return nullptr;
  }
  void* p = reinterpret_cast<void*>(begin_ + static_cast<uintptr_t>(offset_));
  offset_ += size;
  if (offset_ > high_water_) high_water_ = offset_;
  return p;
}

Arena Arena::sub(int64_t bytes) {
  Arena s;
  void* p = alloc(bytes);
  if (p == nullptr) {
    s.failed_ = true;
    return s;
  }
  s.begin_ = reinterpret_cast<uintptr_t>(p);
  s.capacity_ = round_up(bytes);
  return s;
}

}  // namespace core
}  // namespace dsa
