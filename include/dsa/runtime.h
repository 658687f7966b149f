// Library-wide runtime facts: version, backends, devices, CPU threads.
#pragma once
#include <string>
#include <vector>

#include "dsa/status.h"
#include "dsa/types.h"

namespace dsa {

const char* version();

// Backends compiled into this build: "cpu" always, "cuda" with -DDSA_CUDA=ON.
std::vector<std::string> compiled_backends();

struct DeviceInfo {
  Device device;
  std::string name;         // "NVIDIA H200", or the CPU model
  int compute_capability = 0;  // 90 for sm_90; 0 for the CPU
  int multiprocessors = 0;     // SMs, or CPU threads DSA uses
  size_t memory_bytes = 0;     // device memory (total); 0 where unknown
};
// The CPU, then every CUDA device the driver reports (none without a GPU; never fails
// for lack of one).
std::vector<DeviceInfo> list_devices();
bool cuda_available();

// Threads the CPU backend uses (default: all hardware threads). n <= 0 restores the default;
// n > kMaxCpuThreads is kInvalidArgument (and changes nothing).
constexpr int kMaxCpuThreads = 1024;
Status set_num_threads(int n);
int num_threads();

// The kernel the last op of the calling thread launched: a stable name such as
// "indexer_logits.mma_sync_f16", "topk.radix12" or "sparse_mla.mma_sync" (a string literal,
// valid for the life of the program), set by every CUDA launcher. "" before any op, and after an
// op that ran on the CPU or launched nothing (an op refused by its argument checks leaves it
// as it was). An op that launches several kernels (a layer step) leaves the name of its last
// one. For tools that print which kernel ran (`dsa bench`).
const char* last_kernel_name();

}  // namespace dsa
