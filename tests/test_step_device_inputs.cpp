// The pre-write check of an eager step's device-resident inputs (core/step/validate.cpp:
// check_device_inputs, check_device_facts), run here through a stand-in queued backend whose
// "device" memory is host memory: it counts what the step reads back, so the tests also show
// what is read once per batch and what never is. The CUDA end to end (a refused step leaves the
// caches byte-identical) is tests/gpu/test_gpu_step_graph.cpp
// (GpuStepGraph.RefusedDeviceInputsLeaveBothCachesUntouched).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/step/step.h"
#include "dsa/geometry.h"
#include "dsa/planner.h"
#include "test_util.h"

namespace dsa {
namespace {

namespace st = core::step;

class CountingQueuedOps final : public st::DeviceOps {
 public:
  mutable int downloads = 0;
  mutable size_t bytes_read = 0;
  bool queued() const override { return true; }
  Status alloc_staging(Device, size_t, void** out) const override {
    *out = nullptr;
    return Status::Ok();
  }
  void free_staging(void*) const override {}
  Status create_event(Device, bool, void** ev) const override {
    *ev = nullptr;
    return Status::Ok();
  }
  void destroy_event(void*) const override {}
  Status record_event(void*, void*) const override { return Status::Ok(); }
  Status wait_event(void*) const override { return Status::Ok(); }
  Status elapsed_ms(void*, void*, float* ms) const override {
    *ms = 0;
    return Status::Ok();
  }
  Status capturing(void*, bool* out) const override {
    *out = false;
    return Status::Ok();
  }
  Status upload(void* d, const void* s, size_t n, void*) const override {
    std::memcpy(d, s, n);
    return Status::Ok();
  }
  Status download(void* d, const void* s, size_t n, void*) const override {
    ++downloads;
    bytes_read += n;
    if (n) std::memcpy(d, s, n);
    return Status::Ok();
  }
  Status decode_rows(const st::DecodeRowsArgs&, void*) const override { return Status::Ok(); }
  Status mask_padded(const st::MaskPaddedArgs&, void*) const override { return Status::Ok(); }
};

// Two sequences (kv_lens 40 and 17, q_lens 3 and 2) over page 16: pages 3 and 2 of a
// [2, 4] block table on the stand-in device; caches of 8 pages; cos_sin of 64 rows.
struct Batch {
  Plan plan;
  std::vector<int32_t> q_lens{3, 2}, kv_lens{40, 17};
  std::vector<int32_t> table{5, 1, 7, -1,   // row 0 covers j < 3; j = 3 is past it
                             2, 0, -1, -1};  // row 1 covers j < 2
  std::vector<int64_t> positions{37, 38, 39, 15, 16};
  std::vector<int64_t> slots;
  StepParams p;
  CountingQueuedOps ops;
  st::StepState state;
  StepReport rep;

  Batch() {
    PlannerConfig c;
    c.geometry.name = "small";
    c.geometry.num_heads = 2;
    c.geometry.index_heads = 2;
    c.geometry.topk = 64;
    c.geometry.sm_scale = 0.1;
    c.page_size = 16;
    c.max_tokens_per_step = 8;
    c.max_seqs_per_step = 2;
    c.max_context = 64;
    EXPECT_TRUE(make_plan(c, &plan).ok());
    for (int b = 0, t = 0; b < 2; ++b)
      for (int i = 0; i < q_lens[b]; ++i, ++t) {
        const int64_t pos = kv_lens[b] - q_lens[b] + i;
        slots.push_back(int64_t{table[b * 4 + pos / 16]} * 16 + pos % 16);
      }
    p.q_lens = make_tensor(q_lens.data(), DType::kI32, {2});
    p.kv_lens = make_tensor(kv_lens.data(), DType::kI32, {2});
    p.block_table = make_tensor(table.data(), DType::kI32, {2, 4}, cuda_device(0));
    p.mla_cache.num_blocks = 8;
    p.index_cache.num_blocks = 8;
    p.cos_sin.shape[0] = 64;
    p.cos_sin.ndim = 2;
    state.ops = &ops;
    state.device = cuda_device(0);
  }
  void with_positions() { p.positions = make_tensor(positions.data(), DType::kI64, {5}, cuda_device(0)); }
  void with_slots() { p.slot_mapping = make_tensor(slots.data(), DType::kI64, {5}, cuda_device(0)); }
  // check_device_inputs then check_device_facts, as an eager step does.
  Status check(st::DeviceInputFacts* f, bool capturing = false) {
    st::Step s(plan, p, state, rep);
    s.shape.B = 2;
    s.shape.T = 5;
    s.shape.scores = true;
    s.capturing = capturing;
    Status r = st::check_device_inputs(s, f);
    if (r.ok()) r = st::check_device_facts(s, *f);
    return r;
  }
};

TEST(StepDeviceInputs, ValidBatchIsReadOnceAndRemembered) {
  Batch b;
  b.with_positions();
  b.with_slots();
  st::DeviceInputFacts f;
  DSA_ASSERT_OK(b.check(&f));
  EXPECT_TRUE(f.block_table);
  EXPECT_EQ(f.max_page, 7);
  EXPECT_EQ(f.page_b, 0);
  EXPECT_EQ(f.page_j, 2);
  EXPECT_EQ(f.max_pos, 39);
  EXPECT_EQ(f.slot_mapping, b.slots.data());
  // block table (its extent up to the widest row's pages: row 0, then row 1 up to j = 2: 4 + 3
  // words), positions, slots.
  EXPECT_EQ(b.ops.downloads, 3);
  EXPECT_EQ(b.ops.bytes_read, (4 + 3) * 4 + 5 * 8 + 5 * 8);
  // The next layer of the same batch reads nothing back.
  DSA_ASSERT_OK(b.check(&f));
  EXPECT_EQ(b.ops.downloads, 3);
}

TEST(StepDeviceInputs, NegativePageInsideTheCoveredRangeIsRefused) {
  Batch b;
  b.table[1 * 4 + 1] = -1;  // row 1, j = 1: kv_len 17 covers pages 0 and 1
  st::DeviceInputFacts f;
  const Status s = b.check(&f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("attention_step: block_table[1, 1]: expected a page >= 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("got -1"), std::string::npos) << s.message();
}

TEST(StepDeviceInputs, EntriesPastTheCoveredRangeAreNotRead) {
  Batch b;
  b.table[0 * 4 + 3] = -7;  // row 0, j = 3: past kv_len 40's three pages
  b.table[1 * 4 + 2] = 99;
  st::DeviceInputFacts f;
  DSA_ASSERT_OK(b.check(&f));
  EXPECT_EQ(f.max_page, 7);
}

TEST(StepDeviceInputs, PagePastTheLayersCacheIsRefusedPerLayer) {
  Batch b;
  st::DeviceInputFacts f;
  DSA_ASSERT_OK(b.check(&f));
  b.p.index_cache.num_blocks = 7;  // a layer whose indexer cache is smaller: page 7 is past it
  const Status s = b.check(&f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block_table[0, 2]: expected a page in [0, num_blocks = 7)"), std::string::npos)
      << s.message();
  EXPECT_EQ(b.ops.downloads, 1);  // held against the facts, not read again
}

TEST(StepDeviceInputs, PositionsOutOfRangeAreRefused) {
  Batch b;
  b.with_positions();
  b.positions[3] = -2;
  st::DeviceInputFacts f;
  Status s = b.check(&f);
  EXPECT_NE(s.message().find("attention_step: positions[3]: expected 0 <= position, got -2"), std::string::npos)
      << s.message();
  Batch c;
  c.with_positions();
  c.positions[1] = 64;  // cos_sin has 64 rows
  st::DeviceInputFacts g;
  s = c.check(&g);
  EXPECT_NE(s.message().find("positions[1]: expected 0 <= position < cos_sin rows = 64, got 64"), std::string::npos)
      << s.message();
}

TEST(StepDeviceInputs, SlotMappingIsHeldAgainstTheBlockTable) {
  {
    Batch b;
    b.slots[1] += 1;  // not its block-table slot
    b.with_slots();
    st::DeviceInputFacts f;
    const Status s = b.check(&f);
    EXPECT_NE(s.message().find("attention_step: slot_mapping[1]: expected -1 (padded) or the token's block-table slot"),
              std::string::npos)
        << s.message();
  }
  {
    Batch b;
    b.slots[0] = -1;  // a padded token before a real one of the same sequence
    b.with_slots();
    st::DeviceInputFacts f;
    const Status s = b.check(&f);
    EXPECT_NE(s.message().find("slot_mapping[1]: expected -1 like token 0 of sequence 0"), std::string::npos)
        << s.message();
  }
  {
    Batch b;
    b.slots[4] = -1;  // a sequence's last token only: padded in part
    b.with_slots();
    st::DeviceInputFacts f;
    const Status s = b.check(&f);
    EXPECT_NE(s.message().find("slot_mapping[4]: expected the token's block-table slot"), std::string::npos)
        << s.message();
  }
  {
    Batch b;
    b.slots[3] = b.slots[4] = -1;  // sequence 1 padded whole is accepted
    b.with_slots();
    st::DeviceInputFacts f;
    DSA_ASSERT_OK(b.check(&f));
  }
}

TEST(StepDeviceInputs, CapturedAndDeviceLengthStepsReadNothing) {
  Batch b;
  b.table[0] = -1;
  b.with_positions();
  st::DeviceInputFacts f;
  DSA_ASSERT_OK(b.check(&f, /*capturing=*/true));
  EXPECT_EQ(b.ops.downloads, 0);
  b.p.device_lengths = true;
  DSA_ASSERT_OK(b.check(&f));
  EXPECT_EQ(b.ops.downloads, 0);
  EXPECT_FALSE(f.block_table);
}

}  // namespace
}  // namespace dsa
