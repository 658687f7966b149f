#include "oracle/oracle_logits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dsa/numerics.h"

namespace oracle {
namespace {
constexpr int64_t D = 128;
const double kNegInf = -std::numeric_limits<double>::infinity();

double score8(const uint8_t* q8, const float* w, const uint8_t* k8, double k_scale, int64_t H) {
  double total = 0;
  for (int64_t h = 0; h < H; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d)
      dot += static_cast<double>(dsa::e4m3_to_float(q8[h * D + d])) * dsa::e4m3_to_float(k8[d]);
    total += static_cast<double>(w[h]) * std::max(dot, 0.0);
  }
  return total * k_scale;
}
}  // namespace

std::vector<double> indexer_logits(const std::vector<uint8_t>& q8, const std::vector<float>& w,
                                   const std::vector<uint8_t>& k8, const std::vector<float>& k_scale,
                                   const std::vector<int32_t>& ks, const std::vector<int32_t>& ke,
                                   int64_t H, int64_t col_offset, int64_t W) {
  const int64_t M = static_cast<int64_t>(ks.size());
  std::vector<double> out(static_cast<size_t>(M * W), kNegInf);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t c = 0; c < W; ++c) {
      const int64_t j = ks[i] + col_offset + c;
      if (j < ke[i]) out[i * W + c] = score8(&q8[i * H * D], &w[i * H], &k8[j * D], k_scale[j], H);
    }
  return out;
}

std::vector<double> indexer_logits_exact(const std::vector<float>& q, const std::vector<float>& w,
                                         const std::vector<float>& k, const std::vector<int32_t>& ks,
                                         const std::vector<int32_t>& ke, int64_t H, int64_t W) {
  const int64_t M = static_cast<int64_t>(ks.size());
  std::vector<double> out(static_cast<size_t>(M * W), kNegInf);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t c = 0; c < W; ++c) {
      const int64_t j = ks[i] + c;
      if (j >= ke[i]) continue;
      double total = 0;
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[(i * H + h) * D + d]) * k[j * D + d];
        total += static_cast<double>(w[i * H + h]) * std::max(dot, 0.0);
      }
      out[i * W + c] = total;
    }
  return out;
}

std::vector<double> indexer_logits_paged(const std::vector<uint8_t>& q8, const std::vector<float>& w,
                                         const uint8_t* cache, int64_t block_bytes, int64_t page,
                                         const std::vector<int32_t>& block_table, int64_t max_blocks,
                                         const std::vector<int32_t>& seq, const std::vector<int32_t>& len,
                                         int64_t H, int64_t col_offset, int64_t W) {
  const int64_t R = static_cast<int64_t>(seq.size());
  std::vector<double> out(static_cast<size_t>(R * W), kNegInf);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < W; ++c) {
      const int64_t j = col_offset + c;
      if (j >= len[r]) continue;
      const int64_t blk = block_table[seq[r] * max_blocks + j / page];
      const uint8_t* page_base = cache + blk * block_bytes;
      float s;
      std::memcpy(&s, page_base + page * D + (j % page) * 4, 4);
      out[r * W + c] = score8(&q8[r * H * D], &w[r * H], page_base + (j % page) * D, s, H);
    }
  return out;
}

std::vector<int32_t> topk_row(const float* x, int64_t len, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(len));
  for (int64_t j = 0; j < len; ++j) order[j] = static_cast<int32_t>(j);
  if (len > k) {
    // "a before b" = a ranks higher: larger value; NaN lowest; equal values -> lower index.
    auto better = [&](int32_t a, int32_t b) {
      const double va = x[a], vb = x[b];
      const bool na = std::isnan(va), nb = std::isnan(vb);
      if (na != nb) return nb;
      if (!na && va != vb) return va > vb;
      return a < b;
    };
    std::sort(order.begin(), order.end(), better);
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
  }
  order.resize(static_cast<size_t>(k), -1);
  return order;
}

int32_t map_flat(int64_t start, int64_t j) {
  if (j < 0) return -1;
  const int64_t a = start + j;
  return a > std::numeric_limits<int32_t>::max() ? -1 : static_cast<int32_t>(a);
}

int32_t map_paged(const int32_t* bt_row, int64_t max_blocks, int64_t page, int64_t j) {
  if (j < 0 || j >= max_blocks * page) return -1;
  const int64_t blk = bt_row[j / page];
  if (blk < 0) return -1;
  const int64_t a = blk * page + j % page;
  return a > std::numeric_limits<int32_t>::max() ? -1 : static_cast<int32_t>(a);
}

}  // namespace oracle
