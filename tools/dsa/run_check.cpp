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

// Slot `slot` of both caches unchanged since setup (the indexer page keeps keys, then scales).
bool idx_slot_unchanged(const BatchSpec& s, RunBuffers& b, int64_t slot) {
  const int64_t page = slot / s.page_size, off = slot % s.page_size, base = page * s.page_size * dsa::kIndexerTokenBytes;
  const uint8_t *now = b.idx_cache->host(), *was = b.idx_cache_before.data();
  return std::memcmp(now + base + off * 128, was + base + off * 128, 128) == 0 &&
         std::memcmp(now + base + s.page_size * 128 + off * 4, was + base + s.page_size * 128 + off * 4, 4) == 0;
}
bool mla_slot_unchanged(const BatchSpec& s, RunBuffers& b, int64_t slot) {
  const int64_t tb = dsa::mla_token_bytes(s.mla_dtype);
  return std::memcmp(b.mla_cache->host() + slot * tb, b.mla_cache_before.data() + slot * tb, static_cast<size_t>(tb)) == 0;
}

// Slots of the step's new tokens, marked in a [num_blocks * page] table.
std::vector<char> new_token_slots(const BatchSpec& s, RunBuffers& b) {
  std::vector<char> mine(size_t(s.num_blocks) * s.page_size, 0);
  for (int t = 0; t < s.num_tokens; ++t) mine[slot_of(s, b, s.row_seq[t], s.row_pos[t])] = 1;
  return mine;
}

// Every new token's key in the indexer cache against the float64 preparation; every other
// slot (cached prefixes, spare NaN pages) byte for byte as setup left it.
CheckResult check_indexer_cache(const BatchSpec& s, RunBuffers& b) {
  CheckResult c;
  for (int t = 0; t < s.num_tokens; ++t) {
    Fp8Vec ref = prepare_ref(b.idx_k->host_as<uint16_t>() + int64_t(t) * 128, s.row_pos[t],
                             b.cos_sin->host_as<float>(), s.geo.index_rope, s.hadamard);
    const int64_t slot = slot_of(s, b, s.row_seq[t], s.row_pos[t]);
    std::string why;
    if (!compare_fp8(idx_cache_k(s, b, slot), idx_cache_scale(s, b, slot), ref, &c.worst, &why))
      fail(&c, "token " + std::to_string(t) + " (slot " + std::to_string(slot) + "): " + why);
    ++c.rows;
  }
  const auto mine = new_token_slots(s, b);
  for (int64_t slot = 0; slot < int64_t(mine.size()); ++slot)
    if (!mine[slot] && !idx_slot_unchanged(s, b, slot)) {
      fail(&c, "slot " + std::to_string(slot) + " holds no new token but changed");
      break;
    }
  return c;
}

// Every new token's latent in the MLA cache, bytes exactly determined (BF16 copies; FP8 with
// power-of-two tile scales of BF16 inputs); every other slot unchanged.
CheckResult check_mla_cache(const BatchSpec& s, RunBuffers& b) {
  CheckResult c;
  for (int t = 0; t < s.num_tokens; ++t) {
    int64_t slot = slot_of(s, b, s.row_seq[t], s.row_pos[t]);
    const uint8_t* tok = b.mla_cache->host() + slot * dsa::mla_token_bytes(s.mla_dtype);
    const uint16_t* kv = b.kv_c->host_as<uint16_t>() + int64_t(t) * 512;
    const uint16_t* pe = b.k_pe->host_as<uint16_t>() + int64_t(t) * 64;
    if (s.mla_dtype == dsa::MlaCacheDtype::kBF16) {
      if (std::memcmp(tok, kv, 1024) != 0 || std::memcmp(tok + 1024, pe, 128) != 0)
        fail(&c, "token " + std::to_string(t) + ": bf16 bytes at slot " + std::to_string(slot) + " differ");
    } else {
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
  const auto mine = new_token_slots(s, b);
  for (int64_t slot = 0; slot < int64_t(mine.size()); ++slot)
    if (!mine[slot] && !mla_slot_unchanged(s, b, slot)) {
      fail(&c, "slot " + std::to_string(slot) + " holds no new token but changed");
      break;
    }
  return c;
}

// The prepared queries the selection check scores with (prepare_indexer_q on every row; the
// step's own preparation is row-wise the same call) against the float64 preparation.
CheckResult check_prepare_q(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int Hi = s.geo.index_heads;
  const double fold = 1.0 / std::sqrt(128.0 * Hi);
  for (int t : sparse_sample(s, n)) {
    for (int h = 0; h < Hi; ++h) {
      int64_t off = (int64_t(t) * Hi + h) * 128;
      Fp8Vec ref = prepare_ref(b.idx_q->host_as<uint16_t>() + off, s.row_pos[t], b.cos_sin->host_as<float>(),
                               s.geo.index_rope, s.hadamard);
      // The gate folds the backend's own s_q: w' = fl(w c) s_q (SPEC §3.3, docs/design.md).
      float sq = b.q_scale->host_as<float>()[int64_t(t) * Hi + h];
      double w = b.idx_w->host_as<float>()[int64_t(t) * Hi + h];
      double wf = b.w_folded->host_as<float>()[int64_t(t) * Hi + h];
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

// The step's selection (StepParams::indices_out). Every row: min(L, k) ascending keys in
// [0, L) then -1; dense rows exactly the identity 0..L-1. Sampled sparse rows: against logits in
// float64 from the prepared queries and the cache bytes, compared as sets with ties by value:
// the best key left out may beat the worst key taken by no more than their two tolerances
// (1e-5 of the sum of absolute terms; 2^-12 on CUDA, whose FP8 tensor cores accumulate with
// about 14 mantissa bits).
CheckResult check_selection(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  const int K = s.geo.topk, Hi = s.geo.index_heads;
  const int32_t* sel = b.indices->host_as<int32_t>();
  for (int t = 0; t < s.num_tokens && c.passed; ++t) {
    const int L = s.row_pos[t] + 1, want = std::min(L, K);
    const bool dense = t < s.num_dense_rows;
    for (int j = 0; j < K; ++j) {
      const int v = sel[int64_t(t) * K + j];
      const bool ok = j >= want ? v == -1 : dense ? v == j : (v >= 0 && v < L && (j == 0 || v > sel[int64_t(t) * K + j - 1]));
      if (!ok) {
        fail(&c, "row " + std::to_string(t) + " entry " + std::to_string(j) + " = " + std::to_string(v) +
                     (dense ? " (dense row: expected the identity)" : " (expected ascending keys in [0, L) then -1)"));
        break;
      }
    }
  }
  if (!c.passed) return c;
  c.rows = s.num_dense_rows;  // dense rows: exact, all of them
  const double rel = s.device.type == dsa::DeviceType::kCUDA ? 1.0 / 4096 : 1e-5;
  std::vector<double> qd(size_t(Hi) * 128), ref, tol;
  std::vector<char> chosen;
  for (int t : sparse_sample(s, n)) {
    const int seq = s.row_seq[t], L = s.row_pos[t] + 1;
    const uint8_t* q = b.q8->host() + int64_t(t) * Hi * 128;
    const float* w = b.w_folded->host_as<float>() + int64_t(t) * Hi;
    for (int i = 0; i < Hi * 128; ++i) qd[i] = dsa::e4m3_to_float(q[i]);
    ref.assign(L, 0.0);
    tol.assign(L, 0.0);
    for (int j = 0; j < L; ++j) {
      const int64_t slot = slot_of(s, b, seq, j);
      const uint8_t* k = idx_cache_k(s, b, slot);
      double kd[128];
      for (int d = 0; d < 128; ++d) kd[d] = dsa::e4m3_to_float(k[d]);
      double sk = idx_cache_scale(s, b, slot), r = 0, mag = 0;
      for (int h = 0; h < Hi; ++h) {
        double dot = 0, absdot = 0;
        for (int d = 0; d < 128; ++d) {
          dot += qd[h * 128 + d] * kd[d];
          absdot += std::fabs(qd[h * 128 + d] * kd[d]);
        }
        r += w[h] * std::max(dot, 0.0) * sk;
        mag += std::fabs(w[h]) * absdot * sk;
      }
      ref[j] = r;
      tol[j] = rel * mag + 1e-30;
    }
    chosen.assign(L, 0);
    for (int j = 0; j < std::min(L, K); ++j) chosen[sel[int64_t(t) * K + j]] = 1;
    int worst_in = -1, best_out = -1;
    for (int j = 0; j < L; ++j) {
      if (chosen[j] && (worst_in < 0 || ref[j] < ref[worst_in])) worst_in = j;
      if (!chosen[j] && (best_out < 0 || ref[j] > ref[best_out])) best_out = j;
    }
    if (worst_in >= 0 && best_out >= 0 && ref[best_out] > ref[worst_in]) {
      const double over = (ref[best_out] - ref[worst_in]) / (tol[best_out] + tol[worst_in]);
      c.worst = std::max(c.worst, over);
      if (!(over <= 1.0)) {
        char buf[200];
        std::snprintf(buf, sizeof buf, "row %d: key %d (score %.7g) left out, key %d (score %.7g) taken", t, best_out,
                      ref[best_out], worst_in, ref[worst_in]);
        fail(&c, buf);
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

// Sparse rows: attention over the cache tokens the step selected (positions through the block
// table); every sparse row written.
CheckResult check_sparse(const BatchSpec& s, RunBuffers& b, int n) {
  CheckResult c;
  check_rows_written(s, b, s.num_dense_rows, s.num_tokens, &c);
  const int K = s.geo.topk;
  for (int t : sparse_sample(s, n)) {
    if (!c.passed) break;
    std::vector<int64_t> slots;
    for (int j = 0; j < K; ++j) {
      const int v = b.indices->host_as<int32_t>()[int64_t(t) * K + j];
      if (v > s.row_pos[t]) {
        fail(&c, "row " + std::to_string(t) + " entry " + std::to_string(j) + ": key " + std::to_string(v) + " past the row");
        return c;
      }
      if (v >= 0) slots.push_back(slot_of(s, b, s.row_seq[t], v));
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

// The step report against the batch and the plan: SPEC §6 routes (kv_len <= topk dense, the
// rest scored), every row counted once, the arena's high-water mark within the plan.
CheckResult check_report(const BatchSpec& s, const dsa::Plan& plan, const dsa::StepReport& r) {
  CheckResult c;
  const int dense = static_cast<int>(dsa::Route::kDense), scored = static_cast<int>(dsa::Route::kSparseScored);
  const int64_t B = static_cast<int64_t>(s.seqs.size());
  if (r.seqs[dense] != s.num_dense_seqs || r.rows[dense] != s.num_dense_rows)
    fail(&c, "dense route: " + std::to_string(r.seqs[dense]) + " seqs / " + std::to_string(r.rows[dense]) +
                 " rows, expected " + std::to_string(s.num_dense_seqs) + " / " + std::to_string(s.num_dense_rows));
  if (r.seqs[scored] != B - s.num_dense_seqs || r.rows[scored] != s.num_sparse_rows)
    fail(&c, "sparse route: " + std::to_string(r.seqs[scored]) + " seqs / " + std::to_string(r.rows[scored]) +
                 " rows, expected " + std::to_string(B - s.num_dense_seqs) + " / " + std::to_string(s.num_sparse_rows));
  if (r.seqs[static_cast<int>(dsa::Route::kSparseShared)] != 0) fail(&c, "a full layer routed a sequence to shared");
  if (r.workspace_high_water_bytes > plan.workspace_bytes)
    fail(&c, "workspace high-water " + std::to_string(r.workspace_high_water_bytes) + " B exceeds the plan's " +
                 std::to_string(plan.workspace_bytes) + " B");
  if (r.score_high_water_bytes > plan.score_region_bytes || plan.score_region_bytes > plan.score_budget_bytes)
    fail(&c, "score high-water " + std::to_string(r.score_high_water_bytes) + " B, region " +
                 std::to_string(plan.score_region_bytes) + " B, budget " + std::to_string(plan.score_budget_bytes) + " B");
  c.rows = s.num_tokens;
  return c;
}

}  // namespace

std::vector<CheckResult> check_step(const BatchSpec& s, RunBuffers& b, const dsa::Plan& plan,
                                    const dsa::StepReport& report, int samples) {
  std::vector<CheckResult> all;
  auto add = [&](const char* name, CheckResult c) {
    c.stage = name;
    all.push_back(std::move(c));
  };
  add("routes_and_workspace", check_report(s, plan, report));
  add("indexer_cache", check_indexer_cache(s, b));
  add("mla_cache", check_mla_cache(s, b));
  add("prepared_queries", check_prepare_q(s, b, samples));
  add("selection", check_selection(s, b, samples));
  add("sparse_attention", check_sparse(s, b, samples));
  add("dense_attention", check_dense(s, b, samples));
  return all;
}

}  // namespace dsa_cli
