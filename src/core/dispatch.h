// Backend dispatch: the device the tensors live on picks the implementation.
#pragma once
#include <new>

#include "core/kernel_name.h"
#include "core/step/device_ops.h"
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

// DSA_DISPATCH(device, fn, params): cpu::fn(params) or gpu::fn(params) as a StatusCode. It
// clears dsa::last_kernel_name first; the CUDA launchers set it again.
#if defined(DSA_WITH_CUDA)
#define DSA_DISPATCH(device, fn, params)                                                                \
  ::dsa::core::guard_code([&]() {                                                                       \
    ::dsa::core::set_last_kernel_name("");                                                              \
    return (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::gpu::fn(params) : ::dsa::cpu::fn(params); \
  })
#else
#define DSA_DISPATCH(device, fn, params)                                                                            \
  ::dsa::core::guard_code([&]() {                                                                                   \
    ::dsa::core::set_last_kernel_name("");                                                                          \
    return (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::StatusCode::kUnsupported : ::dsa::cpu::fn(params); \
  })
#endif

// The layer step's backend bookkeeping (core/step/device_ops.h) for a device type.
inline const step::DeviceOps& step_backend(DeviceType t) {
#if defined(DSA_WITH_CUDA)
  if (t == DeviceType::kCUDA) return ::dsa::gpu::step_device_ops();
#else
  if (t == DeviceType::kCUDA) return ::dsa::cpu::step_device_ops_unsupported();
#endif
  return ::dsa::cpu::step_device_ops();
}

}  // namespace core
}  // namespace dsa
