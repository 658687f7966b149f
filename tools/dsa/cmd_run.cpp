// `dsa run`: the main job. One full DSA layer step (dsa::Attention, planned by dsa::make_plan)
// on a mixed batch in a model's geometry, on seeded random activations; the caches, the
// selection and the attention outputs checked on sampled rows against a float64 reference.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "dsa/dsa.h"
#include "run_batch.h"
#include "run_check.h"

namespace {

using Clock = std::chrono::steady_clock;

struct RunOptions {
  std::string preset = "glm-5";
  int context = 0;      // kv_len of the long chunked prefill; 0: 16384 on the CPU, 65536 on CUDA
  int chunk = 256;      // its new rows
  int short_len = 512;  // the short prefill (kv_len <= topk: dense)
  int decode_seqs = 2;
  int next_n = 2;
  std::string mla_cache = "bf16";
  int64_t score_budget = dsa::kDefaultScoreBudgetBytes;
  bool hadamard = false;
  std::string backend = "auto";
  uint64_t seed = 1;
  int samples = 4;
  int threads = 0;
  int repeat = 1;
  bool json = false;
  bool quiet = false;
};

constexpr int kCpuDefaultContext = 16384;
constexpr int kCudaDefaultContext = 65536;

void run_usage(FILE* f) {
  std::fprintf(f,
      "usage: dsa run [options]\n"
      "One full DSA layer step (SPEC section 6) through the layer step (dsa::Attention) on seeded\n"
      "random activations for a mixed batch: a short prefill (kv_len <= topk, routed dense), a\n"
      "chunked prefill over a cached prefix (kv_len = --context) and decode sequences with next_n\n"
      "tokens (both scored, sparse). The step is planned first (page 64, limits from the batch,\n"
      "the score budget) and its workspace allocated once. Checked against a float64 reference:\n"
      "both caches, the selected indices and the attention outputs of sampled rows. Prints the\n"
      "plan, the step report (routes, scoring chunks and tiles, workspace high-water beside the\n"
      "budget, per-stage times) and PASS or FAIL (exit code 0 or 1; 2 for bad options or setup\n"
      "errors, including a score budget too small for the batch).\n\n"
      "options:\n"
      "  --preset NAME        deepseek-v3.2 | glm-5 | glm-5.2          (default glm-5)\n"
      "  --context N          kv_len of the chunked prefill (default 16384 on the CPU,\n"
      "                       65536 when the backend is CUDA)\n"
      "  --chunk N            new rows of the chunked prefill           (default 256)\n"
      "  --short N            length of the short prefill               (default 512)\n"
      "  --decode N           decode sequences                          (default 2)\n"
      "  --next-n N           tokens per decode sequence                (default 2)\n"
      "  --mla-cache DTYPE    bf16 | fp8                                (default bf16)\n"
      "  --hadamard           Hadamard-128 on indexer q and k before FP8\n"
      "  --score-budget SIZE  scoring budget, B/KiB/MiB/GiB             (default 512MiB)\n"
      "  --backend NAME       cpu | cuda | auto (auto: cuda when built and a device is visible)\n"
      "  --seed N             seed of the random activations (non-negative; default 1)\n"
      "  --samples N          rows checked per sampled check            (default 4)\n"
      "  --threads N          CPU threads (default: all)\n"
      "  --repeat N           run the step N times, report the fastest (default 1; the step is\n"
      "                       idempotent: same tokens into the same slots)\n"
      "  --json               one JSON object on stdout (progress stays on stderr)\n"
      "  --quiet              no progress lines\n"
      "  --help               this text\n"
      "On CUDA the step runs with StepParams::time_stages: the report gives host enqueue ms and GPU\n"
      "ms per stage (CUDA events between stages; \"gpu stage times: not measured\" when the step\n"
      "does not record them).\n");
}

bool parse_int(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end || end == s || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns 0 to go on, or an exit code (help printed / bad option).
int parse(int argc, char** argv, RunOptions* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char** v) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dsa run: %s needs a value\n", a.c_str());
        return false;
      }
      *v = argv[++i];
      return true;
    };
    const char* v = nullptr;
    long n = 0;
    auto int_opt = [&](long lo, long hi, int* dst) {
      if (!value(&v) || !parse_int(v, lo, hi, &n)) {
        std::fprintf(stderr, "dsa run: %s expects an integer in [%ld, %ld]\n", a.c_str(), lo, hi);
        return false;
      }
      *dst = static_cast<int>(n);
      return true;
    };
    if (a == "--help" || a == "-h") {
      run_usage(stdout);
      return -1;
    } else if (a == "--preset") {
      if (!value(&v)) return 2;
      o->preset = v;
    } else if (a == "--context") {
      if (!int_opt(1, 1 << 22, &o->context)) return 2;
    } else if (a == "--chunk") {
      if (!int_opt(1, 1 << 20, &o->chunk)) return 2;
    } else if (a == "--short") {
      if (!int_opt(1, 1 << 20, &o->short_len)) return 2;
    } else if (a == "--decode") {
      if (!int_opt(0, 4096, &o->decode_seqs)) return 2;
    } else if (a == "--next-n") {
      if (!int_opt(1, 16, &o->next_n)) return 2;
    } else if (a == "--mla-cache") {
      if (!value(&v) || (std::strcmp(v, "bf16") && std::strcmp(v, "fp8"))) {
        std::fprintf(stderr, "dsa run: --mla-cache expects bf16 or fp8\n");
        return 2;
      }
      o->mla_cache = v;
    } else if (a == "--score-budget") {
      if (!value(&v)) return 2;
      dsa::Status st = dsa::parse_byte_size(v, &o->score_budget);
      if (!st.ok() || o->score_budget <= 0) {
        std::fprintf(stderr, "dsa run: --score-budget: %s\n",
                     st.ok() ? "expected a positive size such as 512MiB or 256KiB" : st.message().c_str());
        return 2;
      }
    } else if (a == "--hadamard") {
      o->hadamard = true;
    } else if (a == "--backend") {
      if (!value(&v) || (std::strcmp(v, "cpu") && std::strcmp(v, "cuda") && std::strcmp(v, "auto"))) {
        std::fprintf(stderr, "dsa run: --backend expects cpu, cuda or auto\n");
        return 2;
      }
      o->backend = v;
    } else if (a == "--seed") {
      if (!value(&v)) return 2;
      char* end = nullptr;
      errno = 0;
      // strtoull accepts "-1" (as 2^64 - 1): a sign is refused before it gets the chance.
      const bool digits = v[0] >= '0' && v[0] <= '9';
      o->seed = digits ? std::strtoull(v, &end, 10) : 0;
      if (!digits || !end || *end || errno == ERANGE) {
        std::fprintf(stderr, "dsa run: --seed expects a non-negative integer\n");
        return 2;
      }
    } else if (a == "--samples") {
      if (!int_opt(1, 1024, &o->samples)) return 2;
    } else if (a == "--threads") {
      if (!int_opt(1, 1024, &o->threads)) return 2;
    } else if (a == "--repeat") {
      if (!int_opt(1, 1000, &o->repeat)) return 2;
    } else if (a == "--json") {
      o->json = true;
    } else if (a == "--quiet") {
      o->quiet = true;
    } else {
      std::fprintf(stderr, "dsa run: unknown option '%s'\n", a.c_str());
      run_usage(stderr);
      return 2;
    }
  }
  return 0;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o + "\"";
}

std::string size_str(int64_t bytes) { return dsa::format_byte_size(bytes); }

std::string ms_str(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", ms);
  return buf;
}

// The step's stages as the report times them (host time; on CUDA the time to enqueue).
struct StageTime {
  const char* name;
  double ms;
};
std::vector<StageTime> stage_times(const dsa::StepReport& r) {
  return {{"cache", r.ms_cache},   {"prepare", r.ms_prepare}, {"score", r.ms_score}, {"select", r.ms_select},
          {"map", r.ms_map},       {"sparse", r.ms_sparse},   {"dense", r.ms_dense}, {"total", r.ms_total}};
}
// GPU time per stage (StepParams::time_stages; meaningful when r.gpu_timed).
std::vector<StageTime> gpu_stage_times(const dsa::StepReport& r) {
  return {{"cache", r.gpu_ms_cache}, {"prepare", r.gpu_ms_prepare}, {"score", r.gpu_ms_score},
          {"select", r.gpu_ms_select}, {"map", r.gpu_ms_map}, {"sparse", r.gpu_ms_sparse},
          {"dense", r.gpu_ms_dense}, {"total", r.gpu_ms_total}};
}

int setup_error(bool json, const std::string& backend, const std::string& preset, const std::string& msg) {
  if (json)
    std::printf("{\"passed\": false, \"backend\": %s, \"preset\": %s, \"error\": %s}\n", json_str(backend).c_str(),
                json_str(preset).c_str(), json_str(msg).c_str());
  std::fprintf(stderr, "dsa run: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  RunOptions o;
  int rc = parse(argc, argv, &o);
  if (rc == -1) return 0;
  if (rc) return rc;
  if (o.threads > 0) dsa::set_num_threads(o.threads);
  const bool progress = !o.quiet;

  dsa::ModelGeometry geo;
  dsa::Status st = dsa::geometry_preset(o.preset, &geo);
  if (!st.ok()) return setup_error(o.json, o.backend, o.preset, st.message());

  // Backend.
  bool cuda_built = false;
  for (auto& b : dsa::compiled_backends()) cuda_built |= b == "cuda";
  dsa::Device device = dsa::cpu_device();
  std::string device_name;
  if (o.backend == "cuda" || o.backend == "auto") {
    if (cuda_built && dsa::cuda_available()) {
      device = dsa::cuda_device(0);
    } else if (o.backend == "cuda") {
      return setup_error(o.json, o.backend, o.preset,
                         cuda_built ? "--backend cuda: no CUDA device is visible"
                                    : "--backend cuda: this build has no CUDA backend (configure with -DDSA_CUDA=ON)");
    }
  }
  for (auto& d : dsa::list_devices())
    if (d.device == device) device_name = d.name;
  const std::string backend = device.type == dsa::DeviceType::kCUDA ? "cuda" : "cpu";

  if (o.context == 0) o.context = device.type == dsa::DeviceType::kCUDA ? kCudaDefaultContext : kCpuDefaultContext;

  dsa_cli::BatchSpec spec = dsa_cli::default_batch(geo, o.context, o.chunk, o.short_len, o.decode_seqs, o.next_n);
  spec.mla_dtype = o.mla_cache == "fp8" ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
  spec.hadamard = o.hadamard;
  spec.seed = o.seed;
  spec.device = device;
  std::string err = spec.finalize();
  if (!err.empty()) return setup_error(o.json, backend, o.preset, err);

  dsa::Plan plan;
  st = dsa::make_plan(dsa_cli::plan_config(spec, o.score_budget), &plan);
  if (!st.ok()) return setup_error(o.json, backend, o.preset, st.message());

  const char* rope = geo.index_rope == dsa::RopeStyle::kInterleaved ? "interleaved" : "half-split";
  if (!o.json) {
    std::printf("dsa run: %s (H=%d, H_idx=%d, topk=%d, %s indexer RoPE%s), MLA cache %s, seed %llu\n",
                geo.name.c_str(), geo.num_heads, geo.index_heads, geo.topk, rope, o.hadamard ? ", Hadamard" : "",
                o.mla_cache.c_str(), (unsigned long long)o.seed);
    std::printf("backend: %s (%s%s)\n", backend.c_str(), device_name.c_str(),
                backend == "cpu" ? (", " + std::to_string(dsa::num_threads()) + " threads").c_str() : "");
    std::printf("batch: %zu sequences, %d new tokens, %lld cached tokens, page %d\n", spec.seqs.size(),
                spec.num_tokens, (long long)spec.prefix_tokens(), spec.page_size);
    for (size_t i = 0; i < spec.seqs.size(); ++i) {
      const auto& q = spec.seqs[i];
      std::printf("  seq %zu  %-15s q_len %6d  kv_len %7d  -> %s\n", i, dsa_cli::seq_kind_name(q.kind), q.q_len, q.kv_len,
                  q.sparse ? "sparse (scored)" : "dense (kv_len <= topk)");
    }
    std::printf("plan: workspace %s, score budget %s (region %s, minimum %s), %s\n",
                size_str(plan.workspace_bytes).c_str(), size_str(plan.score_budget_bytes).c_str(),
                size_str(plan.score_region_bytes).c_str(), size_str(plan.min_score_budget_bytes).c_str(),
                plan.takes_fused(spec.max_kv_len)
                    ? (std::to_string(plan.fused_rows_per_chunk(spec.max_kv_len)) + " rows of " +
                       std::to_string(spec.max_kv_len) + " keys per fused scoring chunk (rows of more than " +
                       std::to_string(plan.fused_min_width) + " keys are fused)").c_str()
                : plan.tile_width > 0
                    ? ("rows of " + std::to_string(spec.max_kv_len) + " keys tiled by " + std::to_string(plan.tile_width)).c_str()
                    : (std::to_string(plan.rows_per_chunk(spec.max_kv_len)) + " rows of " + std::to_string(spec.max_kv_len) +
                       " keys per scoring chunk").c_str());
    std::fflush(stdout);
  }

  auto t_setup = Clock::now();
  dsa_cli::RunBuffers bufs;
  err = dsa_cli::setup_run(spec, plan, &bufs, progress);
  if (!err.empty()) return setup_error(o.json, backend, o.preset, "setup: " + err);
  dsa::Attention attn(plan);
  double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();

  // The step, repeated: the fastest run is reported (the first on a GPU pays for module loading).
  dsa::StepReport report;
  double wall_ms = 0;
  std::string step_error;
  for (int rep = 0; rep < o.repeat && step_error.empty(); ++rep) {
    if (progress)
      std::fprintf(stderr, "[dsa run] layer step%s\n",
                   o.repeat > 1 ? (" " + std::to_string(rep + 1) + "/" + std::to_string(o.repeat)).c_str() : "");
    dsa::StepReport r;
    double ms = 0;
    step_error = dsa_cli::run_step(spec, bufs, attn, &r, &ms, device.type == dsa::DeviceType::kCUDA);
    if (rep == 0 || ms < wall_ms) {
      report = r;
      wall_ms = ms;
    }
  }

  // The checks.
  auto t_check = Clock::now();
  std::vector<dsa_cli::CheckResult> checks;
  if (step_error.empty()) {
    if (progress) std::fprintf(stderr, "[dsa run] checking against the float64 reference (%d sampled rows)\n", o.samples);
    err = dsa_cli::prepare_reference_queries(spec, bufs);
    if (err.empty()) err = dsa_cli::download_all(bufs);
    if (!err.empty()) return setup_error(o.json, backend, o.preset, err);
    checks = dsa_cli::check_step(spec, bufs, plan, report, o.samples);
  }
  double check_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_check).count();

  bool passed = step_error.empty();
  for (auto& c : checks) passed &= c.passed;
  const auto times = stage_times(report);
  const auto gpu_times = gpu_stage_times(report);
  const int kRoutes = 3;
  const dsa::Route routes[kRoutes] = {dsa::Route::kDense, dsa::Route::kSparseScored, dsa::Route::kSparseShared};

  if (o.json) {
    std::string j = "{";
    j += "\"passed\": " + std::string(passed ? "true" : "false");
    j += ", \"backend\": " + json_str(backend) + ", \"device\": " + json_str(device_name);
    j += ", \"preset\": " + json_str(geo.name) + ", \"seed\": " + std::to_string(o.seed);
    j += ", \"context\": " + std::to_string(o.context) + ", \"mla_cache\": " + json_str(o.mla_cache);
    j += ", \"hadamard\": " + std::string(o.hadamard ? "true" : "false");
    j += ", \"threads\": " + std::to_string(dsa::num_threads()) + ", \"repeat\": " + std::to_string(o.repeat);
    j += ", \"error\": " + json_str(step_error);
    j += ", \"batch\": [";
    for (size_t i = 0; i < spec.seqs.size(); ++i) {
      const auto& q = spec.seqs[i];
      j += std::string(i ? ", " : "") + "{\"kind\": " + json_str(dsa_cli::seq_kind_name(q.kind)) +
           ", \"q_len\": " + std::to_string(q.q_len) + ", \"kv_len\": " + std::to_string(q.kv_len) +
           ", \"route\": " + json_str(q.sparse ? "sparse" : "dense") + "}";
    }
    j += "], \"routes\": {";
    for (int i = 0; i < kRoutes; ++i) {
      const int r = static_cast<int>(routes[i]);
      j += std::string(i ? ", " : "") + json_str(dsa::route_name(routes[i])) + ": {\"seqs\": " +
           std::to_string(report.seqs[r]) + ", \"rows\": " + std::to_string(report.rows[r]) + "}";
    }
    j += "}, \"score_chunks\": " + std::to_string(report.score_chunks) +
         ", \"fused_chunks\": " + std::to_string(report.fused_chunks) + ", \"fused_rows\": " + std::to_string(report.fused_rows) +
         ", \"tiled_rows\": " + std::to_string(report.tiled_rows) + ", \"score_tiles\": " + std::to_string(report.score_tiles);
    j += ", \"workspace_high_water_bytes\": " + std::to_string(report.workspace_high_water_bytes) +
         ", \"score_high_water_bytes\": " + std::to_string(report.score_high_water_bytes) +
         ", \"workspace_bytes\": " + std::to_string(plan.workspace_bytes) +
         ", \"score_budget_bytes\": " + std::to_string(plan.score_budget_bytes) +
         ", \"score_region_bytes\": " + std::to_string(plan.score_region_bytes) +
         ", \"min_score_budget_bytes\": " + std::to_string(plan.min_score_budget_bytes) +
         ", \"tile_width\": " + std::to_string(plan.tile_width);
    j += ", \"times_ms\": {\"setup\": " + ms_str(setup_ms) + ", \"step_wall\": " + ms_str(wall_ms) +
         ", \"check\": " + ms_str(check_ms);
    for (const auto& t : times) j += ", \"" + std::string(t.name) + "\": " + ms_str(t.ms);
    j += "}, \"gpu_timed\": " + std::string(report.gpu_timed ? "true" : "false") + ", \"gpu_times_ms\": ";
    if (report.gpu_timed) {
      j += "{";
      for (size_t i = 0; i < gpu_times.size(); ++i)
        j += std::string(i ? ", " : "") + "\"" + gpu_times[i].name + "\": " + ms_str(gpu_times[i].ms);
      j += "}";
    } else {
      j += "null";
    }
    j += ", \"checks\": [";
    for (size_t i = 0; i < checks.size(); ++i) {
      const auto& c = checks[i];
      char worst[32];
      std::snprintf(worst, sizeof worst, "%.4g", c.worst);
      j += std::string(i ? ", " : "") + "{\"name\": " + json_str(c.stage) + ", \"rows\": " + std::to_string(c.rows) +
           ", \"passed\": " + (c.passed ? "true" : "false") + ", \"worst_error_over_tolerance\": " + worst +
           ", \"detail\": " + json_str(c.detail) + "}";
    }
    j += "], \"buffer_bytes\": " + std::to_string(bufs.total_bytes) + "}";
    std::printf("%s\n", j.c_str());
    return passed ? 0 : 1;
  }

  if (!step_error.empty()) std::printf("\nstep failed: %s\n", step_error.c_str());
  std::printf("\nroutes:");
  for (int i = 0; i < kRoutes; ++i) {
    const int r = static_cast<int>(routes[i]);
    std::printf("%s %s %lld seqs / %lld rows", i ? "," : "", dsa::route_name(routes[i]), (long long)report.seqs[r],
                (long long)report.rows[r]);
  }
  std::printf("\nscoring: %lld chunks (%lld fused: %lld rows scored and selected in one pass), %lld rows tiled in %lld tiles\n",
              (long long)report.score_chunks, (long long)report.fused_chunks, (long long)report.fused_rows,
              (long long)report.tiled_rows, (long long)report.score_tiles);
  std::printf("workspace: high-water %s of the plan's %s; score high-water %s, region %s, budget %s\n",
              size_str(report.workspace_high_water_bytes).c_str(), size_str(plan.workspace_bytes).c_str(),
              size_str(report.score_high_water_bytes).c_str(), size_str(plan.score_region_bytes).c_str(),
              size_str(plan.score_budget_bytes).c_str());
  std::printf("times (ms%s):", backend == "cuda" ? ", host time to enqueue" : "");
  for (const auto& t : times) std::printf(" %s %.2f", t.name, t.ms);
  std::printf("; step wall %.2f (synchronised)\n", wall_ms);
  if (report.gpu_timed) {
    std::printf("gpu times (ms, CUDA events between stages):");
    for (const auto& t : gpu_times) std::printf(" %s %.3f", t.name, t.ms);
    std::printf("\n");
  } else if (backend == "cuda") {
    std::printf("gpu stage times: not measured\n");
  }

  if (!checks.empty()) std::printf("\n%-22s %6s  %-6s %s\n", "check", "rows", "result", "max err/tol");
  for (const auto& c : checks) {
    std::printf("%-22s %6d  %-6s ", c.stage.c_str(), c.rows, c.passed ? "ok" : "FAIL");
    if (c.worst == 0) std::printf("%s\n", c.passed ? "exact" : "-");
    else std::printf("%.3g\n", c.worst);
    if (!c.detail.empty()) std::printf("    mismatch: %s\n", c.detail.c_str());
  }
  std::printf("\nmemory: %s in all buffers (caches, activations, outputs, workspace); setup %.0f ms, checks %.0f ms\n",
              size_str(static_cast<int64_t>(bufs.total_bytes)).c_str(), setup_ms, check_ms);
  std::printf("%s\n", passed ? "PASS" : "FAIL");
  return passed ? 0 : 1;
}
