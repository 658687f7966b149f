// CPU top-k (SPEC §3.5) and index mapping (SPEC §3.6).
//
// Top-k is a radix select on an order-preserving 32-bit key of each logit (NaN lowest, -0 equal
// to +0): three passes (11, 11, 10 bits, each over the survivors of the previous one) find the
// k-th largest key T and how many entries equal to T are needed; one scan in index order then
// emits every key > T and the first needed keys == T.
// The scan order gives ascending indices and the lower-index tie rule for free. bf16 logits
// widen exactly to f32 first (same keys, same answer as the f32 row of the widened values).
#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "cpu/select_key.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

// Per-slot scratch: the keys of one row and the survivors of each pass (8 bytes per column),
// carved from the caller's workspace so selection allocates nothing and its memory is counted.
struct TopkScratch {
  uint32_t* keys;
  uint32_t* cand;
};

int64_t slot_bytes(int64_t width) { return (width * 8 + 63) / 64 * 64; }

// Picks the digit (bits [shift, shift + bits) of the candidates' keys) that holds the `need`-th
// largest candidate, and lowers `need` by the count of candidates with larger digits.
uint32_t select_digit(const uint32_t* keys, int64_t n, int shift, int bits, int64_t* need) {
  uint32_t hist[2048] = {};
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t j = 0; j < n; ++j) ++hist[(keys[j] >> shift) & mask];
  uint32_t digit = mask;
  for (;; --digit) {
    if (static_cast<int64_t>(hist[digit]) >= *need) break;
    *need -= hist[digit];
  }
  return digit;
}

// Keeps the candidates whose bits [shift, ...) equal `prefix`; returns how many.
int64_t keep_matching(const uint32_t* in, int64_t n, int shift, uint32_t prefix, uint32_t* out) {
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[m] = in[j];
    m += (in[j] >> shift) == prefix;
  }
  return m;
}

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_float(v); }  // bf16: exact widening

template <class T>
void topk_row(const T* __restrict x, int64_t len, int64_t k, int32_t* __restrict idx,
              float* __restrict val, TopkScratch& sc) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (len <= k) {
    for (int64_t j = 0; j < len; ++j) idx[j] = static_cast<int32_t>(j);
    for (int64_t j = len; j < k; ++j) idx[j] = -1;
    if (val) {
      for (int64_t j = 0; j < len; ++j) val[j] = to_f32(x[j]);
      for (int64_t j = len; j < k; ++j) val[j] = ninf;
    }
    return;
  }
  uint32_t* keys = sc.keys;
  uint32_t* cand = sc.cand;
  for (int64_t j = 0; j < len; ++j) keys[j] = order_key(to_f32(x[j]));
  // Digits of 11, 11 and 10 bits, from the top; each pass only looks at the survivors.
  int64_t need = k;
  const uint32_t d1 = select_digit(keys, len, 21, 11, &need);
  int64_t n = keep_matching(keys, len, 21, d1, cand);
  const uint32_t d2 = select_digit(cand, n, 10, 11, &need);
  n = keep_matching(cand, n, 10, (d1 << 11) | d2, cand);
  const uint32_t d3 = select_digit(cand, n, 0, 10, &need);
  const uint32_t threshold = (d1 << 21) | (d2 << 10) | d3;
  // `need` entries equal to the threshold are taken, the lowest indices first. Branch-free:
  // every index is written to the staging slot, which advances only when the entry is taken
  // (the staging buffer has len > k slots, so the write after the k-th take stays inside).
  int32_t* staged = reinterpret_cast<int32_t*>(cand);
  int64_t out = 0;
  for (int64_t j = 0; j < len; ++j) {
    const uint32_t key = keys[j];
    const bool take_eq = key == threshold && need > 0;
    need -= take_eq;
    staged[out] = static_cast<int32_t>(j);
    out += (key > threshold) | take_eq;
    if (out == k) break;
  }
  std::memcpy(idx, staged, static_cast<size_t>(k) * 4);
  if (val)
    for (int64_t j = 0; j < k; ++j) val[j] = to_f32(x[idx[j]]);
}

}  // namespace

size_t topk_min_workspace_size(const TopkParams& p) {
  const int64_t M = p.logits.shape[0], W = p.logits.shape[1];
  return (M > 0 && W > p.k) ? static_cast<size_t>(slot_bytes(W)) : 0;  // rows of <= k read no score
}

// One slot per hardware thread: fixed for the process, so a plan's query stays valid when
// set_num_threads changes later.
int64_t max_slots() {
  const unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int64_t>(h) : 1;
}

size_t topk_workspace_size(const TopkParams& p) {
  const int64_t M = p.logits.shape[0];
  const int64_t slots = std::min<int64_t>(M, max_slots());
  return topk_min_workspace_size(p) * static_cast<size_t>(std::max<int64_t>(slots, 0));
}

StatusCode topk(const TopkParams& p) {
  const int64_t M = p.logits.shape[0], W = p.logits.shape[1];
  const int64_t k = p.k;
  if (M == 0) return StatusCode::kOk;
  // As many scratch slots as threads, rows and workspace allow (the API checked there is one).
  const size_t per = topk_min_workspace_size(p);
  int64_t slots = std::min<int64_t>(M, max_slots());
  if (per > 0) slots = std::min<int64_t>(slots, static_cast<int64_t>(p.workspace_bytes / per));
  if (slots < 1) return per > 0 ? StatusCode::kWorkspaceTooSmall : StatusCode::kInternal;
  const int64_t rows_per_slot = (M + slots - 1) / slots;
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  return parallel_for(slots, 1, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      TopkScratch sc{nullptr, nullptr};
      if (per > 0) {
        sc.keys = reinterpret_cast<uint32_t*>(ws + static_cast<size_t>(s) * per);
        sc.cand = sc.keys + W;
      }
      const int64_t r1 = std::min(M, (s + 1) * rows_per_slot);
      for (int64_t i = s * rows_per_slot; i < r1; ++i) {
        const int64_t len = p.lengths.ptr<const int32_t>()[i * p.lengths.stride[0]];
        int32_t* idx = p.indices.ptr<int32_t>() + i * p.indices.stride[0];
        float* val = p.values.present() ? p.values.ptr<float>() + i * p.values.stride[0] : nullptr;
        if (p.logits.dtype == DType::kBF16)
          topk_row(p.logits.ptr<const uint16_t>() + i * p.logits.stride[0], len, k, idx, val, sc);
        else
          topk_row(p.logits.ptr<const float>() + i * p.logits.stride[0], len, k, idx, val, sc);
      }
    }
  });
}

StatusCode map_indices(const MapIndicesParams& p) {
  const int64_t M = p.indices.shape[0], K = p.indices.shape[1];
  const bool paged = p.kind == IndexMapKind::kPaged;
  const int64_t page = p.page_size;
  const int64_t max_blocks = paged ? p.block_table.shape[1] : 0;
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  return parallel_for(M, 16, [&](int64_t b, int64_t e) {
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
}

}  // namespace cpu
}  // namespace dsa
