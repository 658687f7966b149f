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
  if (p.slot_mapping.present()) {
    where.slots = p.slot_mapping;  // -1: a padded token, written nowhere
  } else {
    where.block_table = p.block_table;
    where.token_seq = s.row_seq;
    where.token_pos = s.token_pos;
  }
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

Status mask_padded(Step& s) {
  const StepParams& p = s.p;
  MaskPaddedArgs a;
  a.slots = p.slot_mapping.ptr<const int64_t>();
  a.slot_stride = p.slot_mapping.stride[0];
  a.T = s.shape.T;
  a.H = s.H;
  a.D = s.core ? s.cfg.geometry.v_head_dim : kLatentDim;  // out's last dim
  a.out = static_cast<uint8_t*>(p.out.data);
  a.out_s0 = p.out.stride[0];
  a.out_s1 = p.out.stride[1];
  a.out_es = static_cast<int64_t>(dtype_size(p.out.dtype));
  a.lse = p.lse.ptr<float>();
  a.lse_s0 = p.lse.stride[0];
  a.lse_s1 = p.lse.stride[1];
  if (p.indices_out.present()) {
    a.ind = p.indices_out.ptr<int32_t>();
    a.ind_s0 = p.indices_out.stride[0];
    a.ind_s1 = p.indices_out.stride[1];
    a.K = s.K;
  }
  return s.ops.mask_padded(a, p.stream);
}

}  // namespace step
}  // namespace core
}  // namespace dsa
