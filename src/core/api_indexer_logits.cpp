// Public entry points of the indexer logits family: validate, pick the device, dispatch.
//
// Column tiling: logits has W columns; column c holds key j = (ks[i] +) col_offset + c. Keys a
// row sees past column W - 1 are simply not computed (a caller tiles the columns with
// col_offset), so a row whose valid keys outnumber W is not an error. Only the keys that fall
// into the computed columns are read, and for CPU tensors only their block-table entries are
// range-checked.
#include <algorithm>
#include <string>

#include "core/dispatch.h"
#include "dsa/indexer.h"

namespace dsa {
namespace {

constexpr int64_t kIndexDim = 128;
constexpr int64_t kMaxKeyIndex = 2147483647;  // key positions are i32 everywhere

std::string at(const char* name, int64_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

template <typename T>
const T& elem1(const TensorDesc& t, int64_t i) {
  return t.ptr<const T>()[i * t.stride[0]];
}

}  // namespace

Status indexer_logits(const IndexerLogitsParams& p) {
  const char* op = "indexer_logits";
  core::ArgCheck c(op);
  c.tensor(p.q, "q", {DType::kE4M3}, {"M", "H_idx", {kIndexDim, "128"}});
  const int64_t M = c.ok() ? p.q.shape[0] : 0;
  const int64_t H = c.ok() ? p.q.shape[1] : 0;
  c.require(!c.ok() || H > 0, "q", "expected H_idx > 0 heads");
  c.tensor(p.weights, "weights", {DType::kF32}, {{M, "M"}, {H, "H_idx"}});
  c.tensor(p.k, "k", {DType::kE4M3}, {"N", {kIndexDim, "128"}});
  const int64_t N = c.ok() ? p.k.shape[0] : 0;
  c.tensor(p.k_scale, "k_scale", {DType::kF32}, {{N, "N"}}, false);
  c.tensor(p.ks, "ks", {DType::kI32}, {{M, "M"}}, false);
  c.tensor(p.ke, "ke", {DType::kI32}, {{M, "M"}}, false);
  c.output(p.logits, "logits", {DType::kF32, DType::kBF16}, {{M, "M"}, "W"});
  c.require(p.col_offset >= 0 && p.col_offset <= kMaxKeyIndex, "col_offset",
            [&] { return "expected in [0, 2^31 - 1], got " + std::to_string(p.col_offset); });
  c.disjoint(p.logits, "logits", p.q, "q").disjoint(p.logits, "logits", p.weights, "weights");
  c.disjoint(p.logits, "logits", p.k, "k").disjoint(p.logits, "logits", p.k_scale, "k_scale");
  c.disjoint(p.logits, "logits", p.ks, "ks").disjoint(p.logits, "logits", p.ke, "ke");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.q, "q"}, {&p.weights, "weights"}, {&p.k, "k"}, {&p.k_scale, "k_scale"}, {&p.ks, "ks"}, {&p.ke, "ke"}, {&p.logits, "logits"}}, &dev);
  if (!st.ok()) return st;
  if (dev.type == DeviceType::kCPU) {
    for (int64_t i = 0; i < M && c.ok(); ++i) {
      const int64_t s = elem1<int32_t>(p.ks, i), e = elem1<int32_t>(p.ke, i);
      if (s >= 0 && s <= e && e <= N) continue;  // messages are built only on failure
      c.require(s >= 0 && s <= e, at("ks", i).c_str(),
                "expected 0 <= ks[i] <= ke[i], got ks = " + std::to_string(s) + ", ke = " + std::to_string(e));
      c.require(e <= N, at("ke", i).c_str(),
                "expected ke[i] <= N = " + std::to_string(N) + ", got " + std::to_string(e));
    }
    if (!c.ok()) return c.status();
  }
  return core::backend_status(op, dev, DSA_DISPATCH(dev, indexer_logits, p));
}

namespace {

// The paged scorer's inputs, as both paged ops take them.
struct PagedInputs {
  const TensorDesc& q;
  const TensorDesc& weights;
  const IndexerCacheDesc& cache;
  const TensorDesc& block_table;
  const TensorDesc& kv_lens;
  int64_t next_n;
  const TensorDesc& row_seq;
  const TensorDesc& row_len;
};

// Shapes and dtypes of the paged inputs; *R gets the row count.
void check_paged_shapes(core::ArgCheck& c, const PagedInputs& p, int64_t* R) {
  c.tensor(p.q, "q", {DType::kE4M3}, {"R", "H_idx", {kIndexDim, "128"}});
  *R = c.ok() ? p.q.shape[0] : 0;
  const int64_t H = c.ok() ? p.q.shape[1] : 0;
  c.require(!c.ok() || H > 0, "q", "expected H_idx > 0 heads");
  c.tensor(p.weights, "weights", {DType::kF32}, {{*R, "R"}, {H, "H_idx"}});
  c.indexer_cache(p.cache, "cache");
  c.tensor(p.block_table, "block_table", {DType::kI32}, {"B", "max_blocks"});
  const int64_t B = c.ok() ? p.block_table.shape[0] : 0;
  const bool general = p.row_seq.present() || p.row_len.present();
  if (general) {
    c.require(p.row_seq.present() && p.row_len.present(), p.row_seq.present() ? "row_len" : "row_seq",
              "expected row_seq and row_len to be given together (general form)");
    c.tensor(p.row_seq, "row_seq", {DType::kI32}, {{*R, "R"}}, false);
    c.tensor(p.row_len, "row_len", {DType::kI32}, {{*R, "R"}}, false);
    c.optional(p.kv_lens, "kv_lens", {DType::kI32}, {{B, "B"}}, false);
  } else {
    c.tensor(p.kv_lens, "kv_lens", {DType::kI32}, {{B, "B"}}, false);
    c.require(p.next_n >= 1, "next_n", [&] { return "expected >= 1, got " + std::to_string(p.next_n); });
    c.require(!c.ok() || *R == B * p.next_n, "q", [&] {
      return "expected R == B * next_n = " + std::to_string(B) + " * " + std::to_string(p.next_n) +
             " rows (decode form), got R = " + std::to_string(*R);
    });
  }
}

// Host row tables (CPU tensors): each row's sequence and length in range (length also
// <= max_len when max_len >= 0, named by max_len_name), and the block-table entries of every
// page a computed key falls in: keys [col_offset, min(L, col_offset + W)) of rows with
// L > skip (skip 0: every row).
void check_paged_rows(core::ArgCheck& c, const PagedInputs& p, int64_t R, int64_t col_offset, int64_t W, int64_t skip,
                      int64_t max_len, const char* max_len_name) {
  const int64_t B = p.block_table.shape[0], max_blocks = p.block_table.shape[1];
  const int64_t page = p.cache.page_size;
  const int64_t cap = core::saturating_mul(max_blocks, page);
  const bool general = p.row_seq.present();
  std::vector<int64_t> reads(static_cast<size_t>(B), 0);  // largest key count a row of each sequence reads
  auto row_reads = [&](int64_t seq, int64_t len) {
    if (skip > 0 && len <= skip) return;  // skipped: reads nothing
    const int64_t last = std::min(len, col_offset + W);  // keys [col_offset, last)
    if (last > col_offset) reads[seq] = std::max(reads[seq], last);
  };
  auto length_ok = [&](int64_t len, const std::string& name) {
    if (max_len < 0 || len <= max_len) return true;
    c.require(false, name.c_str(),
              "expected at most " + std::string(max_len_name) + " = " + std::to_string(max_len) + " keys, got " +
                  std::to_string(len));
    return false;
  };
  if (general) {
    for (int64_t r = 0; r < R && c.ok(); ++r) {
      const int64_t s = elem1<int32_t>(p.row_seq, r), len = elem1<int32_t>(p.row_len, r);
      if (s >= 0 && s < B && len >= 0 && len <= cap) {
        if (length_ok(len, at("row_len", r))) row_reads(s, len);
        continue;
      }
      c.require(s >= 0 && s < B, at("row_seq", r).c_str(),
                "expected in [0, B = " + std::to_string(B) + "), got " + std::to_string(s));
      c.require(len >= 0 && len <= cap, at("row_len", r).c_str(),
                "expected in [0, max_blocks * page_size = " + std::to_string(cap) + "], got " + std::to_string(len));
    }
  } else {
    for (int64_t b = 0; b < B && c.ok(); ++b) {
      const int64_t kv = elem1<int32_t>(p.kv_lens, b);
      if (kv >= p.next_n && kv <= cap) {
        if (length_ok(kv, at("kv_lens", b))) row_reads(b, kv);
        continue;
      }
      c.require(false, at("kv_lens", b).c_str(),
                "expected in [next_n = " + std::to_string(p.next_n) + ", max_blocks * page_size = " +
                    std::to_string(cap) + "], got " + std::to_string(kv));
    }
  }
  for (int64_t b = 0; b < B && c.ok(); ++b) {
    if (reads[b] == 0) continue;
    for (int64_t blk = col_offset / page; blk * page < reads[b] && c.ok(); ++blk) {
      const int64_t e = p.block_table.ptr<const int32_t>()[b * p.block_table.stride[0] + blk * p.block_table.stride[1]];
      if (e >= 0 && e < p.cache.num_blocks) continue;
      c.require(false, ("block_table[" + std::to_string(b) + "][" + std::to_string(blk) + "]").c_str(),
                "expected a block in [0, cache.num_blocks = " + std::to_string(p.cache.num_blocks) + "), got " +
                    std::to_string(e));
    }
  }
}

}  // namespace

Status indexer_logits_paged(const IndexerLogitsPagedParams& p) {
  const char* op = "indexer_logits_paged";
  core::ArgCheck c(op);
  const PagedInputs in{p.q, p.weights, p.cache, p.block_table, p.kv_lens, p.next_n, p.row_seq, p.row_len};
  int64_t R = 0;
  check_paged_shapes(c, in, &R);
  c.output(p.logits, "logits", {DType::kF32, DType::kBF16}, {{R, "R"}, "W"});
  c.require(p.col_offset >= 0 && p.col_offset <= kMaxKeyIndex, "col_offset",
            [&] { return "expected in [0, 2^31 - 1], got " + std::to_string(p.col_offset); });
  c.require(p.skip_rows_up_to >= 0, "skip_rows_up_to",
            [&] { return "expected >= 0, got " + std::to_string(p.skip_rows_up_to); });
  c.disjoint(p.logits, "logits", p.q, "q").disjoint(p.logits, "logits", p.weights, "weights");
  c.disjoint(p.logits, "logits", core::cache_bytes(p.cache), "cache");
  c.disjoint(p.logits, "logits", p.block_table, "block_table").disjoint(p.logits, "logits", p.kv_lens, "kv_lens");
  c.disjoint(p.logits, "logits", p.row_seq, "row_seq").disjoint(p.logits, "logits", p.row_len, "row_len");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.q, "q"}, {&p.weights, "weights"}, {&p.block_table, "block_table"}, {&p.kv_lens, "kv_lens"}, {&p.row_seq, "row_seq"},
                                     {&p.row_len, "row_len"}, {&p.logits, "logits"}}, &dev, {&p.cache.device});
  if (!st.ok()) return st;
  if (dev.type == DeviceType::kCPU) {
    check_paged_rows(c, in, R, p.col_offset, p.logits.shape[1], p.skip_rows_up_to, -1, "");
    if (!c.ok()) return c.status();
  }
  return core::backend_status(op, dev, DSA_DISPATCH(dev, indexer_logits_paged, p));
}

// ---- fused score and select ----

namespace {

constexpr int64_t kMaxTopk = 16384;

core::ArgCheck check_indexer_topk(const IndexerTopkParams& p, int64_t* R) {
  core::ArgCheck c("indexer_topk");
  const PagedInputs in{p.q, p.weights, p.cache, p.block_table, p.kv_lens, p.next_n, p.row_seq, p.row_len};
  check_paged_shapes(c, in, R);
  c.require(p.k > 0 && p.k % 64 == 0 && p.k <= kMaxTopk, "k", [&] {
    return "expected a positive multiple of 64 up to " + std::to_string(kMaxTopk) + ", got " + std::to_string(p.k);
  });
  c.require(p.width >= 0 && p.width <= kMaxKeyIndex, "width",
            [&] { return "expected in [0, 2^31 - 1] (a bound on every row's keys), got " + std::to_string(p.width); });
  c.output(p.indices, "indices", {DType::kI32}, {{*R, "R"}, {p.k, "k"}});
  return c;
}

}  // namespace

bool indexer_topk_available(DeviceType device) { return device == DeviceType::kCPU; }

size_t indexer_topk_workspace_size(const IndexerTopkParams& p) {
  int64_t R = 0;
  if (!check_indexer_topk(p, &R).ok()) return 0;
  if (!indexer_topk_available(p.q.device.type)) return 0;
  return cpu::indexer_topk_workspace_size(p);
}

Status indexer_topk(const IndexerTopkParams& p) {
  const char* op = "indexer_topk";
  int64_t R = 0;
  core::ArgCheck c = check_indexer_topk(p, &R);
  c.disjoint(p.indices, "indices", p.q, "q").disjoint(p.indices, "indices", p.weights, "weights");
  c.disjoint(p.indices, "indices", core::cache_bytes(p.cache), "cache");
  c.disjoint(p.indices, "indices", p.block_table, "block_table").disjoint(p.indices, "indices", p.kv_lens, "kv_lens");
  c.disjoint(p.indices, "indices", p.row_seq, "row_seq").disjoint(p.indices, "indices", p.row_len, "row_len");
  if (c.ok() && p.workspace != nullptr && p.workspace_bytes > 0) {
    const TensorDesc ws = make_tensor(p.workspace, DType::kU8, {static_cast<int64_t>(p.workspace_bytes)}, p.q.device);
    c.disjoint(ws, "workspace", p.indices, "indices").disjoint(ws, "workspace", p.q, "q");
    c.disjoint(ws, "workspace", p.weights, "weights").disjoint(ws, "workspace", core::cache_bytes(p.cache), "cache");
    c.disjoint(ws, "workspace", p.row_seq, "row_seq").disjoint(ws, "workspace", p.row_len, "row_len");
  }
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.q, "q"}, {&p.weights, "weights"}, {&p.block_table, "block_table"}, {&p.kv_lens, "kv_lens"}, {&p.row_seq, "row_seq"},
                                     {&p.row_len, "row_len"}, {&p.indices, "indices"}}, &dev, {&p.cache.device});
  if (!st.ok()) return st;
  if (!indexer_topk_available(dev.type)) {
    return Status(StatusCode::kUnsupported,
                  std::string(op) + ": fused score-and-select was asked on " + device_type_name(dev.type) + ":" +
                      std::to_string(dev.index) + "; it exists on the CPU only. On this device, score with "
                      "indexer_logits_paged and select with topk (indexer_topk_available tells up front)");
  }
  const PagedInputs in{p.q, p.weights, p.cache, p.block_table, p.kv_lens, p.next_n, p.row_seq, p.row_len};
  check_paged_rows(c, in, R, 0, p.width, p.k, p.width, "width");
  if (!c.ok()) return c.status();
  const size_t need = cpu::indexer_topk_workspace_size(p);
  if (p.workspace_bytes < need || (need > 0 && p.workspace == nullptr))
    return Status(StatusCode::kWorkspaceTooSmall, std::string(op) + ": workspace: expected " + std::to_string(need) +
                                                      " bytes (indexer_topk_workspace_size), got " +
                                                      std::to_string(p.workspace_bytes));
  return core::backend_status(op, dev, core::guard_code([&] {
    core::set_last_kernel_name("");
    return cpu::indexer_topk(p);
  }));
}

}  // namespace dsa
