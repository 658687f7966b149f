// The layer step's backend bookkeeping on CUDA (core/step/device_ops.h): pinned staging,
// cudaMemcpyAsync uploads, events and the stream's capture status. Host code only.
#include <cuda_runtime.h>

#include <string>

#include "core/step/device_ops.h"

namespace dsa {
namespace gpu {
namespace {

const char* kOp = "attention_step";

Status cuda_error(const std::string& what, cudaError_t e) {
  cudaGetLastError();  // clear the sticky-free error state
  return Status(StatusCode::kDeviceError, std::string(kOp) + ": " + what + ": " + cudaGetErrorString(e));
}

// Selects `dev` for the scope, restoring the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      ok_ = false;
      return;
    }
    ok_ = previous_ == index || cudaSetDevice(index) == cudaSuccess;
    if (!ok_) cudaGetLastError();
  }
  ~DeviceScope() {
    if (ok_) cudaSetDevice(previous_);
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = 0;
  bool ok_ = false;
};

Status no_device(Device dev) {
  return Status(StatusCode::kDeviceError, std::string(kOp) + ": plan.config.device: cannot select CUDA device " +
                                              std::to_string(dev.index));
}

class CudaStepOps final : public core::step::DeviceOps {
 public:
  bool queued() const override { return true; }
  Status alloc_staging(Device dev, size_t bytes, void** out) const override {
    DeviceScope scope(dev.index);
    if (!scope.ok()) return no_device(dev);
    const cudaError_t e = cudaHostAlloc(out, bytes > 0 ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      *out = nullptr;
      return cuda_error("cannot allocate " + std::to_string(bytes) + " bytes of pinned host staging (plan.host_bytes)", e);
    }
    return Status::Ok();
  }
  void free_staging(void* p) const override {
    if (p) cudaFreeHost(p);
  }
  Status create_event(Device dev, bool timing, void** ev) const override {
    DeviceScope scope(dev.index);
    if (!scope.ok()) return no_device(dev);
    cudaEvent_t e = nullptr;
    const cudaError_t r = cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming);
    *ev = e;
    if (r != cudaSuccess) return cuda_error("cannot create a CUDA event", r);
    return Status::Ok();
  }
  void destroy_event(void* ev) const override {
    if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
  }
  Status record_event(void* ev, void* stream) const override {
    const cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) return cuda_error("cannot record an event on the stream", e);
    return Status::Ok();
  }
  Status wait_event(void* ev) const override {
    const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(ev));
    if (e != cudaSuccess) return cuda_error("an earlier step's work on the device failed", e);
    return Status::Ok();
  }
  Status elapsed_ms(void* from, void* to, float* ms) const override {
    const cudaError_t e = cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to));
    if (e != cudaSuccess) return cuda_error("cannot read a stage timing event", e);
    return Status::Ok();
  }
  Status capturing(void* stream, bool* out) const override {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &cs) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kDeviceError, std::string(kOp) + ": stream: cannot query its capture status");
    }
    *out = cs != cudaStreamCaptureStatusNone;
    return Status::Ok();
  }
  Status upload(void* dst, const void* src, size_t bytes, void* stream) const override {
    if (bytes == 0) return Status::Ok();
    // Pinned source (the object's staging): asynchronous, ordered on the step's stream like
    // every op, and capturable; the source region is not rewritten while the copy may be pending.
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kDeviceError, std::string(kOp) + ": metadata upload failed");
    }
    return Status::Ok();
  }
  Status download(void* dst, const void* src, size_t bytes, void* stream) const override {
    if (bytes == 0) return Status::Ok();
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return cuda_error("cannot read a device-resident step input for its pre-write check", e);
    return Status::Ok();
  }
  Status decode_rows(const core::step::DecodeRowsArgs& a, void* stream) const override {
    return launch_decode_rows(a, stream);
  }
  Status mask_padded(const core::step::MaskPaddedArgs& a, void* stream) const override {
    return launch_mask_padded(a, stream);
  }
};

}  // namespace

const core::step::DeviceOps& step_device_ops() {
  static const CudaStepOps ops;
  return ops;
}

}  // namespace gpu
}  // namespace dsa
