// GPU top-k and index mapping against the CPU backend. The answer is unique (k largest,
// ties to the lower index, NaN lowest, ascending index order, -1 padding), so indices and
// values must match bit for bit. Device lengths and indices cannot be validated: invalid
// ones must behave as documented (lengths clamp to [0, W]; bad indices map to -1).
#include <climits>
#include <cmath>
#include <limits>

#include "gpu_util.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

enum class Fill { kNormal, kFewLevels, kSpecials };

std::vector<float> make_logits(Rng& rng, int64_t M, int64_t W, Fill fill) {
  std::vector<float> x(static_cast<size_t>(M * W));
  for (auto& v : x) {
    switch (fill) {
      case Fill::kNormal: v = rng.normal(); break;
      case Fill::kFewLevels: v = static_cast<float>(rng.integer(0, 9)) * 0.25f; break;
      case Fill::kSpecials: {
        const int64_t c = rng.integer(0, 15);
        v = c == 0 ? std::numeric_limits<float>::quiet_NaN()
            : c == 1 ? -kInf
            : c == 2 ? kInf
            : c == 3 ? -0.f
            : c == 4 ? 0.f
            : c == 5 ? -std::numeric_limits<float>::quiet_NaN()
            : static_cast<float>(rng.integer(-3, 3));
        break;
      }
    }
  }
  return x;
}

// Runs CPU (host lengths `cpu_len`) and GPU (device lengths `dev_len`), compares exactly.
void run_topk(const std::vector<float>& x, int64_t M, int64_t W, int64_t k, const std::vector<int32_t>& dev_len,
              const std::vector<int32_t>& cpu_len, bool with_values) {
  std::vector<int32_t> ref_idx(static_cast<size_t>(M * k), 12345);
  std::vector<float> ref_val(static_cast<size_t>(M * k), 1.f);
  std::vector<float> hx = x;
  std::vector<int32_t> hl = cpu_len;
  TopkParams hp;
  hp.logits = make_tensor(hx.data(), DType::kF32, {M, W});
  hp.lengths = make_tensor(hl.data(), DType::kI32, {M});
  hp.k = k;
  hp.indices = make_tensor(ref_idx.data(), DType::kI32, {M, k});
  if (with_values) hp.values = make_tensor(ref_val.data(), DType::kF32, {M, k});
  std::vector<uint8_t> hws(topk_workspace_size(hp));  // the CPU's per-row key buffers
  hp.workspace = hws.data();
  hp.workspace_bytes = hws.size();
  DSA_ASSERT_OK(topk(hp));

  DeviceBuffer dx(x), dl(dev_len), di(M * k * 4, 0x5A), dv(M * k * 4, 0x5A);
  TopkParams gp = hp;
  gp.logits = dev_tensor(dx, DType::kF32, {M, W});
  gp.lengths = dev_tensor(dl, DType::kI32, {M});
  gp.indices = dev_tensor(di, DType::kI32, {M, k});
  gp.values = with_values ? dev_tensor(dv, DType::kF32, {M, k}) : TensorDesc{};
  const size_t ws = topk_workspace_size(gp);
  DeviceBuffer dws(ws);
  gp.workspace = dws.data();
  gp.workspace_bytes = ws;
  DSA_ASSERT_OK(topk(gp));
  ASSERT_TRUE(device_clean());
  const auto idx = di.download<int32_t>();
  ASSERT_TRUE(same_bits(idx, ref_idx, "indices"));
  if (with_values) {
    EXPECT_TRUE(same_bits(dv.download<float>(), ref_val, "values"));
  }
  DSA_ASSERT_OK(topk(gp));
  EXPECT_TRUE(same_bits(di.download<int32_t>(), idx, "repeat run"));
}

void run_topk_same(Rng& rng, int64_t M, int64_t W, int64_t k, std::vector<int32_t> len, Fill fill, bool values = true) {
  run_topk(make_logits(rng, M, W, fill), M, W, k, len, len, values);
}

}  // namespace

TEST(GpuTopk, LengthsAroundK) {
  DSA_REQUIRE_GPU();
  Rng rng(1);
  run_topk_same(rng, 7, 5000, 2048, {0, 1, 2047, 2048, 2049, 4999, 5000}, Fill::kNormal);
  run_topk_same(rng, 4, 64, 64, {0, 63, 64, 64}, Fill::kNormal);
  run_topk_same(rng, 3, 200, 64, {65, 130, 200}, Fill::kNormal, false);
  run_topk_same(rng, 1, 0, 64, {0}, Fill::kNormal);
}

TEST(GpuTopk, TiesNaNInfAndSignedZeros) {
  DSA_REQUIRE_GPU();
  Rng rng(2);
  run_topk_same(rng, 6, 3000, 256, {3000, 2999, 1500, 257, 256, 1000}, Fill::kFewLevels);
  run_topk_same(rng, 6, 3000, 256, {3000, 2999, 1500, 257, 256, 1000}, Fill::kSpecials);
  // All NaN, all equal, all -inf: ties resolve to the lowest indices.
  const int64_t W = 1000;
  std::vector<float> x(static_cast<size_t>(3 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = std::numeric_limits<float>::quiet_NaN();
    x[W + j] = 1.5f;
    x[2 * W + j] = j % 2 ? -kInf : std::numeric_limits<float>::quiet_NaN();
  }
  run_topk(x, 3, W, 128, {1000, 1000, 1000}, {1000, 1000, 1000}, true);
}

TEST(GpuTopk, LargeK16384Over128K) {
  DSA_REQUIRE_GPU();
  Rng rng(3);
  run_topk_same(rng, 2, 131072, 16384, {131072, 100000}, Fill::kNormal);
  run_topk_same(rng, 4, 131072, 2048, {131072, 131071, 65536, 2049}, Fill::kFewLevels);
}

TEST(GpuTopk, Prefill16KRows) {
  DSA_REQUIRE_GPU();
  Rng rng(4);
  const int64_t M = 16384, W = 8192;
  std::vector<int32_t> len(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) len[i] = static_cast<int32_t>((i * 7919) % (W + 1));
  run_topk_same(rng, M, W, 2048, len, Fill::kNormal, false);
}

// The kernel keeps the keys of the k-th value's 12-bit bucket (sign, exponent, 3 mantissa bits)
// in a 7168-entry shared list; a larger bucket reads the row instead. Buckets just below, at
// and above that size, with duplicates (ties) among them, shuffled.
TEST(GpuTopk, CandidateBucketAroundSharedCapacity) {
  DSA_REQUIRE_GPU();
  Rng rng(7);
  const int64_t k = 2048, above = 1000, below = 5000;
  for (const int64_t bucket : {int64_t{7167}, int64_t{7168}, int64_t{7169}, int64_t{30000}}) {
    const int64_t W = above + bucket + below;
    std::vector<float> x;
    for (int64_t j = 0; j < above; ++j) x.push_back(4.f + static_cast<float>(j % 7));
    // [1, 1.125) is one bucket; pairs of equal values make ties at the threshold.
    for (int64_t j = 0; j < bucket; ++j) x.push_back(1.f + std::ldexp(static_cast<float>(j / 2), -23));
    for (int64_t j = 0; j < below; ++j) x.push_back(j % 3 ? 0.5f : -kInf);
    for (int64_t j = W - 1; j > 0; --j) std::swap(x[j], x[rng.integer(0, j)]);
    const std::vector<int32_t> len = {static_cast<int32_t>(W)};
    run_topk(x, 1, W, k, len, len, true);
  }
  // All equal (and all NaN) over a row far larger than the list: lowest indices win.
  const int64_t W = 20000;
  std::vector<float> x(static_cast<size_t>(2 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = -0.f;
    x[W + j] = std::numeric_limits<float>::quiet_NaN();
  }
  x[W / 2] = 0.f;  // ties with -0
  run_topk(x, 2, W, 1024, {static_cast<int32_t>(W), static_cast<int32_t>(W - 3)},
           {static_cast<int32_t>(W), static_cast<int32_t>(W - 3)}, true);
}

// Rows of odd width start at every 16-byte alignment; lengths leave 0-3 tail elements and
// rows shorter than the aligned head plus one vector.
TEST(GpuTopk, UnalignedRowsAndOddLengths) {
  DSA_REQUIRE_GPU();
  Rng rng(8);
  run_topk_same(rng, 8, 5001, 2048, {5001, 5000, 4999, 4998, 4997, 2049, 2050, 2051}, Fill::kNormal);
  run_topk_same(rng, 8, 71, 64, {65, 66, 67, 68, 69, 70, 71, 71}, Fill::kNormal);
  run_topk_same(rng, 7, 9999, 64, {9999, 9998, 9997, 9996, 65, 66, 67}, Fill::kSpecials);
}

// Device lengths outside [0, W] clamp: negative selects nothing, past W selects within W.
TEST(GpuTopk, InvalidDeviceLengthsClamp) {
  DSA_REQUIRE_GPU();
  Rng rng(5);
  const int64_t W = 3000, k = 1024;
  const std::vector<int32_t> dev = {INT_MIN, -2, -1, static_cast<int32_t>(W + 1), static_cast<int32_t>(W + 2), INT_MAX};
  std::vector<int32_t> cpu(dev.size());
  for (size_t i = 0; i < dev.size(); ++i) cpu[i] = dev[i] < 0 ? 0 : static_cast<int32_t>(W);
  const int64_t M = static_cast<int64_t>(dev.size());
  run_topk(make_logits(rng, M, W, Fill::kNormal), M, W, k, dev, cpu, true);
}

namespace {

void run_map(const std::vector<int32_t>& idx, int64_t M, int64_t K, const MapIndicesParams& shape,
             const std::vector<int32_t>& kv_start, const std::vector<int32_t>& table, const std::vector<int32_t>& row_seq,
             const std::vector<int32_t>* expect_override) {
  std::vector<int32_t> ref(static_cast<size_t>(M * K), 777);
  std::vector<int32_t> hi = idx, hks = kv_start, ht = table, hrs = row_seq;
  const int64_t B = shape.kind == IndexMapKind::kFlat ? static_cast<int64_t>(kv_start.size()) : shape.block_table.shape[0];
  const int64_t max_blocks = shape.kind == IndexMapKind::kPaged ? shape.block_table.shape[1] : 0;
  MapIndicesParams hp = shape;
  hp.indices = make_tensor(hi.data(), DType::kI32, {M, K});
  hp.out = make_tensor(ref.data(), DType::kI32, {M, K});
  if (!row_seq.empty()) hp.row_seq = make_tensor(hrs.data(), DType::kI32, {M});
  if (shape.kind == IndexMapKind::kFlat) hp.kv_start = make_tensor(hks.data(), DType::kI32, {B});
  else hp.block_table = make_tensor(ht.data(), DType::kI32, {B, max_blocks});
  if (!expect_override) DSA_ASSERT_OK(map_indices(hp));
  const std::vector<int32_t>& expect = expect_override ? *expect_override : ref;

  DeviceBuffer di(idx), dout(M * K * 4, 0x5A), dks(kv_start), dt(table), drs(row_seq);
  MapIndicesParams gp = hp;
  gp.indices = dev_tensor(di, DType::kI32, {M, K});
  gp.out = dev_tensor(dout, DType::kI32, {M, K});
  if (!row_seq.empty()) gp.row_seq = dev_tensor(drs, DType::kI32, {M});
  if (shape.kind == IndexMapKind::kFlat) gp.kv_start = dev_tensor(dks, DType::kI32, {B});
  else gp.block_table = dev_tensor(dt, DType::kI32, {B, max_blocks});
  DSA_ASSERT_OK(map_indices(gp));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same_bits(dout.download<int32_t>(), expect, "mapped"));
  // In place (out aliases indices).
  gp.out = gp.indices;
  DSA_ASSERT_OK(map_indices(gp));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same_bits(di.download<int32_t>(), expect, "mapped in place"));
}

}  // namespace

TEST(GpuMap, FlatAndPagedMatchCpuWithEveryInvalidCandidate) {
  DSA_REQUIRE_GPU();
  Rng rng(6);
  const int64_t page = 64, max_blocks = 5, B = 3, rows_per_seq = 2, M = B * rows_per_seq, K = 128;
  const int64_t len = max_blocks * page;
  std::vector<int32_t> idx(static_cast<size_t>(M * K));
  for (auto& v : idx) v = static_cast<int32_t>(rng.integer(0, len - 1));
  const int32_t bad[] = {INT_MIN, -2, -1, static_cast<int32_t>(len), static_cast<int32_t>(len + 1), INT_MAX};
  for (int64_t i = 0; i < M; ++i)
    for (int b = 0; b < 6; ++b) idx[i * K + b * 7] = bad[b];
  std::vector<int32_t> table(static_cast<size_t>(B * max_blocks));
  for (auto& t : table) t = static_cast<int32_t>(rng.integer(0, 1000));
  table[1 * max_blocks + 2] = -1;  // an unallocated block: its positions map to -1
  const std::vector<int32_t> kv_start = {0, 1000, 5000};

  MapIndicesParams paged;
  paged.kind = IndexMapKind::kPaged;
  paged.page_size = page;
  paged.rows_per_seq = rows_per_seq;
  paged.block_table = make_tensor(table.data(), DType::kI32, {B, max_blocks});
  run_map(idx, M, K, paged, {}, table, {}, nullptr);

  // Flat: positions within the sequences (the flat map has no table to bound j).
  std::vector<int32_t> fidx = idx;
  for (auto& v : fidx) if (v >= len) v = -1;
  MapIndicesParams flat;
  flat.kind = IndexMapKind::kFlat;
  flat.rows_per_seq = rows_per_seq;
  run_map(fidx, M, K, flat, kv_start, {}, {}, nullptr);

  // row_seq form.
  std::vector<int32_t> rs = {2, 0, 1, 1, 0, 2};
  run_map(idx, M, K, paged, {}, table, rs, nullptr);
}

// Device-only: invalid row_seq entries and flat addresses past INT32_MAX map to -1.
TEST(GpuMap, InvalidDeviceRowsAndOverflowGiveMinusOne) {
  DSA_REQUIRE_GPU();
  const int64_t M = 4, K = 64;
  std::vector<int32_t> idx(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M * K; ++i) idx[i] = static_cast<int32_t>(i % K);
  idx[3 * K + 5] = INT_MAX;
  std::vector<int32_t> rs = {-1, 2, INT_MAX, 0};
  std::vector<int32_t> kv_start = {100, INT_MAX - 10};
  std::vector<int32_t> expect(static_cast<size_t>(M * K), -1);
  for (int64_t c = 0; c < K; ++c) expect[3 * K + c] = 100 + static_cast<int32_t>(c);
  expect[3 * K + 5] = -1;  // 100 + INT_MAX does not fit
  MapIndicesParams flat;
  flat.kind = IndexMapKind::kFlat;
  // row 1 -> sequence 2 (does not exist) -> -1.
  run_map(idx, M, K, flat, kv_start, {}, rs, &expect);
}
