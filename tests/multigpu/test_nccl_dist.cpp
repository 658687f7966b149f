// The NCCL communicator across real GPUs of one host: one thread per GPU, communicators from
// ncclCommInitAll. dist_topk equals topk() of the unsharded rows bit for bit on every rank;
// lse_merge equals the CPU merge of the same partials. Runs only with >= 2 GPUs (skips
// otherwise). NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is set before any communicator.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <thread>

#include "../gpu/dist_cases.h"
#include "dsa/dsa.h"

using namespace dsa;

namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

struct Group {
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<dist::Communicator>> dsa;
  explicit Group(int R) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
    std::vector<int> devs(R);
    for (int r = 0; r < R; ++r) devs[r] = r;
    comms.resize(R);
    EXPECT_EQ(ncclCommInitAll(comms.data(), R, devs.data()), ncclSuccess);
    for (int r = 0; r < R; ++r) {
      std::unique_ptr<dist::Communicator> c;
      Status s = dist::make_nccl_communicator(comms[r], r, &c);
      EXPECT_TRUE(s.ok()) << s.to_string();
      dsa.push_back(std::move(c));
    }
  }
  ~Group() {
    for (auto c : comms) ncclCommDestroy(c);
  }
};

void run_ranks(int R, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < R; ++r) th.emplace_back([&, r] {
    cudaSetDevice(r);
    fn(r);
  });
  for (auto& t : th) t.join();
}

template <typename T>
T* upload(const std::vector<T>& h) {
  void* p = nullptr;
  cudaMalloc(&p, std::max<size_t>(h.size() * sizeof(T), 1));
  cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> h(n);
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

TEST(NcclDist, TopkEqualsSingleGpuTopk) {
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs >= 2 GPUs, found " << n;
  ASSERT_TRUE(dist::nccl_available());
  for (int R = 2; R <= n; R *= 2) {
    Group g(R);
    for (auto [W, k] : {std::pair<int64_t, int64_t>{5000, 2048}, {131072, 2048}}) {
      std::vector<float> logits;
      std::vector<int32_t> lengths;
      int64_t M = 0;
      dsa_dist_case::topk_rows(W, &logits, &lengths, &M);
      // Reference: topk() of the whole rows on GPU 0.
      cudaSetDevice(0);
      float* dl = upload(logits);
      int32_t* dn = upload(lengths);
      std::vector<int32_t> zero(static_cast<size_t>(M * k));
      int32_t* di = upload(zero);
      TopkParams tp;
      tp.logits = make_tensor(dl, DType::kF32, {M, W}, cuda_device(0));
      tp.lengths = make_tensor(dn, DType::kI32, {M}, cuda_device(0));
      tp.k = k;
      tp.indices = make_tensor(di, DType::kI32, {M, k}, cuda_device(0));
      void* tws = nullptr;
      cudaMalloc(&tws, std::max<size_t>(topk_workspace_size(tp), 1));
      tp.workspace = tws;
      tp.workspace_bytes = std::max<size_t>(topk_workspace_size(tp), 1);
      ASSERT_TRUE(topk(tp).ok());
      std::vector<int32_t> ref = download(di, static_cast<size_t>(M * k));
      cudaFree(dl); cudaFree(dn); cudaFree(di); cudaFree(tws);
      std::vector<std::vector<int32_t>> got(R);
      std::vector<Status> st(R);
      run_ranks(R, [&](int r) {
        std::vector<float> ll;
        std::vector<int32_t> len;
        const int64_t Wl = dsa_dist_case::shard(logits, lengths, M, W, R, r, 1, &ll, &len);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        float* l = upload(ll);
        int32_t* ln = upload(len);
        int32_t* ix = upload(zero);
        dist::DistTopkParams p;
        p.logits = make_tensor(l, DType::kF32, {M, Wl}, cuda_device(r));
        p.lengths = make_tensor(ln, DType::kI32, {M}, cuda_device(r));
        p.k = k;
        p.indices = make_tensor(ix, DType::kI32, {M, k}, cuda_device(r));
        p.stream = s;
        const size_t wb = dist::dist_topk_workspace_size(p, R);
        void* ws = nullptr;
        cudaMalloc(&ws, wb);
        p.workspace = ws;
        p.workspace_bytes = wb;
        cudaDeviceSynchronize();
        st[r] = dist::dist_topk(p, *g.dsa[r]);
        cudaStreamSynchronize(s);
        got[r] = download(ix, static_cast<size_t>(M * k));
        cudaFree(l); cudaFree(ln); cudaFree(ix); cudaFree(ws);
        cudaStreamDestroy(s);
      });
      for (int r = 0; r < R; ++r) {
        ASSERT_TRUE(st[r].ok()) << st[r].to_string();
        ASSERT_EQ(got[r], ref) << "R=" << R << " W=" << W << " rank " << r;
      }
    }
  }
}

TEST(NcclDist, LseMergeMatchesCpuMerge) {
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs >= 2 GPUs, found " << n;
  const int R = n >= 4 ? 4 : 2;
  const int64_t T = 64, H = 16;
  Group g(R);
  std::vector<std::vector<float>> out(R), lse(R);
  for (int r = 0; r < R; ++r) {
    out[r].resize(static_cast<size_t>(T * H * 512));
    lse[r].resize(static_cast<size_t>(T * H));
    for (size_t i = 0; i < out[r].size(); ++i) out[r][i] = std::sin(0.001f * i + r);
    for (size_t i = 0; i < lse[r].size(); ++i)
      lse[r][i] = (i % 9 == 0 && r > 0) ? INFINITY : std::cos(0.01f * i * (r + 1)) * 4.f;
  }
  // CPU merge of the same partials with the in-process group.
  std::vector<std::unique_ptr<dist::Communicator>> cg;
  ASSERT_TRUE(dist::make_local_group(R, cpu_device(), &cg).ok());
  std::vector<float> cpu_out(out[0].size()), cpu_lse(lse[0].size());
  std::vector<Status> st(R), cst(R);
  std::vector<std::vector<float>> got(R), got_lse(R);
  std::thread cpu_threads([&] {
    std::vector<std::thread> th;
    for (int r = 0; r < R; ++r)
      th.emplace_back([&, r] {
        std::vector<float> o(out[0].size()), l(lse[0].size());
        dist::LseMergeParams m;
        m.out_partial = make_tensor(out[r].data(), DType::kF32, {T, H, 512});
        m.lse_partial = make_tensor(lse[r].data(), DType::kF32, {T, H});
        m.out = make_tensor(o.data(), DType::kF32, {T, H, 512});
        m.lse = make_tensor(l.data(), DType::kF32, {T, H});
        std::vector<uint8_t> ws(dist::lse_merge_workspace_size(m, R));
        m.workspace = ws.data();
        m.workspace_bytes = ws.size();
        cst[r] = dist::lse_merge(m, *cg[r]);
        if (r == 0) { cpu_out = o; cpu_lse = l; }
      });
    for (auto& t : th) t.join();
  });
  cpu_threads.join();
  run_ranks(R, [&](int r) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float* po = upload(out[r]);
    float* pl = upload(lse[r]);
    float* o = upload(out[r]);
    float* l = upload(lse[r]);
    dist::LseMergeParams m;
    m.out_partial = make_tensor(po, DType::kF32, {T, H, 512}, cuda_device(r));
    m.lse_partial = make_tensor(pl, DType::kF32, {T, H}, cuda_device(r));
    m.out = make_tensor(o, DType::kF32, {T, H, 512}, cuda_device(r));
    m.lse = make_tensor(l, DType::kF32, {T, H}, cuda_device(r));
    m.stream = s;
    const size_t wb = dist::lse_merge_workspace_size(m, R);
    void* ws = nullptr;
    cudaMalloc(&ws, wb);
    m.workspace = ws;
    m.workspace_bytes = wb;
    cudaDeviceSynchronize();
    st[r] = dist::lse_merge(m, *g.dsa[r]);
    cudaStreamSynchronize(s);
    got[r] = download(o, out[r].size());
    got_lse[r] = download(l, lse[r].size());
    cudaFree(po); cudaFree(pl); cudaFree(o); cudaFree(l); cudaFree(ws);
    cudaStreamDestroy(s);
  });
  for (int r = 0; r < R; ++r) {
    ASSERT_TRUE(st[r].ok() && cst[r].ok()) << st[r].to_string() << cst[r].to_string();
    ASSERT_EQ(got[r], got[0]) << "every rank holds the same result";
    for (size_t i = 0; i < cpu_lse.size(); ++i)
      ASSERT_LE(std::fabs(got_lse[r][i] - cpu_lse[i]), 1e-5f * std::max(1.f, std::fabs(cpu_lse[i]))) << i;
    for (size_t i = 0; i < cpu_out.size(); ++i) ASSERT_LE(std::fabs(got[r][i] - cpu_out[i]), 2e-6f) << i;
  }
}

}  // namespace
