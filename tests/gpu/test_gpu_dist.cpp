// Distributed ops on one GPU: R simulated ranks (threads, one stream each) joined by the
// in-process group over CUDA memory. dist_topk must equal topk() of the unsharded rows bit for
// bit; the CUDA lse merge must match the CPU merge. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "dist_cases.h"
#include "gpu_util.h"
#include "step_batch.h"

#include "dsa/dsa.h"

using namespace dsa;
using dsa_gpu_test::DeviceBuffer;
using dsa_gpu_test::dev_tensor;

namespace {

void run_ranks(int R, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

// topk() of full rows on the device.
void device_topk(const std::vector<float>& logits, const std::vector<int32_t>& lengths, int64_t M, int64_t W,
                 int64_t k, std::vector<int32_t>* idx, std::vector<float>* val) {
  DeviceBuffer dl(logits), dn(lengths), di(static_cast<size_t>(M * k) * 4, 0xEE), dv(static_cast<size_t>(M * k) * 4, 0xEE);
  TopkParams p;
  p.logits = dev_tensor(dl, DType::kF32, {M, W});
  p.lengths = dev_tensor(dn, DType::kI32, {M});
  p.k = k;
  p.indices = dev_tensor(di, DType::kI32, {M, k});
  p.values = dev_tensor(dv, DType::kF32, {M, k});
  DeviceBuffer ws(std::max<size_t>(topk_workspace_size(p), 1));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  ASSERT_TRUE(topk(p).ok());
  *idx = di.download<int32_t>();
  *val = dv.download<float>();
}

TEST(GpuDist, TopkEqualsSingleRankTopk) {
  DSA_REQUIRE_GPU();
  for (auto [W, k] : {std::pair<int64_t, int64_t>{300, 64}, {5000, 2048}, {70000, 2048}}) {
    std::vector<float> logits;
    std::vector<int32_t> lengths;
    int64_t M = 0;
    dsa_dist_case::topk_rows(W, &logits, &lengths, &M);
    std::vector<int32_t> ref_idx;
    std::vector<float> ref_val;
    device_topk(logits, lengths, M, W, k, &ref_idx, &ref_val);
    for (int R : {1, 2, 3, 4}) {
      for (int64_t I : {int64_t{1}, int64_t{64}}) {
        std::vector<std::unique_ptr<dist::Communicator>> g;
        ASSERT_TRUE(dist::make_local_group(R, cuda_device(0), &g).ok());
        std::vector<std::vector<int32_t>> idx(R);
        std::vector<std::vector<float>> val(R);
        std::vector<Status> st(R);
        run_ranks(R, [&](int r) {
          std::vector<float> ll;
          std::vector<int32_t> len;
          const int64_t Wl = dsa_dist_case::shard(logits, lengths, M, W, R, r, I, &ll, &len);
          cudaStream_t s;
          cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          DeviceBuffer dl(ll), dn(len), di(static_cast<size_t>(M * k) * 4, 0xEE), dv(static_cast<size_t>(M * k) * 4, 0xEE);
          dist::DistTopkParams p;
          p.logits = dev_tensor(dl, DType::kF32, {M, Wl});
          p.lengths = dev_tensor(dn, DType::kI32, {M});
          p.k = k;
          p.interleave = I;
          p.indices = dev_tensor(di, DType::kI32, {M, k});
          p.values = dev_tensor(dv, DType::kF32, {M, k});
          p.stream = s;
          DeviceBuffer ws(dist::dist_topk_workspace_size(p, R), 0x7F);
          p.workspace = ws.data();
          p.workspace_bytes = ws.size();
          cudaDeviceSynchronize();  // the uploads (legacy stream) before work on the non-blocking one
          st[r] = dist::dist_topk(p, *g[r]);
          cudaStreamSynchronize(s);
          idx[r] = di.download<int32_t>();
          val[r] = dv.download<float>();
          cudaStreamDestroy(s);
        });
        ASSERT_TRUE(dsa_gpu_test::device_clean());
        for (int r = 0; r < R; ++r) {
          ASSERT_TRUE(st[r].ok()) << st[r].to_string();
          ASSERT_TRUE(dsa_gpu_test::same_bits(idx[r], ref_idx, "indices")) << "W=" << W << " R=" << R << " I=" << I;
          ASSERT_TRUE(dsa_gpu_test::same_bits(val[r], ref_val, "values")) << "W=" << W << " R=" << R << " I=" << I;
        }
      }
    }
  }
}

// Partials of R ranks: rows with keys on every rank, on some, on none (lse +inf, out 0).
void partials(int R, int64_t T, int64_t H, std::vector<std::vector<float>>* out, std::vector<std::vector<float>>* lse) {
  std::mt19937_64 gen(99);
  std::normal_distribution<float> nd;
  out->assign(R, {});
  lse->assign(R, {});
  for (int r = 0; r < R; ++r) {
    (*out)[r].resize(static_cast<size_t>(T * H * 512));
    (*lse)[r].resize(static_cast<size_t>(T * H));
    for (int64_t th = 0; th < T * H; ++th) {
      const int64_t t = th / H;
      const bool none = t == 0 || (t == 1 && r != R - 1) || (t == 2 && r % 2 == 1);
      (*lse)[r][th] = none ? std::numeric_limits<float>::infinity() : 3.f * nd(gen) + (t == 3 ? 80.f * r : 0.f);
      for (int d = 0; d < 512; ++d) (*out)[r][th * 512 + d] = none ? 0.f : nd(gen);
    }
  }
}

TEST(GpuDist, LseMergeMatchesCpu) {
  DSA_REQUIRE_GPU();
  const int64_t T = 7, H = 5;
  std::vector<float> sink = {0.f, 1.f, -3.f, 20.f, -20.f};
  for (int R : {1, 2, 3, 4}) {
    for (bool use_sink : {false, true}) {
      std::vector<std::vector<float>> out, lse;
      partials(R, T, H, &out, &lse);
      std::vector<std::vector<float>> cpu_out(R), cpu_lse(R), gpu_out(R), gpu_lse(R);
      std::vector<Status> st(R), st2(R);
      for (bool gpu : {false, true}) {
        std::vector<std::unique_ptr<dist::Communicator>> g;
        ASSERT_TRUE(dist::make_local_group(R, gpu ? cuda_device(0) : cpu_device(), &g).ok());
        run_ranks(R, [&](int r) {
          std::vector<float> o(static_cast<size_t>(T * H * 512), -1.f), l(static_cast<size_t>(T * H), -1.f);
          dist::LseMergeParams m;
          if (!gpu) {
            m.out_partial = make_tensor(out[r].data(), DType::kF32, {T, H, 512});
            m.lse_partial = make_tensor(lse[r].data(), DType::kF32, {T, H});
            if (use_sink) m.attn_sink = make_tensor(sink.data(), DType::kF32, {H});
            m.out = make_tensor(o.data(), DType::kF32, {T, H, 512});
            m.lse = make_tensor(l.data(), DType::kF32, {T, H});
            std::vector<uint8_t> ws(dist::lse_merge_workspace_size(m, R));
            m.workspace = ws.data();
            m.workspace_bytes = ws.size();
            st[r] = dist::lse_merge(m, *g[r]);
            cpu_out[r] = o;
            cpu_lse[r] = l;
            return;
          }
          cudaStream_t s;
          cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          DeviceBuffer dpo(out[r]), dpl(lse[r]), dsk(sink), dout(o), dlse(l);
          m.out_partial = dev_tensor(dpo, DType::kF32, {T, H, 512});
          m.lse_partial = dev_tensor(dpl, DType::kF32, {T, H});
          if (use_sink) m.attn_sink = dev_tensor(dsk, DType::kF32, {H});
          m.out = dev_tensor(dout, DType::kF32, {T, H, 512});
          m.lse = dev_tensor(dlse, DType::kF32, {T, H});
          m.stream = s;
          DeviceBuffer ws(dist::lse_merge_workspace_size(m, R));
          m.workspace = ws.data();
          m.workspace_bytes = ws.size();
          cudaDeviceSynchronize();
          st2[r] = dist::lse_merge(m, *g[r]);
          cudaStreamSynchronize(s);
          gpu_out[r] = dout.download<float>();
          gpu_lse[r] = dlse.download<float>();
          cudaStreamDestroy(s);
        });
      }
      ASSERT_TRUE(dsa_gpu_test::device_clean());
      for (int r = 0; r < R; ++r) {
        ASSERT_TRUE(st[r].ok() && st2[r].ok()) << st[r].to_string() << " " << st2[r].to_string();
        for (int64_t th = 0; th < T * H; ++th) {
          const float a = cpu_lse[r][th], b = gpu_lse[r][th];
          if (std::isinf(a)) {
            ASSERT_EQ(b, a) << "row " << th;
            for (int d = 0; d < 512; ++d) ASSERT_EQ(gpu_out[r][th * 512 + d], 0.f);
            continue;
          }
          ASSERT_LE(std::fabs(a - b), 4 * std::ldexp(1.0, std::ilogb(std::max(std::fabs(a), 1.f)) - 23)) << th;
          double amax = 0;
          for (int d = 0; d < 512; ++d) amax = std::max(amax, std::fabs(double(cpu_out[r][th * 512 + d])));
          for (int d = 0; d < 512; ++d)
            ASSERT_LE(std::fabs(double(gpu_out[r][th * 512 + d]) - cpu_out[r][th * 512 + d]),
                      8 * std::ldexp(1.0, std::ilogb(amax) - 23))
                << "R=" << R << " row " << th << " d " << d;
        }
      }
    }
  }
}

// ---- CP prefill on one GPU -------------------------------------------------------------------

namespace sb = dsa_gpu_test::step_batch;

struct GpuStepOut {
  Status status;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  std::vector<int32_t> indices;
  std::vector<uint8_t> mla, idx;
};

template <typename T>
std::vector<T> rows_of(const std::vector<T>& x, int64_t width, const std::vector<int64_t>& rows) {
  std::vector<T> y;
  for (int64_t r : rows) y.insert(y.end(), x.begin() + r * width, x.begin() + (r + 1) * width);
  if (y.empty()) y.assign(static_cast<size_t>(width), T{});
  return y;
}

// One layer step on the device: single rank (comm null, rows = all) or this rank's CP step.
GpuStepOut gpu_layer(sb::Batch& b, IndexerRole role, const std::vector<int64_t>& rows,
                     const std::vector<int32_t>* indices_in, dist::Communicator* comm) {
  GpuStepOut r;
  const int64_t Tl = static_cast<int64_t>(rows.size()), K = sb::kK, H = sb::kH, Hi = sb::kHi;
  PlannerConfig cfg;
  cfg.geometry = sb::tiny();
  cfg.page_size = sb::kPage;
  cfg.max_tokens_per_step = std::max<int64_t>(b.T, 1);
  cfg.max_seqs_per_step = std::max<int64_t>(b.B, 1);
  cfg.max_context = std::max<int64_t>(b.max_kv, 1);
  cfg.device = cuda_device(0);
  if (comm) cfg = dist::cp_rank_config(cfg, comm->size());
  Plan plan;
  r.status = make_plan(cfg, &plan);
  if (!r.status.ok()) return r;
  Attention attn(plan);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  DeviceBuffer bt(b.block_table), mla(b.mla), idx(b.idx), cs(b.cos_sin);
  DeviceBuffer kv_c(rows_of(b.kv_c, 512, rows)), k_pe(rows_of(b.k_pe, 64, rows)), q(rows_of(b.q, H * 576, rows));
  DeviceBuffer iq(rows_of(b.iq, Hi * 128, rows)), ik(rows_of(b.ik, 128, rows)), iw(rows_of(b.iw, Hi, rows));
  const int64_t Tn = std::max<int64_t>(Tl, 1);
  DeviceBuffer out(static_cast<size_t>(Tn * H * 512) * 2, 0xFF), lse(static_cast<size_t>(Tn * H) * 4, 0xFF);
  DeviceBuffer ind(static_cast<size_t>(Tn * K) * 4, 0xEE);
  std::vector<int32_t> in_h = indices_in ? *indices_in : std::vector<int32_t>(static_cast<size_t>(Tn * K), -1);
  in_h.resize(static_cast<size_t>(Tn * K), -1);
  DeviceBuffer in_d(in_h);
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes));
  StepParams p;
  p.role = role;
  p.q_lens = make_tensor(b.q_lens.data(), DType::kI32, {b.B});
  p.kv_lens = make_tensor(b.kv_lens.data(), DType::kI32, {b.B});
  p.block_table = dev_tensor(bt, DType::kI32, {b.B, b.max_blocks});
  p.kv_c = dev_tensor(kv_c, DType::kBF16, {Tl, 512});
  p.k_pe = dev_tensor(k_pe, DType::kBF16, {Tl, 64});
  p.q = dev_tensor(q, DType::kBF16, {Tl, H, 576});
  p.index_q = dev_tensor(iq, DType::kF32, {Tl, Hi, 128});
  p.index_k = dev_tensor(ik, DType::kF32, {Tl, 128});
  p.index_w = dev_tensor(iw, DType::kF32, {Tl, Hi});
  p.cos_sin = dev_tensor(cs, DType::kF32, {sb::kMaxPos, 64});
  p.mla_cache.data = mla.data();
  p.mla_cache.num_blocks = b.num_blocks;
  p.mla_cache.page_size = sb::kPage;
  p.mla_cache.device = cuda_device(0);
  if (role != IndexerRole::kShared) {
    p.index_cache.data = idx.data();
    p.index_cache.num_blocks = b.num_blocks;
    p.index_cache.page_size = sb::kPage;
    p.index_cache.device = cuda_device(0);
    p.indices_out = dev_tensor(ind, DType::kI32, {Tl, K});
  } else {
    p.indices_in = dev_tensor(in_d, DType::kI32, {Tl, K});
  }
  p.out = dev_tensor(out, DType::kBF16, {Tl, H, 512});
  p.lse = dev_tensor(lse, DType::kF32, {Tl, H});
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  p.stream = s;
  DeviceBuffer cws;  // allocated (and zeroed on the legacy stream) before the synchronisation below
  if (comm) cws.reset(static_cast<size_t>(dist::cp_workspace_size(plan, comm->size())));
  // Every upload and fill (legacy stream) before work on the non-blocking one: a fill still
  // queued there, behind another rank thread's uploads, would land on this rank's gathered keys.
  cudaDeviceSynchronize();
  if (!comm) {
    r.status = attn.step(p);
  } else {
    dist::ContextParallel cp(plan, comm);
    dist::CpStepParams c;
    c.step = p;
    c.q_lens = p.q_lens;
    c.kv_lens = p.kv_lens;
    c.cp_workspace = cws.data();
    c.cp_workspace_bytes = cws.size();
    r.status = cp.step(attn, c);
    cudaStreamSynchronize(s);
  }
  cudaStreamSynchronize(s);
  r.out = out.download<uint16_t>();
  r.lse = lse.download<float>();
  r.indices = ind.download<int32_t>();
  r.mla = mla.download<uint8_t>();
  r.idx = idx.download<uint8_t>();
  cudaStreamDestroy(s);
  return r;
}

TEST(GpuDist, CpPrefillEqualsSingleRankStep) {
  DSA_REQUIRE_GPU();
  sb::Batch b = sb::make_batch({{300, 300}, {150, 400}, {40, 40}, {3, 90}}, 21);
  std::vector<int64_t> all(static_cast<size_t>(b.T));
  std::iota(all.begin(), all.end(), 0);
  const int64_t K = sb::kK, H = sb::kH;
  GpuStepOut ref = gpu_layer(b, IndexerRole::kFull, all, nullptr, nullptr);
  ASSERT_TRUE(ref.status.ok()) << ref.status.to_string();
  GpuStepOut ref_sh = gpu_layer(b, IndexerRole::kShared, all, &ref.indices, nullptr);
  ASSERT_TRUE(ref_sh.status.ok()) << ref_sh.status.to_string();
  for (int R : {1, 2, 3, 4}) {
    std::vector<std::unique_ptr<dist::Communicator>> g;
    ASSERT_TRUE(dist::make_local_group(R, cuda_device(0), &g).ok());
    std::vector<std::vector<int64_t>> rows(R);
    std::vector<int64_t> start(static_cast<size_t>(b.B), 0);
    for (int64_t s = 1; s < b.B; ++s) start[s] = start[s - 1] + b.q_lens[s - 1];
    for (int r = 0; r < R; ++r) {
      std::vector<dist::CpPiece> pc;
      ASSERT_TRUE(dist::cp_shard(b.q_lens.data(), b.kv_lens.data(), b.B, K, R, r, &pc).ok());
      for (const auto& p : pc)
        for (int32_t i = 0; i < p.q_len; ++i) rows[r].push_back(start[p.seq] + p.q_begin + i);
    }
    std::vector<GpuStepOut> full(R), sh(R);
    run_ranks(R, [&](int r) {
      full[r] = gpu_layer(b, IndexerRole::kFull, rows[r], nullptr, g[r].get());
      if (full[r].status.ok()) sh[r] = gpu_layer(b, IndexerRole::kShared, rows[r], &full[r].indices, g[r].get());
    });
    ASSERT_TRUE(dsa_gpu_test::device_clean());
    for (int r = 0; r < R; ++r) {
      ASSERT_TRUE(full[r].status.ok()) << full[r].status.to_string();
      ASSERT_TRUE(sh[r].status.ok()) << sh[r].status.to_string();
      EXPECT_TRUE(full[r].mla == ref.mla) << "R=" << R << " rank " << r << ": MLA cache differs";
      EXPECT_TRUE(full[r].idx == ref.idx) << "R=" << R << " rank " << r << ": indexer cache differs";
      int64_t differing = 0;
      for (size_t j = 0; j < rows[r].size(); ++j) {
        const int64_t t = rows[r][j];
        ASSERT_EQ(0, std::memcmp(full[r].indices.data() + j * K, ref.indices.data() + t * K, K * 4))
            << "R=" << R << " rank " << r << " token " << t << ": indices";
        for (auto [got, want] : {std::pair<GpuStepOut*, GpuStepOut*>{&full[r], &ref}, {&sh[r], &ref_sh}}) {
          for (int64_t e = 0; e < H * 512; ++e) {
            const float a = dsa::bf16_to_float(got->out[j * H * 512 + e]);
            const float w = dsa::bf16_to_float(want->out[t * H * 512 + e]);
            differing += got->out[j * H * 512 + e] != want->out[t * H * 512 + e];
            // Same rows, same keys: equal up to the kernels' accumulation order (2 bf16 steps).
            ASSERT_LE(dsa_test::bf16_steps(a, w), 2.0) << "R=" << R << " rank " << r << " token " << t;
          }
          for (int64_t h = 0; h < H; ++h)
            ASSERT_LE(dsa_test::f32_steps(got->lse[j * H + h], want->lse[t * H + h]), 8.0)
                << "R=" << R << " rank " << r << " token " << t;
        }
      }
      if (differing) std::printf("GpuDist.CpPrefill R=%d rank %d: %lld bf16 outputs not bit-identical\n", R, r,
                                 static_cast<long long>(differing));
    }
  }
}

}  // namespace
