// Core types, status messages, geometry presets and argument checking.
#include <gtest/gtest.h>

#include "core/kernel_name.h"
#include "core/validate.h"
#include "test_util.h"

using namespace dsa;

TEST(Core, VersionAndBackends) {
  EXPECT_STREQ(version(), "0.1.0");
  auto b = compiled_backends();
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b[0], "cpu");
  auto devs = list_devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_EQ(devs[0].device.type, DeviceType::kCPU);
}

// dsa::last_kernel_name: a CPU op clears what a launcher set (the GPU suite checks the names).
TEST(Core, LastKernelNameClearedByCpuOps) {
  core::set_last_kernel_name("test.kernel");
  EXPECT_STREQ(last_kernel_name(), "test.kernel");
  std::vector<float> x(4 * 8, 1.0f), scale(4);
  std::vector<uint8_t> q(4 * 8);
  QuantizeFp8Params p;
  p.x = make_tensor(x.data(), DType::kF32, {4, 8}, cpu_device());
  p.out = make_tensor(q.data(), DType::kE4M3, {4, 8}, cpu_device());
  p.scale = make_tensor(scale.data(), DType::kF32, {4, 1}, cpu_device());
  p.group = 8;
  ASSERT_TRUE(quantize_fp8(p).ok());
  EXPECT_STREQ(last_kernel_name(), "");
  core::set_last_kernel_name(nullptr);
  EXPECT_STREQ(last_kernel_name(), "");
}

TEST(Core, PresetsMatchSpecTable) {
  ModelGeometry g;
  DSA_ASSERT_OK(geometry_preset("deepseek-v3.2", &g));
  EXPECT_EQ(g.num_heads, 128);
  EXPECT_EQ(g.index_heads, 64);
  EXPECT_EQ(g.index_rope, RopeStyle::kHalfSplit);
  EXPECT_EQ(g.num_layers, 61);
  EXPECT_EQ(g.max_positions, 163840);
  EXPECT_NEAR(g.sm_scale, 0.13523, 5e-5);
  EXPECT_EQ(g.num_indexer_cache_layers(), 61);
  DSA_ASSERT_OK(geometry_preset("glm-5", &g));
  EXPECT_EQ(g.num_heads, 64);
  EXPECT_EQ(g.index_heads, 32);
  EXPECT_EQ(g.index_rope, RopeStyle::kInterleaved);
  EXPECT_EQ(g.v_head_dim, 256);
  EXPECT_EQ(g.max_positions, 202752);
  EXPECT_EQ(g.layer_role(5), IndexerRole::kFull);
  EXPECT_EQ(g.layer_role(78), IndexerRole::kMtp);
  DSA_ASSERT_OK(geometry_preset("glm-5.2", &g));
  EXPECT_EQ(g.max_positions, 1048576);
  // full iff max(i - 3 + 1, 0) % 4 == 0: layers 0, 1, 2 (clamped to 0), 6, 10, ...
  EXPECT_EQ(g.layer_role(0), IndexerRole::kFull);
  EXPECT_EQ(g.layer_role(2), IndexerRole::kFull);
  EXPECT_EQ(g.layer_role(3), IndexerRole::kShared);
  EXPECT_EQ(g.layer_role(5), IndexerRole::kShared);
  EXPECT_EQ(g.layer_role(6), IndexerRole::kFull);
  EXPECT_EQ(g.layer_role(10), IndexerRole::kFull);
  int full = 0;
  for (int i = 0; i < 78; ++i) full += (std::max(i - 2, 0) % 4 == 0);
  EXPECT_EQ(g.num_indexer_cache_layers(), full);
  EXPECT_TRUE(dsa_test::fails_naming(geometry_preset("llama", &g), {"preset", "llama", "glm-5"}));
}

TEST(Core, ArgCheckNamesArgumentAndExpectation) {
  float buf[12];
  TensorDesc t = make_tensor(buf, DType::kF32, {3, 4});
  core::ArgCheck ok("op");
  ok.tensor(t, "x", {DType::kF32}, {3, 4});
  EXPECT_TRUE(ok.ok());

  core::ArgCheck bad_dtype("op");
  bad_dtype.tensor(t, "x", {DType::kBF16}, {3, 4});
  EXPECT_TRUE(dsa_test::fails_naming(bad_dtype.status(), {"op", "x", "bf16", "f32"}));

  core::ArgCheck bad_shape("op");
  bad_shape.tensor(t, "x", {DType::kF32}, {{3, "M"}, {128, "D"}});
  EXPECT_TRUE(dsa_test::fails_naming(bad_shape.status(), {"x", "[M, D]", "[3, 128]", "[3, 4]"}));

  TensorDesc strided = t;
  strided.stride[1] = 2;
  core::ArgCheck bad_stride("op");
  bad_stride.tensor(strided, "x", {DType::kF32}, {3, 4});
  EXPECT_TRUE(dsa_test::fails_naming(bad_stride.status(), {"x", "contiguous"}));

  core::ArgCheck missing("op");
  missing.tensor(TensorDesc{}, "lengths", {DType::kI32}, {{-1, "M"}});
  EXPECT_TRUE(dsa_test::fails_naming(missing.status(), {"lengths", "required"}));
}

// The expectation of a passing require is never built (every launch of a layer step runs these
// checks); a failing one says the same as the std::string form; only the first failure counts.
TEST(Core, ArgCheckBuildsMessagesOnlyOnFailure) {
  int built = 0;
  const auto what = [&] {
    ++built;
    return "expected >= 1, got " + std::to_string(0);
  };
  core::ArgCheck pass("op");
  pass.require(true, "n", what).require(true, "n", "a literal expectation");
  EXPECT_TRUE(pass.ok());
  EXPECT_EQ(built, 0);

  core::ArgCheck lazy("op"), eager("op"), literal("op");
  lazy.require(false, "n", what).require(false, "m", what);
  eager.require(false, "n", "expected >= 1, got " + std::to_string(0));
  literal.require(false, "n", "expected >= 1, got 0");
  EXPECT_EQ(built, 1);
  EXPECT_EQ(lazy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lazy.status().message(), eager.status().message());
  EXPECT_EQ(literal.status().message(), eager.status().message());
  EXPECT_EQ(lazy.status().message(), "op: n: expected >= 1, got 0");
}

TEST(Core, DevicesMustAgreeAndBackendMustExist) {
  float a[4], b[4];
  TensorDesc x = make_tensor(a, DType::kF32, {4});
  TensorDesc y = make_tensor(b, DType::kF32, {4}, cuda_device(0));
  Device d;
  Status st = core::pick_device("op", {{&x, "x"}, {&y, "y"}}, &d);
  EXPECT_TRUE(dsa_test::fails_naming(st, {"op", "y:", "cpu", "cuda:0"}));
  TensorDesc z = y;
  st = core::pick_device("op", {{&z, "z"}}, &d);
  bool has_cuda = false;
  for (auto& n : compiled_backends()) has_cuda |= n == "cuda";
  if (!has_cuda) EXPECT_TRUE(dsa_test::fails_naming(st, {"op", "cuda:0", "cpu backend"}));
}

TEST(Core, CacheLayoutConstantsMatchSpec) {
  EXPECT_EQ(mla_token_bytes(MlaCacheDtype::kBF16), 1152);
  EXPECT_EQ(mla_token_bytes(MlaCacheDtype::kFP8), 656);
  EXPECT_EQ(kMlaFp8ScaleOffset + 4 * 4, kMlaFp8RopeOffset);
  EXPECT_EQ(kMlaFp8RopeOffset + 64 * 2, kMlaFp8TokenBytes);
  EXPECT_EQ(kDefaultPageSize * kIndexerTokenBytes, 8448);
  EXPECT_STREQ(mla_cache_dtype_name(MlaCacheDtype::kBF16), "bf16");
  EXPECT_STREQ(mla_cache_dtype_name(MlaCacheDtype::kFP8), "fp8");
}
