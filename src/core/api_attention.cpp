// Public sparse and dense MLA attention: validate, pick the device, dispatch (SPEC §5, §7).
#include <cmath>
#include <string>

#include "core/dispatch.h"
#include "dsa/attention.h"

namespace dsa {
namespace {

constexpr int64_t kQkDim = 576;
constexpr int64_t kVDim = 512;

std::string num(int64_t v) { return std::to_string(v); }

// Exactly one key source; its shape or cache layout. Returns the number of addressable keys.
int64_t check_kv(core::ArgCheck& c, const MlaKv& kv, bool on_cuda) {
  const bool flat = kv.flat.present();
  const bool paged = kv.paged.data != nullptr || kv.paged.num_blocks != 0;
  c.require(flat != paged, "kv", [&] {
    return std::string("expected exactly one of kv.flat and kv.paged, got ") + (flat ? "both" : "neither");
  });
  if (!c.ok()) return 0;
  if (flat) {
    c.tensor(kv.flat, "kv.flat", {DType::kBF16, DType::kF32}, {"S", {kQkDim, "576"}});
    if (on_cuda) c.require(kv.flat.dtype == DType::kBF16, "kv.flat", "expected dtype bf16 on CUDA, got f32");
    return c.ok() ? kv.flat.shape[0] : 0;
  }
  c.mla_cache(kv.paged, "kv.paged");
  return c.ok() ? kv.paged.num_slots() : 0;
}

// q, sink, out, lse and sm_scale: shared by both ops.
void check_common(core::ArgCheck& c, const TensorDesc& q, const TensorDesc& sink, float sm_scale,
                  const TensorDesc& out, const TensorDesc& lse) {
  c.tensor(q, "q", {DType::kBF16, DType::kF32}, {"T", "H", {kQkDim, "576"}});
  if (!c.ok()) return;
  const int64_t T = q.shape[0], H = q.shape[1];
  c.optional(sink, "attn_sink", {DType::kF32}, {{H, "H"}}, false);
  c.output(out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {kVDim, "512"}});
  c.output(lse, "lse", {DType::kF32}, {{T, "T"}, {H, "H"}}, false);
  c.require(std::isfinite(sm_scale) && sm_scale > 0.f, "sm_scale",
            [&] { return "expected a finite value > 0, got " + std::to_string(sm_scale); });
}

// out and lse must not share memory with any input.
void check_outputs_disjoint(core::ArgCheck& c, const TensorDesc& out, const TensorDesc& lse, const MlaKv& kv,
                            std::initializer_list<std::pair<const TensorDesc*, const char*>> inputs,
                            const TensorDesc& q, const TensorDesc& sink) {
  const TensorDesc cache = core::cache_bytes(kv.paged);
  c.disjoint(lse, "lse", out, "out");
  for (const auto& o : {std::make_pair(&out, "out"), std::make_pair(&lse, "lse")}) {
    c.disjoint(*o.first, o.second, kv.flat, "kv.flat").disjoint(*o.first, o.second, cache, "kv.paged");
    c.disjoint(*o.first, o.second, q, "q").disjoint(*o.first, o.second, sink, "attn_sink");
    for (const auto& in : inputs) c.disjoint(*o.first, o.second, *in.first, in.second);
  }
}

bool cuda_device_of(const TensorDesc& q) { return q.device.type == DeviceType::kCUDA; }

// aliasing: also check that outputs share no memory with inputs (the op does; the size
// queries do not: the planner asks them about descriptors over one fake pointer).
Status validate_sparse(const SparseMlaParams& p, Device* dev, bool aliasing) {
  core::ArgCheck c("sparse_mla");
  check_common(c, p.q, p.attn_sink, p.sm_scale, p.out, p.lse);
  if (!c.ok()) return c.status();
  const bool on_cuda = cuda_device_of(p.q);
  if (on_cuda) c.require(p.q.dtype == DType::kBF16, "q", "expected dtype bf16 on CUDA, got f32");
  const int64_t T = p.q.shape[0];
  check_kv(c, p.kv, on_cuda);
  c.tensor(p.indices, "indices", {DType::kI32}, {{T, "T"}, "K"}, false);
  c.optional(p.topk_length, "topk_length", {DType::kI32}, {{T, "T"}}, false);
  if (aliasing) check_outputs_disjoint(c, p.out, p.lse, p.kv, {{&p.indices, "indices"}, {&p.topk_length, "topk_length"}},
                                       p.q, p.attn_sink);
  if (!c.ok()) return c.status();
  const Device* cache_dev = p.kv.paged.data ? &p.kv.paged.device : nullptr;
  Status st = core::pick_device("sparse_mla",
                                {{&p.q, "q"}, {&p.kv.flat, "kv.flat"}, {&p.indices, "indices"}, {&p.topk_length, "topk_length"}, {&p.attn_sink, "attn_sink"}, {&p.out, "out"}, {&p.lse, "lse"}},
                                dev, {cache_dev});
  if (!st.ok()) return st;
  if (dev->type == DeviceType::kCPU && p.topk_length.present()) {
    // Indices themselves are never errors (invalid ones do not contribute), but a length
    // outside [0, K] describes no row of `indices`.
    const int64_t K = p.indices.shape[1];
    for (int64_t t = 0; t < T && c.ok(); ++t) {
      const int64_t len = p.topk_length.ptr<int32_t>()[t * p.topk_length.stride[0]];
      c.require(len >= 0 && len <= K, "topk_length", [&] {
        return "expected values in [0, K = " + num(K) + "], got topk_length[" + num(t) + "] = " + num(len);
      });
    }
  }
  return c.status();
}

Status validate_dense(const DenseMlaParams& p, Device* dev, bool aliasing) {
  core::ArgCheck c("dense_mla");
  check_common(c, p.q, p.attn_sink, p.sm_scale, p.out, p.lse);
  if (!c.ok()) return c.status();
  const bool on_cuda = cuda_device_of(p.q);
  if (on_cuda) c.require(p.q.dtype == DType::kBF16, "q", "expected dtype bf16 on CUDA, got f32");
  const int64_t T = p.q.shape[0];
  const int64_t num_keys = check_kv(c, p.kv, on_cuda);
  c.tensor(p.cu_seqlens_q, "cu_seqlens_q", {DType::kI32}, {"B + 1"}, false);
  if (!c.ok()) return c.status();
  c.require(p.cu_seqlens_q.shape[0] >= 1, "cu_seqlens_q", "expected at least one entry ([B + 1]), got [0]");
  const int64_t B = p.cu_seqlens_q.shape[0] - 1;
  const bool paged = !p.kv.flat.present();
  if (!paged) {
    c.tensor(p.cu_seqlens_k, "cu_seqlens_k", {DType::kI32}, {{B + 1, "B + 1"}}, false);
    c.require(!p.block_table.present(), "block_table", "expected only with kv.paged (kv.flat was given)");
    c.require(!p.kv_lens.present(), "kv_lens", "expected only with kv.paged (kv.flat was given)");
  } else {
    c.tensor(p.block_table, "block_table", {DType::kI32}, {{B, "B"}, "max_blocks"}, false);
    c.tensor(p.kv_lens, "kv_lens", {DType::kI32}, {{B, "B"}}, false);
    c.require(!p.cu_seqlens_k.present(), "cu_seqlens_k", "expected only with kv.flat (kv.paged was given)");
  }
  if (aliasing)
    check_outputs_disjoint(c, p.out, p.lse, p.kv,
                         {{&p.cu_seqlens_q, "cu_seqlens_q"}, {&p.cu_seqlens_k, "cu_seqlens_k"},
                          {&p.block_table, "block_table"}, {&p.kv_lens, "kv_lens"}},
                           p.q, p.attn_sink);
  if (!c.ok()) return c.status();
  const Device* cache_dev = paged ? &p.kv.paged.device : nullptr;
  Status st = core::pick_device("dense_mla",
                                {{&p.q, "q"}, {&p.kv.flat, "kv.flat"}, {&p.cu_seqlens_q, "cu_seqlens_q"}, {&p.cu_seqlens_k, "cu_seqlens_k"}, {&p.block_table, "block_table"},
                                 {&p.kv_lens, "kv_lens"}, {&p.attn_sink, "attn_sink"}, {&p.out, "out"}, {&p.lse, "lse"}},
                                dev, {cache_dev});
  if (!st.ok() || dev->type != DeviceType::kCPU) return st;

  // Contents that would send the kernel out of bounds (host memory only).
  auto at = [](const TensorDesc& t, int64_t i) -> int64_t { return t.ptr<int32_t>()[i * t.stride[0]]; };
  // Every message below is built only when its check fails (these loops visit every
  // sequence and page of the batch).
  c.require(at(p.cu_seqlens_q, 0) == 0, "cu_seqlens_q",
            [&] { return "expected cu_seqlens_q[0] = 0, got " + num(at(p.cu_seqlens_q, 0)); });
  for (int64_t b = 0; b < B && c.ok(); ++b) {
    c.require(at(p.cu_seqlens_q, b + 1) >= at(p.cu_seqlens_q, b), "cu_seqlens_q", [&] {
      return "expected non-decreasing values, got cu_seqlens_q[" + num(b + 1) + "] = " + num(at(p.cu_seqlens_q, b + 1)) +
             " < cu_seqlens_q[" + num(b) + "] = " + num(at(p.cu_seqlens_q, b));
    });
  }
  c.require(!c.ok() || at(p.cu_seqlens_q, B) == T, "cu_seqlens_q",
            [&] { return "expected cu_seqlens_q[B] = T = " + num(T) + ", got " + num(at(p.cu_seqlens_q, B)); });
  if (!paged) {
    c.require(at(p.cu_seqlens_k, 0) >= 0, "cu_seqlens_k",
              [&] { return "expected cu_seqlens_k[0] >= 0, got " + num(at(p.cu_seqlens_k, 0)); });
    for (int64_t b = 0; b < B && c.ok(); ++b) {
      c.require(at(p.cu_seqlens_k, b + 1) >= at(p.cu_seqlens_k, b), "cu_seqlens_k", [&] {
        return "expected non-decreasing values, got cu_seqlens_k[" + num(b + 1) + "] = " +
               num(at(p.cu_seqlens_k, b + 1)) + " < cu_seqlens_k[" + num(b) + "] = " + num(at(p.cu_seqlens_k, b));
      });
    }
    c.require(!c.ok() || at(p.cu_seqlens_k, B) <= num_keys, "cu_seqlens_k",
              [&] { return "expected cu_seqlens_k[B] <= S = " + num(num_keys) + ", got " + num(at(p.cu_seqlens_k, B)); });
  }
  const int64_t page = paged ? p.kv.paged.page_size : 1;
  const int64_t max_blocks = paged ? p.block_table.shape[1] : 0;
  for (int64_t b = 0; b < B && c.ok(); ++b) {
    const int64_t q_len = at(p.cu_seqlens_q, b + 1) - at(p.cu_seqlens_q, b);
    int64_t kv_len;
    if (!paged) {
      kv_len = at(p.cu_seqlens_k, b + 1) - at(p.cu_seqlens_k, b);
    } else {
      kv_len = at(p.kv_lens, b);
      const int64_t cap = core::saturating_mul(max_blocks, page);
      c.require(kv_len >= 0 && kv_len <= cap, "kv_lens", [&] {
        return "expected values in [0, max_blocks * page_size = " + num(cap) + "], got kv_lens[" + num(b) + "] = " +
               num(kv_len);
      });
      const int32_t* row = p.block_table.ptr<int32_t>() + b * p.block_table.stride[0];
      const int64_t used = (kv_len + page - 1) / page;
      for (int64_t j = 0; j < used && c.ok(); ++j) {
        const int64_t blk = row[j * p.block_table.stride[1]];
        c.require(blk >= 0 && blk < p.kv.paged.num_blocks, "block_table", [&] {
          return "expected entries in [0, num_blocks = " + num(p.kv.paged.num_blocks) + ") for the " + num(used) +
                 " pages that kv_lens[" + num(b) + "] uses, got block_table[" + num(b) + "][" + num(j) + "] = " + num(blk);
        });
      }
    }
    c.require(!c.ok() || q_len <= kv_len, paged ? "kv_lens" : "cu_seqlens_k", [&] {
      return "expected q_len <= kv_len for every sequence, got q_len = " + num(q_len) + " > kv_len = " + num(kv_len) +
             " for sequence " + num(b);
    });
  }
  return c.status();
}

#if defined(DSA_WITH_CUDA)
// The caller's workspace against the backend's query (CUDA only; the CPU needs none).
Status check_workspace(const char* op, size_t need, const void* ws, size_t have) {
  if (need == 0 || (ws != nullptr && have >= need)) return Status::Ok();
  return Status(StatusCode::kWorkspaceTooSmall,
                std::string(op) + ": workspace: expected at least " + std::to_string(need) + " bytes, got " +
                    (ws ? std::to_string(have) : std::string("none")));
}
#endif

}  // namespace

size_t sparse_mla_workspace_size(const SparseMlaParams& p) {
  Device dev;
  if (!validate_sparse(p, &dev, false).ok()) return 0;
#if defined(DSA_WITH_CUDA)
  if (dev.type == DeviceType::kCUDA) return gpu::sparse_mla_workspace_size(p);
#endif
  return 0;
}

Status sparse_mla(const SparseMlaParams& p) {
  Device dev;
  Status st = validate_sparse(p, &dev, true);
  if (!st.ok()) return st;
#if defined(DSA_WITH_CUDA)
  if (dev.type == DeviceType::kCUDA) {
    st = check_workspace("sparse_mla", gpu::sparse_mla_workspace_size(p), p.workspace, p.workspace_bytes);
    if (!st.ok()) return st;
  }
#endif
  return core::backend_status("sparse_mla", dev, DSA_DISPATCH(dev, sparse_mla, p));
}

size_t dense_mla_workspace_size(const DenseMlaParams& p) {
  Device dev;
  if (!validate_dense(p, &dev, false).ok()) return 0;
#if defined(DSA_WITH_CUDA)
  if (dev.type == DeviceType::kCUDA) return gpu::dense_mla_workspace_size(p);
#endif
  return 0;
}

Status dense_mla(const DenseMlaParams& p) {
  Device dev;
  Status st = validate_dense(p, &dev, true);
  if (!st.ok()) return st;
#if defined(DSA_WITH_CUDA)
  if (dev.type == DeviceType::kCUDA) {
    st = check_workspace("dense_mla", gpu::dense_mla_workspace_size(p), p.workspace, p.workspace_bytes);
    if (!st.ok()) return st;
  }
#endif
  return core::backend_status("dense_mla", dev, DSA_DISPATCH(dev, dense_mla, p));
}

}  // namespace dsa
