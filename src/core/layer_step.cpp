// One step of a DSA layer (SPEC §6) on top of the public ops. Every device temporary comes
// from the plan's arena layout (core/step_layout.h); host metadata lives in buffers the
// Attention object allocated at construction. See docs/planner.md.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "core/arena.h"
#include "core/step_layout.h"
#include "core/validate.h"
#include "dsa/attention.h"
#include "dsa/indexer.h"
#include "dsa/layer.h"
#include "dsa/topk.h"
#if defined(DSA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace dsa {
namespace {

const char* kOp = "attention_step";

std::string num(int64_t v) { return std::to_string(v); }

Status invalid(const std::string& what) {
  return Status(StatusCode::kInvalidArgument, std::string(kOp) + ": " + what);
}
Status limit(const std::string& what) {
  return Status(StatusCode::kLimitExceeded, std::string(kOp) + ": " + what);
}
Status internal(const std::string& what) {
  return Status(StatusCode::kInternal, std::string(kOp) + ": " + what + " (a planner bug: please report it)");
}

// Rows [r0, r0 + n) of a tensor (strides kept).
TensorDesc rows(const TensorDesc& t, int64_t r0, int64_t n) {
  TensorDesc s = t;
  if (!t.present()) return s;
  s.data = static_cast<uint8_t*>(t.data) + r0 * t.stride[0] * static_cast<int64_t>(dtype_size(t.dtype));
  s.shape[0] = n;
  return s;
}

TensorDesc dev_tensor(const void* p, DType d, std::initializer_list<int64_t> shape, Device dev) {
  return make_tensor(p, d, shape, dev);
}

// Host metadata -> the arena (device memory; on the CPU the arena is host memory).
Status upload(void* dst, const void* src, size_t bytes, Device dev, void* stream) {
  if (bytes == 0) return Status::Ok();
  if (dev.type == DeviceType::kCPU) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#if defined(DSA_WITH_CUDA)
  // Pinned source (the object's staging): asynchronous, ordered on the step's stream like
  // every op, and capturable; the source region is not rewritten while the copy may be pending.
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    return Status(StatusCode::kDeviceError, std::string(kOp) + ": metadata upload failed");
  }
  return Status::Ok();
#else
  (void)stream;
  return Status(StatusCode::kUnsupported, std::string(kOp) + ": device: the CUDA backend is not compiled in");
#endif
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool host_i32_vector(const TensorDesc& t) {
  return t.present() && t.dtype == DType::kI32 && t.ndim == 1 && t.device.type == DeviceType::kCPU &&
         (t.shape[0] == 0 || t.data != nullptr);
}

}  // namespace

const char* route_name(Route r) {
  switch (r) {
    case Route::kDense: return "dense";
    case Route::kSparseScored: return "sparse";
    case Route::kSparseShared: return "shared";
  }
  return "unknown";
}

Attention::Attention(const Plan& plan) : plan_(plan) {
  const core::HostStaging h = core::host_staging(plan);
  const size_t words = static_cast<size_t>(h.total_words());
  try {
    route_.resize(static_cast<size_t>(plan.config.max_seqs_per_step));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
    status_ = Status(StatusCode::kOutOfMemory, std::string(kOp) + ": plan.config.max_seqs_per_step: cannot allocate the routes of " +
                                                   num(plan.config.max_seqs_per_step) + " sequences");
    return;
  }
#if defined(DSA_WITH_CUDA)
  if (plan.config.device.type == DeviceType::kCUDA) {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(plan.config.device.index) != cudaSuccess) {
      cudaGetLastError();
      status_ = Status(StatusCode::kDeviceError, std::string(kOp) + ": plan.config.device: cannot select CUDA device " +
                                                     num(plan.config.device.index));
      return;
    }
    void* mem = nullptr;
    cudaError_t e = cudaHostAlloc(&mem, words * sizeof(int32_t), cudaHostAllocPortable);
    if (e == cudaSuccess) {
      staging_ = static_cast<int32_t*>(mem);
      pinned_ = true;
      for (int i = 0; i < h.slots && e == cudaSuccess; ++i) {
        cudaEvent_t ev = nullptr;
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        slot_done_[i] = ev;
      }
    }
    cudaSetDevice(previous);
    if (e != cudaSuccess) {
      cudaGetLastError();
      status_ = Status(StatusCode::kDeviceError, std::string(kOp) + ": cannot allocate " +
                                                     num(static_cast<int64_t>(words * sizeof(int32_t))) +
                                                     " bytes of pinned host staging (plan.host_bytes): " + cudaGetErrorString(e));
      return;
    }
  }
#endif
  if (staging_ == nullptr) {
    // A plan's host staging can be larger than the host can give (huge max_seqs_per_step):
    // that is a status, never an exception out of the constructor.
    try {
      host_staging_.assign(words, 0);
    } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
      status_ = Status(StatusCode::kOutOfMemory, std::string(kOp) + ": plan.host_bytes: cannot allocate " +
                                                     num(static_cast<int64_t>(words * sizeof(int32_t))) +
                                                     " bytes of host staging (lower max_seqs_per_step or max_tokens_per_step)");
      return;
    }
    staging_ = host_staging_.data();
  }
  // Tile table, constant for the plan: every tile but a row's last is full.
  const int64_t mt = std::max<int64_t>(plan.max_tiles, 1), Wt = plan.tile_width, K = plan.config.geometry.topk;
  int32_t* tt = staging_ + h.tile_table;
  for (int64_t i = 0; i < mt; ++i) {
    tt[i] = static_cast<int32_t>(i * Wt);
    tt[mt + i] = static_cast<int32_t>(Wt);
    tt[2 * mt + i] = static_cast<int32_t>(K + std::min(Wt, K));
  }
}

Status Attention::create(const Plan& plan, std::unique_ptr<Attention>* out) {
  if (out == nullptr) return invalid("create: out: expected a non-null std::unique_ptr<Attention>*");
  std::unique_ptr<Attention> a(new (std::nothrow) Attention(plan));
  if (!a) return Status(StatusCode::kOutOfMemory, std::string(kOp) + ": create: cannot allocate the Attention object");
  if (!a->status().ok()) return a->status();
  *out = std::move(a);
  return Status::Ok();
}

Attention::~Attention() {
#if defined(DSA_WITH_CUDA)
  // The last eager steps' copies may still read the staging.
  for (int i = 0; i < 2; ++i) {
    if (slot_done_[i] && slot_pending_[i]) cudaEventSynchronize(static_cast<cudaEvent_t>(slot_done_[i]));
  }
  for (void*& ev : slot_done_) {
    if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
    ev = nullptr;
  }
  if (pinned_) cudaFreeHost(staging_);
#endif
  staging_ = nullptr;
}

Status Attention::step(const StepParams& p, StepReport* report) {
  if (!status_.ok()) return status_;
  const auto t_begin = Clock::now();
  StepReport rep;
  rep.workspace_plan_bytes = plan_.workspace_bytes;
  rep.score_budget_bytes = plan_.score_budget_bytes;
  const PlannerConfig& cfg = plan_.config;
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
  if (T > plan_.max_rows)
    return limit("batch: T = " + num(T) + " tokens exceeds the plan's max_tokens_per_step = " + num(cfg.max_tokens_per_step) +
                 (plan_.max_rows > cfg.max_tokens_per_step ? " (max_seqs_per_step * max_next_n = " + num(plan_.max_rows) + " rows)" : ""));
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
  if (p.workspace == nullptr || static_cast<int64_t>(p.workspace_bytes) < plan_.workspace_bytes)
    return Status(StatusCode::kWorkspaceTooSmall, std::string(kOp) + ": workspace: expected at least " +
                                                      num(plan_.workspace_bytes) + " bytes (plan.workspace_bytes), got " +
                                                      (p.workspace ? num(static_cast<int64_t>(p.workspace_bytes)) : "none"));

  // ---- host staging: this step's slot ----
  const core::HostStaging hs = core::host_staging(plan_);
  int slot = 0;
  bool capturing = false;
#if defined(DSA_WITH_CUDA)
  if (pinned_) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(p.stream), &cs) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kDeviceError, std::string(kOp) + ": stream: cannot query its capture status");
    }
    capturing = cs != cudaStreamCaptureStatusNone;
    slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % hs.slots;
    // The step two before may still have copies queued from this slot (never while capturing:
    // a capture begins after the object's eager steps completed, layer.h).
    if (!capturing && slot_pending_[slot]) {
      if (cudaEventSynchronize(static_cast<cudaEvent_t>(slot_done_[slot])) != cudaSuccess) {
        cudaGetLastError();
        return Status(StatusCode::kDeviceError, std::string(kOp) + ": an earlier step's work on the device failed");
      }
      slot_pending_[slot] = false;
    }
  }
#endif
  // Marks, on every exit once copies may be queued, the point after this step's last copy.
  struct SlotRecord {
    Attention* self;
    int slot;
    bool active;
    void* stream;
    ~SlotRecord() {
#if defined(DSA_WITH_CUDA)
      if (active && cudaEventRecord(static_cast<cudaEvent_t>(self->slot_done_[slot]), static_cast<cudaStream_t>(stream)) == cudaSuccess)
        self->slot_pending_[slot] = true;
#endif
    }
  } slot_record{this, slot, pinned_ && !capturing, p.stream};
  (void)slot_record;
  int32_t* const stage = staging_ + hs.slot_begin + slot * hs.slot_words;
  int32_t* const row_seq_h = stage + hs.row_seq;
  int32_t* const row_len_h = stage + hs.row_len;
  int32_t* const token_pos_h = stage + hs.token_pos;
  int32_t* const kv_lens_h = stage + hs.kv_lens;
  int32_t* const dense_cu_h = stage + hs.dense_cu;
  int32_t* const tile_last_h = stage + hs.tile_last;
  const int32_t* const tile_table = staging_ + hs.tile_table;
  const int64_t tile_stride = hs.tile_words / 3;

  // ---- host metadata: routes, rows ----
  int64_t t = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t ql = p.q_lens.ptr<const int32_t>()[b * p.q_lens.stride[0]];
    const int32_t kl = p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]];
    kv_lens_h[b] = kl;
    Route r;
    if (p.role == IndexerRole::kMtp) r = Route::kSparseScored;          // its indices are consumed
    else if (kl <= K && !(p.role == IndexerRole::kFull && p.force_score)) r = Route::kDense;  // top-k = everything
    else r = scores ? Route::kSparseScored : Route::kSparseShared;
    route_[b] = r;
    rep.seqs[static_cast<int>(r)] += 1;
    rep.rows[static_cast<int>(r)] += ql;
    for (int32_t i = 0; i < ql; ++i, ++t) {
      row_seq_h[t] = static_cast<int32_t>(b);
      token_pos_h[t] = kl - ql + i;
      row_len_h[t] = kl - ql + i + 1;
    }
  }

  core::Arena arena(p.workspace, static_cast<int64_t>(p.workspace_bytes));
  core::StepLayout lay;
  if (!core::layout_step(arena, plan_, &lay)) return internal("the step layout does not fit plan.workspace_bytes");
  const int64_t score_offset = static_cast<int64_t>(static_cast<uint8_t*>(lay.score) - static_cast<uint8_t*>(p.workspace));
  Status st;
  if (!(st = upload(lay.row_seq, row_seq_h, T * 4, dev, p.stream)).ok()) return st;
  if (!(st = upload(lay.row_len, row_len_h, T * 4, dev, p.stream)).ok()) return st;
  if (!(st = upload(lay.token_pos, token_pos_h, T * 4, dev, p.stream)).ok()) return st;
  if (!(st = upload(lay.kv_lens, kv_lens_h, B * 4, dev, p.stream)).ok()) return st;

  const TensorDesc row_seq = dev_tensor(lay.row_seq, DType::kI32, {T}, dev);
  const TensorDesc row_len = dev_tensor(lay.row_len, DType::kI32, {T}, dev);
  const TensorDesc token_pos = dev_tensor(lay.token_pos, DType::kI32, {T}, dev);
  const TensorDesc positions = p.positions.present() ? p.positions : token_pos;
  const float sm_scale = p.sm_scale != 0.0f ? p.sm_scale : static_cast<float>(g.sm_scale);
  int64_t score_high = 0;
  core::Arena score_arena(lay.score, lay.score_bytes);
  auto fresh_score_arena = [&]() {
    score_high = std::max(score_high, score_arena.high_water());
    return core::Arena(lay.score, lay.score_bytes);
  };
  auto finish = [&](Status s) {
    score_high = std::max(score_high, score_arena.high_water());
    rep.score_high_water_bytes = score_high;
    rep.workspace_high_water_bytes = score_offset + score_high;
    rep.ms_total = ms_since(t_begin);
    if (report) *report = rep;
    return s;
  };
  if (T == 0) return finish(Status::Ok());

  // ---- 1. caches: every token, every route ----
  auto t0 = Clock::now();
  CacheSlots where;
  where.block_table = p.block_table;
  where.token_seq = row_seq;
  where.token_pos = token_pos;
  {
    WriteMlaCacheParams w;
    w.kv_c = p.kv_c;
    w.k_pe = p.k_pe;
    w.where = where;
    w.cache = p.mla_cache;
    w.stream = p.stream;
    if (!(st = write_mla_cache(w)).ok()) return st;
  }
  const TensorDesc k8 = dev_tensor(lay.index_k, DType::kE4M3, {T, kIndexHeadDim}, dev);
  const TensorDesc k_scale = dev_tensor(lay.index_k_scale, DType::kF32, {T}, dev);
  if (scores) {
    PrepareIndexerKParams pk;
    pk.k = p.index_k;
    pk.positions = positions;
    pk.cos_sin = p.cos_sin;
    pk.rope = g.index_rope;
    pk.hadamard = p.hadamard;
    pk.k_out = k8;
    pk.k_scale = k_scale;
    pk.stream = p.stream;
    if (!(st = prepare_indexer_k(pk)).ok()) return st;
    WriteIndexerCacheParams wi;
    wi.k = k8;
    wi.k_scale = k_scale;
    wi.where = where;
    wi.cache = p.index_cache;
    wi.stream = p.stream;
    if (!(st = write_indexer_cache(wi)).ok()) return st;
  }
  rep.ms_cache = ms_since(t0);

  // Runs of consecutive sequences on one route: [b0, b1), rows [r0, r1).
  struct Run { int64_t b0, b1, r0, r1; bool dense; };
  auto for_each_run = [&](auto&& fn) -> Status {
    int64_t b = 0, r = 0;
    while (b < B) {
      const bool dense = route_[b] == Route::kDense;
      Run run{b, b, r, r, dense};
      while (run.b1 < B && (route_[run.b1] == Route::kDense) == dense) {
        run.r1 += p.q_lens.ptr<const int32_t>()[run.b1 * p.q_lens.stride[0]];
        ++run.b1;
      }
      b = run.b1;
      r = run.r1;
      if (run.r1 > run.r0) {
        Status s = fn(run);
        if (!s.ok()) return s;
      }
    }
    return Status::Ok();
  };

  // Backend attention scratch against the plan's reservation (the CPU needs none: attention.h).
  const bool query_ws = dev.type != DeviceType::kCPU;
  auto attn_ws_check = [&](size_t need) -> Status {
    if (static_cast<int64_t>(need) > lay.attn_ws_bytes)
      return internal("attention needs " + num(static_cast<int64_t>(need)) + " bytes of workspace, the plan reserved " +
                      num(lay.attn_ws_bytes));
    return Status::Ok();
  };
  auto run_topk = [&](TopkParams& tp, void* ws, size_t ws_bytes) -> Status {
    tp.workspace = ws;
    tp.workspace_bytes = ws_bytes;
    tp.stream = p.stream;
    if (query_ws && topk_workspace_size(tp) > ws_bytes)
      return internal("top-k needs " + num(static_cast<int64_t>(topk_workspace_size(tp))) + " bytes of scratch, the layout holds " +
                      num(static_cast<int64_t>(ws_bytes)));
    return topk(tp);
  };
  auto sparse_attend = [&](int64_t r0, int64_t n, const TensorDesc& mapped) -> Status {
    const auto ts = Clock::now();
    SparseMlaParams sp;
    sp.q = rows(p.q, r0, n);
    sp.kv.paged = p.mla_cache;
    sp.indices = mapped;
    sp.attn_sink = p.attn_sink;
    sp.sm_scale = sm_scale;
    sp.out = rows(p.out, r0, n);
    sp.lse = rows(p.lse, r0, n);
    sp.workspace = lay.attn_ws;
    sp.workspace_bytes = static_cast<size_t>(lay.attn_ws_bytes);
    sp.stream = p.stream;
    Status s = query_ws ? attn_ws_check(sparse_mla_workspace_size(sp)) : Status::Ok();
    if (s.ok()) s = sparse_mla(sp);
    rep.ms_sparse += ms_since(ts);
    return s;
  };
  auto map_paged = [&](const TensorDesc& idx, int64_t r0, int64_t n, const TensorDesc& out) -> Status {
    const auto tm = Clock::now();
    MapIndicesParams mp;
    mp.indices = idx;
    mp.row_seq = rows(row_seq, r0, n);
    mp.kind = IndexMapKind::kPaged;
    mp.block_table = p.block_table;
    mp.page_size = cfg.page_size;
    mp.num_blocks = p.mla_cache.num_blocks;  // a table entry past the cache is an error, not a silent -1
    mp.out = out;
    mp.stream = p.stream;
    Status s = map_indices(mp);
    rep.ms_map += ms_since(tm);
    return s;
  };
  auto score_rows = [&](int64_t r0, int64_t n, float* logits, int64_t width, int64_t stride, int64_t col_offset) {
    const auto tl = Clock::now();
    IndexerLogitsPagedParams lp;
    lp.q = dev_tensor(lay.index_q + r0 * Hi * kIndexHeadDim, DType::kE4M3, {n, Hi, kIndexHeadDim}, dev);
    lp.weights = dev_tensor(lay.index_w + r0 * Hi, DType::kF32, {n, Hi}, dev);
    lp.cache = p.index_cache;
    lp.block_table = p.block_table;
    lp.row_seq = rows(row_seq, r0, n);
    lp.row_len = rows(row_len, r0, n);
    lp.col_offset = col_offset;
    lp.logits = dev_tensor(logits, DType::kF32, {n, width}, dev);
    lp.logits.stride[0] = stride;
    lp.stream = p.stream;
    Status s = indexer_logits_paged(lp);
    rep.ms_score += ms_since(tl);
    return s;
  };

  // Rows per identity / shared chunk: the largest count whose layout fits the score region.
  auto max_rows_fitting = [&](auto&& bytes_of) {
    int64_t lo = 1, hi = std::max<int64_t>(T, 1);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (bytes_of(mid) <= lay.score_bytes) lo = mid; else hi = mid - 1;
    }
    return lo;  // the plan guarantees one row fits
  };

  // ---- 2. dense runs ----
  int64_t cu_at = 0;
  st = for_each_run([&](const Run& run) -> Status {
    if (!run.dense) return Status::Ok();
    const auto td = Clock::now();
    const int64_t nb = run.b1 - run.b0, n = run.r1 - run.r0;
    int32_t* cu_host = dense_cu_h + cu_at;  // a region per dense run
    cu_host[0] = 0;
    int64_t run_max_kv = 0;
    for (int64_t b = run.b0; b < run.b1; ++b) {
      cu_host[b - run.b0 + 1] = cu_host[b - run.b0] + p.q_lens.ptr<const int32_t>()[b * p.q_lens.stride[0]];
      run_max_kv = std::max<int64_t>(run_max_kv, p.kv_lens.ptr<const int32_t>()[b * p.kv_lens.stride[0]]);
    }
    int32_t* cu_dev = lay.dense_cu + cu_at;
    cu_at += nb + 1;
    Status s = upload(cu_dev, cu_host, (nb + 1) * 4, dev, p.stream);
    if (!s.ok()) return s;
    DenseMlaParams dp;
    dp.q = rows(p.q, run.r0, n);
    dp.kv.paged = p.mla_cache;
    dp.cu_seqlens_q = dev_tensor(cu_dev, DType::kI32, {nb + 1}, dev);
    dp.block_table = rows(p.block_table, run.b0, nb);
    // Only the pages dense keys can use (kv_len <= topk): the kernels size their key split by
    // the block table's width, and a batch-wide width would launch empty splits.
    dp.block_table.shape[1] = std::min<int64_t>(dp.block_table.shape[1], std::max<int64_t>(1, (run_max_kv + cfg.page_size - 1) / cfg.page_size));
    dp.kv_lens = dev_tensor(lay.kv_lens + run.b0, DType::kI32, {nb}, dev);
    dp.attn_sink = p.attn_sink;
    dp.sm_scale = sm_scale;
    dp.out = rows(p.out, run.r0, n);
    dp.lse = rows(p.lse, run.r0, n);
    dp.workspace = lay.attn_ws;
    dp.workspace_bytes = static_cast<size_t>(lay.attn_ws_bytes);
    dp.stream = p.stream;
    s = query_ws ? attn_ws_check(dense_mla_workspace_size(dp)) : Status::Ok();
    if (s.ok()) s = dense_mla(dp);
    rep.ms_dense += ms_since(td);
    if (!s.ok() || !p.indices_out.present()) return s;
    // A consumer of this layer's indices gets the exact selection 0..L-1: top-k of a row with
    // L <= topk reads no score, so it fills the identity through the ordinary op.
    // Identity rows have L <= min(topk, max_context) keys: no wider than a scored chunk's rows.
    const int64_t id_width = std::min<int64_t>(K, cfg.max_context);
    const int64_t per = max_rows_fitting([&](int64_t r) { return plan_.chunk_bytes(r, id_width); });
    for (int64_t r0 = run.r0; r0 < run.r1 && s.ok(); r0 += per) {
      const int64_t m = std::min(per, run.r1 - r0);
      score_arena = fresh_score_arena();
      core::ChunkLayout cl;
      if (!core::layout_chunk(score_arena, dev, m, id_width, K, &cl)) return internal("identity chunk does not fit the score region");
      const auto ts = Clock::now();
      TopkParams tp;
      tp.logits = dev_tensor(cl.scores, DType::kF32, {m, id_width}, dev);
      tp.logits.stride[0] = cl.stride;
      tp.lengths = rows(row_len, r0, m);
      tp.k = K;
      tp.indices = rows(p.indices_out, r0, m);
      s = run_topk(tp, cl.topk_ws, cl.topk_ws_bytes);
      rep.ms_select += ms_since(ts);
    }
    return s;
  });
  if (!st.ok()) return finish(st);

  // ---- 3. sparse runs, pipelined per chunk: score -> select -> map -> attend ----
  const int64_t shared_per = max_rows_fitting([&](int64_t r) {
    core::Arena a = core::Arena::counting();
    int32_t* m;
    core::layout_shared(a, r, K, &m);
    return a.used();
  });
  st = for_each_run([&](const Run& run) -> Status {
    if (run.dense) return Status::Ok();
    Status s;
    if (!scores) {
      for (int64_t r0 = run.r0; r0 < run.r1 && s.ok(); r0 += shared_per) {
        const int64_t m = std::min(shared_per, run.r1 - r0);
        score_arena = fresh_score_arena();
        int32_t* mapped;
        if (!core::layout_shared(score_arena, m, K, &mapped)) return internal("shared chunk does not fit the score region");
        const TensorDesc md = dev_tensor(mapped, DType::kI32, {m, K}, dev);
        s = map_paged(rows(p.indices_in, r0, m), r0, m, md);
        if (s.ok()) s = sparse_attend(r0, m, md);
        ++rep.score_chunks;
      }
      return s;
    }
    const int64_t n = run.r1 - run.r0;
    {
      const auto tq = Clock::now();
      PrepareIndexerQParams pq;
      pq.q = rows(p.index_q, run.r0, n);
      pq.weights = rows(p.index_w, run.r0, n);
      pq.positions = rows(positions, run.r0, n);
      pq.cos_sin = p.cos_sin;
      pq.rope = g.index_rope;
      pq.hadamard = p.hadamard;
      pq.q_out = dev_tensor(lay.index_q + run.r0 * Hi * kIndexHeadDim, DType::kE4M3, {n, Hi, kIndexHeadDim}, dev);
      pq.weights_out = dev_tensor(lay.index_w + run.r0 * Hi, DType::kF32, {n, Hi}, dev);
      pq.stream = p.stream;
      s = prepare_indexer_q(pq);
      rep.ms_prepare += ms_since(tq);
      if (!s.ok()) return s;
    }
    int64_t r0 = run.r0;
    while (r0 < run.r1 && s.ok()) {
      // Greedy chunk: add rows while the chunk's exact layout fits the score region.
      int64_t m = 0, width = 0;
      while (r0 + m < run.r1) {
        const int64_t w2 = std::max<int64_t>(width, row_len_h[r0 + m]);
        if (plan_.chunk_bytes(m + 1, w2) > lay.score_bytes) break;
        width = w2;
        ++m;
      }
      score_arena = fresh_score_arena();
      if (m > 0) {
        core::ChunkLayout cl;
        if (!core::layout_chunk(score_arena, dev, m, width, K, &cl)) return internal("chunk does not fit the score region");
        s = score_rows(r0, m, cl.scores, width, cl.stride, 0);
        const TensorDesc idx = p.indices_out.present() ? rows(p.indices_out, r0, m)
                                                       : dev_tensor(cl.idx, DType::kI32, {m, K}, dev);
        if (s.ok()) {
          const auto ts = Clock::now();
          TopkParams tp;
          tp.logits = dev_tensor(cl.scores, DType::kF32, {m, width}, dev);
          tp.logits.stride[0] = cl.stride;
          tp.lengths = rows(row_len, r0, m);
          tp.k = K;
          tp.indices = idx;
          s = run_topk(tp, cl.topk_ws, cl.topk_ws_bytes);
          rep.ms_select += ms_since(ts);
        }
        const TensorDesc md = dev_tensor(cl.mapped, DType::kI32, {m, K}, dev);
        if (s.ok()) s = map_paged(idx, r0, m, md);
        if (s.ok()) s = sparse_attend(r0, m, md);
        ++rep.score_chunks;
        r0 += m;
        continue;
      }
      // One row alone does not fit: score it in key tiles, merging partial top-k exactly.
      const int64_t len = row_len_h[r0], Wt = plan_.tile_width;
      if (Wt <= 0) return internal("a row of " + num(len) + " keys does not fit and the plan has no tile width");
      const int64_t ntiles = (len + Wt - 1) / Wt;
      if (ntiles > plan_.max_tiles) return internal("a row needs more tiles than the plan's max_tiles");
      core::TiledLayout tl;
      if (!core::layout_tiled(score_arena, dev, Wt, plan_.max_tiles, K, &tl)) return internal("tiled row does not fit the score region");
      // Tile tables (the score region is reused between rows, so each tiled row uploads its
      // own): offsets and the full tiles from the constant table, the last tile from this row's
      // own staging words.
      int32_t* last = tile_last_h + 2 * rep.tiled_rows;
      const int64_t last_len = len - (ntiles - 1) * Wt;
      last[0] = static_cast<int32_t>(last_len);
      last[1] = static_cast<int32_t>(K + std::min(last_len, K));
      const size_t full = static_cast<size_t>(ntiles - 1) * 4;
      if (!(s = upload(tl.tile_offset, tile_table, ntiles * 4, dev, p.stream)).ok()) return s;
      if (!(s = upload(tl.tile_len, tile_table + tile_stride, full, dev, p.stream)).ok()) return s;
      if (!(s = upload(tl.tile_len + ntiles - 1, last, 4, dev, p.stream)).ok()) return s;
      if (!(s = upload(tl.merge_len, tile_table + 2 * tile_stride, full, dev, p.stream)).ok()) return s;
      if (!(s = upload(tl.merge_len + ntiles - 1, last + 1, 4, dev, p.stream)).ok()) return s;
      const TensorDesc dest = p.indices_out.present() ? rows(p.indices_out, r0, 1)
                                                      : dev_tensor(tl.idx, DType::kI32, {1, K}, dev);
      int cur = 0;
      for (int64_t i = 0; i < ntiles && s.ok(); ++i) {
        s = score_rows(r0, 1, tl.scores, Wt, core::score_stride(Wt), i * Wt);
        if (!s.ok()) break;
        const auto ts = Clock::now();
        TopkParams tp;
        tp.logits = dev_tensor(tl.scores, DType::kF32, {1, Wt}, dev);
        tp.lengths = dev_tensor(tl.tile_len + i, DType::kI32, {1}, dev);
        tp.k = K;
        const bool last = i + 1 == ntiles;
        if (ntiles == 1) {
          tp.indices = dest;
          s = run_topk(tp, tl.topk_ws, tl.topk_ws_bytes);
          rep.ms_select += ms_since(ts);
          break;
        }
        const int64_t half = i == 0 ? 0 : K;  // tile 0 seeds the running best
        tp.indices = dev_tensor(tl.cand_idx[cur] + half, DType::kI32, {1, K}, dev);
        tp.values = dev_tensor(tl.cand_val[cur] + half, DType::kF32, {1, K}, dev);
        s = run_topk(tp, tl.topk_ws, tl.topk_ws_bytes);
        if (s.ok() && i > 0) {
          // Tile-local -> key index: + tile offset (a flat map with kv_start = offset).
          MapIndicesParams off;
          off.indices = tp.indices;
          off.kind = IndexMapKind::kFlat;
          off.kv_start = dev_tensor(tl.tile_offset + i, DType::kI32, {1}, dev);
          off.out = tp.indices;
          off.stream = p.stream;
          s = map_indices(off);
          // Merge: candidates [running k | tile's best] are in ascending key order, so the
          // top-k of their values with ties to the lower position is the exact top-k so far.
          TopkParams mg;
          mg.logits = dev_tensor(tl.cand_val[cur], DType::kF32, {1, 2 * K}, dev);
          mg.lengths = dev_tensor(tl.merge_len + i, DType::kI32, {1}, dev);
          mg.k = K;
          mg.indices = dev_tensor(tl.pos, DType::kI32, {1, K}, dev);
          mg.values = dev_tensor(tl.cand_val[1 - cur], DType::kF32, {1, K}, dev);
          if (s.ok()) s = run_topk(mg, tl.topk_ws, tl.topk_ws_bytes);
          // Positions -> key indices: a gather, as a paged map with page size 1 over the candidates.
          MapIndicesParams gather;
          gather.indices = mg.indices;
          gather.kind = IndexMapKind::kPaged;
          gather.block_table = dev_tensor(tl.cand_idx[cur], DType::kI32, {1, 2 * K}, dev);
          gather.page_size = 1;
          gather.out = last ? dest : dev_tensor(tl.cand_idx[1 - cur], DType::kI32, {1, K}, dev);
          gather.stream = p.stream;
          if (s.ok()) s = map_indices(gather);
          cur = 1 - cur;
        }
        rep.ms_select += ms_since(ts);
        ++rep.score_tiles;
      }
      if (ntiles == 1) ++rep.score_tiles;
      const TensorDesc md = dev_tensor(tl.mapped, DType::kI32, {1, K}, dev);
      if (s.ok()) s = map_paged(dest, r0, 1, md);
      if (s.ok()) s = sparse_attend(r0, 1, md);
      ++rep.tiled_rows;
      r0 += 1;
    }
    return s;
  });
  return finish(st);
}

}  // namespace dsa
