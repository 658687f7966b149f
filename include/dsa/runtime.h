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

}  // namespace dsa
