// Backend dispatch: the device the tensors live on picks the implementation.
#pragma once
#include "core/kernel_name.h"
#include "core/step/device_ops.h"
#include "core/validate.h"
#include "cpu/cpu_ops.h"
#if defined(DSA_WITH_CUDA)
#include "cuda/cuda_ops.h"
#endif

namespace dsa {
namespace core {

// DSA_DISPATCH(device, fn, params): cpu::fn(params) or gpu::fn(params) as a StatusCode. It
// clears dsa::last_kernel_name first; the CUDA launchers set it again.
#if defined(DSA_WITH_CUDA)
#define DSA_DISPATCH(device, fn, params)  \
  (::dsa::core::set_last_kernel_name(""), \
   (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::gpu::fn(params) : ::dsa::cpu::fn(params))
#else
#define DSA_DISPATCH(device, fn, params)  \
  (::dsa::core::set_last_kernel_name(""), \
   (device).type == ::dsa::DeviceType::kCUDA ? ::dsa::StatusCode::kUnsupported : ::dsa::cpu::fn(params))
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
