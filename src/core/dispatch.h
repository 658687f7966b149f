// Backend dispatch: the device the tensors live on picks the implementation.
#pragma once
#include <new>

#include "core/validate.h"
#include "cpu/cpu_ops.h"
#if defined(DSA_WITH_CUDA)
#include "cuda/cuda_ops.h"
#endif

namespace dsa {
namespace core {

// f() as a StatusCode; an exception that escaped a backend becomes kOutOfMemory
// (std::bad_alloc) or kInternal, never a throw across the API.
template <typename F>
StatusCode guard_code(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return StatusCode::kOutOfMemory;
  } catch (...) {
    return StatusCode::kInternal;
  }
}

// DSA_DISPATCH(device, fn, params): cpu::fn(params) or gpu::fn(params) as a StatusCode.
#if defined(DSA_WITH_CUDA)
#define DSA_DISPATCH(device, fn, params)                                                              \
  ::dsa::core::guard_code([&]() {                                                                     \
    return (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::gpu::fn(params) : ::dsa::cpu::fn(params); \
  })
#else
#define DSA_DISPATCH(device, fn, params)                                                             \
  ::dsa::core::guard_code([&]() {                                                                    \
    return (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::StatusCode::kUnsupported : ::dsa::cpu::fn(params); \
  })
#endif

}  // namespace core
}  // namespace dsa
