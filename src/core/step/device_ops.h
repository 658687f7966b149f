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

// Row tables of a graph-stable decode batch (StepParams::device_lengths), built on the device
// from the device kv_lens: B sequences of next_n rows each; sequence b's kv_len is clamped to
// [next_n, cap] (cap = min(max_context, max_blocks * page_size): out-of-range lengths cannot
// reach past the plan or the block table), then row r = b * next_n + i gets
//   row_seq = b, token_pos = kv - next_n + i, row_len = kv - next_n + i + 1,
// and kv_lens_out[b] = kv.
struct DecodeRowsArgs {
  const int32_t* kv_lens = nullptr;
  int64_t kv_stride = 1;
  int64_t B = 0, next_n = 1, cap = 0;
  int32_t* row_seq = nullptr;
  int32_t* row_len = nullptr;
  int32_t* token_pos = nullptr;
  int32_t* kv_lens_out = nullptr;
};

// The rows of padded tokens (slot_mapping -1) after a step: out = 0 (every element), lse =
// +inf, indices_out = -1 (when given). Strides in elements; out's last dim contiguous.
struct MaskPaddedArgs {
  const int64_t* slots = nullptr;
  int64_t slot_stride = 1;
  int64_t T = 0, H = 0, D = 0;
  uint8_t* out = nullptr;
  int64_t out_s0 = 0, out_s1 = 0, out_es = 4;
  float* lse = nullptr;
  int64_t lse_s0 = 0, lse_s1 = 0;
  int32_t* ind = nullptr;
  int64_t ind_s0 = 0, ind_s1 = 0, K = 0;
};

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
  // Device memory -> host memory, complete on return (after the stream's earlier work): the
  // pre-write check of an eager step's device-resident inputs. Never called while capturing.
  virtual Status download(void* dst, const void* src, size_t bytes, void* stream) const = 0;
  // DecodeRowsArgs on the stream (a loop on the CPU, one small kernel on CUDA): capturable, and
  // replays read kv_lens' contents at replay time.
  virtual Status decode_rows(const DecodeRowsArgs& a, void* stream) const = 0;
  virtual Status mask_padded(const MaskPaddedArgs& a, void* stream) const = 0;
};

// The reference loops of decode_rows and mask_padded (the CPU backend runs them).
void decode_rows_host(const DecodeRowsArgs& a);
void mask_padded_host(const MaskPaddedArgs& a);

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
Status launch_decode_rows(const core::step::DecodeRowsArgs& a, void* stream);  // step_rows.cu
Status launch_mask_padded(const core::step::MaskPaddedArgs& a, void* stream);   // step_rows.cu
}
}  // namespace dsa
