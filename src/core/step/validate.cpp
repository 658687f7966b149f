// Stage: validate. The batch (q_lens, kv_lens, B, T) and every tensor the step hands the ops,
// against the plan, before anything is written.
#include <algorithm>
#include <exception>
#include <vector>

#include "core/step/step.h"
#include "core/mha_layout.h"
#include "core/validate.h"

namespace dsa {
namespace core {
namespace step {
namespace {

bool host_i32_vector(const TensorDesc& t) {
  return t.present() && t.dtype == DType::kI32 && t.ndim == 1 && t.device.type == DeviceType::kCPU &&
         (t.shape[0] == 0 || t.data != nullptr);
}

// `name` as a [B] i32 host vector: a wrong dtype is said as "expected dtype" (a TypeError in
// Python), anything else as the whole expectation.
Status check_host_i32(const TensorDesc& t, const char* name, const char* alt) {
  if (host_i32_vector(t)) return Status::Ok();
  if (t.present() && t.dtype != DType::kI32)
    return invalid(std::string(name) + ": expected dtype i32, got " + dtype_name(t.dtype));
  return invalid(std::string(name) + ": expected a [B] i32 tensor in host memory" + alt + ", got " + describe(t));
}

// Contents of the step's inputs that the host can read, so that a step refused for them has
// written nothing (an atomic step): every page a sequence's kv_len covers exists in the block
// table's row and names a page of both caches; RoPE positions index rows of cos_sin; a shared
// layer's indices_in are -1 or a key the row sees. Device-resident contents (CUDA block
// tables, positions, indices_in) are the engine's to keep valid (docs/engine-integration.md).
Status check_contents(const Plan& plan, const StepParams& p, int64_t B, bool scores) {
  // Device-resident kv_lens (device_lengths on CUDA): only their bound, max_context, is known.
  if (p.device_lengths && p.kv_lens.device.type != DeviceType::kCPU) {
    if (scores && !p.positions.present() && p.cos_sin.shape[0] < plan.config.max_context)
      return invalid("cos_sin: expected at least max_context = " + num(plan.config.max_context) +
                     " rows (device_lengths: cache positions up to the plan's max_context), got " + num(p.cos_sin.shape[0]));
    return Status::Ok();
  }
  const int64_t page = plan.config.page_size;
  const int64_t max_blocks = p.block_table.shape[1];
  int64_t num_blocks = p.mla_cache.num_blocks;
  if (scores) num_blocks = std::min<int64_t>(num_blocks, p.index_cache.num_blocks);
  const bool host_bt = p.block_table.device.type == DeviceType::kCPU;
  const int32_t* bt = p.block_table.ptr<const int32_t>();
  int64_t max_kv = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    max_kv = std::max(max_kv, kl);
    const int64_t pages = (kl + page - 1) / page;
    if (pages > max_blocks)
      return invalid("block_table: expected at least " + num(pages) + " pages in row " + num(b) + " for kv_lens[" + num(b) +
                     "] = " + num(kl) + " (page_size " + num(page) + "), got max_blocks = " + num(max_blocks));
  }
  for (int64_t b = 0; b < B && host_bt; ++b) {
    const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    const int64_t pages = (kl + page - 1) / page;
    for (int64_t j = 0; j < pages; ++j) {
      const int64_t v = bt[b * p.block_table.stride[0] + j * p.block_table.stride[1]];
      if (v < 0 || v >= num_blocks)
        return invalid("block_table[" + num(b) + ", " + num(j) + "]: expected a page in [0, num_blocks = " + num(num_blocks) +
                       ") (kv_lens[" + num(b) + "] = " + num(kl) + " covers it), got " + num(v));
    }
  }
  if (scores) {
    const int64_t rows = p.cos_sin.shape[0];
    if (!p.positions.present()) {
      if (max_kv > rows)
        return invalid("cos_sin: expected at least " + num(max_kv) + " rows (the batch's cache positions), got " + num(rows));
    } else if (p.positions.device.type == DeviceType::kCPU) {
      for (int64_t t = 0; t < p.positions.shape[0]; ++t) {
        const int64_t v = p.positions.dtype == DType::kI64 ? p.positions.ptr<const int64_t>()[t * p.positions.stride[0]]
                                                           : p.positions.ptr<const int32_t>()[t * p.positions.stride[0]];
        if (v < 0 || v >= rows)
          return invalid("positions[" + num(t) + "]: expected 0 <= position < cos_sin rows = " + num(rows) + ", got " + num(v));
      }
    }
  }
  if (p.role == IndexerRole::kShared && p.indices_in.device.type == DeviceType::kCPU) {
    const TensorDesc& in = p.indices_in;
    int64_t t = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t ql = p.device_lengths ? p.next_n : batch_q_len(p, b);
      const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
      if (kl <= plan.config.geometry.topk && !p.device_lengths) {  // dense rows: indices_in is not read
        t += ql;
        continue;
      }
      for (int64_t i = 0; i < ql; ++i, ++t) {
        const int64_t len = kl - ql + i + 1;
        for (int64_t j = 0; j < in.shape[1]; ++j) {
          const int64_t v = in.ptr<const int32_t>()[t * in.stride[0] + j * in.stride[1]];
          if (v < -1 || v >= len)
            return invalid("indices_in[" + num(t) + ", " + num(j) + "]: expected -1 or a key 0 <= index < " + num(len) +
                           " (the row's visible keys), got " + num(v));
        }
      }
    }
  }
  return Status::Ok();
}

// q_lens [B] i32, or cu_seqlens [B + 1] i32/i64 (0, nondecreasing), in host memory.
Status check_q_lens(const StepParams& p) {
  if (!p.cu_seqlens.present()) return check_host_i32(p.q_lens, "q_lens", " (or cu_seqlens [B + 1])");
  const TensorDesc& c = p.cu_seqlens;
  if (p.q_lens.present()) return invalid("q_lens, cu_seqlens: expected one of them, got both");
  if (c.dtype != DType::kI32 && c.dtype != DType::kI64)
    return invalid(std::string("cu_seqlens: expected dtype i32 or i64, got ") + dtype_name(c.dtype));
  if (c.ndim != 1 || c.shape[0] < 1 ||
      c.device.type != DeviceType::kCPU || c.data == nullptr)
    return invalid("cu_seqlens: expected a [B + 1] i32 or i64 tensor in host memory, got " + describe(c));
  if (cu_at(c, 0) != 0) return invalid("cu_seqlens[0]: expected 0, got " + num(cu_at(c, 0)));
  for (int64_t b = 0; b + 1 < c.shape[0]; ++b)
    if (cu_at(c, b + 1) < cu_at(c, b))
      return invalid("cu_seqlens[" + num(b + 1) + "]: expected >= cu_seqlens[" + num(b) + "] = " + num(cu_at(c, b)) +
                     ", got " + num(cu_at(c, b + 1)));
  return Status::Ok();
}

// A host-resident slot mapping: every slot -1 or the token's block-table slot, and a sequence
// padded whole or not at all. Why whole sequences: a real token's row must never share keys
// with a padded one, and the CUDA attention kernels read a sequence's keys in tiles, masking the
// keys past a row's causal limit; a padded token's unwritten slot (stale or NaN bytes) inside a
// tile of a real row would reach that row through the masked product (0 * NaN). Engines pad
// with requests of their own (vLLM's graph padding, SGLang's padded decode batches).
Status check_slot_mapping(const Plan& plan, const StepParams& p, int64_t B) {
  const TensorDesc& sm = p.slot_mapping;
  if (!sm.present() || sm.device.type != DeviceType::kCPU || p.kv_lens.device.type != DeviceType::kCPU ||
      p.block_table.device.type != DeviceType::kCPU)
    return Status::Ok();
  const int64_t page = plan.config.page_size;
  const int32_t* bt = p.block_table.ptr<const int32_t>();
  int64_t t = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = p.device_lengths ? p.next_n : batch_q_len(p, b);
    const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    const int64_t t0 = t;
    const bool first_padded = ql > 0 && sm.ptr<const int64_t>()[t0 * sm.stride[0]] == -1;
    for (int64_t i = 0; i < ql; ++i, ++t) {
      const int64_t v = sm.ptr<const int64_t>()[t * sm.stride[0]];
      const int64_t pos = kl - ql + i;
      const int64_t want = int64_t{bt[b * p.block_table.stride[0] + (pos / page) * p.block_table.stride[1]]} * page + pos % page;
      if (v == -1) {
        if (!first_padded)
          return invalid("slot_mapping[" + num(t) + "]: expected the token's block-table slot " + num(want) + " (sequence " +
                         num(b) + " has real tokens, and a sequence is padded whole or not at all: pad with sequences "
                         "of their own), got -1");
        continue;
      }
      if (first_padded)
        return invalid("slot_mapping[" + num(t) + "]: expected -1 like token " + num(t0) + " of sequence " + num(b) +
                       " (a sequence is padded whole or not at all: pad with sequences of their own), got " + num(v));
      if (v != want)
        return invalid("slot_mapping[" + num(t) + "]: expected -1 (padded) or the token's block-table slot " + num(want) +
                       " (sequence " + num(b) + ", position " + num(pos) + "), got " + num(v));
    }
  }
  return Status::Ok();
}

// The batch of a graph-stable decode step (device_lengths): B sequences of next_n tokens, kv_lens
// on the plan's device. *B and *T on success.
Status check_device_batch(const Plan& plan, const StepParams& p, int64_t* B_out, int64_t* T_out) {
  const PlannerConfig& cfg = plan.config;
  if (p.q_lens.present() || p.cu_seqlens.present())
    return invalid("q_lens, cu_seqlens: expected none with device_lengths (every sequence has next_n tokens), got " +
                   describe(p.q_lens.present() ? p.q_lens : p.cu_seqlens));
  if (p.next_n < 1 || p.next_n > cfg.max_next_n)
    return invalid("next_n: expected 1 <= next_n <= the plan's max_next_n = " + num(cfg.max_next_n) +
                   " (device_lengths), got " + num(p.next_n));
  const TensorDesc& kv = p.kv_lens;
  if (kv.present() && kv.dtype != DType::kI32)
    return invalid(std::string("kv_lens: expected dtype i32, got ") + dtype_name(kv.dtype));
  if (!kv.present() || kv.dtype != DType::kI32 || kv.ndim != 1 || kv.device != cfg.device || kv.data == nullptr)
    return invalid("kv_lens: expected a [B] i32 tensor on the plan's device " + std::string(device_type_name(cfg.device.type)) +
                   " (device_lengths), got " + describe(kv));
  const int64_t B = kv.shape[0];
  if (B > cfg.max_seqs_per_step)
    return limit("batch: B = " + num(B) + " sequences exceeds the plan's max_seqs_per_step = " + num(cfg.max_seqs_per_step));
  const int64_t T = B * p.next_n;
  if (T > plan.max_rows)
    return limit("batch: B * next_n = " + num(T) + " rows exceeds the plan's " + num(plan.max_rows) + " rows");
  const bool fused_max = plan.takes_fused(cfg.max_context);
  if ((fused_max ? plan.fused_max_context_rows_per_chunk : plan.max_context_rows_per_chunk) < 1)
    return limit("device_lengths: expected a plan that scores a row of max_context = " + num(cfg.max_context) +
                 " keys whole, but it tiles such rows (score_budget_bytes = " + num(plan.score_budget_bytes) +
                 "; raise it to at least " + num(plan.chunk_bytes(1, cfg.max_context)) + " or lower max_context)");
  if (kv.device.type == DeviceType::kCPU) {  // host-readable here: checked like host-planned lengths
    for (int64_t b = 0; b < B; ++b) {
      const int64_t kl = kv.ptr<const int32_t>()[b * kv.stride[0]];
      if (kl < p.next_n)
        return invalid("kv_lens[" + num(b) + "]: expected >= next_n = " + num(p.next_n) + ", got " + num(kl));
      if (kl > cfg.max_context)
        return limit("kv_lens[" + num(b) + "] = " + num(kl) + " exceeds the plan's max_context = " + num(cfg.max_context));
    }
  }
  if (p.block_table.present() && p.block_table.ndim == 2 && p.block_table.shape[1] * cfg.page_size < p.next_n)
    return invalid("block_table: expected max_blocks * page_size >= next_n = " + num(p.next_n) + ", got max_blocks = " +
                   num(p.block_table.shape[1]));
  *B_out = B;
  *T_out = T;
  return Status::Ok();
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
  int64_t B = 0, dev_T = 0;
  if (p.device_lengths) {
    if (Status st = check_device_batch(plan, p, &B, &dev_T); !st.ok()) return st;
  } else {
    if (Status st = check_q_lens(p); !st.ok()) return st;
    if (Status st = check_host_i32(p.kv_lens, "kv_lens", ""); !st.ok()) return st;
    B = batch_size(p);
    if (p.kv_lens.shape[0] != B)
      return invalid("kv_lens: expected [B = " + num(B) + "] like q_lens, got [" + num(p.kv_lens.shape[0]) + "]");
    if (B > cfg.max_seqs_per_step)
      return limit("batch: B = " + num(B) + " sequences exceeds the plan's max_seqs_per_step = " + num(cfg.max_seqs_per_step));
  }
  // Core mode (q_nope, q_pe, kv_b_proj instead of q; out [T, H, v]) or latent mode.
  const bool core = p.q_nope.present() || p.q_pe.present() || p.kv_b_proj.present();
  const int64_t nope = g.qk_nope_head_dim, vdim = g.v_head_dim;
  const TensorDesc& query = core ? p.q_nope : p.q;
  const char* query_name = core ? "q_nope" : "q";
  if (core) {
    if (!cfg.core_mode)
      return invalid("q_nope: core mode (q_nope / q_pe / kv_b_proj given) expected a plan made with core_mode = true; "
                     "this plan reserved no core-mode workspace");
    if (p.q.present()) return invalid("q: expected none in core mode (q_nope / q_pe / kv_b_proj given), got " + describe(p.q));
    if (!p.q_nope.present() || p.q_nope.ndim != 3 || p.q_nope.shape[1] != H || p.q_nope.shape[2] != nope)
      return invalid("q_nope: expected [T, H = " + num(H) + ", qk_nope = " + num(nope) + "] (core mode, the plan's geometry), got " +
                     describe(p.q_nope));
  } else if (!p.q.present() || p.q.ndim != 3 || p.q.shape[1] != H || p.q.shape[2] != kQkDim) {
    return invalid("q: expected [T, H = " + num(H) + ", 576] (the plan's geometry)");
  }
  if (p.dense_form != DenseForm::kAuto && p.dense_form != DenseForm::kMha && p.dense_form != DenseForm::kAbsorbed)
    return invalid("dense_form: expected auto, mha or absorbed");
  const int64_t T = query.shape[0];
  if (p.device_lengths && T != dev_T)
    return invalid(std::string(query_name) + ": expected T = B * next_n = " + num(dev_T) + " rows (device_lengths), got " + num(T));
  if (T > plan.max_rows)
    return limit("batch: T = " + num(T) + " tokens exceeds the plan's max_tokens_per_step = " + num(cfg.max_tokens_per_step) +
                 (plan.max_rows > cfg.max_tokens_per_step ? " (max_seqs_per_step * max_next_n = " + num(plan.max_rows) + " rows)" : ""));
  if (query.device != dev)
    return invalid(std::string(query_name) + ": expected on the plan's device " + std::string(device_type_name(dev.type)));
  int64_t sum_q = p.device_lengths ? T : 0;
  for (int64_t b = 0; b < B && !p.device_lengths; ++b) {
    const int64_t ql = batch_q_len(p, b);
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
    if (core) {
      if (dev.type == DeviceType::kCPU) c.tensor(p.q_nope, "q_nope", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {nope, "qk_nope_head_dim"}});
      else c.tensor(p.q_nope, "q_nope", {DType::kBF16}, {{T, "T"}, {H, "H"}, {nope, "qk_nope_head_dim"}});
      if (c.ok()) c.tensor(p.q_pe, "q_pe", {p.q_nope.dtype}, {{T, "T"}, {H, "H"}, {kRopeDim, "64"}});
      core::check_kv_b_proj(c, p.kv_b_proj, H, nope, vdim, " in core mode");
      if (c.ok() && p.kv_b_proj.device != dev)
        c.require(false, "kv_b_proj", "expected on the plan's device " + std::string(device_type_name(dev.type)) + ", got " +
                                          describe(p.kv_b_proj));
    } else {
      c.tensor(p.q, "q", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {kQkDim, "576"}});
    }
    c.tensor(p.block_table, "block_table", {DType::kI32}, {{B, "B"}, "max_blocks"});
    c.tensor(p.kv_c, "kv_c", {DType::kBF16, DType::kF32}, {{T, "T"}, {kLatentDim, "512"}});
    c.tensor(p.k_pe, "k_pe", {DType::kBF16, DType::kF32}, {{T, "T"}, {kRopeDim, "64"}});
    if (core) c.tensor(p.out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {vdim, "v_head_dim"}});
    else c.tensor(p.out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {kLatentDim, "512"}});
    c.tensor(p.lse, "lse", {DType::kF32}, {{T, "T"}, {H, "H"}}, false);
    c.optional(p.attn_sink, "attn_sink", {DType::kF32}, {{H, "H"}}, false);
    c.optional(p.positions, "positions", {DType::kI32, DType::kI64}, {{T, "T"}}, false);
    if (scores) {
      c.tensor(p.index_q, "index_q", {DType::kBF16, DType::kF32}, {{T, "T"}, {Hi, "H_idx"}, {kIndexHeadDim, "128"}});
      c.tensor(p.index_w, "index_w", {DType::kBF16, DType::kF32}, {{T, "T"}, {Hi, "H_idx"}}, false);
      c.tensor(p.index_k, "index_k", {DType::kBF16, DType::kF32}, {{T, "T"}, {kIndexHeadDim, "128"}});
      c.tensor(p.cos_sin, "cos_sin", {DType::kF32}, {"max_positions", {kIndexRopeDim, "64"}});
    }
    c.optional(p.slot_mapping, "slot_mapping", {DType::kI64}, {{T, "T"}}, false);
    c.optional(p.indices_in, "indices_in", {DType::kI32}, {{T, "T"}, {K, "topk"}});
    c.optional(p.indices_out, "indices_out", {DType::kI32}, {{T, "T"}, {K, "topk"}});
    if (!c.ok()) return c.status();
  }
  if (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < plan.workspace_bytes)
    return Status(StatusCode::kWorkspaceTooSmall, std::string(kOp) + ": workspace: expected at least " +
                                                      num(plan.workspace_bytes) + " bytes (plan.workspace_bytes), got " +
                                                      (p.workspace ? num(static_cast<int64_t>(p.workspace_bytes)) : "none"));
  if (p.slot_mapping.present() && p.slot_mapping.device != dev)
    return invalid("slot_mapping: expected on the plan's device " + std::string(device_type_name(dev.type)) + ", got " +
                   describe(p.slot_mapping));
  if (Status st = check_contents(plan, p, B, scores); !st.ok()) return st;
  if (Status st = check_slot_mapping(plan, p, B); !st.ok()) return st;
  out->B = B;
  out->T = T;
  out->scores = scores;
  return Status::Ok();
}

Status validate_batch(const Plan& plan, const StepParams& p, BatchShape* out) {
  const PlannerConfig& cfg = plan.config;
  const Device dev = cfg.device;
  int64_t B = 0, T = 0;
  if (p.device_lengths) {
    if (Status st = check_device_batch(plan, p, &B, &T); !st.ok()) return st;
  } else {
    if (Status st = check_q_lens(p); !st.ok()) return st;
    if (Status st = check_host_i32(p.kv_lens, "kv_lens", ""); !st.ok()) return st;
    B = batch_size(p);
    if (p.kv_lens.shape[0] != B)
      return invalid("kv_lens: expected [B = " + num(B) + "] like q_lens, got [" + num(p.kv_lens.shape[0]) + "]");
    if (B > cfg.max_seqs_per_step)
      return limit("batch: B = " + num(B) + " sequences exceeds the plan's max_seqs_per_step = " + num(cfg.max_seqs_per_step));
  }
  for (int64_t b = 0; b < B && !p.device_lengths; ++b) {
    const int64_t ql = batch_q_len(p, b);
    const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    if (ql < 0 || ql > kl)
      return invalid("q_lens[" + num(b) + "]: expected 0 <= q_len <= kv_len = " + num(kl) + ", got " + num(ql));
    if (kl > cfg.max_context)
      return limit("kv_lens[" + num(b) + "] = " + num(kl) + " exceeds the plan's max_context = " + num(cfg.max_context));
    T += ql;
  }
  if (T > plan.max_rows)
    return limit("batch: T = Σ q_lens = " + num(T) + " tokens exceeds the plan's max_tokens_per_step = " +
                 num(cfg.max_tokens_per_step) +
                 (plan.max_rows > cfg.max_tokens_per_step ? " (max_seqs_per_step * max_next_n = " + num(plan.max_rows) + " rows)" : ""));
  {
    ArgCheck c(kOp);
    c.tensor(p.block_table, "block_table", {DType::kI32}, {{B, "B"}, "max_blocks"});
    c.optional(p.positions, "positions", {DType::kI32, DType::kI64}, {{T, "T"}}, false);
    if (!c.ok()) return c.status();
  }
  if (p.block_table.device != dev)
    return invalid("block_table: expected on the plan's device " + std::string(device_type_name(dev.type)));
  if (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < plan.workspace_bytes)
    return Status(StatusCode::kWorkspaceTooSmall, std::string(kOp) + ": workspace: expected at least " +
                                                      num(plan.workspace_bytes) + " bytes (plan.workspace_bytes), got " +
                                                      (p.workspace ? num(static_cast<int64_t>(p.workspace_bytes)) : "none"));
  out->B = B;
  out->T = T;
  out->scores = p.role != IndexerRole::kShared;
  return Status::Ok();
}

Status matches_prepared(const Step& s) {
  const Prepared& pr = s.state.prepared;
  const StepParams& p = s.p;
  if (!pr.valid) return invalid("run: expected a prepared batch (call prepare with the step's batch first)");
  if (p.device_lengths != pr.device_lengths)
    return invalid(std::string("device_lengths: expected the prepared batch's (") + (pr.device_lengths ? "true" : "false") + ")");
  if (p.device_lengths) {
    if (s.shape.B != pr.B || p.next_n != pr.next_n || p.kv_lens.data != pr.kv_lens)
      return invalid("kv_lens, next_n: expected the prepared batch's (B = " + num(pr.B) + ", next_n = " + num(pr.next_n) +
                     ", the same kv_lens tensor), got B = " + num(s.shape.B) + ", next_n = " + num(p.next_n));
  } else if (s.shape.B != pr.B || s.shape.T != pr.T)
    return invalid("q_lens: expected the prepared batch (B = " + num(pr.B) + ", T = " + num(pr.T) + "), got B = " +
                   num(s.shape.B) + ", T = " + num(s.shape.T));
  for (int64_t b = 0; b < pr.B && !p.device_lengths; ++b) {
    const int32_t ql = batch_q_len(p, b);
    const int32_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    if (ql != s.state.q_lens[static_cast<size_t>(b)] || kl != s.kv_lens_h[b])
      return invalid("q_lens, kv_lens: expected the prepared batch's; sequence " + num(b) + " was (" +
                     num(s.state.q_lens[static_cast<size_t>(b)]) + ", " + num(s.kv_lens_h[b]) + "), got (" + num(ql) +
                     ", " + num(kl) + ")");
  }
  if (p.workspace != pr.workspace || p.workspace_bytes != pr.workspace_bytes)
    return invalid("workspace: expected the prepared batch's workspace (its metadata lives there)");
  if (p.block_table.data != pr.block_table)
    return invalid("block_table: expected the prepared batch's block table");
  if (p.positions.data != pr.positions)
    return invalid("positions: expected the prepared batch's positions");
  return Status::Ok();
}

namespace {

// t's strided extent of `elems` elements (counted from t.data) read into `host`; *out is t over
// that host copy (the same strides).
Status download_extent(const Step& s, const TensorDesc& t, int64_t elems, std::vector<uint8_t>* host, TensorDesc* out) {
  const size_t bytes = static_cast<size_t>(elems) * dtype_size(t.dtype);
  try {
    host->resize(bytes);
  } catch (const std::exception&) {
    return Status(StatusCode::kOutOfMemory, std::string(kOp) + ": cannot allocate " + num(static_cast<int64_t>(bytes)) +
                                                " host bytes to check a device-resident input");
  }
  if (Status st = s.ops.download(host->data(), t.data, bytes, s.p.stream); !st.ok()) return st;
  *out = t;
  out->data = host->data();
  out->device = cpu_device();
  return Status::Ok();
}

int64_t extent_1d(const TensorDesc& t) { return t.shape[0] == 0 ? 0 : (t.shape[0] - 1) * t.stride[0] + 1; }

}  // namespace

Status check_device_inputs(Step& s, DeviceInputFacts* f) {
  const StepParams& p = s.p;
  if (!s.ops.queued() || s.capturing || p.device_lengths) return Status::Ok();
  const auto on_device = [](const TensorDesc& t) { return t.present() && t.device.type != DeviceType::kCPU; };
  const bool check_slots = on_device(p.slot_mapping) && f->slot_mapping != p.slot_mapping.data;
  const int64_t B = s.shape.B, page = s.cfg.page_size;
  std::vector<uint8_t> bt_host;
  TensorDesc bt = p.block_table;
  if (on_device(bt) && (!f->block_table || check_slots)) {
    int64_t pages = 0;
    for (int64_t b = 0; b < B; ++b)
      pages = std::max<int64_t>(pages, (p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]] + page - 1) / page);
    const int64_t extent = B == 0 || pages == 0 ? 0 : (B - 1) * bt.stride[0] + (pages - 1) * bt.stride[1] + 1;
    if (Status st = download_extent(s, p.block_table, extent, &bt_host, &bt); !st.ok()) return st;
    if (!f->block_table) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
        for (int64_t j = 0; j < (kl + page - 1) / page; ++j) {
          const int64_t v = bt.ptr<const int32_t>()[b * bt.stride[0] + j * bt.stride[1]];
          if (v < 0)
            return invalid("block_table[" + num(b) + ", " + num(j) + "]: expected a page >= 0 (kv_lens[" + num(b) + "] = " +
                           num(kl) + " covers it), got " + num(v));
          if (v > f->max_page) {
            f->max_page = v;
            f->page_b = b;
            f->page_j = j;
          }
        }
      }
      f->block_table = true;
    }
  }
  if (on_device(p.positions) && !f->positions) {
    std::vector<uint8_t> host;
    TensorDesc pos;
    if (Status st = download_extent(s, p.positions, extent_1d(p.positions), &host, &pos); !st.ok()) return st;
    for (int64_t t = 0; t < pos.shape[0]; ++t) {
      const int64_t v = pos.dtype == DType::kI64 ? pos.ptr<const int64_t>()[t * pos.stride[0]]
                                                 : pos.ptr<const int32_t>()[t * pos.stride[0]];
      if (v < 0) return invalid("positions[" + num(t) + "]: expected 0 <= position, got " + num(v));
      if (v > f->max_pos) {
        f->max_pos = v;
        f->pos_t = t;
      }
    }
    f->positions = true;
  }
  if (check_slots) {
    std::vector<uint8_t> host;
    StepParams q = p;  // the same step over host copies of its block table and slot mapping
    q.block_table = bt;
    if (Status st = download_extent(s, p.slot_mapping, extent_1d(p.slot_mapping), &host, &q.slot_mapping); !st.ok())
      return st;
    if (Status st = check_slot_mapping(s.plan, q, B); !st.ok()) return st;
    f->slot_mapping = p.slot_mapping.data;
  }
  return Status::Ok();
}

Status check_device_facts(const Step& s, const DeviceInputFacts& f) {
  const StepParams& p = s.p;
  if (f.block_table && f.max_page >= 0) {
    int64_t num_blocks = p.mla_cache.num_blocks;
    if (s.shape.scores) num_blocks = std::min<int64_t>(num_blocks, p.index_cache.num_blocks);
    if (f.max_page >= num_blocks)
      return invalid("block_table[" + num(f.page_b) + ", " + num(f.page_j) + "]: expected a page in [0, num_blocks = " +
                     num(num_blocks) + ") (kv_lens[" + num(f.page_b) + "] covers it), got " + num(f.max_page));
  }
  if (f.positions && s.shape.scores && f.max_pos >= p.cos_sin.shape[0])
    return invalid("positions[" + num(f.pos_t) + "]: expected 0 <= position < cos_sin rows = " + num(p.cos_sin.shape[0]) +
                   ", got " + num(f.max_pos));
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
