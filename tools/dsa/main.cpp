// `dsa`: the command-line front end of the DSA library. See docs/cli.md.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "dsa/runtime.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);  // null: the command's source file is not in this build
  const char* summary;
};

// Add a subcommand here and declare it in commands.h.
const Command kCommands[] = {
    {"info", cmd_info, "version, compiled backends, devices, CPU threads"},
    {"run", cmd_run, "the main job: one DSA layer step (GLM-5 geometry) checked against a float64 reference"},
    {"plan", cmd_plan, "workspace plan for declared step limits"},
    {"bench", cmd_bench, "GPU benchmarks of the DSA operations"},
};

void usage(FILE* f) {
  std::fprintf(f,
               "dsa %s: DeepSeek Sparse Attention runtime\n"
               "usage: dsa <command> [options]     (dsa <command> --help for its options)\n\n"
               "commands:\n",
               dsa::version());
  for (const auto& c : kCommands) {
    if (c.fn) std::fprintf(f, "  %-8s %s\n", c.name, c.summary);
  }
  std::fprintf(f, "\n  --version  print the version\n  --help     this text\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char* name = argv[1];
  if (!std::strcmp(name, "--help") || !std::strcmp(name, "-h") || !std::strcmp(name, "help")) {
    usage(stdout);
    return 0;
  }
  if (!std::strcmp(name, "--version")) {
    std::printf("%s\n", dsa::version());
    return 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(c.name, name) != 0) continue;
    if (!c.fn) {
      std::fprintf(stderr, "dsa: '%s' is not built into this binary\n", name);
      return 2;
    }
    return c.fn(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "dsa: unknown command '%s'\n\n", name);
  usage(stderr);
  return 2;
}
