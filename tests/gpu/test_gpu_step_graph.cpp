// The layer step captured in a CUDA graph: a mixed batch (dense short prefill, sparse chunked
// prefill over a prefix, decode with next_n 2) under the plan's smallest score budget, so the
// capture holds chunks, key-axis tiles and per-run metadata copies. The capture must succeed
// (the step allocates nothing and never synchronises) and every replay must reproduce the
// eager step's out, lse, indices and cache bytes bit for bit. Also: eager steps enqueued back
// to back on one object, with the device held behind a long copy, keep each step's metadata.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "gpu_util.h"
#include "step_batch.h"

using namespace dsa;
using namespace dsa_gpu_test;

namespace {

using namespace step_batch;

// One batch's device state: inputs, caches, outputs, and the step's params over them.
struct DeviceStep {
  const Batch* b = nullptr;
  std::vector<int32_t> ql, kl;  // host, by contract
  DeviceBuffer bt, kv_c, k_pe, q, iq, ik, iw, cs, mla, idx, out, lse, ind;
  StepParams p;

  DeviceStep(const Batch& batch, void* workspace, size_t workspace_bytes, cudaStream_t stream)
      : b(&batch), ql(batch.q_lens), kl(batch.kv_lens), bt(batch.block_table), kv_c(batch.kv_c), k_pe(batch.k_pe),
        q(batch.q), iq(batch.iq), ik(batch.ik), iw(batch.iw), cs(batch.cos_sin), mla(batch.mla), idx(batch.idx),
        out(static_cast<size_t>(batch.T * kH * 512 * 4)), lse(static_cast<size_t>(batch.T * kH * 4)),
        ind(static_cast<size_t>(batch.T * kK * 4)) {
    const Device dev = cuda_device(0);
    const int64_t B = batch.B, T = batch.T;
    p.q_lens = make_tensor(ql.data(), DType::kI32, {B});
    p.kv_lens = make_tensor(kl.data(), DType::kI32, {B});
    p.block_table = dev_tensor(bt, DType::kI32, {B, batch.max_blocks});
    p.kv_c = dev_tensor(kv_c, DType::kBF16, {T, 512});
    p.k_pe = dev_tensor(k_pe, DType::kBF16, {T, 64});
    p.q = dev_tensor(q, DType::kBF16, {T, kH, 576});
    p.index_q = dev_tensor(iq, DType::kF32, {T, kHi, 128});
    p.index_k = dev_tensor(ik, DType::kF32, {T, 128});
    p.index_w = dev_tensor(iw, DType::kF32, {T, kHi});
    p.cos_sin = dev_tensor(cs, DType::kF32, {kMaxPos, 64});
    p.mla_cache.data = mla.data();
    p.mla_cache.num_blocks = batch.num_blocks;
    p.mla_cache.page_size = kPage;
    p.mla_cache.device = dev;
    p.index_cache.data = idx.data();
    p.index_cache.num_blocks = batch.num_blocks;
    p.index_cache.page_size = kPage;
    p.index_cache.device = dev;
    p.indices_out = dev_tensor(ind, DType::kI32, {T, kK});
    p.out = dev_tensor(out, DType::kF32, {T, kH, 512});
    p.lse = dev_tensor(lse, DType::kF32, {T, kH});
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    p.stream = stream;
    reset();
  }
  // The pre-step state: caches as before the step, outputs poisoned.
  void reset() {
    mla.upload(b->mla);
    idx.upload(b->idx);
    EXPECT_EQ(cudaMemset(out.data(), 0xFF, out.size()), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse.data(), 0xFF, lse.size()), cudaSuccess);
    EXPECT_EQ(cudaMemset(ind.data(), 0x5A, ind.size()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

struct Snapshot {
  std::vector<float> out, lse;
  std::vector<int32_t> indices;
  std::vector<uint8_t> mla, idx;
};

Snapshot snapshot(const DeviceStep& s) {
  Snapshot o;
  o.out = s.out.download<float>();
  o.lse = s.lse.download<float>();
  o.indices = s.ind.download<int32_t>();
  o.mla = s.mla.download<uint8_t>();
  o.idx = s.idx.download<uint8_t>();
  return o;
}

::testing::AssertionResult same(const Snapshot& a, const Snapshot& b, const std::string& what) {
  for (auto r : {same_bits(a.out, b.out, "out"), same_bits(a.lse, b.lse, "lse"),
                 same_bits(a.indices, b.indices, "indices"), same_bits(a.mla, b.mla, "MLA cache"),
                 same_bits(a.idx, b.idx, "indexer cache")})
    if (!r) return ::testing::AssertionFailure() << what << ": " << r.message();
  return ::testing::AssertionSuccess();
}

PlannerConfig config(int64_t max_tokens, int64_t max_seqs, int64_t max_context, int64_t budget) {
  PlannerConfig c;
  c.geometry = tiny();
  c.page_size = kPage;
  c.max_tokens_per_step = max_tokens;
  c.max_seqs_per_step = max_seqs;
  c.max_context = max_context;
  c.max_next_n = 2;
  c.score_budget_bytes = budget;
  c.device = cuda_device(0);
  return c;
}

// The plan's smallest budget: chunks of few rows, the longest rows tiled along the key axis.
Status tight_plan(int64_t max_tokens, int64_t max_seqs, int64_t max_context, Plan* plan) {
  Plan roomy;
  Status s = make_plan(config(max_tokens, max_seqs, max_context, kDefaultScoreBudgetBytes), &roomy);
  if (!s.ok()) return s;
  return make_plan(config(max_tokens, max_seqs, max_context, roomy.min_score_budget_bytes), plan);
}

struct StreamGuard {
  cudaStream_t s = nullptr;
  StreamGuard() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~StreamGuard() {
    if (s) cudaStreamDestroy(s);
  }
};

// Captures one step of `attn` over `st` (Global mode: the strictest about unsafe calls).
::testing::AssertionResult capture_step(Attention& attn, DeviceStep& st, cudaStream_t stream, cudaGraph_t* graph,
                                        cudaGraphExec_t* exec) {
  *graph = nullptr;
  *exec = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "begin capture: " << cudaGetErrorString(e);
  const Status captured = attn.step(st.p);
  e = cudaStreamEndCapture(stream, graph);
  if (!captured.ok()) return ::testing::AssertionFailure() << "step under capture: " << captured.to_string();
  if (e != cudaSuccess || *graph == nullptr)
    return ::testing::AssertionFailure() << "capture failed (an allocation or synchronisation inside the step?): "
                                         << cudaGetErrorString(e);
  e = cudaGraphInstantiate(exec, *graph, 0);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "instantiate: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

}  // namespace

// First in the file: run alone (--gtest_filter=GpuStepGraph.CaptureBeforeAnyEagerStep) it
// captures with nothing warmed up, so one-time set-up of the kernels (the MLA kernels'
// shared-memory opt-in) happens under capture too.
TEST(GpuStepGraph, CaptureBeforeAnyEagerStep) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{40, 40}, {24, 700}, {2, 2000}}, 5);
  Plan plan;
  ASSERT_TRUE(tight_plan(b.T, b.B, b.max_kv, &plan).ok());
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  Attention graph_owner(plan);
  ASSERT_TRUE(graph_owner.status().ok());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_TRUE(capture_step(graph_owner, st, stream.s, &graph, &exec));
  DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  ASSERT_TRUE(device_clean());
  const Snapshot replayed = snapshot(st);
  st.reset();
  Attention eager(plan);
  const Status r = eager.step(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(replayed, snapshot(st), "cold capture vs eager"));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(GpuStepGraph, CapturedStepReplaysTheEagerStepBitForBit) {
  DSA_REQUIRE_GPU();
  // dense short prefills (two dense runs) | sparse prefills over a prefix (one and several
  // rows per chunk) | decode next_n 2 (tiled: 32 and 19 tiles of 64 keys, partial last tiles)
  const Batch b = make_batch({{40, 40}, {24, 700}, {30, 30}, {8, 150}, {2, 2000}, {2, 1200}}, 11);
  Plan plan;
  ASSERT_TRUE(tight_plan(b.T, b.B, b.max_kv, &plan).ok());
  ASSERT_GT(plan.tile_width, 0) << "the test needs a plan that tiles";
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  std::unique_ptr<Attention> attn;
  ASSERT_TRUE(Attention::create(plan, &attn).ok());
  ASSERT_TRUE(attn->status().ok());

  // Eager.
  StepReport rep;
  const Status eager_status = attn->step(st.p, &rep);
  ASSERT_TRUE(eager_status.ok()) << eager_status.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  ASSERT_TRUE(device_clean());
  EXPECT_EQ(rep.seqs[static_cast<int>(Route::kDense)], 2);
  EXPECT_EQ(rep.seqs[static_cast<int>(Route::kSparseScored)], 4);
  EXPECT_GT(rep.score_chunks, 1) << "the capture should hold several scoring chunks";
  EXPECT_LT(rep.score_chunks, rep.rows[static_cast<int>(Route::kSparseScored)] - rep.tiled_rows)
      << "some chunk should hold several rows";
  EXPECT_GT(rep.tiled_rows, 0) << "the capture should hold key-axis tiles";
  EXPECT_GT(rep.score_tiles, rep.tiled_rows);
  const Snapshot eager = snapshot(st);

  // Capture from the pre-step state, with the workspace re-poisoned: a replay may depend on
  // nothing the eager run left behind.
  st.reset();
  DSA_CUDA_OK(cudaMemset(ws.data(), 0x7F, ws.size()));
  DSA_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_TRUE(capture_step(*attn, st, stream.s, &graph, &exec));
  size_t nodes = 0;
  DSA_CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GT(nodes, 10u);
  // Capturing ran nothing.
  const Snapshot untouched = snapshot(st);
  EXPECT_TRUE(std::all_of(untouched.indices.begin(), untouched.indices.end(), [](int32_t v) { return v == 0x5A5A5A5A; }));
  EXPECT_EQ(untouched.mla, b.mla);

  for (int replay = 0; replay < 2; ++replay) {
    st.reset();
    DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    ASSERT_TRUE(device_clean());
    EXPECT_TRUE(same(snapshot(st), eager, "replay " + std::to_string(replay)));
  }
  // Replays run from the graph alone: the host's q_lens / kv_lens are not read again.
  std::fill(st.ql.begin(), st.ql.end(), 0);
  st.reset();
  DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(snapshot(st), eager, "replay after the host batch changed"));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  EXPECT_TRUE(device_clean());
}

TEST(GpuStepGraph, BackToBackEagerStepsKeepTheirOwnMetadata) {
  DSA_REQUIRE_GPU();
  // Two batches of different shapes (routes, chunks, tile counts) through one object.
  const Batch x = make_batch({{40, 40}, {24, 700}, {30, 30}, {8, 150}, {2, 2000}, {2, 1200}}, 21);
  const Batch y = make_batch({{2, 1500}, {30, 30}, {1, 900}, {16, 400}, {2, 64}}, 22);
  Plan plan;
  ASSERT_TRUE(tight_plan(std::max(x.T, y.T), std::max(x.B, y.B), std::max(x.max_kv, y.max_kv), &plan).ok());
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  // References: a fresh object per step, synchronised.
  Snapshot ref[2];
  {
    const Batch* batches[2] = {&x, &y};
    for (int i = 0; i < 2; ++i) {
      DeviceStep s(*batches[i], ws.data(), ws.size(), stream.s);
      Attention a(plan);
      ASSERT_TRUE(a.status().ok());
      const Status r = a.step(s.p);
      ASSERT_TRUE(r.ok()) << r.to_string();
      DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
      ref[i] = snapshot(s);
    }
  }
  // x, y, x, y enqueued behind a long device copy, without synchronising: the host prepares
  // later steps while earlier steps' metadata copies are still queued.
  DeviceStep sx1(x, ws.data(), ws.size(), stream.s), sy1(y, ws.data(), ws.size(), stream.s),
      sx2(x, ws.data(), ws.size(), stream.s), sy2(y, ws.data(), ws.size(), stream.s);
  const size_t big = size_t{1} << 30;
  DeviceBuffer hold_a(big), hold_b(big);
  Attention attn(plan);
  ASSERT_TRUE(attn.status().ok());
  for (int rep = 0; rep < 4; ++rep)
    DSA_CUDA_OK(cudaMemcpyAsync(hold_b.data(), hold_a.data(), big, cudaMemcpyDeviceToDevice, stream.s));
  DeviceStep* order[4] = {&sx1, &sy1, &sx2, &sy2};
  for (DeviceStep* s : order) {
    const Status r = attn.step(s->p);
    ASSERT_TRUE(r.ok()) << r.to_string();
  }
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same(snapshot(sx1), ref[0], "x, first"));
  EXPECT_TRUE(same(snapshot(sy1), ref[1], "y, first"));
  EXPECT_TRUE(same(snapshot(sx2), ref[0], "x, second"));
  EXPECT_TRUE(same(snapshot(sy2), ref[1], "y, second"));
}

// StepParams::time_stages (issue 9): timed steps give the same bytes as untimed ones, report
// per-stage GPU times that partition the total, and a step captured with the option set is
// captured untimed (no synchronisation under capture) and still replays the eager step. The
// batch's tiled rows change stage more often than the timer has events, so the timer's
// harvest-and-reuse path runs too.
TEST(GpuStepGraph, StageTimesChangeNoByteAndCaptureStillReplays) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{40, 40}, {24, 700}, {30, 30}, {8, 150}, {2, 2000}, {2, 1200}}, 31);
  Plan plan;
  ASSERT_TRUE(tight_plan(b.T, b.B, b.max_kv, &plan).ok());
  ASSERT_GT(plan.tile_width, 0);
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  Attention attn(plan);
  ASSERT_TRUE(attn.status().ok());

  StepReport plain;
  Status r = attn.step(st.p, &plain);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_FALSE(plain.gpu_timed);
  EXPECT_EQ(plain.gpu_ms_total, 0.0);
  const Snapshot untimed = snapshot(st);

  for (int round = 0; round < 2; ++round) {  // the second reuses the object's events
    st.reset();
    st.p.time_stages = true;
    StepReport timed;
    r = attn.step(st.p, &timed);
    st.p.time_stages = false;
    ASSERT_TRUE(r.ok()) << r.to_string();
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    ASSERT_TRUE(device_clean());
    EXPECT_TRUE(same(snapshot(st), untimed, "timed step, round " + std::to_string(round)));
    EXPECT_TRUE(timed.gpu_timed);
    EXPECT_GT(timed.gpu_ms_total, 0.0);
    const double stages[] = {timed.gpu_ms_cache, timed.gpu_ms_prepare, timed.gpu_ms_score, timed.gpu_ms_select,
                             timed.gpu_ms_map, timed.gpu_ms_sparse, timed.gpu_ms_dense};
    double sum = 0;
    for (double v : stages) {
      EXPECT_GE(v, 0.0);
      sum += v;
    }
    EXPECT_NEAR(sum, timed.gpu_ms_total, 1e-3 * timed.gpu_ms_total + 1e-6) << "stage intervals partition the total";
    // Every stage of this batch launched work: a stage that ran kernels has a nonzero interval.
    EXPECT_GT(timed.gpu_ms_score, 0.0);
    EXPECT_GT(timed.gpu_ms_sparse, 0.0);
    EXPECT_GT(timed.gpu_ms_dense, 0.0);
    EXPECT_EQ(timed.seqs[0], plain.seqs[0]);
    EXPECT_EQ(timed.score_tiles, plain.score_tiles);
  }

  // Captured with time_stages set: the capture records no timing event and never waits.
  st.reset();
  DSA_CUDA_OK(cudaMemset(ws.data(), 0x7F, ws.size()));
  DSA_CUDA_OK(cudaDeviceSynchronize());
  st.p.time_stages = true;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_TRUE(capture_step(attn, st, stream.s, &graph, &exec));
  st.p.time_stages = false;
  for (int replay = 0; replay < 2; ++replay) {
    st.reset();
    DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    ASSERT_TRUE(device_clean());
    EXPECT_TRUE(same(snapshot(st), untimed, "replay of a capture with time_stages " + std::to_string(replay)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Plan once per step, run per layer on CUDA: prepare() + run() equals step() bit for bit,
// a second layer's run over the same prepare too, and a capture of prepare + two runs
// replays them.
TEST(GpuStepGraph, PreparedRunsEqualStepsAndCapture) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{40, 40}, {24, 700}, {30, 30}, {8, 150}, {2, 2000}, {2, 1200}}, 41);
  Plan plan;
  ASSERT_TRUE(tight_plan(b.T, b.B, b.max_kv, &plan).ok());
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  Snapshot stepped;
  {
    Attention a(plan);
    const Status r = a.step(st.p);
    ASSERT_TRUE(r.ok()) << r.to_string();
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    stepped = snapshot(st);
  }
  Attention attn(plan);
  ASSERT_TRUE(attn.status().ok());
  st.reset();
  StepReport pr, rr;
  Status r = attn.prepare(st.p, &pr);
  ASSERT_TRUE(r.ok()) << r.to_string();
  r = attn.run(st.p, &rr);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(snapshot(st), stepped, "prepare + run"));
  EXPECT_GT(rr.host_us, 0.0);
  // The next layer: the caches restored as before the step, run alone.
  st.reset();
  r = attn.run(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(snapshot(st), stepped, "second run over one prepare"));

  // prepare + run + run captured in one graph.
  st.reset();
  DSA_CUDA_OK(cudaMemset(ws.data(), 0x7F, ws.size()));
  DSA_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DSA_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
  Status c1 = attn.prepare(st.p), c2 = attn.run(st.p), c3 = attn.run(st.p);
  const cudaError_t end = cudaStreamEndCapture(stream.s, &graph);
  ASSERT_TRUE(c1.ok() && c2.ok() && c3.ok()) << c1.to_string() << c2.to_string() << c3.to_string();
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  st.reset();
  DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  ASSERT_TRUE(device_clean());
  // Two runs writing the same tokens leave the caches and outputs as one step does.
  EXPECT_TRUE(same(snapshot(st), stepped, "captured prepare + two runs"));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
