// Sparse and dense MLA attention against the float64 oracle (SPEC §5), plus argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>

#include "oracle/oracle_attention.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::Rng;

namespace {

constexpr int64_t D = 576;
constexpr int64_t DV = 512;
constexpr float kScale = 0.13523f;
const double kInf = std::numeric_limits<double>::infinity();

// A paged MLA cache whose every byte starts as 0xFF: NaN in bf16, e4m3 and f32 alike, so an
// unused slot (or block padding) that reached the output would show.
struct Cache {
  bool fp8;
  int64_t num_blocks, page, stride;
  Guarded buf;
  std::vector<double> original;  // bf16-rounded latents as written; NaN where unused

  Cache(bool fp8_, int64_t blocks, int64_t page_, int64_t pad_bytes = 0)
      : fp8(fp8_), num_blocks(blocks), page(page_),
        stride(page_ * (fp8_ ? kMlaFp8TokenBytes : kMlaBf16TokenBytes) + pad_bytes),
        buf(static_cast<size_t>(blocks * stride), 0xFF),
        original(static_cast<size_t>(blocks * page_ * D), std::nan("")) {}

  uint8_t* token(int64_t slot) { return buf.as<uint8_t>() + (slot / page) * stride + (slot % page) * (fp8 ? 656 : 1152); }

  void write(int64_t slot, const float* x) {
    uint8_t* tok = token(slot);
    for (int64_t d = 0; d < D; ++d) original[static_cast<size_t>(slot * D + d)] = round_to_bf16(x[d]);
    if (!fp8) {
      for (int64_t d = 0; d < D; ++d) {
        uint16_t v = float_to_bf16(x[d]);
        std::memcpy(tok + 2 * d, &v, 2);
      }
      return;
    }
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0.f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(round_to_bf16(x[tile * 128 + i])));
      const float s = ue8m0_scale(amax);
      for (int i = 0; i < 128; ++i) tok[tile * 128 + i] = quantize_e4m3(round_to_bf16(x[tile * 128 + i]), 1.f / s);
      std::memcpy(tok + kMlaFp8ScaleOffset + 4 * tile, &s, 4);
    }
    for (int d = 0; d < 64; ++d) {
      uint16_t v = float_to_bf16(x[512 + d]);
      std::memcpy(tok + kMlaFp8RopeOffset + 2 * d, &v, 2);
    }
  }

  int64_t slots() const { return num_blocks * page; }
  std::vector<double> decoded() const { return oracle::decode_mla_cache(buf.data(), fp8, num_blocks, page, stride); }
  MlaCacheDesc desc() {
    MlaCacheDesc c;
    c.data = buf.data();
    c.dtype = fp8 ? MlaCacheDtype::kFP8 : MlaCacheDtype::kBF16;
    c.num_blocks = num_blocks;
    c.page_size = page;
    c.block_stride_bytes = stride;
    return c;
  }
};

std::vector<float> latent(Rng& rng) {
  std::vector<float> x(D);
  for (auto& v : x) v = rng.normal();
  return x;
}

// Queries as stored (bf16 or f32) plus their exact values for the oracle.
struct Queries {
  bool f32;
  int64_t T, H;
  std::vector<uint16_t> bf;
  std::vector<float> f;
  std::vector<double> exact;
  Queries(Rng& rng, int64_t T_, int64_t H_, bool f32_, float sd = 1.f) : f32(f32_), T(T_), H(H_) {
    const size_t n = static_cast<size_t>(T * H * D);
    f = dsa_test::random_floats(rng, n, sd);
    bf = dsa_test::to_bf16(f);
    if (!f32) f = dsa_test::from_bf16(bf);
    exact.assign(f.begin(), f.end());
  }
  TensorDesc desc() {
    return f32 ? dsa_test::t_f32(f.data(), {T, H, D}) : dsa_test::t_bf16(bf.data(), {T, H, D});
  }
};

// Guarded, NaN-poisoned outputs.
struct Outputs {
  bool f32;
  int64_t T, H;
  Guarded out, lse;
  Outputs(int64_t T_, int64_t H_, bool f32_)
      : f32(f32_), T(T_), H(H_), out(static_cast<size_t>(T_ * H_ * DV) * (f32_ ? 4 : 2)), lse(static_cast<size_t>(T_ * H_) * 4) {
    if (f32) dsa_test::poison_f32(out.as<float>(), static_cast<size_t>(T * H * DV));
    else dsa_test::poison_bf16(out.as<uint16_t>(), static_cast<size_t>(T * H * DV));
    dsa_test::poison_f32(lse.as<float>(), static_cast<size_t>(T * H));
  }
  TensorDesc out_desc() {
    return f32 ? dsa_test::t_f32(out.as<float>(), {T, H, DV}) : dsa_test::t_bf16(out.as<uint16_t>(), {T, H, DV});
  }
  TensorDesc lse_desc() { return dsa_test::t_f32(lse.as<float>(), {T, H}); }
  double out_at(size_t i) const { return f32 ? out.as<float>()[i] : bf16_to_float(out.as<uint16_t>()[i]); }
  bool same_bytes(const Outputs& o) const {
    return out.size() == o.out.size() && std::memcmp(out.data(), o.out.data(), out.size()) == 0 &&
           std::memcmp(lse.data(), o.lse.data(), lse.size()) == 0;
  }
};

// Tolerances: a few steps of the output dtype at the reference, plus the f32 rounding of the
// scores (32 ulps of the row's largest Σ|q·k|) carried through the softmax weights.
struct Tol {
  double out_steps = 1.0;  // in steps of the output dtype
  double lse_steps = 4.0;  // f32 steps
  double score_ulps = 8.0;
  double loose = 0.0;      // > 0: |err| <= loose * out_scale and lse within `loose` (FP8 vs unquantised)
};

void expect_close(const Outputs& o, const oracle::MlaResult& ref, const Tol& tol, const std::string& what) {
  const double eps32 = std::ldexp(1.0, -24);
  int64_t bad = 0;
  std::string first;
  auto report = [&](const std::string& msg) {
    if (bad++ == 0) first = msg;
  };
  for (int64_t r = 0; r < o.T * o.H; ++r) {
    const double got_lse = o.lse.as<float>()[r];
    const double ref_lse = ref.lse[static_cast<size_t>(r)];
    const double ds = tol.score_ulps * eps32 * ref.score_scale[static_cast<size_t>(r)];
    const bool empty = std::isinf(ref_lse);
    if (empty || tol.loose == 0.0) {
      const double lse_ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref_lse), 1e-30)) - 23);
      const bool lse_ok = empty ? got_lse == kInf : std::fabs(got_lse - ref_lse) <= tol.lse_steps * lse_ulp + ds;
      if (!lse_ok) {
        report("lse row " + std::to_string(r) + ": got " + std::to_string(got_lse) + ", want " + std::to_string(ref_lse));
      }
    } else if (!(std::fabs(got_lse - ref_lse) <= tol.loose)) {
      report("lse row " + std::to_string(r) + ": got " + std::to_string(got_lse) + ", want " + std::to_string(ref_lse));
    }
    for (int64_t d = 0; d < DV; ++d) {
      const size_t i = static_cast<size_t>(r * DV + d);
      const double got = o.out_at(i), want = ref.out[i], sc = ref.out_scale[i];
      bool ok;
      if (empty) {
        ok = got == 0.0;
      } else if (tol.loose > 0.0) {
        ok = std::fabs(got - want) <= tol.loose * sc;
      } else {
        const double steps = o.f32 ? dsa_test::f32_steps(got, want) : dsa_test::bf16_steps(got, want);
        const double step = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 1e-30)) - (o.f32 ? 23 : 7));
        // Near-cancelling sums: allow the f32 error of the weighted sum itself.
        ok = steps <= tol.out_steps || std::fabs(got - want) <= tol.out_steps * step + (ds + 16 * eps32) * sc;
      }
      if (!ok) {
        report("out row " + std::to_string(r) + " dim " + std::to_string(d) + ": got " + std::to_string(got) +
               ", want " + std::to_string(want) + " (scale " + std::to_string(sc) + ")");
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": first mismatch: " << first;
  EXPECT_TRUE(o.out.intact()) << what << ": wrote outside out";
  EXPECT_TRUE(o.lse.intact()) << what << ": wrote outside lse";
}

struct SparseCase {
  int64_t T = 4, H = 3, K = 40;
  bool q_f32 = false, out_f32 = false;
  bool with_topk_length = false, with_sink = false;
  double invalid_fraction = 0.2;
};

struct SparseRun {
  std::vector<int32_t> idx, topk_len;
  std::vector<float> sink;
  std::vector<double> sink_d;
};

// Fills indices: used slot ids, invalid candidates {INT_MIN, -2, -1, n, n + 1, INT_MAX},
// and past topk_length a mix including unused slots.
SparseRun make_indices(Rng& rng, const SparseCase& c, int64_t num_keys, const std::vector<int64_t>& used,
                       const std::vector<int64_t>& unused) {
  SparseRun r;
  r.idx.resize(static_cast<size_t>(c.T * c.K));
  const int64_t cands[6] = {INT_MIN, -2, -1, num_keys, num_keys + 1, INT_MAX};
  for (int64_t t = 0; t < c.T; ++t) {
    int64_t len = c.K;
    if (c.with_topk_length) {
      len = rng.integer(0, c.K);
      if (t == 0) len = c.K;
      r.topk_len.push_back(static_cast<int32_t>(len));
    }
    for (int64_t k = 0; k < c.K; ++k) {
      int32_t v;
      if (k >= len && !unused.empty() && rng.integer(0, 1)) {
        v = static_cast<int32_t>(unused[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(unused.size()) - 1))]);
      } else if (rng.uniform(0.f, 1.f) < c.invalid_fraction) {
        v = static_cast<int32_t>(std::max<int64_t>(INT_MIN, std::min<int64_t>(INT_MAX, cands[rng.integer(0, 5)])));
      } else {
        v = static_cast<int32_t>(used[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(used.size()) - 1))]);
      }
      r.idx[static_cast<size_t>(t * c.K + k)] = v;
    }
  }
  if (c.with_sink) {
    for (int64_t h = 0; h < c.H; ++h) r.sink.push_back(rng.uniform(-2.f, 8.f));
    r.sink_d.assign(r.sink.begin(), r.sink.end());
  }
  return r;
}

Status run_sparse(Queries& q, MlaKv kv, SparseRun& r, int64_t K, Outputs& o, float scale = kScale) {
  SparseMlaParams p;
  p.q = q.desc();
  p.kv = kv;
  p.indices = dsa_test::t_i32(r.idx.data(), {q.T, K});
  if (!r.topk_len.empty()) p.topk_length = dsa_test::t_i32(r.topk_len.data(), {q.T});
  if (!r.sink.empty()) p.attn_sink = dsa_test::t_f32(r.sink.data(), {q.H});
  p.sm_scale = scale;
  p.out = o.out_desc();
  p.lse = o.lse_desc();
  return sparse_mla(p);
}

// A paged cache with `used` slots filled at random and the rest left NaN.
void fill_cache(Rng& rng, Cache& cache, double used_fraction, std::vector<int64_t>* used, std::vector<int64_t>* unused) {
  for (int64_t s = 0; s < cache.slots(); ++s) {
    if (rng.uniform(0.f, 1.f) < used_fraction || s == 0) {
      auto x = latent(rng);
      cache.write(s, x.data());
      used->push_back(s);
    } else {
      unused->push_back(s);
    }
  }
}

void sparse_paged_case(uint64_t seed, bool fp8, int64_t page, int64_t blocks, const SparseCase& c,
                       int64_t pad_bytes = 0) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " fp8 " + std::to_string(fp8) + " page " + std::to_string(page) +
               " H " + std::to_string(c.H) + " T " + std::to_string(c.T) + " K " + std::to_string(c.K));
  Rng rng(seed);
  Cache cache(fp8, blocks, page, pad_bytes);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 0.7, &used, &unused);
  Queries q(rng, c.T, c.H, c.q_f32);
  SparseRun r = make_indices(rng, c, cache.slots(), used, unused);
  Outputs o(c.T, c.H, c.out_f32);
  MlaKv kv;
  kv.paged = cache.desc();
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, o));
  auto ref = oracle::sparse_mla(q.exact, c.T, c.H, cache.decoded(), cache.slots(), r.idx, c.K, r.topk_len, r.sink_d, kScale);
  expect_close(o, ref, Tol{}, "vs dequantised cache");
  if (fp8) {
    // Against the unquantised latents: the FP8 rounding of c_kv moves scores by ~0.1 here.
    auto ref_orig = oracle::sparse_mla(q.exact, c.T, c.H, cache.original, cache.slots(), r.idx, c.K, r.topk_len,
                                       r.sink_d, kScale);
    Tol loose;
    loose.loose = 0.5;
    expect_close(o, ref_orig, loose, "vs unquantised latents");
  }
  Outputs again(c.T, c.H, c.out_f32);
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, again));
  EXPECT_TRUE(o.same_bytes(again)) << "repeated run differs";
}

}  // namespace

// ---- sparse ---------------------------------------------------------------------------------

TEST(SparseMla, FlatBf16AndF32AgainstOracle) {
  for (int variant = 0; variant < 2; ++variant) {
    const bool f32 = variant == 1;
    Rng rng(11 + variant);
    const int64_t S = 150;
    SparseCase c;
    c.T = 7;
    c.H = 3;
    c.K = 90;
    c.q_f32 = f32;
    c.out_f32 = f32;
    // Flat keys; odd rows are never selected and hold NaN.
    std::vector<float> kf(static_cast<size_t>(S * D), std::nanf(""));
    std::vector<uint16_t> kb(static_cast<size_t>(S * D), 0xFFFF);
    std::vector<int64_t> used, unused;
    for (int64_t s = 0; s < S; ++s) {
      if (s % 2) { unused.push_back(s); continue; }
      used.push_back(s);
      for (int64_t d = 0; d < D; ++d) {
        float v = round_to_bf16(rng.normal());
        kf[static_cast<size_t>(s * D + d)] = v;
        kb[static_cast<size_t>(s * D + d)] = float_to_bf16(v);
      }
    }
    std::vector<double> keys(kf.begin(), kf.end());
    Queries q(rng, c.T, c.H, f32);
    SparseRun r = make_indices(rng, c, S, used, unused);
    Outputs o(c.T, c.H, f32);
    MlaKv kv;
    kv.flat = f32 ? dsa_test::t_f32(kf.data(), {S, D}) : dsa_test::t_bf16(kb.data(), {S, D});
    DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, o));
    auto ref = oracle::sparse_mla(q.exact, c.T, c.H, keys, S, r.idx, c.K, r.topk_len, r.sink_d, kScale);
    expect_close(o, ref, Tol{}, f32 ? "flat f32" : "flat bf16");
  }
}

TEST(SparseMla, FlatRowStride) {
  // Key rows with padding between them (stride 600 elements); the padding holds NaN.
  Rng rng(5);
  const int64_t S = 20, stride = 600;
  std::vector<uint16_t> kb(static_cast<size_t>(S * stride), 0xFFFF);
  std::vector<double> keys(static_cast<size_t>(S * D));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t d = 0; d < D; ++d) {
      uint16_t v = float_to_bf16(rng.normal());
      kb[static_cast<size_t>(s * stride + d)] = v;
      keys[static_cast<size_t>(s * D + d)] = bf16_to_float(v);
    }
  SparseCase c;
  c.T = 3;
  c.H = 5;
  c.K = 16;
  std::vector<int64_t> used(S);
  std::iota(used.begin(), used.end(), 0);
  Queries q(rng, c.T, c.H, false);
  SparseRun r = make_indices(rng, c, S, used, {});
  Outputs o(c.T, c.H, false);
  MlaKv kv;
  kv.flat = dsa_test::t_bf16(kb.data(), {S, D});
  kv.flat.stride[0] = stride;
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, o));
  expect_close(o, oracle::sparse_mla(q.exact, c.T, c.H, keys, S, r.idx, c.K, {}, {}, kScale), Tol{}, "strided flat");
}

TEST(SparseMla, StridedQueriesAndOutputs) {
  // q, out and lse with padded token/head strides; the padding must stay untouched.
  Rng rng(7);
  Cache cache(false, 2, 64);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 0.8, &used, &unused);
  SparseCase c;
  c.T = 3;
  c.H = 5;
  c.K = 50;
  Queries q(rng, c.T, c.H, true);
  const int64_t qh = D + 8, qt = c.H * qh + 16, oh = DV + 16, ot = c.H * oh + 32, lh = 3, lt = c.H * lh + 1;
  std::vector<float> qs(static_cast<size_t>(c.T * qt), std::nanf(""));
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t d = 0; d < D; ++d) qs[static_cast<size_t>(t * qt + h * qh + d)] = q.f[static_cast<size_t>((t * c.H + h) * D + d)];
  std::vector<float> out(static_cast<size_t>(c.T * ot), -3.f), lse(static_cast<size_t>(c.T * lt), -3.f);
  SparseRun r = make_indices(rng, c, cache.slots(), used, unused);
  SparseMlaParams p;
  p.q = dsa_test::t_f32(qs.data(), {c.T, c.H, D});
  p.q.stride[0] = qt;
  p.q.stride[1] = qh;
  p.kv.paged = cache.desc();
  p.indices = dsa_test::t_i32(r.idx.data(), {c.T, c.K});
  p.sm_scale = kScale;
  p.out = dsa_test::t_f32(out.data(), {c.T, c.H, DV});
  p.out.stride[0] = ot;
  p.out.stride[1] = oh;
  p.lse = dsa_test::t_f32(lse.data(), {c.T, c.H});
  p.lse.stride[0] = lt;
  p.lse.stride[1] = lh;
  DSA_ASSERT_OK(sparse_mla(p));
  Outputs o(c.T, c.H, true);
  std::vector<bool> written_out(out.size(), false), written_lse(lse.size(), false);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      o.lse.as<float>()[t * c.H + h] = lse[static_cast<size_t>(t * lt + h * lh)];
      written_lse[static_cast<size_t>(t * lt + h * lh)] = true;
      for (int64_t d = 0; d < DV; ++d) {
        o.out.as<float>()[(t * c.H + h) * DV + d] = out[static_cast<size_t>(t * ot + h * oh + d)];
        written_out[static_cast<size_t>(t * ot + h * oh + d)] = true;
      }
    }
  for (size_t i = 0; i < out.size(); ++i) if (!written_out[i]) ASSERT_EQ(out[i], -3.f) << "padding of out at " << i;
  for (size_t i = 0; i < lse.size(); ++i) if (!written_lse[i]) ASSERT_EQ(lse[i], -3.f) << "padding of lse at " << i;
  expect_close(o, oracle::sparse_mla(q.exact, c.T, c.H, cache.decoded(), cache.slots(), r.idx, c.K, {}, {}, kScale),
               Tol{}, "strided");
}

TEST(SparseMla, PagedBf16Page64ManyChunks) {
  SparseCase c;
  c.T = 5;
  c.H = 64;
  c.K = 300;  // several 64-key chunks per row, a partial last one
  sparse_paged_case(21, false, 64, 8, c);
}

TEST(SparseMla, PagedFp8TightAndLoose) {
  SparseCase c;
  c.T = 6;
  c.H = 16;
  c.K = 200;
  c.out_f32 = true;
  sparse_paged_case(31, true, 64, 6, c);
  c.out_f32 = false;
  c.with_topk_length = true;
  c.with_sink = true;
  sparse_paged_case(32, true, 16, 20, c);
}

TEST(SparseMla, Fp8DecodesEveryCode) {
  // Tokens whose c_kv bytes run through every finite e4m3 code (both signs, subnormals,
  // zero), with non-power-of-two and tiny scales.
  Rng rng(33);
  Cache cache(true, 1, 8);
  for (int64_t s = 0; s < 8; ++s) {
    uint8_t* tok = cache.token(s);
    for (int i = 0; i < 512; ++i) {
      const uint8_t code = static_cast<uint8_t>((i + 37 * s) & 0xff);
      tok[i] = (code & 0x7f) == 0x7f ? 0 : code;
    }
    const float scales[4] = {1.f / 64, 0.75f / 256, 1.f / 1024, 3.f / 4096};
    std::memcpy(tok + kMlaFp8ScaleOffset, scales, sizeof(scales));
    for (int d = 0; d < 64; ++d) {
      uint16_t v = float_to_bf16(rng.normal());
      std::memcpy(tok + kMlaFp8RopeOffset + 2 * d, &v, 2);
    }
  }
  SparseCase c;
  c.T = 4;
  c.H = 3;
  c.K = 8;
  Queries q(rng, c.T, c.H, false);
  SparseRun r;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t k = 0; k < c.K; ++k) r.idx.push_back(static_cast<int32_t>((k + t) % 8));
  Outputs o(c.T, c.H, true);
  MlaKv kv;
  kv.paged = cache.desc();
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, o));
  expect_close(o, oracle::sparse_mla(q.exact, c.T, c.H, cache.decoded(), cache.slots(), r.idx, c.K, {}, {}, kScale),
               Tol{}, "every e4m3 code");
}

TEST(SparseMla, PageSizesAndBlockPadding) {
  SparseCase c;
  c.T = 4;
  c.H = 4;
  c.K = 70;
  for (int64_t page : {1, 16, 7, 64}) {
    sparse_paged_case(40 + page, false, page, 160 / page + 1, c, 32);
    sparse_paged_case(41 + page, true, page, 160 / page + 1, c, 16);
  }
}

TEST(SparseMla, HeadCountsAndQueryDtypes) {
  for (int64_t H : {1, 3, 64, 128}) {
    SparseCase c;
    c.T = H >= 64 ? 2 : 9;  // few tokens: heads are split across tasks
    c.H = H;
    c.K = 80;
    c.q_f32 = H == 3;
    c.out_f32 = H == 64;
    sparse_paged_case(50 + H, false, 64, 3, c);
  }
}

TEST(SparseMla, TopkLengthAndSink) {
  SparseCase c;
  c.T = 12;
  c.H = 6;
  c.K = 100;
  c.with_topk_length = true;
  sparse_paged_case(61, false, 64, 4, c);
  c.with_sink = true;
  c.out_f32 = true;
  sparse_paged_case(62, false, 64, 4, c);
}

TEST(SparseMla, AllInvalidRowsGiveZeroAndInfinity) {
  Rng rng(71);
  Cache cache(false, 2, 64);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 0.5, &used, &unused);
  const int64_t T = 5, H = 4, K = 6, n = cache.slots();
  Queries q(rng, T, H, false);
  SparseRun r;
  // Rows 0-2: every invalid candidate; row 3: valid slots but topk_length 0; row 4: one valid key.
  r.idx = {INT_MIN, -2, -1, static_cast<int32_t>(n), static_cast<int32_t>(n + 1), INT_MAX,
           -1, -1, -1, -1, -1, -1,
           static_cast<int32_t>(n), INT_MAX, -2, INT_MIN, static_cast<int32_t>(n + 1), -1,
           static_cast<int32_t>(used[0]), static_cast<int32_t>(used[1]), static_cast<int32_t>(unused[0]), 0, 0, 0,
           -1, static_cast<int32_t>(used[2]), -1, INT_MIN, static_cast<int32_t>(n), static_cast<int32_t>(unused[1])};
  r.topk_len = {6, 6, 6, 0, 5};
  r.sink = {0.5f, -1.f, 3.f, 100.f};
  r.sink_d.assign(r.sink.begin(), r.sink.end());
  Outputs o(T, H, true);
  MlaKv kv;
  kv.paged = cache.desc();
  DSA_ASSERT_OK(run_sparse(q, kv, r, K, o));
  for (int64_t row = 0; row < 4 * H; ++row) {
    EXPECT_EQ(o.lse.as<float>()[row], std::numeric_limits<float>::infinity()) << row;
    for (int64_t d = 0; d < DV; ++d) ASSERT_EQ(o.out.as<float>()[row * DV + d], 0.f) << row;
  }
  expect_close(o, oracle::sparse_mla(q.exact, T, H, cache.decoded(), n, r.idx, K, r.topk_len, r.sink_d, kScale),
               Tol{}, "invalid rows");
}

TEST(SparseMla, EmptyShapes) {
  Rng rng(81);
  Cache cache(false, 1, 64);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 1.0, &used, &unused);
  MlaKv kv;
  kv.paged = cache.desc();
  const int64_t shapes[][3] = {{0, 4, 8}, {3, 0, 8}, {3, 2, 0}, {1, 1, 1}};
  for (const auto& shape : shapes) {
    const int64_t T = shape[0], H = shape[1], K = shape[2];
    Queries q(rng, T, H, false);
    SparseRun r;
    r.idx.assign(static_cast<size_t>(T * K), static_cast<int32_t>(used.back()));
    Outputs o(T, H, false);
    DSA_ASSERT_OK(run_sparse(q, kv, r, K, o));
    expect_close(o, oracle::sparse_mla(q.exact, T, H, cache.decoded(), cache.slots(), r.idx, K, {}, {}, kScale),
                 Tol{}, "empty shapes");
  }
}

TEST(SparseMla, LargeScoresStayFinite) {
  // Scores of a few hundred: the softmax must subtract the running max.
  SparseCase c;
  c.T = 3;
  c.H = 4;
  c.K = 130;
  Rng rng(91);
  Cache cache(false, 3, 64);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 0.9, &used, &unused);
  Queries q(rng, c.T, c.H, false, 8.f);
  SparseRun r = make_indices(rng, c, cache.slots(), used, unused);
  Outputs o(c.T, c.H, true);
  MlaKv kv;
  kv.paged = cache.desc();
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, o, 1.0f));
  auto ref = oracle::sparse_mla(q.exact, c.T, c.H, cache.decoded(), cache.slots(), r.idx, c.K, {}, {}, 1.0);
  expect_close(o, ref, Tol{}, "large scores");
}

TEST(SparseMla, ThreadCountDoesNotChangeBits) {
  Rng rng(95);
  Cache cache(true, 4, 64);
  std::vector<int64_t> used, unused;
  fill_cache(rng, cache, 0.8, &used, &unused);
  SparseCase c;
  c.T = 3;
  c.H = 20;
  c.K = 150;
  Queries q(rng, c.T, c.H, false);
  SparseRun r = make_indices(rng, c, cache.slots(), used, unused);
  MlaKv kv;
  kv.paged = cache.desc();
  Outputs a(c.T, c.H, true), b(c.T, c.H, true);
  const int threads = num_threads();
  set_num_threads(1);
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, a));
  set_num_threads(3);
  DSA_ASSERT_OK(run_sparse(q, kv, r, c.K, b));
  set_num_threads(threads);
  EXPECT_TRUE(a.same_bytes(b));
}

// ---- dense ----------------------------------------------------------------------------------

namespace {

struct DenseSeq {
  int64_t q_len, kv_len;
};

// Dense over a paged cache (shuffled block table, unused slots NaN) or a flat buffer.
void dense_case(uint64_t seed, const std::vector<DenseSeq>& seqs, int64_t H, bool paged, bool fp8, int64_t page,
                bool out_f32 = false, bool sink = false) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " page " + std::to_string(page) + " H " + std::to_string(H));
  Rng rng(seed);
  const int64_t B = static_cast<int64_t>(seqs.size());
  std::vector<int32_t> cu_q{0}, cu_k{0}, kv_lens, block_table;
  int64_t max_blocks = 1;
  for (auto& s : seqs) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(s.q_len));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(s.kv_len));
    kv_lens.push_back(static_cast<int32_t>(s.kv_len));
    max_blocks = std::max(max_blocks, (s.kv_len + page - 1) / page + 1);  // one spare entry
  }
  const int64_t T = cu_q.back();
  Queries q(rng, T, H, false);
  std::vector<float> sink_f;
  for (int64_t h = 0; sink && h < H; ++h) sink_f.push_back(rng.uniform(-1.f, 6.f));
  std::vector<double> sink_d(sink_f.begin(), sink_f.end());
  Outputs o(T, H, out_f32);
  DenseMlaParams p;
  p.q = q.desc();
  p.cu_seqlens_q = dsa_test::t_i32(cu_q.data(), {B + 1});
  p.sm_scale = kScale;
  p.out = o.out_desc();
  p.lse = o.lse_desc();
  if (sink) p.attn_sink = dsa_test::t_f32(sink_f.data(), {H});
  oracle::MlaResult ref;
  // Keys live in the cache/flat buffer only while `cache`/`flat` are alive.
  const int64_t blocks = B * max_blocks + 2;
  Cache cache(fp8, blocks, page);
  std::vector<uint16_t> flat(static_cast<size_t>(std::max<int64_t>(cu_k.back(), 1) * D));
  if (paged) {
    // Shuffled blocks; entries past the used pages point at a block that does not exist.
    std::vector<int32_t> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng.gen);
    block_table.assign(static_cast<size_t>(B * max_blocks), -7);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t used = (seqs[b].kv_len + page - 1) / page;
      for (int64_t j = 0; j < used; ++j) block_table[static_cast<size_t>(b * max_blocks + j)] = order[static_cast<size_t>(b * max_blocks + j)];
      for (int64_t j = 0; j < seqs[b].kv_len; ++j) {
        auto x = latent(rng);
        cache.write(int64_t{block_table[static_cast<size_t>(b * max_blocks + j / page)]} * page + j % page, x.data());
      }
    }
    p.kv.paged = cache.desc();
    p.block_table = dsa_test::t_i32(block_table.data(), {B, max_blocks});
    p.kv_lens = dsa_test::t_i32(kv_lens.data(), {B});
    DSA_ASSERT_OK(dense_mla(p));
    ref = oracle::dense_mla(q.exact, T, H, cache.decoded(), cu_q, {}, block_table, max_blocks, kv_lens, page, sink_d, kScale);
  } else {
    for (auto& v : flat) v = float_to_bf16(rng.normal());
    std::vector<double> keys(flat.size());
    for (size_t i = 0; i < flat.size(); ++i) keys[i] = bf16_to_float(flat[i]);
    p.kv.flat = dsa_test::t_bf16(flat.data(), {cu_k.back(), D});
    p.cu_seqlens_k = dsa_test::t_i32(cu_k.data(), {B + 1});
    DSA_ASSERT_OK(dense_mla(p));
    ref = oracle::dense_mla(q.exact, T, H, keys, cu_q, cu_k, {}, 0, {}, 1, sink_d, kScale);
  }
  expect_close(o, ref, Tol{}, "dense");
  Outputs again(T, H, out_f32);
  p.out = again.out_desc();
  p.lse = again.lse_desc();
  DSA_ASSERT_OK(dense_mla(p));
  EXPECT_TRUE(o.same_bytes(again)) << "repeated run differs";
}

}  // namespace

TEST(DenseMla, FlatVarlenWithPrefixes) {
  dense_case(101, {{5, 5}, {1, 9}, {0, 3}, {7, 70}, {3, 3}}, 3, false, false, 1);
  dense_case(102, {{66, 130}}, 2, false, false, 1, true, true);
}

TEST(DenseMla, PagedPageEdges) {
  for (int64_t page : {64, 16, 1, 7}) {
    std::vector<DenseSeq> seqs = {{2, page - 1 > 1 ? page - 1 : 2}, {1, page}, {std::min<int64_t>(3, page + 1), page + 1}, {std::min<int64_t>(4, 2 * page), 2 * page}, {2, 3 * page + 2}, {1, 1}};
    dense_case(110 + page, seqs, 4, true, false, page);
  }
}

TEST(DenseMla, PagedFp8DecodeNextN) {
  // Decode rows: next_n = 1..4 new tokens on top of long prefixes.
  dense_case(121, {{1, 200}, {2, 129}, {3, 64}, {4, 65}}, 8, true, true, 64, true);
  dense_case(122, {{2, 40}, {4, 17}}, 128, true, false, 16, false, true);
}

TEST(DenseMla, ZeroTokensAndEmptyBatch) {
  dense_case(131, {{0, 0}, {0, 5}}, 4, true, false, 64);
  dense_case(132, {}, 4, false, false, 1);
}

TEST(DenseMla, EqualsSparseWhenContextFitsTopk) {
  // kv_len <= topk: sparse over all positions < L_t (shuffled, -1 padded) is dense attention.
  Rng rng(141);
  const int64_t page = 16, H = 8, topk = 96;
  const std::vector<DenseSeq> seqs = {{5, 90}, {1, 33}, {20, 20}};
  const int64_t B = static_cast<int64_t>(seqs.size()), max_blocks = 6;
  Cache cache(false, B * max_blocks, page);
  std::vector<int32_t> cu_q{0}, kv_lens, block_table(static_cast<size_t>(B * max_blocks), 0);
  std::vector<int32_t> order(static_cast<size_t>(B * max_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng.gen);
  for (int64_t b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(seqs[b].q_len));
    kv_lens.push_back(static_cast<int32_t>(seqs[b].kv_len));
    for (int64_t j = 0; j < max_blocks; ++j) block_table[static_cast<size_t>(b * max_blocks + j)] = order[static_cast<size_t>(b * max_blocks + j)];
    for (int64_t j = 0; j < seqs[b].kv_len; ++j) {
      auto x = latent(rng);
      cache.write(int64_t{block_table[static_cast<size_t>(b * max_blocks + j / page)]} * page + j % page, x.data());
    }
  }
  const int64_t T = cu_q.back();
  Queries q(rng, T, H, false);
  SparseRun r;
  r.idx.assign(static_cast<size_t>(T * topk), -1);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < seqs[b].q_len; ++i) {
      const int64_t t = cu_q[b] + i, L = seqs[b].kv_len - seqs[b].q_len + i + 1;
      std::vector<int32_t> pos(static_cast<size_t>(L));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng.gen);
      for (int64_t k = 0; k < L; ++k) {
        const int64_t j = pos[static_cast<size_t>(k)];
        r.idx[static_cast<size_t>(t * topk + k)] = block_table[static_cast<size_t>(b * max_blocks + j / page)] * static_cast<int32_t>(page) + static_cast<int32_t>(j % page);
      }
    }
  }
  MlaKv kv;
  kv.paged = cache.desc();
  Outputs sparse_out(T, H, true);
  DSA_ASSERT_OK(run_sparse(q, kv, r, topk, sparse_out));
  Outputs dense_out(T, H, true);
  DenseMlaParams p;
  p.q = q.desc();
  p.kv = kv;
  p.cu_seqlens_q = dsa_test::t_i32(cu_q.data(), {B + 1});
  p.block_table = dsa_test::t_i32(block_table.data(), {B, max_blocks});
  p.kv_lens = dsa_test::t_i32(kv_lens.data(), {B});
  p.sm_scale = kScale;
  p.out = dense_out.out_desc();
  p.lse = dense_out.lse_desc();
  DSA_ASSERT_OK(dense_mla(p));
  // Both within the oracle's tolerance, and within twice that of each other.
  auto ref = oracle::dense_mla(q.exact, T, H, cache.decoded(), cu_q, {}, block_table, max_blocks, kv_lens, page, {}, kScale);
  expect_close(dense_out, ref, Tol{}, "dense");
  expect_close(sparse_out, ref, Tol{}, "sparse");
  oracle::MlaResult as_ref = ref;
  for (size_t i = 0; i < as_ref.out.size(); ++i) as_ref.out[i] = dense_out.out.as<float>()[i];
  for (size_t i = 0; i < as_ref.lse.size(); ++i) as_ref.lse[i] = dense_out.lse.as<float>()[i];
  Tol twice;
  twice.out_steps = 2;
  twice.lse_steps = 8;
  twice.score_ulps = 16;
  expect_close(sparse_out, as_ref, twice, "sparse vs dense");
}

// ---- argument checks ------------------------------------------------------------------------

namespace {

struct SparseArgs {
  std::vector<uint16_t> q = std::vector<uint16_t>(2 * 3 * D, 0);
  std::vector<int32_t> idx = std::vector<int32_t>(2 * 4, 0);
  std::vector<int32_t> len = {4, 2};
  std::vector<float> sink = {0.f, 0.f, 0.f};
  std::vector<uint16_t> out = std::vector<uint16_t>(2 * 3 * DV);
  std::vector<float> lse = std::vector<float>(2 * 3);
  Cache cache{false, 2, 64};
  SparseMlaParams p;
  SparseArgs() {
    p.q = dsa_test::t_bf16(q.data(), {2, 3, D});
    p.kv.paged = cache.desc();
    p.indices = dsa_test::t_i32(idx.data(), {2, 4});
    p.topk_length = dsa_test::t_i32(len.data(), {2});
    p.attn_sink = dsa_test::t_f32(sink.data(), {3});
    p.sm_scale = kScale;
    p.out = dsa_test::t_bf16(out.data(), {2, 3, DV});
    p.lse = dsa_test::t_f32(lse.data(), {2, 3});
  }
};

}  // namespace

TEST(SparseMla, RejectsBadArguments) {
  { SparseArgs a; DSA_ASSERT_OK(sparse_mla(a.p)); EXPECT_EQ(sparse_mla_workspace_size(a.p), 0u); }
  { SparseArgs a; a.p.q.shape[2] = 512; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"sparse_mla", "q", "576"})); }
  { SparseArgs a; a.p.q.dtype = DType::kE4M3; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"q", "dtype"})); }
  { SparseArgs a; a.p.q.stride[2] = 2; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"q", "contiguous"})); }
  { SparseArgs a; a.p.kv.paged = MlaCacheDesc{}; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"kv", "neither"})); }
  {
    SparseArgs a;
    std::vector<uint16_t> flat(D);
    a.p.kv.flat = dsa_test::t_bf16(flat.data(), {1, D});
    EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"kv", "both"}));
    a.p.kv.paged = MlaCacheDesc{};
    DSA_ASSERT_OK(sparse_mla(a.p));
    a.p.kv.flat.shape[1] = 575;
    EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"kv.flat", "576"}));
  }
  { SparseArgs a; a.p.kv.paged.page_size = 0; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"kv.paged", "page_size"})); }
  { SparseArgs a; a.p.kv.paged.block_stride_bytes = 100; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"kv.paged", "block_stride_bytes"})); }
  { SparseArgs a; a.p.indices.dtype = DType::kI64; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"indices", "i32"})); }
  { SparseArgs a; a.p.indices.shape[0] = 3; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"indices", "T"})); }
  { SparseArgs a; a.p.topk_length.shape[0] = 1; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"topk_length"})); }
  { SparseArgs a; a.len[1] = 5; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"topk_length", "[0, K = 4]", "topk_length[1] = 5"})); }
  { SparseArgs a; a.len[0] = -1; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"topk_length", "-1"})); }
  { SparseArgs a; a.p.attn_sink.shape[0] = 4; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"attn_sink", "H"})); }
  { SparseArgs a; a.p.attn_sink.dtype = DType::kBF16; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"attn_sink", "f32"})); }
  { SparseArgs a; a.p.out.shape[2] = 576; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"out", "512"})); }
  { SparseArgs a; a.p.out.dtype = DType::kI32; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"out", "dtype"})); }
  { SparseArgs a; a.p.out.stride[2] = 3; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"out", "contiguous"})); }
  { SparseArgs a; a.p.lse.dtype = DType::kBF16; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"lse", "f32"})); }
  { SparseArgs a; a.p.lse = TensorDesc{}; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"lse", "required"})); }
  { SparseArgs a; a.p.sm_scale = 0.f; EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"sm_scale"})); }
  { SparseArgs a; a.p.sm_scale = std::nanf(""); EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"sm_scale"})); }
  { SparseArgs a; a.p.out.device = cuda_device(0); EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"sparse_mla", "devices"})); }
  { SparseArgs a; a.p.kv.paged.device = cuda_device(0); EXPECT_TRUE(dsa_test::fails_naming(sparse_mla(a.p), {"sparse_mla", "cache"})); }
  // Out-of-range indices are defined semantics, not errors.
  { SparseArgs a; a.idx = {INT_MIN, -1, 128, INT_MAX, 5, 200, -3, 7}; DSA_ASSERT_OK(sparse_mla(a.p)); }
}

namespace {

struct DenseArgs {
  std::vector<uint16_t> q = std::vector<uint16_t>(4 * 2 * D, 0);
  std::vector<int32_t> cu_q = {0, 1, 4};
  std::vector<int32_t> kv_lens = {10, 3};
  std::vector<int32_t> bt = {0, 1, 2, -1};  // [2, 2] with page 8: seq 0 uses 2 pages, seq 1 one
  std::vector<int32_t> cu_k = {0, 10, 13};
  std::vector<uint16_t> flat = std::vector<uint16_t>(13 * D, 0);
  std::vector<float> out = std::vector<float>(4 * 2 * DV);
  std::vector<float> lse = std::vector<float>(4 * 2);
  Cache cache{true, 3, 8};
  DenseMlaParams p;
  DenseArgs() {
    bt = {0, 1, 2, -1};
    p.q = dsa_test::t_bf16(q.data(), {4, 2, D});
    p.kv.paged = cache.desc();
    p.cu_seqlens_q = dsa_test::t_i32(cu_q.data(), {3});
    p.block_table = dsa_test::t_i32(bt.data(), {2, 2});
    p.kv_lens = dsa_test::t_i32(kv_lens.data(), {2});
    p.sm_scale = kScale;
    p.out = dsa_test::t_f32(out.data(), {4, 2, DV});
    p.lse = dsa_test::t_f32(lse.data(), {4, 2});
  }
  void use_flat() {
    p.kv.paged = MlaCacheDesc{};
    p.kv.flat = dsa_test::t_bf16(flat.data(), {13, D});
    p.block_table = TensorDesc{};
    p.kv_lens = TensorDesc{};
    p.cu_seqlens_k = dsa_test::t_i32(cu_k.data(), {3});
  }
};

}  // namespace

TEST(DenseMla, RejectsBadArguments) {
  { DenseArgs a; DSA_ASSERT_OK(dense_mla(a.p)); EXPECT_EQ(dense_mla_workspace_size(a.p), 0u); }
  { DenseArgs a; a.use_flat(); DSA_ASSERT_OK(dense_mla(a.p)); }
  { DenseArgs a; a.p.q.shape[2] = 64; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"dense_mla", "q", "576"})); }
  { DenseArgs a; a.p.out.shape[0] = 3; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"out", "T"})); }
  { DenseArgs a; a.p.lse.shape[1] = 3; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"lse", "H"})); }
  { DenseArgs a; a.p.cu_seqlens_q.dtype = DType::kI64; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_q", "i32"})); }
  { DenseArgs a; a.p.cu_seqlens_q.shape[0] = 0; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_q", "at least one"})); }
  { DenseArgs a; a.cu_q = {1, 1, 4}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_q", "cu_seqlens_q[0] = 0"})); }
  { DenseArgs a; a.cu_q = {0, 3, 2}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_q", "non-decreasing"})); }
  { DenseArgs a; a.cu_q = {0, 1, 3}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_q", "T = 4"})); }
  { DenseArgs a; a.kv_lens = {10, 2}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"kv_lens", "q_len = 3 > kv_len = 2"})); }
  { DenseArgs a; a.kv_lens = {17, 3}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"kv_lens", "max_blocks * page_size = 16"})); }
  { DenseArgs a; a.kv_lens = {-1, 3}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"kv_lens", "kv_lens[0] = -1"})); }
  { DenseArgs a; a.bt = {0, 3, 2, -1}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"block_table", "num_blocks = 3", "block_table[0][1] = 3"})); }
  { DenseArgs a; a.kv_lens = {10, 9}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"block_table", "block_table[1][1] = -1"})); }
  { DenseArgs a; a.p.block_table.shape[0] = 3; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"block_table", "B"})); }
  { DenseArgs a; a.p.block_table = TensorDesc{}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"block_table", "required"})); }
  { DenseArgs a; a.p.kv_lens = TensorDesc{}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"kv_lens", "required"})); }
  { DenseArgs a; a.p.cu_seqlens_k = dsa_test::t_i32(a.cu_k.data(), {3}); EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", "kv.flat"})); }
  { DenseArgs a; a.use_flat(); a.p.cu_seqlens_k = TensorDesc{}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", "required"})); }
  { DenseArgs a; a.use_flat(); a.cu_k = {0, 10, 14}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", "S = 13"})); }
  { DenseArgs a; a.use_flat(); a.cu_k = {0, 10, 9}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", "non-decreasing"})); }
  { DenseArgs a; a.use_flat(); a.cu_k = {-1, 10, 13}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", ">= 0"})); }
  { DenseArgs a; a.use_flat(); a.cu_k = {0, 11, 13}; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"cu_seqlens_k", "q_len = 3 > kv_len = 2"})); }
  { DenseArgs a; a.use_flat(); a.p.block_table = dsa_test::t_i32(a.bt.data(), {2, 2}); EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"block_table", "kv.paged"})); }
  { DenseArgs a; a.p.attn_sink = dsa_test::t_f32(a.lse.data(), {3}); EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"attn_sink", "H"})); }
  { DenseArgs a; a.p.sm_scale = -1.f; EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"sm_scale"})); }
  { DenseArgs a; a.p.kv_lens.device = cuda_device(0); EXPECT_TRUE(dsa_test::fails_naming(dense_mla(a.p), {"dense_mla", "devices"})); }
}
