// `dsa bench`: per-op GPU benchmarks at the SPEC §2 shapes (tools/dsa/cmd_bench.cpp).
#pragma once

// Returns the process exit code: 0 when every selected benchmark ran, 1 when one failed,
// 2 for bad options or when there is no CUDA backend or device.
int cmd_bench(int argc, char** argv);
