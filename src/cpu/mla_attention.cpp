// Sparse and dense MLA attention on the CPU (SPEC §5).
//
// Every head of a token attends to the same keys (absorbed MQA form), so the work unit is
// one token and a range of its heads: its keys are gathered in chunks of kChunk, converted to
// f32 once per chunk in two layouts (transposed [576][kChunk] for the q·k scores, row-major
// [kChunk][576] for p·v), and all heads of the range run over the chunk with an online
// softmax in the log2 domain. Dense attention is the same engine with the key list
// 0 .. L_t - 1 of the token's sequence, so dense and sparse agree bit for bit on equal key
// lists. Only valid keys are ever read: invalid indices and unused cache slots (NaN) never
// enter the arithmetic.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/parallel.h"
#include "dsa/numerics.h"

namespace dsa {
namespace cpu {
namespace {

constexpr int kDim = 576;     // [c_kv 512 | k_pe 64]
constexpr int kVDim = 512;
constexpr int kChunk = 64;    // keys per converted block
constexpr int kHeadGroup = 4; // heads per micro-kernel call
constexpr float kLog2e = 1.4426950408889634f;

// The micro-kernels use GCC/Clang vector extensions: with plain arrays GCC interchanges the
// loops and keeps the accumulators in memory. 16 floats = one AVX-512 register (two AVX2 ones).
#if defined(__GNUC__) && !defined(__clang__)
// Without AVX-512 GCC warns that passing 64-byte vectors changes the ABI; these helpers are
// internal and inlined, so no ABI is involved.
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
typedef uint32_t U16 __attribute__((vector_size(64)));
typedef uint8_t B16 __attribute__((vector_size(16)));

// 16 E4M3fn codes to floats times `scale`, by bit arithmetic on whole vectors (the values
// of dsa::e4m3_to_float): normal codes place exponent and mantissa into f32 bits,
// subnormals are man * 2^-9, 0x7f/0xff are NaN.
inline void e4m3x16_to_float(const uint8_t* src, float scale, float* dst) {
  B16 b;
  std::memcpy(&b, src, sizeof(b));
  const U16 v = __builtin_convertvector(b, U16);
  const U16 sign = (v & 0x80u) << 24;
  const U16 exp = (v >> 3) & 0xfu, man = v & 0x7u;
  const U16 normal = sign | ((exp + 120u) << 23) | (man << 20);
  const V16 sub_f = __builtin_convertvector(man, V16) * 0.001953125f;
  U16 sub;
  std::memcpy(&sub, &sub_f, sizeof(sub));
  sub |= sign;
  const U16 nan = sign | 0x7fc00000u;
  const U16 is_sub = (U16)(exp == 0u);  // comparisons give all-ones lanes
  const U16 is_nan = (U16)((v & 0x7fu) == 0x7fu);
  U16 bits = (normal & ~is_sub) | (sub & is_sub);
  bits = (bits & ~is_nan) | (nan & is_nan);
  V16 f;
  std::memcpy(&f, &bits, sizeof(f));
  store16(dst, f * scale);
}

// Where keys come from: a flat [S, 576] tensor (f32 or bf16) or a paged cache.
struct KeySource {
  const uint8_t* base = nullptr;
  bool paged = false;
  DType flat_dtype = DType::kF32;
  int64_t flat_row_stride = 0;  // elements
  MlaCacheDtype cache_dtype = MlaCacheDtype::kBF16;
  int64_t page_size = 1;
  int64_t block_bytes = 0;
  int64_t token_bytes = 0;

  explicit KeySource(const MlaKv& kv) {
    if (kv.flat.present()) {
      base = static_cast<const uint8_t*>(kv.flat.data);
      flat_dtype = kv.flat.dtype;
      flat_row_stride = kv.flat.stride[0];
    } else {
      paged = true;
      base = static_cast<const uint8_t*>(kv.paged.data);
      cache_dtype = kv.paged.dtype;
      page_size = kv.paged.page_size;
      block_bytes = kv.paged.block_bytes();
      token_bytes = kv.paged.token_bytes();
    }
  }

  const uint8_t* address(int64_t slot) const {
    if (!paged) return base + slot * flat_row_stride * static_cast<int64_t>(dtype_size(flat_dtype));
    return base + (slot / page_size) * block_bytes + (slot % page_size) * token_bytes;
  }
  // Sparse keys are scattered over the whole cache: fetch a key's lines ahead of its use.
  void prefetch(int64_t slot) const {
    const uint8_t* a = address(slot);
    const int64_t bytes = paged ? token_bytes : kDim * static_cast<int64_t>(dtype_size(flat_dtype));
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(a + off);
  }

  // Decodes key `slot` (row of the flat tensor, or cache slot) into dst[576].
  void load(int64_t slot, float* __restrict dst) const {
    if (!paged) {
      if (flat_dtype == DType::kF32) {
        std::memcpy(dst, reinterpret_cast<const float*>(base) + slot * flat_row_stride, kDim * 4);
      } else {
        const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + slot * flat_row_stride;
        bf16_row(src, dst, kDim);
      }
      return;
    }
    const uint8_t* tok = base + (slot / page_size) * block_bytes + (slot % page_size) * token_bytes;
    if (cache_dtype == MlaCacheDtype::kBF16) {
      uint16_t tmp[kDim];
      std::memcpy(tmp, tok, sizeof(tmp));
      bf16_row(tmp, dst, kDim);
      return;
    }
    float scale[4];
    std::memcpy(scale, tok + kMlaFp8ScaleOffset, sizeof(scale));
    for (int tile = 0; tile < 4; ++tile) {
      const uint8_t* q8 = tok + tile * kMlaFp8TileSize;
      float* o = dst + tile * kMlaFp8TileSize;
      const float s = scale[tile];
      for (int i = 0; i < kMlaFp8TileSize; i += kLanes) e4m3x16_to_float(q8 + i, s, o + i);
    }
    uint16_t rope[kDim - kVDim];
    std::memcpy(rope, tok + kMlaFp8RopeOffset, sizeof(rope));
    bf16_row(rope, dst + kVDim, kDim - kVDim);
  }

  static void bf16_row(const uint16_t* __restrict src, float* __restrict dst, int n) {
    for (int i = 0; i < n; ++i) dst[i] = bits_float(static_cast<uint32_t>(src[i]) << 16);
  }
};

// Per-task scratch, reused across the task's work items.
struct Scratch {
  std::vector<float> key_t;    // [576][kChunk]
  std::vector<float> key_rows; // [kChunk][576]
  std::vector<float> q;        // [heads][576], pre-scaled by sm_scale * log2(e)
  std::vector<float> acc;      // [heads][512]
  std::vector<float> score;    // [heads][kChunk]
  std::vector<float> m, l;     // running max (log2 domain) and sum per head
  std::vector<int64_t> slots;  // the token's valid keys
  explicit Scratch(int heads)
      : key_t(static_cast<size_t>(kDim) * kChunk, 0.f), key_rows(static_cast<size_t>(kChunk) * kDim, 0.f),
        q(static_cast<size_t>(heads) * kDim), acc(static_cast<size_t>(heads) * kVDim),
        score(static_cast<size_t>(heads) * kChunk), m(heads), l(heads) {}
};

// Both micro-kernels work on one slice of kSlice dims, so that the slice of the key block
// (kSlice x kChunk floats = 16 KiB) stays in L1 while every head group passes over it; the
// accumulators go through memory between slices, which keeps each element's summation order
// (dims ascending, keys ascending) independent of the grouping.
constexpr int kSlice = 64;
static_assert(kDim % kSlice == 0 && kVDim % kSlice == 0, "dims in slices of 64");

// score[h][0:kChunk] += q[h][0:kSlice] · key_t[0:kSlice][0:kChunk] for NH heads.
template <int NH>
void scores_slice(const float* __restrict q, const float* __restrict key_t, float* __restrict score) {
  static_assert(kChunk == 4 * kLanes, "one register row of accumulators per head");
  V16 acc[NH][4];
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < 4; ++i) acc[h][i] = load16(score + h * kChunk + i * kLanes);
  for (int d = 0; d < kSlice; ++d) {
    const float* k = key_t + d * kChunk;
    const V16 k0 = load16(k), k1 = load16(k + 16), k2 = load16(k + 32), k3 = load16(k + 48);
    for (int h = 0; h < NH; ++h) {
      const float qv = q[h * kDim + d];
      acc[h][0] += qv * k0;
      acc[h][1] += qv * k1;
      acc[h][2] += qv * k2;
      acc[h][3] += qv * k3;
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < 4; ++i) store16(score + h * kChunk + i * kLanes, acc[h][i]);
}

// acc[h][0:kSlice] += Σ_{j < n} p[h][j] · key_rows[j][0:kSlice] for NH heads.
template <int NH>
void values_slice(const float* __restrict p, const float* __restrict key_rows, int n, float* __restrict acc) {
  static_assert(kSlice == 4 * kLanes, "four registers per head");
  V16 a[NH][4];
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < 4; ++i) a[h][i] = load16(acc + h * kVDim + i * kLanes);
  for (int j = 0; j < n; ++j) {
    const float* v = key_rows + j * kDim;
    const V16 v0 = load16(v), v1 = load16(v + 16), v2 = load16(v + 32), v3 = load16(v + 48);
    for (int h = 0; h < NH; ++h) {
      const float pj = p[h * kChunk + j];
      a[h][0] += pj * v0;
      a[h][1] += pj * v1;
      a[h][2] += pj * v2;
      a[h][3] += pj * v3;
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < 4; ++i) store16(acc + h * kVDim + i * kLanes, a[h][i]);
}

// Calls f(integral_constant<int, NH>, h) for heads [0, nh) in groups of (up to) kHeadGroup.
template <typename F>
void for_head_groups(int nh, F&& f) {
  int h = 0;
  for (; h + kHeadGroup <= nh; h += kHeadGroup) f(std::integral_constant<int, kHeadGroup>{}, h);
  switch (nh - h) {
    case 3: f(std::integral_constant<int, 3>{}, h); break;
    case 2: f(std::integral_constant<int, 2>{}, h); break;
    case 1: f(std::integral_constant<int, 1>{}, h); break;
    default: break;
  }
}

// 2^x for x <= 0 (x = -inf gives 0), to about 1 ulp, in plain arithmetic so that loops over
// it vectorise (libm's exp2f does not): x = n + f with n = round(x), |f| <= 1/2, and 2^f by
// its Taylor series to degree 7 (truncation error < 6e-9).
inline float exp2_nonpositive(float x) {
  x = x < -127.f ? -127.f : x;
  const float n = std::nearbyint(x);
  const float f = (x - n) * 0.6931471805599453f;
  float p = 1.f / 5040.f + f * (1.f / 40320.f);
  p = 1.f / 720.f + f * p;
  p = 1.f / 120.f + f * p;
  p = 1.f / 24.f + f * p;
  p = 1.f / 6.f + f * p;
  p = 0.5f + f * p;
  p = 1.f + f * p;
  p = 1.f + f * p;
  const float scale = bits_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x < -126.f ? 0.f : p * scale;
}

// Online softmax update of head h for a chunk of n valid keys: turns score[h] into weights,
// rescales the head's running sum and accumulator.
void softmax_chunk(Scratch& s, int h, int n) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float* __restrict sc = s.score.data() + static_cast<size_t>(h) * kChunk;
  // Mask the padding columns before anything reads them.
  for (int j = n; j < kChunk; ++j) sc[j] = neg_inf;
  float lane_max[kLanes];
  for (int l = 0; l < kLanes; ++l) lane_max[l] = neg_inf;
  for (int j0 = 0; j0 < kChunk; j0 += kLanes)
    for (int l = 0; l < kLanes; ++l) lane_max[l] = sc[j0 + l] > lane_max[l] ? sc[j0 + l] : lane_max[l];
  float mx = neg_inf;
  for (int l = 0; l < kLanes; ++l) mx = std::max(mx, lane_max[l]);
  const float m_old = s.m[h];
  const float m_new = std::max(m_old, mx);
  // m_old = -inf on the first chunk: alpha = 0 and acc (zero) stays zero.
  const float alpha = exp2_nonpositive(m_old - m_new);
  float lane_sum[kLanes] = {};
  for (int j0 = 0; j0 < kChunk; j0 += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float pj = exp2_nonpositive(sc[j0 + l] - m_new);
      sc[j0 + l] = pj;
      lane_sum[l] += pj;
    }
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += lane_sum[l];
  s.m[h] = m_new;
  s.l[h] = s.l[h] * alpha + sum;
  if (alpha != 1.f) {
    float* a = s.acc.data() + static_cast<size_t>(h) * kVDim;
    for (int d = 0; d < kVDim; ++d) a[d] *= alpha;
  }
}

struct OutputWriter {
  const TensorDesc& out;
  const TensorDesc& lse;
  const TensorDesc& sink;
};

// One token t, heads [h0, h1), over the keys in s.slots.
void attend_token(const KeySource& src, const TensorDesc& q, float sm_scale, int64_t t,
                  int h0, int h1, const OutputWriter& w, Scratch& s) {
  const int nh = h1 - h0;
  const float qscale = sm_scale * kLog2e;
  for (int h = 0; h < nh; ++h) {
    float* dst = s.q.data() + static_cast<size_t>(h) * kDim;
    if (q.dtype == DType::kF32) {
      const float* row = q.ptr<float>() + t * q.stride[0] + (h0 + h) * q.stride[1];
      for (int d = 0; d < kDim; ++d) dst[d] = row[d] * qscale;
    } else {
      const uint16_t* row = q.ptr<uint16_t>() + t * q.stride[0] + (h0 + h) * q.stride[1];
      for (int d = 0; d < kDim; ++d) dst[d] = bf16_to_float(row[d]) * qscale;
    }
  }
  std::fill(s.acc.begin(), s.acc.begin() + static_cast<size_t>(nh) * kVDim, 0.f);
  std::fill(s.m.begin(), s.m.begin() + nh, -std::numeric_limits<float>::infinity());
  std::fill(s.l.begin(), s.l.begin() + nh, 0.f);

  const int64_t total = static_cast<int64_t>(s.slots.size());
  for (int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, total - c0));
    float* kt = s.key_t.data();
    float* rows = s.key_rows.data();
    constexpr int kAhead = 8;
    for (int j = 0; j < n; ++j) {
      if (c0 + j + kAhead < total) src.prefetch(s.slots[static_cast<size_t>(c0 + j + kAhead)]);
      src.load(s.slots[static_cast<size_t>(c0 + j)], rows + static_cast<size_t>(j) * kDim);
    }
    // Rows past n are zeroed (no stale NaN or denormals): the fixed-width score tile
    // computes their scores, which are never read.
    if (n < kChunk) std::fill(rows + static_cast<size_t>(n) * kDim, rows + static_cast<size_t>(kChunk) * kDim, 0.f);
    // Transpose 16 keys at a time, so each store stream stays within one cache line.
    for (int j0 = 0; j0 < kChunk; j0 += kLanes) {
      const float* r = rows + static_cast<size_t>(j0) * kDim;
      for (int d = 0; d < kDim; ++d)
        for (int j = 0; j < kLanes; ++j) kt[d * kChunk + j0 + j] = r[j * kDim + d];
    }
    float* score = s.score.data();
    std::fill(score, score + static_cast<size_t>(nh) * kChunk, 0.f);
    for (int d0 = 0; d0 < kDim; d0 += kSlice) {
      for_head_groups(nh, [&](auto NH, int h) {
        scores_slice<decltype(NH)::value>(s.q.data() + static_cast<size_t>(h) * kDim + d0, kt + d0 * kChunk,
                                          score + static_cast<size_t>(h) * kChunk);
      });
    }
    for (int h = 0; h < nh; ++h) softmax_chunk(s, h, n);
    for (int d0 = 0; d0 < kVDim; d0 += kSlice) {
      for_head_groups(nh, [&](auto NH, int h) {
        values_slice<decltype(NH)::value>(score + static_cast<size_t>(h) * kChunk, rows + d0, n,
                                          s.acc.data() + static_cast<size_t>(h) * kVDim + d0);
      });
    }
  }

  for (int h = 0; h < nh; ++h) {
    const int hg = h0 + h;
    const float* a = s.acc.data() + static_cast<size_t>(h) * kVDim;
    float factor = 0.f;
    float lse = std::numeric_limits<float>::infinity();  // no valid key
    if (s.l[h] > 0.f) {
      const double lse_d = (static_cast<double>(s.m[h]) + std::log2(static_cast<double>(s.l[h]))) *
                           0.6931471805599453;
      lse = static_cast<float>(lse_d);
      double f = 1.0 / static_cast<double>(s.l[h]);
      if (w.sink.present()) {
        const double sink = w.sink.ptr<float>()[hg * w.sink.stride[0]];
        // exp(lse) / (exp(lse) + exp(sink)) = 1 / (1 + exp(sink - lse)), overflow-safe.
        f /= 1.0 + std::exp(sink - lse_d);
      }
      factor = static_cast<float>(f);
    }
    w.lse.ptr<float>()[t * w.lse.stride[0] + hg * w.lse.stride[1]] = lse;
    if (w.out.dtype == DType::kF32) {
      float* o = w.out.ptr<float>() + t * w.out.stride[0] + hg * w.out.stride[1];
      for (int d = 0; d < kVDim; ++d) o[d] = a[d] * factor;
    } else {
      uint16_t* o = w.out.ptr<uint16_t>() + t * w.out.stride[0] + hg * w.out.stride[1];
      for (int d = 0; d < kVDim; ++d) o[d] = float_to_bf16(a[d] * factor);
    }
  }
}

// Splits the heads of few tokens across tasks. Depends only on the shape (never on the
// thread count), and each head's arithmetic is the same in every split, so results are
// reproducible everywhere.
int heads_per_item(int64_t tokens, int heads) {
  if (tokens >= 8 || heads <= kHeadGroup) return heads;
  int64_t splits = std::min<int64_t>((8 + tokens - 1) / tokens, (heads + kHeadGroup - 1) / kHeadGroup);
  int per = static_cast<int>((heads + splits - 1) / splits);
  return (per + kHeadGroup - 1) / kHeadGroup * kHeadGroup;
}

}  // namespace

StatusCode sparse_mla(const SparseMlaParams& p) {
  const int64_t T = p.q.shape[0];
  const int H = static_cast<int>(p.q.shape[1]);
  const int64_t K = p.indices.shape[1];
  if (T == 0 || H == 0) return StatusCode::kOk;
  const KeySource src(p.kv);
  const int64_t num_keys = p.kv.flat.present() ? p.kv.flat.shape[0] : p.kv.paged.num_slots();
  const int hpi = heads_per_item(T, H);
  const int64_t hsplit = (H + hpi - 1) / hpi;
  const OutputWriter w{p.out, p.lse, p.attn_sink};
  return parallel_for(T * hsplit, 1, [&](int64_t b, int64_t e) {
    Scratch s(hpi);
    s.slots.reserve(static_cast<size_t>(K));
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / hsplit;
      const int h0 = static_cast<int>(item % hsplit) * hpi;
      const int h1 = std::min(H, h0 + hpi);
      int64_t len = K;
      if (p.topk_length.present()) {
        len = std::min<int64_t>(K, std::max<int64_t>(0, p.topk_length.ptr<int32_t>()[t * p.topk_length.stride[0]]));
      }
      s.slots.clear();
      const int32_t* row = p.indices.ptr<int32_t>() + t * p.indices.stride[0];
      for (int64_t k = 0; k < len; ++k) {
        const int64_t idx = row[k * p.indices.stride[1]];
        if (idx >= 0 && idx < num_keys) s.slots.push_back(idx);
      }
      attend_token(src, p.q, p.sm_scale, t, h0, h1, w, s);
    }
  });
}

StatusCode dense_mla(const DenseMlaParams& p) {
  const int64_t T = p.q.shape[0];
  const int H = static_cast<int>(p.q.shape[1]);
  const int64_t B = p.cu_seqlens_q.shape[0] - 1;
  if (T == 0 || H == 0 || B <= 0) return StatusCode::kOk;
  const bool paged = p.kv.paged.present();
  const KeySource src(p.kv);
  auto cu_q = [&](int64_t b) { return static_cast<int64_t>(p.cu_seqlens_q.ptr<int32_t>()[b * p.cu_seqlens_q.stride[0]]); };
  // Sequence of every token (cu_seqlens_q is validated: monotone, from 0 to T).
  std::vector<int64_t> seq_of(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = cu_q(b); t < cu_q(b + 1); ++t) seq_of[static_cast<size_t>(t)] = b;
  const int hpi = heads_per_item(T, H);
  const int64_t hsplit = (H + hpi - 1) / hpi;
  const int64_t items = T * hsplit;
  const OutputWriter w{p.out, p.lse, p.attn_sink};
  return parallel_for(items, 1, [&](int64_t b, int64_t e) {
    Scratch s(hpi);
    for (int64_t item = b; item < e; ++item) {
      // Causal rows grow in cost with t: interleave cheap and expensive tokens so that every
      // contiguous range of items carries a similar load.
      const int64_t r = item / hsplit;
      const int64_t t = (r % 2 == 0) ? r / 2 : T - 1 - r / 2;
      const int h0 = static_cast<int>(item % hsplit) * hpi;
      const int h1 = std::min(H, h0 + hpi);
      const int64_t sq = seq_of[static_cast<size_t>(t)];
      const int64_t q_len = cu_q(sq + 1) - cu_q(sq);
      const int64_t i = t - cu_q(sq);
      s.slots.clear();
      if (!paged) {
        const int32_t* cu_k = p.cu_seqlens_k.ptr<int32_t>();
        const int64_t k0 = cu_k[sq * p.cu_seqlens_k.stride[0]];
        const int64_t kv_len = cu_k[(sq + 1) * p.cu_seqlens_k.stride[0]] - k0;
        const int64_t n = kv_len - q_len + i + 1;
        for (int64_t j = 0; j < n; ++j) s.slots.push_back(k0 + j);
      } else {
        const int64_t kv_len = p.kv_lens.ptr<int32_t>()[sq * p.kv_lens.stride[0]];
        const int64_t n = kv_len - q_len + i + 1;
        const int64_t page = p.kv.paged.page_size;
        const int32_t* bt = p.block_table.ptr<int32_t>() + sq * p.block_table.stride[0];
        for (int64_t j = 0; j < n; ++j)
          s.slots.push_back(static_cast<int64_t>(bt[(j / page) * p.block_table.stride[1]]) * page + j % page);
      }
      attend_token(src, p.q, p.sm_scale, t, h0, h1, w, s);
    }
  });
}

}  // namespace cpu
}  // namespace dsa
