// Dense attention in MHA form (SPEC §5b) on CUDA: gather + cuBLAS decompression + attention
// (the Hopper kernel on sm_90a, the portable kernel elsewhere or when forced) against the
// float64 oracle and the CPU backend; packed (host kv_lens given) and strided groups,
// sequence groups in a small workspace, graph capture, NaN-poisoned cache slots and workspace.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/cuda_ops.h"
#include "gpu/gpu_util.h"
#include "mha_batch.h"

namespace {

using namespace mha_test;
using dsa_gpu_test::DeviceBuffer;
using dsa_gpu_test::dev_tensor;

// The batch's inputs on the device, and a run of the op writing into the batch's host outputs.
struct DevBatch {
  Batch& b;
  DeviceBuffer cache, table, kv_lens, cu_q, w, qn, qp, sink, out, lse, ws;
  explicit DevBatch(Batch& batch)
      : b(batch), cache(b.cache.size()), table(b.table), kv_lens(b.kv_lens), cu_q(b.cu_q), w(b.w_bf), qn(b.qn_bf),
        qp(b.qp_bf), out(b.out.size()), lse(b.lse.size()) {
    cache.upload_bytes(b.cache.data(), b.cache.size());
    if (b.sink) sink = DeviceBuffer(b.sink_f);
  }
  DenseMhaPrefillParams params(bool host_lens) {
    DenseMhaPrefillParams p;
    p.q_nope = dev_tensor(qn, DType::kBF16, {b.T, b.H, b.nope});
    p.q_pe = dev_tensor(qp, DType::kBF16, {b.T, b.H, 64});
    p.cache = b.cache_desc();
    p.cache.data = cache.data();
    p.cache.device = cuda_device(0);
    p.block_table = dev_tensor(table, DType::kI32, {b.B, b.max_blocks});
    p.kv_lens = dev_tensor(kv_lens, DType::kI32, {b.B});
    p.cu_seqlens_q = dev_tensor(cu_q, DType::kI32, {b.B + 1});
    if (host_lens) p.kv_lens_host = dsa_test::t_i32(b.kv_lens.data(), {b.B});
    p.kv_b_proj = dev_tensor(w, DType::kBF16, {b.H * (b.nope + b.v), 512});
    if (b.sink) p.attn_sink = dev_tensor(sink, DType::kF32, {b.H});
    p.sm_scale = kScale;
    p.out = dev_tensor(out, b.out_f32 ? DType::kF32 : DType::kBF16, {b.T, b.H, b.v});
    p.lse = dev_tensor(lse, DType::kF32, {b.T, b.H});
    return p;
  }
  // ws_bytes 0: the whole batch in one group. The workspace and outputs start as NaN.
  Status run(bool host_lens, size_t ws_bytes = 0, cudaStream_t stream = nullptr) {
    DenseMhaPrefillParams p = params(host_lens);
    const MhaWorkspaceSize need = dense_mha_prefill_workspace_size(p);
    EXPECT_GT(need.min_bytes, 0u);
    const size_t n = ws_bytes ? ws_bytes : need.batch_bytes;
    if (ws.size() < n + 512) ws.reset(n + 512, 0xFF);
    cudaMemset(out.data(), 0xFF, out.size());
    cudaMemset(lse.data(), 0xFF, lse.size());
    p.workspace = ws.as<uint8_t>() + 16;  // not 256-aligned on purpose
    p.workspace_bytes = n;
    p.stream = stream;
    return dense_mha_prefill(p);
  }
  void fetch() {
    EXPECT_TRUE(dsa_gpu_test::device_clean());
    const auto o = out.download<uint8_t>();
    const auto l = lse.download<uint8_t>();
    std::memcpy(b.out.data(), o.data(), o.size());
    std::memcpy(b.lse.data(), l.data(), l.size());
  }
};

struct Geo {
  int64_t nope, v;
};
const Geo kGeos[] = {{128, 128}, {192, 256}};
// Prefix offsets, a sequence without new tokens, block edges of both kernels (16 / 128 rows,
// 32 / 64 keys), a sequence of 200 rows over 300 keys.
const std::vector<Seq> kSeqs = {{5, 5}, {17, 40}, {0, 3}, {129, 129}, {200, 300}, {1, 64}, {64, 65}};

class GpuMha : public ::testing::TestWithParam<bool> {  // param: force the portable kernel
 protected:
  void SetUp() override {
    DSA_REQUIRE_GPU();
    dsa::gpu::set_mha_force_portable(GetParam());
  }
  void TearDown() override { dsa::gpu::set_mha_force_portable(false); }
};

TEST_P(GpuMha, AgainstOracle) {
  uint64_t seed = 300;
  for (const Geo& g : kGeos) {
    for (bool fp8 : {false, true}) {
      for (bool host_lens : {true, false}) {
        SCOPED_TRACE("qk_nope " + std::to_string(g.nope) + " v " + std::to_string(g.v) + " fp8 " +
                     std::to_string(fp8) + " host kv_lens " + std::to_string(host_lens));
        Batch b(seed++, kSeqs, 3, g.nope, g.v, fp8, 16, false, host_lens, /*sink=*/!host_lens);
        DevBatch d(b);
        DSA_ASSERT_OK(d.run(host_lens));
        d.fetch();
        // As on the CPU (tests/test_mha.cpp): K/V rounded to bf16 by cuBLAS's f32 sums.
        expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "vs oracle");
        const auto first = b.bytes();
        DSA_ASSERT_OK(d.run(host_lens));
        d.fetch();
        EXPECT_EQ(first, b.bytes()) << "rerun differs";
      }
    }
  }
}

TEST_P(GpuMha, MatchesCpuBackend) {
  Batch b(7, {{40, 90}, {130, 130}}, 4, 192, 256, false, 64, false, true);
  DevBatch d(b);
  DSA_ASSERT_OK(d.run(true));
  d.fetch();
  std::vector<float> gpu_out(b.out.as<float>(), b.out.as<float>() + b.T * b.H * b.v);
  std::vector<float> gpu_lse(b.lse.as<float>(), b.lse.as<float>() + b.T * b.H);
  DenseMhaPrefillParams p = b.params();
  std::vector<uint8_t> ws(dense_mha_prefill_workspace_size(p).batch_bytes);
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  DSA_ASSERT_OK(dense_mha_prefill(p));
  // Both compute the oracle's function; against each other, twice the tolerance.
  oracle::MhaResult cpu;
  cpu.out.assign(b.out.as<float>(), b.out.as<float>() + b.T * b.H * b.v);
  cpu.lse.assign(b.lse.as<float>(), b.lse.as<float>() + b.T * b.H);
  const oracle::MhaResult ref = b.oracle_result(true);
  cpu.out_scale = ref.out_scale;
  cpu.score_scale = ref.score_scale;
  cpu.out_flip = ref.out_flip;  // each side may round V elements the other way
  std::memcpy(b.out.data(), gpu_out.data(), gpu_out.size() * 4);
  std::memcpy(b.lse.data(), gpu_lse.data(), gpu_lse.size() * 4);
  expect_close(b, cpu, 2.0, std::ldexp(1.0, -7), 2 * kKvFlipLse, "GPU vs CPU backend", 2.0);
}

TEST_P(GpuMha, SequenceGroupsInASmallWorkspace) {
  std::vector<Seq> seqs;
  for (int i = 0; i < 20; ++i) seqs.push_back({static_cast<int32_t>(1 + (i * 13) % 70), static_cast<int32_t>(70 + i)});
  for (bool host_lens : {true, false}) {
    SCOPED_TRACE("host kv_lens " + std::to_string(host_lens));
    Batch b(900 + host_lens, seqs, 2, 128, 128, true, 16, false, false);
    DevBatch d(b);
    const MhaWorkspaceSize need = dense_mha_prefill_workspace_size(d.params(host_lens));
    DSA_ASSERT_OK(d.run(host_lens, need.min_bytes));
    d.fetch();
    expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "one sequence per group");
    const auto small = b.bytes();
    DSA_ASSERT_OK(d.run(host_lens));
    d.fetch();
    expect_close(b, b.oracle_result(true), 1.0, std::ldexp(1.0, -8), kKvFlipLse, "one group");
    // The attention kernels' arithmetic per row does not depend on the grouping; cuBLAS may
    // pick another algorithm for another row count, so report rather than require equal bits.
    if (small != b.bytes()) std::printf("note: grouped and whole runs differ in bits (cuBLAS algorithm choice)\n");
    Status st = d.run(host_lens, need.min_bytes - 1);
    EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  }
}

TEST_P(GpuMha, GraphCaptureReplaysTheSameBits) {
  Batch b(31, {{50, 80}, {128, 128}}, 2, 192, 256, false, 64, false, false);
  DevBatch d(b);
  DSA_ASSERT_OK(d.run(true));  // warm-up: cuBLAS handle, kernel attributes
  d.fetch();
  const auto direct = b.bytes();
  cudaStream_t s;
  DSA_CUDA_OK(cudaStreamCreate(&s));
  DenseMhaPrefillParams p = d.params(true);
  p.workspace = d.ws.data();
  p.workspace_bytes = dense_mha_prefill_workspace_size(p).batch_bytes;
  p.stream = s;
  cudaGraph_t graph;
  DSA_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status st = dense_mha_prefill(p);
  DSA_CUDA_OK(cudaStreamEndCapture(s, &graph));
  DSA_ASSERT_OK(st);
  cudaGraphExec_t exec;
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  cudaMemset(d.out.data(), 0xFF, d.out.size());
  cudaMemset(d.lse.data(), 0xFF, d.lse.size());
  DSA_CUDA_OK(cudaGraphLaunch(exec, s));
  DSA_CUDA_OK(cudaStreamSynchronize(s));
  d.fetch();
  EXPECT_EQ(direct, b.bytes()) << "graph replay differs from the direct call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Kernels, GpuMha, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Portable" : "Default"; });

// The Hopper kernels (serial and pipelined) against the portable one on the same inputs
// (sm_90a only): both within the oracle's tolerance, and within twice that of each other.
TEST(GpuMhaKernels, HopperAgreesWithPortable) {
  DSA_REQUIRE_GPU();
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "no sm_90a device";
  // 2: the serial Hopper kernel (the default), 3: the pipelined one (DSA_MHA_KERNEL=wgmma_pipe),
  // 4: ping-pong (DSA_MHA_KERNEL=wgmma_pingpong).
  for (int mode : {2, 3, 4})
  for (const Geo& g : kGeos) {
    SCOPED_TRACE("qk_nope " + std::to_string(g.nope) + (mode == 4 ? " ping-pong" : mode == 3 ? " pipelined" : " serial"));
    Batch b(55, {{300, 300}, {77, 333}, {128, 200}}, 4, g.nope, g.v, false, 64, false, true);
    DevBatch d(b);
    dsa::gpu::set_mha_kernel(1);
    DSA_ASSERT_OK(d.run(true));
    d.fetch();
    dsa::gpu::set_mha_kernel(mode);
    oracle::MhaResult port;
    port.out.assign(b.out.as<float>(), b.out.as<float>() + b.T * b.H * b.v);
    port.lse.assign(b.lse.as<float>(), b.lse.as<float>() + b.T * b.H);
    const oracle::MhaResult ref = b.oracle_result(true);
    port.out_scale = ref.out_scale;
    port.score_scale = ref.score_scale;
    DSA_ASSERT_OK(d.run(true));
    d.fetch();
    expect_close(b, ref, 1.0, std::ldexp(1.0, -8), kKvFlipLse, "Hopper vs oracle");
    // Hopper rounds P to bf16 for the tensor cores; the portable kernel keeps it f32.
    // Both share one decompression (the same bf16 K/V bytes), so no V flips between them.
    expect_close(b, port, 2.0, std::ldexp(1.0, -7), 2 * kKvFlipLse, "Hopper vs portable", 0.0);
    const auto first = b.bytes();
    DSA_ASSERT_OK(d.run(true));
    d.fetch();
    EXPECT_EQ(first, b.bytes()) << "rerun differs";
  }
  dsa::gpu::set_mha_kernel(0);
}

}  // namespace
