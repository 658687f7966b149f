// Hopper (sm_90a) attention kernel of the MHA-form prefill: not yet written; the launcher
// falls back to the portable kernel while launch_hopper answers kUnsupported.
#pragma once
#include <cuda_runtime.h>

#include "cuda/mha_prefill_kernels.cuh"
#include "dsa/status.h"

namespace dsa {
namespace gpu {
namespace mha {

template <int kNope, int kV>
StatusCode launch_hopper(const Problem&, int64_t, cudaStream_t) {
  return StatusCode::kUnsupported;
}

}  // namespace mha
}  // namespace gpu
}  // namespace dsa
