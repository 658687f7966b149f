// CPU backend of the distributed ops (dsa/dist.h, src/core/dist_ops.h).
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dist_math.h"
#include "core/dist_ops.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

namespace dsa {
namespace distops {
namespace cpu {

using ::dsa::cpu::parallel_for;

StatusCode candidates(const CandidatesArgs& a) {
  const float ninf = -std::numeric_limits<float>::infinity();
  return parallel_for(a.M, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < a.k; ++j) {
        const int32_t li = a.local_idx[i * a.k + j];
        float v = ninf;
        int32_t g = -1;
        if (li >= 0) {
          if (a.logits.dtype == DType::kBF16)
            v = bf16_to_float(a.logits.ptr<const uint16_t>()[i * a.logits.stride[0] + li]);
          else
            v = a.logits.ptr<const float>()[i * a.logits.stride[0] + li];
          g = static_cast<int32_t>(global_of(li, a.ranks, a.rank, a.interleave));
        }
        a.vals[i * a.k + j] = v;
        a.pos[i * a.k + j] = g;
      }
    }
  });
}

StatusCode merge(const MergeArgs& a) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t W = a.ranks * a.k;
  return parallel_for(a.M, 4, [&](int64_t b, int64_t e) {
    int64_t head[kMaxRanks];
    for (int64_t i = b; i < e; ++i) {
      for (int r = 0; r < a.ranks; ++r) head[r] = 0;
      float* mv = a.mvals + i * W;
      int32_t* mp = a.mpos + i * W;
      int64_t n = 0;
      for (;;) {  // R-way merge by position; positions of different ranks are distinct
        int best = -1;
        int32_t bp = 0;
        for (int r = 0; r < a.ranks; ++r) {
          if (head[r] >= a.k) continue;
          const int32_t p = a.pos[(static_cast<int64_t>(r) * a.M + i) * a.k + head[r]];
          if (p < 0) continue;
          if (best < 0 || p < bp) {
            best = r;
            bp = p;
          }
        }
        if (best < 0) break;
        const int64_t src = (static_cast<int64_t>(best) * a.M + i) * a.k + head[best];
        mv[n] = a.vals[src];
        mp[n] = bp;
        ++n;
        ++head[best];
      }
      a.mlen[i] = static_cast<int32_t>(n);
      for (int64_t j = n; j < W; ++j) {
        mv[j] = ninf;
        mp[j] = -1;
      }
    }
  });
}

StatusCode final_select(const FinalArgs& a) {
  const float ninf = -std::numeric_limits<float>::infinity();
  return parallel_for(a.M, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int32_t* idx = a.indices.ptr<int32_t>() + i * a.indices.stride[0];
      float* val = a.values.present() ? a.values.ptr<float>() + i * a.values.stride[0] : nullptr;
      for (int64_t j = 0; j < a.k; ++j) {
        const int32_t s = a.sel[i * a.k + j];
        const bool ok = s >= 0 && s < a.width;
        idx[j] = ok ? a.mpos[i * a.width + s] : -1;
        if (val) val[j] = ok ? a.mvals[i * a.width + s] : ninf;
      }
    }
  });
}

StatusCode local_indices(const LocalIndicesArgs& a) {
  const int64_t M = a.indices.shape[0], K = a.indices.shape[1];
  return parallel_for(M, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int32_t* in = a.indices.ptr<const int32_t>() + i * a.indices.stride[0];
      int32_t* out = a.out.ptr<int32_t>() + i * a.out.stride[0];
      for (int64_t j = 0; j < K; ++j) {
        const int32_t g = in[j];
        out[j] = (g >= 0 && owner_of(g, a.ranks, a.interleave) == a.rank)
                     ? static_cast<int32_t>(local_of(g, a.ranks, a.interleave))
                     : -1;
      }
    }
  });
}

StatusCode lse_merge(const LseMergeArgs& a) {
  const int64_t TH = a.T * a.H;
  return parallel_for(TH, 8, [&](int64_t b, int64_t e) {
    float w[kMaxRanks];
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / a.H, h = th % a.H;
      float L = lse_merge_weights<kMaxRanks>(a.lses + th, TH, a.ranks, w);
      float f = 1.f;
      if (a.attn_sink.present() && !(L == INFINITY))
        f = sink_factor(L, a.attn_sink.ptr<const float>()[h * a.attn_sink.stride[0]]);
      if (a.lse.present()) a.lse.ptr<float>()[t * a.lse.stride[0] + h * a.lse.stride[1]] = L;
      float* of = a.out.dtype == DType::kF32 ? a.out.ptr<float>() + t * a.out.stride[0] + h * a.out.stride[1] : nullptr;
      uint16_t* ob = of ? nullptr : a.out.ptr<uint16_t>() + t * a.out.stride[0] + h * a.out.stride[1];
      for (int64_t d = 0; d < a.D; ++d) {
        float acc = 0.f;
        for (int r = 0; r < a.ranks; ++r) {
          if (w[r] == 0.f) continue;  // no key on rank r (or a negligible one: adds 0)
          const int64_t src = (static_cast<int64_t>(r) * TH + th) * a.D + d;
          const float x = a.part_dtype == DType::kF32
                              ? static_cast<const float*>(a.parts)[src]
                              : bf16_to_float(static_cast<const uint16_t*>(a.parts)[src]);
          acc = std::fma(w[r], x, acc);
        }
        acc *= f;
        if (of) of[d] = acc;
        else ob[d] = float_to_bf16(acc);
      }
    }
  });
}

}  // namespace cpu
}  // namespace distops
}  // namespace dsa
