// Stage: validate. The batch (q_lens, kv_lens, B, T) and every tensor the step hands the ops,
// against the plan, before anything is written.
#include "core/step/step.h"
#include "core/validate.h"

namespace dsa {
namespace core {
namespace step {
namespace {

bool host_i32_vector(const TensorDesc& t) {
  return t.present() && t.dtype == DType::kI32 && t.ndim == 1 && t.device.type == DeviceType::kCPU &&
         (t.shape[0] == 0 || t.data != nullptr);
}

}  // namespace

Status validate(const Plan& plan, const StepParams& p, BatchShape* out) {
  const PlannerConfig& cfg = plan.config;
  const ModelGeometry& g = cfg.geometry;
  const Device dev = cfg.device;
  const int64_t K = g.topk, H = g.num_heads, Hi = g.index_heads;

  // ---- the batch against the plan ----
  if (p.role != IndexerRole::kFull && p.role != IndexerRole::kShared && p.role != IndexerRole::kMtp)
    return invalid("role: expected full, shared or mtp");
  const bool scores = p.role != IndexerRole::kShared;
  if (!host_i32_vector(p.q_lens)) return invalid("q_lens: expected a [B] i32 tensor in host memory");
  if (!host_i32_vector(p.kv_lens)) return invalid("kv_lens: expected a [B] i32 tensor in host memory");
  const int64_t B = p.q_lens.shape[0];
  if (p.kv_lens.shape[0] != B)
    return invalid("kv_lens: expected [B = " + num(B) + "] like q_lens, got [" + num(p.kv_lens.shape[0]) + "]");
  if (B > cfg.max_seqs_per_step)
    return limit("batch: B = " + num(B) + " sequences exceeds the plan's max_seqs_per_step = " + num(cfg.max_seqs_per_step));
  if (!p.q.present() || p.q.ndim != 3 || p.q.shape[1] != H || p.q.shape[2] != kQkDim)
    return invalid("q: expected [T, H = " + num(H) + ", 576] (the plan's geometry)");
  const int64_t T = p.q.shape[0];
  if (T > plan.max_rows)
    return limit("batch: T = " + num(T) + " tokens exceeds the plan's max_tokens_per_step = " + num(cfg.max_tokens_per_step) +
                 (plan.max_rows > cfg.max_tokens_per_step ? " (max_seqs_per_step * max_next_n = " + num(plan.max_rows) + " rows)" : ""));
  if (p.q.device != dev) return invalid("q: expected on the plan's device " + std::string(device_type_name(dev.type)));
  int64_t sum_q = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = p.q_lens.ptr<const int32_t>()[b * p.q_lens.stride[0]];
    const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    if (ql < 0 || ql > kl)
      return invalid("q_lens[" + num(b) + "]: expected 0 <= q_len <= kv_len = " + num(kl) + ", got " + num(ql));
    if (kl > cfg.max_context)
      return limit("kv_lens[" + num(b) + "] = " + num(kl) + " exceeds the plan's max_context = " + num(cfg.max_context));
    sum_q += ql;
  }
  if (sum_q != T) return invalid("q_lens: expected Σ q_lens = T = " + num(T) + ", got " + num(sum_q));
  if (!p.block_table.present() || p.block_table.ndim != 2 || p.block_table.shape[0] != B)
    return invalid("block_table: expected [B = " + num(B) + ", max_blocks] i32");
  if (!p.mla_cache.present()) return invalid("mla_cache: expected the layer's MLA cache (data and num_blocks > 0)");
  if (scores && !p.index_cache.present())
    return invalid("index_cache: expected the layer's indexer cache (full and mtp layers own one)");
  if (p.mla_cache.page_size != cfg.page_size)
    return invalid("mla_cache: expected page_size = " + num(cfg.page_size) + " (the plan's), got " + num(p.mla_cache.page_size));
  if (scores && p.index_cache.page_size != cfg.page_size)
    return invalid("index_cache: expected page_size = " + num(cfg.page_size) + " (the plan's; one block table serves both caches), got " +
                   num(p.index_cache.page_size));
  if (p.role == IndexerRole::kShared) {
    if (!p.indices_in.present() || p.indices_in.ndim != 2 || p.indices_in.shape[0] != T || p.indices_in.shape[1] != K)
      return invalid("indices_in: expected [T = " + num(T) + ", topk = " + num(K) + "] i32 from the last full layer (shared layer)");
    if (p.indices_out.present()) return invalid("indices_out: expected none for a shared layer (it selects nothing; reuse indices_in)");
  } else if (p.indices_out.present() &&
             (p.indices_out.ndim != 2 || p.indices_out.shape[0] != T || p.indices_out.shape[1] != K)) {
    return invalid("indices_out: expected [T = " + num(T) + ", topk = " + num(K) + "] i32");
  }
  {
    // Whole-step shapes: the step hands the ops row slices, so a short tensor must fail here.
    core::ArgCheck c(kOp);
    c.tensor(p.q, "q", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {kQkDim, "576"}});
    c.tensor(p.block_table, "block_table", {DType::kI32}, {{B, "B"}, "max_blocks"});
    c.tensor(p.kv_c, "kv_c", {DType::kBF16, DType::kF32}, {{T, "T"}, {kLatentDim, "512"}});
    c.tensor(p.k_pe, "k_pe", {DType::kBF16, DType::kF32}, {{T, "T"}, {kRopeDim, "64"}});
    c.tensor(p.out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {kLatentDim, "512"}});
    c.tensor(p.lse, "lse", {DType::kF32}, {{T, "T"}, {H, "H"}}, false);
    c.optional(p.attn_sink, "attn_sink", {DType::kF32}, {{H, "H"}}, false);
    c.optional(p.positions, "positions", {DType::kI32}, {{T, "T"}}, false);
    if (scores) {
      c.tensor(p.index_q, "index_q", {DType::kBF16, DType::kF32}, {{T, "T"}, {Hi, "H_idx"}, {kIndexHeadDim, "128"}});
      c.tensor(p.index_w, "index_w", {DType::kBF16, DType::kF32}, {{T, "T"}, {Hi, "H_idx"}}, false);
      c.tensor(p.index_k, "index_k", {DType::kBF16, DType::kF32}, {{T, "T"}, {kIndexHeadDim, "128"}});
      c.tensor(p.cos_sin, "cos_sin", {DType::kF32}, {"max_positions", {kIndexRopeDim, "64"}});
    }
    c.optional(p.indices_in, "indices_in", {DType::kI32}, {{T, "T"}, {K, "topk"}});
    c.optional(p.indices_out, "indices_out", {DType::kI32}, {{T, "T"}, {K, "topk"}});
    if (!c.ok()) return c.status();
  }
  if (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < plan.workspace_bytes)
    return Status(StatusCode::kWorkspaceTooSmall, std::string(kOp) + ": workspace: expected at least " +
                                                      num(plan.workspace_bytes) + " bytes (plan.workspace_bytes), got " +
                                                      (p.workspace ? num(static_cast<int64_t>(p.workspace_bytes)) : "none"));
  out->B = B;
  out->T = T;
  out->scores = scores;
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
