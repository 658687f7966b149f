// The layer step captured in a CUDA graph: a mixed batch (dense short prefill, sparse chunked
// prefill over a prefix, decode with next_n 2) under the plan's smallest score budget, so the
// capture holds chunks, key-axis tiles and per-run metadata copies. The capture must succeed
// (the step allocates nothing and never synchronises) and every replay must reproduce the
// eager step's out, lse, indices and cache bytes bit for bit. Also: eager steps enqueued back
// to back on one object, with the device held behind a long copy, keep each step's metadata.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

// ---- graph-stable decode (StepParams::device_lengths) ----
namespace {

// One layer's caches and outputs.
struct DecodeLayer {
  IndexerRole role;
  DeviceBuffer mla, idx, out, lse, ind;
};

// A model of three layers (full, shared reading the full layer's indices, mtp) over inputs
// the lanes share; each lane has its own caches, outputs, workspace and Attention object.
struct DecodeLane {
  std::vector<DecodeLayer> layers;
  DeviceBuffer ws;
  std::unique_ptr<Attention> attn;
};

constexpr int64_t kDecB = 3, kDecNextN = 2, kDecT = kDecB * kDecNextN, kDecCtx = 256;
constexpr int64_t kDecMaxBlocks = kDecCtx / kPage;

DecodeLane make_lane(const Plan& plan, const Batch& b, int64_t num_blocks) {
  DecodeLane lane;
  const size_t mla_bytes = static_cast<size_t>(num_blocks * kPage * kMlaBf16TokenBytes);
  const size_t idx_bytes = static_cast<size_t>(num_blocks * kPage * kIndexerTokenBytes);
  for (IndexerRole role : {IndexerRole::kFull, IndexerRole::kShared, IndexerRole::kMtp}) {
    DecodeLayer l;
    l.role = role;
    l.mla.reset(mla_bytes, 0xFF);  // NaN poison past the prefix
    l.idx.reset(idx_bytes, 0xFF);
    l.mla.upload(b.mla);  // the prefix pages are the first b.num_blocks pages
    l.idx.upload(b.idx);
    l.out.reset(static_cast<size_t>(kDecT * kH * 512 * 4), 0xFF);
    l.lse.reset(static_cast<size_t>(kDecT * kH * 4), 0xFF);
    l.ind.reset(static_cast<size_t>(kDecT * kK * 4), 0x5A);
    lane.layers.push_back(std::move(l));
  }
  lane.ws.reset(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  lane.attn.reset(new Attention(plan));
  return lane;
}

// The shared inputs of one decode step (device buffers updated in place between steps).
struct DecodeInputs {
  DeviceBuffer kv_dev, bt, kv_c, k_pe, q, iq, ik, iw, cs;
  std::vector<int32_t> kv, q_lens, bt_h;
};

StepParams decode_params(DecodeLane& lane, int layer, DecodeInputs& in, int64_t num_blocks, bool device_lengths,
                         cudaStream_t stream) {
  const Device dev = cuda_device(0);
  DecodeLayer& l = lane.layers[static_cast<size_t>(layer)];
  StepParams p;
  p.role = l.role;
  if (device_lengths) {
    p.device_lengths = true;
    p.next_n = kDecNextN;
    p.kv_lens = dev_tensor(in.kv_dev, DType::kI32, {kDecB});
  } else {
    p.q_lens = make_tensor(in.q_lens.data(), DType::kI32, {kDecB});
    p.kv_lens = make_tensor(in.kv.data(), DType::kI32, {kDecB});
    p.force_score = l.role == IndexerRole::kFull;  // the full layer's indices feed the shared one
  }
  p.block_table = dev_tensor(in.bt, DType::kI32, {kDecB, kDecMaxBlocks});
  p.kv_c = dev_tensor(in.kv_c, DType::kBF16, {kDecT, 512});
  p.k_pe = dev_tensor(in.k_pe, DType::kBF16, {kDecT, 64});
  p.q = dev_tensor(in.q, DType::kBF16, {kDecT, kH, 576});
  p.mla_cache.data = l.mla.data();
  p.mla_cache.num_blocks = num_blocks;
  p.mla_cache.page_size = kPage;
  p.mla_cache.device = dev;
  if (l.role != IndexerRole::kShared) {
    p.index_q = dev_tensor(in.iq, DType::kF32, {kDecT, kHi, 128});
    p.index_k = dev_tensor(in.ik, DType::kF32, {kDecT, 128});
    p.index_w = dev_tensor(in.iw, DType::kF32, {kDecT, kHi});
    p.cos_sin = dev_tensor(in.cs, DType::kF32, {kMaxPos, 64});
    p.index_cache.data = l.idx.data();
    p.index_cache.num_blocks = num_blocks;
    p.index_cache.page_size = kPage;
    p.index_cache.device = dev;
    p.indices_out = dev_tensor(l.ind, DType::kI32, {kDecT, kK});
  } else {
    p.indices_in = dev_tensor(lane.layers[0].ind, DType::kI32, {kDecT, kK});
  }
  p.out = dev_tensor(l.out, DType::kF32, {kDecT, kH, 512});
  p.lse = dev_tensor(l.lse, DType::kF32, {kDecT, kH});
  p.workspace = lane.ws.data();
  p.workspace_bytes = lane.ws.size();
  p.stream = stream;
  return p;
}

Status run_lane(DecodeLane& lane, DecodeInputs& in, int64_t num_blocks, bool device_lengths, cudaStream_t stream,
                StepReport* full_report = nullptr) {
  std::vector<StepParams> ps;
  for (int l = 0; l < 3; ++l) ps.push_back(decode_params(lane, l, in, num_blocks, device_lengths, stream));
  Status s = lane.attn->prepare(ps[0]);
  for (int l = 0; l < 3 && s.ok(); ++l) s = lane.attn->run(ps[static_cast<size_t>(l)], l == 0 ? full_report : nullptr);
  return s;
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double tol, const char* what) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - ref[i]) <= tol * std::max(1.0, std::fabs(double(ref[i])))))
      return ::testing::AssertionFailure() << what << ": element " << i << ": " << got[i] << " vs " << ref[i];
  return ::testing::AssertionSuccess();
}

}  // namespace

// Capture one decode step (prepare + full + shared + mtp runs) while every context is below
// topk, then replay it for 72 steps as the contexts grow past topk: the engine updates the
// device kv_lens, the block table (pages appended as sequences grow) and the inputs in place.
// Each replay equals an eager device_lengths step of the same batch bit for bit (outputs,
// indices, both caches of every layer), and the host-planned step (full layer with
// force_score) in indices and caches bit for bit, in outputs to f32 rounding (short rows are
// sparse over the identity there, dense here).
TEST(GpuStepGraph, OneDecodeGraphServesGrowingContexts) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{kDecNextN, 9}, {kDecNextN, 30}, {kDecNextN, 52}}, 77);
  const int64_t num_blocks = kDecB * kDecMaxBlocks + b.num_blocks;
  Plan plan;
  ASSERT_TRUE(make_plan(config(kDecT, kDecB, kDecCtx, kDefaultScoreBudgetBytes), &plan).ok());
  ASSERT_GE(plan.rows_per_chunk(kDecCtx), 1);
  StreamGuard stream;
  DecodeLane graph_lane = make_lane(plan, b, num_blocks), eager = make_lane(plan, b, num_blocks),
             host = make_lane(plan, b, num_blocks);
  DecodeInputs in;
  in.kv = b.kv_lens;
  in.q_lens.assign(kDecB, kDecNextN);
  in.bt_h.assign(static_cast<size_t>(kDecB * kDecMaxBlocks), -1);
  for (int64_t s = 0; s < kDecB; ++s)
    for (int64_t j = 0; j < b.max_blocks; ++j) in.bt_h[s * kDecMaxBlocks + j] = b.block_table[s * b.max_blocks + j];
  std::vector<int32_t> free_pages;
  for (int64_t pg = b.num_blocks; pg < num_blocks; ++pg) free_pages.push_back(static_cast<int32_t>(pg));
  dsa_test::Rng rng(2026);
  std::shuffle(free_pages.begin(), free_pages.end(), rng.gen);
  in.kv_dev.reset(kDecB * 4);
  in.bt.reset(in.bt_h.size() * 4);
  in.kv_c.reset(kDecT * 512 * 2);
  in.k_pe.reset(kDecT * 64 * 2);
  in.q.reset(kDecT * kH * 576 * 2);
  in.iq.reset(kDecT * kHi * 128 * 4);
  in.ik.reset(kDecT * 128 * 4);
  in.iw.reset(kDecT * kHi * 4);
  in.cs.reset(b.cos_sin.size() * 4);
  in.cs.upload(b.cos_sin);
  auto next_inputs = [&](int step) {
    if (step > 0)
      for (auto& k : in.kv) k += kDecNextN;
    for (int64_t s = 0; s < kDecB; ++s)
      for (int64_t j = 0; j < (in.kv[s] + kPage - 1) / kPage; ++j)
        if (in.bt_h[s * kDecMaxBlocks + j] < 0) {
          in.bt_h[s * kDecMaxBlocks + j] = free_pages.back();
          free_pages.pop_back();
        }
    in.kv_dev.upload(in.kv);
    in.bt.upload(in.bt_h);
    in.kv_c.upload(dsa_test::to_bf16(dsa_test::random_floats(rng, kDecT * 512)));
    in.k_pe.upload(dsa_test::to_bf16(dsa_test::random_floats(rng, kDecT * 64)));
    in.q.upload(dsa_test::to_bf16(dsa_test::random_floats(rng, kDecT * kH * 576, 0.5f)));
    in.iq.upload(dsa_test::random_floats(rng, kDecT * kHi * 128));
    in.ik.upload(dsa_test::random_floats(rng, kDecT * 128));
    in.iw.upload(dsa_test::random_floats(rng, kDecT * kHi));
  };
  next_inputs(0);
  ASSERT_TRUE(device_clean());
  for (int32_t k : in.kv) ASSERT_LT(k, kK);  // captured below topk

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DSA_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal));
  const Status captured = run_lane(graph_lane, in, num_blocks, true, stream.s);
  const cudaError_t end = cudaStreamEndCapture(stream.s, &graph);
  ASSERT_TRUE(captured.ok()) << captured.to_string();
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  constexpr int kSteps = 72;
  bool crossed = false;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("decode step " + std::to_string(step) + ", kv_lens " + std::to_string(in.kv[0]) + " " +
                 std::to_string(in.kv[1]) + " " + std::to_string(in.kv[2]));
    if (step > 0) next_inputs(step);
    DSA_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    StepReport rep;
    Status s = run_lane(eager, in, num_blocks, true, stream.s, &rep);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(rep.rows[static_cast<int>(Route::kSparseScored)], kDecT);
    EXPECT_EQ(rep.seqs[static_cast<int>(Route::kDense)], 0);
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    s = run_lane(host, in, num_blocks, false, stream.s);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_TRUE(device_clean());
    crossed = crossed || *std::min_element(in.kv.begin(), in.kv.end()) > kK;
    for (int l = 0; l < 3; ++l) {
      const DecodeLayer &g = graph_lane.layers[l], &e = eager.layers[l], &h = host.layers[l];
      const std::string what = std::string(l == 0 ? "full" : l == 1 ? "shared" : "mtp");
      ASSERT_TRUE(same_bits(g.out.download<float>(), e.out.download<float>(), (what + " out").c_str()));
      ASSERT_TRUE(same_bits(g.lse.download<float>(), e.lse.download<float>(), (what + " lse").c_str()));
      ASSERT_TRUE(same_bits(g.mla.download<uint8_t>(), e.mla.download<uint8_t>(), (what + " MLA cache").c_str()));
      ASSERT_TRUE(same_bits(g.mla.download<uint8_t>(), h.mla.download<uint8_t>(), (what + " MLA cache vs host").c_str()));
      if (l != 1) {
        ASSERT_TRUE(same_bits(g.ind.download<int32_t>(), e.ind.download<int32_t>(), (what + " indices").c_str()));
        ASSERT_TRUE(same_bits(g.ind.download<int32_t>(), h.ind.download<int32_t>(), (what + " indices vs host").c_str()));
        ASSERT_TRUE(same_bits(g.idx.download<uint8_t>(), e.idx.download<uint8_t>(), (what + " indexer cache").c_str()));
        ASSERT_TRUE(
            same_bits(g.idx.download<uint8_t>(), h.idx.download<uint8_t>(), (what + " indexer cache vs host").c_str()));
      }
      ASSERT_TRUE(close(g.out.download<float>(), h.out.download<float>(), 1e-4, (what + " out vs host").c_str()));
      ASSERT_TRUE(close(g.lse.download<float>(), h.lse.download<float>(), 1e-4, (what + " lse vs host").c_str()));
    }
  }
  EXPECT_TRUE(crossed);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Engine-shaped inputs on CUDA: i64 positions equal to the cache positions and a slot mapping
// equal to the block-table slots change no byte; padded tokens (slot -1, at the ends of
// sequences and one padding-only sequence) are written nowhere, their rows are out 0, lse +inf,
// indices -1, and every other row and cache byte equals the unpadded step's.
TEST(GpuStepGraph, I64PositionsSlotMappingAndPaddedTokens) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{3, 40}, {4, 100}, {2, 2}, {1, 80}}, 91);
  Plan plan;
  ASSERT_TRUE(make_plan(config(b.T, b.B, b.max_kv, kDefaultScoreBudgetBytes), &plan).ok());
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  Attention attn(plan);
  Status r = attn.step(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  const Snapshot ref = snapshot(st);
  std::vector<int64_t> pos, slots;
  for (int64_t s = 0; s < b.B; ++s)
    for (int32_t i = 0; i < b.q_lens[s]; ++i) {
      const int64_t p = b.kv_lens[s] - b.q_lens[s] + i;
      pos.push_back(p);
      slots.push_back(int64_t{b.block_table[s * b.max_blocks + p / kPage]} * kPage + p % kPage);
    }
  DeviceBuffer dpos(pos), dslots(slots);
  st.reset();
  st.p.positions = dev_tensor(dpos, DType::kI64, {b.T});
  st.p.slot_mapping = dev_tensor(dslots, DType::kI64, {b.T});
  r = attn.step(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(snapshot(st), ref, "i64 positions + slot mapping"));

  std::vector<bool> pad(static_cast<size_t>(b.T), false);
  // Padding sequences (a sequence is padded whole): sequence 2 (dense) and 3 (past topk).
  for (int64_t t : {int64_t{7}, int64_t{8}, int64_t{9}}) pad[t] = true;
  std::vector<int64_t> padded = slots;
  for (int64_t t = 0; t < b.T; ++t)
    if (pad[t]) padded[t] = -1;
  DeviceBuffer dpad(padded);
  st.reset();
  st.p.slot_mapping = dev_tensor(dpad, DType::kI64, {b.T});
  r = attn.step(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  ASSERT_TRUE(device_clean());
  const Snapshot got = snapshot(st);
  std::vector<uint8_t> want_mla = ref.mla, want_idx = ref.idx;
  for (int64_t t = 0; t < b.T; ++t) {
    if (!pad[t]) continue;
    const int64_t s = slots[t], blk = s / kPage, off = s % kPage;
    std::memcpy(&want_mla[s * kMlaBf16TokenBytes], &b.mla[s * kMlaBf16TokenBytes], kMlaBf16TokenBytes);
    const int64_t ib = blk * kPage * kIndexerTokenBytes;
    std::memcpy(&want_idx[ib + off * 128], &b.idx[ib + off * 128], 128);
    std::memcpy(&want_idx[ib + kPage * 128 + off * 4], &b.idx[ib + kPage * 128 + off * 4], 4);
  }
  EXPECT_TRUE(same_bits(got.mla, want_mla, "MLA cache with padded tokens"));
  EXPECT_TRUE(same_bits(got.idx, want_idx, "indexer cache with padded tokens"));
  for (int64_t t = 0; t < b.T; ++t) {
    const size_t o = static_cast<size_t>(t * kH * 512), l = static_cast<size_t>(t * kH), k = static_cast<size_t>(t * kK);
    if (pad[t]) {
      for (int64_t j = 0; j < kH * 512; ++j) ASSERT_EQ(got.out[o + j], 0.0f) << "padded row " << t;
      for (int64_t h = 0; h < kH; ++h) ASSERT_EQ(got.lse[l + h], std::numeric_limits<float>::infinity());
      for (int64_t j = 0; j < kK; ++j) ASSERT_EQ(got.indices[k + j], -1);
    } else {
      ASSERT_EQ(0, std::memcmp(&got.out[o], &ref.out[o], kH * 512 * 4)) << "row " << t;
      ASSERT_EQ(0, std::memcmp(&got.lse[l], &ref.lse[l], kH * 4)) << "row " << t;
      ASSERT_EQ(0, std::memcmp(&got.indices[k], &ref.indices[k], kK * 4)) << "row " << t;
    }
  }
}

namespace {

uint64_t checksum(const std::vector<uint8_t>& bytes) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// Atomic eager steps over device-resident inputs: a block table naming no page (or one past a
// layer's cache), positions past cos_sin and slot mappings that disagree with the block table
// live in device memory, yet each is refused before either cache is written (both caches'
// checksums unchanged), by step, prepare and run alike; the same object then serves the valid
// batch bit-identically to a fresh one.
TEST(GpuStepGraph, RefusedDeviceInputsLeaveBothCachesUntouched) {
  DSA_REQUIRE_GPU();
  const Batch b = make_batch({{3, 40}, {4, 100}, {2, 2}, {1, 80}}, 92);
  Plan plan;
  ASSERT_TRUE(make_plan(config(b.T, b.B, b.max_kv, kDefaultScoreBudgetBytes), &plan).ok());
  StreamGuard stream;
  DeviceBuffer ws(static_cast<size_t>(plan.workspace_bytes), 0x7F);
  DeviceStep st(b, ws.data(), ws.size(), stream.s);
  Snapshot ref;
  {
    Attention fresh(plan);
    const Status r = fresh.step(st.p);
    ASSERT_TRUE(r.ok()) << r.to_string();
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    ref = snapshot(st);
  }
  const uint64_t mla0 = checksum(b.mla), idx0 = checksum(b.idx);
  Attention attn(plan);
  auto refused = [&](const char* what, const std::string& expect, auto&& call) {
    st.reset();
    const Status r = call();
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << what << ": " << r.to_string();
    EXPECT_EQ(r.message().rfind("attention_step: ", 0), 0u) << what << ": " << r.message();
    EXPECT_NE(r.message().find(expect), std::string::npos) << what << ": " << r.message();
    DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
    EXPECT_EQ(checksum(st.mla.download<uint8_t>()), mla0) << what << ": the MLA cache was written";
    EXPECT_EQ(checksum(st.idx.download<uint8_t>()), idx0) << what << ": the indexer cache was written";
  };
  const int64_t mb = b.max_blocks;
  std::vector<int32_t> table = b.block_table;
  // Sequence 1 (kv_len 100) covers pages 0..6; its page 5 is replaced.
  table[1 * mb + 5] = -1;
  DeviceBuffer neg(table);
  table[1 * mb + 5] = static_cast<int32_t>(b.num_blocks);
  DeviceBuffer past(table);
  const TensorDesc good_bt = st.p.block_table;
  refused("block table -1", "block_table[1, 5]: expected a page >= 0", [&] {
    st.p.block_table = dev_tensor(neg, DType::kI32, {b.B, mb});
    return attn.step(st.p);
  });
  refused("block table past the caches", "block_table[1, 5]: expected a page in [0, num_blocks", [&] {
    st.p.block_table = dev_tensor(past, DType::kI32, {b.B, mb});
    return attn.step(st.p);
  });
  refused("prepare, block table -1", "block_table[1, 5]", [&] {
    st.p.block_table = dev_tensor(neg, DType::kI32, {b.B, mb});
    return attn.prepare(st.p);
  });
  refused("run, a page past the layer's caches", "expected a page in [0, num_blocks", [&] {
    st.p.block_table = dev_tensor(past, DType::kI32, {b.B, mb});
    const Status pr = attn.prepare(st.p);  // prepare has no caches: the page range is each run's
    if (!pr.ok()) return pr;
    return attn.run(st.p);
  });
  st.p.block_table = good_bt;

  std::vector<int64_t> pos, slots;
  for (int64_t s = 0; s < b.B; ++s)
    for (int32_t i = 0; i < b.q_lens[s]; ++i) {
      const int64_t p = b.kv_lens[s] - b.q_lens[s] + i;
      pos.push_back(p);
      slots.push_back(int64_t{b.block_table[s * mb + p / kPage]} * kPage + p % kPage);
    }
  std::vector<int64_t> bad_pos = pos;
  bad_pos[4] = kMaxPos;
  DeviceBuffer dbad_pos(bad_pos);
  refused("positions past cos_sin", "positions[4]: expected 0 <= position < cos_sin rows", [&] {
    st.p.positions = dev_tensor(dbad_pos, DType::kI64, {b.T});
    return attn.step(st.p);
  });
  st.p.positions = TensorDesc{};
  std::vector<int64_t> bad_slots = slots;
  bad_slots[6] += 1;
  DeviceBuffer dbad_slots(bad_slots);
  refused("slot mapping off its block-table slot", "slot_mapping[6]: expected -1 (padded) or the token's", [&] {
    st.p.slot_mapping = dev_tensor(dbad_slots, DType::kI64, {b.T});
    return attn.step(st.p);
  });
  bad_slots = slots;
  bad_slots[3] = -1;  // sequence 1's first token padded, its second not
  DeviceBuffer dpad_first(bad_slots);
  refused("padding before a real token", "slot_mapping[4]: expected -1 like token 3 of sequence 1", [&] {
    st.p.slot_mapping = dev_tensor(dpad_first, DType::kI64, {b.T});
    return attn.step(st.p);
  });
  bad_slots = slots;
  bad_slots[2] = -1;  // sequence 0's last token only: its real rows would share a key tile with it
  DeviceBuffer dpad_last(bad_slots);
  refused("a sequence padded in part", "slot_mapping[2]: expected the token's block-table slot", [&] {
    st.p.slot_mapping = dev_tensor(dpad_last, DType::kI64, {b.T});
    return attn.step(st.p);
  });
  st.p.slot_mapping = TensorDesc{};

  // The same object, after every refusal, serves the valid batch like a fresh one.
  st.reset();
  const Status r = attn.step(st.p);
  ASSERT_TRUE(r.ok()) << r.to_string();
  DSA_CUDA_OK(cudaStreamSynchronize(stream.s));
  EXPECT_TRUE(same(snapshot(st), ref, "after refused steps"));
}
