// The CPU backend's thread pool. parallel_for splits [0, n) into contiguous chunks, one task
// per chunk; the calling thread works too. Chunks are fixed by (n, grain, threads), so the
// result of a loop whose iterations are independent never depends on scheduling.
#pragma once
#include <cstdint>
#include <functional>

#include "dsa/status.h"

namespace dsa {
namespace cpu {

int pool_threads();
void set_pool_threads(int n);  // n <= 0: hardware concurrency

// body(begin, end) over disjoint ranges covering [0, n); at least `grain` items per task.
// Nested calls run serially in the calling thread. An exception thrown by body never leaves
// the pool: the loop finishes the other chunks and returns kOutOfMemory (std::bad_alloc) or
// kInternal (anything else); kOk otherwise.
[[nodiscard]] StatusCode parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

}  // namespace cpu
}  // namespace dsa
