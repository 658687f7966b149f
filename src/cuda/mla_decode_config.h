// Tile constants of the Hopper decode kernels (mla_decode_kernels.cuh): dense decode over
// paged BF16 / FP8 caches and FP8 sparse decode. Host and device share them.
#pragma once
#include <cstdint>

namespace dsa {
namespace gpu {
namespace mla_decode {

constexpr int kDim = 576;       // [c_kv 512 | k_pe 64]
constexpr int kVDim = 512;
constexpr int kRows = 64;       // query rows (token, head) per CTA: one wgmma m64 tile
constexpr int kTileKeys = 64;   // keys per shared-memory stage
constexpr int kDimBlocks = 9;   // 576 bf16 = 9 blocks of 64 (128-byte swizzle rows)
constexpr int kVBlocksPerWg = 4;  // each consumer warpgroup owns 256 output dims
constexpr int kStages = 2;
constexpr int kThreads = 384;   // WG0, WG1: consumers; WG2: producer
// Register reallocation (setmaxnreg) from the 168 of 384 threads: the consumers need more
// for unserialised wgmma; 2 * 128 * consumer + 128 * producer <= 65536.
constexpr int kConsumerRegsTma = 224, kProducerRegsTma = 56;        // TMA producer: one thread
constexpr int kConsumerRegsGather = 216, kProducerRegsGather = 72;  // FP8 gather + dequantise
static_assert(2 * 128 * kConsumerRegsTma + 128 * kProducerRegsTma <= 65536, "register file");
static_assert(2 * 128 * kConsumerRegsGather + 128 * kProducerRegsGather <= 65536, "register file");

// Shared memory (bytes from a 1024-aligned base).
constexpr int kBlockBytes = kRows * 128;                  // 8192: 64 rows x 128 B
constexpr int kQBytes = kDimBlocks * kBlockBytes;         // 73728
constexpr int kKBytes = kDimBlocks * kBlockBytes;         // 73728 per stage
constexpr int kSmemQ = 0;
constexpr int kSmemK = kSmemQ + kQBytes;
constexpr int kSmemP = kSmemK + kStages * kKBytes;        // 221184
constexpr int kSmemAlpha = kSmemP + kBlockBytes;          // 229376: 64 f32
constexpr int kSmemRowF = kSmemAlpha + kRows * 4;         // 2 x 64 f32
constexpr int kSmemMask = kSmemRowF + 2 * kRows * 4;      // kStages x u64
constexpr int kSmemBars = kSmemMask + kStages * 8;        // full[2], empty[2], p_full, p_empty, f_full
constexpr int kSmemUsed = kSmemBars + 7 * 8;
constexpr int kSmemBytes = kSmemUsed + 1024;              // + alignment slack
static_assert(kSmemBytes <= 232448, "fits the 227 KiB opt-in");

// Scheduling: one persistent CTA per SM walks a contiguous range of (row block, key tile)
// positions; a row block cut by a range boundary leaves partials in slots 2g / 2g + 1.
constexpr int kSchedThreads = 512;
constexpr int kCombineRows = 4;       // rows per combine block (grid.y = 64 / 4), one per 128 threads
constexpr int kCombineThreads = 128 * kCombineRows;  // 128 x 4 dims = 512 per row

}  // namespace mla_decode
}  // namespace gpu
}  // namespace dsa
