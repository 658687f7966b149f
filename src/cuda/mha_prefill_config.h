// Tile constants of the MHA-form prefill kernels (mha_prefill_kernels.cuh, mha_prefill_hopper.cuh).
#pragma once

namespace dsa {
namespace gpu {
namespace mha {

constexpr int kRowElems = 576;       // gathered latent row [c_kv 512 | k_pe 64], bf16
constexpr int kRopeElems = 64;
constexpr float kLn2 = 0.6931471805599453f;

// latent gather: one warp per context token
constexpr int kGatherThreads = 256;
constexpr int kGatherTokens = kGatherThreads / 32;

// portable attention kernel
constexpr int kPortThreads = 128;
constexpr int kPortRows = 16;        // query rows per block (4 per warp)
constexpr int kPortKeys = 32;        // keys per shared-memory tile

// Hopper attention kernel: 2 consumer warpgroups x 64 query rows, one producer warpgroup
// (one lane issues the copies; setmaxnreg moves its registers to the consumers);
// key tiles of kHopKeys through a TMA / mbarrier ring (HopCfg::kStages deep).
constexpr int kHopRowsPerWg = 64;
constexpr int kHopConsumers = 2;
constexpr int kHopRows = kHopRowsPerWg * kHopConsumers;  // 128 query rows per block
constexpr int kHopKeys = 64;
// stages: HopCfg (3 for qk + v <= 320, else 2)
constexpr int kHopThreads = 128 * (kHopConsumers + 1);
constexpr int kHopProducerRegs = 24;
constexpr int kHopConsumerRegs = 240;  // (2 * 240 + 24) * 128 <= 64 Ki registers

}  // namespace mha
}  // namespace gpu
}  // namespace dsa
