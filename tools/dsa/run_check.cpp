#include "run_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

namespace dsa_cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double bf16d(uint16_t v) { return dsa::bf16_to_float(v); }

// Distinct rows of [lo, hi): the first, the last, the ones in `must`, then seeded picks.
std::vector<int> sample_rows(int lo, int hi, int n, std::vector<int> must, uint64_t seed) {
  std::set<int> rows;
  if (hi <= lo) return {};
  rows.insert(lo);
  rows.insert(hi - 1);
  for (int m : must)
    if (m >= lo && m < hi) rows.insert(m);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  while (static_cast<int>(rows.size()) < std::min(n, hi - lo)) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    rows.insert(lo + static_cast<int>((x >> 33) % uint64_t(hi - lo)));
  }
  return std::vector<int>(rows.begin(), rows.end());
}

// Sparse rows to sample: include the first row of the long prefill and the first decode row.
std::vector<int> sparse_sample(const BatchSpec& s, int n) {
  int lo = s.num_dense_rows, hi = s.num_tokens;
  return sample_rows(lo, hi, n, {hi - s.num_decode_rows}, s.seed + 11);
}

// One e4m3 step at magnitude |y| (y in units of the scale).
double e4m3_step(double y) {
  y = std::fabs(y);
  if (y < 0.015625) return 0.001953125;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(y))) - 3);
}

double bf16_step(double v) {
  v = std::fabs(v);
  if (v < 1e-30) return 1e-38;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(v))) - 7);
}

struct Fp8Vec {
  uint8_t q[128];
  float scale;
};

// SPEC §3.1-3 on one 128-vector: RoPE on dims 0..63, optional Hadamard, BF16, FP8 + ue8m0.
Fp8Vec prepare_ref(const uint16_t* in, int pos, const float* cos_sin, dsa::RopeStyle rope, bool hadamard) {
  double x[128];
  for (int d = 0; d < 128; ++d) x[d] = bf16d(in[d]);
  for (int i = 0; i < 32; ++i) {
    int a = rope == dsa::RopeStyle::kInterleaved ? 2 * i : i;
    int b = rope == dsa::RopeStyle::kInterleaved ? 2 * i + 1 : i + 32;
    double c = cos_sin[int64_t(pos) * 64 + i], sn = cos_sin[int64_t(pos) * 64 + 32 + i];
    double xa = x[a], xb = x[b];
    x[a] = xa * c - xb * sn;
    x[b] = xa * sn + xb * c;
  }
  if (hadamard) {
    double y[128];
    for (int i = 0; i < 128; ++i) {
      double acc = 0;
      for (int j = 0; j < 128; ++j) acc += (__builtin_popcount(i & j) & 1) ? -x[j] : x[j];
      y[i] = acc / std::sqrt(128.0);
    }
    std::memcpy(x, y, sizeof x);
  }
  float r[128];
  float amax = 0;
  for (int d = 0; d < 128; ++d) {
    r[d] = dsa::round_to_bf16(static_cast<float>(x[d]));
    amax = std::max(amax, std::fabs(r[d]));
  }
  Fp8Vec v;
  v.scale = dsa::ue8m0_scale(amax);
  for (int d = 0; d < 128; ++d) v.q[d] = dsa::quantize_e4m3(r[d], 1.0f / v.scale);
  return v;
}

// Compares a backend FP8 vector with the reference: values within one e4m3 step (float
// rounding before the BF16/FP8 roundings may land one step over), scales powers of two.
bool compare_fp8(const uint8_t* q, float scale, const Fp8Vec& ref, double* worst, std::string* why) {
  int e;
  if (!(scale > 0) || std::frexp(scale, &e) != 0.5) {
    *why = "scale " + std::to_string(scale) + " is not a power of two";
    return false;
  }
  double smax = std::max<double>(scale, ref.scale);
  if (smax > 2.0 * std::min<double>(scale, ref.scale)) {
    *why = "scale " + std::to_string(scale) + ", reference " + std::to_string(ref.scale);
    return false;
  }
  for (int d = 0; d < 128; ++d) {
    double a = dsa::e4m3_to_float(q[d]) * double(scale), r = dsa::e4m3_to_float(ref.q[d]) * double(ref.scale);
    double tol = e4m3_step(std::max(std::fabs(a), std::fabs(r)) / smax) * smax * 1.0001;
    double err = std::fabs(a - r);
    if (!(err <= tol)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "dim %d: %.6g, reference %.6g (tolerance %.3g)", d, a, r, tol);
      *why = buf;
      *worst = std::max(*worst, std::isfinite(err) ? err / tol : kInf);
      return false;
    }
    *worst = std::max(*worst, err / tol);
  }
  return true;
}

const uint8_t* idx_cache_k(const BatchSpec& s, RunBuffers& b, int64_t slot) {
  int64_t page = slot / s.page_size, off = slot % s.page_size;
  return b.idx_cache->host() + page * s.page_size * dsa::kIndexerTokenBytes + off * 128;
}
float idx_cache_scale(const BatchSpec& s, RunBuffers& b, int64_t slot) {
  int64_t page = slot / s.page_size, off = slot % s.page_size;
  float v;
  std::memcpy(&v, b.idx_cache->host() + page * s.page_size * dsa::kIndexerTokenBytes + s.page_size * 128 + off * 4, 4);
  return v;
}
int64_t slot_of(const BatchSpec& s, RunBuffers& b, int seq, int pos) {
  const int32_t* bt = b.block_table->host_as<int32_t>();
  return int64_t(bt[int64_t(seq) * s.max_blocks + pos / s.page_size]) * s.page_size + pos % s.page_size;
}

// One MLA cache token as 576 doubles (FP8: e4m3 * tile scale).
void mla_token(const BatchSpec& s, RunBuffers& b, int64_t slot, double* kv) {
  const uint8_t* t = b.mla_cache->host() + slot * dsa::mla_token_bytes(s.mla_dtype);
  if (s.mla_dtype == dsa::MlaCacheDtype::kBF16) {
    const uint16_t* v = reinterpret_cast<const uint16_t*>(t);
    for (int d = 0; d < 576; ++d) kv[d] = bf16d(v[d]);
    return;
  }
  float sc[4];
  std::memcpy(sc, t + dsa::kMlaFp8ScaleOffset, 16);
  for (int d = 0; d < 512; ++d) kv[d] = dsa::e4m3_to_float(t[d]) * double(sc[d / 128]);
  const uint16_t* pe = reinterpret_cast<const uint16_t*>(t + dsa::kMlaFp8RopeOffset);
  for (int d = 0; d < 64; ++d) kv[512 + d] = bf16d(pe[d]);
}

void fail(CheckResult* c, const std::string& why) {
  if (c->passed) c->detail = why;
  c->passed = false;
}

CheckResult check_prepare_k(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  auto rows = sample_rows(0, s.num_tokens, n, {s.num_dense_rows}, s.seed + 1);
  for (int t : rows) {
    Fp8Vec ref = prepare_ref(b.idx_k->host_as<uint16_t>() + int64_t(t) * 128, s.row_pos[t],
                             b.cos_sin->host_as<float>(), s.geo.index_rope, s.hadamard);
    std::string why;
    if (!compare_fp8(b.k8->host() + int64_t(t) * 128, b.k_scale->host_as<float>()[t], ref, &c.worst, &why))
      fail(&c, "token " + std::to_string(t) + ": " + why);
    ++c.rows;
  }
  return c;
}

CheckResult check_prepare_q(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int Hi = s.geo.index_heads;
  const double fold = 1.0 / std::sqrt(128.0 * Hi);
  for (int t : sparse_sample(s, n)) {
    int r = t - s.num_dense_rows;
    for (int h = 0; h < Hi; ++h) {
      int64_t off = (int64_t(r) * Hi + h) * 128;
      Fp8Vec ref = prepare_ref(b.idx_q->host_as<uint16_t>() + off, s.row_pos[t], b.cos_sin->host_as<float>(),
                               s.geo.index_rope, s.hadamard);
      // The gate folds the backend's own s_q: w' = fl(w c) s_q (SPEC §3.3, docs/design.md).
      float sq = b.q_scale->host_as<float>()[int64_t(r) * Hi + h];
      double w = b.idx_w->host_as<float>()[int64_t(r) * Hi + h];
      double wf = b.w_folded->host_as<float>()[int64_t(r) * Hi + h];
      double want = w * fold * sq;
      double tol = std::fabs(want) * 2e-7 + 1e-30;
      std::string why;
      if (!compare_fp8(b.q8->host() + off, sq, ref, &c.worst, &why)) {
        fail(&c, "row " + std::to_string(t) + " head " + std::to_string(h) + ": " + why);
      } else if (!(std::fabs(wf - want) <= tol)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "row %d head %d: folded gate %.8g, reference %.8g", t, h, wf, want);
        fail(&c, buf);
      }
    }
    ++c.rows;
  }
  return c;
}

CheckResult check_write_indexer(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  for (int t : sample_rows(0, s.num_tokens, n, {s.num_dense_rows}, s.seed + 2)) {
    int64_t slot = slot_of(s, b, s.row_seq[t], s.row_pos[t]);
    if (std::memcmp(idx_cache_k(s, b, slot), b.k8->host() + int64_t(t) * 128, 128) != 0)
      fail(&c, "token " + std::to_string(t) + ": key bytes at slot " + std::to_string(slot) + " differ");
    float sc = idx_cache_scale(s, b, slot), want = b.k_scale->host_as<float>()[t];
    if (std::memcmp(&sc, &want, 4) != 0) fail(&c, "token " + std::to_string(t) + ": scale differs");
    ++c.rows;
  }
  return c;
}

CheckResult check_write_mla(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  for (int t : sample_rows(0, s.num_tokens, n, {s.num_dense_rows}, s.seed + 3)) {
    int64_t slot = slot_of(s, b, s.row_seq[t], s.row_pos[t]);
    const uint8_t* tok = b.mla_cache->host() + slot * dsa::mla_token_bytes(s.mla_dtype);
    const uint16_t* kv = b.kv_c->host_as<uint16_t>() + int64_t(t) * 512;
    const uint16_t* pe = b.k_pe->host_as<uint16_t>() + int64_t(t) * 64;
    if (s.mla_dtype == dsa::MlaCacheDtype::kBF16) {
      if (std::memcmp(tok, kv, 1024) != 0 || std::memcmp(tok + 1024, pe, 128) != 0)
        fail(&c, "token " + std::to_string(t) + ": bf16 bytes at slot " + std::to_string(slot) + " differ");
    } else {
      // Inputs are BF16 and scales powers of two, so the FP8 bytes are exactly determined.
      for (int tile = 0; tile < 4; ++tile) {
        float amax = 0;
        for (int d = 0; d < 128; ++d) amax = std::max(amax, std::fabs(dsa::bf16_to_float(kv[tile * 128 + d])));
        float sc = dsa::ue8m0_scale(amax), got;
        std::memcpy(&got, tok + dsa::kMlaFp8ScaleOffset + tile * 4, 4);
        if (got != sc) fail(&c, "token " + std::to_string(t) + ": tile scale differs");
        for (int d = 0; d < 128; ++d)
          if (tok[tile * 128 + d] != dsa::quantize_e4m3(dsa::bf16_to_float(kv[tile * 128 + d]), 1.0f / sc))
            fail(&c, "token " + std::to_string(t) + ": fp8 byte " + std::to_string(tile * 128 + d) + " differs");
      }
      if (std::memcmp(tok + dsa::kMlaFp8RopeOffset, pe, 128) != 0) fail(&c, "token " + std::to_string(t) + ": k_pe differs");
    }
    ++c.rows;
  }
  return c;
}

CheckResult check_logits(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int Hi = s.geo.index_heads, W = s.logits_width;
  const float* lg = b.logits->host_as<float>();
  // f32 accumulation on the CPU; Hopper FP8 tensor cores accumulate with fewer mantissa bits
  // (about 14), so the GPU gets 2^-12 of the sum of absolute terms.
  const double rel = s.device.type == dsa::DeviceType::kCUDA ? 1.0 / 4096 : 1e-5;
  // Every row: finite inside its length, -inf past it (poisoned cache slots would show as NaN).
  for (int r = 0; r < s.num_sparse_rows && c.passed; ++r) {
    int L = b.row_len->host_as<int32_t>()[r];
    for (int j = 0; j < W; ++j) {
      float v = lg[int64_t(r) * W + j];
      if (j < L ? !std::isfinite(v) : !(std::isinf(v) && v < 0)) {
        fail(&c, "row " + std::to_string(s.num_dense_rows + r) + " column " + std::to_string(j) + ": " +
                     std::to_string(v) + (j < L ? " (expected finite)" : " (expected -inf)"));
        break;
      }
    }
  }
  for (int t : sparse_sample(s, n)) {
    int r = t - s.num_dense_rows, seq = s.row_seq[t], L = s.row_pos[t] + 1;
    const uint8_t* q = b.q8->host() + int64_t(r) * Hi * 128;
    const float* w = b.w_folded->host_as<float>() + int64_t(r) * Hi;
    double qd[128 * 64];
    for (int i = 0; i < Hi * 128; ++i) qd[i] = dsa::e4m3_to_float(q[i]);
    for (int j = 0; j < L; ++j) {
      int64_t slot = slot_of(s, b, seq, j);
      const uint8_t* k = idx_cache_k(s, b, slot);
      double kd[128];
      for (int d = 0; d < 128; ++d) kd[d] = dsa::e4m3_to_float(k[d]);
      double sk = idx_cache_scale(s, b, slot), ref = 0, mag = 0;
      for (int h = 0; h < Hi; ++h) {
        double dot = 0, absdot = 0;
        for (int d = 0; d < 128; ++d) {
          dot += qd[h * 128 + d] * kd[d];
          absdot += std::fabs(qd[h * 128 + d] * kd[d]);
        }
        ref += w[h] * std::max(dot, 0.0) * sk;
        mag += std::fabs(w[h]) * absdot * sk;
      }
      double got = lg[int64_t(r) * W + j], tol = rel * mag + 1e-30, err = std::fabs(got - ref);
      c.worst = std::max(c.worst, std::isfinite(err) ? err / tol : kInf);
      if (!(err <= tol)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "row %d column %d: %.7g, reference %.7g", t, j, got, ref);
        fail(&c, buf);
        break;
      }
    }
    ++c.rows;
  }
  return c;
}

CheckResult check_topk(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int K = s.geo.topk, W = s.logits_width;
  const int32_t* got = b.topk_idx->host_as<int32_t>();
  // Every row: min(L, K) valid entries, then -1.
  for (int r = 0; r < s.num_sparse_rows && c.passed; ++r) {
    int L = b.row_len->host_as<int32_t>()[r], want = std::min(L, K);
    for (int j = 0; j < K; ++j) {
      int v = got[int64_t(r) * K + j];
      bool ok = j < want ? (v >= 0 && v < L) : v == -1;
      if (!ok) {
        fail(&c, "row " + std::to_string(s.num_dense_rows + r) + " entry " + std::to_string(j) + " = " + std::to_string(v));
        break;
      }
    }
  }
  for (int t : sparse_sample(s, n)) {
    int r = t - s.num_dense_rows, L = s.row_pos[t] + 1;
    const float* lg = b.logits->host_as<float>() + int64_t(r) * W;
    std::vector<int> order(L);
    for (int j = 0; j < L; ++j) order[j] = j;
    // The k largest; ties at the k-th value go to the lower index; NaN below everything.
    auto better = [&](int a, int bb) {
      float x = lg[a], y = lg[bb];
      if (std::isnan(x) != std::isnan(y)) return std::isnan(y);
      if (!std::isnan(x) && x != y) return x > y;
      return a < bb;
    };
    if (L > K) std::nth_element(order.begin(), order.begin() + K, order.end(), better);
    std::vector<int> want(order.begin(), order.begin() + std::min(L, K));
    std::sort(want.begin(), want.end());
    std::vector<int> have;
    for (int j = 0; j < K; ++j)
      if (got[int64_t(r) * K + j] >= 0) have.push_back(got[int64_t(r) * K + j]);
    std::sort(have.begin(), have.end());
    if (have != want) {
      size_t i = 0;
      while (i < have.size() && i < want.size() && have[i] == want[i]) ++i;
      fail(&c, "row " + std::to_string(t) + ": selected set differs from the reference (first at sorted entry " +
                   std::to_string(i) + ")");
    }
    ++c.rows;
  }
  return c;
}

CheckResult check_map(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int K = s.geo.topk;
  for (int t : sparse_sample(s, n)) {
    int r = t - s.num_dense_rows, seq = s.row_seq[t];
    for (int j = 0; j < K; ++j) {
      int idx = b.topk_idx->host_as<int32_t>()[int64_t(r) * K + j];
      int64_t want = idx < 0 || idx / s.page_size >= s.max_blocks ? -1 : slot_of(s, b, seq, idx);
      int got = b.mapped->host_as<int32_t>()[int64_t(r) * K + j];
      if (got != want) {
        fail(&c, "row " + std::to_string(t) + " entry " + std::to_string(j) + ": " + std::to_string(got) +
                     ", expected " + std::to_string(want));
        break;
      }
    }
    ++c.rows;
  }
  return c;
}

// Attention of row t over `slots` (all heads) against the backend's out and lse.
void check_attention_row(const BatchSpec& s, RunBuffers& b, int t, const std::vector<int64_t>& slots, CheckResult* c) {
  const int H = s.geo.num_heads;
  const double scale = static_cast<float>(s.geo.sm_scale);
  std::vector<double> kv(slots.size() * 576);
  for (size_t j = 0; j < slots.size(); ++j) mla_token(s, b, slots[j], &kv[j * 576]);
  std::vector<double> p(slots.size()), o(512);
  for (int h = 0; h < H && c->passed; ++h) {
    const uint16_t* q = b.q_mla->host_as<uint16_t>() + (int64_t(t) * H + h) * 576;
    double qd[576];
    for (int d = 0; d < 576; ++d) qd[d] = bf16d(q[d]);
    double mx = -kInf;
    for (size_t j = 0; j < slots.size(); ++j) {
      double acc = 0;
      for (int d = 0; d < 576; ++d) acc += qd[d] * kv[j * 576 + d];
      p[j] = acc * scale;
      mx = std::max(mx, p[j]);
    }
    double sum = 0;
    for (size_t j = 0; j < slots.size(); ++j) sum += (p[j] = std::exp(p[j] - mx));
    std::fill(o.begin(), o.end(), 0.0);
    for (size_t j = 0; j < slots.size(); ++j)
      for (int d = 0; d < 512; ++d) o[d] += p[j] / sum * kv[j * 576 + d];
    double lse_ref = slots.empty() ? kInf : mx + std::log(sum);
    double omax = 0;
    for (int d = 0; d < 512; ++d) omax = std::max(omax, std::fabs(o[d]));
    const uint16_t* out = b.out->host_as<uint16_t>() + (int64_t(t) * H + h) * 512;
    for (int d = 0; d < 512; ++d) {
      double got = bf16d(out[d]), err = std::fabs(got - o[d]);
      // Two bf16 steps of the value plus one of the head's largest output.
      double tol = 2 * bf16_step(o[d]) + bf16_step(omax);
      c->worst = std::max(c->worst, std::isfinite(err) ? err / tol : kInf);
      if (!(err <= tol)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "row %d head %d dim %d: out %.6g, reference %.6g", t, h, d, got, o[d]);
        fail(c, buf);
        return;
      }
    }
    double got = b.lse->host_as<float>()[int64_t(t) * H + h];
    double tol = 2e-5 * std::max(1.0, std::fabs(lse_ref)), err = std::fabs(got - lse_ref);
    if (std::isinf(lse_ref) ? got != lse_ref : !(err <= tol)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "row %d head %d: lse %.8g, reference %.8g", t, h, got, lse_ref);
      fail(c, buf);
      return;
    }
    if (std::isfinite(lse_ref)) c->worst = std::max(c->worst, err / tol);
  }
}

// Every output row in [lo, hi) was written: no NaN (the buffers start NaN-poisoned).
void check_rows_written(const BatchSpec& s, RunBuffers& b, int lo, int hi, CheckResult* c) {
  const int64_t H = s.geo.num_heads;
  const uint16_t* out = b.out->host_as<uint16_t>();
  const float* lse = b.lse->host_as<float>();
  for (int64_t i = int64_t(lo) * H * 512; i < int64_t(hi) * H * 512; ++i) {
    if ((out[i] & 0x7fff) > 0x7f80) {
      fail(c, "row " + std::to_string(i / (H * 512)) + ": out holds NaN");
      return;
    }
  }
  for (int64_t i = int64_t(lo) * H; i < int64_t(hi) * H; ++i) {
    if (std::isnan(lse[i])) {
      fail(c, "row " + std::to_string(i / H) + ": lse is NaN");
      return;
    }
  }
}

CheckResult check_sparse(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  check_rows_written(s, b, s.num_dense_rows, s.num_tokens, &c);
  const int K = s.geo.topk;
  const int64_t num_slots = int64_t(s.num_blocks) * s.page_size;
  for (int t : sparse_sample(s, n)) {
    if (!c.passed) break;
    int r = t - s.num_dense_rows;
    std::vector<int64_t> slots;
    for (int j = 0; j < K; ++j) {
      int v = b.mapped->host_as<int32_t>()[int64_t(r) * K + j];
      if (v >= 0 && v < num_slots) slots.push_back(v);
    }
    check_attention_row(s, b, t, slots, &c);
    ++c.rows;
  }
  return c;
}

CheckResult check_dense(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  check_rows_written(s, b, 0, s.num_dense_rows, &c);
  for (int t : sample_rows(0, s.num_dense_rows, n, {}, s.seed + 5)) {
    if (!c.passed) break;
    std::vector<int64_t> slots;
    for (int j = 0; j <= s.row_pos[t]; ++j) slots.push_back(slot_of(s, b, s.row_seq[t], j));
    check_attention_row(s, b, t, slots, &c);
    ++c.rows;
  }
  return c;
}

}  // namespace

CheckResult check_stage(const std::string& stage, const BatchSpec& s, RunBuffers& b, int samples) {
  CheckResult c;
  if (stage == "prepare_indexer_k") c = check_prepare_k(s, b, samples);
  else if (stage == "prepare_indexer_q") c = check_prepare_q(s, b, samples);
  else if (stage == "write_indexer_cache") c = check_write_indexer(s, b, samples);
  else if (stage == "write_mla_cache") c = check_write_mla(s, b, samples);
  else if (stage == "indexer_logits") c = check_logits(s, b, samples);
  else if (stage == "topk") c = check_topk(s, b, samples);
  else if (stage == "map_indices") c = check_map(s, b, samples);
  else if (stage == "sparse_mla") c = check_sparse(s, b, samples);
  else if (stage == "dense_mla") c = check_dense(s, b, samples);
  else fail(&c, "no reference for stage " + stage);
  c.stage = stage;
  return c;
}

}  // namespace dsa_cli
