// The planner: workspace layout and breakdown, the score budget as a hard bound, key-axis
// tiling, KV capacity against hand computation, refusals naming the minimum; the arena; sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>

#include "core/arena.h"
#include "test_util.h"

using namespace dsa;

namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024, kGiB = 1024 * kMiB;

int64_t A(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The CPU top-k's scratch (topk.h): 8 bytes per column, rounded to 64, per row slot (one per
// hardware thread, at most one per row); none when every row fits in k.
int64_t cpu_topk_scratch(int64_t rows, int64_t width, int64_t k) {
  if (width <= k) return 0;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::min(rows, hw) * ((width * 8 + 63) / 64 * 64);
}

ModelGeometry small_geometry(int topk = 64) {
  ModelGeometry g;
  g.name = "small";
  g.num_heads = 4;
  g.qk_nope_head_dim = 128;
  g.v_head_dim = 128;
  g.index_heads = 2;
  g.topk = topk;
  g.num_layers = 5;
  g.num_mtp_layers = 1;
  g.max_positions = 1 << 20;
  g.sm_scale = 0.1;
  return g;
}

// 16 rows of at most 256 keys, 4 sequences, pages of 16: small enough to count by hand.
PlannerConfig by_hand_config() {
  PlannerConfig c;
  c.geometry = small_geometry();
  c.max_tokens_per_step = 16;
  c.max_seqs_per_step = 4;
  c.max_context = 256;
  c.page_size = 16;
  return c;
}

int64_t sum_buffers(const std::vector<PlanBuffer>& v) {
  int64_t s = 0;
  for (const auto& b : v) s += b.bytes;
  return s;
}

int64_t find_buffer(const Plan& p, const std::string& name) {
  for (const auto& b : p.buffers)
    if (b.name == name) return b.bytes;
  return -1;
}

// The number after `key` in a message.
int64_t number_after(const std::string& msg, const std::string& key) {
  const size_t at = msg.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(msg.substr(at + key.size()));
}

}  // namespace

TEST(Planner, WorkspaceBreakdownByHand) {
  PlannerConfig c = by_hand_config();
  c.select = SelectPath::kUnfused;  // the fused layout: FusedWorkspaceByHand
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  // Everything fits one chunk: 16 rows x 256 keys, idx and mapped [16, 64].
  EXPECT_EQ(p.score_region_bytes, A(16 * 256 * 4) + A(cpu_topk_scratch(16, 256, 64)) + A(16 * 64 * 4) * 2);
  EXPECT_EQ(p.tile_width, 0);
  EXPECT_EQ(find_buffer(p, "indexer_q"), A(16 * 2 * 128));
  EXPECT_EQ(find_buffer(p, "indexer_weights"), A(16 * 2 * 4));
  EXPECT_EQ(find_buffer(p, "indexer_k"), A(16 * 128));
  EXPECT_EQ(find_buffer(p, "dense_cu_seqlens"), A((2 * 4 + 1) * 4));
  EXPECT_EQ(find_buffer(p, "attention_scratch"), 0);  // the CPU needs none
  EXPECT_EQ(find_buffer(p, "score_region"), p.score_region_bytes);
  EXPECT_EQ(find_buffer(p, "alignment_slack"), 256);
  const int64_t expect = A(16 * 2 * 128) + A(16 * 2 * 4) + A(16 * 128) + A(16 * 4) + 3 * A(16 * 4) + A(4 * 4) +
                         A(9 * 4) + 0 + p.score_region_bytes + 256;
  EXPECT_EQ(p.workspace_bytes, expect);
  EXPECT_EQ(sum_buffers(p.buffers), p.workspace_bytes);
  EXPECT_EQ(sum_buffers(p.score_buffers), p.score_region_bytes);
  EXPECT_EQ(p.rows_per_chunk(256), 16);
  EXPECT_EQ(p.kv_pages, 0) << "no device memory given: no KV sizing";
}

TEST(Planner, RowsPerChunkUnderTheBudgetWithPadding) {
  PlannerConfig c;
  c.geometry = small_geometry();
  c.max_tokens_per_step = 4096;
  c.max_context = 100000;
  c.score_budget_bytes = 3 * kMiB + 77;  // not a multiple of the alignment
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_LE(p.score_region_bytes, c.score_budget_bytes);
  for (int64_t L : {1, 63, 64, 65, 1000, 4097, 50000, 100000}) {
    const int64_t r = p.rows_per_chunk(L);
    ASSERT_GT(r, 0) << L;
    EXPECT_LE(p.chunk_bytes(r, L), p.score_region_bytes) << L;
    if (r < p.max_rows) {
      EXPECT_GT(p.chunk_bytes(r + 1, L), p.score_region_bytes) << L;
    }
    // The score rows are padded to 64 floats and the padding is counted.
    const int64_t stride = (L + 63) / 64 * 64;
    EXPECT_EQ(p.chunk_bytes(r, L), A(r * stride * 4) + A(cpu_topk_scratch(r, L, 64)) + 2 * A(r * 64 * 4)) << L;
  }
  EXPECT_EQ(p.tile_width_for(100000), 0);
}

TEST(Planner, TilesWhenOneRowExceedsTheBudget) {
  PlannerConfig c;
  c.geometry = small_geometry(128);
  c.max_context = 1 << 20;
  c.score_budget_bytes = 256 * kKiB;  // one row of 1M keys is 4 MiB
  c.select = SelectPath::kUnfused;    // fused rows are never tiled (FusedPathNeverTiles)
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_EQ(p.rows_per_chunk(1 << 20), 0);
  EXPECT_GE(p.tile_width, 128);
  EXPECT_EQ(p.tile_width % 64, 0);
  EXPECT_EQ(p.tile_width_for(1 << 20), p.tile_width);
  EXPECT_EQ(p.max_tiles, ((1 << 20) + p.tile_width - 1) / p.tile_width);
  EXPECT_LE(p.tiled_row_bytes(p.tile_width), p.score_region_bytes);
  EXPECT_GT(p.tiled_row_bytes(p.tile_width + 64), c.score_budget_bytes) << "the widest tile that fits";
  EXPECT_EQ(sum_buffers(p.score_buffers), p.tiled_row_bytes(p.tile_width));
  EXPECT_LE(p.score_region_bytes, c.score_budget_bytes);
  // Short rows still go whole.
  EXPECT_GT(p.rows_per_chunk(1000), 0);
}

// The CPU fused score-and-select's scratch (indexer.h): per worker slot 17 buffers of 2k + 64
// eight-byte words, and no merge region while the rows alone give every thread two tiles.
int64_t cpu_fused_scratch(int64_t rows, int64_t k) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return std::min(rows, hw) * 17 * (2 * k + 64) * 8;
}

TEST(Planner, FusedWorkspaceByHand) {
  PlannerConfig c = by_hand_config();
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  // topk 64 on the CPU: every scored row is cheaper fused, so the unfused path serves only the
  // identity fills (rows of 64 keys) and the fused chunk holds all 16 rows of 256 keys.
  ASSERT_TRUE(p.fused_select);
  EXPECT_EQ(p.fused_min_width, 64);
  EXPECT_EQ(p.unfused_max_width, 64);
  const int64_t fused = A(cpu_fused_scratch(16, 64)) + 2 * A(16 * 64 * 4);
  EXPECT_EQ(p.fused_region_bytes, fused);
  EXPECT_EQ(p.fused_chunk_bytes(16, 256), fused);
  EXPECT_EQ(sum_buffers(p.fused_buffers), fused);
  EXPECT_EQ(p.unfused_region_bytes, p.chunk_bytes(16, 64));
  EXPECT_EQ(p.score_region_bytes, std::max(fused, p.chunk_bytes(16, 64)));
  EXPECT_EQ(p.fused_max_context_rows_per_chunk, 16);
  EXPECT_EQ(p.fused_bytes_all_rows, fused);
  EXPECT_EQ(p.unfused_bytes_all_rows, p.chunk_bytes(16, 256));
  EXPECT_TRUE(p.takes_fused(65));
  EXPECT_FALSE(p.takes_fused(64));
}

TEST(Planner, FusedPathNeverTilesAndHoldsAllRowsInLittleMemory) {
  PlannerConfig c;
  c.geometry = small_geometry(128);
  c.max_context = 1 << 20;
  c.score_budget_bytes = 256 * kKiB;  // one unfused row of 1M keys is 4 MiB: tiled
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_EQ(p.tile_width, 0);
  EXPECT_EQ(p.tile_width_for(1 << 20), 0);
  ASSERT_GE(p.fused_max_context_rows_per_chunk, 1);
  EXPECT_LE(p.fused_chunk_bytes(p.fused_max_context_rows_per_chunk, 1 << 20), p.score_region_bytes);
  EXPECT_LE(p.score_region_bytes, c.score_budget_bytes);
  // Selection memory of all 8192 rows at 1M keys: O(rows * topk) fused, O(rows * N) unfused.
  EXPECT_LT(p.fused_bytes_all_rows, 2 * 8192 * 128 * 4 + 4 * kMiB);
  EXPECT_GT(p.unfused_bytes_all_rows, int64_t{8192} * (1 << 20) * 4);
  // A budget below one fused row: auto leaves every row to the unfused path, which tiles;
  // select = fused refuses it, naming the smallest budget that works.
  c.score_budget_bytes = 48 * kKiB;
  Plan small;
  DSA_ASSERT_OK(make_plan(c, &small));
  EXPECT_FALSE(small.fused_select);
  EXPECT_GT(small.tile_width, 0);
  c.select = SelectPath::kFused;
  Plan refused;
  const Status st = make_plan(c, &refused);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  const int64_t least = number_after(st.message(), "the smallest budget that works is ");
  EXPECT_EQ(least, p.fused_chunk_bytes(1, 1 << 20));
  c.score_budget_bytes = least;
  Plan at_least;
  DSA_ASSERT_OK(make_plan(c, &at_least));
  EXPECT_EQ(at_least.fused_max_context_rows_per_chunk, 1);
}

TEST(Planner, SelectPathIsCheckedAgainstTheDevice) {
  PlannerConfig c;
  c.geometry = small_geometry();
  c.max_context = 4096;
  c.select = SelectPath::kUnfused;
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_FALSE(p.fused_select);
  EXPECT_EQ(p.fused_bytes_all_rows, 0);
  c.select = static_cast<SelectPath>(7);
  EXPECT_TRUE(dsa_test::fails_naming(make_plan(c, &p), {"select"}));
  // No fused kernel on CUDA yet: select = fused is refused there before anything is sized.
  c.select = SelectPath::kFused;
  c.device = Device{DeviceType::kCUDA, 0};
  EXPECT_TRUE(dsa_test::fails_naming(make_plan(c, &p), {"select = fused", "cuda", "CPU"}));
  EXPECT_STREQ(select_path_name(SelectPath::kAuto), "auto");
  EXPECT_STREQ(select_path_name(SelectPath::kFused), "fused");
}

TEST(Planner, ImpossibleBudgetNamesTheMinimumAndTheMinimumWorks) {
  for (int64_t L : {int64_t{5000}, int64_t{202752}, int64_t{1048576}}) {
    PlannerConfig c;
    c.geometry = small_geometry(2048);
    c.max_context = L;
    c.score_budget_bytes = 1000;
    Plan p;
    Status st = make_plan(c, &p);
    ASSERT_EQ(st.code(), StatusCode::kLimitExceeded) << st.to_string();
    EXPECT_TRUE(dsa_test::fails_naming(st, {"score_budget_bytes", "smallest budget that works"}));
    const int64_t min = number_after(st.message(), "smallest budget that works is ");
    ASSERT_GT(min, 1000) << st.message();
    c.score_budget_bytes = min;
    DSA_ASSERT_OK(make_plan(c, &p));
    EXPECT_EQ(p.min_score_budget_bytes, min);
    c.score_budget_bytes = min - 1;
    EXPECT_EQ(make_plan(c, &p).code(), StatusCode::kLimitExceeded) << L;
  }
}

TEST(Planner, KvCapacityByHandForEveryPresetAndPolicy) {
  for (const std::string name : {"deepseek-v3.2", "glm-5", "glm-5.2"}) {
    for (MlaCacheDtype dt : {MlaCacheDtype::kBF16, MlaCacheDtype::kFP8}) {
      PlannerConfig c;
      DSA_ASSERT_OK(geometry_preset(name, &c.geometry));
      c.cache_dtype = dt;
      c.device_memory_bytes = 141 * kGiB;
      c.max_tokens_per_step = 8192;
      Plan p;
      DSA_ASSERT_OK(make_plan(c, &p));
      // Layers by hand from SPEC §2.
      int64_t full = 0;
      const int64_t layers = name == "deepseek-v3.2" ? 61 : 78;
      for (int64_t i = 0; i < layers; ++i) full += name == "glm-5.2" ? (std::max<int64_t>(i - 2, 0) % 4 == 0) : 1;
      EXPECT_EQ(p.mla_layers, layers + 1) << name;
      EXPECT_EQ(p.indexer_layers, full + 1) << name;
      const int64_t token = dt == MlaCacheDtype::kBF16 ? 1152 : 656;
      const int64_t per_page = (layers + 1) * 64 * token + (full + 1) * 8448;
      const int64_t kv_budget =
          static_cast<int64_t>(std::floor(static_cast<double>(141 * kGiB - p.workspace_bytes) * 0.9));
      EXPECT_EQ(p.kv_budget_bytes, kv_budget) << name;
      EXPECT_EQ(p.kv_pages, kv_budget / per_page) << name;
      EXPECT_EQ(p.kv_tokens, p.kv_pages * 64) << name;
      EXPECT_EQ(p.mla_cache_bytes, p.kv_pages * 64 * token * (layers + 1)) << name;
      EXPECT_EQ(p.indexer_cache_bytes, p.kv_pages * 8448 * (full + 1)) << name;
      EXPECT_LE(p.mla_cache_bytes + p.indexer_cache_bytes + p.workspace_bytes, 141 * kGiB);
      EXPECT_LE(p.score_region_bytes, 512 * kMiB);
      EXPECT_EQ(sum_buffers(p.buffers), p.workspace_bytes);
      EXPECT_EQ(p.tile_width, 0) << "512 MiB holds a row of every preset's max context";
    }
  }
}

TEST(Planner, ReservationComesBeforeTheCache) {
  // A bigger score budget (more workspace) leaves fewer KV pages: the cache never eats it.
  PlannerConfig c;
  DSA_ASSERT_OK(geometry_preset("glm-5", &c.geometry));
  c.device_memory_bytes = 80 * kGiB;
  Plan small, big;
  c.score_budget_bytes = 64 * kMiB;
  DSA_ASSERT_OK(make_plan(c, &small));
  c.score_budget_bytes = 4 * kGiB;
  DSA_ASSERT_OK(make_plan(c, &big));
  EXPECT_GT(big.workspace_bytes, small.workspace_bytes);
  EXPECT_LT(big.kv_pages, small.kv_pages);
}

// memory_is_exact: device_memory_bytes is DSA's whole share (workspace + KV), no fraction; by
// default the KV gets kv_cache_fraction of what the workspace leaves.
TEST(Planner, MemoryIsExactAppliesNoFraction) {
  PlannerConfig c;
  DSA_ASSERT_OK(geometry_preset("glm-5", &c.geometry));
  c.device_memory_bytes = 80 * kGiB;
  Plan def, exact;
  DSA_ASSERT_OK(make_plan(c, &def));
  EXPECT_EQ(def.kv_budget_bytes, static_cast<int64_t>(std::floor((80 * kGiB - def.workspace_bytes) * 0.9)));
  c.memory_is_exact = true;
  c.kv_cache_fraction = 0.5;  // ignored
  DSA_ASSERT_OK(make_plan(c, &exact));
  EXPECT_EQ(exact.workspace_bytes, def.workspace_bytes);
  EXPECT_EQ(exact.kv_budget_bytes, 80 * kGiB - exact.workspace_bytes);
  const int64_t page_bytes = exact.mla_layers * exact.mla_page_bytes + exact.indexer_layers * exact.indexer_page_bytes;
  EXPECT_EQ(exact.kv_pages, exact.kv_budget_bytes / page_bytes);
  EXPECT_LE(exact.workspace_bytes + exact.kv_pages * page_bytes, 80 * kGiB);
  EXPECT_GT(exact.kv_pages, def.kv_pages);
  // The smallest memory that works is exact too.
  c.device_memory_bytes = 2 * kGiB;
  Plan p;
  const Status st = make_plan(c, &p);
  ASSERT_EQ(st.code(), StatusCode::kLimitExceeded);
  c.device_memory_bytes = number_after(st.message(), "smallest device memory that works is ");
  DSA_ASSERT_OK(make_plan(c, &p));
  c.device_memory_bytes -= 1;
  EXPECT_EQ(make_plan(c, &p).code(), StatusCode::kLimitExceeded);
}

TEST(Planner, ImpossibleMemoryNamesTheMinimumAndTheMinimumWorks) {
  PlannerConfig c;
  DSA_ASSERT_OK(geometry_preset("glm-5", &c.geometry));
  c.device_memory_bytes = 2 * kGiB;
  Plan p;
  Status st = make_plan(c, &p);
  ASSERT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_TRUE(dsa_test::fails_naming(st, {"device_memory_bytes", "smallest device memory that works"}));
  const int64_t min = number_after(st.message(), "smallest device memory that works is ");
  ASSERT_GT(min, 2 * kGiB);
  c.device_memory_bytes = min;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_EQ(p.kv_pages, (202752 + 63) / 64);
  c.device_memory_bytes = min - 1;
  EXPECT_EQ(make_plan(c, &p).code(), StatusCode::kLimitExceeded);
}

TEST(Planner, MalformedConfigsNameTheField) {
  auto fails = [](void (*edit)(PlannerConfig&), std::initializer_list<const char*> needles) {
    PlannerConfig c;
    c.geometry = small_geometry();
    c.max_context = 1000;
    edit(c);
    Plan p;
    return dsa_test::fails_naming(make_plan(c, &p), needles);
  };
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.geometry.topk = 100; }, {"topk", "multiple of 64"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.geometry.num_heads = 0; }, {"num_heads"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.page_size = 0; }, {"page_size"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.page_size = 6; }, {"page_size", "multiple of 4"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.max_tokens_per_step = 0; }, {"max_tokens_per_step"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.max_seqs_per_step = -1; }, {"max_seqs_per_step"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.max_next_n = 0; }, {"max_next_n"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.kv_cache_fraction = 1.5; }, {"kv_cache_fraction"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.score_budget_bytes = 0; }, {"score_budget_bytes"}));
  EXPECT_TRUE(fails([](PlannerConfig& c) { c.max_context = (1 << 20) + 1; }, {"max_context", "max_positions"}));
}

TEST(Planner, DecodeRowsCountTowardsTheStep) {
  PlannerConfig c;
  c.geometry = small_geometry();
  c.max_context = 1000;
  c.max_tokens_per_step = 8;
  c.max_seqs_per_step = 16;
  c.max_next_n = 4;
  Plan p;
  DSA_ASSERT_OK(make_plan(c, &p));
  EXPECT_EQ(p.max_rows, 64);
}

TEST(Arena, AlignsCountsAndRefuses) {
  alignas(256) static uint8_t buf[4096];
  core::Arena a(buf + 3, 1000);  // unaligned base: the first buffer starts at buf + 256
  void* p = a.alloc(10);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(p, buf + 256);
  EXPECT_EQ(a.used(), 256);
  EXPECT_NE(a.alloc(256), nullptr);
  EXPECT_EQ(a.high_water(), 512);
  const int64_t m = a.mark();
  EXPECT_EQ(a.alloc(1000), nullptr) << "1000 - 253 bytes remain";
  EXPECT_TRUE(a.failed());
  a.reset(m);
  EXPECT_EQ(a.used(), 512);
  core::Arena c = core::Arena::counting();
  c.alloc(1);
  c.alloc(257);
  EXPECT_EQ(c.used(), 256 + 512);
  core::Arena s = c.sub(300);
  EXPECT_EQ(s.capacity(), 512);
  EXPECT_NE(s.alloc(512), nullptr);
  EXPECT_EQ(s.alloc(1), nullptr);
}

TEST(ByteSize, ParsesUnitsAndRejectsJunk) {
  int64_t v = 0;
  DSA_ASSERT_OK(parse_byte_size("141GiB", &v));
  EXPECT_EQ(v, 141 * kGiB);
  DSA_ASSERT_OK(parse_byte_size("512MiB", &v));
  EXPECT_EQ(v, 512 * kMiB);
  DSA_ASSERT_OK(parse_byte_size("64kib", &v));
  EXPECT_EQ(v, 64 * kKiB);
  DSA_ASSERT_OK(parse_byte_size("4096", &v));
  EXPECT_EQ(v, 4096);
  DSA_ASSERT_OK(parse_byte_size("100 B", &v));
  EXPECT_EQ(v, 100);
  DSA_ASSERT_OK(parse_byte_size("1.5GiB", &v));
  EXPECT_EQ(v, 3 * kGiB / 2);
  DSA_ASSERT_OK(parse_byte_size("2TiB", &v));
  EXPECT_EQ(v, 2048 * kGiB);
  EXPECT_TRUE(dsa_test::fails_naming(parse_byte_size("12XB", &v), {"12XB", "unit"}));
  EXPECT_TRUE(dsa_test::fails_naming(parse_byte_size("GiB", &v), {"number"}));
  EXPECT_TRUE(dsa_test::fails_naming(parse_byte_size("0.3B", &v), {"whole number"}));
  EXPECT_TRUE(dsa_test::fails_naming(parse_byte_size("99999999999TiB", &v), {"too large"}));
  EXPECT_TRUE(dsa_test::fails_naming(parse_byte_size("5 MiB x", &v), {"unexpected"}));
  EXPECT_EQ(format_byte_size(512 * kMiB), "512 MiB");
  EXPECT_EQ(format_byte_size(1536), "1.5 KiB");
  EXPECT_EQ(format_byte_size(100), "100 B");
}
