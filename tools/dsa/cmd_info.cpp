// `dsa info`: what this build of DSA has and what it sees.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "dsa/dsa.h"

namespace {

void info_usage(FILE* f) {
  std::fprintf(f,
               "usage: dsa info [--json]\n"
               "Prints the DSA version, the compiled backends, the devices (the CPU, then every\n"
               "CUDA device the driver reports) and the CPU threads the CPU backend uses.\n"
               "  --json   one JSON object instead of text\n");
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      info_usage(stdout);
      return 0;
    } else if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else {
      std::fprintf(stderr, "dsa info: unknown option '%s'\n", argv[i]);
      info_usage(stderr);
      return 2;
    }
  }
  auto backends = dsa::compiled_backends();
  auto devices = dsa::list_devices();
  if (json) {
    std::printf("{\"version\": \"%s\", \"backends\": [", dsa::version());
    for (size_t i = 0; i < backends.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", backends[i].c_str());
    std::printf("], \"cpu_threads\": %d, \"devices\": [", dsa::num_threads());
    for (size_t i = 0; i < devices.size(); ++i) {
      const auto& d = devices[i];
      std::printf("%s{\"type\": \"%s\", \"index\": %d, \"name\": \"%s\", \"compute_capability\": %d, "
                  "\"multiprocessors\": %d, \"memory_bytes\": %zu}",
                  i ? ", " : "", dsa::device_type_name(d.device.type), d.device.index,
                  json_escape(d.name).c_str(), d.compute_capability, d.multiprocessors, d.memory_bytes);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("dsa %s\n", dsa::version());
  std::printf("backends:    ");
  for (size_t i = 0; i < backends.size(); ++i) std::printf("%s%s", i ? ", " : "", backends[i].c_str());
  std::printf("\ncpu threads: %d\ndevices:\n", dsa::num_threads());
  for (const auto& d : devices) {
    if (d.device.type == dsa::DeviceType::kCPU) {
      std::printf("  cpu        %s (%d threads)\n", d.name.c_str(), d.multiprocessors);
    } else {
      std::printf("  cuda:%-5d %s, sm_%d, %d SMs, %.1f GiB\n", d.device.index, d.name.c_str(),
                  d.compute_capability, d.multiprocessors, d.memory_bytes / double(1ull << 30));
    }
  }
  bool has_cuda_backend = false;
  for (auto& b : backends) has_cuda_backend |= b == "cuda";
  if (has_cuda_backend && !dsa::cuda_available()) std::printf("  (no CUDA device visible)\n");
  return 0;
}
