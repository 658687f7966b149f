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
  num_dense_seqs = num_decode_seqs = 0;
  max_blocks = max_kv_len = logits_width = 0;
  seq_first_row.clear();
  row_seq.clear();
  row_pos.clear();
  int64_t blocks = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& q = seqs[b];
    seq_first_row.push_back(num_tokens);
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
      logits_width = std::max(logits_width, q.kv_len);
      if (q.kind == SeqKind::kDecode) {
        num_decode_rows += q.q_len;
        ++num_decode_seqs;
      }
    }
  }
  num_blocks = static_cast<int>(blocks) + 3;  // spare pages: NaN-poisoned, never referenced
  return "";
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

dsa::TensorDesc view(Buffer& buf, dsa::DType dt, std::initializer_list<int64_t> shape, size_t byte_offset = 0) {
  return dsa::make_tensor(static_cast<uint8_t*>(buf.dev()) + byte_offset, dt, shape, buf.device());
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

dsa::TopkParams topk_params(const BatchSpec& s, RunBuffers& b) {
  dsa::TopkParams p;
  int64_t R = s.num_sparse_rows;
  p.logits = view(*b.logits, dsa::DType::kF32, {R, s.logits_width});
  p.lengths = view(*b.row_len, dsa::DType::kI32, {R});
  p.k = s.geo.topk;
  p.indices = view(*b.topk_idx, dsa::DType::kI32, {R, s.geo.topk});
  if (b.workspace) {
    p.workspace = b.workspace->dev();
    p.workspace_bytes = b.workspace->bytes();
  }
  return p;
}

dsa::SparseMlaParams sparse_params(const BatchSpec& s, RunBuffers& b) {
  dsa::SparseMlaParams p;
  const int64_t H = s.geo.num_heads, R = s.num_sparse_rows, Td = s.num_dense_rows;
  p.q = view(*b.q_mla, dsa::DType::kBF16, {R, H, dsa::kQkDim}, Td * H * dsa::kQkDim * 2);
  p.kv.paged = mla_desc(s, b);
  p.indices = view(*b.mapped, dsa::DType::kI32, {R, s.geo.topk});
  p.sm_scale = static_cast<float>(s.geo.sm_scale);
  p.out = view(*b.out, dsa::DType::kBF16, {R, H, dsa::kLatentDim}, Td * H * dsa::kLatentDim * 2);
  p.lse = view(*b.lse, dsa::DType::kF32, {R, H}, Td * H * 4);
  if (b.workspace) {
    p.workspace = b.workspace->dev();
    p.workspace_bytes = b.workspace->bytes();
  }
  return p;
}

dsa::DenseMlaParams dense_params(const BatchSpec& s, RunBuffers& b) {
  dsa::DenseMlaParams p;
  const int64_t H = s.geo.num_heads, Td = s.num_dense_rows, Bd = s.num_dense_seqs;
  p.q = view(*b.q_mla, dsa::DType::kBF16, {Td, H, dsa::kQkDim});
  p.kv.paged = mla_desc(s, b);
  p.cu_seqlens_q = view(*b.cu_seqlens_q, dsa::DType::kI32, {Bd + 1});
  p.block_table = view(*b.block_table, dsa::DType::kI32, {Bd, s.max_blocks});
  p.kv_lens = view(*b.kv_lens, dsa::DType::kI32, {Bd});
  p.sm_scale = static_cast<float>(s.geo.sm_scale);
  p.out = view(*b.out, dsa::DType::kBF16, {Td, H, dsa::kLatentDim});
  p.lse = view(*b.lse, dsa::DType::kF32, {Td, H});
  if (b.workspace) {
    p.workspace = b.workspace->dev();
    p.workspace_bytes = b.workspace->bytes();
  }
  return p;
}

// Runs `call` (returning a Status), waits for the device, times it.
template <typename F>
StageResult timed(const BatchSpec& s, const char* name, std::string what, F&& call) {
  StageResult r;
  r.name = name;
  r.what = std::move(what);
  auto t0 = Clock::now();
  dsa::Status st = call();
  std::string err;
  bool synced = device_sync(s.device, &err);
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  r.ran = true;
  if (!st.ok()) r.error = st.to_string();
  else if (!synced) r.error = "device error: " + err;
  return r;
}

StageResult skipped(const char* name, const char* why) {
  StageResult r;
  r.name = name;
  r.what = why;
  return r;
}

}  // namespace

std::string setup_run(const BatchSpec& s, RunBuffers* b, bool progress) {
  const int64_t T = s.num_tokens, R = s.num_sparse_rows, B = num_seqs(s);
  const int64_t H = s.geo.num_heads, Hi = s.geo.index_heads, P = s.page_size;
  const int64_t W = std::max(s.logits_width, 1), K = s.geo.topk;
  std::string err;
  b->idx_q = alloc(s, b, R * Hi * 128 * 2, &err);
  b->idx_w = alloc(s, b, R * Hi * 4, &err);
  b->idx_k = alloc(s, b, T * 128 * 2, &err);
  b->kv_c = alloc(s, b, T * 512 * 2, &err);
  b->k_pe = alloc(s, b, T * 64 * 2, &err);
  b->q_mla = alloc(s, b, T * H * dsa::kQkDim * 2, &err);
  b->positions = alloc(s, b, T * 4, &err);
  b->cos_sin = alloc(s, b, int64_t(s.max_kv_len) * 64 * 4, &err);
  b->block_table = alloc(s, b, B * s.max_blocks * 4, &err);
  b->token_seq = alloc(s, b, T * 4, &err);
  b->slots = alloc(s, b, T * 8, &err);
  b->kv_lens = alloc(s, b, B * 4, &err);
  b->cu_seqlens_q = alloc(s, b, (s.num_dense_seqs + 1) * 4, &err);
  b->row_seq = alloc(s, b, R * 4, &err);
  b->row_len = alloc(s, b, R * 4, &err);
  b->idx_cache = alloc(s, b, int64_t(s.num_blocks) * P * dsa::kIndexerTokenBytes, &err);
  b->mla_cache = alloc(s, b, int64_t(s.num_blocks) * P * dsa::mla_token_bytes(s.mla_dtype), &err);
  b->q8 = alloc(s, b, R * Hi * 128, &err);
  b->w_folded = alloc(s, b, R * Hi * 4, &err);
  b->q_scale = alloc(s, b, R * Hi * 4, &err);
  b->k8 = alloc(s, b, T * 128, &err);
  b->k_scale = alloc(s, b, T * 4, &err);
  b->logits = alloc(s, b, R * W * 4, &err);
  b->topk_idx = alloc(s, b, R * K * 4, &err);
  b->mapped = alloc(s, b, R * K * 4, &err);
  b->out = alloc(s, b, T * H * dsa::kLatentDim * 2, &err);
  b->lse = alloc(s, b, T * H * 4, &err);
  if (!err.empty()) return err;

  // Inputs.
  if (progress) std::fprintf(stderr, "[dsa run] generating inputs (seed %llu)\n", (unsigned long long)s.seed);
  Rng rng(s.seed);
  fill_bf16(*b->idx_q, R * Hi * 128, rng, 1.0f);
  fill_f32(*b->idx_w, R * Hi, rng, 1.0f);
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
    b->kv_lens->host_as<int32_t>()[q] = s.seqs[q].kv_len;
  }
  auto slot_of = [&](int seq, int pos) -> int64_t {
    return int64_t(bt[int64_t(seq) * s.max_blocks + pos / s.page_size]) * s.page_size + pos % s.page_size;
  };
  for (int64_t t = 0; t < T; ++t) {
    b->positions->host_as<int32_t>()[t] = s.row_pos[t];
    b->token_seq->host_as<int32_t>()[t] = s.row_seq[t];
    b->slots->host_as<int64_t>()[t] = slot_of(s.row_seq[t], s.row_pos[t]);
  }
  {
    auto* cu = b->cu_seqlens_q->host_as<int32_t>();
    cu[0] = 0;
    for (int q = 0; q < s.num_dense_seqs; ++q) cu[q + 1] = cu[q] + s.seqs[q].q_len;
  }
  for (int64_t r = 0; r < R; ++r) {
    int t = s.num_dense_rows + static_cast<int>(r);
    b->row_seq->host_as<int32_t>()[r] = s.row_seq[t];
    b->row_len->host_as<int32_t>()[r] = s.row_pos[t] + 1;
  }
  // Unused cache slots hold NaN (0xff is NaN in e4m3, bf16 and f32): they must never matter.
  std::memset(b->idx_cache->host(), 0xff, b->idx_cache->bytes());
  std::memset(b->mla_cache->host(), 0xff, b->mla_cache->bytes());
  std::memset(b->out->host(), 0xff, b->out->bytes());
  std::memset(b->lse->host(), 0xff, b->lse->bytes());
  for (auto* buf : {b->idx_q.get(), b->idx_w.get(), b->idx_k.get(), b->kv_c.get(), b->k_pe.get(),
                    b->q_mla.get(), b->positions.get(), b->cos_sin.get(), b->block_table.get(),
                    b->token_seq.get(), b->slots.get(), b->kv_lens.get(), b->cu_seqlens_q.get(),
                    b->row_seq.get(), b->row_len.get(), b->idx_cache.get(), b->mla_cache.get(),
                    b->out.get(), b->lse.get()}) {
    if (!buf->upload()) return "upload failed: " + device_error_string();
  }

  // Workspace: one buffer, the largest any op asks for.
  if (R > 0) b->workspace_topk = dsa::topk_workspace_size(topk_params(s, *b));
  if (R > 0) b->workspace_sparse = dsa::sparse_mla_workspace_size(sparse_params(s, *b));
  if (s.num_dense_rows > 0) b->workspace_dense = dsa::dense_mla_workspace_size(dense_params(s, *b));
  size_t ws = std::max({b->workspace_topk, b->workspace_sparse, b->workspace_dense, size_t(1)});
  b->workspace = alloc(s, b, ws, &err);
  if (!err.empty()) return err;

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
  return "";
}

StageResult stage_prepare_indexer_k(const BatchSpec& s, RunBuffers& b) {
  const int64_t T = s.num_tokens;
  dsa::PrepareIndexerKParams p;
  p.k = view(*b.idx_k, dsa::DType::kBF16, {T, 128});
  p.positions = view(*b.positions, dsa::DType::kI32, {T});
  p.cos_sin = view(*b.cos_sin, dsa::DType::kF32, {s.max_kv_len, 64});
  p.rope = s.geo.index_rope;
  p.hadamard = s.hadamard;
  p.k_out = view(*b.k8, dsa::DType::kE4M3, {T, 128});
  p.k_scale = view(*b.k_scale, dsa::DType::kF32, {T});
  return timed(s, "prepare_indexer_k", std::to_string(T) + " keys (every new token)",
               [&] { return dsa::prepare_indexer_k(p); });
}

StageResult stage_prepare_indexer_q(const BatchSpec& s, RunBuffers& b) {
  const int64_t R = s.num_sparse_rows, Hi = s.geo.index_heads;
  if (R == 0) return skipped("prepare_indexer_q", "no sparse rows");
  dsa::PrepareIndexerQParams p;
  p.q = view(*b.idx_q, dsa::DType::kBF16, {R, Hi, 128});
  p.weights = view(*b.idx_w, dsa::DType::kF32, {R, Hi});
  p.positions = view(*b.positions, dsa::DType::kI32, {R}, size_t(s.num_dense_rows) * 4);
  p.cos_sin = view(*b.cos_sin, dsa::DType::kF32, {s.max_kv_len, 64});
  p.rope = s.geo.index_rope;
  p.hadamard = s.hadamard;
  p.q_out = view(*b.q8, dsa::DType::kE4M3, {R, Hi, 128});
  p.weights_out = view(*b.w_folded, dsa::DType::kF32, {R, Hi});
  p.q_scale = view(*b.q_scale, dsa::DType::kF32, {R, Hi});
  return timed(s, "prepare_indexer_q", std::to_string(R) + " sparse rows x " + std::to_string(Hi) + " heads",
               [&] { return dsa::prepare_indexer_q(p); });
}

StageResult stage_write_indexer_cache(const BatchSpec& s, RunBuffers& b) {
  const int64_t T = s.num_tokens;
  dsa::WriteIndexerCacheParams p;
  p.k = view(*b.k8, dsa::DType::kE4M3, {T, 128});
  p.k_scale = view(*b.k_scale, dsa::DType::kF32, {T});
  p.where.block_table = view(*b.block_table, dsa::DType::kI32, {num_seqs(s), s.max_blocks});
  p.where.token_seq = view(*b.token_seq, dsa::DType::kI32, {T});
  p.where.token_pos = view(*b.positions, dsa::DType::kI32, {T});
  p.cache = idx_desc(s, b);
  return timed(s, "write_indexer_cache", std::to_string(T) + " tokens by block table, page " + std::to_string(s.page_size),
               [&] { return dsa::write_indexer_cache(p); });
}

StageResult stage_write_mla_cache(const BatchSpec& s, RunBuffers& b) {
  const int64_t T = s.num_tokens;
  dsa::WriteMlaCacheParams p;
  p.kv_c = view(*b.kv_c, dsa::DType::kBF16, {T, 512});
  p.k_pe = view(*b.k_pe, dsa::DType::kBF16, {T, 64});
  p.where.slots = view(*b.slots, dsa::DType::kI64, {T});
  p.cache = mla_desc(s, b);
  return timed(s, "write_mla_cache",
               std::to_string(T) + " tokens by slot, " + dsa::mla_cache_dtype_name(s.mla_dtype) + " layout",
               [&] { return dsa::write_mla_cache(p); });
}

StageResult stage_indexer_logits(const BatchSpec& s, RunBuffers& b) {
  const int64_t R = s.num_sparse_rows, Rd = s.num_decode_rows, Rp = R - Rd, Hi = s.geo.index_heads;
  const int64_t W = s.logits_width, B = num_seqs(s), Bdec = s.num_decode_seqs;
  if (R == 0) return skipped("indexer_logits", "no sparse rows");
  std::string what = "paged, W = " + std::to_string(W) + ": ";
  if (Rp) what += std::to_string(Rp) + " prefill rows (row form)";
  if (Rp && Rd) what += " + ";
  if (Rd) what += std::to_string(Rd) + " decode rows (next_n = " + std::to_string(s.next_n) + ")";
  return timed(s, "indexer_logits", what, [&]() -> dsa::Status {
    if (Rp > 0) {
      dsa::IndexerLogitsPagedParams p;
      p.q = view(*b.q8, dsa::DType::kE4M3, {Rp, Hi, 128});
      p.weights = view(*b.w_folded, dsa::DType::kF32, {Rp, Hi});
      p.cache = idx_desc(s, b);
      p.block_table = view(*b.block_table, dsa::DType::kI32, {B, s.max_blocks});
      p.kv_lens = view(*b.kv_lens, dsa::DType::kI32, {B});
      p.next_n = 1;
      p.row_seq = view(*b.row_seq, dsa::DType::kI32, {Rp});
      p.row_len = view(*b.row_len, dsa::DType::kI32, {Rp});
      p.logits = view(*b.logits, dsa::DType::kF32, {Rp, W});
      dsa::Status st = dsa::indexer_logits_paged(p);
      if (!st.ok()) return st;
    }
    if (Rd > 0) {
      const int64_t first_seq = B - Bdec;
      dsa::IndexerLogitsPagedParams p;
      p.q = view(*b.q8, dsa::DType::kE4M3, {Rd, Hi, 128}, size_t(Rp * Hi * 128));
      p.weights = view(*b.w_folded, dsa::DType::kF32, {Rd, Hi}, size_t(Rp * Hi * 4));
      p.cache = idx_desc(s, b);
      p.block_table = view(*b.block_table, dsa::DType::kI32, {Bdec, s.max_blocks}, size_t(first_seq * s.max_blocks * 4));
      p.kv_lens = view(*b.kv_lens, dsa::DType::kI32, {Bdec}, size_t(first_seq * 4));
      p.next_n = s.next_n;
      p.logits = view(*b.logits, dsa::DType::kF32, {Rd, W}, size_t(Rp * W * 4));
      return dsa::indexer_logits_paged(p);
    }
    return dsa::Status::Ok();
  });
}

StageResult stage_topk(const BatchSpec& s, RunBuffers& b) {
  if (s.num_sparse_rows == 0) return skipped("topk", "no sparse rows");
  dsa::TopkParams p = topk_params(s, b);
  return timed(s, "topk", std::to_string(s.num_sparse_rows) + " rows, k = " + std::to_string(s.geo.topk),
               [&] { return dsa::topk(p); });
}

StageResult stage_map_indices(const BatchSpec& s, RunBuffers& b) {
  const int64_t R = s.num_sparse_rows;
  if (R == 0) return skipped("map_indices", "no sparse rows");
  dsa::MapIndicesParams p;
  p.indices = view(*b.topk_idx, dsa::DType::kI32, {R, s.geo.topk});
  p.row_seq = view(*b.row_seq, dsa::DType::kI32, {R});
  p.kind = dsa::IndexMapKind::kPaged;
  p.block_table = view(*b.block_table, dsa::DType::kI32, {num_seqs(s), s.max_blocks});
  p.page_size = s.page_size;
  p.out = view(*b.mapped, dsa::DType::kI32, {R, s.geo.topk});
  return timed(s, "map_indices", std::to_string(R) + " rows to paged slots", [&] { return dsa::map_indices(p); });
}

StageResult stage_sparse_mla(const BatchSpec& s, RunBuffers& b) {
  if (s.num_sparse_rows == 0) return skipped("sparse_mla", "no sparse rows");
  dsa::SparseMlaParams p = sparse_params(s, b);
  return timed(s, "sparse_mla",
               std::to_string(s.num_sparse_rows) + " rows x " + std::to_string(s.geo.num_heads) + " heads, paged " +
                   dsa::mla_cache_dtype_name(s.mla_dtype),
               [&] { return dsa::sparse_mla(p); });
}

StageResult stage_dense_mla(const BatchSpec& s, RunBuffers& b) {
  if (s.num_dense_rows == 0) return skipped("dense_mla", "no dense sequences");
  dsa::DenseMlaParams p = dense_params(s, b);
  return timed(s, "dense_mla",
               std::to_string(s.num_dense_rows) + " rows of " + std::to_string(s.num_dense_seqs) +
                   " sequence(s) (kv_len <= topk), causal, paged " + dsa::mla_cache_dtype_name(s.mla_dtype),
               [&] { return dsa::dense_mla(p); });
}

const std::vector<StageEntry>& step_stages() {
  static const std::vector<StageEntry> stages = {
      {"prepare_indexer_k", stage_prepare_indexer_k},   {"prepare_indexer_q", stage_prepare_indexer_q},
      {"write_indexer_cache", stage_write_indexer_cache}, {"write_mla_cache", stage_write_mla_cache},
      {"indexer_logits", stage_indexer_logits},          {"topk", stage_topk},
      {"map_indices", stage_map_indices},                {"sparse_mla", stage_sparse_mla},
      {"dense_mla", stage_dense_mla},
  };
  return stages;
}

std::string download_all(RunBuffers& b) {
  for (auto* buf : {b.q8.get(), b.w_folded.get(), b.q_scale.get(), b.k8.get(), b.k_scale.get(), b.logits.get(), b.topk_idx.get(),
                    b.mapped.get(), b.out.get(), b.lse.get(), b.idx_cache.get(), b.mla_cache.get()}) {
    if (!buf->download()) return "download failed: " + device_error_string();
  }
  return "";
}

}  // namespace dsa_cli
