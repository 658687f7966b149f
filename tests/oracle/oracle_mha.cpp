#include "oracle/oracle_mha.h"

#include <cmath>
#include <limits>

namespace oracle {

double round_bf16(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e;
  std::frexp(x, &e);                        // |x| in [2^(e-1), 2^e)
  const double step = std::ldexp(1.0, e - 8);  // 8 significant bits
  const double q = x / step;
  double r = std::nearbyint(q);             // ties to even (default rounding mode)
  return r * step;
}

MhaResult dense_mha(const std::vector<double>& q_nope, const std::vector<double>& q_pe, int64_t T, int64_t H,
                    int64_t nope, int64_t v, const std::vector<double>& w, const std::vector<double>& latents,
                    const std::vector<int32_t>& cu_q, const std::vector<int32_t>& block_table, int64_t max_blocks,
                    const std::vector<int32_t>& kv_lens, int64_t page, const std::vector<double>& sink,
                    double sm_scale, bool round_kv) {
  MhaResult r;
  r.out.assign(static_cast<size_t>(T * H * v), 0.0);
  r.lse.assign(static_cast<size_t>(T * H), 0.0);
  r.out_scale.assign(r.out.size(), 0.0);
  r.score_scale.assign(r.lse.size(), 0.0);
  const int64_t B = static_cast<int64_t>(cu_q.size()) - 1;
  const int64_t qk = nope + 64;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cu_q[b + 1] - cu_q[b], kv_len = kv_lens[b];
    for (int64_t h = 0; h < H; ++h) {
      // Decompress this head's keys and values for the whole context.
      std::vector<double> k(static_cast<size_t>(kv_len * qk)), val(static_cast<size_t>(kv_len * v));
      for (int64_t j = 0; j < kv_len; ++j) {
        const int64_t slot = int64_t{block_table[b * max_blocks + j / page]} * page + j % page;
        const double* c = &latents[static_cast<size_t>(slot * 576)];
        for (int64_t d = 0; d < nope + v; ++d) {
          const double* wr = &w[static_cast<size_t>((h * (nope + v) + d) * 512)];
          double s = 0.0;
          for (int64_t i = 0; i < 512; ++i) s += wr[i] * c[i];
          if (round_kv) s = round_bf16(s);
          if (d < nope) k[static_cast<size_t>(j * qk + d)] = s;
          else val[static_cast<size_t>(j * v + d - nope)] = s;
        }
        for (int64_t d = 0; d < 64; ++d) k[static_cast<size_t>(j * qk + nope + d)] = c[512 + d];
      }
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t t = cu_q[b] + i, row = t * H + h;
        const int64_t L = kv_len - q_len + i + 1;
        std::vector<double> q(static_cast<size_t>(qk)), p(static_cast<size_t>(L));
        for (int64_t d = 0; d < nope; ++d) q[d] = q_nope[static_cast<size_t>(row * nope + d)];
        for (int64_t d = 0; d < 64; ++d) q[nope + d] = q_pe[static_cast<size_t>(row * 64 + d)];
        double mx = -std::numeric_limits<double>::infinity(), sc = 0.0;
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0.0, ad = 0.0;
          for (int64_t d = 0; d < qk; ++d) {
            dot += q[d] * k[static_cast<size_t>(j * qk + d)];
            ad += std::fabs(q[d] * k[static_cast<size_t>(j * qk + d)]);
          }
          p[j] = sm_scale * dot;
          sc = std::max(sc, sm_scale * ad);
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (double& x : p) {
          x = std::exp(x - mx);
          sum += x;
        }
        const double lse = mx + std::log(sum);
        double f = 1.0;
        if (!sink.empty()) f = 1.0 / (1.0 + std::exp(sink[static_cast<size_t>(h)] - lse));
        for (int64_t d = 0; d < v; ++d) {
          double acc = 0.0, aa = 0.0;
          for (int64_t j = 0; j < L; ++j) {
            acc += p[j] * val[static_cast<size_t>(j * v + d)];
            aa += p[j] * std::fabs(val[static_cast<size_t>(j * v + d)]);
          }
          r.out[static_cast<size_t>(row * v + d)] = acc / sum * f;
          r.out_scale[static_cast<size_t>(row * v + d)] = aa / sum * f;
        }
        r.lse[static_cast<size_t>(row)] = lse;
        r.score_scale[static_cast<size_t>(row)] = sc;
      }
    }
  }
  return r;
}

}  // namespace oracle
