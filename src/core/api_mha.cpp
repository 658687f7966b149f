// Dense attention in MHA form (SPEC §5b): validation, workspace sizing, sequence groups,
// dispatch; and the cost model of the two forms (docs/mha.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/mha_layout.h"
#include "dsa/mha.h"

namespace dsa {
namespace core {

MhaLayout mha_layout(DeviceType device, int64_t H, int64_t qk_nope, int64_t v, int64_t tokens) {
  auto up = [](int64_t b) { return (b + kMhaAlign - 1) / kMhaAlign * kMhaAlign; };
  MhaLayout l;
  const int64_t n = std::max<int64_t>(tokens, 0);
  const bool cpu = device == DeviceType::kCPU;
  l.kv = 0;
  l.latent = up(n * H * (qk_nope + v) * 2);
  l.extra = l.latent + up(n * (kMhaLatentDim + kMhaRopeDim) * (cpu ? 4 : 2));
  const int64_t extra = cpu ? up(H * (qk_nope + v) * kMhaLatentDim * 4) : kMhaCublasWorkspace;
  l.total = l.extra + extra + kMhaAlign;
  return l;
}

}  // namespace core

namespace {

using core::MhaGroup;

std::string num(int64_t v) { return std::to_string(v); }

struct Shape {
  int64_t T = 0, H = 0, nope = 0, v = 0, B = 0, max_blocks = 0, page = 0;
  Device dev;
};

int32_t at(const TensorDesc& t, int64_t i) { return t.ptr<int32_t>()[i * t.stride[0]]; }

Status validate(const DenseMhaPrefillParams& p, Shape* s) {
  core::ArgCheck c("dense_mha_prefill");
  c.tensor(p.q_nope, "q_nope", {DType::kBF16, DType::kF32}, {"T", "H", "qk_nope"});
  if (!c.ok()) return c.status();
  const int64_t T = p.q_nope.shape[0], H = p.q_nope.shape[1], nope = p.q_nope.shape[2];
  // Messages are built only when a check fails (lambdas): a passing call allocates nothing.
  c.require(H > 0, "q_nope", [&] { return "expected H > 0 heads, got shape " + core::shape_string(p.q_nope); });
  c.require(nope > 0 && nope % 16 == 0, "q_nope",
            [&] { return "expected qk_nope a positive multiple of 16, got " + num(nope); });
  c.tensor(p.q_pe, "q_pe", {p.q_nope.dtype}, {{T, "T"}, {H, "H"}, {core::kMhaRopeDim, "64"}});
  c.output(p.out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, "v"});
  if (!c.ok()) return c.status();
  const int64_t v = p.out.shape[2];
  c.require(v > 0 && v % 16 == 0, "out", [&] { return "expected v (its last dim) a positive multiple of 16, got " + num(v); });
  c.output(p.lse, "lse", {DType::kF32}, {{T, "T"}, {H, "H"}}, false);
  c.optional(p.attn_sink, "attn_sink", {DType::kF32}, {{H, "H"}}, false);
  c.require(std::isfinite(p.sm_scale) && p.sm_scale > 0.f, "sm_scale",
            [&] { return "expected a finite value > 0, got " + std::to_string(p.sm_scale); });
  core::check_kv_b_proj(c, p.kv_b_proj, H, nope, v);
  c.mla_cache(p.cache, "cache");
  c.tensor(p.cu_seqlens_q, "cu_seqlens_q", {DType::kI32}, {"B + 1"}, false);
  if (!c.ok()) return c.status();
  c.require(p.cu_seqlens_q.shape[0] >= 1, "cu_seqlens_q", "expected at least one entry ([B + 1]), got [0]");
  const int64_t B = p.cu_seqlens_q.shape[0] - 1;
  c.tensor(p.block_table, "block_table", {DType::kI32}, {{B, "B"}, "max_blocks"}, false);
  c.tensor(p.kv_lens, "kv_lens", {DType::kI32}, {{B, "B"}}, false);
  c.optional(p.kv_lens_host, "kv_lens_host", {DType::kI32}, {{B, "B"}}, false);
  if (!c.ok()) return c.status();
  Status st = core::pick_device("dense_mha_prefill",
                                {{&p.q_nope, "q_nope"}, {&p.q_pe, "q_pe"}, {&p.block_table, "block_table"},
                                 {&p.kv_lens, "kv_lens"}, {&p.cu_seqlens_q, "cu_seqlens_q"}, {&p.kv_b_proj, "kv_b_proj"},
                                 {&p.attn_sink, "attn_sink"}, {&p.out, "out"}, {&p.lse, "lse"}},
                                &s->dev, {&p.cache.device});
  if (!st.ok()) return st;
  if (p.kv_lens_host.present() && p.kv_lens_host.device.type != DeviceType::kCPU)
    return Status(StatusCode::kInvalidArgument, "dense_mha_prefill: kv_lens_host: expected host (CPU) memory, got " +
                                                    core::device_string(p.kv_lens_host.device));
  const bool on_cuda = s->dev.type == DeviceType::kCUDA;
  if (on_cuda) {
    c.require(p.q_nope.dtype == DType::kBF16, "q_nope", "expected dtype bf16 on CUDA, got f32");
    c.require((nope == 128 || nope == 192) && (v == 128 || v == 256), "q_nope", [&] {
      return "expected (qk_nope, v) in {128, 192} x {128, 256} on CUDA (qk 192/256 per head), got (" + num(nope) + ", " +
             num(v) + ")";
    });
    c.aligned(p.q_nope, "q_nope", 16).aligned(p.q_pe, "q_pe", 16).aligned(p.kv_b_proj, "kv_b_proj", 16);
    c.aligned(p.out, "out", 16);
    if (!c.ok()) return c.status();
  }
  s->T = T; s->H = H; s->nope = nope; s->v = v; s->B = B;
  s->max_blocks = p.block_table.shape[1];
  s->page = p.cache.page_size;
  if (on_cuda) {
    // Device contents are guarded inside the kernels; host copies are checked here.
    if (p.kv_lens_host.present()) {
      for (int64_t b = 0; b < B && c.ok(); ++b) {
        const int64_t kv = at(p.kv_lens_host, b);
        c.require(kv >= 0 && kv <= s->max_blocks * s->page, "kv_lens_host", [&] {
          return "expected values in [0, max_blocks * page_size = " + num(s->max_blocks * s->page) +
                 "], got kv_lens_host[" + num(b) + "] = " + num(kv);
        });
      }
    }
    return c.status();
  }
  // Host contents that would send the backend out of bounds.
  c.require(at(p.cu_seqlens_q, 0) == 0, "cu_seqlens_q",
            [&] { return "expected cu_seqlens_q[0] = 0, got " + num(at(p.cu_seqlens_q, 0)); });
  for (int64_t b = 0; b < B && c.ok(); ++b)
    c.require(at(p.cu_seqlens_q, b + 1) >= at(p.cu_seqlens_q, b), "cu_seqlens_q", [&] {
      return "expected non-decreasing values, got cu_seqlens_q[" + num(b + 1) + "] = " + num(at(p.cu_seqlens_q, b + 1)) +
             " < cu_seqlens_q[" + num(b) + "] = " + num(at(p.cu_seqlens_q, b));
    });
  c.require(!c.ok() || at(p.cu_seqlens_q, B) == T, "cu_seqlens_q",
            [&] { return "expected cu_seqlens_q[B] = T = " + num(T) + ", got " + num(at(p.cu_seqlens_q, B)); });
  for (int64_t b = 0; b < B && c.ok(); ++b) {
    const int64_t q_len = at(p.cu_seqlens_q, b + 1) - at(p.cu_seqlens_q, b);
    const int64_t kv = at(p.kv_lens, b);
    c.require(kv >= 0 && kv <= s->max_blocks * s->page, "kv_lens", [&] {
      return "expected values in [0, max_blocks * page_size = " + num(s->max_blocks * s->page) + "], got kv_lens[" +
             num(b) + "] = " + num(kv);
    });
    const int32_t* row = p.block_table.ptr<int32_t>() + b * p.block_table.stride[0];
    const int64_t used = (kv + s->page - 1) / s->page;
    for (int64_t j = 0; j < used && c.ok(); ++j) {
      const int64_t blk = row[j * p.block_table.stride[1]];
      c.require(blk >= 0 && blk < p.cache.num_blocks, "block_table", [&] {
        return "expected entries in [0, num_blocks = " + num(p.cache.num_blocks) + ") for the " + num(used) +
               " pages that kv_lens[" + num(b) + "] uses, got block_table[" + num(b) + "][" + num(j) + "] = " + num(blk);
      });
    }
    c.require(!c.ok() || q_len <= kv, "kv_lens", [&] {
      return "expected q_len <= kv_len for every sequence, got q_len = " + num(q_len) + " > kv_len = " + num(kv) +
             " for sequence " + num(b);
    });
  }
  return c.status();
}

// Context tokens each sequence takes in the workspace: its kv_len where the host knows it,
// else the block table's capacity.
std::vector<int64_t> context_budget(const DenseMhaPrefillParams& p, const Shape& s, bool* packed) {
  std::vector<int64_t> ctx(static_cast<size_t>(s.B));
  const bool cpu = s.dev.type == DeviceType::kCPU;
  *packed = cpu || p.kv_lens_host.present();
  for (int64_t b = 0; b < s.B; ++b) {
    if (cpu) ctx[b] = at(p.kv_lens, b);
    else if (p.kv_lens_host.present()) ctx[b] = at(p.kv_lens_host, b);
    else ctx[b] = s.max_blocks * s.page;
  }
  return ctx;
}

int64_t layout_bytes(const Shape& s, int64_t tokens) {
  return core::mha_layout(s.dev.type, s.H, s.nope, s.v, tokens).total;
}

}  // namespace

int64_t mha_prefill_workspace_bytes(Device device, int64_t num_heads, int64_t qk_nope, int64_t v_dim,
                                    int64_t context_tokens) {
  if (num_heads <= 0 || qk_nope <= 0 || v_dim <= 0 || context_tokens < 0) return 0;
  return core::mha_layout(device.type, num_heads, qk_nope, v_dim, context_tokens).total;
}

MhaWorkspaceSize dense_mha_prefill_workspace_size(const DenseMhaPrefillParams& p) {
  MhaWorkspaceSize w;
  Shape s;
  if (!validate(p, &s).ok()) return w;
  bool packed = true;
  const std::vector<int64_t> ctx = context_budget(p, s, &packed);
  int64_t longest = 0, all = 0;
  for (int64_t c : ctx) {
    longest = std::max(longest, c);
    all += c;
  }
  w.min_bytes = static_cast<size_t>(layout_bytes(s, longest));
  w.batch_bytes = static_cast<size_t>(layout_bytes(s, all));
  return w;
}

Status dense_mha_prefill(const DenseMhaPrefillParams& p) {
  Shape s;
  Status st = validate(p, &s);
  if (!st.ok()) return st;
  if (s.T == 0 || s.B == 0) return Status::Ok();
  bool packed = true;
  const std::vector<int64_t> ctx = context_budget(p, s, &packed);
  int64_t longest = 0, all = 0;
  for (int64_t c : ctx) {
    longest = std::max(longest, c);
    all += c;
  }
  const int64_t need = layout_bytes(s, longest);
  if (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < need) {
    return Status(StatusCode::kWorkspaceTooSmall,
                  "dense_mha_prefill: workspace: expected at least " + num(need) + " bytes (one sequence of " +
                      num(longest) + " context tokens; " + num(layout_bytes(s, all)) + " for the whole batch), got " +
                      (p.workspace ? num(static_cast<int64_t>(p.workspace_bytes)) : std::string("none")));
  }
  // The most context tokens one group can hold (bytes are monotone in tokens).
  int64_t lo = longest, hi = all;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (layout_bytes(s, mid) <= static_cast<int64_t>(p.workspace_bytes)) lo = mid; else hi = mid - 1;
  }
  const int64_t capacity = lo;
  core::set_last_kernel_name("");  // the CUDA launcher names its attention kernel
  int64_t b = 0;
  while (b < s.B) {
    MhaGroup g;
    g.b0 = b;
    g.packed = packed;
    g.seq_stride = packed ? 0 : s.max_blocks * s.page;
    int64_t tokens = 0;
    while (b < s.B && tokens + ctx[b] <= capacity) tokens += ctx[b++];
    if (b == g.b0) tokens = ctx[b++];  // cannot happen: capacity >= longest
    g.b1 = b;
    g.tokens = tokens;
#if defined(DSA_WITH_CUDA)
    const StatusCode code = s.dev.type == DeviceType::kCUDA ? gpu::dense_mha_prefill_group(p, g)
                                                            : cpu::dense_mha_prefill_group(p, g);
#else
    const StatusCode code = cpu::dense_mha_prefill_group(p, g);
#endif
    st = core::backend_status("dense_mha_prefill", s.dev, code);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

namespace core {

void check_kv_b_proj(ArgCheck& c, const TensorDesc& w, int64_t H, int64_t nope, int64_t v, const char* when) {
  const auto shape = [&] {
    return "[H * (qk_nope + v), 512] = [" + num(H) + " * (" + num(nope) + " + " + num(v) + "), 512] = [" +
           num(H * (nope + v)) + ", 512]";
  };
  if (c.ok() && !w.present())
    c.require(false, "kv_b_proj", [&] { return std::string("is required") + when + " (expected a bf16 tensor of shape " + shape() + ")"; });
  if (c.ok() && w.dtype != DType::kBF16)
    c.require(false, "kv_b_proj", [&] { return std::string("expected dtype bf16, got ") + dtype_name(w.dtype); });
  if (c.ok() && (w.ndim != 2 || w.shape[0] != H * (nope + v) || w.shape[1] != 512))
    c.require(false, "kv_b_proj", [&] { return "expected shape " + shape() + ", got " + shape_string(w); });
  c.tensor(w, "kv_b_proj", {DType::kBF16}, {{H * (nope + v), "H * (qk_nope + v)"}, {512, "512"}});
}

}  // namespace core

// ---- the cost model (docs/mha.md) ----

MhaCost mha_form_cost(int64_t q_len, int64_t kv_len, int64_t H, int64_t qk_nope, int64_t v) {
  MhaCost c;
  if (q_len <= 0 || kv_len <= 0 || H <= 0) return c;
  const double q = static_cast<double>(q_len), kv = static_cast<double>(kv_len);
  const double prefix = std::max(0.0, kv - q);
  // Causal pairs: query i sees prefix + i + 1 keys.
  const double pairs = q * prefix + q * (q + 1) / 2;
  const double h = static_cast<double>(H);
  const double latent = 512.0;
  const double proj = 2.0 * latent * h * static_cast<double>(qk_nope + v);  // per key (MHA) or query (absorbed)
  c.mha_flops = kv * proj + pairs * 2.0 * h * static_cast<double>(qk_nope + 64 + v);
  c.absorbed_flops = q * proj + pairs * 2.0 * h * (576.0 + 512.0);
  return c;
}

bool prefer_mha_form(int64_t q_len, int64_t kv_len, int64_t H, int64_t qk_nope, int64_t v) {
  const MhaCost c = mha_form_cost(q_len, kv_len, H, qk_nope, v);
  return c.mha_flops < c.absorbed_flops;
}

}  // namespace dsa

// ---- the absorbed form's projections (SPEC §5b, §6 core mode) ----
namespace dsa {
namespace {

const char* kAbsorb = "mla_absorb_q";
const char* kUpProject = "mla_up_project";

// The CUDA backend multiplies with cuBLAS: bf16 activations only (its GEMMs take both operands
// in one type, and the weight is bf16), a bf16 or f32 output.
Status cuda_bf16_input(const char* op, const char* arg, const TensorDesc& t, Device dev) {
  if (t.dtype == DType::kBF16) return Status::Ok();
  return Status(StatusCode::kUnsupported,
                std::string(op) + ": " + arg + ": dtype " + dtype_name(t.dtype) + " on " + core::device_string(dev) +
                    ": the CUDA backend takes bf16 " + arg + " (cuBLAS multiplies the bf16 weight by bf16 operands "
                    "only), with a bf16 or f32 output; f32 inputs run on the CPU backend");
}

// A row stride the CUDA backend's batched GEMM takes as a leading dimension: in [min, 2^31)
// where the tensor has more than one row (the contiguous layouts all do). `what` names min.
Status cuda_row_stride(const char* op, const char* arg, const TensorDesc& t, int64_t min, const char* what,
                       Device dev) {
  const int64_t s = t.stride[0];
  if (t.shape[0] <= 1 || (s >= min && s <= INT32_MAX)) return Status::Ok();
  return Status(StatusCode::kUnsupported, std::string(op) + ": " + arg + ": on " + core::device_string(dev) +
                                              " expected a row stride (stride[0]) in [" +
                                              (what ? std::string(what) + " = " : std::string()) + num(min) +
                                              ", 2^31) for the batched GEMM's leading dimension, got " + num(s) +
                                              " (a contiguous tensor has one; the CPU backend takes any stride)");
}

// The GEMM's row count and head count are 32-bit in cuBLAS.
Status cuda_sizes(const char* op, const char* arg, int64_t T, int64_t H, Device dev) {
  if (T <= INT32_MAX && H <= INT32_MAX) return Status::Ok();
  return Status(StatusCode::kUnsupported, std::string(op) + ": " + arg + ": on " + core::device_string(dev) +
                                              " expected T and H below 2^31 (cuBLAS's 32-bit sizes), got T = " +
                                              num(T) + ", H = " + num(H));
}

template <typename... Checks>
Status first_failure(Status st, Checks... rest) {
  if (!st.ok()) return st;
  if constexpr (sizeof...(rest) > 0) return first_failure(rest...);
  return st;
}

}  // namespace

Status mla_absorb_q(const MlaAbsorbQParams& p) {
  return core::guarded(kAbsorb, [&]() -> Status {
    core::ArgCheck c(kAbsorb);
    c.tensor(p.q_nope, "q_nope", {DType::kBF16, DType::kF32}, {"T", "H", "qk_nope"});
    if (!c.ok()) return c.status();
    const int64_t T = p.q_nope.shape[0], H = p.q_nope.shape[1], nope = p.q_nope.shape[2];
    c.require(H > 0 && nope > 0, "q_nope",
              [&] { return "expected H > 0 and qk_nope > 0, got shape " + core::shape_string(p.q_nope); });
    c.require(p.v_dim > 0, "v_dim", [&] { return "expected > 0 (the weight's v rows per head), got " + num(p.v_dim); });
    c.tensor(p.q_pe, "q_pe", {p.q_nope.dtype}, {{T, "T"}, {H, "H"}, {core::kMhaRopeDim, "64"}});
    core::check_kv_b_proj(c, p.kv_b_proj, H, nope, p.v_dim);
    c.output(p.q_out, "q_out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, {576, "576"}});
    c.disjoint(p.q_out, "q_out", p.q_nope, "q_nope").disjoint(p.q_out, "q_out", p.q_pe, "q_pe");
    c.disjoint(p.q_out, "q_out", p.kv_b_proj, "kv_b_proj");
    if (!c.ok()) return c.status();
    Device dev;
    Status st = core::pick_device(kAbsorb, {{&p.q_nope, "q_nope"}, {&p.q_pe, "q_pe"}, {&p.kv_b_proj, "kv_b_proj"},
                                            {&p.q_out, "q_out"}}, &dev);
    if (!st.ok()) return st;
    if (dev.type == DeviceType::kCUDA) {
      st = first_failure(cuda_bf16_input(kAbsorb, "q_nope", p.q_nope, dev), cuda_sizes(kAbsorb, "q_nope", T, H, dev),
                         cuda_row_stride(kAbsorb, "q_nope", p.q_nope, nope, "qk_nope", dev),
                         cuda_row_stride(kAbsorb, "kv_b_proj", p.kv_b_proj, 512, nullptr, dev),
                         cuda_row_stride(kAbsorb, "q_out", p.q_out, 512, nullptr, dev));
      if (!st.ok()) return st;
    }
    if (T == 0) {
      core::set_last_kernel_name("");  // nothing launched
      return Status::Ok();
    }
    return core::backend_status(kAbsorb, dev, DSA_DISPATCH(dev, mla_absorb_q, p));
  });
}

Status mla_up_project(const MlaUpProjectParams& p) {
  return core::guarded(kUpProject, [&]() -> Status {
    core::ArgCheck c(kUpProject);
    c.tensor(p.latent, "latent", {DType::kBF16, DType::kF32}, {"T", "H", {512, "512"}});
    c.require(p.qk_nope > 0, "qk_nope", [&] { return "expected > 0 (the weight's W_UK rows per head), got " + num(p.qk_nope); });
    if (!c.ok()) return c.status();
    const int64_t T = p.latent.shape[0], H = p.latent.shape[1];
    c.require(H > 0, "latent", [&] { return "expected H > 0 heads, got shape " + core::shape_string(p.latent); });
    c.output(p.out, "out", {DType::kBF16, DType::kF32}, {{T, "T"}, {H, "H"}, "v"});
    if (!c.ok()) return c.status();
    const int64_t v = p.out.shape[2];
    c.require(v > 0, "out", [&] { return "expected v (its last dim) > 0, got " + num(v); });
    core::check_kv_b_proj(c, p.kv_b_proj, H, p.qk_nope, v);
    c.disjoint(p.out, "out", p.latent, "latent").disjoint(p.out, "out", p.kv_b_proj, "kv_b_proj");
    if (!c.ok()) return c.status();
    Device dev;
    Status st = core::pick_device(kUpProject, {{&p.latent, "latent"}, {&p.kv_b_proj, "kv_b_proj"}, {&p.out, "out"}}, &dev);
    if (!st.ok()) return st;
    if (dev.type == DeviceType::kCUDA) {
      st = first_failure(cuda_bf16_input(kUpProject, "latent", p.latent, dev),
                         cuda_sizes(kUpProject, "latent", T, H, dev),
                         cuda_row_stride(kUpProject, "latent", p.latent, 512, nullptr, dev),
                         cuda_row_stride(kUpProject, "kv_b_proj", p.kv_b_proj, 512, nullptr, dev),
                         cuda_row_stride(kUpProject, "out", p.out, v, "v", dev));
      if (!st.ok()) return st;
    }
    if (T == 0) {
      core::set_last_kernel_name("");  // nothing launched
      return Status::Ok();
    }
    return core::backend_status(kUpProject, dev, DSA_DISPATCH(dev, mla_up_project, p));
  });
}

}  // namespace dsa
