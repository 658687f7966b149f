#include "run_batch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace dsa_cli {

const char* seq_kind_name(SeqKind k) {
  switch (k) {
    case SeqKind::kPrefill: return "prefill";
    case SeqKind::kChunkedPrefill: return "chunked-prefill";
    case SeqKind::kDecode: return "decode";
  }
  return "?";
}

BatchSpec default_batch(const dsa::ModelGeometry& geo, int context, int chunk, int short_len,
                        int decode_seqs, int next_n) {
  BatchSpec s;
  s.geo = geo;
  s.next_n = next_n;
  s.seqs.push_back({SeqKind::kPrefill, short_len, short_len, false});
  s.seqs.push_back({SeqKind::kChunkedPrefill, std::min(chunk, context), context, false});
  // Decodes at different depths, all past topk when the context allows it.
  for (int i = 0; i < decode_seqs; ++i) {
    int kv = std::max(next_n, context / (2 + i) + 1 + 37 * i);
    s.seqs.push_back({SeqKind::kDecode, next_n, kv, false});
  }
  return s;
}

int64_t BatchSpec::prefix_tokens() const {
  int64_t n = 0;
  for (const auto& q : seqs) n += q.kv_len - q.q_len;
  return n;
}

std::string BatchSpec::finalize() {
  if (seqs.empty()) return "the batch has no sequences";
  for (auto& q : seqs) {
    if (q.q_len < 1 || q.kv_len < q.q_len) return "every sequence needs 1 <= q_len <= kv_len";
    if (q.kind == SeqKind::kDecode && q.q_len != next_n) return "decode sequences have q_len = next_n";
    if (q.kv_len > geo.max_positions) return "kv_len exceeds the preset's max positions";
    q.sparse = q.kv_len > geo.topk;
  }
  // Dense first, then sparse prefills, then sparse decodes (each range contiguous).
  auto rank = [](const SeqSpec& q) { return !q.sparse ? 0 : (q.kind == SeqKind::kDecode ? 2 : 1); };
  std::stable_sort(seqs.begin(), seqs.end(),
                   [&](const SeqSpec& a, const SeqSpec& b) { return rank(a) < rank(b); });
  num_tokens = num_dense_rows = num_sparse_rows = num_decode_rows = 0;
  num_dense_seqs = 0;
  max_blocks = max_kv_len = 0;
  row_seq.clear();
  row_pos.clear();
  int64_t blocks = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& q = seqs[b];
    for (int i = 0; i < q.q_len; ++i) {
      row_seq.push_back(static_cast<int>(b));
      row_pos.push_back(q.kv_len - q.q_len + i);
    }
    num_tokens += q.q_len;
    int nb = (q.kv_len + page_size - 1) / page_size;
    blocks += nb;
    max_blocks = std::max(max_blocks, nb);
    max_kv_len = std::max(max_kv_len, q.kv_len);
    if (!q.sparse) {
      num_dense_rows += q.q_len;
      ++num_dense_seqs;
    } else {
      num_sparse_rows += q.q_len;
      if (q.kind == SeqKind::kDecode) num_decode_rows += q.q_len;
    }
  }
  num_blocks = static_cast<int>(blocks) + 3;  // spare pages: NaN-poisoned, never referenced
  return "";
}

dsa::PlannerConfig plan_config(const BatchSpec& s, int64_t score_budget_bytes) {
  dsa::PlannerConfig c;
  c.geometry = s.geo;
  c.cache_dtype = s.mla_dtype;
  c.page_size = s.page_size;
  c.max_tokens_per_step = s.num_tokens;
  c.max_seqs_per_step = static_cast<int64_t>(s.seqs.size());
  c.max_context = s.max_kv_len;
  c.max_next_n = s.next_n;
  c.score_budget_bytes = score_budget_bytes;
  c.device_memory_bytes = 0;  // the tool allocates its own caches
  c.device = s.device;
  return c;
}

namespace {

using Clock = std::chrono::steady_clock;

// splitmix64: fast, seeded, identical everywhere.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (2.0 / 16777216.0) - 1.0); }  // [-1, 1)
};

void fill_bf16(Buffer& b, size_t n, Rng& r, float scale) {
  auto* p = b.host_as<uint16_t>();
  for (size_t i = 0; i < n; ++i) p[i] = dsa::float_to_bf16(r.uniform() * scale);
}
void fill_f32(Buffer& b, size_t n, Rng& r, float scale) {
  auto* p = b.host_as<float>();
  for (size_t i = 0; i < n; ++i) p[i] = r.uniform() * scale;
}

std::unique_ptr<Buffer> alloc(const BatchSpec& s, RunBuffers* b, size_t bytes, std::string* err) {
  auto buf = std::make_unique<Buffer>(s.device, bytes);
  if (!buf->ok() && err->empty()) err->assign("device allocation of " + std::to_string(bytes) + " bytes failed: " + device_error_string());
  b->total_bytes += bytes;
  return buf;
}

dsa::TensorDesc view(Buffer& buf, dsa::DType dt, std::initializer_list<int64_t> shape) {
  return dsa::make_tensor(buf.dev(), dt, shape, buf.device());
}

dsa::MlaCacheDesc mla_desc(const BatchSpec& s, RunBuffers& b) {
  dsa::MlaCacheDesc c;
  c.data = b.mla_cache->dev();
  c.dtype = s.mla_dtype;
  c.num_blocks = s.num_blocks;
  c.page_size = s.page_size;
  c.device = s.device;
  return c;
}

dsa::IndexerCacheDesc idx_desc(const BatchSpec& s, RunBuffers& b) {
  dsa::IndexerCacheDesc c;
  c.data = b.idx_cache->dev();
  c.num_blocks = s.num_blocks;
  c.page_size = s.page_size;
  c.device = s.device;
  return c;
}


int num_seqs(const BatchSpec& s) { return static_cast<int>(s.seqs.size()); }

}  // namespace

std::string setup_run(const BatchSpec& s, const dsa::Plan& plan, RunBuffers* b, bool progress) {
  const int64_t T = s.num_tokens, B = num_seqs(s);
  const int64_t H = s.geo.num_heads, Hi = s.geo.index_heads, P = s.page_size, K = s.geo.topk;
  std::string err;
  b->idx_q = alloc(s, b, T * Hi * 128 * 2, &err);
  b->idx_w = alloc(s, b, T * Hi * 4, &err);
  b->idx_k = alloc(s, b, T * 128 * 2, &err);
  b->kv_c = alloc(s, b, T * 512 * 2, &err);
  b->k_pe = alloc(s, b, T * 64 * 2, &err);
  b->q_mla = alloc(s, b, T * H * dsa::kQkDim * 2, &err);
  b->cos_sin = alloc(s, b, int64_t(s.max_kv_len) * 64 * 4, &err);
  b->block_table = alloc(s, b, B * s.max_blocks * 4, &err);
  b->idx_cache = alloc(s, b, int64_t(s.num_blocks) * P * dsa::kIndexerTokenBytes, &err);
  b->mla_cache = alloc(s, b, int64_t(s.num_blocks) * P * dsa::mla_token_bytes(s.mla_dtype), &err);
  b->indices = alloc(s, b, T * K * 4, &err);
  b->out = alloc(s, b, T * H * dsa::kLatentDim * 2, &err);
  b->lse = alloc(s, b, T * H * 4, &err);
  b->workspace = alloc(s, b, static_cast<size_t>(plan.workspace_bytes), &err);
  b->positions = alloc(s, b, T * 4, &err);
  b->q8 = alloc(s, b, T * Hi * 128, &err);
  b->w_folded = alloc(s, b, T * Hi * 4, &err);
  b->q_scale = alloc(s, b, T * Hi * 4, &err);
  if (!err.empty()) return err;

  // Inputs.
  if (progress) std::fprintf(stderr, "[dsa run] generating inputs (seed %llu)\n", (unsigned long long)s.seed);
  Rng rng(s.seed);
  fill_bf16(*b->idx_q, T * Hi * 128, rng, 1.0f);
  fill_f32(*b->idx_w, T * Hi, rng, 1.0f);
  fill_bf16(*b->idx_k, T * 128, rng, 1.0f);
  fill_bf16(*b->kv_c, T * 512, rng, 1.0f);
  fill_bf16(*b->k_pe, T * 64, rng, 1.0f);
  fill_bf16(*b->q_mla, T * H * dsa::kQkDim, rng, 1.0f);
  {
    auto* cs = b->cos_sin->host_as<float>();
    for (int64_t pos = 0; pos < s.max_kv_len; ++pos) {
      for (int i = 0; i < 32; ++i) {
        double inv_freq = std::pow(s.rope_theta, -2.0 * i / 64.0);
        cs[pos * 64 + i] = static_cast<float>(std::cos(pos * inv_freq));
        cs[pos * 64 + 32 + i] = static_cast<float>(std::sin(pos * inv_freq));
      }
    }
  }
  // Pages: a seeded shuffle, so block-table mistakes cannot hide behind identity mappings.
  std::vector<int> perm(s.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = s.num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
  const int spare = perm[s.num_blocks - 1];
  auto* bt = b->block_table->host_as<int32_t>();
  size_t next_block = 0;
  for (int64_t q = 0; q < B; ++q) {
    int nb = (s.seqs[q].kv_len + s.page_size - 1) / s.page_size;
    for (int j = 0; j < s.max_blocks; ++j) bt[q * s.max_blocks + j] = j < nb ? perm[next_block++] : spare;
  }
  auto slot_of = [&](int seq, int pos) -> int64_t {
    return int64_t(bt[int64_t(seq) * s.max_blocks + pos / s.page_size]) * s.page_size + pos % s.page_size;
  };
  b->q_lens.resize(B);
  b->kv_lens.resize(B);
  for (int64_t q = 0; q < B; ++q) {
    b->q_lens[q] = s.seqs[q].q_len;
    b->kv_lens[q] = s.seqs[q].kv_len;
  }
  for (int64_t t = 0; t < T; ++t) b->positions->host_as<int32_t>()[t] = s.row_pos[t];
  // Unused cache slots hold NaN (0xff is NaN in e4m3, bf16 and f32): they must never matter.
  // Outputs and the workspace start NaN-poisoned too, so an unwritten row or a read of
  // workspace bytes the step did not write shows up.
  for (Buffer* x : {b->idx_cache.get(), b->mla_cache.get(), b->out.get(), b->lse.get(), b->workspace.get()})
    std::memset(x->host(), 0xff, x->bytes());
  std::memset(b->indices->host(), 0x7f, b->indices->bytes());  // an unwritten index is out of range
  for (auto* buf : {b->idx_q.get(), b->idx_w.get(), b->idx_k.get(), b->kv_c.get(), b->k_pe.get(),
                    b->q_mla.get(), b->positions.get(), b->cos_sin.get(), b->block_table.get(),
                    b->idx_cache.get(), b->mla_cache.get(), b->indices.get(), b->out.get(), b->lse.get(),
                    b->workspace.get()}) {
    if (!buf->upload()) return "upload failed: " + device_error_string();
  }

  // The cached prefix: the tokens every sequence had before this step, written like any token.
  const int64_t Np = s.prefix_tokens();
  if (Np > 0) {
    if (progress) std::fprintf(stderr, "[dsa run] writing the cached prefix (%lld tokens)\n", (long long)Np);
    Buffer pk(s.device, Np * 128 * 2), ppos(s.device, Np * 4), pslots(s.device, Np * 8);
    Buffer pkv(s.device, Np * 512 * 2), ppe(s.device, Np * 64 * 2), pk8(s.device, Np * 128), pks(s.device, Np * 4);
    for (Buffer* x : {&pk, &ppos, &pslots, &pkv, &ppe, &pk8, &pks})
      if (!x->ok()) return "device allocation for the prefix failed: " + device_error_string();
    fill_bf16(pk, Np * 128, rng, 1.0f);
    fill_bf16(pkv, Np * 512, rng, 1.0f);
    fill_bf16(ppe, Np * 64, rng, 1.0f);
    int64_t n = 0;
    for (int64_t q = 0; q < B; ++q) {
      for (int pos = 0; pos < s.seqs[q].kv_len - s.seqs[q].q_len; ++pos, ++n) {
        ppos.host_as<int32_t>()[n] = pos;
        pslots.host_as<int64_t>()[n] = slot_of(static_cast<int>(q), pos);
      }
    }
    for (Buffer* x : {&pk, &ppos, &pslots, &pkv, &ppe})
      if (!x->upload()) return "upload failed: " + device_error_string();
    dsa::PrepareIndexerKParams pp;
    pp.k = view(pk, dsa::DType::kBF16, {Np, 128});
    pp.positions = view(ppos, dsa::DType::kI32, {Np});
    pp.cos_sin = view(*b->cos_sin, dsa::DType::kF32, {s.max_kv_len, 64});
    pp.rope = s.geo.index_rope;
    pp.hadamard = s.hadamard;
    pp.k_out = view(pk8, dsa::DType::kE4M3, {Np, 128});
    pp.k_scale = view(pks, dsa::DType::kF32, {Np});
    dsa::Status st = dsa::prepare_indexer_k(pp);
    if (!st.ok()) return "prefix: " + st.to_string();
    dsa::WriteIndexerCacheParams wi;
    wi.k = pp.k_out;
    wi.k_scale = pp.k_scale;
    wi.where.slots = view(pslots, dsa::DType::kI64, {Np});
    wi.cache = idx_desc(s, *b);
    st = dsa::write_indexer_cache(wi);
    if (!st.ok()) return "prefix: " + st.to_string();
    dsa::WriteMlaCacheParams wm;
    wm.kv_c = view(pkv, dsa::DType::kBF16, {Np, 512});
    wm.k_pe = view(ppe, dsa::DType::kBF16, {Np, 64});
    wm.where.slots = wi.where.slots;
    wm.cache = mla_desc(s, *b);
    st = dsa::write_mla_cache(wm);
    if (!st.ok()) return "prefix: " + st.to_string();
    if (!device_sync(s.device, &err)) return "prefix: device error: " + err;
  }
  // The caches as the step finds them: the checks compare every slot it must not touch.
  for (Buffer* x : {b->idx_cache.get(), b->mla_cache.get()})
    if (!x->download()) return "download failed: " + device_error_string();
  b->idx_cache_before.assign(b->idx_cache->host(), b->idx_cache->host() + b->idx_cache->bytes());
  b->mla_cache_before.assign(b->mla_cache->host(), b->mla_cache->host() + b->mla_cache->bytes());
  return "";
}

std::string run_step(const BatchSpec& s, RunBuffers& b, dsa::Attention& attn, dsa::StepReport* report,
                     double* wall_ms, bool time_stages) {
  const int64_t T = s.num_tokens, B = num_seqs(s), H = s.geo.num_heads, Hi = s.geo.index_heads;
  dsa::StepParams p;
  p.role = dsa::IndexerRole::kFull;
  p.q_lens = dsa::make_tensor(b.q_lens.data(), dsa::DType::kI32, {B}, dsa::cpu_device());
  p.kv_lens = dsa::make_tensor(b.kv_lens.data(), dsa::DType::kI32, {B}, dsa::cpu_device());
  p.block_table = view(*b.block_table, dsa::DType::kI32, {B, s.max_blocks});
  p.kv_c = view(*b.kv_c, dsa::DType::kBF16, {T, 512});
  p.k_pe = view(*b.k_pe, dsa::DType::kBF16, {T, 64});
  p.q = view(*b.q_mla, dsa::DType::kBF16, {T, H, dsa::kQkDim});
  p.index_q = view(*b.idx_q, dsa::DType::kBF16, {T, Hi, 128});
  p.index_k = view(*b.idx_k, dsa::DType::kBF16, {T, 128});
  p.index_w = view(*b.idx_w, dsa::DType::kF32, {T, Hi});
  p.cos_sin = view(*b.cos_sin, dsa::DType::kF32, {s.max_kv_len, 64});
  p.hadamard = s.hadamard;
  p.mla_cache = mla_desc(s, b);
  p.index_cache = idx_desc(s, b);
  p.indices_out = view(*b.indices, dsa::DType::kI32, {T, s.geo.topk});
  p.out = view(*b.out, dsa::DType::kBF16, {T, H, dsa::kLatentDim});
  p.lse = view(*b.lse, dsa::DType::kF32, {T, H});
  p.workspace = b.workspace->dev();
  p.workspace_bytes = b.workspace->bytes();
  p.time_stages = time_stages;
  const auto t0 = Clock::now();
  dsa::Status st = attn.step(p, report);
  std::string err;
  const bool synced = device_sync(s.device, &err);
  *wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!st.ok()) return st.to_string();
  if (!synced) return "device error: " + err;
  return "";
}

std::string prepare_reference_queries(const BatchSpec& s, RunBuffers& b) {
  const int64_t T = s.num_tokens, Hi = s.geo.index_heads;
  dsa::PrepareIndexerQParams p;
  p.q = view(*b.idx_q, dsa::DType::kBF16, {T, Hi, 128});
  p.weights = view(*b.idx_w, dsa::DType::kF32, {T, Hi});
  p.positions = view(*b.positions, dsa::DType::kI32, {T});
  p.cos_sin = view(*b.cos_sin, dsa::DType::kF32, {s.max_kv_len, 64});
  p.rope = s.geo.index_rope;
  p.hadamard = s.hadamard;
  p.q_out = view(*b.q8, dsa::DType::kE4M3, {T, Hi, 128});
  p.weights_out = view(*b.w_folded, dsa::DType::kF32, {T, Hi});
  p.q_scale = view(*b.q_scale, dsa::DType::kF32, {T, Hi});
  dsa::Status st = dsa::prepare_indexer_q(p);
  std::string err;
  if (!device_sync(s.device, &err)) return "prepare_indexer_q: device error: " + err;
  return st.ok() ? "" : st.to_string();
}

std::string download_all(RunBuffers& b) {
  for (auto* buf : {b.q8.get(), b.w_folded.get(), b.q_scale.get(), b.indices.get(), b.out.get(), b.lse.get(),
                    b.idx_cache.get(), b.mla_cache.get()}) {
    if (!buf->download()) return "download failed: " + device_error_string();
  }
  return "";
}

}  // namespace dsa_cli
