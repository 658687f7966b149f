// `dsa bench`: per-op GPU benchmarks at the SPEC §2 and the anchors' shapes, and the layer
// benchmarks (tools/dsa/cmd_bench.cpp, bench_layer.cpp).
#pragma once

// Returns the process exit code: 0 when every selected benchmark ran, 1 when one failed,
// 2 for bad options, 77 when there is no CUDA backend or device (CTest's skip code).
int cmd_bench(int argc, char** argv);
