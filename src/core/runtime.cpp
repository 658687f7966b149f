#include "dsa/runtime.h"

#include <fstream>
#include <string>

#include "core/kernel_name.h"
#include "cpu/parallel.h"
#if defined(DSA_WITH_CUDA)
#include "cuda/cuda_ops.h"
#endif

#ifndef DSA_VERSION_STRING
#define DSA_VERSION_STRING "0.0.0"
#endif

namespace dsa {

const char* version() { return DSA_VERSION_STRING; }

std::vector<std::string> compiled_backends() {
#if defined(DSA_WITH_CUDA)
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

static std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "CPU";
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  DeviceInfo c;
  c.device = cpu_device();
  c.name = cpu_model_name();
  c.multiprocessors = num_threads();
  out.push_back(c);
#if defined(DSA_WITH_CUDA)
  for (auto& d : gpu::list_devices()) out.push_back(d);
#endif
  return out;
}

bool cuda_available() {
#if defined(DSA_WITH_CUDA)
  return !gpu::list_devices().empty();
#else
  return false;
#endif
}

Status set_num_threads(int n) {
  if (n > kMaxCpuThreads)
    return Status(StatusCode::kInvalidArgument, "set_num_threads: n: expected <= " + std::to_string(kMaxCpuThreads) +
                                                    " (or <= 0 for all hardware threads), got " + std::to_string(n));
  cpu::set_pool_threads(n);
  return Status::Ok();
}
int num_threads() { return cpu::pool_threads(); }

namespace {
thread_local const char* t_last_kernel = "";
}  // namespace

void core::set_last_kernel_name(const char* name) { t_last_kernel = name ? name : ""; }
const char* last_kernel_name() { return t_last_kernel; }

}  // namespace dsa
