// CPU top-k (SPEC §3.5) and index mapping (SPEC §3.6).
//
// Top-k is a radix select on an order-preserving 32-bit key of each logit (NaN lowest, -0 equal
// to +0): four 8-bit passes find the k-th largest key T and how many of the entries equal to T
// are needed; one scan in index order then emits every key > T and the first needed keys == T.
// The scan order gives ascending indices and the lower-index tie rule for free.
#include <algorithm>
#include <cstring>
#include <limits>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

// Monotone in value: larger float -> larger key. Every NaN -> 0 (below -inf's key); -0 -> +0.
inline uint32_t order_key(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

void topk_row(const float* __restrict x, int64_t len, int64_t k, int32_t* __restrict idx,
              float* __restrict val) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (len <= k) {
    for (int64_t j = 0; j < len; ++j) idx[j] = static_cast<int32_t>(j);
    for (int64_t j = len; j < k; ++j) idx[j] = -1;
    if (val) {
      for (int64_t j = 0; j < len; ++j) val[j] = x[j];
      for (int64_t j = len; j < k; ++j) val[j] = ninf;
    }
    return;
  }
  uint32_t prefix = 0;
  int64_t need = k;  // how many of the entries matching `prefix` so far are still to take
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t hist[257] = {};  // bin 256 counts the entries that left the candidate set
    const int high = shift + 8;
    for (int64_t j = 0; j < len; ++j) {
      const uint32_t key = order_key(x[j]);
      const bool match = high == 32 || (key >> high) == prefix;
      ++hist[match ? (key >> shift) & 0xffu : 256u];
    }
    uint32_t digit = 255;
    for (;; --digit) {
      if (static_cast<int64_t>(hist[digit]) >= need) break;
      need -= hist[digit];
    }
    prefix = (high == 32 ? 0u : prefix << 8) | digit;
  }
  const uint32_t threshold = prefix;
  int64_t out = 0;
  for (int64_t j = 0; j < len && out < k; ++j) {
    const uint32_t key = order_key(x[j]);
    const bool take_eq = key == threshold && need > 0;
    if (key > threshold || take_eq) {
      need -= take_eq;
      idx[out] = static_cast<int32_t>(j);
      if (val) val[out] = x[j];
      ++out;
    }
  }
}

}  // namespace

StatusCode topk(const TopkParams& p) {
  const int64_t M = p.logits.shape[0];
  const int64_t k = p.k;
  parallel_for(M, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* x = p.logits.ptr<const float>() + i * p.logits.stride[0];
      const int64_t len = p.lengths.ptr<const int32_t>()[i * p.lengths.stride[0]];
      int32_t* idx = p.indices.ptr<int32_t>() + i * p.indices.stride[0];
      float* val = p.values.present() ? p.values.ptr<float>() + i * p.values.stride[0] : nullptr;
      topk_row(x, len, k, idx, val);
    }
  });
  return StatusCode::kOk;
}

StatusCode map_indices(const MapIndicesParams& p) {
  const int64_t M = p.indices.shape[0], K = p.indices.shape[1];
  const bool paged = p.kind == IndexMapKind::kPaged;
  const int64_t page = p.page_size;
  const int64_t max_blocks = paged ? p.block_table.shape[1] : 0;
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  parallel_for(M, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t seq = p.row_seq.present() ? p.row_seq.ptr<const int32_t>()[i * p.row_seq.stride[0]]
                                              : i / p.rows_per_seq;
      const int32_t* in = p.indices.ptr<const int32_t>() + i * p.indices.stride[0];
      int32_t* out = p.out.ptr<int32_t>() + i * p.out.stride[0];
      if (!paged) {
        const int64_t start = p.kv_start.ptr<const int32_t>()[seq * p.kv_start.stride[0]];
        for (int64_t c = 0; c < K; ++c) {
          const int64_t j = in[c];
          const int64_t a = start + j;
          out[c] = (j < 0 || a > kMaxI32) ? -1 : static_cast<int32_t>(a);
        }
      } else {
        const int32_t* bt = p.block_table.ptr<const int32_t>() + seq * p.block_table.stride[0];
        const int64_t bs = p.block_table.stride[1];
        for (int64_t c = 0; c < K; ++c) {
          const int64_t j = in[c];
          int64_t a = -1;
          if (j >= 0 && j / page < max_blocks) {
            const int64_t blk = bt[(j / page) * bs];
            a = blk < 0 ? -1 : blk * page + j % page;
          }
          out[c] = a > kMaxI32 ? -1 : static_cast<int32_t>(a);
        }
      }
    }
  });
  return StatusCode::kOk;
}

}  // namespace cpu
}  // namespace dsa
