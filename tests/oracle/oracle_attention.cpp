#include "oracle/oracle_attention.h"

#include "oracle/oracle_numerics.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace oracle {

std::vector<double> decode_mla_cache(const void* data, bool fp8, int64_t num_blocks,
                                     int64_t page_size, int64_t block_stride_bytes) {
  const int64_t token_bytes = fp8 ? 656 : 1152;
  if (block_stride_bytes == 0) block_stride_bytes = page_size * token_bytes;
  const uint8_t* base = static_cast<const uint8_t*>(data);
  std::vector<double> out(static_cast<size_t>(num_blocks * page_size * kMlaDim));
  for (int64_t s = 0; s < num_blocks * page_size; ++s) {
    const uint8_t* tok = base + (s / page_size) * block_stride_bytes + (s % page_size) * token_bytes;
    double* o = &out[static_cast<size_t>(s * kMlaDim)];
    if (!fp8) {
      for (int d = 0; d < kMlaDim; ++d) {
        uint16_t v;
        std::memcpy(&v, tok + 2 * d, 2);
        o[d] = bf16_value(v);
      }
    } else {
      for (int d = 0; d < 512; ++d) {
        float scale;
        std::memcpy(&scale, tok + 512 + 4 * (d / 128), 4);
        o[d] = e4m3_value(tok[d]) * scale;
      }
      for (int d = 0; d < 64; ++d) {
        uint16_t v;
        std::memcpy(&v, tok + 528 + 2 * d, 2);
        o[512 + d] = bf16_value(v);
      }
    }
  }
  return out;
}

// One (token, head) row over an explicit list of key rows.
static void attend_row(const double* q, const std::vector<double>& keys,
                       const std::vector<int64_t>& rows, bool has_sink, double sink,
                       double sm_scale, double* out, double* lse, double* out_scale,
                       double* score_scale) {
  *score_scale = 0.0;
  if (rows.empty()) {
    for (int d = 0; d < kMlaVDim; ++d) out[d] = out_scale[d] = 0.0;
    *lse = std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<double> score(rows.size());
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < rows.size(); ++j) {
    const double* k = &keys[static_cast<size_t>(rows[j] * kMlaDim)];
    double dot = 0.0, abs_dot = 0.0;
    for (int d = 0; d < kMlaDim; ++d) {
      dot += q[d] * k[d];
      abs_dot += std::fabs(q[d] * k[d]);
    }
    score[j] = sm_scale * dot;
    *score_scale = std::max(*score_scale, sm_scale * abs_dot);
    mx = std::max(mx, score[j]);
  }
  double sum = 0.0;
  for (double& s : score) { s = std::exp(s - mx); sum += s; }
  for (int d = 0; d < kMlaVDim; ++d) {
    double acc = 0.0, abs_acc = 0.0;
    for (size_t j = 0; j < rows.size(); ++j) {
      const double v = keys[static_cast<size_t>(rows[j] * kMlaDim + d)];
      acc += score[j] * v;
      abs_acc += score[j] * std::fabs(v);
    }
    out[d] = acc / sum;
    out_scale[d] = abs_acc / sum;
  }
  *lse = mx + std::log(sum);
  if (has_sink) {
    const double f = std::exp(*lse - mx) / (std::exp(*lse - mx) + std::exp(sink - mx));
    for (int d = 0; d < kMlaVDim; ++d) {
      out[d] *= f;
      out_scale[d] *= f;
    }
  }
}

MlaResult sparse_mla(const std::vector<double>& q, int64_t T, int64_t H,
                     const std::vector<double>& keys, int64_t num_keys,
                     const std::vector<int32_t>& indices, int64_t K,
                     const std::vector<int32_t>& topk_length, const std::vector<double>& sink,
                     double sm_scale) {
  MlaResult r;
  r.out.assign(static_cast<size_t>(T * H * kMlaVDim), 0.0);
  r.lse.assign(static_cast<size_t>(T * H), 0.0);
  r.out_scale.assign(r.out.size(), 0.0);
  r.score_scale.assign(r.lse.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> rows;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t idx = indices[static_cast<size_t>(t * K + k)];
      const bool past_length = !topk_length.empty() && k >= topk_length[static_cast<size_t>(t)];
      if (idx < 0 || idx >= num_keys || past_length) continue;
      rows.push_back(idx);
    }
    for (int64_t h = 0; h < H; ++h) {
      attend_row(&q[static_cast<size_t>((t * H + h) * kMlaDim)], keys, rows, !sink.empty(),
                 sink.empty() ? 0.0 : sink[static_cast<size_t>(h)], sm_scale,
                 &r.out[static_cast<size_t>((t * H + h) * kMlaVDim)], &r.lse[static_cast<size_t>(t * H + h)],
                 &r.out_scale[static_cast<size_t>((t * H + h) * kMlaVDim)],
                 &r.score_scale[static_cast<size_t>(t * H + h)]);
    }
  }
  return r;
}

MlaResult dense_mla(const std::vector<double>& q, int64_t T, int64_t H,
                    const std::vector<double>& keys, const std::vector<int32_t>& cu_q,
                    const std::vector<int32_t>& cu_k, const std::vector<int32_t>& block_table,
                    int64_t max_blocks, const std::vector<int32_t>& kv_lens, int64_t page,
                    const std::vector<double>& sink, double sm_scale) {
  MlaResult r;
  r.out.assign(static_cast<size_t>(T * H * kMlaVDim), 0.0);
  r.lse.assign(static_cast<size_t>(T * H), 0.0);
  r.out_scale.assign(r.out.size(), 0.0);
  r.score_scale.assign(r.lse.size(), 0.0);
  const int64_t B = static_cast<int64_t>(cu_q.size()) - 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cu_q[b + 1] - cu_q[b];
    const int64_t kv_len = cu_k.empty() ? kv_lens[b] : cu_k[b + 1] - cu_k[b];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t t = cu_q[b] + i;
      std::vector<int64_t> rows;
      for (int64_t j = 0; j <= kv_len - q_len + i; ++j) {
        rows.push_back(cu_k.empty() ? int64_t{block_table[b * max_blocks + j / page]} * page + j % page
                                    : cu_k[b] + j);
      }
      for (int64_t h = 0; h < H; ++h) {
        attend_row(&q[static_cast<size_t>((t * H + h) * kMlaDim)], keys, rows, !sink.empty(),
                   sink.empty() ? 0.0 : sink[static_cast<size_t>(h)], sm_scale,
                   &r.out[static_cast<size_t>((t * H + h) * kMlaVDim)], &r.lse[static_cast<size_t>(t * H + h)],
                 &r.out_scale[static_cast<size_t>((t * H + h) * kMlaVDim)],
                 &r.score_scale[static_cast<size_t>(t * H + h)]);
      }
    }
  }
  return r;
}

}  // namespace oracle
