// Public entry points of the cache-write family (SPEC §4): validate, pick the device, dispatch.
#include <string>

#include "core/dispatch.h"
#include "core/validate.h"
#include "dsa/cache.h"
#include "dsa/geometry.h"

namespace dsa {
namespace {

std::string fail_msg(const char* op, const std::string& name, const std::string& what) {
  return std::string(op) + ": " + name + ": " + what;
}

// Shapes and dtypes of the token -> slot mapping for T tokens.
void check_where_shapes(core::ArgCheck& c, const CacheSlots& w, int64_t T) {
  if (w.slots.present()) {
    c.tensor(w.slots, "where.slots", {DType::kI64}, {{T, "T"}}, false);
    c.require(!w.block_table.present() && !w.token_seq.present() && !w.token_pos.present(),
              "where", "expected either slots or block_table + token_seq + token_pos, not both");
    return;
  }
  c.require(w.block_table.present(), "where",
            "expected slots [T] i64, or block_table [B, max_blocks] i32 with token_seq and token_pos");
  c.tensor(w.block_table, "where.block_table", {DType::kI32}, {"B", "max_blocks"}, false);
  c.tensor(w.token_seq, "where.token_seq", {DType::kI32}, {{T, "T"}}, false);
  c.tensor(w.token_pos, "where.token_pos", {DType::kI32}, {{T, "T"}}, false);
}

// For host tensors: every slot the op will touch lies inside the cache.
Status check_where_contents(const char* op, const CacheSlots& w, int64_t T, int64_t num_blocks,
                            int64_t page_size, const char* slots_name = "where.slots") {
  const int64_t num_slots = core::saturating_mul(num_blocks, page_size);
  if (w.slots.present()) {
    if (w.slots.device.type != DeviceType::kCPU) return Status::Ok();
    const int64_t* s = w.slots.ptr<const int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      int64_t v = s[t * w.slots.stride[0]];
      if (v < -1 || v >= num_slots) {
        return Status(StatusCode::kInvalidArgument,
                      fail_msg(op, slots_name,
                               "expected -1 (skip) or 0 <= slot < num_slots = " +
                                   std::to_string(num_slots) + ", got slots[" + std::to_string(t) +
                                   "] = " + std::to_string(v)));
      }
    }
    return Status::Ok();
  }
  if (w.block_table.device.type != DeviceType::kCPU) return Status::Ok();
  const TensorDesc& bt = w.block_table;
  const int64_t B = bt.shape[0], max_blocks = bt.shape[1];
  const int32_t* seq = w.token_seq.ptr<const int32_t>();
  const int32_t* pos = w.token_pos.ptr<const int32_t>();
  const int32_t* table = bt.ptr<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    int64_t b = seq[t * w.token_seq.stride[0]];
    int64_t j = pos[t * w.token_pos.stride[0]];
    if (b < 0 || b >= B) {
      return Status(StatusCode::kInvalidArgument,
                    fail_msg(op, "where.token_seq",
                             "expected 0 <= token_seq[t] < B = " + std::to_string(B) +
                                 ", got token_seq[" + std::to_string(t) + "] = " + std::to_string(b)));
    }
    if (j < 0 || j >= core::saturating_mul(max_blocks, page_size)) {
      return Status(StatusCode::kInvalidArgument,
                    fail_msg(op, "where.token_pos",
                             "expected 0 <= token_pos[t] < max_blocks * page_size = " +
                                 std::to_string(core::saturating_mul(max_blocks, page_size)) + ", got token_pos[" +
                                 std::to_string(t) + "] = " + std::to_string(j)));
    }
    int64_t blk = table[b * bt.stride[0] + (j / page_size) * bt.stride[1]];
    if (blk < 0 || blk >= num_blocks) {
      return Status(StatusCode::kInvalidArgument,
                    fail_msg(op, "where.block_table",
                             "expected entries used by the tokens in [0, num_blocks = " +
                                 std::to_string(num_blocks) + "), got block_table[" +
                                 std::to_string(b) + "][" + std::to_string(j / page_size) +
                                 "] = " + std::to_string(blk) + " (token " + std::to_string(t) + ")"));
    }
  }
  return Status::Ok();
}

}  // namespace

Status write_indexer_cache(const WriteIndexerCacheParams& p) {
  const char* op = "write_indexer_cache";
  core::ArgCheck c(op);
  c.tensor(p.k, "k", {DType::kE4M3}, {"T", {kIndexHeadDim, "128"}});
  if (!c.ok()) return c.status();
  const int64_t T = p.k.shape[0];
  c.tensor(p.k_scale, "k_scale", {DType::kF32}, {{T, "T"}}, false);
  check_where_shapes(c, p.where, T);
  c.indexer_cache(p.cache, "cache");
  if (c.ok()) {
    const TensorDesc cb = core::cache_bytes(p.cache);
    c.disjoint(cb, "cache", p.k, "k").disjoint(cb, "cache", p.k_scale, "k_scale");
    c.disjoint(cb, "cache", p.where.slots, "where.slots").disjoint(cb, "cache", p.where.block_table, "where.block_table");
    c.disjoint(cb, "cache", p.where.token_seq, "where.token_seq").disjoint(cb, "cache", p.where.token_pos, "where.token_pos");
  }
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op,
                                {{&p.k, "k"}, {&p.k_scale, "k_scale"}, {&p.where.slots, "where.slots"}, {&p.where.block_table, "where.block_table"},
                                 {&p.where.token_seq, "where.token_seq"}, {&p.where.token_pos, "where.token_pos"}},
                                &dev, {&p.cache.device});
  if (!st.ok()) return st;
  st = check_where_contents(op, p.where, T, p.cache.num_blocks, p.cache.page_size);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, write_indexer_cache, p));
}

Status write_mla_cache(const WriteMlaCacheParams& p) {
  const char* op = "write_mla_cache";
  core::ArgCheck c(op);
  c.tensor(p.kv_c, "kv_c", {DType::kBF16, DType::kF32}, {"T", {kLatentDim, "512"}});
  if (!c.ok()) return c.status();
  const int64_t T = p.kv_c.shape[0];
  c.tensor(p.k_pe, "k_pe", {DType::kBF16, DType::kF32}, {{T, "T"}, {kRopeDim, "64"}});
  check_where_shapes(c, p.where, T);
  c.mla_cache(p.cache, "cache");
  if (c.ok()) {
    const TensorDesc cb = core::cache_bytes(p.cache);
    c.disjoint(cb, "cache", p.kv_c, "kv_c").disjoint(cb, "cache", p.k_pe, "k_pe");
    c.disjoint(cb, "cache", p.where.slots, "where.slots").disjoint(cb, "cache", p.where.block_table, "where.block_table");
    c.disjoint(cb, "cache", p.where.token_seq, "where.token_seq").disjoint(cb, "cache", p.where.token_pos, "where.token_pos");
  }
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op,
                                {{&p.kv_c, "kv_c"}, {&p.k_pe, "k_pe"}, {&p.where.slots, "where.slots"}, {&p.where.block_table, "where.block_table"},
                                 {&p.where.token_seq, "where.token_seq"}, {&p.where.token_pos, "where.token_pos"}},
                                &dev, {&p.cache.device});
  if (!st.ok()) return st;
  st = check_where_contents(op, p.where, T, p.cache.num_blocks, p.cache.page_size);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, write_mla_cache, p));
}

Status read_mla_cache(const ReadMlaCacheParams& p) {
  const char* op = "read_mla_cache";
  core::ArgCheck c(op);
  c.mla_cache(p.cache, "cache");
  c.tensor(p.slots, "slots", {DType::kI64}, {"T"}, false);
  if (!c.ok()) return c.status();
  const int64_t T = p.slots.shape[0];
  c.output(p.out, "out", {DType::kF32}, {{T, "T"}, {kQkDim, "576"}});
  c.disjoint(p.out, "out", core::cache_bytes(p.cache), "cache").disjoint(p.out, "out", p.slots, "slots");
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.slots, "slots"}, {&p.out, "out"}}, &dev, {&p.cache.device});
  if (!st.ok()) return st;
  CacheSlots where;
  where.slots = p.slots;
  st = check_where_contents(op, where, T, p.cache.num_blocks, p.cache.page_size, "slots");
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, read_mla_cache, p));
}

Status read_indexer_cache(const ReadIndexerCacheParams& p) {
  const char* op = "read_indexer_cache";
  core::ArgCheck c(op);
  c.indexer_cache(p.cache, "cache");
  c.tensor(p.slots, "slots", {DType::kI64}, {"T"}, false);
  if (!c.ok()) return c.status();
  const int64_t T = p.slots.shape[0];
  c.tensor(p.k, "k", {DType::kE4M3}, {{T, "T"}, {kIndexHeadDim, "128"}});
  c.tensor(p.k_scale, "k_scale", {DType::kF32}, {{T, "T"}}, false);
  if (!c.ok()) return c.status();
  Device dev;
  Status st = core::pick_device(op, {{&p.slots, "slots"}, {&p.k, "k"}, {&p.k_scale, "k_scale"}}, &dev, {&p.cache.device});
  if (!st.ok()) return st;
  CacheSlots where;
  where.slots = p.slots;
  st = check_where_contents(op, where, T, p.cache.num_blocks, p.cache.page_size);
  if (!st.ok()) return st;
  return core::backend_status(op, dev, DSA_DISPATCH(dev, read_indexer_cache, p));
}

}  // namespace dsa
