// The layer step's backend bookkeeping on the CPU (core/step/device_ops.h): ops run when
// called, so there is nothing to queue, record or wait for.
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/step/device_ops.h"

namespace dsa {
namespace cpu {
namespace {

class CpuStepOps final : public core::step::DeviceOps {
 public:
  bool queued() const override { return false; }
  Status alloc_staging(Device, size_t bytes, void** out) const override {
    *out = std::calloc(bytes > 0 ? bytes : 1, 1);
    if (*out == nullptr)
      return Status(StatusCode::kOutOfMemory, "attention_step: plan.host_bytes: cannot allocate " + std::to_string(bytes) +
                                                  " bytes of host staging (lower max_seqs_per_step or max_tokens_per_step)");
    return Status::Ok();
  }
  void free_staging(void* p) const override { std::free(p); }
  Status create_event(Device, bool, void** ev) const override {
    *ev = nullptr;
    return Status::Ok();
  }
  void destroy_event(void*) const override {}
  Status record_event(void*, void*) const override { return Status::Ok(); }
  Status wait_event(void*) const override { return Status::Ok(); }
  Status elapsed_ms(void*, void*, float* ms) const override {
    *ms = 0.0f;
    return Status::Ok();
  }
  Status capturing(void*, bool* out) const override {
    *out = false;
    return Status::Ok();
  }
  Status upload(void* dst, const void* src, size_t bytes, void*) const override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status download(void* dst, const void* src, size_t bytes, void*) const override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status decode_rows(const core::step::DecodeRowsArgs& a, void*) const override {
    core::step::decode_rows_host(a);
    return Status::Ok();
  }
  Status mask_padded(const core::step::MaskPaddedArgs& a, void*) const override {
    core::step::mask_padded_host(a);
    return Status::Ok();
  }
};

// A CUDA plan in a build without the CUDA backend: every call says so.
class UnsupportedStepOps final : public core::step::DeviceOps {
  static Status no() {
    return Status(StatusCode::kUnsupported, "attention_step: device: the CUDA backend is not compiled in");
  }
 public:
  bool queued() const override { return false; }
  Status alloc_staging(Device d, size_t bytes, void** out) const override {
    // Staging is plain host memory here; the step's first device call reports the backend.
    return CpuStepOps().alloc_staging(d, bytes, out);
  }
  void free_staging(void* p) const override { std::free(p); }
  Status create_event(Device, bool, void** ev) const override {
    *ev = nullptr;
    return Status::Ok();
  }
  void destroy_event(void*) const override {}
  Status record_event(void*, void*) const override { return Status::Ok(); }
  Status wait_event(void*) const override { return Status::Ok(); }
  Status elapsed_ms(void*, void*, float*) const override { return no(); }
  Status capturing(void*, bool* out) const override {
    *out = false;
    return Status::Ok();
  }
  Status upload(void*, const void*, size_t bytes, void*) const override { return bytes == 0 ? Status::Ok() : no(); }
  Status download(void*, const void*, size_t bytes, void*) const override { return bytes == 0 ? Status::Ok() : no(); }
  Status decode_rows(const core::step::DecodeRowsArgs&, void*) const override { return no(); }
  Status mask_padded(const core::step::MaskPaddedArgs&, void*) const override { return no(); }
};

}  // namespace

const core::step::DeviceOps& step_device_ops() {
  static const CpuStepOps ops;
  return ops;
}
const core::step::DeviceOps& step_device_ops_unsupported() {
  static const UnsupportedStepOps ops;
  return ops;
}

}  // namespace cpu
}  // namespace dsa
