// A decode step of the indexer path captured in a CUDA graph: prepare q/k -> write the
// indexer cache -> paged logits -> top-k -> map. The ops allocate nothing and never
// synchronise, so the capture must succeed, and graph replays must equal the eager run bit
// for bit.
#include <cmath>

#include "gpu_util.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

TEST(GpuGraph, IndexerStepReplayEqualsEager) {
  DSA_REQUIRE_GPU();
  Rng rng(77);
  const int64_t B = 4, H = 64, page = 64, max_pos = 8192, topk_k = 256;
  const std::vector<int32_t> kv_lens = {300, 1, 2049, 777};  // after this step (one new token each)
  int64_t max_blocks = 0, blocks = 0;
  for (int32_t l : kv_lens) { max_blocks = std::max<int64_t>(max_blocks, (l + page - 1) / page); blocks += (l + page - 1) / page; }
  // Block table: consecutive distinct blocks per sequence.
  std::vector<int32_t> table(static_cast<size_t>(B * max_blocks), 0);
  int32_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < (kv_lens[b] + page - 1) / page; ++c) table[b * max_blocks + c] = next++;
  // Cache with the earlier tokens (random keys), NaN elsewhere.
  std::vector<uint8_t> cache(static_cast<size_t>(blocks * page * kIndexerTokenBytes), 0x7f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j + 1 < kv_lens[b]; ++j) {
      const int64_t blk = table[b * max_blocks + j / page], off = j % page;
      uint8_t* pg = &cache[blk * page * kIndexerTokenBytes];
      for (int d = 0; d < 128; ++d) pg[off * 128 + d] = quantize_e4m3(rng.normal() * 20.f, 1.f);
      const float s = 0.25f;
      std::memcpy(pg + page * 128 + off * 4, &s, 4);
    }
  std::vector<float> cs(static_cast<size_t>(max_pos * 64));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int i = 0; i < 32; ++i) {
      cs[p * 64 + i] = static_cast<float>(std::cos(p * std::pow(10000.0, -i / 32.0)));
      cs[p * 64 + 32 + i] = static_cast<float>(std::sin(p * std::pow(10000.0, -i / 32.0)));
    }
  std::vector<int32_t> pos(static_cast<size_t>(B));
  std::vector<int64_t> slots(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = kv_lens[b] - 1;
    slots[b] = static_cast<int64_t>(table[b * max_blocks + pos[b] / page]) * page + pos[b] % page;
  }
  const std::vector<float> q = dsa_test::random_floats(rng, static_cast<size_t>(B * H * 128));
  const std::vector<float> k = dsa_test::random_floats(rng, static_cast<size_t>(B * 128));
  const std::vector<float> w = dsa_test::random_floats(rng, static_cast<size_t>(B * H));
  const int64_t W = max_blocks * page;

  DeviceBuffer dq(q), dk(k), dw(w), dpos(pos), dcs(cs), dslots(slots), dtable(table), dlens(kv_lens), dcache(cache);
  DeviceBuffer q8(B * H * 128), wq(B * H * 4), k8(B * 128), ks(B * 4), logits(B * W * 4), idx(B * topk_k * 4),
      vals(B * topk_k * 4), mapped(B * topk_k * 4);

  PrepareIndexerKParams pk;
  pk.k = dev_tensor(dk, DType::kF32, {B, 128});
  pk.positions = dev_tensor(dpos, DType::kI32, {B});
  pk.cos_sin = dev_tensor(dcs, DType::kF32, {max_pos, 64});
  pk.hadamard = true;
  pk.k_out = dev_tensor(k8, DType::kE4M3, {B, 128});
  pk.k_scale = dev_tensor(ks, DType::kF32, {B});
  WriteIndexerCacheParams wc;
  wc.k = pk.k_out;
  wc.k_scale = pk.k_scale;
  wc.where.slots = dev_tensor(dslots, DType::kI64, {B});
  wc.cache.data = dcache.data();
  wc.cache.num_blocks = blocks;
  wc.cache.page_size = page;
  wc.cache.device = cuda_device(0);
  PrepareIndexerQParams pq;
  pq.q = dev_tensor(dq, DType::kF32, {B, H, 128});
  pq.weights = dev_tensor(dw, DType::kF32, {B, H});
  pq.positions = pk.positions;
  pq.cos_sin = pk.cos_sin;
  pq.hadamard = true;
  pq.q_out = dev_tensor(q8, DType::kE4M3, {B, H, 128});
  pq.weights_out = dev_tensor(wq, DType::kF32, {B, H});
  IndexerLogitsPagedParams lp;
  lp.q = pq.q_out;
  lp.weights = pq.weights_out;
  lp.cache.data = dcache.data();
  lp.cache.num_blocks = blocks;
  lp.cache.page_size = page;
  lp.cache.device = cuda_device(0);
  lp.block_table = dev_tensor(dtable, DType::kI32, {B, max_blocks});
  lp.kv_lens = dev_tensor(dlens, DType::kI32, {B});
  lp.next_n = 1;
  lp.logits = dev_tensor(logits, DType::kF32, {B, W});
  TopkParams tp;
  tp.logits = lp.logits;
  tp.lengths = lp.kv_lens;
  tp.k = topk_k;
  tp.indices = dev_tensor(idx, DType::kI32, {B, topk_k});
  tp.values = dev_tensor(vals, DType::kF32, {B, topk_k});
  const size_t ws_bytes = topk_workspace_size(tp);
  DeviceBuffer ws(ws_bytes);
  tp.workspace = ws.data();
  tp.workspace_bytes = ws_bytes;
  MapIndicesParams mp;
  mp.indices = tp.indices;
  mp.kind = IndexMapKind::kPaged;
  mp.block_table = lp.block_table;
  mp.page_size = page;
  mp.out = dev_tensor(mapped, DType::kI32, {B, topk_k});

  cudaStream_t stream;
  DSA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pk.stream = wc.stream = pq.stream = lp.stream = tp.stream = mp.stream = stream;
  auto step = [&]() -> Status {
    Status st = prepare_indexer_k(pk);
    if (st.ok()) st = write_indexer_cache(wc);
    if (st.ok()) st = prepare_indexer_q(pq);
    if (st.ok()) st = indexer_logits_paged(lp);
    if (st.ok()) st = topk(tp);
    if (st.ok()) st = map_indices(mp);
    return st;
  };

  DSA_ASSERT_OK(step());
  DSA_CUDA_OK(cudaStreamSynchronize(stream));
  const auto e_logits = logits.download<float>();
  const auto e_idx = idx.download<int32_t>(), e_map = mapped.download<int32_t>();
  const auto e_vals = vals.download<float>();
  const auto e_cache = dcache.download<uint8_t>();
  // The step selected something real: row 0 has 300 keys > k, row 1 has one key.
  EXPECT_NE(e_idx[0], -1);
  EXPECT_EQ(e_idx[1 * topk_k + 0], 0);
  EXPECT_EQ(e_idx[1 * topk_k + 1], -1);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DSA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status captured = step();
  DSA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DSA_ASSERT_OK(captured);
  DSA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    DSA_CUDA_OK(cudaMemsetAsync(logits.data(), 0, logits.size(), stream));
    DSA_CUDA_OK(cudaMemsetAsync(idx.data(), 0, idx.size(), stream));
    DSA_CUDA_OK(cudaMemsetAsync(mapped.data(), 0, mapped.size(), stream));
    DSA_CUDA_OK(cudaGraphLaunch(exec, stream));
    DSA_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(same_bits(logits.download<float>(), e_logits, "replayed logits"));
    EXPECT_TRUE(same_bits(idx.download<int32_t>(), e_idx, "replayed indices"));
    EXPECT_TRUE(same_bits(vals.download<float>(), e_vals, "replayed values"));
    EXPECT_TRUE(same_bits(mapped.download<int32_t>(), e_map, "replayed mapping"));
    EXPECT_TRUE(same_bits(dcache.download<uint8_t>(), e_cache, "replayed cache"));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_TRUE(device_clean());
}
