// The absorbed form's per-head projections on the CPU (dsa/mha.h): q_abs = [W_UKᵀ q_nope | q_pe]
// and out = W_UV latent. One work item per (head, block of rows): the item widens its head's
// weight rows to f32 once (1/(2 * rows) of its multiply-adds), then accumulates in f32.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/mha.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

constexpr int64_t kLatent = 512, kRope = 64, kRowBlock = 128;

float load(const TensorDesc& t, int64_t i) {
  return t.dtype == DType::kBF16 ? bf16_to_float(t.ptr<const uint16_t>()[i]) : t.ptr<const float>()[i];
}
void store(const TensorDesc& t, int64_t i, float x) {
  if (t.dtype == DType::kBF16) t.ptr<uint16_t>()[i] = float_to_bf16(x);
  else t.ptr<float>()[i] = x;
}

// Rows [r0, r0 + n) of the weight, widened to f32 ([n, 512]).
void widen_rows(const TensorDesc& w, int64_t r0, int64_t n, std::vector<float>* out) {
  out->resize(static_cast<size_t>(n * kLatent));
  for (int64_t r = 0; r < n; ++r) {
    const uint16_t* src = w.ptr<const uint16_t>() + (r0 + r) * w.stride[0];
    for (int64_t c = 0; c < kLatent; ++c) (*out)[static_cast<size_t>(r * kLatent + c)] = bf16_to_float(src[c]);
  }
}

// body(h, t0, t1, w) for every (head, block of rows), items on the pool; w is the head's `rows`
// weight rows from row h * per_head + first, widened once per head a worker meets.
template <typename Body>
StatusCode over_head_blocks(const TensorDesc& weight, int64_t T, int64_t H, int64_t per_head, int64_t first,
                            int64_t rows, Body&& body) {
  const int64_t blocks = (T + kRowBlock - 1) / kRowBlock;
  return parallel_for(H * blocks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> w;
    int64_t w_head = -1;
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t h = it / blocks, t0 = (it % blocks) * kRowBlock;
      if (h != w_head) {
        widen_rows(weight, h * per_head + first, rows, &w);
        w_head = h;
      }
      body(h, t0, std::min(T, t0 + kRowBlock), w.data());
    }
  });
}

}  // namespace

StatusCode mla_absorb_q(const MlaAbsorbQParams& p) {
  const int64_t T = p.q_nope.shape[0], H = p.q_nope.shape[1], nope = p.q_nope.shape[2];
  // W_UK[h]: rows [0, qk_nope) of the head's block.
  return over_head_blocks(p.kv_b_proj, T, H, nope + p.v_dim, 0, nope,
                          [&](int64_t h, int64_t t0, int64_t t1, const float* w) {
    float acc[kLatent];
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc, acc + kLatent, 0.0f);
      const int64_t qi = t * p.q_nope.stride[0] + h * p.q_nope.stride[1];
      for (int64_t d = 0; d < nope; ++d) {
        const float a = load(p.q_nope, qi + d);
        const float* wr = w + d * kLatent;
        for (int64_t c = 0; c < kLatent; ++c) acc[c] += a * wr[c];
      }
      const int64_t oi = t * p.q_out.stride[0] + h * p.q_out.stride[1];
      for (int64_t c = 0; c < kLatent; ++c) store(p.q_out, oi + c, acc[c]);
      const int64_t pi = t * p.q_pe.stride[0] + h * p.q_pe.stride[1];
      for (int64_t r = 0; r < kRope; ++r) store(p.q_out, oi + kLatent + r, load(p.q_pe, pi + r));
    }
  });
}

StatusCode mla_up_project(const MlaUpProjectParams& p) {
  const int64_t T = p.latent.shape[0], H = p.latent.shape[1], v = p.out.shape[2];
  // W_UV[h]: rows [qk_nope, qk_nope + v) of the head's block.
  return over_head_blocks(p.kv_b_proj, T, H, p.qk_nope + v, p.qk_nope, v,
                          [&](int64_t h, int64_t t0, int64_t t1, const float* w) {
    float lat[kLatent];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t li = t * p.latent.stride[0] + h * p.latent.stride[1];
      for (int64_t c = 0; c < kLatent; ++c) lat[c] = load(p.latent, li + c);
      const int64_t oi = t * p.out.stride[0] + h * p.out.stride[1];
      for (int64_t e = 0; e < v; ++e) {
        // 16 partial sums: a vectorisable dot product without reassociation flags.
        float part[16] = {};
        const float* wr = w + e * kLatent;
        for (int64_t c = 0; c < kLatent; c += 16)
          for (int l = 0; l < 16; ++l) part[l] += lat[c + l] * wr[c + l];
        float s = 0.0f;
        for (float x : part) s += x;
        store(p.out, oi + e, s);
      }
    }
  });
}

}  // namespace cpu
}  // namespace dsa
