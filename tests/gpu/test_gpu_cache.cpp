// GPU cache writes and reads (SPEC §4) against the CPU backend: the cache bytes are the
// contract, so a GPU-written cache must equal a CPU-written one byte for byte, including the
// untouched (NaN-poisoned) slots. Device slot data cannot be validated, so out-of-range
// slots and block-table entries must be skipped without touching memory.
#include <climits>

#include "gpu_util.h"

using namespace dsa;
using namespace dsa_gpu_test;
using dsa_test::Rng;

namespace {


// Fills a cache with NaN patterns: every 4-byte word 0x7fc07fc0 is a NaN as f32 and as two bf16.
std::vector<uint8_t> poisoned_cache(size_t bytes) {
  std::vector<uint8_t> c(bytes);
  for (size_t i = 0; i < bytes; i += 4) {
    const uint32_t w = 0x7fc07fc0u;
    std::memcpy(&c[i], &w, std::min<size_t>(4, bytes - i));
  }
  return c;
}

// Slots for T tokens: a permutation of some cache slots, every 5th token skipped (-1).
std::vector<int64_t> scatter_slots(Rng& rng, int64_t T, int64_t num_slots) {
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  for (int64_t i = 0; i < num_slots; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng.gen);
  std::vector<int64_t> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s[t] = (t % 5 == 4) ? -1 : all[t];
  return s;
}

// Device-only invalid slots, mixed into valid ones.
std::vector<int64_t> with_invalid_slots(std::vector<int64_t> s, int64_t num_slots, std::vector<int64_t>* cpu_equiv) {
  const int64_t bad[] = {INT64_MIN, -2, -1, num_slots, num_slots + 1, INT64_MAX, INT_MAX, INT_MIN};
  *cpu_equiv = s;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) && i * 3 < s.size(); ++i) {
    s[i * 3] = bad[i];
    (*cpu_equiv)[i * 3] = -1;
  }
  return s;
}

void run_indexer_write(int64_t T, int64_t page, int64_t blocks, bool use_table, bool invalid, uint64_t seed) {
  Rng rng(seed);
  const int64_t B = 3, max_blocks = (T + page - 1) / page + 2;
  if (use_table) blocks = std::max(blocks, B * max_blocks);  // distinct blocks per table entry
  const int64_t num_slots = blocks * page;
  ASSERT_LE(T, num_slots);
  std::vector<uint8_t> k(static_cast<size_t>(T * 128));
  for (auto& b : k) b = static_cast<uint8_t>(rng.integer(0, 255) & 0xf7);  // no NaN codes needed
  std::vector<float> ks(static_cast<size_t>(T));
  for (auto& s : ks) s = std::ldexp(1.f, static_cast<int>(rng.integer(-20, 4)));
  const size_t bytes = static_cast<size_t>(blocks * page * kIndexerTokenBytes);
  std::vector<uint8_t> ref = poisoned_cache(bytes);

  // The placement: slots, or a block table with token sequence and position.
  std::vector<int64_t> slots = scatter_slots(rng, T, num_slots), cpu_slots = slots;
  if (invalid) slots = with_invalid_slots(slots, num_slots, &cpu_slots);
  std::vector<int32_t> table(static_cast<size_t>(B * max_blocks)), seq(static_cast<size_t>(T)), posv(static_cast<size_t>(T));
  if (use_table) {
    std::vector<int32_t> perm(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    // Sequence b gets tokens t with t % B == b at consecutive positions.
    for (int64_t t = 0; t < T; ++t) { seq[t] = static_cast<int32_t>(t % B); posv[t] = static_cast<int32_t>(t / B); }
    // Distinct blocks per (sequence, column) so no slot is written twice.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < max_blocks; ++c) table[b * max_blocks + c] = perm[(b * max_blocks + c) % blocks];
    if (invalid) {
      // Device-only bad entries: sequences, positions and table entries out of range.
      const int32_t bad[] = {INT_MIN, -2, -1, static_cast<int32_t>(blocks), static_cast<int32_t>(blocks + 1), INT_MAX};
      for (int i = 0; i < 6 && i < T; ++i) {
        if (i % 2) seq[i] = static_cast<int32_t>(B + i); else posv[i] = bad[i] < 0 ? bad[i] : INT_MAX;
      }
      table[(B - 1) * max_blocks + 1] = bad[static_cast<int>(rng.integer(0, 5))];
      table[(B - 1) * max_blocks + 0] = bad[3];
    }
  }

  // CPU reference over host data (invalid entries replaced by skips).
  WriteIndexerCacheParams hp;
  hp.k = make_tensor(k.data(), DType::kE4M3, {T, 128});
  hp.k_scale = make_tensor(ks.data(), DType::kF32, {T});
  hp.cache.data = ref.data();
  hp.cache.num_blocks = blocks;
  hp.cache.page_size = page;
  std::vector<int64_t> cpu_slots_tbl;
  if (!use_table) {
    hp.where.slots = make_tensor(cpu_slots.data(), DType::kI64, {T});
  } else {
    // Resolve on the host exactly as the contract says, marking device-invalid tokens -1.
    cpu_slots_tbl.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = seq[t], p = posv[t];
      int64_t slot = -1;
      if (s >= 0 && s < B && p >= 0 && p / page < max_blocks) {
        const int64_t e = table[s * max_blocks + p / page];
        if (e >= 0 && e < blocks) slot = e * page + p % page;
      }
      cpu_slots_tbl[t] = slot;
    }
    hp.where.slots = make_tensor(cpu_slots_tbl.data(), DType::kI64, {T});
  }
  DSA_ASSERT_OK(write_indexer_cache(hp));

  DeviceBuffer dk(k), dks(ks), dcache(bytes), dslots(slots), dtable(table), dseq(seq), dpos(posv);
  dcache.upload(poisoned_cache(bytes));
  WriteIndexerCacheParams gp;
  gp.k = dev_tensor(dk, DType::kE4M3, {T, 128});
  gp.k_scale = dev_tensor(dks, DType::kF32, {T});
  gp.cache.data = dcache.data();
  gp.cache.num_blocks = blocks;
  gp.cache.page_size = page;
  gp.cache.device = cuda_device(0);
  if (!use_table) {
    gp.where.slots = dev_tensor(dslots, DType::kI64, {T});
  } else {
    gp.where.block_table = dev_tensor(dtable, DType::kI32, {B, max_blocks});
    gp.where.token_seq = dev_tensor(dseq, DType::kI32, {T});
    gp.where.token_pos = dev_tensor(dpos, DType::kI32, {T});
  }
  DSA_ASSERT_OK(write_indexer_cache(gp));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same_bits(dcache.download<uint8_t>(), ref, "indexer cache bytes"));
}

}  // namespace

TEST(GpuCache, IndexerCacheBytesMatchCpu) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 11;
  for (bool table : {false, true})
    for (bool invalid : {false, true}) {
      SCOPED_TRACE(testing::Message() << "table " << table << " invalid " << invalid);
      run_indexer_write(1, 64, 8, table, invalid, seed++);
      run_indexer_write(200, 64, 16, table, invalid, seed++);
      run_indexer_write(77, 16, 40, table, invalid, seed++);
      run_indexer_write(3000, 64, 160, table, invalid, seed++);
    }
}

namespace {

void run_mla_write(MlaCacheDtype dtype, int64_t T, int64_t page, int64_t blocks, bool bf16_in, bool invalid, uint64_t seed) {
  Rng rng(seed);
  const int64_t num_slots = blocks * page;
  std::vector<float> kv = dsa_test::random_floats(rng, static_cast<size_t>(T * 512), 2.f);
  std::vector<float> pe = dsa_test::random_floats(rng, static_cast<size_t>(T * 64), 0.5f);
  for (int64_t t = 0; t < T; t += 3) kv[t * 512 + 130] *= 300.f;  // per-tile outliers
  std::vector<uint16_t> kvb = dsa_test::to_bf16(kv), peb = dsa_test::to_bf16(pe);
  const DType dt = bf16_in ? DType::kBF16 : DType::kF32;
  const size_t es = bf16_in ? 2 : 4;
  const void* hkv = bf16_in ? static_cast<const void*>(kvb.data()) : kv.data();
  const void* hpe = bf16_in ? static_cast<const void*>(peb.data()) : pe.data();
  const size_t bytes = static_cast<size_t>(num_slots * mla_token_bytes(dtype));
  std::vector<int64_t> slots = scatter_slots(rng, T, num_slots), cpu_slots = slots;
  if (invalid) slots = with_invalid_slots(slots, num_slots, &cpu_slots);

  std::vector<uint8_t> ref = poisoned_cache(bytes);
  WriteMlaCacheParams hp;
  hp.kv_c = make_tensor(hkv, dt, {T, 512});
  hp.k_pe = make_tensor(hpe, dt, {T, 64});
  hp.where.slots = make_tensor(cpu_slots.data(), DType::kI64, {T});
  hp.cache.data = ref.data();
  hp.cache.dtype = dtype;
  hp.cache.num_blocks = blocks;
  hp.cache.page_size = page;
  DSA_ASSERT_OK(write_mla_cache(hp));

  DeviceBuffer dkv(T * 512 * es), dpe(T * 64 * es), dslots(slots), dcache(bytes);
  dkv.upload_bytes(hkv, T * 512 * es);
  dpe.upload_bytes(hpe, T * 64 * es);
  dcache.upload(poisoned_cache(bytes));
  WriteMlaCacheParams gp = hp;
  gp.kv_c = dev_tensor(dkv, dt, {T, 512});
  gp.k_pe = dev_tensor(dpe, dt, {T, 64});
  gp.where.slots = dev_tensor(dslots, DType::kI64, {T});
  gp.cache.data = dcache.data();
  gp.cache.device = cuda_device(0);
  DSA_ASSERT_OK(write_mla_cache(gp));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same_bits(dcache.download<uint8_t>(), ref, "MLA cache bytes"));

  // Read back every written slot plus invalid ones: CPU read of the CPU cache for valid
  // slots; rows of invalid device slots are left untouched.
  std::vector<int64_t> read_slots, cpu_read;
  for (int64_t s : cpu_slots) if (s >= 0) { read_slots.push_back(s); cpu_read.push_back(s); }
  const int64_t R = static_cast<int64_t>(read_slots.size());
  std::vector<float> ref_out(static_cast<size_t>(R * 576));
  ReadMlaCacheParams hr;
  hr.cache = hp.cache;
  hr.slots = make_tensor(cpu_read.data(), DType::kI64, {R});
  hr.out = make_tensor(ref_out.data(), DType::kF32, {R, 576});
  DSA_ASSERT_OK(read_mla_cache(hr));
  const int64_t bad[] = {-1, INT64_MIN, num_slots, INT64_MAX};
  for (int64_t b : bad) read_slots.push_back(b);
  const int64_t RG = static_cast<int64_t>(read_slots.size());
  DeviceBuffer drs(read_slots), dout(RG * 576 * 4, 0xFF);
  ReadMlaCacheParams gr;
  gr.cache = gp.cache;
  gr.slots = dev_tensor(drs, DType::kI64, {RG});
  gr.out = dev_tensor(dout, DType::kF32, {RG, 576});
  DSA_ASSERT_OK(read_mla_cache(gr));
  ASSERT_TRUE(device_clean());
  std::vector<float> got = dout.download<float>();
  std::vector<float> got_valid(got.begin(), got.begin() + R * 576);
  EXPECT_TRUE(same_bits(got_valid, ref_out, "read_mla_cache"));
  // Rows of invalid slots stay untouched (the 0xFF fill).
  const std::vector<uint8_t> raw = dout.download<uint8_t>();
  for (size_t i = static_cast<size_t>(R * 576 * 4); i < raw.size(); ++i) ASSERT_EQ(raw[i], 0xFF) << "invalid slot row, byte " << i;
}

}  // namespace

TEST(GpuCache, MlaCacheBytesMatchCpu) {
  DSA_REQUIRE_GPU();
  uint64_t seed = 50;
  for (MlaCacheDtype dt : {MlaCacheDtype::kBF16, MlaCacheDtype::kFP8})
    for (bool bf16_in : {false, true})
      for (bool invalid : {false, true}) {
        SCOPED_TRACE(testing::Message() << mla_cache_dtype_name(dt) << " bf16_in " << bf16_in << " invalid " << invalid);
        run_mla_write(dt, 1, 64, 2, bf16_in, invalid, seed++);
        run_mla_write(dt, 150, 64, 4, bf16_in, invalid, seed++);
        run_mla_write(dt, 61, 1, 80, bf16_in, invalid, seed++);
        run_mla_write(dt, 90, 17, 7, bf16_in, invalid, seed++);
      }
}

TEST(GpuCache, ZeroTokensTouchNothing) {
  DSA_REQUIRE_GPU();
  const size_t bytes = 64 * kIndexerTokenBytes;
  DeviceBuffer dk(16), dks(16), dslots(16), dcache(bytes);
  dcache.upload(poisoned_cache(bytes));
  WriteIndexerCacheParams p;
  p.k = dev_tensor(dk, DType::kE4M3, {0, 128});
  p.k_scale = dev_tensor(dks, DType::kF32, {0});
  p.where.slots = dev_tensor(dslots, DType::kI64, {0});
  p.cache.data = dcache.data();
  p.cache.num_blocks = 1;
  p.cache.device = cuda_device(0);
  DSA_ASSERT_OK(write_indexer_cache(p));
  ASSERT_TRUE(device_clean());
  EXPECT_TRUE(same_bits(dcache.download<uint8_t>(), poisoned_cache(bytes), "untouched cache"));
}

// read_indexer_cache on the device: the bytes written come back (keys and scales), equal to the
// CPU's read; rows of invalid slots (-1, outside the cache) are left untouched.
TEST(GpuCache, ReadIndexerCacheIsTheInverseOfTheWrite) {
  DSA_REQUIRE_GPU();
  Rng rng(31);
  const int64_t page = 16, blocks = 9, T = 100, num_slots = page * blocks;
  std::vector<uint8_t> cache(static_cast<size_t>(blocks * page * kIndexerTokenBytes));
  for (auto& b : cache) b = static_cast<uint8_t>(rng.integer(0, 255));
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < T; ++t) slots.push_back(rng.integer(0, num_slots - 1));
  IndexerCacheDesc hc;
  hc.data = cache.data();
  hc.num_blocks = blocks;
  hc.page_size = page;
  std::vector<uint8_t> hk(static_cast<size_t>(T * 128));
  std::vector<float> hs(static_cast<size_t>(T));
  ReadIndexerCacheParams hp;
  hp.cache = hc;
  hp.slots = make_tensor(slots.data(), DType::kI64, {T});
  hp.k = make_tensor(hk.data(), DType::kE4M3, {T, 128});
  hp.k_scale = make_tensor(hs.data(), DType::kF32, {T});
  DSA_ASSERT_OK(read_indexer_cache(hp));
  std::vector<int64_t> dslots_h = slots;
  for (int64_t b : {int64_t{-1}, num_slots, INT64_MIN}) dslots_h.push_back(b);
  const int64_t R = static_cast<int64_t>(dslots_h.size());
  DeviceBuffer dcache(cache), dslots(dslots_h), dk(R * 128, 0x5A), ds(R * 4, 0x5A);
  ReadIndexerCacheParams gp;
  gp.cache = hc;
  gp.cache.data = dcache.data();
  gp.cache.device = cuda_device(0);
  gp.slots = dev_tensor(dslots, DType::kI64, {R});
  gp.k = dev_tensor(dk, DType::kE4M3, {R, 128});
  gp.k_scale = dev_tensor(ds, DType::kF32, {R});
  DSA_ASSERT_OK(read_indexer_cache(gp));
  ASSERT_TRUE(device_clean());
  const std::vector<uint8_t> gk = dk.download<uint8_t>(), gs = ds.download<uint8_t>();
  EXPECT_EQ(0, std::memcmp(gk.data(), hk.data(), hk.size()));
  EXPECT_EQ(0, std::memcmp(gs.data(), hs.data(), hs.size() * 4));
  for (size_t i = hk.size(); i < gk.size(); ++i) ASSERT_EQ(gk[i], 0x5A) << "invalid-slot key byte " << i;
  for (size_t i = hs.size() * 4; i < gs.size(); ++i) ASSERT_EQ(gs[i], 0x5A) << "invalid-slot scale byte " << i;
}
