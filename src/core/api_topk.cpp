// Public entry points of top-k selection and index mapping: validate, pick the device, dispatch.
#include <string>

#include "core/dispatch.h"
#include "dsa/topk.h"

namespace dsa {
namespace {

constexpr int64_t kMaxTopk = 16384;

std::string at(const char* name, int64_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

template <typename T>
const T& elem1(const TensorDesc& t, int64_t i) {
  return t.ptr<const T>()[i * t.stride[0]];
}

core::ArgCheck check_topk(const TopkParams& p) {
  core::ArgCheck c("topk");
  c.require(p.k > 0 && p.k % 64 == 0 && p.k <= kMaxTopk, "k", [&] {
    return "expected a positive multiple of 64 up to " + std::to_string(kMaxTopk) + ", got " + std::to_string(p.k);
  });
  c.tensor(p.logits, "logits", {DType::kF32, DType::kBF16}, {"M", "W"});
  const int64_t M = c.ok() ? p.logits.shape[0] : 0;
  c.tensor(p.lengths, "lengths", {DType::kI32}, {{M, "M"}}, false);
  c.output(p.indices, "indices", {DType::kI32}, {{M, "M"}, {p.k, "k"}});
  c.optional_output(p.values, "values", {DType::kF32}, {{M, "M"}, {p.k, "k"}});
  return c;
}

}  // namespace

size_t topk_workspace_size(const TopkParams& p) {
  if (!check_topk(p).ok()) return 0;
#if defined(DSA_WITH_CUDA)
  if (p.logits.device.type == DeviceType::kCUDA) return gpu::topk_workspace_size(p);
#endif
  return cpu::topk_workspace_size(p);
}

Status topk(const TopkParams& p) {
  const char* op = "topk";
  core::ArgCheck c = check_topk(p);
  // Aliasing is checked by the op, not by the size query (which the planner runs on fake pointers).
  c.disjoint(p.indices, "indices", p.logits, "logits").disjoint(p.indices, "indices", p.lengths, "lengths");
  c.disjoint(p.values, "values", p.logits, "logits").disjoint(p.values, "values", p.lengths, "lengths");
  c.disjoint(p.values, "values", p.indices, "indices");
  if (c.ok() && p.workspace != nullptr && p.workspace_bytes > 0) {
    const TensorDesc ws = make_tensor(p.workspace, DType::kU8, {static_cast<int64_t>(p.workspace_bytes)}, p.logits.device);
    c.disjoint(ws, "workspace", p.logits, "logits").disjoint(ws, "workspace", p.lengths, "lengths");
    c.disjoint(ws, "workspace", p.indices, "indices").disjoint(ws, "workspace", p.values, "values");
  }
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.logits, "logits"}, {&p.lengths, "lengths"}, {&p.indices, "indices"}, {&p.values, "values"}}, &dev);
  if (!st.ok()) return st;
  if (dev.type == DeviceType::kCPU) {
    const int64_t M = p.logits.shape[0], W = p.logits.shape[1];
    for (int64_t i = 0; i < M; ++i) {
      const int64_t len = elem1<int32_t>(p.lengths, i);
      if (len >= 0 && len <= W) continue;
      c.require(false, at("lengths", i).c_str(),
                "expected in [0, W = " + std::to_string(W) + "], got " + std::to_string(len));
      return c.status();
    }
    // The CPU runs with as many row slots as the workspace holds (topk_workspace_size gives one
    // per thread); it needs at least one.
    const size_t need = cpu::topk_min_workspace_size(p);
    if (p.workspace_bytes < need || (need > 0 && p.workspace == nullptr)) {
      return Status(StatusCode::kWorkspaceTooSmall,
                    "topk: workspace: expected at least " + std::to_string(need) + " bytes (8 per column of logits; " +
                        "topk_workspace_size = " + std::to_string(cpu::topk_workspace_size(p)) + " for all threads), got " +
                        std::to_string(p.workspace_bytes));
    }
  }
#if defined(DSA_WITH_CUDA)
  if (dev.type == DeviceType::kCUDA) {
    const size_t need = gpu::topk_workspace_size(p);
    if (p.workspace_bytes < need || (need > 0 && p.workspace == nullptr)) {
      return Status(StatusCode::kWorkspaceTooSmall,
                    "topk: workspace: expected " + std::to_string(need) + " bytes (topk_workspace_size), got " +
                        std::to_string(p.workspace_bytes));
    }
  }
#endif
  return core::backend_status(op, dev, DSA_DISPATCH(dev, topk, p));
}

Status map_indices(const MapIndicesParams& p) {
  const char* op = "map_indices";
  core::ArgCheck c(op);
  c.tensor(p.indices, "indices", {DType::kI32}, {"M", "k"});
  const int64_t M = c.ok() ? p.indices.shape[0] : 0;
  const int64_t K = c.ok() ? p.indices.shape[1] : 0;
  c.output(p.out, "out", {DType::kI32}, {{M, "M"}, {K, "k"}});
  c.disjoint(p.out, "out", p.indices, "indices", /*alias_ok=*/true);
  c.optional(p.row_seq, "row_seq", {DType::kI32}, {{M, "M"}}, false);
  c.disjoint(p.out, "out", p.row_seq, "row_seq");
  c.require(p.row_seq.present() || p.rows_per_seq >= 1, "rows_per_seq",
            [&] { return "expected >= 1, got " + std::to_string(p.rows_per_seq); });
  c.require(p.kind == IndexMapKind::kFlat || p.kind == IndexMapKind::kPaged, "kind",
            "expected kFlat or kPaged");
  int64_t B = 0;
  if (c.ok() && p.kind == IndexMapKind::kFlat) {
    c.tensor(p.kv_start, "kv_start", {DType::kI32}, {"B"}, false);
    c.disjoint(p.out, "out", p.kv_start, "kv_start");
    B = c.ok() ? p.kv_start.shape[0] : 0;
  } else if (c.ok()) {
    c.tensor(p.block_table, "block_table", {DType::kI32}, {"B", "max_blocks"});
    c.require(p.page_size > 0 && p.page_size <= 2147483647, "page_size",
              [&] { return "expected in [1, 2^31 - 1], got " + std::to_string(p.page_size); });
    c.require(p.num_blocks >= 0, "num_blocks",
              [&] { return "expected >= 0 (0: unchecked), got " + std::to_string(p.num_blocks); });
    c.disjoint(p.out, "out", p.block_table, "block_table");
    B = c.ok() ? p.block_table.shape[0] : 0;
  }
  if (c.ok() && !p.row_seq.present() && M > 0) {
    const int64_t need = (M - 1) / p.rows_per_seq + 1;
    c.require(need <= B, p.kind == IndexMapKind::kFlat ? "kv_start" : "block_table", [&] {
      return "expected at least (M - 1) / rows_per_seq + 1 = " + std::to_string(need) + " sequences, got B = " +
             std::to_string(B);
    });
  }
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.indices, "indices"}, {&p.out, "out"}, {&p.row_seq, "row_seq"}, {&p.kv_start, "kv_start"}, {&p.block_table, "block_table"}}, &dev);
  if (!st.ok()) return st;
  if (dev.type == DeviceType::kCPU) {
    for (int64_t i = 0; p.row_seq.present() && i < M; ++i) {
      const int64_t s = elem1<int32_t>(p.row_seq, i);
      if (s >= 0 && s < B) continue;
      c.require(false, at("row_seq", i).c_str(),
                "expected in [0, B = " + std::to_string(B) + "), got " + std::to_string(s));
      return c.status();
    }
    for (int64_t b = 0; p.kind == IndexMapKind::kFlat && b < B; ++b) {
      const int64_t s = elem1<int32_t>(p.kv_start, b);
      if (s >= 0) continue;
      c.require(false, at("kv_start", b).c_str(), "expected >= 0, got " + std::to_string(s));
      return c.status();
    }
    // Every address the map produces must fit int32, and (paged, num_blocks given) every
    // block-table entry it reads must be a page of the cache. Checked before anything is
    // written (out may alias indices).
    constexpr int64_t kMaxI32 = 2147483647;
    const bool paged = p.kind == IndexMapKind::kPaged;
    const int64_t page = p.page_size;
    const int64_t max_blocks = paged ? p.block_table.shape[1] : 0;
    for (int64_t i = 0; i < M; ++i) {
      const int64_t seq = p.row_seq.present() ? elem1<int32_t>(p.row_seq, i) : i / p.rows_per_seq;
      const int32_t* in = p.indices.ptr<const int32_t>() + i * p.indices.stride[0];
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = in[k];
        if (j < 0) continue;
        if (!paged) {
          const int64_t start = elem1<int32_t>(p.kv_start, seq);
          if (start + j <= kMaxI32) continue;
          c.require(false, at("kv_start", seq).c_str(),
                    "expected kv_start[b] + index to fit int32, got " + std::to_string(start) + " + indices[" +
                        std::to_string(i) + "][" + std::to_string(k) + "] = " + std::to_string(j) + " = " +
                        std::to_string(start + j) + " > 2^31 - 1");
          return c.status();
        }
        if (j / page >= max_blocks) continue;  // past the table: -1, as documented
        const int64_t blk = p.block_table.ptr<const int32_t>()[seq * p.block_table.stride[0] + (j / page) * p.block_table.stride[1]];
        if (blk < 0) continue;
        // The entry's name is built only for a message (this loop visits every index).
        const auto entry = [&] { return "block_table[" + std::to_string(seq) + "][" + std::to_string(j / page) + "]"; };
        if (p.num_blocks > 0 && blk >= p.num_blocks) {
          c.require(false, entry().c_str(),
                    "expected a page of the cache in [0, num_blocks = " + std::to_string(p.num_blocks) + "), got " +
                        std::to_string(blk) + " (read for indices[" + std::to_string(i) + "][" + std::to_string(k) + "])");
          return c.status();
        }
        if (core::saturating_add(core::saturating_mul(blk, page), j % page) > kMaxI32) {
          c.require(false, entry().c_str(),
                    "expected block * page_size + offset to fit int32, got " + std::to_string(blk) + " * " +
                        std::to_string(page) + " + " + std::to_string(j % page) + " > 2^31 - 1");
          return c.status();
        }
      }
    }
  }
  return core::backend_status(op, dev, DSA_DISPATCH(dev, map_indices, p));
}

}  // namespace dsa
