// `dsa plan`: the workspace a step needs under declared limits and a hard scoring budget, and
// the KV cache that fits after reserving it (docs/planner.md).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "commands.h"
#include "dsa/dsa.h"

namespace {

void plan_usage(FILE* f) {
  std::fprintf(f,
               "usage: dsa plan [options]\n"
               "Plans the workspace of one DSA layer step within the given limits, with every temporary\n"
               "of scoring and selection inside the score budget, then sizes the KV caches in the device\n"
               "memory left after that reservation. Impossible limits exit 1 naming the minimum.\n"
               "  --preset NAME          deepseek-v3.2, glm-5 (default), glm-5.2\n"
               "  --device-memory SIZE   memory for workspace + KV caches (e.g. 141GiB); 0: no KV sizing\n"
               "  --score-budget SIZE    scoring budget (default 512MiB)\n"
               "  --max-tokens N         new tokens per step (default 8192)\n"
               "  --max-seqs N           sequences per step (default 256)\n"
               "  --max-context N        kv_len bound (default: the model's max positions)\n"
               "  --max-next-n N         decode tokens per sequence (default 1)\n"
               "  --page-size N          cache page size in tokens (default 64)\n"
               "  --cache bf16|fp8       MLA cache policy (default bf16)\n"
               "  --kv-fraction F        share of the memory after the workspace the KV may take (default 0.9)\n"
               "  --device cpu|cuda      backend whose scratch queries size the plan (default: cuda if present)\n"
               "  --select auto|unfused|fused\n"
               "                         selection path of scoring chunks (default auto: the cost model picks\n"
               "                         per chunk among what the device has; fused needs the CPU today)\n"
               "  --json                 one JSON object instead of a table\n"
               "SIZE accepts B, KiB, MiB, GiB, TiB (e.g. 512MiB, 1.5GiB, 4096).\n");
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

bool parse_int(const char* s, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0) return false;
  *out = v;
  return true;
}

void print_buffers_json(const std::vector<dsa::PlanBuffer>& v) {
  std::printf("[");
  for (size_t i = 0; i < v.size(); ++i)
    std::printf("%s{\"name\": \"%s\", \"bytes\": %lld, \"what\": \"%s\"}", i ? ", " : "", v[i].name.c_str(),
                static_cast<long long>(v[i].bytes), json_escape(v[i].what).c_str());
  std::printf("]");
}

void print_buffers_table(const std::vector<dsa::PlanBuffer>& v) {
  for (const auto& b : v)
    std::printf("  %-20s %14lld  %-10s  %s\n", b.name.c_str(), static_cast<long long>(b.bytes),
                dsa::format_byte_size(b.bytes).c_str(), b.what.c_str());
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  std::string preset = "glm-5";
  bool json = false;
  dsa::PlannerConfig c;
  c.device = dsa::cuda_available() ? dsa::cuda_device(0) : dsa::cpu_device();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char** out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dsa plan: %s: expected a value\n", a.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    const char* v = nullptr;
    auto size_opt = [&](int64_t* dst) {
      if (!value(&v)) return false;
      dsa::Status st = dsa::parse_byte_size(v, dst);
      if (!st.ok()) std::fprintf(stderr, "dsa plan: %s: %s\n", a.c_str(), st.message().c_str());
      return st.ok();
    };
    auto int_opt = [&](int64_t* dst) {
      if (!value(&v)) return false;
      if (parse_int(v, dst)) return true;
      std::fprintf(stderr, "dsa plan: %s: expected a non-negative integer, got '%s'\n", a.c_str(), v);
      return false;
    };
    bool ok = true;
    if (a == "--help" || a == "-h") {
      plan_usage(stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--preset") {
      ok = value(&v);
      if (ok) preset = v;
    } else if (a == "--device-memory") {
      ok = size_opt(&c.device_memory_bytes);
    } else if (a == "--score-budget") {
      ok = size_opt(&c.score_budget_bytes);
    } else if (a == "--max-tokens") {
      ok = int_opt(&c.max_tokens_per_step);
    } else if (a == "--max-seqs") {
      ok = int_opt(&c.max_seqs_per_step);
    } else if (a == "--max-context") {
      ok = int_opt(&c.max_context);
    } else if (a == "--max-next-n") {
      ok = int_opt(&c.max_next_n);
    } else if (a == "--page-size") {
      ok = int_opt(&c.page_size);
    } else if (a == "--cache") {
      ok = value(&v);
      if (ok && !std::strcmp(v, "bf16")) c.cache_dtype = dsa::MlaCacheDtype::kBF16;
      else if (ok && !std::strcmp(v, "fp8")) c.cache_dtype = dsa::MlaCacheDtype::kFP8;
      else if (ok) {
        std::fprintf(stderr, "dsa plan: --cache: expected bf16 or fp8, got '%s'\n", v);
        ok = false;
      }
    } else if (a == "--kv-fraction") {
      ok = value(&v);
      char* end = nullptr;
      if (ok) c.kv_cache_fraction = std::strtod(v, &end);
      if (ok && (end == v || *end != '\0')) {
        std::fprintf(stderr, "dsa plan: --kv-fraction: expected a number in (0, 1], got '%s'\n", v);
        ok = false;
      }
    } else if (a == "--select") {
      ok = value(&v);
      if (ok && !std::strcmp(v, "auto")) c.select = dsa::SelectPath::kAuto;
      else if (ok && !std::strcmp(v, "unfused")) c.select = dsa::SelectPath::kUnfused;
      else if (ok && !std::strcmp(v, "fused")) c.select = dsa::SelectPath::kFused;
      else if (ok) {
        std::fprintf(stderr, "dsa plan: --select: expected auto, unfused or fused, got '%s'\n", v);
        ok = false;
      }
    } else if (a == "--device") {
      ok = value(&v);
      if (ok && !std::strcmp(v, "cpu")) c.device = dsa::cpu_device();
      else if (ok && !std::strcmp(v, "cuda")) {
        // The CUDA plan's scratch comes from the CUDA kernels' size queries: without a device
        // (or the backend) there is nothing to ask, and a CPU plan under a CUDA label would lie.
        if (!dsa::cuda_available()) {
          std::fprintf(stderr, "dsa plan: --device cuda: no CUDA device is visible (or this build has no CUDA "
                               "backend); use --device cpu\n");
          return 2;
        }
        c.device = dsa::cuda_device(0);
      }
      else if (ok) {
        std::fprintf(stderr, "dsa plan: --device: expected cpu or cuda, got '%s'\n", v);
        ok = false;
      }
    } else {
      std::fprintf(stderr, "dsa plan: unknown option '%s'\n", a.c_str());
      plan_usage(stderr);
      return 2;
    }
    if (!ok) return 2;
  }
  dsa::Status st = dsa::geometry_preset(preset, &c.geometry);
  if (!st.ok()) {
    std::fprintf(stderr, "dsa plan: %s\n", st.message().c_str());
    return 2;
  }
  dsa::Plan p;
  st = dsa::make_plan(c, &p);
  if (!st.ok()) {
    std::fprintf(stderr, "dsa plan: %s\n", st.to_string().c_str());
    // docs/cli.md: 1 when valid limits cannot be served, 2 for an invalid value.
    return st.code() == dsa::StatusCode::kLimitExceeded ? 1 : 2;
  }
  const dsa::PlannerConfig& pc = p.config;
  const int64_t L = pc.max_context;
  const int64_t rows_at_max = p.rows_per_chunk(L);
  if (json) {
    std::printf("{\"preset\": \"%s\", \"device\": \"%s\", \"cache\": \"%s\", \"page_size\": %lld, "
                "\"max_tokens_per_step\": %lld, \"max_seqs_per_step\": %lld, \"max_context\": %lld, \"max_next_n\": %lld, "
                "\"max_rows\": %lld, \"device_memory_bytes\": %lld, \"kv_cache_fraction\": %g, ",
                preset.c_str(), dsa::device_type_name(pc.device.type), dsa::mla_cache_dtype_name(pc.cache_dtype),
                (long long)pc.page_size, (long long)pc.max_tokens_per_step, (long long)pc.max_seqs_per_step,
                (long long)L, (long long)pc.max_next_n, (long long)p.max_rows, (long long)pc.device_memory_bytes,
                pc.kv_cache_fraction);
    std::printf("\"workspace_bytes\": %lld, \"host_bytes\": %lld, \"score_budget_bytes\": %lld, "
                "\"score_region_bytes\": %lld, \"min_score_budget_bytes\": %lld, \"attention_scratch_bytes\": %lld, "
                "\"rows_per_chunk_at_max_context\": %lld, \"tile_width\": %lld, \"max_tiles\": %lld, \"buffers\": ",
                (long long)p.workspace_bytes, (long long)p.host_bytes, (long long)p.score_budget_bytes,
                (long long)p.score_region_bytes, (long long)p.min_score_budget_bytes,
                (long long)p.attention_scratch_bytes, (long long)rows_at_max, (long long)p.tile_width,
                (long long)p.max_tiles);
    print_buffers_json(p.buffers);
    std::printf(", \"score_buffers\": ");
    print_buffers_json(p.score_buffers);
    const bool fused_any = p.fused_select && p.fused_min_width < L;
    std::printf(", \"select\": \"%s\", \"fused_select\": %s, \"fused_min_width\": %lld, \"unfused_max_width\": %lld, "
                "\"unfused_region_bytes\": %lld, \"fused_region_bytes\": %lld, \"unfused_bytes_all_rows\": %lld, "
                "\"fused_bytes_all_rows\": %lld, \"fused_rows_per_chunk_at_max_context\": %lld, \"fused_buffers\": ",
                dsa::select_path_name(pc.select), fused_any ? "true" : "false",
                (long long)(fused_any ? p.fused_min_width : -1), (long long)p.unfused_max_width,
                (long long)p.unfused_region_bytes, (long long)p.fused_region_bytes, (long long)p.unfused_bytes_all_rows,
                (long long)p.fused_bytes_all_rows, (long long)p.fused_max_context_rows_per_chunk);
    print_buffers_json(p.fused_buffers);
    std::printf(", \"kv_budget_bytes\": %lld, \"kv_pages\": %lld, \"kv_tokens\": %lld, \"mla_layers\": %lld, "
                "\"indexer_layers\": %lld, \"kv_pages_per_layer\": {\"mla\": %lld, \"indexer\": %lld}, "
                "\"mla_page_bytes\": %lld, \"indexer_page_bytes\": %lld, \"mla_cache_bytes\": %lld, "
                "\"indexer_cache_bytes\": %lld}\n",
                (long long)p.kv_budget_bytes, (long long)p.kv_pages, (long long)p.kv_tokens, (long long)p.mla_layers,
                (long long)p.indexer_layers, (long long)p.kv_pages, (long long)p.kv_pages, (long long)p.mla_page_bytes,
                (long long)p.indexer_page_bytes, (long long)p.mla_cache_bytes, (long long)p.indexer_cache_bytes);
    return 0;
  }
  std::printf("dsa plan: %s, %s MLA cache, page %lld, device %s\n", preset.c_str(),
              dsa::mla_cache_dtype_name(pc.cache_dtype), (long long)pc.page_size, dsa::device_type_name(pc.device.type));
  std::printf("limits:    %lld tokens/step (%lld rows), %lld seqs/step, context %lld, next_n %lld\n",
              (long long)pc.max_tokens_per_step, (long long)p.max_rows, (long long)pc.max_seqs_per_step, (long long)L,
              (long long)pc.max_next_n);
  std::printf("workspace: %lld bytes (%s); score region %s of a %s budget (minimum %s)\n", (long long)p.workspace_bytes,
              dsa::format_byte_size(p.workspace_bytes).c_str(), dsa::format_byte_size(p.score_region_bytes).c_str(),
              dsa::format_byte_size(p.score_budget_bytes).c_str(),
              dsa::format_byte_size(p.min_score_budget_bytes).c_str());
  print_buffers_table(p.buffers);
  const bool fused_any = p.fused_select && p.fused_min_width < L;
  const int64_t Lu = p.unfused_max_width;
  if (fused_any && p.fused_min_width == 0)
    std::printf("selection: %s: every scored row fused (score and select in one pass)\n", dsa::select_path_name(pc.select));
  else if (fused_any)
    std::printf("selection: %s: rows of more than %lld keys fused (the cost model's crossover), shorter unfused\n",
                dsa::select_path_name(pc.select), (long long)p.fused_min_width);
  else
    std::printf("selection: %s: unfused (scores written, then top-k)%s\n", dsa::select_path_name(pc.select),
                pc.select == dsa::SelectPath::kUnfused ? "" : p.fused_select ? "; no row is wider than the crossover"
                                                                              : "; this device has no fused kernel");
  if (p.tile_width == 0)
    std::printf("unfused:   rows of %lld keys in chunks of %lld rows (%s); no key-axis tiling\n", (long long)Lu,
                (long long)p.rows_per_chunk(Lu), dsa::format_byte_size(p.unfused_region_bytes).c_str());
  else
    std::printf("unfused:   one row of %lld keys exceeds the budget: tiles of %lld keys (%lld tiles), merged exactly\n",
                (long long)Lu, (long long)p.tile_width, (long long)p.max_tiles);
  print_buffers_table(p.score_buffers);
  if (fused_any) {
    std::printf("fused:     rows of %lld keys in chunks of %lld rows (%s)\n", (long long)L,
                (long long)p.fused_max_context_rows_per_chunk, dsa::format_byte_size(p.fused_region_bytes).c_str());
    print_buffers_table(p.fused_buffers);
  }
  std::printf("selection memory of all %lld rows at %lld keys in one chunk: unfused %s", (long long)p.max_rows,
              (long long)L, dsa::format_byte_size(p.unfused_bytes_all_rows).c_str());
  if (p.fused_select)
    std::printf(", fused %s\n", dsa::format_byte_size(p.fused_bytes_all_rows).c_str());
  else
    std::printf("\n");
  if (pc.device_memory_bytes == 0) {
    std::printf("kv cache:  not sized (give --device-memory)\n");
    return 0;
  }
  std::printf("kv cache:  %s of %s after the workspace (fraction %g)\n", dsa::format_byte_size(p.kv_budget_bytes).c_str(),
              dsa::format_byte_size(pc.device_memory_bytes).c_str(), pc.kv_cache_fraction);
  std::printf("  kv_pages %lld per layer, kv_tokens %lld\n", (long long)p.kv_pages, (long long)p.kv_tokens);
  std::printf("  MLA      %lld layers x %lld pages x %lld B = %s\n", (long long)p.mla_layers, (long long)p.kv_pages,
              (long long)p.mla_page_bytes, dsa::format_byte_size(p.mla_cache_bytes).c_str());
  std::printf("  indexer  %lld layers x %lld pages x %lld B = %s (shared layers own none)\n", (long long)p.indexer_layers,
              (long long)p.kv_pages, (long long)p.indexer_page_bytes, dsa::format_byte_size(p.indexer_cache_bytes).c_str());
  return 0;
}
