// dsa::last_kernel_name: every CUDA launcher names the kernel it launched; an op on the CPU, or
// one that launches nothing, leaves "".
#include <string>
#include <thread>
#include <vector>

#include "gpu_util.h"

namespace {

using dsa_gpu_test::DeviceBuffer;

// A [M, W] top-k on `dev`; returns the op's status.
dsa::Status run_topk(dsa::Device dev, float* logits, int32_t* lengths, int32_t* idx, int64_t M, int64_t W, int64_t K,
                     std::vector<uint8_t>* ws) {
  dsa::TopkParams p;
  p.logits = dsa::make_tensor(logits, dsa::DType::kF32, {M, W}, dev);
  p.lengths = dsa::make_tensor(lengths, dsa::DType::kI32, {M}, dev);
  p.k = K;
  p.indices = dsa::make_tensor(idx, dsa::DType::kI32, {M, K}, dev);
  if (ws) {
    ws->resize(dsa::topk_workspace_size(p));
    p.workspace = ws->data();
    p.workspace_bytes = ws->size();
  }
  return dsa::topk(p);
}

TEST(GpuKernelName, NamedByTheLauncherClearedByCpuOps) {
  DSA_REQUIRE_GPU();
  const int64_t M = 3, W = 4096, K = 64;
  std::vector<float> h(static_cast<size_t>(M * W));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 100003) * 1e-3f;
  std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
  DeviceBuffer dl(h), dlen(len), didx(static_cast<size_t>(M * K * 4));
  const dsa::Device gpu = dsa::cuda_device(0);

  ASSERT_TRUE(run_topk(gpu, dl.as<float>(), dlen.as<int32_t>(), didx.as<int32_t>(), M, W, K, nullptr).ok());
  DSA_CUDA_OK(cudaDeviceSynchronize());
  const std::string name = dsa::last_kernel_name();
  EXPECT_EQ(name.rfind("topk.", 0), 0u) << "got '" << name << "'";

  // The same op on the CPU clears it.
  std::vector<int32_t> idx(static_cast<size_t>(M * K));
  std::vector<uint8_t> ws;
  ASSERT_TRUE(run_topk(dsa::cpu_device(), h.data(), len.data(), idx.data(), M, W, K, &ws).ok());
  EXPECT_STREQ(dsa::last_kernel_name(), "");

  // M = 0 launches nothing on the GPU: "" again.
  ASSERT_TRUE(run_topk(gpu, dl.as<float>(), dlen.as<int32_t>(), didx.as<int32_t>(), 0, W, K, nullptr).ok());
  EXPECT_STREQ(dsa::last_kernel_name(), "");

  // Another thread has its own name.
  ASSERT_TRUE(run_topk(gpu, dl.as<float>(), dlen.as<int32_t>(), didx.as<int32_t>(), M, W, K, nullptr).ok());
  std::string other = "unset";
  std::thread([&] { other = dsa::last_kernel_name(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(std::string(dsa::last_kernel_name()).rfind("topk.", 0), 0u);
  DSA_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
