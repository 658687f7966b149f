// Adversarial calls (issue 16): every public op, each argument malformed in each way that
// applies -- dtype, rank, shape, negative / zero strides, an output sharing memory with itself
// or with an input, device, range, size overflow, null data, NaN where a value matters -- and
// each case asserts the exact StatusCode and that the message starts with the op and names the
// argument. A valid call is checked first, so a case fails only for its own malformation.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dsa/dsa.h"
#include "test_util.h"

using namespace dsa;

namespace {

template <class F>
struct Case {
  std::string what;
  std::function<void(F&)> mutate;
  StatusCode code;
  std::vector<std::string> needles;  // substrings the message must contain (the argument first)
};

template <class F>
void run_cases(const char* op, const std::function<std::unique_ptr<F>()>& make,
               const std::function<Status(F&)>& run, const std::vector<Case<F>>& cases) {
  {
    auto f = make();
    const Status s = run(*f);
    ASSERT_TRUE(s.ok()) << op << ": the valid call failed: " << s.to_string();
  }
  for (const auto& c : cases) {
    auto f = make();
    c.mutate(*f);
    const Status s = run(*f);
    EXPECT_EQ(s.code(), c.code) << op << " / " << c.what << ": got " << s.to_string();
    EXPECT_EQ(s.message().rfind(op, 0), 0u) << op << " / " << c.what << ": message does not start with the op: " << s.message();
    for (const auto& n : c.needles)
      EXPECT_NE(s.message().find(n), std::string::npos) << op << " / " << c.what << ": '" << n << "' not in: " << s.message();
  }
}

// How a tensor argument takes part: `lead` tensors define a size (their dim 0 is free, and a
// device change on them is reported on the next tensor); `fixed_dim` is a dim whose size the
// op fixes or ties to another argument (-1: none).
struct Role {
  bool output = false;
  bool lead = false;
  int fixed_dim = -1;
  bool optional = false;  // leaving it out is valid
};

// The generic malformations of one tensor argument.
template <class F>
void tensor_cases(std::vector<Case<F>>* out, const std::string& name, std::function<TensorDesc&(F&)> get, Role role,
                  std::function<const TensorDesc&(F&)> other_input = nullptr) {
  const auto inv = StatusCode::kInvalidArgument;
  out->push_back({name + " wrong dtype", [get](F& f) {
                    TensorDesc& t = get(f);
                    t.dtype = (t.dtype == DType::kI32 || t.dtype == DType::kI64) ? DType::kF32 : DType::kI64;
                  }, inv, {name, "dtype"}});
  out->push_back({name + " one dim more", [get](F& f) {
                    TensorDesc& t = get(f);
                    if (t.ndim < kMaxDims) { t.shape[t.ndim] = 1; t.stride[t.ndim] = 1; ++t.ndim; }
                    else { --t.ndim; }
                  }, inv, {name, "shape"}});
  out->push_back({name + " ndim past kMaxDims", [get](F& f) { get(f).ndim = kMaxDims + 3; }, inv, {name, "dims"}});
  if (!role.optional) out->push_back({name + " missing", [get](F& f) { get(f) = TensorDesc{}; }, inv, {name}});
  if (role.fixed_dim >= 0) {
    out->push_back({name + " wrong size in dim " + std::to_string(role.fixed_dim), [get, role](F& f) {
                      get(f).shape[role.fixed_dim] += 1;
                    }, inv, {name, "shape"}});
  }
  out->push_back({name + " negative stride", [get](F& f) {
                    TensorDesc& t = get(f);
                    t.stride[0] = -std::max<int64_t>(t.stride[0], 1);
                  }, inv, {name, "stride"}});
  out->push_back({name + " null data", [get](F& f) { get(f).data = nullptr; }, inv, {name, "null"}});
  out->push_back({name + " shape x stride overflows", [get](F& f) {
                    TensorDesc& t = get(f);
                    t.shape[0] = int64_t{1} << 62;
                    t.stride[0] = int64_t{1} << 40;
                  }, inv, {name}});
  if (!role.lead) {
    out->push_back({name + " on another device", [get](F& f) { get(f).device = cuda_device(0); }, inv,
                    {name, "cuda:0"}});
  }
  if (role.output) {
    out->push_back({name + " zero stride (elements share memory)", [get](F& f) {
                      TensorDesc& t = get(f);
                      t.stride[0] = 0;
                    }, inv, {name, "share memory"}});
    if (other_input) {
      out->push_back({name + " overlaps an input", [get, other_input](F& f) {
                        get(f).data = other_input(f).data;
                      }, inv, {name, "share memory with"}});
    }
  }
}

// ---------------------------------------------------------------------------------------------

struct Quant {
  std::vector<float> x = std::vector<float>(2 * 256, 0.5f);
  std::vector<uint8_t> out = std::vector<uint8_t>(2 * 256);
  std::vector<float> scale = std::vector<float>(4);
  QuantizeFp8Params p;
  Quant() {
    p.x = dsa_test::t_f32(x.data(), {2, 256});
    p.out = dsa_test::t_e4m3(out.data(), {2, 256});
    p.scale = dsa_test::t_f32(scale.data(), {2, 2});
    p.group = 128;
  }
};

TEST(Adversarial, QuantizeFp8) {
  std::vector<Case<Quant>> cs;
  tensor_cases<Quant>(&cs, "x", [](Quant& f) -> TensorDesc& { return f.p.x; }, {false, true, -1});
  tensor_cases<Quant>(&cs, "out", [](Quant& f) -> TensorDesc& { return f.p.out; }, {true, false, 1},
                      [](Quant& f) -> const TensorDesc& { return f.p.x; });
  tensor_cases<Quant>(&cs, "scale", [](Quant& f) -> TensorDesc& { return f.p.scale; }, {true, false, 1},
                      [](Quant& f) -> const TensorDesc& { return f.p.x; });
  cs.push_back({"group 0", [](Quant& f) { f.p.group = 0; }, StatusCode::kInvalidArgument, {"group"}});
  cs.push_back({"group not dividing D", [](Quant& f) { f.p.group = 100; }, StatusCode::kInvalidArgument, {"x", "group"}});
  cs.push_back({"out aliases scale", [](Quant& f) { f.p.scale.data = f.p.out.data; }, StatusCode::kInvalidArgument, {"scale", "out"}});
  run_cases<Quant>("quantize_fp8", [] { return std::make_unique<Quant>(); },
                   [](Quant& f) { return quantize_fp8(f.p); }, cs);
}

struct PrepK {
  std::vector<float> k = std::vector<float>(3 * 128, 0.25f);
  std::vector<int32_t> pos = {0, 1, 2};
  std::vector<float> cs = std::vector<float>(16 * 64, 0.5f);
  std::vector<uint8_t> ko = std::vector<uint8_t>(3 * 128);
  std::vector<float> ks = std::vector<float>(3);
  PrepareIndexerKParams p;
  PrepK() {
    p.k = dsa_test::t_f32(k.data(), {3, 128});
    p.positions = dsa_test::t_i32(pos.data(), {3});
    p.cos_sin = dsa_test::t_f32(cs.data(), {16, 64});
    p.k_out = dsa_test::t_e4m3(ko.data(), {3, 128});
    p.k_scale = dsa_test::t_f32(ks.data(), {3});
  }
};

TEST(Adversarial, PrepareIndexerK) {
  std::vector<Case<PrepK>> cs;
  auto in = [](PrepK& f) -> const TensorDesc& { return f.p.k; };
  tensor_cases<PrepK>(&cs, "k", [](PrepK& f) -> TensorDesc& { return f.p.k; }, {false, true, 1});
  tensor_cases<PrepK>(&cs, "positions", [](PrepK& f) -> TensorDesc& { return f.p.positions; }, {false, false, 0});
  tensor_cases<PrepK>(&cs, "cos_sin", [](PrepK& f) -> TensorDesc& { return f.p.cos_sin; }, {false, false, 1});
  tensor_cases<PrepK>(&cs, "k_out", [](PrepK& f) -> TensorDesc& { return f.p.k_out; }, {true, false, 0}, in);
  tensor_cases<PrepK>(&cs, "k_scale", [](PrepK& f) -> TensorDesc& { return f.p.k_scale; }, {true, false, 0}, in);
  cs.push_back({"position past cos_sin", [](PrepK& f) { f.pos[1] = 16; }, StatusCode::kInvalidArgument, {"positions", "16"}});
  cs.push_back({"negative position", [](PrepK& f) { f.pos[2] = -1; }, StatusCode::kInvalidArgument, {"positions", "-1"}});
  cs.push_back({"rope out of range", [](PrepK& f) { f.p.rope = static_cast<RopeStyle>(7); }, StatusCode::kInvalidArgument, {"rope"}});
  run_cases<PrepK>("prepare_indexer_k", [] { return std::make_unique<PrepK>(); },
                   [](PrepK& f) { return prepare_indexer_k(f.p); }, cs);
}

struct PrepQ {
  std::vector<float> q = std::vector<float>(3 * 2 * 128, 0.25f);
  std::vector<float> w = std::vector<float>(3 * 2, 1.f);
  std::vector<int32_t> pos = {0, 1, 2};
  std::vector<float> cs = std::vector<float>(16 * 64, 0.5f);
  std::vector<uint8_t> qo = std::vector<uint8_t>(3 * 2 * 128);
  std::vector<float> wo = std::vector<float>(3 * 2);
  PrepareIndexerQParams p;
  PrepQ() {
    p.q = dsa_test::t_f32(q.data(), {3, 2, 128});
    p.weights = dsa_test::t_f32(w.data(), {3, 2});
    p.positions = dsa_test::t_i32(pos.data(), {3});
    p.cos_sin = dsa_test::t_f32(cs.data(), {16, 64});
    p.q_out = dsa_test::t_e4m3(qo.data(), {3, 2, 128});
    p.weights_out = dsa_test::t_f32(wo.data(), {3, 2});
  }
};

TEST(Adversarial, PrepareIndexerQ) {
  std::vector<Case<PrepQ>> cs;
  auto in = [](PrepQ& f) -> const TensorDesc& { return f.p.q; };
  tensor_cases<PrepQ>(&cs, "q", [](PrepQ& f) -> TensorDesc& { return f.p.q; }, {false, true, 2});
  tensor_cases<PrepQ>(&cs, "weights", [](PrepQ& f) -> TensorDesc& { return f.p.weights; }, {false, false, 1});
  tensor_cases<PrepQ>(&cs, "positions", [](PrepQ& f) -> TensorDesc& { return f.p.positions; }, {false, false, 0});
  tensor_cases<PrepQ>(&cs, "q_out", [](PrepQ& f) -> TensorDesc& { return f.p.q_out; }, {true, false, 1}, in);
  tensor_cases<PrepQ>(&cs, "weights_out", [](PrepQ& f) -> TensorDesc& { return f.p.weights_out; }, {true, false, 1},
                      [](PrepQ& f) -> const TensorDesc& { return f.p.weights; });
  cs.push_back({"position past cos_sin", [](PrepQ& f) { f.pos[0] = 99; }, StatusCode::kInvalidArgument, {"positions", "99"}});
  cs.push_back({"zero heads", [](PrepQ& f) { f.p.q.shape[1] = 0; f.p.weights.shape[1] = 0; }, StatusCode::kInvalidArgument, {"q", "H_idx"}});
  run_cases<PrepQ>("prepare_indexer_q", [] { return std::make_unique<PrepQ>(); },
                   [](PrepQ& f) { return prepare_indexer_q(f.p); }, cs);
}

struct Logits {
  std::vector<uint8_t> q = std::vector<uint8_t>(2 * 2 * 128, 0x38);
  std::vector<float> w = std::vector<float>(2 * 2, 1.f);
  std::vector<uint8_t> k = std::vector<uint8_t>(10 * 128, 0x38);
  std::vector<float> ksc = std::vector<float>(10, 1.f);
  std::vector<int32_t> ks = {0, 2}, ke = {5, 10};
  std::vector<float> out = std::vector<float>(2 * 8);
  IndexerLogitsParams p;
  Logits() {
    p.q = dsa_test::t_e4m3(q.data(), {2, 2, 128});
    p.weights = dsa_test::t_f32(w.data(), {2, 2});
    p.k = dsa_test::t_e4m3(k.data(), {10, 128});
    p.k_scale = dsa_test::t_f32(ksc.data(), {10});
    p.ks = dsa_test::t_i32(ks.data(), {2});
    p.ke = dsa_test::t_i32(ke.data(), {2});
    p.logits = dsa_test::t_f32(out.data(), {2, 8});
  }
};

TEST(Adversarial, IndexerLogits) {
  std::vector<Case<Logits>> cs;
  auto in = [](Logits& f) -> const TensorDesc& { return f.p.k_scale; };
  tensor_cases<Logits>(&cs, "q", [](Logits& f) -> TensorDesc& { return f.p.q; }, {false, true, 2});
  tensor_cases<Logits>(&cs, "weights", [](Logits& f) -> TensorDesc& { return f.p.weights; }, {false, false, 1});
  tensor_cases<Logits>(&cs, "k", [](Logits& f) -> TensorDesc& { return f.p.k; }, {false, false, 1});
  tensor_cases<Logits>(&cs, "k_scale", [](Logits& f) -> TensorDesc& { return f.p.k_scale; }, {false, false, 0});
  tensor_cases<Logits>(&cs, "ks", [](Logits& f) -> TensorDesc& { return f.p.ks; }, {false, false, 0});
  tensor_cases<Logits>(&cs, "ke", [](Logits& f) -> TensorDesc& { return f.p.ke; }, {false, false, 0});
  tensor_cases<Logits>(&cs, "logits", [](Logits& f) -> TensorDesc& { return f.p.logits; }, {true, false, 0}, in);
  cs.push_back({"ks > ke", [](Logits& f) { f.ks[0] = 6; }, StatusCode::kInvalidArgument, {"ks[0]"}});
  cs.push_back({"ke > N", [](Logits& f) { f.ke[1] = 11; }, StatusCode::kInvalidArgument, {"ke[1]", "N = 10"}});
  cs.push_back({"ke = 2^31 - 1", [](Logits& f) { f.ke[1] = std::numeric_limits<int32_t>::max(); }, StatusCode::kInvalidArgument, {"ke[1]"}});
  cs.push_back({"negative ks", [](Logits& f) { f.ks[0] = -1; }, StatusCode::kInvalidArgument, {"ks[0]"}});
  cs.push_back({"negative col_offset", [](Logits& f) { f.p.col_offset = -1; }, StatusCode::kInvalidArgument, {"col_offset"}});
  cs.push_back({"col_offset past int32", [](Logits& f) { f.p.col_offset = int64_t{1} << 31; }, StatusCode::kInvalidArgument, {"col_offset"}});
  run_cases<Logits>("indexer_logits", [] { return std::make_unique<Logits>(); },
                    [](Logits& f) { return indexer_logits(f.p); }, cs);
}

struct Paged {
  std::vector<uint8_t> q = std::vector<uint8_t>(2 * 2 * 128, 0x38);
  std::vector<float> w = std::vector<float>(2 * 2, 1.f);
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 64 * 132, 0);
  std::vector<int32_t> bt = {0, 1, 1, 0}, kv = {10, 70};
  std::vector<float> out = std::vector<float>(2 * 70);
  IndexerLogitsPagedParams p;
  Paged() {
    p.q = dsa_test::t_e4m3(q.data(), {2, 2, 128});
    p.weights = dsa_test::t_f32(w.data(), {2, 2});
    p.cache.data = cache.data();
    p.cache.num_blocks = 2;
    p.cache.page_size = 64;
    p.block_table = dsa_test::t_i32(bt.data(), {2, 2});
    p.kv_lens = dsa_test::t_i32(kv.data(), {2});
    p.logits = dsa_test::t_f32(out.data(), {2, 70});
  }
};

TEST(Adversarial, IndexerLogitsPaged) {
  std::vector<Case<Paged>> cs;
  auto in = [](Paged& f) -> const TensorDesc& { return f.p.weights; };
  tensor_cases<Paged>(&cs, "q", [](Paged& f) -> TensorDesc& { return f.p.q; }, {false, true, 2});
  tensor_cases<Paged>(&cs, "weights", [](Paged& f) -> TensorDesc& { return f.p.weights; }, {false, false, 1});
  tensor_cases<Paged>(&cs, "block_table", [](Paged& f) -> TensorDesc& { return f.p.block_table; }, {false, true, -1});
  tensor_cases<Paged>(&cs, "kv_lens", [](Paged& f) -> TensorDesc& { return f.p.kv_lens; }, {false, false, 0});
  tensor_cases<Paged>(&cs, "logits", [](Paged& f) -> TensorDesc& { return f.p.logits; }, {true, false, 0}, in);
  cs.push_back({"block past the cache", [](Paged& f) { f.bt[2] = 5; }, StatusCode::kInvalidArgument, {"block_table[1][0]", "num_blocks = 2"}});
  cs.push_back({"kv_len past the table", [](Paged& f) { f.kv[0] = 129; }, StatusCode::kInvalidArgument, {"kv_lens[0]"}});
  cs.push_back({"kv_len below next_n", [](Paged& f) { f.kv[0] = 0; }, StatusCode::kInvalidArgument, {"kv_lens[0]"}});
  cs.push_back({"next_n 0", [](Paged& f) { f.p.next_n = 0; }, StatusCode::kInvalidArgument, {"next_n"}});
  cs.push_back({"cache page_size 6", [](Paged& f) { f.p.cache.page_size = 6; }, StatusCode::kInvalidArgument, {"cache", "page_size"}});
  cs.push_back({"cache num_blocks overflow", [](Paged& f) { f.p.cache.num_blocks = int64_t{1} << 60; }, StatusCode::kInvalidArgument, {"cache", "int64"}});
  cs.push_back({"cache negative block stride", [](Paged& f) { f.p.cache.block_stride_bytes = -8448; }, StatusCode::kInvalidArgument, {"cache", "block_stride_bytes"}});
  cs.push_back({"cache on another device", [](Paged& f) { f.p.cache.device = cuda_device(0); }, StatusCode::kInvalidArgument, {"cache", "cuda:0"}});
  cs.push_back({"logits overlap the cache", [](Paged& f) { f.p.logits.data = f.cache.data(); }, StatusCode::kInvalidArgument, {"logits", "cache"}});
  cs.push_back({"row_seq without row_len", [](Paged& f) { f.p.row_seq = f.p.kv_lens; }, StatusCode::kInvalidArgument, {"row_len"}});
  run_cases<Paged>("indexer_logits_paged", [] { return std::make_unique<Paged>(); },
                   [](Paged& f) { return indexer_logits_paged(f.p); }, cs);
}

struct Topk {
  std::vector<float> logits = std::vector<float>(2 * 128);
  std::vector<int32_t> len = {100, 128};
  std::vector<int32_t> idx = std::vector<int32_t>(2 * 64);
  std::vector<uint8_t> ws;
  TopkParams p;
  Topk() {
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 101);
    p.logits = dsa_test::t_f32(logits.data(), {2, 128});
    p.lengths = dsa_test::t_i32(len.data(), {2});
    p.k = 64;
    p.indices = dsa_test::t_i32(idx.data(), {2, 64});
    ws.resize(topk_workspace_size(p));
    p.workspace = ws.data();
    p.workspace_bytes = ws.size();
  }
};

TEST(Adversarial, Topk) {
  std::vector<Case<Topk>> cs;
  auto in = [](Topk& f) -> const TensorDesc& { return f.p.logits; };
  tensor_cases<Topk>(&cs, "logits", [](Topk& f) -> TensorDesc& { return f.p.logits; }, {false, true, -1});
  tensor_cases<Topk>(&cs, "lengths", [](Topk& f) -> TensorDesc& { return f.p.lengths; }, {false, false, 0});
  tensor_cases<Topk>(&cs, "indices", [](Topk& f) -> TensorDesc& { return f.p.indices; }, {true, false, 1}, in);
  cs.push_back({"k not a multiple of 64", [](Topk& f) { f.p.k = 65; }, StatusCode::kInvalidArgument, {"k"}});
  cs.push_back({"k 0", [](Topk& f) { f.p.k = 0; }, StatusCode::kInvalidArgument, {"k"}});
  cs.push_back({"length past W", [](Topk& f) { f.len[1] = 129; }, StatusCode::kInvalidArgument, {"lengths[1]"}});
  cs.push_back({"negative length", [](Topk& f) { f.len[0] = -3; }, StatusCode::kInvalidArgument, {"lengths[0]"}});
  cs.push_back({"no workspace", [](Topk& f) { f.p.workspace = nullptr; f.p.workspace_bytes = 0; }, StatusCode::kWorkspaceTooSmall, {"workspace"}});
  cs.push_back({"workspace overlaps logits", [](Topk& f) { f.p.workspace = f.logits.data(); }, StatusCode::kInvalidArgument, {"workspace", "logits"}});
  cs.push_back({"values overlap indices", [](Topk& f) { f.p.values = f.p.indices; f.p.values.dtype = DType::kF32; }, StatusCode::kInvalidArgument, {"values", "indices"}});
  run_cases<Topk>("topk", [] { return std::make_unique<Topk>(); }, [](Topk& f) { return topk(f.p); }, cs);
}

struct Map {
  std::vector<int32_t> idx = std::vector<int32_t>(2 * 64);
  std::vector<int32_t> bt = {0, 1};
  std::vector<int32_t> kv_start = {0};
  std::vector<int32_t> out = std::vector<int32_t>(2 * 64);
  MapIndicesParams p;
  explicit Map(bool paged = true) {
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
    p.indices = dsa_test::t_i32(idx.data(), {2, 64});
    p.rows_per_seq = 2;
    if (paged) {
      p.kind = IndexMapKind::kPaged;
      p.block_table = dsa_test::t_i32(bt.data(), {1, 2});
      p.page_size = 64;
      p.num_blocks = 2;
    } else {
      p.kind = IndexMapKind::kFlat;
      p.kv_start = dsa_test::t_i32(kv_start.data(), {1});
    }
    p.out = dsa_test::t_i32(out.data(), {2, 64});
  }
};

TEST(Adversarial, MapIndices) {
  std::vector<Case<Map>> cs;
  auto in = [](Map& f) -> const TensorDesc& { return f.p.block_table; };
  tensor_cases<Map>(&cs, "indices", [](Map& f) -> TensorDesc& { return f.p.indices; }, {false, true, -1});
  tensor_cases<Map>(&cs, "block_table", [](Map& f) -> TensorDesc& { return f.p.block_table; }, {false, false, -1});
  tensor_cases<Map>(&cs, "out", [](Map& f) -> TensorDesc& { return f.p.out; }, {true, false, 1}, in);
  cs.push_back({"table entry past the cache", [](Map& f) { f.bt[1] = 2; }, StatusCode::kInvalidArgument, {"block_table[0][1]", "num_blocks = 2"}});
  cs.push_back({"slot past int32", [](Map& f) { f.bt[1] = 1 << 30; f.p.num_blocks = 0; }, StatusCode::kInvalidArgument, {"block_table[0][1]", "int32"}});
  cs.push_back({"page_size 0", [](Map& f) { f.p.page_size = 0; }, StatusCode::kInvalidArgument, {"page_size"}});
  cs.push_back({"rows_per_seq 0", [](Map& f) { f.p.rows_per_seq = 0; }, StatusCode::kInvalidArgument, {"rows_per_seq"}});
  cs.push_back({"too few sequences", [](Map& f) { f.p.rows_per_seq = 1; }, StatusCode::kInvalidArgument, {"block_table", "sequences"}});
  cs.push_back({"negative num_blocks", [](Map& f) { f.p.num_blocks = -1; }, StatusCode::kInvalidArgument, {"num_blocks"}});
  cs.push_back({"kind out of range", [](Map& f) { f.p.kind = static_cast<IndexMapKind>(5); }, StatusCode::kInvalidArgument, {"kind"}});
  cs.push_back({"out partly overlapping indices", [](Map& f) { f.p.out.data = f.idx.data() + 1; }, StatusCode::kInvalidArgument, {"out", "indices"}});
  run_cases<Map>("map_indices", [] { return std::make_unique<Map>(true); }, [](Map& f) { return map_indices(f.p); }, cs);

  std::vector<Case<Map>> flat;
  tensor_cases<Map>(&flat, "kv_start", [](Map& f) -> TensorDesc& { return f.p.kv_start; }, {false, false, -1});
  flat.push_back({"kv_start + index past int32", [](Map& f) { f.kv_start[0] = std::numeric_limits<int32_t>::max() - 10; },
                  StatusCode::kInvalidArgument, {"kv_start[0]", "int32"}});
  flat.push_back({"negative kv_start", [](Map& f) { f.kv_start[0] = -1; }, StatusCode::kInvalidArgument, {"kv_start[0]"}});
  run_cases<Map>("map_indices", [] { return std::make_unique<Map>(false); }, [](Map& f) { return map_indices(f.p); }, flat);
}

TEST(Adversarial, MapIndicesInPlaceStillAllowed) {
  Map f(true);
  f.p.out = f.p.indices;
  DSA_ASSERT_OK(map_indices(f.p));
  EXPECT_EQ(f.idx[65], 65);  // row 1 is sequence 0, position 65 -> block 1, offset 1
}

struct WriteIdx {
  std::vector<uint8_t> k = std::vector<uint8_t>(3 * 128, 0x38);
  std::vector<float> ks = std::vector<float>(3, 1.f);
  std::vector<int64_t> slots = {0, 5, 70};
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 64 * 132);
  WriteIndexerCacheParams p;
  WriteIdx() {
    p.k = dsa_test::t_e4m3(k.data(), {3, 128});
    p.k_scale = dsa_test::t_f32(ks.data(), {3});
    p.where.slots = dsa_test::t_i64(slots.data(), {3});
    p.cache.data = cache.data();
    p.cache.num_blocks = 2;
    p.cache.page_size = 64;
  }
};

TEST(Adversarial, WriteIndexerCache) {
  std::vector<Case<WriteIdx>> cs;
  tensor_cases<WriteIdx>(&cs, "k", [](WriteIdx& f) -> TensorDesc& { return f.p.k; }, {false, true, 1});
  tensor_cases<WriteIdx>(&cs, "k_scale", [](WriteIdx& f) -> TensorDesc& { return f.p.k_scale; }, {false, false, 0});
  cs.push_back({"slot past the cache", [](WriteIdx& f) { f.slots[2] = 128; }, StatusCode::kInvalidArgument, {"where.slots", "128"}});
  cs.push_back({"slot -2", [](WriteIdx& f) { f.slots[0] = -2; }, StatusCode::kInvalidArgument, {"where.slots"}});
  cs.push_back({"cache null", [](WriteIdx& f) { f.p.cache.data = nullptr; }, StatusCode::kInvalidArgument, {"cache"}});
  cs.push_back({"cache block stride below a page", [](WriteIdx& f) { f.p.cache.block_stride_bytes = 64; }, StatusCode::kInvalidArgument, {"cache", "block_stride_bytes"}});
  cs.push_back({"cache overlaps k", [](WriteIdx& f) { f.p.k.data = f.cache.data() + 256; }, StatusCode::kInvalidArgument, {"cache", "k"}});
  cs.push_back({"slots and block_table both", [](WriteIdx& f) { f.p.where.block_table = f.p.where.slots; f.p.where.block_table.dtype = DType::kI32; },
                StatusCode::kInvalidArgument, {"where"}});
  run_cases<WriteIdx>("write_indexer_cache", [] { return std::make_unique<WriteIdx>(); },
                      [](WriteIdx& f) { return write_indexer_cache(f.p); }, cs);
}

struct WriteMla {
  std::vector<float> kv = std::vector<float>(3 * 512, 0.5f), pe = std::vector<float>(3 * 64, 0.25f);
  std::vector<int32_t> bt = {1, 0}, seq = {0, 0, 0}, pos = {0, 1, 70};
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 64 * 1152);
  WriteMlaCacheParams p;
  WriteMla() {
    p.kv_c = dsa_test::t_f32(kv.data(), {3, 512});
    p.k_pe = dsa_test::t_f32(pe.data(), {3, 64});
    p.where.block_table = dsa_test::t_i32(bt.data(), {1, 2});
    p.where.token_seq = dsa_test::t_i32(seq.data(), {3});
    p.where.token_pos = dsa_test::t_i32(pos.data(), {3});
    p.cache.data = cache.data();
    p.cache.num_blocks = 2;
    p.cache.page_size = 64;
  }
};

TEST(Adversarial, WriteMlaCache) {
  std::vector<Case<WriteMla>> cs;
  tensor_cases<WriteMla>(&cs, "kv_c", [](WriteMla& f) -> TensorDesc& { return f.p.kv_c; }, {false, true, 1});
  tensor_cases<WriteMla>(&cs, "k_pe", [](WriteMla& f) -> TensorDesc& { return f.p.k_pe; }, {false, false, 1});
  tensor_cases<WriteMla>(&cs, "where.block_table", [](WriteMla& f) -> TensorDesc& { return f.p.where.block_table; }, {false, false, -1, true});
  tensor_cases<WriteMla>(&cs, "where.token_seq", [](WriteMla& f) -> TensorDesc& { return f.p.where.token_seq; }, {false, false, 0});
  tensor_cases<WriteMla>(&cs, "where.token_pos", [](WriteMla& f) -> TensorDesc& { return f.p.where.token_pos; }, {false, false, 0});
  cs.push_back({"table entry past the cache", [](WriteMla& f) { f.bt[1] = 2; }, StatusCode::kInvalidArgument, {"where.block_table", "num_blocks = 2"}});
  cs.push_back({"position past the table", [](WriteMla& f) { f.pos[2] = 128; }, StatusCode::kInvalidArgument, {"where.token_pos"}});
  cs.push_back({"sequence past the table", [](WriteMla& f) { f.seq[1] = 1; }, StatusCode::kInvalidArgument, {"where.token_seq"}});
  cs.push_back({"cache dtype out of range", [](WriteMla& f) { f.p.cache.dtype = static_cast<MlaCacheDtype>(3); }, StatusCode::kInvalidArgument, {"cache", "dtype"}});
  cs.push_back({"cache overlaps kv_c", [](WriteMla& f) { f.p.cache.data = f.kv.data(); }, StatusCode::kInvalidArgument, {"cache", "kv_c"}});
  cs.push_back({"misaligned cache", [](WriteMla& f) { f.p.cache.data = f.cache.data() + 4; }, StatusCode::kInvalidArgument, {"cache", "aligned"}});
  run_cases<WriteMla>("write_mla_cache", [] { return std::make_unique<WriteMla>(); },
                      [](WriteMla& f) { return write_mla_cache(f.p); }, cs);
}

struct ReadMla {
  std::vector<uint8_t> cache = std::vector<uint8_t>(2 * 64 * 1152);
  std::vector<int64_t> slots = {0, 127};
  std::vector<float> out = std::vector<float>(2 * 576);
  ReadMlaCacheParams p;
  ReadMla() {
    p.cache.data = cache.data();
    p.cache.num_blocks = 2;
    p.cache.page_size = 64;
    p.slots = dsa_test::t_i64(slots.data(), {2});
    p.out = dsa_test::t_f32(out.data(), {2, 576});
  }
};

TEST(Adversarial, ReadMlaCache) {
  std::vector<Case<ReadMla>> cs;
  tensor_cases<ReadMla>(&cs, "slots", [](ReadMla& f) -> TensorDesc& { return f.p.slots; }, {false, true, -1});
  tensor_cases<ReadMla>(&cs, "out", [](ReadMla& f) -> TensorDesc& { return f.p.out; }, {true, false, 1},
                        [](ReadMla& f) -> const TensorDesc& { return f.p.slots; });
  cs.push_back({"slot past the cache", [](ReadMla& f) { f.slots[1] = 128; }, StatusCode::kInvalidArgument, {"slots", "128"}});
  cs.push_back({"out overlaps the cache", [](ReadMla& f) { f.p.out.data = f.cache.data(); }, StatusCode::kInvalidArgument, {"out", "cache"}});
  run_cases<ReadMla>("read_mla_cache", [] { return std::make_unique<ReadMla>(); },
                     [](ReadMla& f) { return read_mla_cache(f.p); }, cs);
}

struct Sparse {
  std::vector<float> q = std::vector<float>(2 * 2 * 576, 0.1f), kv = std::vector<float>(8 * 576, 0.2f);
  std::vector<int32_t> idx = std::vector<int32_t>(2 * 64, -1);
  std::vector<float> out = std::vector<float>(2 * 2 * 512), lse = std::vector<float>(2 * 2);
  std::vector<float> sink = {0.f, 1.f};
  SparseMlaParams p;
  Sparse() {
    for (int i = 0; i < 8; ++i) idx[i] = i;
    p.q = dsa_test::t_f32(q.data(), {2, 2, 576});
    p.kv.flat = dsa_test::t_f32(kv.data(), {8, 576});
    p.indices = dsa_test::t_i32(idx.data(), {2, 64});
    p.attn_sink = dsa_test::t_f32(sink.data(), {2});
    p.sm_scale = 0.1f;
    p.out = dsa_test::t_f32(out.data(), {2, 2, 512});
    p.lse = dsa_test::t_f32(lse.data(), {2, 2});
  }
};

TEST(Adversarial, SparseMla) {
  std::vector<Case<Sparse>> cs;
  auto in = [](Sparse& f) -> const TensorDesc& { return f.p.kv.flat; };
  tensor_cases<Sparse>(&cs, "q", [](Sparse& f) -> TensorDesc& { return f.p.q; }, {false, true, 2});
  tensor_cases<Sparse>(&cs, "indices", [](Sparse& f) -> TensorDesc& { return f.p.indices; }, {false, false, 0});
  tensor_cases<Sparse>(&cs, "attn_sink", [](Sparse& f) -> TensorDesc& { return f.p.attn_sink; }, {false, false, 0, true});
  tensor_cases<Sparse>(&cs, "out", [](Sparse& f) -> TensorDesc& { return f.p.out; }, {true, false, 2}, in);
  tensor_cases<Sparse>(&cs, "lse", [](Sparse& f) -> TensorDesc& { return f.p.lse; }, {true, false, 1}, in);
  cs.push_back({"sm_scale NaN", [](Sparse& f) { f.p.sm_scale = std::nanf(""); }, StatusCode::kInvalidArgument, {"sm_scale"}});
  cs.push_back({"sm_scale inf", [](Sparse& f) { f.p.sm_scale = INFINITY; }, StatusCode::kInvalidArgument, {"sm_scale"}});
  cs.push_back({"sm_scale 0", [](Sparse& f) { f.p.sm_scale = 0.f; }, StatusCode::kInvalidArgument, {"sm_scale"}});
  cs.push_back({"kv flat and paged", [](Sparse& f) { f.p.kv.paged.data = f.kv.data(); f.p.kv.paged.num_blocks = 1; }, StatusCode::kInvalidArgument, {"kv", "both"}});
  cs.push_back({"no kv", [](Sparse& f) { f.p.kv.flat = TensorDesc{}; }, StatusCode::kInvalidArgument, {"kv", "neither"}});
  cs.push_back({"topk_length past K", [](Sparse& f) {
                  static int32_t len[2] = {65, 1};
                  f.p.topk_length = dsa_test::t_i32(len, {2});
                }, StatusCode::kInvalidArgument, {"topk_length", "65"}});
  cs.push_back({"lse overlaps out", [](Sparse& f) { f.p.lse.data = f.out.data(); }, StatusCode::kInvalidArgument, {"lse", "out"}});
  cs.push_back({"out overlaps q", [](Sparse& f) { f.p.out.data = f.q.data() + 8; }, StatusCode::kInvalidArgument, {"out", "q"}});
  cs.push_back({"out overlaps indices", [](Sparse& f) { f.p.lse.data = f.idx.data(); }, StatusCode::kInvalidArgument, {"lse", "indices"}});
  run_cases<Sparse>("sparse_mla", [] { return std::make_unique<Sparse>(); },
                    [](Sparse& f) { return sparse_mla(f.p); }, cs);
}

struct Dense {
  std::vector<float> q = std::vector<float>(3 * 2 * 576, 0.1f), kv = std::vector<float>(6 * 576, 0.2f);
  std::vector<int32_t> cuq = {0, 2, 3}, cuk = {0, 4, 6};
  std::vector<float> out = std::vector<float>(3 * 2 * 512), lse = std::vector<float>(3 * 2);
  DenseMlaParams p;
  Dense() {
    p.q = dsa_test::t_f32(q.data(), {3, 2, 576});
    p.kv.flat = dsa_test::t_f32(kv.data(), {6, 576});
    p.cu_seqlens_q = dsa_test::t_i32(cuq.data(), {3});
    p.cu_seqlens_k = dsa_test::t_i32(cuk.data(), {3});
    p.sm_scale = 0.1f;
    p.out = dsa_test::t_f32(out.data(), {3, 2, 512});
    p.lse = dsa_test::t_f32(lse.data(), {3, 2});
  }
};

TEST(Adversarial, DenseMla) {
  std::vector<Case<Dense>> cs;
  auto in = [](Dense& f) -> const TensorDesc& { return f.p.kv.flat; };
  tensor_cases<Dense>(&cs, "q", [](Dense& f) -> TensorDesc& { return f.p.q; }, {false, true, 2});
  tensor_cases<Dense>(&cs, "kv.flat", [](Dense& f) -> TensorDesc& { return f.p.kv.flat; }, {false, false, 1});
  tensor_cases<Dense>(&cs, "cu_seqlens_k", [](Dense& f) -> TensorDesc& { return f.p.cu_seqlens_k; }, {false, false, 0});
  tensor_cases<Dense>(&cs, "out", [](Dense& f) -> TensorDesc& { return f.p.out; }, {true, false, 2}, in);
  tensor_cases<Dense>(&cs, "lse", [](Dense& f) -> TensorDesc& { return f.p.lse; }, {true, false, 1}, in);
  cs.push_back({"cu_seqlens_q not from 0", [](Dense& f) { f.cuq[0] = 1; }, StatusCode::kInvalidArgument, {"cu_seqlens_q"}});
  cs.push_back({"cu_seqlens_q decreasing", [](Dense& f) { f.cuq[1] = 4; }, StatusCode::kInvalidArgument, {"cu_seqlens_q"}});
  cs.push_back({"cu_seqlens_q not ending at T", [](Dense& f) { f.cuq[2] = 2; }, StatusCode::kInvalidArgument, {"cu_seqlens_q"}});
  cs.push_back({"cu_seqlens_k past S", [](Dense& f) { f.cuk[2] = 7; }, StatusCode::kInvalidArgument, {"cu_seqlens_k"}});
  cs.push_back({"q_len > kv_len", [](Dense& f) { f.cuk[1] = 1; }, StatusCode::kInvalidArgument, {"cu_seqlens_k", "q_len"}});
  cs.push_back({"sm_scale NaN", [](Dense& f) { f.p.sm_scale = std::nanf(""); }, StatusCode::kInvalidArgument, {"sm_scale"}});
  cs.push_back({"block_table with flat kv", [](Dense& f) { f.p.block_table = f.p.cu_seqlens_k; }, StatusCode::kInvalidArgument, {"block_table"}});
  cs.push_back({"out overlaps cu_seqlens_k", [](Dense& f) { f.p.lse.data = f.cuk.data(); }, StatusCode::kInvalidArgument, {"lse", "cu_seqlens_k"}});
  run_cases<Dense>("dense_mla", [] { return std::make_unique<Dense>(); }, [](Dense& f) { return dense_mla(f.p); }, cs);
}

// The planner: every invalid value is kInvalidArgument naming the field; every product of
// limits is overflow-checked (issue 16, item 5), never wrapped into a small plan.
TEST(Adversarial, Planner) {
  auto base = [] {
    PlannerConfig c;
    EXPECT_TRUE(geometry_preset("deepseek-v3.2", &c.geometry).ok());
    c.max_tokens_per_step = 512;
    c.max_context = 4096;
    return c;
  };
  struct P {
    const char* what;
    std::function<void(PlannerConfig&)> mutate;
    StatusCode code;
    const char* needle;
  };
  const int64_t huge = int64_t{1} << 40;
  const std::vector<P> cases = {
      {"page_size 6", [](PlannerConfig& c) { c.page_size = 6; }, StatusCode::kInvalidArgument, "page_size"},
      {"page_size past int32", [](PlannerConfig& c) { c.page_size = int64_t{1} << 32; }, StatusCode::kInvalidArgument, "page_size"},
      {"max_seqs * max_next_n overflows int64", [huge](PlannerConfig& c) { c.max_seqs_per_step = huge; c.max_next_n = huge; },
       StatusCode::kInvalidArgument, "max_seqs_per_step * max_next_n"},
      {"rows past int32", [](PlannerConfig& c) { c.max_tokens_per_step = int64_t{1} << 31; }, StatusCode::kInvalidArgument, "max_tokens_per_step"},
      {"negative max_seqs", [](PlannerConfig& c) { c.max_seqs_per_step = -1; }, StatusCode::kInvalidArgument, "max_seqs_per_step"},
      {"zero next_n", [](PlannerConfig& c) { c.max_next_n = 0; }, StatusCode::kInvalidArgument, "max_next_n"},
      {"max_context past int32", [](PlannerConfig& c) { c.max_context = int64_t{1} << 31; }, StatusCode::kInvalidArgument, "max_context"},
      {"budget 0", [](PlannerConfig& c) { c.score_budget_bytes = 0; }, StatusCode::kInvalidArgument, "score_budget_bytes"},
      {"budget too small", [](PlannerConfig& c) { c.score_budget_bytes = 1; }, StatusCode::kLimitExceeded, "smallest budget"},
      {"kv fraction NaN", [](PlannerConfig& c) { c.kv_cache_fraction = std::nan(""); }, StatusCode::kInvalidArgument, "kv_cache_fraction"},
      {"negative device memory", [](PlannerConfig& c) { c.device_memory_bytes = -1; }, StatusCode::kInvalidArgument, "device_memory_bytes"},
      {"device memory too small", [](PlannerConfig& c) { c.device_memory_bytes = 1 << 20; }, StatusCode::kLimitExceeded, "device_memory_bytes"},
      {"topk 65", [](PlannerConfig& c) { c.geometry.topk = 65; }, StatusCode::kInvalidArgument, "topk"},
      {"zero heads", [](PlannerConfig& c) { c.geometry.num_heads = 0; }, StatusCode::kInvalidArgument, "num_heads"},
      {"index heads overflow the workspace", [](PlannerConfig& c) { c.geometry.index_heads = std::numeric_limits<int>::max(); c.max_tokens_per_step = (int64_t{1} << 31) - 1; },
       StatusCode::kLimitExceeded, "int64"},
  };
  Plan ok;
  ASSERT_TRUE(make_plan(base(), &ok).ok());
  for (const auto& pc : cases) {
    PlannerConfig c = base();
    pc.mutate(c);
    Plan p;
    const Status s = make_plan(c, &p);
    EXPECT_EQ(s.code(), pc.code) << pc.what << ": " << s.to_string();
    EXPECT_NE(s.message().find(pc.needle), std::string::npos) << pc.what << ": " << s.message();
  }
}

// An Attention whose host staging cannot be allocated reports kOutOfMemory from create() and
// status(), and never throws (issue 16, item 6).
TEST(Adversarial, AttentionConstructionFailureIsAStatus) {
  PlannerConfig c;
  ASSERT_TRUE(geometry_preset("deepseek-v3.2", &c.geometry).ok());
  c.max_tokens_per_step = 512;
  c.max_context = 4096;
  c.max_seqs_per_step = std::numeric_limits<int32_t>::max();
  Plan plan;
  ASSERT_TRUE(make_plan(c, &plan).ok());
  plan.config.max_seqs_per_step = int64_t{1} << 61;  // beyond any host: the routes alone cannot be allocated
  std::unique_ptr<Attention> a;
  Status s;
  EXPECT_NO_THROW(s = Attention::create(plan, &a));
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory) << s.to_string();
  EXPECT_NE(s.message().find("attention_step"), std::string::npos);
  EXPECT_EQ(a, nullptr);
}

}  // namespace

namespace {
TEST(Adversarial, ThreadCountPastTheCapIsRefused) {
  const int before = num_threads();
  const Status s = set_num_threads(kMaxCpuThreads + 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("set_num_threads: n"), std::string::npos) << s.message();
  EXPECT_EQ(num_threads(), before);
  DSA_ASSERT_OK(set_num_threads(0));
}
}  // namespace
