// Dense attention in MHA form on the CPU (SPEC §5b), one sequence group at a time:
//  1. gather the group's latents [c_kv | k_pe] from the paged cache into f32 rows,
//  2. decompress K_nope and V for every context token and head with one GEMM per tile,
//     latent · kv_b_projᵀ, f32 accumulation, rounded to bf16 (as engines do): a real BLAS
//     (sgemm, when CMake found one: DSA_HAVE_BLAS) or our own blocked loop,
//  3. causal flash attention per (sequence, head, block of 64 queries): keys in chunks of 64,
//     online softmax in the log2 domain, f32 accumulation; lse.
// Every work item's arithmetic is fixed by the shape, so results do not depend on the thread
// count. Only context tokens are gathered: unused cache slots (NaN) never enter.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/mha_layout.h"
#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

#if defined(DSA_HAVE_BLAS)
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
// OpenBLAS only: our pool already runs the tiles in parallel.
void openblas_set_num_threads(int) __attribute__((weak));
}
#endif

namespace dsa {
namespace cpu {
namespace {

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float V16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;
inline V16 load16(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }

constexpr int64_t kLatent = 512;
constexpr int64_t kRope = 64;
constexpr int64_t kRow = kLatent + kRope;  // gathered latent row
constexpr int kTileTokens = 64;            // decompression tile
constexpr int kTileCols = 256;
constexpr int kQRows = 64;                 // queries per attention item
constexpr int kKeys = 64;                  // keys per chunk
constexpr int kRowGroup = 4;
constexpr float kLog2e = 1.4426950408889634f;

std::atomic<bool> g_blas_off{false};

bool use_blas() {
#if defined(DSA_HAVE_BLAS)
  static const bool init = [] {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    return true;
  }();
  return init && !g_blas_off.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// ---- decompression ----

// out[m][n] = Σ_k a[m][k] w[n][k] for a tile of m <= 64 rows, n = 256 columns, k = 512, our
// own loop: 4 rows x 4 columns of 16-lane partial sums along k.
void gemm_tile_own(const float* a, int64_t lda, const float* w, int m, int n, float* out, int ldo) {
  for (int r0 = 0; r0 < m; r0 += 4) {
    const int rn = std::min(4, m - r0);
    for (int c0 = 0; c0 < n; c0 += 4) {
      V16 acc[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = V16{};
      const float* ar[4];
      for (int i = 0; i < 4; ++i) ar[i] = a + (r0 + std::min(i, rn - 1)) * lda;
      const float* wr[4];
      for (int j = 0; j < 4; ++j) wr[j] = w + static_cast<int64_t>(c0 + j) * kLatent;
      for (int k = 0; k < kLatent; k += kLanes) {
        const V16 w0 = load16(wr[0] + k), w1 = load16(wr[1] + k), w2 = load16(wr[2] + k), w3 = load16(wr[3] + k);
        for (int i = 0; i < 4; ++i) {
          const V16 x = load16(ar[i] + k);
          acc[i][0] += x * w0;
          acc[i][1] += x * w1;
          acc[i][2] += x * w2;
          acc[i][3] += x * w3;
        }
      }
      for (int i = 0; i < rn; ++i)
        for (int j = 0; j < 4; ++j) {
          float s = 0.f;
          for (int l = 0; l < kLanes; ++l) s += acc[i][j][l];
          out[(r0 + i) * ldo + c0 + j] = s;
        }
    }
  }
}

void gemm_tile(const float* a, int64_t lda, const float* w, int m, int n, float* out, int ldo) {
#if defined(DSA_HAVE_BLAS)
  if (use_blas()) {
    const float one = 1.f, zero = 0.f;
    const int k = static_cast<int>(kLatent), la = static_cast<int>(lda), lw = static_cast<int>(kLatent);
    // Column-major: outᵀ (n x m) = wᵀᵀ (n x k) · aᵀ (k x m).
    sgemm_("T", "N", &n, &m, &k, &one, w, &lw, a, &la, &zero, out, &ldo);
    return;
  }
#endif
  gemm_tile_own(a, lda, w, m, n, out, ldo);
}

// ---- attention ----

struct Scratch {
  std::vector<float> q, kt, v, s, acc, m, l;
  Scratch(int dqk, int dv)
      : q(static_cast<size_t>(kQRows) * dqk), kt(static_cast<size_t>(dqk) * kKeys), v(static_cast<size_t>(kKeys) * dv),
        s(static_cast<size_t>(kQRows) * kKeys), acc(static_cast<size_t>(kQRows) * dv), m(kQRows), l(kQRows) {}
};

// s[r][0:64] = q[r][0:dqk] · kt[0:dqk][0:64] for NR rows.
template <int NR>
void scores(const float* q, int dqk, const float* kt, float* s) {
  V16 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = V16{};
  for (int d = 0; d < dqk; ++d) {
    const float* k = kt + d * kKeys;
    const V16 k0 = load16(k), k1 = load16(k + 16), k2 = load16(k + 32), k3 = load16(k + 48);
    for (int r = 0; r < NR; ++r) {
      const float x = q[r * dqk + d];
      acc[r][0] += x * k0;
      acc[r][1] += x * k1;
      acc[r][2] += x * k2;
      acc[r][3] += x * k3;
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) store16(s + r * kKeys + i * kLanes, acc[r][i]);
}

// acc[r][d0:d0+64] += Σ_{j<n} p[r][j] v[j][d0:d0+64] for NR rows.
template <int NR>
void values(const float* p, const float* v, int dv, int d0, int n, float* acc) {
  V16 a[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) a[r][i] = load16(acc + r * dv + d0 + i * kLanes);
  for (int j = 0; j < n; ++j) {
    const float* x = v + j * dv + d0;
    const V16 v0 = load16(x), v1 = load16(x + 16), v2 = load16(x + 32), v3 = load16(x + 48);
    for (int r = 0; r < NR; ++r) {
      const float pj = p[r * kKeys + j];
      a[r][0] += pj * v0;
      a[r][1] += pj * v1;
      a[r][2] += pj * v2;
      a[r][3] += pj * v3;
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) store16(acc + r * dv + d0 + i * kLanes, a[r][i]);
}

template <typename F>
void for_row_groups(int nr, F&& f) {
  int r = 0;
  for (; r + kRowGroup <= nr; r += kRowGroup) f(std::integral_constant<int, kRowGroup>{}, r);
  switch (nr - r) {
    case 3: f(std::integral_constant<int, 3>{}, r); break;
    case 2: f(std::integral_constant<int, 2>{}, r); break;
    case 1: f(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

struct Ctx {
  const DenseMhaPrefillParams& p;
  int64_t H, nope, v, dqk, stride_kv;  // stride_kv = H * (nope + v): one token's decompressed row
  const uint16_t* kv;                  // [tokens][H][nope + v] bf16
  const float* latent;                 // [tokens][576] f32
};

float load_q(const TensorDesc& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.ptr<float>()[i] : bf16_to_float(t.ptr<uint16_t>()[i]);
}

// Queries t0 .. t0 + nr - 1 (local i0 .. of a sequence with prefix keys before them) of head h
// against the sequence's context rows ctx0 .. in the workspace.
void attend(const Ctx& c, int64_t h, int64_t t0, int64_t i0, int nr, int64_t prefix, int64_t ctx0, Scratch& s) {
  const DenseMhaPrefillParams& p = c.p;
  const int dqk = static_cast<int>(c.dqk), dv = static_cast<int>(c.v), nope = static_cast<int>(c.nope);
  const float qs = p.sm_scale * kLog2e;
  for (int r = 0; r < nr; ++r) {
    const int64_t t = t0 + r;
    float* q = s.q.data() + r * dqk;
    const int64_t bn = t * p.q_nope.stride[0] + h * p.q_nope.stride[1];
    const int64_t bp = t * p.q_pe.stride[0] + h * p.q_pe.stride[1];
    for (int d = 0; d < nope; ++d) q[d] = load_q(p.q_nope, bn + d) * qs;
    for (int d = 0; d < kRope; ++d) q[nope + d] = load_q(p.q_pe, bp + d) * qs;
  }
  std::fill(s.acc.begin(), s.acc.end(), 0.f);
  std::fill(s.m.begin(), s.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(s.l.begin(), s.l.end(), 0.f);
  // Row r sees keys < L_r = prefix + i0 + r + 1; the last row sees the most.
  const int64_t keys = prefix + i0 + nr;
  for (int64_t c0 = 0; c0 < keys; c0 += kKeys) {
    const int n = static_cast<int>(std::min<int64_t>(kKeys, keys - c0));
    float* kt = s.kt.data();
    float* vv = s.v.data();
    for (int j = 0; j < n; ++j) {
      const uint16_t* row = c.kv + (ctx0 + c0 + j) * c.stride_kv + h * (c.nope + c.v);
      const float* lat = c.latent + (ctx0 + c0 + j) * kRow;
      for (int d = 0; d < nope; ++d) kt[d * kKeys + j] = bf16_to_float(row[d]);
      for (int d = 0; d < kRope; ++d) kt[(nope + d) * kKeys + j] = lat[kLatent + d];
      for (int d = 0; d < dv; ++d) vv[j * dv + d] = bf16_to_float(row[nope + d]);
    }
    for (int j = n; j < kKeys; ++j)
      for (int d = 0; d < dqk; ++d) kt[d * kKeys + j] = 0.f;
    for_row_groups(nr, [&](auto NR, int r) {
      scores<decltype(NR)::value>(s.q.data() + r * dqk, dqk, kt, s.s.data() + r * kKeys);
    });
    for (int r = 0; r < nr; ++r) {
      float* sc = s.s.data() + r * kKeys;
      const int64_t L = prefix + i0 + r + 1;
      const int valid = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kKeys, L - c0)));
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < valid; ++j) mx = std::max(mx, sc[j]);
      if (valid == 0) {  // a later chunk this row does not see
        std::fill(sc, sc + kKeys, 0.f);
        continue;
      }
      const float m_new = std::max(s.m[r], mx);
      const float alpha = std::exp2(s.m[r] - m_new);  // 0 on the first chunk (m = -inf)
      float sum = 0.f;
      for (int j = 0; j < valid; ++j) {
        sc[j] = std::exp2(sc[j] - m_new);
        sum += sc[j];
      }
      for (int j = valid; j < kKeys; ++j) sc[j] = 0.f;
      s.m[r] = m_new;
      s.l[r] = s.l[r] * alpha + sum;
      if (alpha != 1.f)
        for (int d = 0; d < dv; ++d) s.acc[r * dv + d] *= alpha;
    }
    for (int d0 = 0; d0 < dv; d0 += 64)
      for_row_groups(nr, [&](auto NR, int r) {
        values<decltype(NR)::value>(s.s.data() + r * kKeys, vv, dv, d0, n, s.acc.data() + r * dv);
      });
  }
  for (int r = 0; r < nr; ++r) {
    const int64_t t = t0 + r;
    const double lse_d = (static_cast<double>(s.m[r]) + std::log2(static_cast<double>(s.l[r]))) * 0.6931471805599453;
    double f = 1.0 / static_cast<double>(s.l[r]);
    if (p.attn_sink.present()) f /= 1.0 + std::exp(static_cast<double>(p.attn_sink.ptr<float>()[h * p.attn_sink.stride[0]]) - lse_d);
    const float factor = static_cast<float>(f);
    p.lse.ptr<float>()[t * p.lse.stride[0] + h * p.lse.stride[1]] = static_cast<float>(lse_d);
    const float* a = s.acc.data() + r * dv;
    const int64_t o = t * p.out.stride[0] + h * p.out.stride[1];
    if (p.out.dtype == DType::kF32) {
      for (int d = 0; d < dv; ++d) p.out.ptr<float>()[o + d] = a[d] * factor;
    } else {
      for (int d = 0; d < dv; ++d) p.out.ptr<uint16_t>()[o + d] = float_to_bf16(a[d] * factor);
    }
  }
}

int32_t i32(const TensorDesc& t, int64_t i) { return t.ptr<int32_t>()[i * t.stride[0]]; }

}  // namespace

bool mha_uses_blas() { return use_blas(); }
void set_mha_blas(bool on) { g_blas_off.store(!on); }

StatusCode dense_mha_prefill_group(const DenseMhaPrefillParams& p, const core::MhaGroup& g) {
  const int64_t H = p.q_nope.shape[1], nope = p.q_nope.shape[2], v = p.out.shape[2];
  const int64_t N = H * (nope + v);
  const core::MhaLayout lay = core::mha_layout(DeviceType::kCPU, H, nope, v, g.tokens);
  uint8_t* base = static_cast<uint8_t*>(p.workspace);
  base += (core::kMhaAlign - reinterpret_cast<uintptr_t>(base) % core::kMhaAlign) % core::kMhaAlign;
  uint16_t* kv = reinterpret_cast<uint16_t*>(base + lay.kv);
  float* latent = reinterpret_cast<float*>(base + lay.latent);
  float* w = reinterpret_cast<float*>(base + lay.extra);

  // Context row offsets of the group's sequences.
  const int64_t nb = g.b1 - g.b0;
  std::vector<int64_t> off(static_cast<size_t>(nb) + 1, 0);
  for (int64_t b = 0; b < nb; ++b) off[b + 1] = off[b] + i32(p.kv_lens, g.b0 + b);
  const int64_t tokens = off[nb];
  if (tokens == 0) return StatusCode::kOk;

  // 1. the weight in f32 and the latents.
  const TensorDesc& W = p.kv_b_proj;
  StatusCode sc = parallel_for(N, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* src = W.ptr<uint16_t>() + r * W.stride[0];
      for (int64_t k = 0; k < kLatent; ++k) w[r * kLatent + k] = bf16_to_float(src[k]);
    }
  });
  if (sc != StatusCode::kOk) return sc;
  const int64_t page = p.cache.page_size;
  const uint8_t* cache = static_cast<const uint8_t*>(p.cache.data);
  const bool fp8 = p.cache.dtype == MlaCacheDtype::kFP8;
  sc = parallel_for(nb, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t b = s0; b < s1; ++b) {
      const int32_t* bt = p.block_table.ptr<int32_t>() + (g.b0 + b) * p.block_table.stride[0];
      for (int64_t j = 0; j < off[b + 1] - off[b]; ++j) {
        const int64_t blk = bt[(j / page) * p.block_table.stride[1]];
        const uint8_t* tok = cache + blk * p.cache.block_bytes() + (j % page) * p.cache.token_bytes();
        float* dst = latent + (off[b] + j) * kRow;
        if (!fp8) {
          for (int64_t d = 0; d < kRow; ++d) {
            uint16_t x;
            std::memcpy(&x, tok + 2 * d, 2);
            dst[d] = bf16_to_float(x);
          }
        } else {
          float scale[4];
          std::memcpy(scale, tok + kMlaFp8ScaleOffset, sizeof(scale));
          for (int64_t d = 0; d < kLatent; ++d) dst[d] = e4m3_to_float(tok[d]) * scale[d / kMlaFp8TileSize];
          for (int64_t d = 0; d < kRope; ++d) {
            uint16_t x;
            std::memcpy(&x, tok + kMlaFp8RopeOffset + 2 * d, 2);
            dst[kLatent + d] = bf16_to_float(x);
          }
        }
      }
    }
  });
  if (sc != StatusCode::kOk) return sc;

  // 2. decompression: kv[j][n] = bf16(Σ_k latent[j][k] w[n][k]).
  const int64_t row_tiles = (tokens + kTileTokens - 1) / kTileTokens;
  const int64_t col_tiles = (N + kTileCols - 1) / kTileCols;
  sc = parallel_for(row_tiles * col_tiles, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> tile(static_cast<size_t>(kTileTokens) * kTileCols);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t ct = it % col_tiles, rt = it / col_tiles;
      const int m = static_cast<int>(std::min<int64_t>(kTileTokens, tokens - rt * kTileTokens));
      const int n = static_cast<int>(std::min<int64_t>(kTileCols, N - ct * kTileCols));
      gemm_tile(latent + rt * kTileTokens * kRow, kRow, w + ct * kTileCols * kLatent, m, n, tile.data(), kTileCols);
      for (int r = 0; r < m; ++r) {
        uint16_t* dst = kv + (rt * kTileTokens + r) * N + ct * kTileCols;
        for (int c = 0; c < n; ++c) dst[c] = float_to_bf16(tile[r * kTileCols + c]);
      }
    }
  });
  if (sc != StatusCode::kOk) return sc;

  // 3. attention, one item per (sequence, query block, head); cheap and expensive blocks
  // interleaved so that contiguous ranges of items carry similar loads.
  struct Item {
    int64_t b, t0, i0;
    int nr;
  };
  std::vector<Item> blocks;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t q0 = i32(p.cu_seqlens_q, g.b0 + b), q1 = i32(p.cu_seqlens_q, g.b0 + b + 1);
    for (int64_t t = q0; t < q1; t += kQRows)
      blocks.push_back(Item{b, t, t - q0, static_cast<int>(std::min<int64_t>(kQRows, q1 - t))});
  }
  const Ctx c{p, H, nope, v, nope + kRope, N, kv, latent};
  const int64_t nblk = static_cast<int64_t>(blocks.size());
  sc = parallel_for(nblk * H, 1, [&](int64_t i0, int64_t i1) {
    Scratch s(static_cast<int>(nope + kRope), static_cast<int>(v));
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t r = it / H, h = it % H;
      const int64_t k = (r % 2 == 0) ? r / 2 : nblk - 1 - r / 2;
      const Item& item = blocks[static_cast<size_t>(k)];
      const int64_t q_len = i32(p.cu_seqlens_q, g.b0 + item.b + 1) - i32(p.cu_seqlens_q, g.b0 + item.b);
      const int64_t kv_len = off[item.b + 1] - off[item.b];
      attend(c, h, item.t0, item.i0, item.nr, kv_len - q_len, off[item.b], s);
    }
  });
  return sc;
}

}  // namespace cpu
}  // namespace dsa
