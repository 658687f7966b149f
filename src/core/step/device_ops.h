// The step's backend boundary: the device-side bookkeeping a layer step needs beyond the ops
// themselves (host staging memory, metadata uploads, stream events, capture status). Core code
// of the step calls only this interface; src/cpu/step_device_ops.cpp and
// src/cuda/step_device_ops.cu implement it, so no step stage needs `#if DSA_WITH_CUDA`.
#pragma once
#include <cstddef>

#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {
namespace core {
namespace step {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Whether copies and launches are queued on a stream (CUDA) rather than done when called.
  virtual bool queued() const = 0;
  // Host memory for the step's metadata staging (pinned on CUDA: capturable async copies).
  virtual Status alloc_staging(Device dev, size_t bytes, void** out) const = 0;
  virtual void free_staging(void* p) const = 0;
  // Events. `timing`: usable for elapsed_ms. Created on `dev`.
  virtual Status create_event(Device dev, bool timing, void** ev) const = 0;
  virtual void destroy_event(void* ev) const = 0;
  virtual Status record_event(void* ev, void* stream) const = 0;
  virtual Status wait_event(void* ev) const = 0;  // the host waits for it
  virtual Status elapsed_ms(void* from, void* to, float* ms) const = 0;
  // Whether `stream` is being captured into a graph.
  virtual Status capturing(void* stream, bool* out) const = 0;
  // Host metadata -> device memory (the workspace), ordered on the stream like every op.
  virtual Status upload(void* dst, const void* src, size_t bytes, void* stream) const = 0;
};

// The backend of `dev` (CUDA without the CUDA backend compiled in: one whose calls all return
// kUnsupported).
const DeviceOps& device_ops(Device dev);

}  // namespace step
}  // namespace core

namespace cpu {
const core::step::DeviceOps& step_device_ops();
const core::step::DeviceOps& step_device_ops_unsupported();  // CUDA plans without the backend
}
namespace gpu {
const core::step::DeviceOps& step_device_ops();  // defined only with the CUDA backend
}
}  // namespace dsa
