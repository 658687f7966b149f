// The planner: workspace layout under a hard scoring budget, then KV sizing in what is left.
// See docs/planner.md for the formulas.
#include "dsa/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/arena.h"
#include "core/mha_layout.h"
#include "core/select_cost.h"
#include "core/step_layout.h"
#include "core/validate.h"
#include "dsa/attention.h"
#include "dsa/mha.h"

namespace dsa {
namespace {

constexpr int64_t kMaxTopk = 16384;

std::string num(int64_t v) { return std::to_string(v); }
std::string bytes_str(int64_t v) { return num(v) + " bytes (" + format_byte_size(v) + ")"; }

Status invalid(const std::string& what) { return Status(StatusCode::kInvalidArgument, "plan: " + what); }
Status limit(const std::string& what) { return Status(StatusCode::kLimitExceeded, "plan: " + what); }

void* fake_ptr() { return reinterpret_cast<void*>(static_cast<uintptr_t>(1) << 12); }

// Backend workspace of sparse / dense MLA (0 on the CPU). A backend may split the keys of a
// small call across more blocks and need scratch only then (the CUDA kernels do, below ~2
// tiles per SM), so this is the maximum over every row count a call can have, up to 2048 (past
// which a device with <= 1024 SMs has enough row tiles), and, for dense, over any key count
// (the caller's block-table width sets it): the query at a very wide table bounds them all.
int64_t attention_scratch(const PlannerConfig& c, int64_t rows) {
  if (c.device.type == DeviceType::kCPU) return 0;
  const int64_t H = c.geometry.num_heads, K = c.geometry.topk;
  MlaCacheDesc cache;
  cache.data = fake_ptr();
  cache.dtype = c.cache_dtype;
  cache.num_blocks = 1;
  cache.page_size = c.page_size;
  cache.device = c.device;
  const int64_t wide_blocks = ((int64_t{1} << 24) + c.page_size - 1) / c.page_size;
  size_t need = 0;
  for (int64_t t = 1; t <= std::min<int64_t>(rows, 2048); ++t) {
    SparseMlaParams s;
    s.q = make_tensor(fake_ptr(), DType::kBF16, {t, H, kQkDim}, c.device);
    s.kv.paged = cache;
    s.indices = make_tensor(fake_ptr(), DType::kI32, {t, K}, c.device);
    s.sm_scale = 1.0f;
    s.out = make_tensor(fake_ptr(), DType::kBF16, {t, H, kLatentDim}, c.device);
    s.lse = make_tensor(fake_ptr(), DType::kF32, {t, H}, c.device);
    DenseMlaParams d;
    d.q = s.q;
    d.kv.paged = cache;
    d.cu_seqlens_q = make_tensor(fake_ptr(), DType::kI32, {2}, c.device);
    d.block_table = make_tensor(fake_ptr(), DType::kI32, {1, wide_blocks}, c.device);
    d.kv_lens = make_tensor(fake_ptr(), DType::kI32, {1}, c.device);
    d.sm_scale = 1.0f;
    d.out = s.out;
    d.lse = s.lse;
    need = std::max({need, sparse_mla_workspace_size(s), dense_mla_workspace_size(d)});
  }
  return static_cast<int64_t>(need);
}

}  // namespace

int64_t Plan::chunk_bytes(int64_t rows, int64_t width) const {
  core::Arena a = core::Arena::counting();
  core::ChunkLayout l;
  core::layout_chunk(a, config.device, rows, width, config.geometry.topk, &l);
  return a.failed() ? std::numeric_limits<int64_t>::max() : a.used();  // an overflow fits nothing
}

int64_t Plan::tiled_row_bytes(int64_t width) const {
  core::Arena a = core::Arena::counting();
  core::TiledLayout l;
  const int64_t tiles = (config.max_context + width - 1) / width;
  core::layout_tiled(a, config.device, width, tiles, config.geometry.topk, &l);
  return a.failed() ? std::numeric_limits<int64_t>::max() : a.used();
}

int64_t Plan::fused_chunk_bytes(int64_t rows, int64_t width) const {
  core::Arena a = core::Arena::counting();
  core::FusedLayout l;
  core::layout_fused(a, config.device, rows, width, config.geometry.topk, &l);
  return a.failed() ? std::numeric_limits<int64_t>::max() : a.used();
}

int64_t Plan::fused_rows_per_chunk(int64_t context_len) const {
  const int64_t w = std::max<int64_t>(context_len, 1);
  if (fused_chunk_bytes(1, w) > score_region_bytes) return 0;
  int64_t lo = 1, hi = max_rows;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fused_chunk_bytes(mid, w) <= score_region_bytes) lo = mid; else hi = mid - 1;
  }
  return lo;
}

int64_t Plan::rows_per_chunk(int64_t context_len) const {
  const int64_t w = std::max<int64_t>(context_len, 1);
  if (chunk_bytes(1, w) > score_region_bytes) return 0;
  int64_t lo = 1, hi = max_rows;  // largest rows with chunk_bytes <= region (monotone in rows)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (chunk_bytes(mid, w) <= score_region_bytes) lo = mid; else hi = mid - 1;
  }
  return lo;
}

int64_t Plan::tile_width_for(int64_t context_len) const {
  if (takes_fused(context_len)) return 0;  // fused rows are never tiled
  return rows_per_chunk(context_len) == 0 ? tile_width : 0;
}

Status make_plan(const PlannerConfig& config, Plan* out) {
  if (out == nullptr) return invalid("plan: expected a Plan to fill, got null");
  PlannerConfig c = config;
  const ModelGeometry& g = c.geometry;
  if (c.max_context == 0) c.max_context = g.max_positions;
  if (g.num_heads <= 0) return invalid("geometry.num_heads: expected > 0, got " + num(g.num_heads));
  if (g.index_heads <= 0) return invalid("geometry.index_heads: expected > 0, got " + num(g.index_heads));
  if (g.topk <= 0 || g.topk % 64 != 0 || g.topk > kMaxTopk)
    return invalid("geometry.topk: expected a positive multiple of 64 up to " + num(kMaxTopk) + ", got " + num(g.topk));
  if (g.num_layers < 0 || g.num_mtp_layers < 0)
    return invalid("geometry.num_layers: expected >= 0 main and MTP layers");
  if (c.cache_dtype != MlaCacheDtype::kBF16 && c.cache_dtype != MlaCacheDtype::kFP8)
    return invalid("cache_dtype: expected bf16 or fp8");
  if (c.page_size <= 0 || c.page_size % 4 != 0 || c.page_size > std::numeric_limits<int32_t>::max())
    return invalid("page_size: expected > 0, a multiple of 4 (indexer cache pages) and below 2^31 (i32 slots), got " +
                   num(c.page_size));
  if (c.max_tokens_per_step <= 0) return invalid("max_tokens_per_step: expected >= 1, got " + num(c.max_tokens_per_step));
  if (c.max_seqs_per_step <= 0) return invalid("max_seqs_per_step: expected >= 1, got " + num(c.max_seqs_per_step));
  if (c.max_next_n <= 0) return invalid("max_next_n: expected >= 1, got " + num(c.max_next_n));
  if (c.max_context <= 0 || c.max_context > std::numeric_limits<int32_t>::max())
    return invalid("max_context: expected in [1, 2^31 - 1], got " + num(c.max_context));
  if (g.max_positions > 0 && c.max_context > g.max_positions)
    return limit("max_context = " + num(c.max_context) + " exceeds the model's max_positions = " +
                 num(g.max_positions) + " (" + g.name + ")");
  if (c.score_budget_bytes <= 0) return invalid("score_budget_bytes: expected > 0, got " + num(c.score_budget_bytes));
  if (c.device_memory_bytes < 0) return invalid("device_memory_bytes: expected >= 0, got " + num(c.device_memory_bytes));
  if (!c.memory_is_exact && !(c.kv_cache_fraction > 0.0 && c.kv_cache_fraction <= 1.0))
    return invalid("kv_cache_fraction: expected in (0, 1], got " + std::to_string(c.kv_cache_fraction));
  // Rows are i32 everywhere: the product is checked, never wrapped (it can overflow int64).
  const int64_t decode_rows = core::saturating_mul(c.max_seqs_per_step, c.max_next_n);
  if (decode_rows > std::numeric_limits<int32_t>::max())
    return invalid("max_seqs_per_step * max_next_n: expected rows per step below 2^31, got " +
                   (decode_rows == std::numeric_limits<int64_t>::max()
                        ? num(c.max_seqs_per_step) + " * " + num(c.max_next_n) + " (overflows int64)"
                        : num(decode_rows)));
  const int64_t max_rows = std::max(c.max_tokens_per_step, decode_rows);
  if (max_rows > std::numeric_limits<int32_t>::max())
    return invalid("max_tokens_per_step: expected rows per step below 2^31, got " + num(max_rows));

  Plan p;
  p.config = c;
  p.max_rows = max_rows;
  p.score_budget_bytes = c.score_budget_bytes;
  const int64_t K = g.topk, L = c.max_context;

  // ---- the selection paths ----
  if (c.select != SelectPath::kAuto && c.select != SelectPath::kUnfused && c.select != SelectPath::kFused)
    return invalid("select: expected auto, unfused or fused");
  const core::SelectCostModel cost = core::select_cost_model(c.device.type);
  if (c.select == SelectPath::kFused && !cost.fused_available)
    return invalid(std::string("select = fused: no fused score-and-select kernel on ") + device_type_name(c.device.type) +
                   " (it exists on the CPU); use auto or unfused");
  p.fused_select = cost.fused_available && c.select != SelectPath::kUnfused;
  p.fused_min_width = !p.fused_select ? std::numeric_limits<int64_t>::max()
                      : c.select == SelectPath::kFused ? 0
                                                       : core::fused_crossover_width(cost, K);
  const int64_t budget = c.score_budget_bytes / core::Arena::kAlign * core::Arena::kAlign;
  // auto: a budget below one fused row of max_context (the fused path's candidate buffers
  // are per worker slot) leaves every row to the unfused path, which can tile.
  if (p.fused_select && c.select == SelectPath::kAuto && L > p.fused_min_width && p.fused_chunk_bytes(1, L) > budget) {
    p.fused_select = false;
    p.fused_min_width = std::numeric_limits<int64_t>::max();
  }
  // The unfused path serves rows up to the crossover, and always the identity fills of dense
  // rows (one row of min(topk, max_context) keys).
  const int64_t Lu = std::max(std::min(L, p.fused_min_width), std::min(K, L));
  p.unfused_max_width = Lu;

  // ---- the score region ----
  // The smallest region that serves unfused rows of up to `width` keys: one whole, or in tiles
  // of any width >= topk; *tile gets the widest tile within the budget (0: none fits).
  auto unfused_min = [&](int64_t width, int64_t* tile) {
    int64_t least = p.chunk_bytes(1, width);
    *tile = 0;
    for (int64_t w = core::score_stride(width); w >= K; w -= core::kScoreRowAlign) {
      const int64_t need = p.tiled_row_bytes(w);
      least = std::min(least, need);
      if (*tile == 0 && need <= budget) *tile = w;
    }
    // Identity fills of dense rows take one row of min(topk, max_context) keys.
    return std::max(least, p.chunk_bytes(1, std::min(K, L)));
  };
  int64_t best_tile = 0;
  const bool one_row_fits = p.chunk_bytes(1, Lu) <= budget;
  int64_t min_region = unfused_min(Lu, &best_tile);
  const bool fused_used = p.fused_select && L > p.fused_min_width;
  if (fused_used) min_region = std::max(min_region, p.fused_chunk_bytes(1, L));
  // auto falls back to the unfused path alone under a smaller budget (above): the smallest
  // budget that works is the lesser of the two.
  int64_t least_budget = min_region;
  if (fused_used && c.select == SelectPath::kAuto) {
    int64_t unused_tile = 0;
    least_budget = std::min(least_budget, unfused_min(L, &unused_tile));
  }
  p.min_score_budget_bytes = least_budget;
  if (min_region > budget || (!one_row_fits && best_tile == 0)) {
    return limit("score_budget_bytes = " + bytes_str(c.score_budget_bytes) +
                 " cannot serve one query row of max_context = " + num(L) + " keys with topk = " + num(K) +
                 (fused_used ? " (rows of up to " + num(Lu) + " keys unfused, wider fused)" : std::string()) +
                 "; the smallest budget that works is " + bytes_str(least_budget));
  }
  const int64_t whole = p.chunk_bytes(max_rows, Lu);
  p.unfused_region_bytes = std::min(whole, budget);
  p.unfused_bytes_all_rows = p.chunk_bytes(max_rows, L);
  if (p.fused_select) p.fused_bytes_all_rows = p.fused_chunk_bytes(max_rows, L);
  if (fused_used) p.fused_region_bytes = std::min(p.fused_bytes_all_rows, budget);
  p.score_region_bytes = std::max(p.unfused_region_bytes, p.fused_region_bytes);
  if (c.core_mode) {
    // Core mode: dense rows in MHA form decompress their K/V into the score region, so the
    // region grows (within the budget) to the MHA reservation; the longest dense context
    // whose K/V fit it is the plan's mha_max_context.
    if (g.qk_nope_head_dim <= 0 || g.qk_nope_head_dim % 16 != 0 || g.v_head_dim <= 0 || g.v_head_dim % 16 != 0)
      return invalid("core_mode: expected geometry.qk_nope_head_dim and v_head_dim positive multiples of 16, got " +
                     num(g.qk_nope_head_dim) + " and " + num(g.v_head_dim));
    if (core::mha_geometry_supported(c.device.type, g.qk_nope_head_dim, g.v_head_dim)) {
      MhaPrefillReservation r;
      if (plan_mha_prefill(c, budget, &r).ok()) {
        p.score_region_bytes = std::max(p.score_region_bytes, std::min(budget, r.bytes));
        auto mha_bytes = [&](int64_t n) {
          return mha_prefill_workspace_bytes(c.device, g.num_heads, g.qk_nope_head_dim, g.v_head_dim, n);
        };
        int64_t lo = 0, hi = r.max_seq_context;  // the longest context within the region
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo + 1) / 2;
          if (mha_bytes(mid) <= p.score_region_bytes) lo = mid; else hi = mid - 1;
        }
        p.mha_max_context = lo;
      }
    }
  }
  if (!one_row_fits) {
    p.tile_width = best_tile;
    p.max_tiles = (Lu + best_tile - 1) / best_tile;
  }

  p.max_context_rows_per_chunk = p.rows_per_chunk(L);
  if (fused_used) {
    p.fused_max_context_rows_per_chunk = p.fused_rows_per_chunk(L);
    core::Arena a = core::Arena::counting();
    core::FusedLayout l;
    const int64_t rows = p.fused_max_context_rows_per_chunk;
    core::layout_fused(a, c.device, rows, L, K, &l, &p.fused_buffers);
    for (auto& b : p.fused_buffers) b.what += " (" + num(rows) + " rows of " + num(L) + " keys)";
  }
  // The score region's breakdown for the unfused path's widest rows.
  {
    core::Arena a = core::Arena::counting();
    if (one_row_fits) {
      core::ChunkLayout l;
      const int64_t rows = p.rows_per_chunk(Lu);
      core::layout_chunk(a, c.device, rows, Lu, K, &l, &p.score_buffers);
      for (auto& b : p.score_buffers) b.what += " (" + num(rows) + " rows of " + num(Lu) + " keys)";
    } else {
      core::TiledLayout l;
      core::layout_tiled(a, c.device, p.tile_width, p.max_tiles, K, &l, &p.score_buffers);
    }
  }

  // ---- the arena ----
  p.attention_scratch_bytes = attention_scratch(c, max_rows);
  {
    core::Arena a = core::Arena::counting();
    core::StepLayout l;
    if (!core::layout_step(a, p, &l, &p.buffers))
      return limit("the workspace for max_rows = " + num(max_rows) + ", max_seqs_per_step = " + num(c.max_seqs_per_step) +
                   " and index_heads = " + num(g.index_heads) + " does not fit int64 bytes");
    p.buffers.push_back(PlanBuffer{"alignment_slack", core::Arena::kAlign,
                                   "aligns the first buffer of an unaligned workspace"});
    p.workspace_bytes = a.used() + core::Arena::kAlign;
    for (const PlanBuffer& b : p.buffers)
      if (b.name == "core_absorbed_q" || b.name == "core_latent_out") p.core_bytes += b.bytes;
  }
  p.host_bytes = core::host_staging(p).total_words() * 4;

  // ---- KV cache after the reservation ----
  p.mla_layers = g.num_layers + g.num_mtp_layers;
  p.indexer_layers = g.num_indexer_cache_layers() + g.num_mtp_layers;
  p.mla_page_bytes = c.page_size * mla_token_bytes(c.cache_dtype);
  p.indexer_page_bytes = c.page_size * kIndexerTokenBytes;
  const int64_t page_all_layers = core::saturating_add(core::saturating_mul(p.mla_layers, p.mla_page_bytes),
                                                       core::saturating_mul(p.indexer_layers, p.indexer_page_bytes));
  if (page_all_layers == std::numeric_limits<int64_t>::max())
    return invalid("geometry.num_layers: the bytes of one page over all layers overflow int64");
  const double fraction = c.memory_is_exact ? 1.0 : c.kv_cache_fraction;
  if (c.device_memory_bytes > 0 && page_all_layers > 0) {
    const int64_t need_pages = (L + c.page_size - 1) / c.page_size;  // one sequence of max_context
    auto pages_for = [&](int64_t mem) -> int64_t {
      if (mem <= p.workspace_bytes) return 0;
      const double kv = std::floor(static_cast<double>(mem - p.workspace_bytes) * fraction);
      return static_cast<int64_t>(kv) / page_all_layers;
    };
    if (pages_for(c.device_memory_bytes) < need_pages) {
      const double need_mem = static_cast<double>(p.workspace_bytes) +
                              std::ceil(static_cast<double>(need_pages) * static_cast<double>(page_all_layers) /
                                        fraction);
      if (!(need_mem < 9.0e18))
        return limit("device_memory_bytes: one sequence of max_context = " + num(L) + " needs more than 2^63 bytes of KV cache");
      int64_t mem = static_cast<int64_t>(need_mem);
      while (pages_for(mem) < need_pages) ++mem;
      while (mem > p.workspace_bytes + 1 && pages_for(mem - 1) >= need_pages) --mem;
      return limit("device_memory_bytes = " + bytes_str(c.device_memory_bytes) + " leaves room for " +
                   num(pages_for(c.device_memory_bytes)) + " KV pages after the " +
                   bytes_str(p.workspace_bytes) + " workspace, fewer than the " + num(need_pages) +
                   " pages one sequence of max_context = " + num(L) + " needs; the smallest device memory that works is " +
                   bytes_str(mem));
    }
    p.kv_budget_bytes = static_cast<int64_t>(
        std::floor(static_cast<double>(c.device_memory_bytes - p.workspace_bytes) * fraction));
    // Cache slots are i32 (SPEC §3.6 indices): no more pages than i32 can address.
    const int64_t max_pages = std::numeric_limits<int32_t>::max() / c.page_size;
    p.kv_pages = std::min(p.kv_budget_bytes / page_all_layers, max_pages);
    p.kv_tokens = p.kv_pages * c.page_size;
    p.mla_cache_bytes = p.kv_pages * p.mla_page_bytes * p.mla_layers;
    p.indexer_cache_bytes = p.kv_pages * p.indexer_page_bytes * p.indexer_layers;
  }
  *out = std::move(p);
  return Status::Ok();
}

// ---- MHA-form prefill ----

Status plan_mha_prefill(const PlannerConfig& c, int64_t budget_bytes, MhaPrefillReservation* out) {
  if (out == nullptr) return invalid("plan_mha_prefill: expected a reservation to fill, got null");
  const ModelGeometry& g = c.geometry;
  if (g.num_heads <= 0 || g.qk_nope_head_dim <= 0 || g.v_head_dim <= 0)
    return invalid("geometry: expected num_heads, qk_nope_head_dim and v_head_dim > 0 for the MHA form, got " +
                   num(g.num_heads) + ", " + num(g.qk_nope_head_dim) + ", " + num(g.v_head_dim));
  if (g.topk <= 0) return invalid("geometry.topk: expected > 0, got " + num(g.topk));
  if (c.max_tokens_per_step <= 0 || c.max_seqs_per_step <= 0)
    return invalid("max_tokens_per_step, max_seqs_per_step: expected >= 1");
  const int64_t max_context = c.max_context > 0 ? c.max_context : g.max_positions;
  if (max_context <= 0) return invalid("max_context: expected >= 1 (or a geometry with max_positions)");
  if (budget_bytes < 0) return invalid("budget_bytes: expected >= 0, got " + num(budget_bytes));
  auto bytes = [&](int64_t tokens) {
    return mha_prefill_workspace_bytes(c.device, g.num_heads, g.qk_nope_head_dim, g.v_head_dim, tokens);
  };
  MhaPrefillReservation r;
  r.max_seq_context = std::min<int64_t>(g.topk, max_context);
  r.batch_tokens = std::min(c.max_seqs_per_step, c.max_tokens_per_step) * r.max_seq_context;
  r.min_bytes = bytes(r.max_seq_context);
  r.batch_bytes = bytes(r.batch_tokens);
  int64_t lo = r.max_seq_context, hi = r.batch_tokens;  // largest tokens within the budget
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (bytes(mid) <= budget_bytes) lo = mid; else hi = mid - 1;
  }
  r.group_tokens = lo;
  r.bytes = bytes(lo);
  *out = r;
  return Status::Ok();
}

// ---- names ----

const char* select_path_name(SelectPath s) {
  switch (s) {
    case SelectPath::kAuto: return "auto";
    case SelectPath::kUnfused: return "unfused";
    case SelectPath::kFused: return "fused";
  }
  return "?";
}

// ---- byte sizes ----

Status parse_byte_size(const std::string& text, int64_t* bytes) {
  auto bad = [&](const std::string& why) {
    return Status(StatusCode::kInvalidArgument,
                  "size '" + text + "': " + why + " (expected e.g. 4096, 512MiB, 141GiB; units B, KiB, MiB, GiB, TiB)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t num_begin = i;
  int64_t whole = 0;
  bool digits = false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (whole > (std::numeric_limits<int64_t>::max() - 9) / 10) return bad("too large");
    whole = whole * 10 + (text[i] - '0');
    digits = true;
    ++i;
  }
  int64_t frac_num = 0, frac_den = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (frac_den < int64_t{1000000000000}) {
        frac_num = frac_num * 10 + (text[i] - '0');
        frac_den *= 10;
      }
      digits = true;
      ++i;
    }
  }
  if (!digits || i == num_begin) return bad("expected a number");
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return bad("unexpected text after the unit");
  int shift;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "kib") shift = 10;
  else if (unit == "mib") shift = 20;
  else if (unit == "gib") shift = 30;
  else if (unit == "tib") shift = 40;
  else return bad("unknown unit '" + unit + "'");
  const int64_t mult = int64_t{1} << shift;
  if (whole > std::numeric_limits<int64_t>::max() / mult) return bad("too large");
  // frac_num / frac_den * mult must be a whole number of bytes.
  const long double frac = static_cast<long double>(frac_num) * mult / frac_den;
  const int64_t frac_bytes = static_cast<int64_t>(frac);
  if (static_cast<long double>(frac_bytes) != frac) return bad("not a whole number of bytes");
  *bytes = whole * mult + frac_bytes;
  return Status::Ok();
}

std::string format_byte_size(int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (u < 4 && std::fabs(v) >= 1024.0) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0 || v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  std::string s = buf;
  // "1.50 KiB" -> "1.5 KiB"
  const size_t dot = s.find('.');
  if (dot != std::string::npos) {
    size_t sp = s.find(' ');
    size_t e = sp;
    while (e > dot + 1 && s[e - 1] == '0') --e;
    if (e == dot + 1) e = dot;  // "13.00" -> "13"
    s.erase(e, sp - e);
  }
  return s;
}

}  // namespace dsa
