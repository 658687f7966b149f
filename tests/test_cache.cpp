// Cache writes and reads (SPEC §4): exact bytes of the indexer page layout and of both MLA
// token layouts against the oracle, slot -1 skipping (sentinel bytes untouched), both slot
// forms, odd page sizes, padded block strides, page edges, FP8 round trips, shapes 0/1 and
// argument errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "oracle/oracle_indexer_prep.h"
#include "oracle/oracle_numerics.h"
#include "test_util.h"

using namespace dsa;
using dsa_test::Guarded;

namespace {

constexpr uint8_t kCacheFill = 0xEE;  // what untouched cache bytes must still hold

// Slots for T tokens over `num_slots`: distinct, shuffled, covering both ends and page edges,
// with every 5th token skipped (-1).
std::vector<int64_t> make_slots(dsa_test::Rng& rng, int64_t T, int64_t num_slots, int64_t page) {
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng.gen);
  // Put the edges first so they are always used.
  std::vector<int64_t> edges = {0, num_slots - 1, page - 1, page, std::min(num_slots - 1, 2 * page - 1)};
  std::vector<int64_t> out;
  for (int64_t e : edges) if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  for (int64_t s : all) if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  out.resize(static_cast<size_t>(T));
  for (int64_t t = 4; t < T; t += 5) out[t] = -1;
  return out;
}

struct MlaInput {
  std::vector<float> kv_f32, pe_f32;
  std::vector<uint16_t> kv_bf16, pe_bf16;
  std::vector<double> kv, pe;  // the values the op receives
  DType dtype;
  MlaInput(dsa_test::Rng& rng, int64_t T, DType dt) : dtype(dt) {
    kv_f32 = dsa_test::random_floats(rng, static_cast<size_t>(T * 512), 1.f);
    pe_f32 = dsa_test::random_floats(rng, static_cast<size_t>(T * 64), 3.f);
    // Tile variety: zeros (floor scale), large, tiny, and a lone outlier.
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < 128; ++i) {
        if (t % 3 == 0) kv_f32[t * 512 + i] = 0.f;
        kv_f32[t * 512 + 128 + i] *= (t % 2 ? 3e4f : 1e-5f);
      }
      kv_f32[t * 512 + 300] = 900.f;
    }
    kv_bf16 = dsa_test::to_bf16(kv_f32);
    pe_bf16 = dsa_test::to_bf16(pe_f32);
    for (size_t i = 0; i < kv_f32.size(); ++i) kv.push_back(dt == DType::kBF16 ? oracle::bf16_value(kv_bf16[i]) : kv_f32[i]);
    for (size_t i = 0; i < pe_f32.size(); ++i) pe.push_back(dt == DType::kBF16 ? oracle::bf16_value(pe_bf16[i]) : pe_f32[i]);
  }
  TensorDesc kv_c(int64_t T) {
    return dtype == DType::kBF16 ? dsa_test::t_bf16(kv_bf16.data(), {T, 512}) : dsa_test::t_f32(kv_f32.data(), {T, 512});
  }
  TensorDesc k_pe(int64_t T) {
    return dtype == DType::kBF16 ? dsa_test::t_bf16(pe_bf16.data(), {T, 64}) : dsa_test::t_f32(pe_f32.data(), {T, 64});
  }
};

MlaCacheDesc mla_desc(Guarded& buf, MlaCacheDtype dt, int64_t blocks, int64_t page, int64_t stride = 0) {
  MlaCacheDesc c;
  c.data = buf.data();
  c.dtype = dt;
  c.num_blocks = blocks;
  c.page_size = page;
  c.block_stride_bytes = stride;
  return c;
}

}  // namespace

TEST(Cache, IndexerPagesHoldKeysThenScales) {
  for (auto cfg : std::vector<std::pair<int64_t, int64_t>>{{64, 0}, {8, 8 * 132 + 48}, {4, 0}}) {
    const int64_t page = cfg.first, blocks = 3, T = 2 * page + 1;
    SCOPED_TRACE(::testing::Message() << "page " << page << " stride " << cfg.second);
    dsa_test::Rng rng(page);
    const int64_t block_bytes = cfg.second ? cfg.second : page * 132;
    Guarded cache(static_cast<size_t>(blocks * block_bytes), kCacheFill);
    std::vector<uint8_t> k(static_cast<size_t>(T * 128));
    std::vector<float> ks(static_cast<size_t>(T));
    for (auto& b : k) b = static_cast<uint8_t>(rng.integer(0, 255));
    for (auto& s : ks) s = std::ldexp(1.f, static_cast<int>(rng.integer(-20, 5)));
    std::vector<int64_t> slots = make_slots(rng, T, blocks * page, page);
    WriteIndexerCacheParams p;
    p.k = dsa_test::t_e4m3(k.data(), {T, 128});
    p.k_scale = dsa_test::t_f32(ks.data(), {T});
    p.where.slots = dsa_test::t_i64(slots.data(), {T});
    p.cache.data = cache.data();
    p.cache.num_blocks = blocks;
    p.cache.page_size = page;
    p.cache.block_stride_bytes = cfg.second;
    DSA_ASSERT_OK(write_indexer_cache(p));
    ASSERT_TRUE(cache.intact());
    std::vector<uint8_t> want(cache.size(), kCacheFill);
    for (int64_t t = 0; t < T; ++t) {
      if (slots[t] < 0) continue;
      const int64_t blk = slots[t] / page, off = slots[t] % page;
      std::memcpy(&want[blk * block_bytes + off * 128], &k[t * 128], 128);
      std::memcpy(&want[blk * block_bytes + page * 128 + off * 4], &ks[t], 4);
    }
    EXPECT_EQ(0, std::memcmp(want.data(), cache.data(), want.size()));
    // read_indexer_cache is the inverse: the keys and scales as written; -1 rows untouched.
    std::vector<int64_t> rs = slots;
    rs.push_back(-1);
    const int64_t R = T + 1;
    std::vector<uint8_t> k_back(static_cast<size_t>(R * 128), 0xA5);
    std::vector<float> s_back(static_cast<size_t>(R), -3.f);
    ReadIndexerCacheParams r;
    r.cache = p.cache;
    r.slots = dsa_test::t_i64(rs.data(), {R});
    r.k = dsa_test::t_e4m3(k_back.data(), {R, 128});
    r.k_scale = dsa_test::t_f32(s_back.data(), {R});
    DSA_ASSERT_OK(read_indexer_cache(r));
    for (int64_t t = 0; t < T; ++t) {
      if (slots[t] < 0) continue;
      ASSERT_EQ(0, std::memcmp(&k_back[t * 128], &k[t * 128], 128)) << "key " << t;
      ASSERT_EQ(s_back[t], ks[t]) << "scale " << t;
    }
    for (int64_t j = 0; j < 128; ++j) ASSERT_EQ(k_back[T * 128 + j], 0xA5);
    ASSERT_EQ(s_back[T], -3.f);
    rs[0] = blocks * page;  // outside the cache: refused, naming the slot
    EXPECT_TRUE(dsa_test::fails_naming(read_indexer_cache(r), {"read_indexer_cache", "slots[0]"}));
    r.k = dsa_test::t_e4m3(k_back.data(), {R, 64});
    EXPECT_TRUE(dsa_test::fails_naming(read_indexer_cache(r), {"read_indexer_cache", "k", "128"}));
  }
}

TEST(Cache, MlaBf16TokenBytesAreExact) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto cfg : std::vector<std::pair<int64_t, int64_t>>{{64, 0}, {3, 3 * 1152 + 16}, {1, 0}}) {
      const int64_t page = cfg.first, blocks = 4, T = std::min<int64_t>(blocks * page, 2 * page + 3);
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " page " << page);
      dsa_test::Rng rng(page + 10);
      MlaInput in(rng, T, dt);
      const int64_t block_bytes = cfg.second ? cfg.second : page * 1152;
      Guarded cache(static_cast<size_t>(blocks * block_bytes), kCacheFill);
      std::vector<int64_t> slots = make_slots(rng, T, blocks * page, page);
      WriteMlaCacheParams p;
      p.kv_c = in.kv_c(T);
      p.k_pe = in.k_pe(T);
      p.where.slots = dsa_test::t_i64(slots.data(), {T});
      p.cache = mla_desc(cache, MlaCacheDtype::kBF16, blocks, page, cfg.second);
      DSA_ASSERT_OK(write_mla_cache(p));
      ASSERT_TRUE(cache.intact());
      std::vector<uint8_t> want(cache.size(), kCacheFill);
      for (int64_t t = 0; t < T; ++t) {
        if (slots[t] < 0) continue;
        auto bytes = oracle::mla_token_bytes(&in.kv[t * 512], &in.pe[t * 64], false);
        std::memcpy(&want[(slots[t] / page) * block_bytes + (slots[t] % page) * 1152], bytes.data(), 1152);
      }
      EXPECT_EQ(0, std::memcmp(want.data(), cache.data(), want.size()));
    }
  }
}

TEST(Cache, MlaFp8TokenBytesAndRoundTrip) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t page : {64, 3}) {
      const int64_t blocks = 3, T = 2 * page + 1;
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " page " << page);
      dsa_test::Rng rng(page + 20);
      MlaInput in(rng, T, dt);
      Guarded cache(static_cast<size_t>(blocks * page * 656), kCacheFill);
      std::vector<int64_t> slots = make_slots(rng, T, blocks * page, page);
      WriteMlaCacheParams p;
      p.kv_c = in.kv_c(T);
      p.k_pe = in.k_pe(T);
      p.where.slots = dsa_test::t_i64(slots.data(), {T});
      p.cache = mla_desc(cache, MlaCacheDtype::kFP8, blocks, page);
      DSA_ASSERT_OK(write_mla_cache(p));
      ASSERT_TRUE(cache.intact());
      std::vector<uint8_t> want(cache.size(), kCacheFill);
      for (int64_t t = 0; t < T; ++t) {
        if (slots[t] < 0) continue;
        auto bytes = oracle::mla_token_bytes(&in.kv[t * 512], &in.pe[t * 64], true);
        std::memcpy(&want[slots[t] * 656], bytes.data(), 656);
        for (int g = 0; g < 4; ++g) {  // the stored scales are exactly powers of two
          float s;
          std::memcpy(&s, cache.as<uint8_t>() + slots[t] * 656 + 512 + 4 * g, 4);
          EXPECT_TRUE(oracle::is_power_of_two(s)) << "token " << t << " tile " << g << ": " << s;
        }
      }
      EXPECT_EQ(0, std::memcmp(want.data(), cache.data(), want.size()));

      // Read back: the dequantised values exactly, and within half an e4m3 step (plus the BF16
      // rounding) of the original input. Rows of slot -1 stay untouched.
      Guarded out(static_cast<size_t>(T * 576 * 4));
      dsa_test::poison_f32(out.as<float>(), static_cast<size_t>(T * 576));
      ReadMlaCacheParams r;
      r.cache = p.cache;
      r.slots = dsa_test::t_i64(slots.data(), {T});
      r.out = dsa_test::t_f32(out.as<float>(), {T, 576});
      DSA_ASSERT_OK(read_mla_cache(r));
      ASSERT_TRUE(out.intact());
      for (int64_t t = 0; t < T; ++t) {
        const float* o = out.as<float>() + t * 576;
        if (slots[t] < 0) {
          uint32_t bits;
          std::memcpy(&bits, o, 4);
          EXPECT_EQ(bits, 0x7fbadbadu) << "skipped row " << t << " was written";
          continue;
        }
        auto vals = oracle::mla_token_values(&in.kv[t * 512], &in.pe[t * 64], true);
        for (int i = 0; i < 576; ++i) ASSERT_EQ(static_cast<double>(o[i]), vals[i]) << "t " << t << " i " << i;
        for (int g = 0; g < 4; ++g) {
          float s;
          std::memcpy(&s, cache.as<uint8_t>() + slots[t] * 656 + 512 + 4 * g, 4);
          for (int i = g * 128; i < (g + 1) * 128; ++i) {
            const double x = in.kv[t * 512 + i];
            const double tol = 0.5 * s * oracle::e4m3_step(std::fabs(x) / s * (1 + 1.0 / 128)) +
                               std::fabs(x) * std::ldexp(1.0, -8);
            ASSERT_LE(std::fabs(o[i] - x), tol) << "t " << t << " i " << i;
          }
        }
      }
    }
  }
}

TEST(Cache, Bf16ReadReturnsTheRoundedInput) {
  const int64_t page = 16, blocks = 2, T = 5;
  dsa_test::Rng rng(3);
  MlaInput in(rng, T, DType::kF32);
  Guarded cache(static_cast<size_t>(blocks * page * 1152), kCacheFill);
  std::vector<int64_t> slots = {31, 0, 15, 16, 7};
  WriteMlaCacheParams p;
  p.kv_c = in.kv_c(T);
  p.k_pe = in.k_pe(T);
  p.where.slots = dsa_test::t_i64(slots.data(), {T});
  p.cache = mla_desc(cache, MlaCacheDtype::kBF16, blocks, page);
  DSA_ASSERT_OK(write_mla_cache(p));
  std::vector<float> out(T * 576);
  ReadMlaCacheParams r;
  r.cache = p.cache;
  r.slots = dsa_test::t_i64(slots.data(), {T});
  r.out = dsa_test::t_f32(out.data(), {T, 576});
  DSA_ASSERT_OK(read_mla_cache(r));
  for (int64_t t = 0; t < T; ++t) {
    auto vals = oracle::mla_token_values(&in.kv[t * 512], &in.pe[t * 64], false);
    for (int i = 0; i < 576; ++i) ASSERT_EQ(static_cast<double>(out[t * 576 + i]), vals[i]);
  }
}

TEST(Cache, BlockTableFormAddressesLikeSlots) {
  // Two sequences; block_table[b][j / page] * page + j % page. Unused entries hold -1.
  for (MlaCacheDtype cdt : {MlaCacheDtype::kBF16, MlaCacheDtype::kFP8}) {
    const int64_t page = 4, blocks = 6, T = 9;
    std::vector<int32_t> table = {3, 1, -1, 0, 5, 2};  // [2, 3]
    std::vector<int32_t> seq = {0, 0, 0, 1, 1, 1, 1, 0, 1};
    std::vector<int32_t> pos = {3, 4, 7, 0, 3, 4, 11, 0, 8};
    std::vector<int64_t> slots(T);
    for (int64_t t = 0; t < T; ++t) slots[t] = table[seq[t] * 3 + pos[t] / page] * page + pos[t] % page;
    dsa_test::Rng rng(8);
    MlaInput in(rng, T, DType::kBF16);
    const int64_t tb = mla_token_bytes(cdt);
    Guarded by_table(static_cast<size_t>(blocks * page * tb), kCacheFill), by_slot(by_table.size(), kCacheFill);
    WriteMlaCacheParams p;
    p.kv_c = in.kv_c(T);
    p.k_pe = in.k_pe(T);
    p.where.slots = dsa_test::t_i64(slots.data(), {T});
    p.cache = mla_desc(by_slot, cdt, blocks, page);
    DSA_ASSERT_OK(write_mla_cache(p));
    p.where = CacheSlots{};
    p.where.block_table = dsa_test::t_i32(table.data(), {2, 3});
    p.where.token_seq = dsa_test::t_i32(seq.data(), {T});
    p.where.token_pos = dsa_test::t_i32(pos.data(), {T});
    p.cache = mla_desc(by_table, cdt, blocks, page);
    DSA_ASSERT_OK(write_mla_cache(p));
    EXPECT_EQ(0, std::memcmp(by_table.data(), by_slot.data(), by_slot.size()));
    ASSERT_TRUE(by_table.intact());
    // Every written token sits where the slot formula says.
    for (int64_t t = 0; t < T; ++t) {
      auto bytes = oracle::mla_token_bytes(&in.kv[t * 512], &in.pe[t * 64], cdt == MlaCacheDtype::kFP8);
      EXPECT_EQ(0, std::memcmp(bytes.data(), by_table.as<uint8_t>() + slots[t] * tb, static_cast<size_t>(tb))) << t;
    }

    // The indexer cache takes the same form.
    std::vector<uint8_t> k(T * 128);
    std::vector<float> ks(T);
    for (auto& b : k) b = static_cast<uint8_t>(rng.integer(0, 255));
    for (auto& s : ks) s = 0.25f;
    Guarded icache_table(static_cast<size_t>(blocks * page * 132), kCacheFill), icache_slot(icache_table.size(), kCacheFill);
    WriteIndexerCacheParams w;
    w.k = dsa_test::t_e4m3(k.data(), {T, 128});
    w.k_scale = dsa_test::t_f32(ks.data(), {T});
    w.where.slots = dsa_test::t_i64(slots.data(), {T});
    w.cache.data = icache_slot.data();
    w.cache.num_blocks = blocks;
    w.cache.page_size = page;
    DSA_ASSERT_OK(write_indexer_cache(w));
    w.where = p.where;
    w.cache.data = icache_table.data();
    DSA_ASSERT_OK(write_indexer_cache(w));
    EXPECT_EQ(0, std::memcmp(icache_table.data(), icache_slot.data(), icache_slot.size()));
  }
}

TEST(Cache, EmptyBatchesTouchNothingAndRunsRepeat) {
  const int64_t page = 64, blocks = 2;
  Guarded cache(static_cast<size_t>(blocks * page * 656), kCacheFill);
  std::vector<float> dummy(512);
  WriteMlaCacheParams p;
  p.kv_c = dsa_test::t_f32(dummy.data(), {0, 512});
  p.k_pe = dsa_test::t_f32(dummy.data(), {0, 64});
  int64_t no_slot = 0;
  p.where.slots = dsa_test::t_i64(&no_slot, {0});
  p.cache = mla_desc(cache, MlaCacheDtype::kFP8, blocks, page);
  DSA_ASSERT_OK(write_mla_cache(p));
  std::vector<uint8_t> fill(cache.size(), kCacheFill);
  EXPECT_EQ(0, std::memcmp(fill.data(), cache.data(), fill.size()));

  // A large batch written twice into fresh caches gives identical bytes.
  const int64_t T = 1000, big_blocks = 16;
  dsa_test::Rng rng(12);
  MlaInput in(rng, T, DType::kF32);
  std::vector<int64_t> slots = make_slots(rng, T, big_blocks * page, page);
  Guarded a(static_cast<size_t>(big_blocks * page * 656), kCacheFill), b(a.size(), kCacheFill);
  p.kv_c = in.kv_c(T);
  p.k_pe = in.k_pe(T);
  p.where.slots = dsa_test::t_i64(slots.data(), {T});
  p.cache = mla_desc(a, MlaCacheDtype::kFP8, big_blocks, page);
  DSA_ASSERT_OK(write_mla_cache(p));
  p.cache = mla_desc(b, MlaCacheDtype::kFP8, big_blocks, page);
  DSA_ASSERT_OK(write_mla_cache(p));
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size()));
}

TEST(Cache, RejectsBadArgumentsNamingThem) {
  const int64_t page = 4, blocks = 2, T = 2;
  Guarded mla(static_cast<size_t>(blocks * page * 1152)), idx(static_cast<size_t>(blocks * page * 132));
  std::vector<float> kv(T * 512), pe(T * 64), out(T * 576), ks(T);
  std::vector<uint8_t> k(T * 128);
  std::vector<int64_t> slots = {0, 7};
  WriteMlaCacheParams good;
  good.kv_c = dsa_test::t_f32(kv.data(), {T, 512});
  good.k_pe = dsa_test::t_f32(pe.data(), {T, 64});
  good.where.slots = dsa_test::t_i64(slots.data(), {T});
  good.cache = mla_desc(mla, MlaCacheDtype::kBF16, blocks, page);
  DSA_ASSERT_OK(write_mla_cache(good));

  auto p = good;
  std::vector<int64_t> bad = {0, 8};
  p.where.slots = dsa_test::t_i64(bad.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"write_mla_cache", "where.slots", "num_slots = 8", "slots[1] = 8"}));
  bad = {-2, 0};
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.slots", "-1", "slots[0] = -2"}));
  p = good;
  p.where.slots.dtype = DType::kI32;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.slots", "i64"}));
  p = good;
  p.kv_c = dsa_test::t_f32(kv.data(), {T, 576});
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"kv_c", "512"}));
  p = good;
  p.k_pe.dtype = DType::kE4M3;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"k_pe", "dtype"}));
  p = good;
  p.k_pe = dsa_test::t_f32(pe.data(), {T + 1, 64});
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"k_pe", "T"}));
  p = good;
  p.kv_c.stride[1] = 2;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"kv_c", "contiguous"}));
  p = good;
  p.cache.block_stride_bytes = 100;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"cache", "block_stride_bytes"}));
  p = good;
  p.cache.data = nullptr;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"cache", "num_blocks"}));
  p = good;
  p.where = CacheSlots{};
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where", "slots", "block_table"}));

  // Block-table form ranges.
  std::vector<int32_t> table = {1, 0, 0, 2};  // [2, 2]: entry 2 is out of range (2 blocks)
  std::vector<int32_t> seq = {0, 1}, pos = {5, 3};
  p = good;
  p.where = CacheSlots{};
  p.where.block_table = dsa_test::t_i32(table.data(), {2, 2});
  p.where.token_seq = dsa_test::t_i32(seq.data(), {T});
  p.where.token_pos = dsa_test::t_i32(pos.data(), {T});
  DSA_ASSERT_OK(write_mla_cache(p));
  pos = {5, 7};  // sequence 1, block 1 -> entry 2
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.block_table", "num_blocks = 2", "block_table[1][1] = 2"}));
  pos = {8, 0};
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.token_pos", "max_blocks * page_size = 8"}));
  pos = {0, 0};
  seq = {0, 2};
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.token_seq", "B = 2"}));
  seq = {0, 1};
  auto both = p;
  both.where.slots = good.where.slots;
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(both), {"where", "not both"}));
  p.where.token_pos = TensorDesc{};
  EXPECT_TRUE(dsa_test::fails_naming(write_mla_cache(p), {"where.token_pos", "required"}));

  WriteIndexerCacheParams w;
  w.k = dsa_test::t_e4m3(k.data(), {T, 128});
  w.k_scale = dsa_test::t_f32(ks.data(), {T});
  w.where.slots = dsa_test::t_i64(slots.data(), {T});
  w.cache.data = idx.data();
  w.cache.num_blocks = blocks;
  w.cache.page_size = page;
  DSA_ASSERT_OK(write_indexer_cache(w));
  auto w2 = w;
  w2.k.dtype = DType::kBF16;
  EXPECT_TRUE(dsa_test::fails_naming(write_indexer_cache(w2), {"write_indexer_cache", "k", "e4m3"}));
  w2 = w;
  w2.k_scale = dsa_test::t_f32(ks.data(), {T, 1});
  EXPECT_TRUE(dsa_test::fails_naming(write_indexer_cache(w2), {"k_scale"}));
  w2 = w;
  w2.cache.page_size = 6;
  EXPECT_TRUE(dsa_test::fails_naming(write_indexer_cache(w2), {"cache", "page_size"}));
  w2 = w;
  bad = {0, 8};
  w2.where.slots = dsa_test::t_i64(bad.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(write_indexer_cache(w2), {"where.slots", "num_slots = 8"}));

  ReadMlaCacheParams r;
  r.cache = good.cache;
  r.slots = dsa_test::t_i64(slots.data(), {T});
  r.out = dsa_test::t_f32(out.data(), {T, 576});
  DSA_ASSERT_OK(read_mla_cache(r));
  auto r2 = r;
  r2.out = dsa_test::t_f32(out.data(), {T, 512});
  EXPECT_TRUE(dsa_test::fails_naming(read_mla_cache(r2), {"read_mla_cache", "out", "576"}));
  r2 = r;
  r2.slots = dsa_test::t_i64(bad.data(), {T});
  EXPECT_TRUE(dsa_test::fails_naming(read_mla_cache(r2), {"slots", "num_slots"}));
  r2 = r;
  r2.cache.device = cuda_device(0);
  EXPECT_TRUE(dsa_test::fails_naming(read_mla_cache(r2), {"read_mla_cache", "cache", "cuda:0"}));
}
