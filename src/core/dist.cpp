// Host logic of the distributed ops (dsa/dist.h): the in-process communicator group, the CP
// sharding and step, the exact distributed top-k and the lse merge. Device work goes to the
// backends through src/core/dist_ops.h; collectives through the Communicator.
#include "dsa/dist.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "core/arena.h"
#include "core/dist_math.h"
#include "core/dist_ops.h"
#include "core/validate.h"
#include "dsa/cache.h"
#include "dsa/indexer.h"
#include "dsa/topk.h"

namespace dsa {
namespace distops {

StatusCode copy(Device d, void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return StatusCode::kOk;
#if defined(DSA_WITH_CUDA)
  if (d.type == DeviceType::kCUDA) return gpu::copy(dst, src, bytes, stream);
#endif
  if (d.type != DeviceType::kCPU) return StatusCode::kUnsupported;
  (void)stream;
  std::memmove(dst, src, bytes);
  return StatusCode::kOk;
}

StatusCode copy_2d(Device d, void* dst, size_t dpitch, const void* src, size_t spitch,
                   size_t width, size_t rows, void* stream) {
  if (rows == 0 || width == 0) return StatusCode::kOk;
#if defined(DSA_WITH_CUDA)
  if (d.type == DeviceType::kCUDA) return gpu::copy_2d(dst, dpitch, src, spitch, width, rows, stream);
#endif
  if (d.type != DeviceType::kCPU) return StatusCode::kUnsupported;
  (void)stream;
  for (size_t r = 0; r < rows; ++r)
    std::memmove(static_cast<uint8_t*>(dst) + r * dpitch, static_cast<const uint8_t*>(src) + r * spitch, width);
  return StatusCode::kOk;
}

StatusCode fill(Device d, void* dst, int byte, size_t bytes, void* stream) {
  if (bytes == 0) return StatusCode::kOk;
#if defined(DSA_WITH_CUDA)
  if (d.type == DeviceType::kCUDA) return gpu::fill(dst, byte, bytes, stream);
#endif
  if (d.type != DeviceType::kCPU) return StatusCode::kUnsupported;
  (void)stream;
  std::memset(dst, byte, bytes);
  return StatusCode::kOk;
}

StatusCode sync(Device d, void* stream) {
#if defined(DSA_WITH_CUDA)
  if (d.type == DeviceType::kCUDA) return gpu::sync(stream);
#endif
  (void)d;
  (void)stream;
  return StatusCode::kOk;
}

}  // namespace distops

namespace dist {
namespace {

using distops::copy;
using distops::copy_2d;
using distops::fill;

Status fail(StatusCode c, const char* op, const std::string& what) {
  return Status(c, std::string(op) + ": " + what);
}

#define DSA_DIST_TRY(op, expr)                                   \
  do {                                                           \
    const ::dsa::StatusCode _c = (expr);                         \
    if (_c != ::dsa::StatusCode::kOk) return fail(_c, op, #expr); \
  } while (0)

#define DSA_DIST_OK(expr)        \
  do {                           \
    ::dsa::Status _s = (expr);   \
    if (!_s.ok()) return _s;     \
  } while (0)

// ---- the in-process group ----------------------------------------------------------------
struct LocalShared {
  int ranks;
  Device device;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<const void*> send;
  std::vector<size_t> bytes;

  void barrier() {
    std::unique_lock<std::mutex> l(mu);
    const int64_t gen = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return generation != gen; });
    }
  }
};

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalShared> sh, int rank) : sh_(std::move(sh)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return sh_->ranks; }
  Device device() const override { return sh_->device; }

  Status all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    const char* op = "local_group.all_gather";
    const Device d = sh_->device;
    DSA_DIST_TRY(op, distops::sync(d, stream));  // this rank's send data is complete
    sh_->send[rank_] = send;
    sh_->bytes[rank_] = bytes;
    sh_->barrier();
    bool same = true;
    for (int r = 0; r < sh_->ranks; ++r) same = same && sh_->bytes[r] == bytes;
    StatusCode c = StatusCode::kOk;
    if (same) {
      for (int r = 0; r < sh_->ranks && c == StatusCode::kOk; ++r)
        c = copy(d, static_cast<uint8_t*>(recv) + r * bytes, sh_->send[r], bytes, stream);
      if (c == StatusCode::kOk) c = distops::sync(d, stream);
    }
    sh_->barrier();  // nobody reuses its send buffer before every rank has copied from it
    if (!same) return fail(StatusCode::kInvalidArgument, op, "bytes differ across ranks");
    if (c != StatusCode::kOk) return fail(c, op, "copy");
    return Status::Ok();
  }

  Status all_reduce_f32(const float* send, float* recv, size_t count, ReduceOp rop,
                        void* stream) override {
    const char* op = "local_group.all_reduce_f32";
    (void)stream;
    if (sh_->device.type != DeviceType::kCPU)
      return fail(StatusCode::kUnsupported, op, "the in-process group reduces host memory only");
    sh_->send[rank_] = send;
    sh_->bytes[rank_] = count;
    sh_->barrier();
    bool same = true;
    for (int r = 0; r < sh_->ranks; ++r) same = same && sh_->bytes[r] == count;
    std::vector<float> acc;
    if (same) {
      acc.assign(static_cast<const float*>(sh_->send[0]), static_cast<const float*>(sh_->send[0]) + count);
      for (int r = 1; r < sh_->ranks; ++r) {
        const float* x = static_cast<const float*>(sh_->send[r]);
        for (size_t i = 0; i < count; ++i)
          acc[i] = rop == ReduceOp::kSum ? acc[i] + x[i] : std::max(acc[i], x[i]);
      }
    }
    sh_->barrier();  // every rank has read every send buffer: recv may alias send
    if (!same) return fail(StatusCode::kInvalidArgument, op, "count differs across ranks");
    std::copy(acc.begin(), acc.end(), recv);
    return Status::Ok();
  }

 private:
  std::shared_ptr<LocalShared> sh_;
  int rank_;
};

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status make_local_group(int ranks, Device device, std::vector<std::unique_ptr<Communicator>>* out) {
  if (out == nullptr) return fail(StatusCode::kInvalidArgument, "make_local_group", "out: expected non-null");
  if (ranks < 1 || ranks > distops::kMaxRanks)
    return fail(StatusCode::kInvalidArgument, "make_local_group",
                "ranks: expected 1.." + std::to_string(distops::kMaxRanks) + ", got " + std::to_string(ranks));
#if !defined(DSA_WITH_CUDA)
  if (device.type == DeviceType::kCUDA)
    return fail(StatusCode::kUnsupported, "make_local_group", "device: built without the CUDA backend");
#endif
  auto sh = std::make_shared<LocalShared>();
  sh->ranks = ranks;
  sh->device = device;
  sh->send.assign(static_cast<size_t>(ranks), nullptr);
  sh->bytes.assign(static_cast<size_t>(ranks), 0);
  out->clear();
  for (int r = 0; r < ranks; ++r) out->push_back(std::make_unique<LocalComm>(sh, r));
  return Status::Ok();
}

#if !defined(DSA_WITH_NCCL)
bool nccl_available() { return false; }
Status make_nccl_communicator(void*, int, std::unique_ptr<Communicator>*) {
  return fail(StatusCode::kUnsupported, "make_nccl_communicator",
              "this build of DSA has no NCCL (configure with -DDSA_NCCL=ON and the CUDA backend)");
}
#endif

// ---- context-parallel prefill ------------------------------------------------------------
Status cp_shard(const int32_t* q_lens, const int32_t* kv_lens, int64_t B, int64_t topk, int ranks,
                int rank, std::vector<CpPiece>* pieces) {
  const char* op = "cp_shard";
  if (pieces == nullptr) return fail(StatusCode::kInvalidArgument, op, "pieces: expected non-null");
  if (ranks < 1 || rank < 0 || rank >= ranks)
    return fail(StatusCode::kInvalidArgument, op, "rank: expected 0 <= rank < ranks, got " +
                                                    std::to_string(rank) + " of " + std::to_string(ranks));
  if (B > 0 && (q_lens == nullptr || kv_lens == nullptr))
    return fail(StatusCode::kInvalidArgument, op, "q_lens, kv_lens: expected host arrays of B values");
  pieces->clear();
  const int64_t C = 2 * int64_t{ranks};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = q_lens[b], kv = kv_lens[b];
    if (q < 0 || kv < q)
      return fail(StatusCode::kInvalidArgument, op, "q_lens[" + std::to_string(b) + "], kv_lens[" +
                                                      std::to_string(b) + "]: expected 0 <= q_len <= kv_len");
    const int64_t P = kv - q, base = q / C, extra = q % C;
    auto start = [&](int64_t c) { return c * base + std::min(c, extra); };
    int64_t first = 0;  // chunks [0, first] form one piece on rank 0
    if (kv > topk)
      while (first < C - 1 && P + start(first + 1) <= topk) ++first;
    for (int64_t c = first; c < C; ++c) {
      const int64_t owner = c == first ? 0 : (c < ranks ? c : C - 1 - c);
      const int64_t s = c == first ? 0 : start(c), e = start(c + 1);
      if (owner != rank || e <= s) continue;
      pieces->push_back(CpPiece{static_cast<int32_t>(b), static_cast<int32_t>(s), static_cast<int32_t>(e - s),
                                static_cast<int32_t>(P + e)});
    }
  }
  return Status::Ok();
}

PlannerConfig cp_rank_config(const PlannerConfig& global, int ranks) {
  PlannerConfig c = global;
  (void)ranks;
  c.max_seqs_per_step = 2 * global.max_seqs_per_step;
  return c;
}

namespace {

// The CP workspace, carved in one order (sizing and use).
struct CpLayout {
  uint8_t* k8 = nullptr;     // [R, cap, 128]
  float* ks = nullptr;       // [R, cap]
  uint8_t* kvc = nullptr;    // [R, cap, 512 * 4]
  uint8_t* kpe = nullptr;    // [R, cap, 64 * 4]
  int32_t* seq = nullptr;    // [R, cap]
  int32_t* pos = nullptr;    // [R, cap]
  int32_t* bt = nullptr;     // [max_seqs, max_blocks]
};

int64_t cp_max_blocks(const Plan& plan) { return cdiv(std::max<int64_t>(plan.config.max_context, 1), plan.config.page_size); }

CpLayout cp_layout(core::Arena& a, const Plan& plan, int R) {
  const int64_t cap = plan.config.max_tokens_per_step;
  CpLayout l;
  l.k8 = a.alloc_n<uint8_t>(R * cap * 128);
  l.ks = a.alloc_n<float>(R * cap);
  l.kvc = a.alloc_n<uint8_t>(R * cap * 512 * 4);
  l.kpe = a.alloc_n<uint8_t>(R * cap * 64 * 4);
  l.seq = a.alloc_n<int32_t>(R * cap);
  l.pos = a.alloc_n<int32_t>(R * cap);
  l.bt = a.alloc_n<int32_t>(plan.config.max_seqs_per_step * cp_max_blocks(plan));
  return l;
}

TensorDesc on(Device d, TensorDesc t) {
  t.device = d;
  return t;
}

}  // namespace

int64_t cp_workspace_size(const Plan& rank_plan, int ranks) {
  core::Arena a = core::Arena::counting();
  cp_layout(a, rank_plan, std::max(ranks, 1));
  return a.used() + core::Arena::kAlign;
}

ContextParallel::ContextParallel(const Plan& rank_plan, Communicator* comm) : plan_(rank_plan), comm_(comm) {
  if (comm == nullptr) {
    status_ = fail(StatusCode::kInvalidArgument, "ContextParallel", "comm: expected non-null");
    return;
  }
  const int R = comm->size();
  const size_t cap = static_cast<size_t>(plan_.config.max_tokens_per_step);
  const size_t seqs = static_cast<size_t>(plan_.config.max_seqs_per_step);
  all_pieces_.resize(static_cast<size_t>(R));
  for (auto& v : all_pieces_) v.reserve(seqs);
  pieces_.reserve(seqs);
  h_q_lens_.resize(seqs);
  h_kv_lens_.resize(seqs);
  h_token_seq_.resize(R * cap);
  h_token_pos_.resize(R * cap);
  h_in_q_.resize(seqs);
  h_in_kv_.resize(seqs);
  h_rows_.resize(static_cast<size_t>(R));
}

Status ContextParallel::step(Attention& attn, const CpStepParams& cp, StepReport* report) {
  const char* op = "cp_step";
  if (!status_.ok()) return status_;
  const StepParams& sp = cp.step;
  const int R = comm_->size(), me = comm_->rank();
  const Device dev = comm_->device();
  const int64_t topk = plan_.config.geometry.topk;
  const int64_t cap = plan_.config.max_tokens_per_step;
  const bool index = sp.role != IndexerRole::kShared;

  core::ArgCheck c(op);
  c.tensor(cp.q_lens, "q_lens", {DType::kI32}, {"B"}, false);
  const int64_t B = c.ok() ? cp.q_lens.shape[0] : 0;
  c.tensor(cp.kv_lens, "kv_lens", {DType::kI32}, {{B, "B"}}, false);
  c.require(cp.q_lens.device.type == DeviceType::kCPU && cp.kv_lens.device.type == DeviceType::kCPU,
            "q_lens", "expected host memory (q_lens and kv_lens)");
  c.require(2 * B <= plan_.config.max_seqs_per_step, "q_lens",
            "expected B <= max_seqs_per_step / 2 of the rank plan (" +
                std::to_string(plan_.config.max_seqs_per_step / 2) + "), got " + std::to_string(B));
  c.tensor(sp.block_table, "step.block_table", {DType::kI32}, {{B, "B"}, "max_blocks"});
  if (!c.ok()) return c.status();
  if (sp.block_table.device != dev)
    return fail(StatusCode::kInvalidArgument, op, "step.block_table: expected the communicator's device");

  // The sharding of every rank (host), in contiguous copies of the sizes.
  std::vector<int32_t>& ql = h_q_lens_;
  std::vector<int32_t>& kl = h_kv_lens_;
  std::vector<int32_t>& qlv = h_in_q_;
  std::vector<int32_t>& klv = h_in_kv_;
  for (int64_t b = 0; b < B; ++b) {
    qlv[b] = cp.q_lens.ptr<const int32_t>()[b * cp.q_lens.stride[0]];
    klv[b] = cp.kv_lens.ptr<const int32_t>()[b * cp.kv_lens.stride[0]];
  }
  std::vector<int64_t>& n = h_rows_;
  std::fill(n.begin(), n.end(), 0);
  int64_t n_max = 0;
  for (int r = 0; r < R; ++r) {
    DSA_DIST_OK(cp_shard(qlv.data(), klv.data(), B, topk, R, r, &all_pieces_[r]));
    for (const CpPiece& pc : all_pieces_[r]) n[r] += pc.q_len;
    n_max = std::max(n_max, n[r]);
  }
  pieces_ = all_pieces_[me];
  if (n_max > cap)
    return fail(StatusCode::kLimitExceeded, op, "a rank's rows: " + std::to_string(n_max) +
                                                  " > max_tokens_per_step " + std::to_string(cap));
  const int64_t Tl = n[me];
  c.tensor(sp.kv_c, "step.kv_c", {DType::kF32, DType::kBF16}, {{Tl, "T_local"}, 512});
  c.tensor(sp.k_pe, "step.k_pe", {DType::kF32, DType::kBF16}, {{Tl, "T_local"}, 64});
  if (index) {
    c.tensor(sp.index_k, "step.index_k", {DType::kF32, DType::kBF16}, {{Tl, "T_local"}, 128});
    c.optional(sp.positions, "step.positions", {DType::kI32}, {{Tl, "T_local"}});
  }
  if (!c.ok()) return c.status();
  if (sp.kv_c.dtype != sp.k_pe.dtype) return fail(StatusCode::kInvalidArgument, op, "step.k_pe: expected the dtype of step.kv_c");
  if (Tl > 0 && (sp.kv_c.device != dev || sp.k_pe.device != dev))
    return fail(StatusCode::kInvalidArgument, op, "step.kv_c, step.k_pe: expected the communicator's device");

  core::Arena arena(cp.cp_workspace, static_cast<int64_t>(cp.cp_workspace_bytes));
  CpLayout L = cp_layout(arena, plan_, R);
  if (arena.failed() || cp.cp_workspace == nullptr)
    return fail(StatusCode::kWorkspaceTooSmall, op, "cp_workspace: expected at least cp_workspace_size() = " +
                                                      std::to_string(cp_workspace_size(plan_, R)) + " bytes, got " +
                                                      std::to_string(cp.cp_workspace_bytes));
  if (n_max == 0) {
    if (report) *report = StepReport{};
    return Status::Ok();
  }

  // Per-token metadata of every rank's rows: sequence and cache position.
  for (int r = 0; r < R; ++r) {
    int64_t j = r * n_max;
    for (const CpPiece& pc : all_pieces_[r])
      for (int32_t i = 0; i < pc.q_len; ++i, ++j) {
        h_token_seq_[j] = pc.seq;
        h_token_pos_[j] = klv[pc.seq] - qlv[pc.seq] + pc.q_begin + i;
      }
  }
  void* st = sp.stream;
  const size_t meta = static_cast<size_t>(R * n_max) * 4;
  DSA_DIST_TRY(op, copy(dev, L.seq, h_token_seq_.data(), meta, st));
  DSA_DIST_TRY(op, copy(dev, L.pos, h_token_pos_.data(), meta, st));

  const size_t es = dtype_size(sp.kv_c.dtype);
  const size_t kvc_row = 512 * es, kpe_row = 64 * es;
  uint8_t* const k8_me = L.k8 + me * n_max * 128;
  float* const ks_me = L.ks + me * n_max;
  uint8_t* const kvc_me = L.kvc + me * n_max * kvc_row;
  uint8_t* const kpe_me = L.kpe + me * n_max * kpe_row;
  if (Tl > 0) {
    if (index) {
      PrepareIndexerKParams pk;
      pk.k = sp.index_k;
      pk.positions = sp.positions.present() ? sp.positions : on(dev, make_tensor(L.pos + me * n_max, DType::kI32, {Tl}));
      pk.cos_sin = sp.cos_sin;
      pk.rope = plan_.config.geometry.index_rope;
      pk.hadamard = sp.hadamard;
      pk.k_out = on(dev, make_tensor(k8_me, DType::kE4M3, {Tl, 128}));
      pk.k_scale = on(dev, make_tensor(ks_me, DType::kF32, {Tl}));
      pk.stream = st;
      DSA_DIST_OK(prepare_indexer_k(pk));
    }
    DSA_DIST_TRY(op, copy_2d(dev, kvc_me, kvc_row, sp.kv_c.data, sp.kv_c.stride[0] * es, kvc_row, Tl, st));
    DSA_DIST_TRY(op, copy_2d(dev, kpe_me, kpe_row, sp.k_pe.data, sp.k_pe.stride[0] * es, kpe_row, Tl, st));
  }

  // The gather (in place: each rank's slot is its own send buffer).
  DSA_DIST_OK(comm_->group_start());
  if (index) {
    DSA_DIST_OK(comm_->all_gather(k8_me, L.k8, n_max * 128, st));
    DSA_DIST_OK(comm_->all_gather(ks_me, L.ks, n_max * 4, st));
  }
  DSA_DIST_OK(comm_->all_gather(kvc_me, L.kvc, n_max * kvc_row, st));
  DSA_DIST_OK(comm_->all_gather(kpe_me, L.kpe, n_max * kpe_row, st));
  DSA_DIST_OK(comm_->group_end());

  // The other ranks' tokens into this rank's caches (its own come with the step).
  for (int r = 0; r < R; ++r) {
    if (r == me || n[r] == 0) continue;
    const int64_t nr = n[r];
    CacheSlots where;
    where.block_table = sp.block_table;
    where.token_seq = on(dev, make_tensor(L.seq + r * n_max, DType::kI32, {nr}));
    where.token_pos = on(dev, make_tensor(L.pos + r * n_max, DType::kI32, {nr}));
    WriteMlaCacheParams w;
    w.kv_c = on(dev, make_tensor(L.kvc + r * n_max * kvc_row, sp.kv_c.dtype, {nr, 512}));
    w.k_pe = on(dev, make_tensor(L.kpe + r * n_max * kpe_row, sp.kv_c.dtype, {nr, 64}));
    w.where = where;
    w.cache = sp.mla_cache;
    w.stream = st;
    DSA_DIST_OK(write_mla_cache(w));
    if (index) {
      WriteIndexerCacheParams wi;
      wi.k = on(dev, make_tensor(L.k8 + r * n_max * 128, DType::kE4M3, {nr, 128}));
      wi.k_scale = on(dev, make_tensor(L.ks + r * n_max, DType::kF32, {nr}));
      wi.where = where;
      wi.cache = sp.index_cache;
      wi.stream = st;
      DSA_DIST_OK(write_indexer_cache(wi));
    }
  }

  if (Tl == 0) {
    if (report) *report = StepReport{};
    return Status::Ok();
  }
  // This rank's step: one chunked-prefill "sequence" per piece, over the block-table row of
  // its sequence.
  const int64_t np = static_cast<int64_t>(pieces_.size());
  const int64_t mb = std::min<int64_t>(sp.block_table.shape[1], cp_max_blocks(plan_));
  const size_t es_bt = 4;
  for (int64_t i = 0; i < np; ++i) {
    ql[i] = pieces_[i].q_len;
    kl[i] = pieces_[i].kv_len;
    const int32_t* src = sp.block_table.ptr<const int32_t>() + pieces_[i].seq * sp.block_table.stride[0];
    DSA_DIST_TRY(op, copy_2d(dev, L.bt + i * mb, mb * es_bt, src, mb * es_bt, mb * es_bt, 1, st));
  }
  StepParams s = sp;
  s.q_lens = make_tensor(ql.data(), DType::kI32, {np});
  s.kv_lens = make_tensor(kl.data(), DType::kI32, {np});
  s.block_table = on(dev, make_tensor(L.bt, DType::kI32, {np, mb}));
  return attn.step(s, report);
}

// ---- exact distributed top-k -------------------------------------------------------------
namespace {

constexpr int64_t kMaxTopk = 16384;
// A non-null address for descriptors that only size a workspace (never dereferenced).
void* const kSizingPtr = reinterpret_cast<void*>(uintptr_t{4096});

struct TopkLayout {
  int32_t* lidx = nullptr;
  float* cv = nullptr;
  int32_t* cp = nullptr;
  float* mv = nullptr;
  int32_t* mp = nullptr;
  int32_t* ml = nullptr;
  int32_t* sel = nullptr;
  void* tk = nullptr;
  int64_t tk_bytes = 0;
};

TopkParams local_topk_params(const DistTopkParams& p) {
  TopkParams t;
  t.logits = p.logits;
  t.lengths = p.lengths;
  t.k = p.k;
  t.indices = on(p.logits.device, make_tensor(kSizingPtr, DType::kI32, {p.logits.shape[0], p.k}));
  t.stream = p.stream;
  return t;
}

TopkParams merge_topk_params(const DistTopkParams& p, int R) {
  const int64_t M = p.logits.shape[0];
  TopkParams t;
  t.logits = on(p.logits.device, make_tensor(kSizingPtr, DType::kF32, {M, R * p.k}));
  t.lengths = on(p.logits.device, make_tensor(kSizingPtr, DType::kI32, {M}));
  t.k = p.k;
  t.indices = on(p.logits.device, make_tensor(kSizingPtr, DType::kI32, {M, p.k}));
  t.stream = p.stream;
  return t;
}

TopkLayout topk_layout(core::Arena& a, const DistTopkParams& p, int R) {
  const int64_t M = p.logits.shape[0], k = p.k;
  TopkLayout l;
  l.lidx = a.alloc_n<int32_t>(M * k);
  l.cv = a.alloc_n<float>(R * M * k);
  l.cp = a.alloc_n<int32_t>(R * M * k);
  l.mv = a.alloc_n<float>(M * R * k);
  l.mp = a.alloc_n<int32_t>(M * R * k);
  l.ml = a.alloc_n<int32_t>(M);
  l.sel = a.alloc_n<int32_t>(M * k);
  size_t w1 = p.logits.shape[1] > 0 ? topk_workspace_size(local_topk_params(p)) : 0;
  size_t w2 = topk_workspace_size(merge_topk_params(p, R));
  l.tk_bytes = static_cast<int64_t>(std::max(w1, w2));
  l.tk = a.alloc(l.tk_bytes);
  return l;
}

core::ArgCheck check_dist_topk(const DistTopkParams& p, int R) {
  core::ArgCheck c("dist_topk");
  c.require(p.k > 0 && p.k % 64 == 0 && p.k <= kMaxTopk, "k",
            "expected a positive multiple of 64 up to " + std::to_string(kMaxTopk) + ", got " + std::to_string(p.k));
  c.require(p.interleave >= 1, "interleave", "expected >= 1, got " + std::to_string(p.interleave));
  c.require(R >= 1 && R <= distops::kMaxRanks, "comm", "expected 1.." + std::to_string(distops::kMaxRanks) + " ranks");
  c.tensor(p.logits, "logits", {DType::kF32, DType::kBF16}, {"M", "W_local"});
  const int64_t M = c.ok() ? p.logits.shape[0] : 0;
  c.tensor(p.lengths, "lengths", {DType::kI32}, {{M, "M"}}, false);
  c.tensor(p.indices, "indices", {DType::kI32}, {{M, "M"}, {p.k, "k"}});
  c.optional(p.values, "values", {DType::kF32}, {{M, "M"}, {p.k, "k"}});
  if (c.ok())
    c.require(p.logits.shape[1] * R <= int64_t{0x7fffffff}, "logits",
              "expected W_local * ranks to fit int32 positions");
  return c;
}

}  // namespace

size_t dist_topk_workspace_size(const DistTopkParams& p, int ranks) {
  if (!check_dist_topk(p, ranks).ok()) return 0;
  core::Arena a = core::Arena::counting();
  topk_layout(a, p, ranks);
  return static_cast<size_t>(a.used() + core::Arena::kAlign);
}

Status dist_topk(const DistTopkParams& p, Communicator& comm) {
  const char* op = "dist_topk";
  const int R = comm.size(), me = comm.rank();
  core::ArgCheck c = check_dist_topk(p, R);
  if (!c.ok()) return c.status();
  Device dev;
  DSA_DIST_OK(core::pick_device(op, {{&p.logits, "logits"}, {&p.lengths, "lengths"}, {&p.indices, "indices"}, {&p.values, "values"}}, &dev));
  if (dev != comm.device()) return fail(StatusCode::kInvalidArgument, op, "logits: expected the communicator's device");
  const int64_t M = p.logits.shape[0], W = p.logits.shape[1], k = p.k;
  if (dev.type == DeviceType::kCPU)
    for (int64_t i = 0; i < M; ++i) {
      const int32_t l = p.lengths.ptr<const int32_t>()[i * p.lengths.stride[0]];
      if (l < 0 || l > W)
        return fail(StatusCode::kInvalidArgument, op, "lengths[" + std::to_string(i) + "]: expected 0.." +
                                                        std::to_string(W) + ", got " + std::to_string(l));
    }
  core::Arena a(p.workspace, static_cast<int64_t>(p.workspace_bytes));
  TopkLayout l = topk_layout(a, p, R);
  if (a.failed() || p.workspace == nullptr)
    return fail(StatusCode::kWorkspaceTooSmall, op, "workspace: expected at least dist_topk_workspace_size() = " +
                                                      std::to_string(dist_topk_workspace_size(p, R)) + " bytes, got " +
                                                      std::to_string(p.workspace_bytes));
  if (M == 0) return Status::Ok();
  auto backend = [&](StatusCode code) -> Status {
    return code == StatusCode::kOk ? Status::Ok() : core::backend_status(op, dev, code);
  };
#if defined(DSA_WITH_CUDA)
#define DSA_DIST_BACKEND(fn, args) (dev.type == DeviceType::kCUDA ? distops::gpu::fn(args) : distops::cpu::fn(args))
#else
#define DSA_DIST_BACKEND(fn, args) distops::cpu::fn(args)
#endif
  // 1. the local top-k
  if (W > 0) {
    TopkParams t = local_topk_params(p);
    t.indices.data = l.lidx;
    t.workspace = l.tk;
    t.workspace_bytes = static_cast<size_t>(l.tk_bytes);
    DSA_DIST_OK(topk(t));
  } else {
    DSA_DIST_TRY(op, fill(dev, l.lidx, 0xFF, static_cast<size_t>(M * k) * 4, p.stream));
  }
  // 2. candidates: values and global positions, into this rank's slot
  distops::CandidatesArgs ca{p.logits, l.lidx, M, k, R, me, p.interleave, l.cv + me * M * k, l.cp + me * M * k, p.stream};
  DSA_DIST_OK(backend(DSA_DIST_BACKEND(candidates, ca)));
  // 3. gather
  const size_t bytes = static_cast<size_t>(M * k) * 4;
  DSA_DIST_OK(comm.group_start());
  DSA_DIST_OK(comm.all_gather(l.cv + me * M * k, l.cv, bytes, p.stream));
  DSA_DIST_OK(comm.all_gather(l.cp + me * M * k, l.cp, bytes, p.stream));
  DSA_DIST_OK(comm.group_end());
  // 4. merge in global-position order, 5. select, 6. positions
  distops::MergeArgs ma{l.cv, l.cp, M, k, R, l.mv, l.mp, l.ml, p.stream};
  DSA_DIST_OK(backend(DSA_DIST_BACKEND(merge, ma)));
  TopkParams t = merge_topk_params(p, R);
  t.logits.data = l.mv;
  t.lengths.data = l.ml;
  t.indices.data = l.sel;
  t.workspace = l.tk;
  t.workspace_bytes = static_cast<size_t>(l.tk_bytes);
  DSA_DIST_OK(topk(t));
  distops::FinalArgs fa{l.sel, l.mv, l.mp, M, k, R * k, p.indices, p.values, p.stream};
  return backend(DSA_DIST_BACKEND(final_select, fa));
}

Status dcp_local_indices(const DcpLocalIndicesParams& p, int ranks, int rank) {
  const char* op = "dcp_local_indices";
  core::ArgCheck c(op);
  c.require(ranks >= 1 && rank >= 0 && rank < ranks, "rank", "expected 0 <= rank < ranks");
  c.require(p.interleave >= 1, "interleave", "expected >= 1");
  c.tensor(p.indices, "indices", {DType::kI32}, {"M", "k"});
  const int64_t M = c.ok() ? p.indices.shape[0] : 0, K = c.ok() ? p.indices.shape[1] : 0;
  c.tensor(p.out, "out", {DType::kI32}, {{M, "M"}, {K, "k"}});
  if (!c.ok()) return c.status();
  Device dev;
  DSA_DIST_OK(core::pick_device(op, {{&p.indices, "indices"}, {&p.out, "out"}}, &dev));
  distops::LocalIndicesArgs la{p.indices, p.out, ranks, rank, p.interleave, p.stream};
  const StatusCode code = DSA_DIST_BACKEND(local_indices, la);
  return code == StatusCode::kOk ? Status::Ok() : core::backend_status(op, dev, code);
}

// ---- lse merge ---------------------------------------------------------------------------
namespace {

core::ArgCheck check_merge(const LseMergeParams& p, int R) {
  core::ArgCheck c("lse_merge");
  c.require(R >= 1 && R <= distops::kMaxRanks, "comm", "expected 1.." + std::to_string(distops::kMaxRanks) + " ranks");
  c.tensor(p.out_partial, "out_partial", {DType::kF32, DType::kBF16}, {"T", "H", "D"});
  const int64_t T = c.ok() ? p.out_partial.shape[0] : 0, H = c.ok() ? p.out_partial.shape[1] : 0,
                D = c.ok() ? p.out_partial.shape[2] : 0;
  c.require(!c.ok() || p.out_partial.is_contiguous(), "out_partial", "expected a contiguous tensor");
  c.require(D <= 1024, "out_partial", "expected D <= 1024");
  c.tensor(p.lse_partial, "lse_partial", {DType::kF32}, {{T, "T"}, {H, "H"}});
  c.require(!c.ok() || p.lse_partial.is_contiguous(), "lse_partial", "expected a contiguous tensor");
  c.optional(p.attn_sink, "attn_sink", {DType::kF32}, {{H, "H"}}, false);
  c.tensor(p.out, "out", {DType::kF32, DType::kBF16}, {{T, "T"}, {H, "H"}, {D, "D"}});
  c.optional(p.lse, "lse", {DType::kF32}, {{T, "T"}, {H, "H"}}, false);
  return c;
}

}  // namespace

size_t lse_merge_workspace_size(const LseMergeParams& p, int ranks) {
  if (!check_merge(p, ranks).ok()) return 0;
  const int64_t T = p.out_partial.shape[0], H = p.out_partial.shape[1], D = p.out_partial.shape[2];
  core::Arena a = core::Arena::counting();
  a.alloc(ranks * T * H * D * static_cast<int64_t>(dtype_size(p.out_partial.dtype)));
  a.alloc(ranks * T * H * 4);
  return static_cast<size_t>(a.used() + core::Arena::kAlign);
}

Status lse_merge(const LseMergeParams& p, Communicator& comm) {
  const char* op = "lse_merge";
  const int R = comm.size();
  core::ArgCheck c = check_merge(p, R);
  if (!c.ok()) return c.status();
  Device dev;
  DSA_DIST_OK(core::pick_device(op, {{&p.out_partial, "out_partial"}, {&p.lse_partial, "lse_partial"}, {&p.attn_sink, "attn_sink"}, {&p.out, "out"}, {&p.lse, "lse"}}, &dev));
  if (dev != comm.device()) return fail(StatusCode::kInvalidArgument, op, "out_partial: expected the communicator's device");
  const int64_t T = p.out_partial.shape[0], H = p.out_partial.shape[1], D = p.out_partial.shape[2];
  const int64_t es = static_cast<int64_t>(dtype_size(p.out_partial.dtype));
  core::Arena a(p.workspace, static_cast<int64_t>(p.workspace_bytes));
  void* parts = a.alloc(R * T * H * D * es);
  float* lses = a.alloc_n<float>(R * T * H);
  if (a.failed() || p.workspace == nullptr)
    return fail(StatusCode::kWorkspaceTooSmall, op, "workspace: expected at least lse_merge_workspace_size() = " +
                                                      std::to_string(lse_merge_workspace_size(p, R)) + " bytes, got " +
                                                      std::to_string(p.workspace_bytes));
  if (T * H == 0) return Status::Ok();
  DSA_DIST_OK(comm.group_start());
  DSA_DIST_OK(comm.all_gather(p.out_partial.data, parts, static_cast<size_t>(T * H * D * es), p.stream));
  DSA_DIST_OK(comm.all_gather(p.lse_partial.data, lses, static_cast<size_t>(T * H) * 4, p.stream));
  DSA_DIST_OK(comm.group_end());
  distops::LseMergeArgs la{parts, p.out_partial.dtype, lses, T, H, D, R, p.attn_sink, p.out, p.lse, p.stream};
  const StatusCode code = DSA_DIST_BACKEND(lse_merge, la);
  return code == StatusCode::kOk ? Status::Ok() : core::backend_status(op, dev, code);
}

}  // namespace dist
}  // namespace dsa
