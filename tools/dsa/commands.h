// Subcommands of the `dsa` tool. Each takes the arguments after its name (argv[0] is the
// subcommand) and returns the process exit code.
//
// Commands that live in optional source files (plan, bench) are declared weak: main.cpp
// dispatches them only when their file is linked in, and says "not built" otherwise.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DSA_CLI_OPTIONAL __attribute__((weak))
#else
#define DSA_CLI_OPTIONAL
#endif

int cmd_info(int argc, char** argv);
int cmd_run(int argc, char** argv);
DSA_CLI_OPTIONAL int cmd_plan(int argc, char** argv);   // tools/dsa/cmd_plan.cpp (planner)
DSA_CLI_OPTIONAL int cmd_bench(int argc, char** argv);  // tools/dsa/cmd_bench.cpp (GPU benchmarks)
