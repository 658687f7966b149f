// Stage: write caches. Every token of every route goes into the MLA latent cache; full and mtp
// layers also quantize their indexer keys (RoPE, optional Hadamard, FP8) into the indexer cache.
#include "core/step/step.h"
#include "dsa/cache.h"
#include "dsa/indexer.h"

namespace dsa {
namespace core {
namespace step {

Status write_caches(Step& s) {
  const StepParams& p = s.p;
  const int64_t T = s.shape.T;
  const auto t0 = Clock::now();
  Status st;
  mark(s, Stage::kCache);
  CacheSlots where;
  where.block_table = p.block_table;
  where.token_seq = s.row_seq;
  where.token_pos = s.token_pos;
  {
    WriteMlaCacheParams w;
    w.kv_c = p.kv_c;
    w.k_pe = p.k_pe;
    w.where = where;
    w.cache = p.mla_cache;
    w.stream = p.stream;
    if (!(st = write_mla_cache(w)).ok()) return st;
  }
  if (s.shape.scores) {
    const TensorDesc k8 = dev_tensor(s.lay.index_k, DType::kE4M3, {T, kIndexHeadDim}, s.dev);
    const TensorDesc k_scale = dev_tensor(s.lay.index_k_scale, DType::kF32, {T}, s.dev);
    PrepareIndexerKParams pk;
    pk.k = p.index_k;
    pk.positions = s.positions;
    pk.cos_sin = p.cos_sin;
    pk.rope = s.cfg.geometry.index_rope;
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
  s.rep.ms_cache = ms_since(t0);
  return Status::Ok();
}

}  // namespace step
}  // namespace core
}  // namespace dsa
