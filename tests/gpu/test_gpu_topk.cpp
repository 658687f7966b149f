// GPU top-k and index mapping against the CPU backend. The answer is unique (k largest,
// ties to the lower index, NaN lowest, ascending index order, -1 padding), so indices and
// values must match bit for bit. Device lengths and indices cannot be validated: invalid
// ones must behave as documented (lengths clamp to [0, W]; bad indices map to -1).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda/topk_internal.h"
#include "dsa/numerics.h"
#include "gpu_util.h"
#include "oracle/oracle_logits.h"

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

// Runs CPU (host lengths `cpu_len`) and GPU (device lengths `dev_len`), compares exactly;
// row 0 also against the sort-based oracle. bf16: x must hold bf16 values (both backends read
// them as bf16). Returns the kernel the GPU ran.
std::string run_topk(const std::vector<float>& x, int64_t M, int64_t W, int64_t k, const std::vector<int32_t>& dev_len,
                     const std::vector<int32_t>& cpu_len, bool with_values, bool bf16 = false) {
  std::vector<int32_t> ref_idx(static_cast<size_t>(M * k), 12345);
  std::vector<float> ref_val(static_cast<size_t>(M * k), 1.f);
  std::vector<float> hx = x;
  std::vector<uint16_t> hb;
  if (bf16)
    for (float v : x) hb.push_back(float_to_bf16(v));
  std::vector<int32_t> hl = cpu_len;
  TopkParams hp;
  hp.logits = bf16 ? make_tensor(hb.data(), DType::kBF16, {M, W}) : make_tensor(hx.data(), DType::kF32, {M, W});
  hp.lengths = make_tensor(hl.data(), DType::kI32, {M});
  hp.k = k;
  hp.indices = make_tensor(ref_idx.data(), DType::kI32, {M, k});
  if (with_values) hp.values = make_tensor(ref_val.data(), DType::kF32, {M, k});
  std::vector<uint8_t> hws(topk_workspace_size(hp));  // the CPU's per-row key buffers
  hp.workspace = hws.data();
  hp.workspace_bytes = hws.size();
  EXPECT_TRUE(topk(hp).ok());
  if (M > 0 && W > 0) {
    std::vector<float> row0(x.begin(), x.begin() + W);
    if (bf16)
      for (auto& v : row0) v = bf16_to_float(float_to_bf16(v));
    const auto want = oracle::topk_row(row0.data(), cpu_len[0], k);
    for (int64_t j = 0; j < k; ++j) {
      if (want[j] != ref_idx[j]) {
        ADD_FAILURE() << "CPU reference differs from the oracle at slot " << j;
        break;
      }
    }
  }

  DeviceBuffer dl(dev_len), di(M * k * 4, 0x5A), dv(M * k * 4, 0x5A);
  DeviceBuffer dx = bf16 ? DeviceBuffer(hb) : DeviceBuffer(x);
  TopkParams gp = hp;
  gp.logits = dev_tensor(dx, bf16 ? DType::kBF16 : DType::kF32, {M, W});
  gp.lengths = dev_tensor(dl, DType::kI32, {M});
  gp.indices = dev_tensor(di, DType::kI32, {M, k});
  gp.values = with_values ? dev_tensor(dv, DType::kF32, {M, k}) : TensorDesc{};
  const size_t ws = topk_workspace_size(gp);
  DeviceBuffer dws(ws, 0x77);
  gp.workspace = ws ? dws.data() : nullptr;
  gp.workspace_bytes = ws;
  const std::string name = gpu::topk_kernel_name(gp);
  EXPECT_TRUE(topk(gp).ok()) << name;
  EXPECT_EQ(name, last_kernel_name());
  EXPECT_TRUE(device_clean()) << name;
  const auto idx = di.download<int32_t>();
  EXPECT_TRUE(same_bits(idx, ref_idx, "indices")) << name;
  if (with_values) {
    EXPECT_TRUE(same_bits(dv.download<float>(), ref_val, "values")) << name;
  }
  EXPECT_TRUE(topk(gp).ok());
  EXPECT_TRUE(same_bits(di.download<int32_t>(), idx, "repeat run")) << name;
  return name;
}

// Seven rows of W keys built to defeat radix selection: all equal, a flood of one 12-bit bucket,
// last-bit differences, a few above a flood, +-0, -inf runs, NaN.
std::vector<float> adversarial_rows(Rng& rng, int64_t W) {
  std::vector<float> x(static_cast<size_t>(7 * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = 0.75f;
    x[W + j] = 1.f + std::ldexp(static_cast<float>(rng.integer(0, (1 << 20) - 1)), -23);
    x[2 * W + j] = j % 2 ? std::nextafter(1.5f, 2.f) : 1.5f;
    x[3 * W + j] = (j % 9973 == 17) ? 3.f + static_cast<float>(j % 5) : 0.25f;
    x[4 * W + j] = (j % 3 == 0) ? -0.f : (j % 3 == 1 ? 0.f : -1.f);
    x[5 * W + j] = (j / 700) % 2 ? -kInf : static_cast<float>(rng.integer(-2, 2));
    x[6 * W + j] = j % 4 == 0 ? std::numeric_limits<float>::quiet_NaN() : (j % 4 == 1 ? -kInf : rng.normal());
  }
  return x;
}

// Forces a top-k kernel choice (DSA_CUDA_TOPK) for the scope.
struct ScopedTopkKernel : ScopedEnv {
  explicit ScopedTopkKernel(const char* v) : ScopedEnv("DSA_CUDA_TOPK", v) {}
};

// Few rows of at most 262144 keys take the cluster kernel on sm_90, the split elsewhere.
std::string few_rows_kernel() { return device_is_sm90() ? "topk.cluster" : "topk.stream_split"; }

// The cluster kernel under either of its names: CTAs of 64 keys a thread run as 1024 threads
// ("topk.cluster_1024"), which shape a width gets depends on the occupancy calculator.
std::string cluster_family(const std::string& name) { return name == "topk.cluster_1024" ? "topk.cluster" : name; }

// A debug counter of the CUDA top-k (gpu::topk_*_count).
unsigned long long counter(StatusCode (*read)(unsigned long long*)) {
  unsigned long long n = 0;
  EXPECT_EQ(read(&n), StatusCode::kOk);
  return n;
}
unsigned long long fallbacks() { return counter(gpu::topk_fallback_count); }
unsigned long long short_lists() { return counter(gpu::topk_short_list_count); }

std::string run_topk_same(Rng& rng, int64_t M, int64_t W, int64_t k, std::vector<int32_t> len, Fill fill,
                          bool values = true, bool bf16 = false) {
  return run_topk(make_logits(rng, M, W, fill), M, W, k, len, len, values, bf16);
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

// Large buckets at the k-th value: first written for the legacy kernel's 7168-key list (its
// 12-bit bucket: sign, exponent, 3 mantissa bits); for the streaming kernel they put many
// candidates at and around the threshold, with duplicates (ties), shuffled.
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

// Both streaming paths: one block per row (many rows, or rows shorter than 8k) and rows split
// over blocks with a merge (few rows), at k = 64, 2048, 16384 and lengths around k.
TEST(GpuTopk, OneBlockAndSplitPathsAtEveryK) {
  DSA_REQUIRE_GPU();
  Rng rng(21);
  for (int64_t k : {64, 2048, 16384}) {
    const int64_t W = std::max<int64_t>(32768, std::min<int64_t>(16 * k, 131072));  // >= 2 runs of 16384
    const std::vector<int32_t> len = {static_cast<int32_t>(W), 0, 1, static_cast<int32_t>(k - 1), static_cast<int32_t>(k),
                                      static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 1), static_cast<int32_t>(W / 2 + 3)};
    EXPECT_EQ(cluster_family(run_topk_same(rng, 8, W, k, len, Fill::kNormal)), few_rows_kernel()) << k;
    {
      ScopedTopkKernel no_cluster("no_cluster");
      EXPECT_EQ(run_topk_same(rng, 8, W, k, len, Fill::kNormal), "topk.stream_split") << k;
    }
    std::vector<int32_t> many(400);
    for (size_t i = 0; i < many.size(); ++i) many[i] = len[i % len.size()];
    if (k <= 2048) EXPECT_EQ(run_topk_same(rng, 400, W, k, many, Fill::kNormal, false), "topk.stream_rows") << k;
  }
  EXPECT_EQ(run_topk_same(rng, 3, 5000, 2048, {5000, 4097, 2049}, Fill::kNormal),
            device_is_sm90() ? "topk.cluster" : "topk.stream_rows");
  ScopedTopkKernel no_cluster("no_cluster");
  EXPECT_EQ(run_topk_same(rng, 3, 5000, 2048, {5000, 4097, 2049}, Fill::kNormal), "topk.stream_rows");
}

// Ordinary rows never need the fallback: the sampled threshold lands between k and the
// candidate capacity (the streaming path is what these shapes measure).
TEST(GpuTopk, RandomRowsTakeTheStreamingPath) {
  DSA_REQUIRE_GPU();
  Rng rng(22);
  ScopedTopkKernel no_cluster("no_cluster");  // the streaming kernels are what this checks
  const unsigned long long before = fallbacks();
  EXPECT_EQ(run_topk_same(rng, 300, 32768, 2048, std::vector<int32_t>(300, 32768), Fill::kNormal, false), "topk.stream_rows");
  EXPECT_EQ(run_topk_same(rng, 4, 131072, 2048, {131072, 131072, 100000, 65536}, Fill::kNormal), "topk.stream_split");
  EXPECT_EQ(fallbacks(), before);
}

// The stream tests keys against the sampled threshold as floats (setp.ge.f32, no flush):
// thresholds among denormals, among negative values, and above runs of +-0 must select
// exactly what the integer keys do. Few rows split (segments of 16384), many take a row each.
TEST(GpuTopk, StreamThresholdAmongDenormalsNegativesAndZeros) {
  DSA_REQUIRE_GPU();
  Rng rng(31);
  for (const int64_t M : {3, 150}) {
    const int64_t W = M == 3 ? 131072 : 32768;
    std::vector<float> x(static_cast<size_t>(M * W));
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < W; ++j) {
        float& v = x[static_cast<size_t>(i * W + j)];
        const float n = static_cast<float>(rng.normal());
        switch (i % 3) {
          case 0: v = n * 1e-40f; break;  // denormals of both signs
          case 1: v = n - 2.f; break;     // the threshold is negative
          default: {
            const int64_t c = j % 8;
            v = c == 0 ? (j % 16 ? 0.f : -0.f) : c == 1 ? n * 1e-41f : -(1.f + std::fabs(n));
          }
        }
      }
    }
    const std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
    {
      ScopedTopkKernel no_cluster("no_cluster");
      run_topk(x, M, W, 2048, len, len, true);
      run_topk(x, M, W, 2048, len, len, true, /*bf16=*/true);
    }
    run_topk(x, M, W, 2048, len, len, true);  // few rows: the cluster kernel on sm_90
    run_topk(x, M, W, 2048, len, len, true, true);
  }
}

// Candidate-list overflow (every key passes any threshold) and underfill take the exact
// fallback, on both paths; the counter proves the fallback ran.
TEST(GpuTopk, OverflowTakesTheExactFallback) {
  DSA_REQUIRE_GPU();
  const int64_t W = 100000;
  for (const int64_t M : {int64_t{2}, int64_t{300}}) {
    std::vector<float> x(static_cast<size_t>(M * W));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < W; ++j)
        x[i * W + j] = i % 2 ? 2.5f : (j % 50000 == 7 ? 3.f : -0.f);  // all equal; all but a few equal
    const std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
    {
      ScopedTopkKernel no_cluster("no_cluster");
      const unsigned long long before = fallbacks();
      const std::string name = run_topk(x, M, W, 2048, len, len, true);
      EXPECT_EQ(name, M == 2 ? "topk.stream_split" : "topk.stream_rows");
      EXPECT_GT(fallbacks(), before) << name;
    }
    // The cluster kernel has no candidate list: the same rows, exact, and no fallback.
    if (M == 2 && device_is_sm90()) {
      const unsigned long long before = fallbacks();
      EXPECT_EQ(cluster_family(run_topk(x, M, W, 2048, len, len, true)), "topk.cluster");
      EXPECT_EQ(fallbacks(), before);
    }
  }
  // Underfill: the sampled chunks (32 runs of 128 keys spread over the row) hold the row's
  // largest values, so few keys pass the threshold. Rows of W = 65536 on the one-block path.
  const int64_t M = 300, Wr = 65536;
  std::vector<float> x(static_cast<size_t>(M * Wr));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < Wr; ++j) {
      const int64_t c = j / (Wr / 32), off = j % (Wr / 32);
      x[i * Wr + j] = off < 128 ? 100.f + static_cast<float>(c * 128 + off) : static_cast<float>(j % 1000);
    }
  const unsigned long long before = fallbacks();
  const std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(Wr));
  EXPECT_EQ(run_topk(x, M, Wr, 2048, len, len, true), "topk.stream_rows");
  EXPECT_GT(fallbacks(), before);
}

// Rows built to defeat radix selection (as in the CPU suite): 100K keys in one 12-bit bucket,
// keys differing in the last mantissa bit, all but a few equal, signed zeros, -inf runs, NaN.
TEST(GpuTopk, AdversarialRows) {
  DSA_REQUIRE_GPU();
  Rng rng(23);
  const int64_t W = 100000, M = 6;
  std::vector<float> x(static_cast<size_t>(M * W));
  for (int64_t j = 0; j < W; ++j) {
    x[j] = 1.f + std::ldexp(static_cast<float>(rng.integer(0, (1 << 20) - 1)), -23);
    x[W + j] = j % 2 ? std::nextafter(1.5f, 2.f) : 1.5f;
    x[2 * W + j] = (j % 9973 == 17) ? 3.f + static_cast<float>(j % 5) : 0.25f;
    x[3 * W + j] = (j % 3 == 0) ? -0.f : (j % 3 == 1 ? 0.f : -1.f);
    x[4 * W + j] = (j / 700) % 2 ? -kInf : static_cast<float>(rng.integer(-2, 2));
    x[5 * W + j] = j % 4 == 0 ? std::numeric_limits<float>::quiet_NaN() : (j % 4 == 1 ? -kInf : rng.normal());
  }
  for (int64_t k : {64, 2048, 16384}) {
    const std::vector<int32_t> len = {static_cast<int32_t>(W), static_cast<int32_t>(W - 1), static_cast<int32_t>(W),
                                      static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 3), static_cast<int32_t>(W)};
    run_topk(x, M, W, k, len, len, true);
    run_topk(x, M, W, k, len, len, true, true);  // the same rows in bf16
  }
  // NaN below -inf: 20% numbers, 20% -inf, 60% NaN. 100000 keys: numbers only; 30000 keys:
  // every number and -inf, then the lowest-index NaNs.
  std::vector<float> y(static_cast<size_t>(W));
  for (int64_t j = 0; j < W; ++j)
    y[j] = j % 5 == 0 ? rng.normal() : (j % 5 < 3 ? std::numeric_limits<float>::quiet_NaN() : (j % 5 == 3 ? -kInf : std::numeric_limits<float>::quiet_NaN()));
  run_topk(y, 1, W, 16384, {static_cast<int32_t>(W)}, {static_cast<int32_t>(W)}, true);
  run_topk(y, 1, W, 16384, {30000}, {30000}, true);  // 12000 numbers and -inf, then NaNs
}

// Rows of 1,048,576 keys (split over blocks), f32 and bf16, k = 2048 and 16384.
TEST(GpuTopk, MillionKeyRows) {
  DSA_REQUIRE_GPU();
  Rng rng(24);
  const int64_t W = 1048576;
  const std::vector<int32_t> len = {static_cast<int32_t>(W), static_cast<int32_t>(W - 7), 131073};
  EXPECT_EQ(run_topk_same(rng, 3, W, 2048, len, Fill::kNormal), "topk.stream_split");
  EXPECT_EQ(run_topk_same(rng, 3, W, 2048, len, Fill::kNormal, true, true), "topk.stream_split");
  EXPECT_EQ(run_topk_same(rng, 2, W, 16384, {static_cast<int32_t>(W), 600000}, Fill::kNormal), "topk.stream_split");
  EXPECT_EQ(run_topk_same(rng, 2, W, 2048, {static_cast<int32_t>(W), 900000}, Fill::kFewLevels), "topk.stream_split");
}

// bf16 logits on both paths, with ties, NaN, +-inf and signed zeros; odd widths (unaligned rows).
TEST(GpuTopk, Bf16Rows) {
  DSA_REQUIRE_GPU();
  Rng rng(25);
  run_topk_same(rng, 7, 5003, 2048, {0, 1, 2047, 2048, 2049, 5003, 5001}, Fill::kNormal, true, true);
  run_topk_same(rng, 6, 40001, 2048, {40001, 40000, 39999, 2049, 30000, 12345}, Fill::kSpecials, true, true);
  run_topk_same(rng, 300, 9001, 64, std::vector<int32_t>(300, 9001), Fill::kNormal, true, true);
}

// DSA_CUDA_TOPK=fused_split: split rows in one launch (the row's last segment block merges).
// The same exactness as the two-launch split at its edge shapes: lengths around k, empty and
// one-key rows, ties, specials, one-bucket floods, 1M-key rows, bf16; reruns bit-identical.
// Plain CUDA, so it runs on every device the suite runs on.

TEST(GpuTopk, FusedSplitMatchesAtEdgeShapes) {
  DSA_REQUIRE_GPU();
  ScopedTopkKernel force("fused_split");
  Rng rng(31);
  for (int64_t k : {64, 2048, 16384}) {
    const int64_t W = std::max<int64_t>(32768, std::min<int64_t>(16 * k, 131072));
    const std::vector<int32_t> len = {static_cast<int32_t>(W), 0, 1, static_cast<int32_t>(k - 1), static_cast<int32_t>(k),
                                      static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 1), static_cast<int32_t>(W / 2 + 3)};
    EXPECT_EQ(run_topk_same(rng, 8, W, k, len, Fill::kNormal), "topk.fused_split") << k;
    EXPECT_EQ(run_topk_same(rng, 8, W, k, len, Fill::kFewLevels, false), "topk.fused_split") << k;
    EXPECT_EQ(run_topk_same(rng, 8, W, k, len, Fill::kSpecials, true, true), "topk.fused_split") << k;
  }
  // The benchmark shape (64 x 65536, k 2048), every row a different length class.
  std::vector<int32_t> len64(64);
  for (int i = 0; i < 64; ++i) len64[i] = i % 4 == 0 ? 65536 : (i % 4 == 1 ? 65536 - i : (i % 4 == 2 ? 2049 + 997 * i : 2047 + i % 3));
  EXPECT_EQ(run_topk_same(rng, 64, 65536, 2048, len64, Fill::kNormal, false), "topk.fused_split");
  // Adversarial rows of 100000 keys: all equal, a 100K flood of one 12-bit bucket, last-bit
  // differences, a few above a flood, +-0, -inf runs, NaN.
  const int64_t W = 100000, M = 7;
  const std::vector<float> x = adversarial_rows(rng, W);
  for (int64_t k : {64, 2048}) {
    const std::vector<int32_t> len = {static_cast<int32_t>(W), static_cast<int32_t>(W), static_cast<int32_t>(W - 1),
                                      static_cast<int32_t>(W), static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 3),
                                      static_cast<int32_t>(W)};
    EXPECT_EQ(run_topk(x, M, W, k, len, len, true), "topk.fused_split") << k;
    EXPECT_EQ(run_topk(x, M, W, k, len, len, true, true), "topk.fused_split") << k;
  }
  // Rows of 1,048,576 keys (8 or more segments per row).
  const int64_t WM = 1048576;
  const std::vector<int32_t> lm = {static_cast<int32_t>(WM), static_cast<int32_t>(WM - 7), 131073};
  EXPECT_EQ(run_topk_same(rng, 3, WM, 2048, lm, Fill::kNormal), "topk.fused_split");
  EXPECT_EQ(run_topk_same(rng, 3, WM, 2048, lm, Fill::kNormal, true, true), "topk.fused_split");
  EXPECT_EQ(run_topk_same(rng, 2, WM, 16384, {static_cast<int32_t>(WM), 600000}, Fill::kNormal), "topk.fused_split");
  EXPECT_EQ(run_topk_same(rng, 2, WM, 2048, {static_cast<int32_t>(WM), 900000}, Fill::kFewLevels), "topk.fused_split");
  // Rows the split never takes keep their kernel under the switch.
  EXPECT_EQ(run_topk_same(rng, 3, 5000, 2048, {5000, 4097, 2049}, Fill::kNormal), "topk.stream_rows");
}

// The cluster kernel (sm_90; chosen for few rows of <= 262144 keys, forced here for any row
// count): chunk shapes (widths 1000 to 262144: clusters of 1-8 CTAs of 8-64 keys a thread,
// chunks that are not whole 16-byte loads of bf16, CTAs past the row's length), lengths
// around k, empty and one-key rows, odd widths (unaligned rows), ties,
// specials, one-bucket floods, last-bit differences, signed zeros, -inf runs, NaN, bf16, k up
// to 16384; reruns bit-identical; many rows (several waves of clusters).
TEST(GpuTopk, ClusterMatchesAtEdgeShapes) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  ScopedTopkKernel force("cluster");
  Rng rng(41);
  for (int64_t k : {64, 2048, 16384}) {
    for (int64_t W : {int64_t{1000}, int64_t{5000}, int64_t{16383}, int64_t{16385}, int64_t{30000}, int64_t{65536},
                      int64_t{131071}, int64_t{196608}, int64_t{262144}}) {
      if (W <= k) continue;
      const int32_t w = static_cast<int32_t>(W), kk = static_cast<int32_t>(k);
      const std::vector<int32_t> len = {w, 0, 1, kk - 1, kk, kk + 1, w - 1, w / 2 + 3, std::min(w, 16385), std::min(w, 8191)};
      const int64_t M = static_cast<int64_t>(len.size());
      EXPECT_EQ(cluster_family(run_topk_same(rng, M, W, k, len, Fill::kNormal)), "topk.cluster") << k << " " << W;
      EXPECT_EQ(cluster_family(run_topk_same(rng, M, W, k, len, Fill::kFewLevels, false)), "topk.cluster") << k << " " << W;
      EXPECT_EQ(cluster_family(run_topk_same(rng, M, W, k, len, Fill::kSpecials, true, true)), "topk.cluster") << k << " " << W;
    }
  }
  const int64_t W = 100000, M = 7;
  const std::vector<float> x = adversarial_rows(rng, W);
  for (int64_t k : {64, 2048, 16384}) {
    const std::vector<int32_t> len = {static_cast<int32_t>(W), static_cast<int32_t>(W), static_cast<int32_t>(W - 1),
                                      static_cast<int32_t>(W), static_cast<int32_t>(k + 1), static_cast<int32_t>(W - 3),
                                      static_cast<int32_t>(W)};
    EXPECT_EQ(cluster_family(run_topk(x, M, W, k, len, len, true)), "topk.cluster") << k;
    EXPECT_EQ(cluster_family(run_topk(x, M, W, k, len, len, true, true)), "topk.cluster") << k;
  }
  // Many rows: far more clusters than fit at once.
  std::vector<int32_t> many(600);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>(i % 7 == 0 ? 2047 : 65536 - (i * 37) % 4000);
  EXPECT_EQ(cluster_family(run_topk_same(rng, 600, 65536, 2048, many, Fill::kNormal, false)), "topk.cluster");
  // Wider rows keep the other kernels under the switch.
  EXPECT_EQ(run_topk_same(rng, 2, 262145, 2048, {262145, 262000}, Fill::kNormal), "topk.stream_split");
}

// The cluster kernel's first pass counts only keys above a floor taken from a 1-in-16 sample
// (positions p with p % 16 == 0: every chunk starts at a multiple of 16). Rows whose sampled
// positions hold their largest values put fewer than k keys above the floor: the kernel must
// count the first pass again from key 0 (the fallback counter shows it ran) and still give the
// exact answer.
TEST(GpuTopk, ClusterSampleMissTakesTheFullHistogram) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  Rng rng(43);
  const int64_t M = 4, W = 65536;
  for (const bool bf16 : {false, true}) {
    std::vector<float> x(static_cast<size_t>(M * W));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < W; ++j) x[i * W + j] = j % 16 == 0 ? 1000.f + static_cast<float>(j % 4096) : rng.normal();
    const std::vector<int32_t> len = {static_cast<int32_t>(W), static_cast<int32_t>(W - 5), 40000, 20000};
    const unsigned long long before = fallbacks();
    EXPECT_EQ(cluster_family(run_topk(x, M, W, 2048, len, len, true, bf16)), "topk.cluster") << bf16;
    EXPECT_GT(fallbacks(), before) << bf16;
  }
  // Ordinary rows never need it.
  const unsigned long long before = fallbacks();
  EXPECT_EQ(cluster_family(run_topk_same(rng, 64, 65536, 2048, std::vector<int32_t>(64, 65536), Fill::kNormal)), "topk.cluster");
  EXPECT_EQ(fallbacks(), before);
}

// DSA_CUDA_TOPK=no_floor: the cluster kernel without its sample round (the first pass over
// every key, in bins of their top 12 bits) gives the same answers, ties, specials and one-bucket floods included.
TEST(GpuTopk, ClusterWithoutTheFloorMatches) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  ScopedTopkKernel force("no_floor");
  Rng rng(44);
  const std::vector<int32_t> len = {65536, 65535, 2049, 2048, 40000, 1, 0, 30001};
  EXPECT_EQ(cluster_family(run_topk_same(rng, 8, 65536, 2048, len, Fill::kNormal)), "topk.cluster");
  EXPECT_EQ(cluster_family(run_topk_same(rng, 8, 65536, 2048, len, Fill::kFewLevels)), "topk.cluster");
  EXPECT_EQ(cluster_family(run_topk_same(rng, 8, 65536, 64, len, Fill::kSpecials, true, true)), "topk.cluster");
  std::vector<float> x = adversarial_rows(rng, 100000);
  x.resize(2 * 100000);  // all equal; a flood of one 12-bit bucket
  EXPECT_EQ(cluster_family(run_topk(x, 2, 100000, 16384, {100000, 99999}, {100000, 99999}, true)), "topk.cluster");
}

// The cluster kernel's chunks of 64 keys a thread in both forms: 1024 threads of 32 keys (the
// default; DSA_CUDA_TOPK_WIDE empty acts as unset) and 512 threads of 64 (DSA_CUDA_TOPK_WIDE=512).
// Forced to chunks of 64 keys a thread (2 CTAs a row at 65536 keys, 8 at 262144): lengths
// around k at k 64 / 2048 / 16384, ties, specials, bf16, one-bucket floods, a sample miss (the
// fallback counter moves), many rows; reruns bit-identical (run_topk).
TEST(GpuTopk, ClusterAt64KeysAThreadMatchesInBothForms) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  ScopedTopkKernel force("cluster");
  Rng rng(45);
  for (const auto& form : {std::pair<const char*, std::string>{"", "topk.cluster_1024"}, {"512", "topk.cluster"}}) {
    SCOPED_TRACE(form.second);
    ScopedEnv wide("DSA_CUDA_TOPK_WIDE", form.first);
    const std::string& name = form.second;
    {
      ScopedEnv ctas("DSA_CUDA_TOPK_CTAS", "2");
      const int64_t W = 65536;
      for (int64_t k : {64, 2048, 16384}) {
        const int32_t kk = static_cast<int32_t>(k);
        const std::vector<int32_t> len = {65536, 0, 1, kk - 1, kk, kk + 1, 65535, 32771, 16385, 40000};
        const int64_t M = static_cast<int64_t>(len.size());
        EXPECT_EQ(run_topk_same(rng, M, W, k, len, Fill::kNormal), name) << k;
        EXPECT_EQ(run_topk_same(rng, M, W, k, len, Fill::kFewLevels, false), name) << k;
        EXPECT_EQ(run_topk_same(rng, M, W, k, len, Fill::kSpecials, true, true), name) << k;
      }
      std::vector<float> x = adversarial_rows(rng, W);
      const int64_t M = static_cast<int64_t>(x.size()) / W;
      const std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
      EXPECT_EQ(run_topk(x, M, W, 2048, len, len, true), name);
      EXPECT_EQ(run_topk(x, M, W, 2048, len, len, true, true), name);
      // Sampled positions hold every row's largest values: the first pass is counted again.
      std::vector<float> miss(static_cast<size_t>(4 * W));
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < W; ++j) miss[i * W + j] = j % 16 == 0 ? 1000.f + static_cast<float>(j % 4096) : rng.normal();
      const std::vector<int32_t> mlen = {65536, 65531, 40000, 20000};
      const unsigned long long before = fallbacks();
      EXPECT_EQ(run_topk(miss, 4, W, 2048, mlen, mlen, true), name);
      EXPECT_GT(fallbacks(), before);
      EXPECT_EQ(run_topk_same(rng, 300, W, 2048, std::vector<int32_t>(300, 65536), Fill::kNormal, false), name);
    }
    const std::vector<int32_t> wide_len = {262144, 262143, 200000, 131073, 2049};
    EXPECT_EQ(run_topk_same(rng, 5, 262144, 2048, wide_len, Fill::kNormal), name);
    EXPECT_EQ(run_topk_same(rng, 5, 262144, 16384, wide_len, Fill::kFewLevels, true, true), name);
  }
}

// A small case of the default 64-keys-a-thread form (1024 threads of 32) for the sanitizer
// subsets (scripts/sanitizer-*.txt): two rows of one cluster of 2 CTAs, normal and special values.
TEST(GpuTopk, ClusterAt1024ThreadsSanitizerSmall) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  ScopedTopkKernel force("cluster");
  ScopedEnv ctas("DSA_CUDA_TOPK_CTAS", "2");
  Rng rng(46);
  EXPECT_EQ(run_topk_same(rng, 2, 65536, 2048, {65536, 40001}, Fill::kNormal), "topk.cluster_1024");
  EXPECT_EQ(run_topk_same(rng, 2, 65536, 64, {65535, 2049}, Fill::kSpecials, true, true), "topk.cluster_1024");
}

// The cluster kernel settles a chosen bin of at most 32 keys from its short list (one warp ranks
// the cluster's entries by key, then position) instead of counting it once more; DSA_CUDA_TOPK_LIST=off
// always counts. Rows built so that the k-th key falls in a bin of exactly n keys (value 5 and
// its next floats, at positions spread over both CTAs of the row, none sampled), k - need keys
// above it and capped normals below: ties inside the list, ties across CTAs, distinct values,
// n around the list's capacity (33 and 40 take another pass first). Both settings give the CPU's answer
// (run_topk: bits of indices and values, reruns bit-identical); the counter shows which ran.
// Rows 0-3: n equal keys; two values alternating; n distinct values out of position order; the
// alternation the other way, with need = n - 1 (rows 2 and 3 too).
TEST(GpuTopk, ClusterShortListSettlesTheLastBin) {
  DSA_REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "the cluster kernel runs on sm_90 only";
  ScopedTopkKernel force("cluster");
  ScopedEnv ctas("DSA_CUDA_TOPK_CTAS", "2");
  Rng rng(47);
  const int64_t W = 65536, k = 2048, M = 4;
  const std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
  const float ulp = std::nextafter(5.f, 6.f) - 5.f;
  for (const char* setting : {"", "off"}) {
    SCOPED_TRACE(setting);
    ScopedEnv list("DSA_CUDA_TOPK_LIST", setting);
    const bool on = setting[0] == '\0';
    unsigned long long before = short_lists();
    EXPECT_EQ(run_topk_same(rng, 8, W, k, {65536, 65535, 40000, 32769, 2049, 65536, 50001, 60000}, Fill::kNormal),
              "topk.cluster_1024");
    if (on) {
      EXPECT_GT(short_lists(), before);
    } else {
      EXPECT_EQ(short_lists(), before);
    }
    for (const int n : {2, 3, 9, 20, 31, 32, 33, 40}) {
      SCOPED_TRACE(n);
      std::vector<float> x(static_cast<size_t>(M * W));
      for (int64_t i = 0; i < M; ++i) {
        float* row = x.data() + i * W;
        for (int64_t j = 0; j < W; ++j) row[j] = std::min(static_cast<float>(rng.normal()), 4.f);
        const int need = i == 0 ? std::max(1, n / 2) : i == 1 ? std::max(1, n / 3) : n - 1;
        for (int64_t j = 0; j < k - need; ++j) row[j * 32 + 3] = 100.f + 0.001f * static_cast<float>(j);
        for (int e = 0; e < n; ++e) {
          const float step = i == 0 ? 0.f : i == 1 ? static_cast<float>(e % 2) : i == 2 ? static_cast<float>((e * 7) % n)
                                                                                             : static_cast<float>(1 - e % 2);
          row[(static_cast<int64_t>(e) * W / n) / 32 * 32 + 17] = 5.f + step * ulp;
        }
      }
      for (const bool bf16 : {false, true}) {
        before = short_lists();
        EXPECT_EQ(run_topk(x, M, W, k, len, len, true, bf16), "topk.cluster_1024") << bf16;
        // run_topk launches twice (the rerun), so each listed row counts twice. n <= 32: every
        // row settles from the list after the first pass. n > 32: the second pass counts 4-ulp
        // bins, where the equal and alternating rows still hold n keys (a third pass, one value),
        // but row 2's n distinct f32 values leave 4 keys in the k-th key's bin: listed there (the
        // H100 run of 2026-12-06 counted exactly that row). In bf16 they are one value.
        const unsigned long long listed = n <= 32 ? static_cast<unsigned long long>(2 * M) : (bf16 ? 0ull : 2ull);
        EXPECT_EQ(short_lists() - before, on ? listed : 0ull) << bf16;
      }
    }
  }
}

// The default choice: the benchmark's decode-like shape (64 rows of 65536) takes the cluster
// kernel on sm_90, every row a different length class; many rows stream a row per block.
TEST(GpuTopk, FewRowsTakeTheClusterKernel) {
  DSA_REQUIRE_GPU();
  Rng rng(42);
  std::vector<int32_t> len64(64);
  for (int i = 0; i < 64; ++i) len64[i] = i % 4 == 0 ? 65536 : (i % 4 == 1 ? 65536 - i : (i % 4 == 2 ? 2049 + 997 * i : 2047 + i % 3));
  EXPECT_EQ(cluster_family(run_topk_same(rng, 64, 65536, 2048, len64, Fill::kNormal, false)), few_rows_kernel());
  EXPECT_EQ(cluster_family(run_topk_same(rng, 64, 65536, 2048, len64, Fill::kNormal, true, true)), few_rows_kernel());
  EXPECT_EQ(run_topk_same(rng, 600, 65536, 2048, std::vector<int32_t>(600, 65536), Fill::kNormal, false),
            "topk.stream_rows");
}

// The planner sizes a chunk's scratch for its largest row count and reuses it for fewer rows:
// the CUDA size must not grow as M or W shrink.
TEST(GpuTopk, WorkspaceSizeIsNonDecreasing) {
  DSA_REQUIRE_GPU();
  DeviceBuffer any(64);
  size_t last = 0;
  for (int64_t M : {1, 2, 63, 64, 65, 131, 132, 133, 264, 265, 4096}) {
    TopkParams p;
    p.logits = dev_tensor(any, DType::kF32, {M, 65536});
    p.lengths = dev_tensor(any, DType::kI32, {M});
    p.k = 2048;
    p.indices = dev_tensor(any, DType::kI32, {M, 2048});
    const size_t ws = topk_workspace_size(p);
    EXPECT_GE(ws, last) << M;
    last = ws;
  }
  size_t lw = 0;
  for (int64_t W : {2048, 4096, 16383, 16384, 131072, 131073, 1048576}) {
    TopkParams p;
    p.logits = dev_tensor(any, DType::kF32, {64, W});
    p.lengths = dev_tensor(any, DType::kI32, {64});
    p.k = 2048;
    p.indices = dev_tensor(any, DType::kI32, {64, 2048});
    const size_t ws = topk_workspace_size(p);
    EXPECT_GE(ws, lw) << W;
    lw = ws;
  }
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
