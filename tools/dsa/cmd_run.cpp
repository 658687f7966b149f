// `dsa run`: the main job. One DSA layer step on a mixed batch in a model's geometry, on
// seeded random activations, every stage checked on sampled rows against a float64 reference.
#include <algorithm>
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
  int context = 16384;  // kv_len of the long chunked prefill
  int chunk = 256;      // its new rows
  int short_len = 512;  // the short prefill (kv_len <= topk: dense)
  int decode_seqs = 2;
  int next_n = 2;
  std::string mla_cache = "bf16";
  bool hadamard = false;
  std::string backend = "auto";
  uint64_t seed = 1;
  int samples = 4;
  int threads = 0;
  int repeat = 1;
  bool json = false;
  bool quiet = false;
};

void run_usage(FILE* f) {
  std::fprintf(f,
      "usage: dsa run [options]\n"
      "One DSA layer step (SPEC section 6) on seeded random activations for a mixed batch: a short\n"
      "prefill (kv_len <= topk, routed to dense MLA), a chunked prefill over a cached prefix\n"
      "(kv_len = --context) and decode sequences with next_n draft tokens (both sparse). Stages:\n"
      "prepare indexer k/q (RoPE theta 10000), write the paged indexer and MLA caches (page 64),\n"
      "indexer logits (paged), top-k, index mapping, sparse MLA, dense MLA. Sampled rows of every\n"
      "stage are checked against a float64 reference; prints per-stage times, the workspace and\n"
      "PASS or FAIL (exit code 0 or 1; 2 for bad options or setup errors).\n\n"
      "options:\n"
      "  --preset NAME      deepseek-v3.2 | glm-5 | glm-5.2            (default glm-5)\n"
      "  --context N        kv_len of the chunked prefill               (default 16384)\n"
      "  --chunk N          new rows of the chunked prefill             (default 256)\n"
      "  --short N          length of the short prefill                 (default 512)\n"
      "  --decode N         decode sequences                            (default 2)\n"
      "  --next-n N         tokens per decode sequence                  (default 2)\n"
      "  --mla-cache DTYPE  bf16 | fp8                                  (default bf16)\n"
      "  --hadamard         Hadamard-128 on indexer q and k before FP8\n"
      "  --backend NAME     cpu | cuda | auto (auto: cuda when built and a device is visible)\n"
      "  --seed N           seed of the random activations              (default 1)\n"
      "  --samples N        rows checked per stage                      (default 4)\n"
      "  --threads N        CPU threads (default: all)\n"
      "  --repeat N         run the step N times, report each stage's fastest run (default 1;\n"
      "                     the step is idempotent: same tokens into the same slots)\n"
      "  --json             one JSON object on stdout (progress stays on stderr)\n"
      "  --quiet            no progress lines\n"
      "  --help             this text\n");
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
      o->seed = std::strtoull(v, &end, 10);
      if (!end || *end) {
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

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
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

  dsa_cli::BatchSpec spec = dsa_cli::default_batch(geo, o.context, o.chunk, o.short_len, o.decode_seqs, o.next_n);
  spec.mla_dtype = o.mla_cache == "fp8" ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
  spec.hadamard = o.hadamard;
  spec.seed = o.seed;
  spec.device = device;
  std::string err = spec.finalize();
  if (!err.empty()) return setup_error(o.json, backend, o.preset, err);

  const char* rope = geo.index_rope == dsa::RopeStyle::kInterleaved ? "interleaved" : "half-split";
  if (!o.json) {
    std::printf("dsa run: %s (H=%d, H_idx=%d, topk=%d, %s indexer RoPE%s), MLA cache %s, seed %llu\n",
                geo.name.c_str(), geo.num_heads, geo.index_heads, geo.topk, rope, o.hadamard ? ", Hadamard" : "",
                o.mla_cache.c_str(), (unsigned long long)o.seed);
    std::printf("backend: %s (%s%s)\n", backend.c_str(), device_name.c_str(),
                backend == "cpu" ? (", " + std::to_string(dsa::num_threads()) + " threads").c_str() : "");
    std::printf("batch: %zu sequences, %d new tokens (%d dense rows, %d sparse rows), %lld cached tokens, page %d\n",
                spec.seqs.size(), spec.num_tokens, spec.num_dense_rows, spec.num_sparse_rows,
                (long long)spec.prefix_tokens(), spec.page_size);
    for (size_t i = 0; i < spec.seqs.size(); ++i) {
      const auto& q = spec.seqs[i];
      std::printf("  seq %zu  %-15s q_len %6d  kv_len %7d  -> %s\n", i, dsa_cli::seq_kind_name(q.kind), q.q_len,
                  q.kv_len, q.sparse ? "sparse (score, top-k, map, sparse MLA)" : "dense MLA (kv_len <= topk)");
    }
    std::fflush(stdout);
  }

  auto t_setup = Clock::now();
  dsa_cli::RunBuffers bufs;
  err = dsa_cli::setup_run(spec, &bufs, progress);
  if (!err.empty()) return setup_error(o.json, backend, o.preset, "setup: " + err);
  double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();

  // The step (repeated: each stage keeps its fastest run; the first run on a GPU pays for
  // module loading).
  std::vector<dsa_cli::StageResult> results;
  bool call_failed = false;
  const auto& stages = dsa_cli::step_stages();
  for (int rep = 0; rep < o.repeat && !call_failed; ++rep) {
    for (size_t i = 0; i < stages.size(); ++i) {
      if (call_failed) {
        if (rep == 0) {
          dsa_cli::StageResult r;
          r.name = stages[i].name;
          r.what = "not run (an earlier stage failed)";
          results.push_back(r);
        }
        continue;
      }
      if (progress)
        std::fprintf(stderr, "[dsa run] %sstage %zu/%zu: %s\n",
                     o.repeat > 1 ? ("run " + std::to_string(rep + 1) + "/" + std::to_string(o.repeat) + ", ").c_str() : "",
                     i + 1, stages.size(), stages[i].name);
      dsa_cli::StageResult r = stages[i].fn(spec, bufs);
      if (!r.error.empty()) call_failed = true;
      if (rep == 0) results.push_back(r);
      else if (!r.error.empty() || r.ms < results[i].ms) results[i] = r;
    }
  }
  double step_ms = 0;
  for (auto& r : results) step_ms += r.ms;

  // The checks.
  auto t_check = Clock::now();
  std::vector<dsa_cli::CheckResult> checks(results.size());
  if (!call_failed) {
    if (progress) std::fprintf(stderr, "[dsa run] checking %d sampled rows per stage against the float64 reference\n", o.samples);
    err = dsa_cli::download_all(bufs);
    if (!err.empty()) return setup_error(o.json, backend, o.preset, err);
    for (size_t i = 0; i < results.size(); ++i)
      if (results[i].ran) checks[i] = dsa_cli::check_stage(results[i].name, spec, bufs, o.samples);
  }
  double check_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_check).count();

  bool passed = !call_failed;
  for (size_t i = 0; i < results.size(); ++i) passed &= !results[i].ran || checks[i].passed;
  const size_t ws = bufs.workspace ? bufs.workspace->bytes() : 0;
  const size_t logits_bytes = bufs.logits->bytes();

  if (o.json) {
    std::string j = "{";
    j += "\"passed\": " + std::string(passed ? "true" : "false");
    j += ", \"backend\": " + json_str(backend) + ", \"device\": " + json_str(device_name);
    j += ", \"preset\": " + json_str(geo.name) + ", \"seed\": " + std::to_string(o.seed);
    j += ", \"context\": " + std::to_string(o.context) + ", \"mla_cache\": " + json_str(o.mla_cache);
    j += ", \"hadamard\": " + std::string(o.hadamard ? "true" : "false");
    j += ", \"threads\": " + std::to_string(dsa::num_threads()) + ", \"repeat\": " + std::to_string(o.repeat);
    j += ", \"batch\": [";
    for (size_t i = 0; i < spec.seqs.size(); ++i) {
      const auto& q = spec.seqs[i];
      j += std::string(i ? ", " : "") + "{\"kind\": " + json_str(dsa_cli::seq_kind_name(q.kind)) +
           ", \"q_len\": " + std::to_string(q.q_len) + ", \"kv_len\": " + std::to_string(q.kv_len) +
           ", \"route\": " + json_str(q.sparse ? "sparse" : "dense") + "}";
    }
    j += "], \"stages\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      const auto& c = checks[i];
      char ms[32], worst[32];
      std::snprintf(ms, sizeof ms, "%.3f", r.ms);
      std::snprintf(worst, sizeof worst, "%.4g", c.worst);
      j += std::string(i ? ", " : "") + "{\"name\": " + json_str(r.name) + ", \"ran\": " + (r.ran ? "true" : "false") +
           ", \"what\": " + json_str(r.what) + ", \"ms\": " + ms + ", \"error\": " + json_str(r.error) +
           ", \"checked_rows\": " + std::to_string(c.rows) + ", \"passed\": " + (!r.ran || c.passed ? "true" : "false") +
           ", \"worst_error_over_tolerance\": " + worst + ", \"detail\": " + json_str(c.detail) + "}";
    }
    char t[256];
    std::snprintf(t, sizeof t, "], \"times_ms\": {\"setup\": %.3f, \"step\": %.3f, \"check\": %.3f", setup_ms, step_ms, check_ms);
    j += t;
    for (auto& r : results) {
      std::snprintf(t, sizeof t, ", \"%s\": %.3f", r.name.c_str(), r.ms);
      j += t;
    }
    j += "}, \"workspace_bytes\": {\"scoring_logits\": " + std::to_string(logits_bytes) +
         ", \"topk\": " + std::to_string(bufs.workspace_topk) + ", \"sparse_mla\": " + std::to_string(bufs.workspace_sparse) +
         ", \"dense_mla\": " + std::to_string(bufs.workspace_dense) + ", \"shared_workspace\": " + std::to_string(ws) +
         "}, \"buffer_bytes\": " + std::to_string(bufs.total_bytes) + "}";
    std::printf("%s\n", j.c_str());
    return passed ? 0 : 1;
  }

  std::printf("\n%-20s %10s  %-6s %s\n", "stage", "time (ms)", "check", "what");
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const auto& c = checks[i];
    if (!r.ran) {
      std::printf("%-20s %10s  %-6s %s\n", r.name.c_str(), "-", "-", r.what.c_str());
      continue;
    }
    const char* verdict = !r.error.empty() ? "ERROR" : (call_failed ? "-" : (c.passed ? "ok" : "FAIL"));
    std::printf("%-20s %10.2f  %-6s %s", r.name.c_str(), r.ms, verdict, r.what.c_str());
    if (!call_failed && c.worst == 0) std::printf("; %d rows checked, exact", c.rows);
    else if (!call_failed) std::printf("; %d rows checked, max err/tol %.2f", c.rows, c.worst);
    std::printf("\n");
    if (!r.error.empty()) std::printf("    error: %s\n", r.error.c_str());
    if (!c.detail.empty()) std::printf("    mismatch: %s\n", c.detail.c_str());
  }
  std::printf("%-20s %10.2f\n", "step total", step_ms);
  std::printf("\nworkspace: scoring logits %s ([%d x %d] f32), topk %s, sparse_mla %s, dense_mla %s; shared workspace %s\n",
              mib(logits_bytes).c_str(), spec.num_sparse_rows, spec.logits_width, mib(bufs.workspace_topk).c_str(),
              mib(bufs.workspace_sparse).c_str(), mib(bufs.workspace_dense).c_str(), mib(ws).c_str());
  std::printf("memory: %s in all buffers (caches, activations, outputs); setup %.0f ms, checks %.0f ms\n",
              mib(bufs.total_bytes).c_str(), setup_ms, check_ms);
  std::printf("%s\n", passed ? "PASS" : "FAIL");
  return passed ? 0 : 1;
}
