// Distributed ops (dsa/dist.h) on the CPU with simulated ranks: R threads, each with its own
// Attention object and cache replica, joined by the in-process communicator group. Checked
// against the single-rank step, topk() and sparse_mla() of the unsharded problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>

#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;
using dsa_test::t_f32;
using dsa_test::t_i32;
using dsa_test::t_i64;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Runs fn(rank) on R threads and joins them.
void run_ranks(int R, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

std::vector<std::unique_ptr<dist::Communicator>> group(int R) {
  std::vector<std::unique_ptr<dist::Communicator>> g;
  EXPECT_TRUE(dist::make_local_group(R, cpu_device(), &g).ok());
  return g;
}

bool same_f32_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// ---- the communicator ----------------------------------------------------------------------

TEST(DistLocalGroup, AllGatherAndAllReduce) {
  for (int R : {1, 2, 3, 4}) {
    auto g = group(R);
    std::vector<std::vector<int32_t>> got(R);
    std::vector<std::vector<float>> red(R), mx(R);
    std::vector<Status> st(R);
    run_ranks(R, [&](int r) {
      std::vector<int32_t> mine = {r * 10 + 1, r * 10 + 2, r * 10 + 3};
      got[r].assign(3 * R, -1);
      // In place: this rank's slot of recv is its send buffer.
      std::copy(mine.begin(), mine.end(), got[r].begin() + 3 * r);
      st[r] = g[r]->all_gather(got[r].data() + 3 * r, got[r].data(), 12, nullptr);
      std::vector<float> x = {float(r), float(-r), 0.5f};
      red[r].assign(3, 0.f);
      if (st[r].ok()) st[r] = g[r]->all_reduce_f32(x.data(), red[r].data(), 3, dist::ReduceOp::kSum, nullptr);
      mx[r] = x;  // in place
      if (st[r].ok()) st[r] = g[r]->all_reduce_f32(mx[r].data(), mx[r].data(), 3, dist::ReduceOp::kMax, nullptr);
    });
    for (int r = 0; r < R; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].to_string();
      for (int q = 0; q < R; ++q)
        for (int i = 0; i < 3; ++i) EXPECT_EQ(got[r][3 * q + i], q * 10 + i + 1);
      const float s = float(R * (R - 1) / 2);
      EXPECT_EQ(red[r][0], s);
      EXPECT_EQ(red[r][1], -s);
      EXPECT_EQ(red[r][2], 0.5f * R);
      EXPECT_EQ(mx[r][0], float(R - 1));
      EXPECT_EQ(mx[r][1], 0.f);
    }
  }
}

TEST(DistLocalGroup, MismatchedSizesFailOnEveryRank) {
  auto g = group(2);
  std::vector<Status> st(2);
  std::vector<uint8_t> buf[2] = {std::vector<uint8_t>(64), std::vector<uint8_t>(64)};
  run_ranks(2, [&](int r) { st[r] = g[r]->all_gather(buf[r].data(), buf[r].data(), r ? 8 : 16, nullptr); });
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  std::vector<std::unique_ptr<dist::Communicator>> none;
  EXPECT_TRUE(dsa_test::fails_naming(dist::make_local_group(0, cpu_device(), &none), {"ranks"}));
  std::unique_ptr<dist::Communicator> nc;
  if (!dist::nccl_available())
    EXPECT_EQ(dist::make_nccl_communicator(nullptr, 0, &nc).code(), StatusCode::kUnsupported);
}

// ---- the sharding -------------------------------------------------------------------------

TEST(DistCpShard, CoversEveryTokenOnceZigzagAndRoutesLikeTheSequence) {
  const int64_t topk = 64;
  const std::vector<int32_t> q = {1, 7, 300, 5, 200, 130, 0, 64};
  const std::vector<int32_t> kv = {1, 7, 300, 900, 200, 1000, 3, 70};
  const int64_t B = static_cast<int64_t>(q.size());
  for (int R : {1, 2, 3, 4}) {
    std::vector<std::vector<int>> owner(B);
    for (int64_t b = 0; b < B; ++b) owner[b].assign(q[b], -1);
    for (int r = 0; r < R; ++r) {
      std::vector<dist::CpPiece> pc;
      DSA_ASSERT_OK(dist::cp_shard(q.data(), kv.data(), B, topk, R, r, &pc));
      int last_seq = -1;
      for (const auto& p : pc) {
        EXPECT_GE(p.seq, last_seq);  // (sequence, chunk) order
        last_seq = p.seq;
        EXPECT_GT(p.q_len, 0);
        EXPECT_EQ(p.kv_len, kv[p.seq] - q[p.seq] + p.q_begin + p.q_len);
        // A piece of a sequence routed sparse is routed sparse too.
        if (kv[p.seq] > topk) EXPECT_GT(p.kv_len, topk) << "R=" << R << " seq " << p.seq;
        for (int32_t i = 0; i < p.q_len; ++i) {
          EXPECT_EQ(owner[p.seq][p.q_begin + i], -1);
          owner[p.seq][p.q_begin + i] = r;
        }
      }
    }
    for (int64_t b = 0; b < B; ++b)
      for (int32_t i = 0; i < q[b]; ++i) EXPECT_GE(owner[b][i], 0) << "R=" << R << " seq " << b << " token " << i;
    // Zigzag: a 300-token fresh prompt (seq 2) with R ranks: chunk c of 2R goes to rank
    // min(c, 2R-1-c), except the leading chunks that end at or below topk (rank 0).
    const int C = 2 * R;
    for (int c = 0; c < C; ++c) {
      const int s = c * (300 / C) + std::min(c, 300 % C);
      const int e = (c + 1) * (300 / C) + std::min(c + 1, 300 % C);
      // chunk c joins the first piece iff every chunk before it ends at or below topk
      const int want = s <= topk ? 0 : std::min(c, C - 1 - c);
      for (int i = s; i < e; ++i) ASSERT_EQ(owner[2][i], want) << "R=" << R << " chunk " << c;
    }
  }
  // Few tokens: some ranks serve nothing.
  std::vector<dist::CpPiece> pc;
  const int32_t q1 = 3, kv1 = 3;
  DSA_ASSERT_OK(dist::cp_shard(&q1, &kv1, 1, topk, 4, 3, &pc));
  EXPECT_TRUE(pc.empty());
  EXPECT_TRUE(dsa_test::fails_naming(dist::cp_shard(&q1, &kv1, 1, topk, 2, 2, &pc), {"rank"}));
}

// ---- exact distributed top-k ----------------------------------------------------------------

// The single-GPU answer for rows [M, W] of global logits.
void topk_reference(std::vector<float>& logits, std::vector<int32_t>& lengths, int64_t M, int64_t W, int64_t k,
                    std::vector<int32_t>* idx, std::vector<float>* val) {
  idx->assign(static_cast<size_t>(M * k), -7);
  val->assign(static_cast<size_t>(M * k), -7.f);
  TopkParams p;
  p.logits = t_f32(logits.data(), {M, W});
  p.lengths = t_i32(lengths.data(), {M});
  p.k = k;
  p.indices = t_i32(idx->data(), {M, k});
  p.values = t_f32(val->data(), {M, k});
  std::vector<uint8_t> ws(topk_workspace_size(p) + 1);
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  ASSERT_TRUE(topk(p).ok());
}

// Shards the rows by token index and runs dist_topk on R threads; every rank's answer must be
// the single-rank one, bit for bit.
void check_dist_topk(std::vector<float>& logits, std::vector<int32_t>& lengths, int64_t M, int64_t W, int64_t k,
                     int R, int64_t I, const char* what) {
  std::vector<int32_t> ref_idx;
  std::vector<float> ref_val;
  topk_reference(logits, lengths, M, W, k, &ref_idx, &ref_val);
  auto g = group(R);
  std::vector<std::vector<int32_t>> idx(R);
  std::vector<std::vector<float>> val(R);
  std::vector<Status> st(R);
  run_ranks(R, [&](int r) {
    // This rank's keys: global positions g with owner r, in local order.
    int64_t Wl = 0;
    for (int64_t gp = 0; gp < W; ++gp) Wl += ((gp / I) % R) == r;
    std::vector<float> ll(static_cast<size_t>(std::max<int64_t>(M * Wl, 1)), kNaN);
    std::vector<int32_t> len(static_cast<size_t>(M), 0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t gp = 0; gp < W; ++gp) {
        if ((gp / I) % R != r) continue;
        const int64_t l = (gp / (I * R)) * I + gp % I;
        ll[i * Wl + l] = logits[i * W + gp];
        if (gp < lengths[i]) len[i] = static_cast<int32_t>(l + 1);
      }
    idx[r].assign(static_cast<size_t>(M * k), -7);
    val[r].assign(static_cast<size_t>(M * k), -7.f);
    dist::DistTopkParams p;
    p.logits = t_f32(ll.data(), {M, Wl});
    p.lengths = t_i32(len.data(), {M});
    p.k = k;
    p.interleave = I;
    p.indices = t_i32(idx[r].data(), {M, k});
    p.values = t_f32(val[r].data(), {M, k});
    Guarded ws(dist::dist_topk_workspace_size(p, R), 0x7F);
    p.workspace = ws.data();
    p.workspace_bytes = ws.size();
    st[r] = dist::dist_topk(p, *g[r]);
    // The guard verdict goes into this rank's own status: a shared std::vector<bool> packs the
    // ranks' flags into one word, and threads writing neighbouring bits race.
    if (st[r].ok() && !ws.intact()) st[r] = Status(StatusCode::kInternal, "workspace guard");
  });
  for (int r = 0; r < R; ++r) {
    ASSERT_TRUE(st[r].ok()) << what << " R=" << R << ": " << st[r].to_string();
    for (int64_t i = 0; i < M * k; ++i) {
      ASSERT_EQ(idx[r][i], ref_idx[i]) << what << " R=" << R << " I=" << I << " rank " << r << " row " << i / k
                                       << " slot " << i % k;
      ASSERT_TRUE(same_f32_bits(val[r][i], ref_val[i])) << what << " row " << i / k << " slot " << i % k;
    }
  }
}

TEST(DistTopk, RandomRowsEqualSingleRankTopk) {
  dsa_test::Rng rng(19);
  const int64_t k = 64;
  for (int64_t W : {1, 40, 64, 65, 300}) {
    const int64_t M = 9;
    std::vector<float> logits(static_cast<size_t>(M * W));
    for (auto& x : logits) x = rng.normal();
    std::vector<int32_t> lengths(static_cast<size_t>(M));
    const int64_t pick[] = {0, 1, W / 2, W, W, k - 1, k, k + 1, W};
    for (int64_t i = 0; i < M; ++i) lengths[i] = static_cast<int32_t>(std::min(pick[i], W));
    for (int R : {1, 2, 3, 4})
      for (int64_t I : {1, 3}) check_dist_topk(logits, lengths, M, W, k, R, I, "random");
  }
}

TEST(DistTopk, AdversarialTiesInfNanAllEqual) {
  const int64_t k = 64, W = 257, M = 8;
  dsa_test::Rng rng(7);
  std::vector<float> logits(static_cast<size_t>(M * W));
  std::vector<int32_t> lengths(static_cast<size_t>(M), static_cast<int32_t>(W));
  for (int64_t j = 0; j < W; ++j) {
    logits[0 * W + j] = 1.0f;                                     // all equal: 0 .. k-1
    logits[1 * W + j] = static_cast<float>(j % 3);                // ties at the k-th value across ranks
    logits[2 * W + j] = -kInf;                                    // all -inf
    logits[3 * W + j] = j % 5 == 0 ? rng.normal() : kNaN;         // fewer numbers than k: NaN fill by index
    logits[4 * W + j] = j % 2 ? 0.0f : -0.0f;                     // -0 == +0
    logits[5 * W + j] = j < 200 ? -kInf : 2.0f;                   // 57 numbers above a sea of -inf
    logits[6 * W + j] = static_cast<float>((j * 37) % 11) - 5.f;  // many duplicated values
    logits[7 * W + j] = j % 7 == 0 ? kInf : rng.normal();         // +inf ties
  }
  lengths[5] = 250;
  for (int R : {1, 2, 3, 4})
    for (int64_t I : {1, 2, 64}) check_dist_topk(logits, lengths, M, W, k, R, I, "adversarial");
}

TEST(DistTopk, ZeroKeysOnSomeRanksAndBadArguments) {
  // W = 2 keys over 4 ranks: ranks 2 and 3 hold none (W_local = 0).
  const int64_t k = 64, W = 2, M = 3;
  std::vector<float> logits = {0.5f, -1.f, kNaN, 3.f, -kInf, -kInf};
  std::vector<int32_t> lengths = {2, 2, 1};
  check_dist_topk(logits, lengths, M, W, k, 4, 1, "tiny");
  auto g = group(1);
  std::vector<float> l(64);
  std::vector<int32_t> len(1, 65), idx(64);
  dist::DistTopkParams p;
  p.logits = t_f32(l.data(), {1, 64});
  p.lengths = t_i32(len.data(), {1});
  p.k = 64;
  p.indices = t_i32(idx.data(), {1, 64});
  std::vector<uint8_t> ws(dist::dist_topk_workspace_size(p, 1));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  EXPECT_TRUE(dsa_test::fails_naming(dist::dist_topk(p, *g[0]), {"lengths[0]"}));
  len[0] = 3;
  p.workspace_bytes = ws.size() / 2;
  EXPECT_EQ(dist::dist_topk(p, *g[0]).code(), StatusCode::kWorkspaceTooSmall);
  p.k = 60;
  EXPECT_TRUE(dsa_test::fails_naming(dist::dist_topk(p, *g[0]), {"k"}));
}

TEST(DistTopk, Bf16LogitsEqualSingleRankTopk) {
  // bf16 scores rank as their exact f32 values: candidates are widened, never rounded again.
  dsa_test::Rng rng(23);
  const int64_t M = 4, W = 500, k = 128;
  std::vector<float> f(static_cast<size_t>(M * W));
  for (auto& x : f) x = std::round(rng.normal() * 8.f) / 8.f;  // many exact ties
  std::vector<uint16_t> h = dsa_test::to_bf16(f);
  std::vector<int32_t> lengths = {500, 129, 128, 300};
  std::vector<int32_t> ref_idx(static_cast<size_t>(M * k));
  std::vector<float> ref_val(static_cast<size_t>(M * k));
  TopkParams tp;
  tp.logits = dsa_test::t_bf16(h.data(), {M, W});
  tp.lengths = t_i32(lengths.data(), {M});
  tp.k = k;
  tp.indices = t_i32(ref_idx.data(), {M, k});
  tp.values = t_f32(ref_val.data(), {M, k});
  std::vector<uint8_t> tws(topk_workspace_size(tp) + 1);
  tp.workspace = tws.data();
  tp.workspace_bytes = tws.size();
  DSA_ASSERT_OK(topk(tp));
  for (int R : {2, 3}) {
    auto g = group(R);
    std::vector<std::vector<int32_t>> idx(R);
    std::vector<std::vector<float>> val(R);
    std::vector<Status> st(R);
    run_ranks(R, [&](int r) {
      const int64_t Wl = (W - r + R - 1) / R;
      std::vector<uint16_t> ll(static_cast<size_t>(M * Wl));
      std::vector<int32_t> len(static_cast<size_t>(M));
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t l = 0; l < Wl; ++l) ll[i * Wl + l] = h[i * W + l * R + r];
        len[i] = static_cast<int32_t>((lengths[i] - r + R - 1) / R);
      }
      idx[r].assign(static_cast<size_t>(M * k), -7);
      val[r].assign(static_cast<size_t>(M * k), -7.f);
      dist::DistTopkParams p;
      p.logits = dsa_test::t_bf16(ll.data(), {M, Wl});
      p.lengths = t_i32(len.data(), {M});
      p.k = k;
      p.indices = t_i32(idx[r].data(), {M, k});
      p.values = t_f32(val[r].data(), {M, k});
      Guarded ws(dist::dist_topk_workspace_size(p, R), 0x5A);
      p.workspace = ws.data();
      p.workspace_bytes = ws.size();
      st[r] = dist::dist_topk(p, *g[r]);
      if (st[r].ok() && !ws.intact()) st[r] = Status(StatusCode::kInternal, "workspace guard");
    });
    for (int r = 0; r < R; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].to_string();
      EXPECT_EQ(idx[r], ref_idx) << "R=" << R << " rank " << r;
      EXPECT_EQ(0, std::memcmp(val[r].data(), ref_val.data(), ref_val.size() * 4)) << "R=" << R;
    }
  }
}

// ---- partial attention and the lse merge (DCP decode) -------------------------------------

struct DcpCase {
  int64_t T = 6, H = 4, S = 300, K = 64;
  std::vector<float> q, kv, sink;
  std::vector<int32_t> idx;  // [T, K] global positions
};

DcpCase make_dcp_case(uint64_t seed) {
  DcpCase c;
  dsa_test::Rng rng(seed);
  c.q = dsa_test::random_floats(rng, static_cast<size_t>(c.T * c.H * 576), 0.5f);
  c.kv = dsa_test::random_floats(rng, static_cast<size_t>(c.S * 576));
  c.sink = {0.3f, -2.f, 1.5f, 0.f};
  c.idx.assign(static_cast<size_t>(c.T * c.K), -1);
  for (int64_t t = 0; t < c.T; ++t) {
    // rows: 0 no valid index; 1 keys of one rank only (position multiples of 4); others random
    std::vector<int32_t> pos(static_cast<size_t>(c.S));
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng.gen);
    int64_t n = t == 0 ? 0 : (t == 2 ? 5 : c.K);
    std::vector<int32_t> sel;
    for (int32_t p : pos) {
      if (static_cast<int64_t>(sel.size()) >= n) break;
      if (t == 1 && p % 4 != 0) continue;
      sel.push_back(p);
    }
    std::sort(sel.begin(), sel.end());
    for (size_t j = 0; j < sel.size(); ++j) c.idx[t * c.K + j] = sel[j];
  }
  return c;
}

// Single-rank sparse attention over all S keys.
void sparse_reference(DcpCase& c, bool sink, std::vector<float>* out, std::vector<float>* lse) {
  out->assign(static_cast<size_t>(c.T * c.H * 512), kNaN);
  lse->assign(static_cast<size_t>(c.T * c.H), kNaN);
  SparseMlaParams p;
  p.q = t_f32(c.q.data(), {c.T, c.H, 576});
  p.kv.flat = t_f32(c.kv.data(), {c.S, 576});
  p.indices = t_i32(c.idx.data(), {c.T, c.K});
  if (sink) p.attn_sink = t_f32(c.sink.data(), {c.H});
  p.sm_scale = 0.0625f;
  p.out = t_f32(out->data(), {c.T, c.H, 512});
  p.lse = t_f32(lse->data(), {c.T, c.H});
  ASSERT_TRUE(sparse_mla(p).ok());
}

TEST(DistLseMerge, DcpDecodeEqualsSingleRankUpToMergeRounding) {
  DcpCase c = make_dcp_case(5);
  for (bool sink : {false, true}) {
    std::vector<float> ref_out, ref_lse;
    sparse_reference(c, sink, &ref_out, &ref_lse);
    for (int R : {1, 2, 3, 4}) {
      for (int64_t I : {1, 4}) {
        auto g = group(R);
        std::vector<std::vector<float>> out(R), lse(R), part(R);
        std::vector<Status> st(R);
        run_ranks(R, [&](int r) {
          // The rank's flat KV (its keys in local order) and its local indices.
          std::vector<float> kvl;
          for (int64_t gp = 0; gp < c.S; ++gp)
            if ((gp / I) % R == r) kvl.insert(kvl.end(), c.kv.begin() + gp * 576, c.kv.begin() + (gp + 1) * 576);
          const int64_t Sl = static_cast<int64_t>(kvl.size() / 576);
          if (Sl == 0) kvl.assign(576, kNaN);
          std::vector<int32_t> li(c.idx.size());
          dist::DcpLocalIndicesParams lp;
          lp.indices = t_i32(c.idx.data(), {c.T, c.K});
          lp.interleave = I;
          lp.out = t_i32(li.data(), {c.T, c.K});
          st[r] = dist::dcp_local_indices(lp, R, r);
          if (!st[r].ok()) return;
          part[r].assign(static_cast<size_t>(c.T * c.H * 512), kNaN);
          std::vector<float> plse(static_cast<size_t>(c.T * c.H), kNaN);
          SparseMlaParams p;
          p.q = t_f32(c.q.data(), {c.T, c.H, 576});
          p.kv.flat = t_f32(kvl.data(), {std::max<int64_t>(Sl, 1), 576});
          p.indices = t_i32(li.data(), {c.T, c.K});
          p.sm_scale = 0.0625f;
          p.out = t_f32(part[r].data(), {c.T, c.H, 512});
          p.lse = t_f32(plse.data(), {c.T, c.H});
          st[r] = sparse_mla(p);
          if (!st[r].ok()) return;
          out[r].assign(part[r].size(), kNaN);
          lse[r].assign(plse.size(), kNaN);
          dist::LseMergeParams m;
          m.out_partial = p.out;
          m.lse_partial = p.lse;
          if (sink) m.attn_sink = t_f32(c.sink.data(), {c.H});
          m.out = t_f32(out[r].data(), {c.T, c.H, 512});
          m.lse = t_f32(lse[r].data(), {c.T, c.H});
          Guarded ws(dist::lse_merge_workspace_size(m, R), 0x7F);
          m.workspace = ws.data();
          m.workspace_bytes = ws.size();
          st[r] = dist::lse_merge(m, *g[r]);
          if (st[r].ok() && !ws.intact()) st[r] = Status(StatusCode::kInternal, "workspace guard");
        });
        for (int r = 0; r < R; ++r) {
          ASSERT_TRUE(st[r].ok()) << st[r].to_string();
          // Every rank holds the same merged result.
          EXPECT_EQ(0, std::memcmp(out[r].data(), out[0].data(), out[0].size() * 4));
          EXPECT_EQ(0, std::memcmp(lse[r].data(), lse[0].data(), lse[0].size() * 4));
        }
        for (int64_t th = 0; th < c.T * c.H; ++th) {
          const float rl = ref_lse[th], gl = lse[0][th];
          if (std::isinf(rl)) {
            ASSERT_EQ(gl, kInf) << "row without keys: lse +inf";
            for (int d = 0; d < 512; ++d) ASSERT_EQ(out[0][th * 512 + d], 0.f);
            continue;
          }
          // lse: a few f32 steps (the merge's exp/log); R = 1 is exact.
          const double lsteps = dsa_test::f32_steps(gl, rl);
          if (R == 1) EXPECT_EQ(lsteps, 0.0);
          EXPECT_LE(lsteps, 8.0) << "R=" << R << " row " << th;
          double amax = 0;
          for (int d = 0; d < 512; ++d) amax = std::max(amax, std::fabs(double(ref_out[th * 512 + d])));
          for (int d = 0; d < 512; ++d) {
            const double got = out[0][th * 512 + d], ref = ref_out[th * 512 + d];
            // 64 f32 steps at the row's magnitude: the weights' rounding is relative to the row.
            ASSERT_LE(std::fabs(got - ref), 64 * std::ldexp(1.0, std::ilogb(amax) - 23))
                << "R=" << R << " I=" << I << " sink=" << sink << " row " << th << " d " << d;
          }
          if (R == 1 && !sink)
            for (int d = 0; d < 512; ++d) ASSERT_EQ(out[0][th * 512 + d], part[0][th * 512 + d]);
        }
      }
    }
  }
}

// ---- context-parallel prefill ----------------------------------------------------------------

constexpr int64_t kH = 4, kHi = 2;

ModelGeometry tiny_geometry() {
  ModelGeometry g;
  g.name = "tiny";
  g.num_heads = kH;
  g.qk_nope_head_dim = 128;
  g.v_head_dim = 128;
  g.q_lora_rank = 64;
  g.index_heads = kHi;
  g.topk = 64;
  g.index_rope = RopeStyle::kInterleaved;
  g.num_layers = 3;
  g.num_mtp_layers = 1;
  g.max_positions = 4096;
  g.sm_scale = 0.0625;
  return g;
}

struct Batch {
  ModelGeometry g = tiny_geometry();
  int64_t page = 64;
  std::vector<int32_t> q_lens, kv_lens, block_table, row_pos;
  int64_t B = 0, T = 0, max_blocks = 0, num_blocks = 0, max_kv = 0;
  std::vector<uint8_t> mla, idx;  // caches with the prefixes written, unused slots NaN (0xFF)
  std::vector<float> cos_sin, kv_c, k_pe, q, iq, ik, iw;
};

Batch make_batch(std::vector<std::pair<int32_t, int32_t>> seqs, uint64_t seed) {
  Batch w;
  dsa_test::Rng rng(seed);
  w.B = static_cast<int64_t>(seqs.size());
  int64_t pages = 0;
  for (auto [q, kv] : seqs) {
    w.q_lens.push_back(q);
    w.kv_lens.push_back(kv);
    w.T += q;
    w.max_kv = std::max<int64_t>(w.max_kv, kv);
    w.max_blocks = std::max<int64_t>(w.max_blocks, (kv + w.page - 1) / w.page);
    pages += (kv + w.page - 1) / w.page;
  }
  w.num_blocks = pages + 2;
  std::vector<int32_t> perm(static_cast<size_t>(w.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng.gen);
  w.block_table.assign(static_cast<size_t>(w.B * w.max_blocks), -1);
  int64_t next = 0;
  for (int64_t b = 0; b < w.B; ++b)
    for (int64_t j = 0; j < (w.kv_lens[b] + w.page - 1) / w.page; ++j) w.block_table[b * w.max_blocks + j] = perm[next++];
  for (int64_t b = 0; b < w.B; ++b)
    for (int32_t i = 0; i < w.q_lens[b]; ++i) w.row_pos.push_back(w.kv_lens[b] - w.q_lens[b] + i);
  w.cos_sin.resize(static_cast<size_t>(w.g.max_positions) * 64);
  for (int64_t p = 0; p < w.g.max_positions; ++p)
    for (int i = 0; i < 32; ++i) {
      const double a = p * std::pow(10000.0, -i / 32.0);
      w.cos_sin[p * 64 + i] = static_cast<float>(std::cos(a));
      w.cos_sin[p * 64 + 32 + i] = static_cast<float>(std::sin(a));
    }
  w.mla.assign(static_cast<size_t>(w.num_blocks * w.page * kMlaBf16TokenBytes), 0xFF);
  w.idx.assign(static_cast<size_t>(w.num_blocks * w.page * kIndexerTokenBytes), 0xFF);
  // Prefixes.
  std::vector<int64_t> slots;
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < w.B; ++b)
    for (int32_t j = 0; j < w.kv_lens[b] - w.q_lens[b]; ++j) {
      slots.push_back(int64_t{w.block_table[b * w.max_blocks + j / w.page]} * w.page + j % w.page);
      pos.push_back(j);
    }
  const int64_t P = static_cast<int64_t>(slots.size());
  if (P > 0) {
    auto c = dsa_test::random_floats(rng, static_cast<size_t>(P * 512));
    auto pe = dsa_test::random_floats(rng, static_cast<size_t>(P * 64));
    auto k = dsa_test::random_floats(rng, static_cast<size_t>(P * 128));
    MlaCacheDesc mc;
    mc.data = w.mla.data();
    mc.num_blocks = w.num_blocks;
    mc.page_size = w.page;
    WriteMlaCacheParams wm;
    wm.kv_c = t_f32(c.data(), {P, 512});
    wm.k_pe = t_f32(pe.data(), {P, 64});
    wm.where.slots = t_i64(slots.data(), {P});
    wm.cache = mc;
    EXPECT_TRUE(write_mla_cache(wm).ok());
    std::vector<uint8_t> k8(static_cast<size_t>(P * 128));
    std::vector<float> ks(static_cast<size_t>(P));
    PrepareIndexerKParams pk;
    pk.k = t_f32(k.data(), {P, 128});
    pk.positions = t_i32(pos.data(), {P});
    pk.cos_sin = t_f32(w.cos_sin.data(), {w.g.max_positions, 64});
    pk.rope = w.g.index_rope;
    pk.k_out = dsa_test::t_e4m3(k8.data(), {P, 128});
    pk.k_scale = t_f32(ks.data(), {P});
    EXPECT_TRUE(prepare_indexer_k(pk).ok());
    IndexerCacheDesc ic;
    ic.data = w.idx.data();
    ic.num_blocks = w.num_blocks;
    ic.page_size = w.page;
    WriteIndexerCacheParams wi;
    wi.k = pk.k_out;
    wi.k_scale = pk.k_scale;
    wi.where.slots = t_i64(slots.data(), {P});
    wi.cache = ic;
    EXPECT_TRUE(write_indexer_cache(wi).ok());
  }
  w.kv_c = dsa_test::random_floats(rng, static_cast<size_t>(w.T * 512));
  w.k_pe = dsa_test::random_floats(rng, static_cast<size_t>(w.T * 64));
  w.q = dsa_test::random_floats(rng, static_cast<size_t>(w.T * kH * 576), 0.5f);
  w.iq = dsa_test::random_floats(rng, static_cast<size_t>(w.T * kHi * 128));
  w.ik = dsa_test::random_floats(rng, static_cast<size_t>(w.T * 128));
  w.iw = dsa_test::random_floats(rng, static_cast<size_t>(w.T * kHi));
  return w;
}

PlannerConfig batch_config(const Batch& w) {
  PlannerConfig c;
  c.geometry = w.g;
  c.page_size = w.page;
  c.max_tokens_per_step = std::max<int64_t>(w.T, 1);
  c.max_seqs_per_step = std::max<int64_t>(w.B, 1);
  c.max_context = std::max<int64_t>(w.max_kv, 1);
  return c;
}

// The step's outputs for rows `rows` of the batch (global token indices), with caches.
struct StepOut {
  Status status;
  std::vector<float> out, lse;
  std::vector<int32_t> indices;
  std::vector<uint8_t> mla, idx;
};

// Gathers rows of a [T, width] f32 tensor.
template <typename T>
std::vector<T> pick_rows(const std::vector<T>& x, int64_t width, const std::vector<int64_t>& rows) {
  std::vector<T> y;
  y.reserve(rows.size() * width);
  for (int64_t r : rows) y.insert(y.end(), x.begin() + r * width, x.begin() + (r + 1) * width);
  if (y.empty()) y.assign(static_cast<size_t>(width), T{});
  return y;
}

// One layer step (role) on `rows` of the batch with caches mla/idx: single rank when comm is
// null (rows = all), else the CP step of comm's rank. indices_in: [rows, topk] (shared).
StepOut run_layer(Batch& w, IndexerRole role, const std::vector<int64_t>& rows, std::vector<uint8_t> mla,
                  std::vector<uint8_t> idx, const std::vector<int32_t>* indices_in, dist::Communicator* comm) {
  StepOut r;
  const int64_t Tl = static_cast<int64_t>(rows.size()), K = w.g.topk;
  const int R = comm ? comm->size() : 1;
  PlannerConfig cfg = batch_config(w);
  if (comm) cfg = dist::cp_rank_config(cfg, R);
  Plan plan;
  r.status = make_plan(cfg, &plan);
  if (!r.status.ok()) return r;
  Attention attn(plan);
  auto kv_c = pick_rows(w.kv_c, 512, rows), k_pe = pick_rows(w.k_pe, 64, rows), q = pick_rows(w.q, kH * 576, rows);
  auto iq = pick_rows(w.iq, kHi * 128, rows), ik = pick_rows(w.ik, 128, rows), iw = pick_rows(w.iw, kHi, rows);
  std::vector<int32_t> in_copy;
  r.out.assign(static_cast<size_t>(std::max<int64_t>(Tl, 1) * kH * 512), kNaN);
  r.lse.assign(static_cast<size_t>(std::max<int64_t>(Tl, 1) * kH), kNaN);
  r.indices.assign(static_cast<size_t>(std::max<int64_t>(Tl, 1) * K), -7);
  StepParams p;
  p.role = role;
  p.q_lens = t_i32(w.q_lens.data(), {w.B});
  p.kv_lens = t_i32(w.kv_lens.data(), {w.B});
  p.block_table = t_i32(w.block_table.data(), {w.B, w.max_blocks});
  p.kv_c = t_f32(kv_c.data(), {Tl, 512});
  p.k_pe = t_f32(k_pe.data(), {Tl, 64});
  p.q = t_f32(q.data(), {Tl, kH, 576});
  p.index_q = t_f32(iq.data(), {Tl, kHi, 128});
  p.index_k = t_f32(ik.data(), {Tl, 128});
  p.index_w = t_f32(iw.data(), {Tl, kHi});
  p.cos_sin = t_f32(w.cos_sin.data(), {w.g.max_positions, 64});
  p.mla_cache.data = mla.data();
  p.mla_cache.num_blocks = w.num_blocks;
  p.mla_cache.page_size = w.page;
  if (role != IndexerRole::kShared) {
    p.index_cache.data = idx.data();
    p.index_cache.num_blocks = w.num_blocks;
    p.index_cache.page_size = w.page;
    p.indices_out = t_i32(r.indices.data(), {Tl, K});
  }
  if (indices_in) {
    in_copy = *indices_in;
    if (in_copy.empty()) in_copy.assign(static_cast<size_t>(K), -1);
    p.indices_in = t_i32(in_copy.data(), {Tl, K});
  }
  p.out = t_f32(r.out.data(), {Tl, kH, 512});
  p.lse = t_f32(r.lse.data(), {Tl, kH});
  Guarded ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  if (!comm) {
    r.status = attn.step(p);
  } else {
    dist::ContextParallel cp(plan, comm);
    Guarded cws(static_cast<size_t>(dist::cp_workspace_size(plan, R)), 0x7F);
    dist::CpStepParams c;
    c.step = p;
    c.q_lens = p.q_lens;
    c.kv_lens = p.kv_lens;
    c.cp_workspace = cws.data();
    c.cp_workspace_bytes = cws.size();
    r.status = cp.step(attn, c);
    if (r.status.ok() && !cws.intact()) r.status = Status(StatusCode::kInternal, "cp workspace guard");
  }
  if (r.status.ok() && !ws.intact()) r.status = Status(StatusCode::kInternal, "workspace guard");
  r.mla = std::move(mla);
  r.idx = std::move(idx);
  return r;
}

// The global token indices of a rank's local rows.
std::vector<int64_t> local_rows(const Batch& w, int R, int rank) {
  std::vector<dist::CpPiece> pc;
  EXPECT_TRUE(dist::cp_shard(w.q_lens.data(), w.kv_lens.data(), w.B, w.g.topk, R, rank, &pc).ok());
  std::vector<int64_t> start(static_cast<size_t>(w.B), 0);
  for (int64_t b = 1; b < w.B; ++b) start[b] = start[b - 1] + w.q_lens[b - 1];
  std::vector<int64_t> rows;
  for (const auto& p : pc)
    for (int32_t i = 0; i < p.q_len; ++i) rows.push_back(start[p.seq] + p.q_begin + i);
  return rows;
}

void check_cp(std::vector<std::pair<int32_t, int32_t>> seqs, uint64_t seed) {
  Batch w = make_batch(seqs, seed);
  std::vector<int64_t> all(static_cast<size_t>(w.T));
  std::iota(all.begin(), all.end(), 0);
  const int64_t K = w.g.topk;
  // Single rank: a full layer, then a shared layer reusing its indices, then an MTP layer.
  StepOut ref_full = run_layer(w, IndexerRole::kFull, all, w.mla, w.idx, nullptr, nullptr);
  ASSERT_TRUE(ref_full.status.ok()) << ref_full.status.to_string();
  StepOut ref_shared = run_layer(w, IndexerRole::kShared, all, w.mla, w.idx, &ref_full.indices, nullptr);
  ASSERT_TRUE(ref_shared.status.ok()) << ref_shared.status.to_string();
  StepOut ref_mtp = run_layer(w, IndexerRole::kMtp, all, w.mla, w.idx, nullptr, nullptr);
  ASSERT_TRUE(ref_mtp.status.ok()) << ref_mtp.status.to_string();
  for (int R : {1, 2, 3, 4}) {
    auto g = group(R);
    std::vector<std::vector<int64_t>> rows(R);
    std::vector<StepOut> full(R), shared(R), mtp(R);
    for (int r = 0; r < R; ++r) rows[r] = local_rows(w, R, r);
    run_ranks(R, [&](int r) {
      full[r] = run_layer(w, IndexerRole::kFull, rows[r], w.mla, w.idx, nullptr, g[r].get());
      if (!full[r].status.ok()) return;
      std::vector<int32_t> in = full[r].indices;
      in.resize(rows[r].size() * K);
      shared[r] = run_layer(w, IndexerRole::kShared, rows[r], w.mla, w.idx, &in, g[r].get());
      mtp[r] = run_layer(w, IndexerRole::kMtp, rows[r], w.mla, w.idx, nullptr, g[r].get());
    });
    for (int r = 0; r < R; ++r) {
      for (const StepOut* s : {&full[r], &shared[r], &mtp[r]}) ASSERT_TRUE(s->status.ok()) << s->status.to_string();
      // Every rank's caches hold every token, byte for byte the single-rank caches.
      EXPECT_TRUE(full[r].mla == ref_full.mla) << "R=" << R << " rank " << r << " MLA cache";
      EXPECT_TRUE(full[r].idx == ref_full.idx) << "R=" << R << " rank " << r << " indexer cache";
      EXPECT_TRUE(shared[r].mla == ref_shared.mla) << "R=" << R << " rank " << r << " shared MLA cache";
      EXPECT_TRUE(mtp[r].idx == ref_mtp.idx) << "R=" << R << " rank " << r << " MTP indexer cache";
      const std::pair<const StepOut*, const StepOut*> layers[] = {
          {&full[r], &ref_full}, {&shared[r], &ref_shared}, {&mtp[r], &ref_mtp}};
      for (auto [got, ref] : layers) {
        for (size_t j = 0; j < rows[r].size(); ++j) {
          const int64_t t = rows[r][j];
          ASSERT_EQ(0, std::memcmp(got->out.data() + j * kH * 512, ref->out.data() + t * kH * 512, kH * 512 * 4))
              << "R=" << R << " rank " << r << " token " << t << ": out differs from the single-rank step";
          ASSERT_EQ(0, std::memcmp(got->lse.data() + j * kH, ref->lse.data() + t * kH, kH * 4))
              << "R=" << R << " rank " << r << " token " << t;
          if (got != &shared[r])
            ASSERT_EQ(0, std::memcmp(got->indices.data() + j * K, ref->indices.data() + t * K, K * 4))
                << "R=" << R << " rank " << r << " token " << t << ": indices";
        }
      }
    }
  }
}

TEST(DistCpPrefill, LongPromptsEqualSingleRankStep) {
  // Fresh prompts past topk, one with a cached prefix, one short (dense) sequence.
  check_cp({{300, 300}, {150, 400}, {40, 40}}, 11);
}

TEST(DistCpPrefill, UnevenShardsAndRanksWithoutRows) {
  // 3 and 1 new tokens: with 4 ranks most ranks serve nothing, yet join the gather.
  check_cp({{3, 200}, {1, 1}}, 12);
  check_cp({{70, 70}}, 13);  // kv just past topk: leading chunks join the first one past it
}

TEST(DistCpPrefill, WorkspaceAndLimits) {
  Batch w = make_batch({{100, 100}}, 3);
  Plan plan;
  DSA_ASSERT_OK(make_plan(dist::cp_rank_config(batch_config(w), 2), &plan));
  EXPECT_EQ(plan.config.max_seqs_per_step, 2);
  auto g = group(1);
  Attention attn(plan);
  dist::ContextParallel cp(plan, g[0].get());
  std::vector<int64_t> all(100);
  std::iota(all.begin(), all.end(), 0);
  dist::CpStepParams c;
  c.q_lens = t_i32(w.q_lens.data(), {1});
  c.kv_lens = t_i32(w.kv_lens.data(), {1});
  c.step.block_table = t_i32(w.block_table.data(), {1, w.max_blocks});
  c.step.kv_c = t_f32(w.kv_c.data(), {100, 512});
  c.step.k_pe = t_f32(w.k_pe.data(), {100, 64});
  c.step.index_k = t_f32(w.ik.data(), {100, 128});
  std::vector<uint8_t> small(64);
  c.cp_workspace = small.data();
  c.cp_workspace_bytes = small.size();
  EXPECT_EQ(cp.step(attn, c).code(), StatusCode::kWorkspaceTooSmall);
  c.step.kv_c = t_f32(w.kv_c.data(), {99, 512});
  EXPECT_TRUE(dsa_test::fails_naming(cp.step(attn, c), {"step.kv_c", "T_local"}));
}

}  // namespace
