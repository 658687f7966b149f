// Distributed ops on one GPU: R simulated ranks (threads, one stream each) joined by the
// in-process group over CUDA memory. dist_topk must equal topk() of the unsharded rows bit for
// bit; the CUDA lse merge must match the CPU merge. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "dist_cases.h"
#include "gpu_util.h"

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

}  // namespace
