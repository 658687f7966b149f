// `dsa bench`: per-op GPU benchmarks at the shapes of SPEC §2 (issue 4 §6) and of the anchors
// (/work/shared/anchors/bench.py: same op and shape strings), plus the layer benchmarks of
// bench_layer.cpp (issue 9). Every row names the kernel that ran (dsa::last_kernel_name).
//
// Every op runs through the public API on device buffers filled with random data (never
// zeros), rotating between several input sets so one run does not warm the cache for the
// next. Time: CUDA events around each launch, warm-up first, the median of the timed runs.
// Each result is set against its floor: max(FLOPs / peak, compulsory bytes / bandwidth) with
// the device's measured ceilings (overridable), printed as time / floor.
#include "cmd_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "dsa/dsa.h"

#if defined(DSA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"  // set_mha_stages: the MHA prefill's attention part alone
#endif

using namespace dsa_bench;

constexpr int kNoDevice = 77;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: dsa bench [options]\n"
               "  --op NAME[,NAME]   only these ops: indexer_logits, indexer_logits_paged, topk,\n"
               "                     sparse_mla_prefill, sparse_mla_decode, dense_mla_decode,\n"
               "                     dense_mla_prefill, layer_prefill, layer_decode, layer_core\n"
               "  --quick            fewer and smaller shapes, fewer runs (whole run well under a minute;\n"
               "                     layer_prefill at S=16384 step=4096)\n"
               "  --json [PATH]      JSON results to PATH (the table still prints) or to stdout (no table)\n"
               "  --warmup N         untimed runs per shape (default 3; quick 2)\n"
               "  --iters N          timed runs per shape, median reported (default 30; quick 10)\n"
               "  --device N         CUDA device (default 0)\n"
               "  --backend cpu|cuda cuda (default), or cpu: only the layer benchmarks, on the CPU backend\n"
               "                     (host times; give small sizes with --prefill / --decode)\n"
               "  --preset NAME      layer benchmarks of this preset only (default glm-5 and deepseek-v3.2)\n"
               "  --prefill S,STEP   layer_prefill of S tokens in steps of STEP instead of the default shape\n"
               "  --decode B,N,CTX   layer_decode of B sequences, next_n N, CTX cached tokens each\n"
               "                     Both layer rows add the host us per layer (JSON host_us_per_layer):\n"
               "                     each call alone (step; prepare once + run; device lengths), run()\n"
               "                     back to back over the layers, run()'s host time by op, and on CUDA\n"
               "                     (layer_decode) the device-lengths step replayed as a CUDA graph:\n"
               "                     launch host us and GPU us, per replay and per layer\n"
               "  --select PATH      layer_prefill's selection: both (default: the plan's own choice, and\n"
               "                     beside it the unfused path where the device has the fused kernel),\n"
               "                     auto, unfused or fused (score and select in one pass; CPU only today)\n"
               "  --core B,LEN       layer_core: B fresh prompts of LEN tokens through the step in core mode\n"
               "                     (cost model vs dense absorbed vs forced sparse; default 4,2048)\n"
               "  --bf16-tflops X    bf16 tensor-core ceiling for floors (default %.0f)\n"
               "  --fp8-tflops X     fp8 tensor-core ceiling (default %.0f)\n"
               "  --copy-tbs X       memory bandwidth ceiling in TB/s (default %.2f)\n"
               "Exit status: 0 every benchmark ran, 1 one failed, 2 bad options, 77 no CUDA backend or\n"
               "device (a test harness's skip code).\n",
               kBf16Tflops, kFp8Tflops, kCopyTBs);
}

bool parse(int argc, char** argv, Options* o) {
  bool warm_set = false, iters_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dsa bench: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      o->help = true;
      return true;
    } else if (a == "--quick") {
      o->quick = true;

    } else if (a == "--json") {
      o->json = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') o->json_path = argv[++i];
    } else if (a == "--op") {
      const char* v = value("--op");
      if (!v) return false;
      std::string s = v;
      size_t pos = 0;
      while (pos <= s.size()) {
        const size_t c = s.find(',', pos);
        const std::string name = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
        if (!name.empty()) o->ops.push_back(name);
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    } else if (a == "--warmup" || a == "--iters" || a == "--device") {
      const char* v = value(a.c_str());
      if (!v) return false;
      const int n = std::atoi(v);
      if (n < (a == "--iters" ? 1 : 0)) {
        std::fprintf(stderr, "dsa bench: %s: expected a number >= %d, got '%s'\n", a.c_str(), a == "--iters" ? 1 : 0, v);
        return false;
      }
      if (a == "--warmup") { o->warmup = n; warm_set = true; }
      else if (a == "--iters") { o->iters = n; iters_set = true; }
      else o->device = n;
    } else if (a == "--backend") {
      const char* v = value("--backend");
      if (!v) return false;
      const std::string b = v;
      if (b != "cpu" && b != "cuda") {
        std::fprintf(stderr, "dsa bench: --backend: expected cpu or cuda, got '%s'\n", v);
        return false;
      }
      o->cpu = b == "cpu";
    } else if (a == "--preset") {
      const char* v = value("--preset");
      if (!v) return false;
      dsa::ModelGeometry g;
      if (!dsa::geometry_preset(v, &g).ok()) {
        std::fprintf(stderr, "dsa bench: --preset: unknown preset '%s'\n", v);
        return false;
      }
      o->preset = v;
    } else if (a == "--prefill" || a == "--decode") {
      const char* v = value(a.c_str());
      if (!v) return false;
      long long x[3] = {0, 0, 0};
      const int want = a == "--prefill" ? 2 : 3;
      const int got = want == 2 ? std::sscanf(v, "%lld,%lld", &x[0], &x[1]) : std::sscanf(v, "%lld,%lld,%lld", &x[0], &x[1], &x[2]);
      bool good = got == want && x[0] > 0 && x[1] > 0 && (want == 2 || x[2] >= x[1]);
      if (!good) {
        std::fprintf(stderr, "dsa bench: %s: expected %s of positive integers, got '%s'\n", a.c_str(),
                     want == 2 ? "S,STEP" : "B,NEXT_N,CTX (CTX >= NEXT_N)", v);
        return false;
      }
      if (want == 2) { o->prefill_S = x[0]; o->prefill_step = x[1]; }
      else { o->decode_B = x[0]; o->decode_next_n = x[1]; o->decode_ctx = x[2]; }
    } else if (a == "--select") {
      const char* v = value("--select");
      if (!v) return false;
      o->select = v;
      if (o->select != "both" && o->select != "auto" && o->select != "unfused" && o->select != "fused") {
        std::fprintf(stderr, "dsa bench: --select: expected both, auto, unfused or fused, got '%s'\n", v);
        return false;
      }
    } else if (a == "--core") {
      const char* v = value("--core");
      if (!v) return false;
      long long x[2] = {0, 0};
      if (std::sscanf(v, "%lld,%lld", &x[0], &x[1]) != 2 || x[0] <= 0 || x[1] <= 0) {
        std::fprintf(stderr, "dsa bench: --core: expected B,LEN of positive integers, got '%s'\n", v);
        return false;
      }
      o->core_B = x[0];
      o->core_len = x[1];
    } else if (a == "--bf16-tflops" || a == "--fp8-tflops" || a == "--copy-tbs") {
      const char* v = value(a.c_str());
      if (!v) return false;
      const double x = std::atof(v);
      if (!(x > 0)) {
        std::fprintf(stderr, "dsa bench: %s: expected a positive number, got '%s'\n", a.c_str(), v);
        return false;
      }
      (a == "--bf16-tflops" ? o->bf16_tflops : a == "--fp8-tflops" ? o->fp8_tflops : o->copy_tbs) = x;
    } else {
      std::fprintf(stderr, "dsa bench: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return false;
    }
  }
  if (o->quick) {
    if (!warm_set) o->warmup = 2;
    if (!iters_set) o->iters = 10;
  }
  return true;
}

const char* const kOpNames[] = {"indexer_logits",   "indexer_logits_paged", "topk",
                                "sparse_mla_prefill", "sparse_mla_decode",  "dense_mla_decode",
                                "dense_mla_prefill",  "layer_prefill",      "layer_decode",
                                "layer_core"};

bool ops_known(const Options& o) {
  for (const auto& name : o.ops) {
    if (std::find_if(std::begin(kOpNames), std::end(kOpNames), [&](const char* n) { return name == n; }) ==
        std::end(kOpNames)) {
      std::fprintf(stderr, "dsa bench: --op: unknown op '%s'\n", name.c_str());
      return false;
    }
  }
  return true;
}

bool selected(const Options& o, const char* op) {
  return o.ops.empty() || std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) { o += ' '; continue; }
    o += c;
  }
  return o;
}


// One benchmark: runs it with the device's random pools (null on the CPU).
using Case = std::function<Result(const Pools*)>;

// The layer benchmarks: the default shapes (their strings join with the anchors'), or the sizes
// of --prefill / --decode and --preset.
void add_layer_cases(const Options& o, std::vector<Case>* cases) {
  const std::vector<std::string> presets =
      o.preset.empty() ? std::vector<std::string>{"glm-5", "deepseek-v3.2"} : std::vector<std::string>{o.preset};
  if (selected(o, "layer_prefill")) {
    const int64_t S = o.prefill_S ? o.prefill_S : o.quick ? 16384 : 131072;
    const int64_t step = o.prefill_step ? o.prefill_step : o.quick ? 4096 : 8192;
    // The plan's own choice (auto) under the shape the anchors join on; beside it, where the
    // device has the fused kernel, the unfused path ("select=unfused" in the shape).
    const bool fused_here = dsa::indexer_topk_available(o.cpu ? dsa::DeviceType::kCPU : dsa::DeviceType::kCUDA);
    std::vector<std::pair<dsa::SelectPath, std::string>> paths;
    if (o.select == "both" || o.select == "auto") paths.push_back({dsa::SelectPath::kAuto, ""});
    if ((o.select == "both" && fused_here) || o.select == "unfused") paths.push_back({dsa::SelectPath::kUnfused, " select=unfused"});
    if (o.select == "fused") paths.push_back({dsa::SelectPath::kFused, " select=fused"});
    for (const std::string& preset : presets)
      for (const auto& path : paths)
        cases->push_back([&o, preset, S, step, path](const Pools* pp) {
          return bench_layer_prefill(o, pp, preset, S, step, dsa::kDefaultScoreBudgetBytes, path.first, path.second);
        });
  }
  if (selected(o, "layer_decode")) {
    if (o.decode_B) {
      for (const std::string& preset : presets)
        cases->push_back([&o, preset](const Pools* pp) {
          return bench_layer_decode(o, pp, preset, o.decode_B, o.decode_next_n, o.decode_ctx);
        });
    } else {
      if (o.preset.empty() || o.preset == "glm-5")
        cases->push_back([&o](const Pools* pp) { return bench_layer_decode(o, pp, "glm-5", 64, 2, o.quick ? 8192 : 32768); });
      if ((o.preset.empty() && !o.quick) || o.preset == "deepseek-v3.2")
        cases->push_back([&o](const Pools* pp) { return bench_layer_decode(o, pp, "deepseek-v3.2", 128, 1, 8192); });
    }
  }
  if (selected(o, "layer_core")) {
    for (const std::string& preset : presets)
      cases->push_back([&o, preset](const Pools* pp) { return bench_layer_core(o, pp, preset, o.core_B, o.core_len); });
  }
}

// Runs the cases, prints the table (unless JSON goes to stdout) and writes the JSON.
int run_cases(const Options& o, const std::string& device, int units, const std::vector<Case>& cases, const Pools* pools) {
  std::vector<Result> results;
  bool all_ok = true;
  const bool table = !o.json || !o.json_path.empty();  // JSON to a file: the table still prints
  if (table) {
    std::printf("dsa bench on %s (%d %s); ceilings bf16 %.0f TFLOP/s, fp8 %.0f TFLOP/s, memory %.2f TB/s\n",
                device.c_str(), units, o.cpu ? "threads" : "SMs", o.bf16_tflops, o.fp8_tflops, o.copy_tbs);
    std::printf("%-20s %-46s %10s %9s %9s %10s %8s %8s  %s\n", "op", "shape", "ms", "TFLOP/s", "GB/s", "floor ms",
                "x floor", "bound", "kernel");
  }
  for (const auto& c : cases) {
    Result r = c(pools);
    set_floor(o, &r);
    all_ok = all_ok && r.ok;
    if (table) {
      if (r.ok) {
        std::printf("%-20s %-46s %10.4f %9.1f %9.0f %10.4f %8.2f %8s  %s\n", r.op.c_str(), r.shape.c_str(), r.ms,
                    r.work.flops / (r.ms * 1e9), r.work.bytes / (r.ms * 1e6), r.floor_ms, r.ms / r.floor_ms, r.bound,
                    r.kernel.empty() ? "-" : r.kernel.c_str());
        if (!r.text_extra.empty()) std::fputs(r.text_extra.c_str(), stdout);
      } else {
        std::printf("%-20s %-46s FAILED: %s\n", r.op.c_str(), r.shape.c_str(), r.error.c_str());
      }
      std::fflush(stdout);
    }
    results.push_back(r);
  }

  if (o.json) {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::string js = "{\n  \"tool\": \"dsa bench\",\n  \"version\": \"" + std::string(dsa::version()) +
                     "\",\n  \"backend\": \"" + (o.cpu ? "cpu" : "cuda") + "\",\n  \"device\": \"" + json_escape(device) + "\",\n  \"date\": \"" + date +
                     "\",\n  \"ceilings\": {\"bf16_tflops\": " + std::to_string(o.bf16_tflops) +
                     ", \"fp8_tflops\": " + std::to_string(o.fp8_tflops) + ", \"copy_tbs\": " + std::to_string(o.copy_tbs) +
                     "},\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      char buf[512];
      if (r.ok) {
        std::snprintf(buf, sizeof(buf),
                      "\"ok\": true, \"ms\": %.6f, \"ms_min\": %.6f, \"flops\": %.6g, \"bytes\": %.6g, \"tflops\": %.3f, "
                      "\"gbs\": %.1f, \"floor_ms\": %.6f, \"floor_ratio\": %.3f, \"bound\": \"%s\"",
                      r.ms, r.ms_min, r.work.flops, r.work.bytes, r.work.flops / (r.ms * 1e9), r.work.bytes / (r.ms * 1e6),
                      r.floor_ms, r.ms / r.floor_ms, r.bound);
      } else {
        std::snprintf(buf, sizeof(buf), "\"ok\": false, \"floor_ms\": %.6f", r.floor_ms);
      }
      js += "    {\"op\": \"" + r.op + "\", \"shape\": \"" + r.shape + "\", \"kernel\": \"" + json_escape(r.kernel) + "\", " + buf;
      if (r.ok) js += r.json_extra;
      if (!r.ok) js += ", \"error\": \"" + json_escape(r.error) + "\"";
      js += i + 1 < results.size() ? "},\n" : "}\n";
    }
    js += "  ]\n}\n";
    if (o.json_path.empty()) {
      std::fputs(js.c_str(), stdout);
    } else {
      FILE* f = std::fopen(o.json_path.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "dsa bench: --json: cannot write '%s'\n", o.json_path.c_str());
        return 2;
      }
      std::fputs(js.c_str(), f);
      std::fclose(f);
    }
  }
  return all_ok ? 0 : 1;
}


// --backend cpu: the layer benchmarks on the CPU backend.
int run_cpu(const Options& o) {
  for (const auto& name : o.ops)
    if (name != "layer_prefill" && name != "layer_decode" && name != "layer_core") {
      std::fprintf(stderr, "dsa bench: --backend cpu: only layer_prefill, layer_decode and layer_core run on the CPU, got '%s'\n",
                   name.c_str());
      return 2;
    }
  Options oc = o;
  if (oc.ops.empty()) oc.ops = {"layer_prefill", "layer_decode"};
  std::vector<Case> cases;
  add_layer_cases(oc, &cases);
  const auto devs = dsa::list_devices();
  return run_cases(oc, devs.empty() ? "CPU" : devs[0].name, dsa::num_threads(), cases, nullptr);
}

}  // namespace

#if !defined(DSA_WITH_CUDA)

int cmd_bench(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.help) return 0;
  if (!ops_known(o)) return 2;
  if (o.cpu) return run_cpu(o);
  std::fprintf(stderr, "dsa bench: this build has no CUDA backend (configure with -DDSA_CUDA=ON; --backend cpu runs the layer benchmarks)\n");
  return kNoDevice;
}

#else

namespace {


// ---- the ops ------------------------------------------------------------------------------------
constexpr int64_t kD = 576, kDV = 512;
constexpr float kSmScale = 0.13523f;

Result bench_indexer_logits(const Options& o, const Pools& pools, int64_t M, int64_t N, int64_t H) {
  Result r;
  r.op = "indexer_logits";
  r.shape = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " H=" + std::to_string(H);
  // Rows are the last M positions of an N-token context: row i sees keys 0 .. N - M + i.
  double pairs = 0;
  std::vector<int32_t> ks(static_cast<size_t>(M), 0), ke(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    ke[static_cast<size_t>(i)] = static_cast<int32_t>(N - M + i + 1);
    pairs += static_cast<double>(N - M + i + 1);
  }
  r.work.flops = pairs * H * 128 * 2;
  r.work.bytes = static_cast<double>(M) * N * 4 + M * H * (128 + 4) + N * (128 + 4);
  r.work.fp8 = true;
  const double in_bytes = static_cast<double>(M * H * 132 + N * 132);
  const int sets = rotation_sets(o, in_bytes);
  Rng rng(11);
  std::vector<Buf> q, w, k, kscale;
  bool ok = true;
  for (int s = 0; s < sets; ++s) {
    q.emplace_back(M * H * 128);
    w.emplace_back(M * H * 4);
    k.emplace_back(N * 128);
    kscale.emplace_back(N * 4);
    ok = ok && q.back().ok() && w.back().ok() && k.back().ok() && kscale.back().ok() &&
         pools.e4m3.fill(q.back().get(), q.back().bytes(), rng) && pools.f32.fill(w.back().get(), w.back().bytes(), rng) &&
         pools.e4m3.fill(k.back().get(), k.back().bytes(), rng) && pools.pow2.fill(kscale.back().get(), kscale.back().bytes(), rng);
  }
  Buf dks(M * 4), dke(M * 4), logits(static_cast<size_t>(M * N * 4));
  ok = ok && dks.ok() && dke.ok() && logits.ok() &&
       cudaMemcpy(dks.get(), ks.data(), M * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dke.get(), ke.data(), M * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  if (!ok) { r.error = fail_alloc(); return r; }
  const dsa::Device d = dev0(o);
  time_op(o, sets, [&](int s) {
    dsa::IndexerLogitsParams p;
    p.q = dsa::make_tensor(q[s].get(), dsa::DType::kE4M3, {M, H, 128}, d);
    p.weights = dsa::make_tensor(w[s].get(), dsa::DType::kF32, {M, H}, d);
    p.k = dsa::make_tensor(k[s].get(), dsa::DType::kE4M3, {N, 128}, d);
    p.k_scale = dsa::make_tensor(kscale[s].get(), dsa::DType::kF32, {N}, d);
    p.ks = dsa::make_tensor(dks.get(), dsa::DType::kI32, {M}, d);
    p.ke = dsa::make_tensor(dke.get(), dsa::DType::kI32, {M}, d);
    p.logits = dsa::make_tensor(logits.get(), dsa::DType::kF32, {M, N}, d);
    return dsa::indexer_logits(p);
  }, &r);
  return r;
}

// Paged decode logits against the indexer cache: B sequences of ctx cached keys, next_n rows
// each (row i of a sequence sees ctx - next_n + i + 1 keys); pages shuffled.
Result bench_indexer_paged(const Options& o, const Pools& pools, int64_t B, int64_t nn, int64_t H, int64_t ctx) {
  Result r;
  r.op = "indexer_logits_paged";
  r.shape = "B=" + std::to_string(B) + " next_n=" + std::to_string(nn) + " H=" + std::to_string(H) +
            " ctx=" + std::to_string(ctx);
  const int64_t R = B * nn, per_seq = (ctx + 63) / 64, blocks = B * per_seq;
  double pairs = 0;
  for (int64_t i = 0; i < nn; ++i) pairs += static_cast<double>(ctx - nn + i + 1);
  pairs *= static_cast<double>(B);
  r.work.flops = pairs * H * 128 * 2;
  r.work.bytes = static_cast<double>(B) * ctx * dsa::kIndexerTokenBytes + static_cast<double>(R) * ctx * 4 +
                 static_cast<double>(R) * H * (128 + 4);
  r.work.fp8 = true;
  const dsa::Device d = dev0(o);
  Rng rng(15);
  Buf cache(static_cast<size_t>(blocks * 64 * dsa::kIndexerTokenBytes));
  bool ok = cache.ok() && pools.e4m3.fill(cache.get(), cache.bytes(), rng);
  // Each page is [64 x 128 e4m3][64 x f32 scale]: the scales get powers of two.
  const size_t page_bytes = 64 * dsa::kIndexerTokenBytes, scale_bytes = 64 * 4;
  const size_t rows_per_copy = pools.pow2.bytes() / scale_bytes;
  for (int64_t b0 = 0; ok && b0 < blocks; b0 += static_cast<int64_t>(rows_per_copy)) {
    const size_t nb = std::min<size_t>(rows_per_copy, static_cast<size_t>(blocks - b0));
    ok = cudaMemcpy2DAsync(cache.as<uint8_t>() + static_cast<size_t>(b0) * page_bytes + 64 * 128, page_bytes,
                           pools.pow2.data(), scale_bytes, scale_bytes, nb, cudaMemcpyDeviceToDevice) == cudaSuccess;
  }
  std::vector<int32_t> bt(static_cast<size_t>(blocks)), lens(static_cast<size_t>(B), static_cast<int32_t>(ctx));
  for (int64_t i = 0; i < blocks; ++i) bt[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = blocks - 1; i > 0; --i) std::swap(bt[static_cast<size_t>(i)], bt[rng.next() % static_cast<uint64_t>(i + 1)]);
  Buf dbt(bt.size() * 4), dlens(lens.size() * 4), logits(static_cast<size_t>(R * ctx * 4));
  ok = ok && dbt.ok() && dlens.ok() && logits.ok() &&
       cudaMemcpy(dbt.get(), bt.data(), bt.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dlens.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  std::vector<Buf> q, w;
  for (int s = 0; s < 2 && ok; ++s) {
    q.emplace_back(static_cast<size_t>(R * H * 128));
    w.emplace_back(static_cast<size_t>(R * H * 4));
    ok = q.back().ok() && w.back().ok() && pools.e4m3.fill(q.back().get(), q.back().bytes(), rng) &&
         pools.f32.fill(w.back().get(), w.back().bytes(), rng);
  }
  if (!ok || cudaDeviceSynchronize() != cudaSuccess) { r.error = fail_alloc(); return r; }
  dsa::IndexerCacheDesc cd;
  cd.data = cache.get();
  cd.num_blocks = blocks;
  cd.page_size = 64;
  cd.device = d;
  time_op(o, 2, [&](int s) {
    dsa::IndexerLogitsPagedParams p;
    p.q = dsa::make_tensor(q[s].get(), dsa::DType::kE4M3, {R, H, 128}, d);
    p.weights = dsa::make_tensor(w[s].get(), dsa::DType::kF32, {R, H}, d);
    p.cache = cd;
    p.block_table = dsa::make_tensor(dbt.get(), dsa::DType::kI32, {B, per_seq}, d);
    p.kv_lens = dsa::make_tensor(dlens.get(), dsa::DType::kI32, {B}, d);
    p.next_n = nn;
    p.logits = dsa::make_tensor(logits.get(), dsa::DType::kF32, {R, ctx}, d);
    return dsa::indexer_logits_paged(p);
  }, &r);
  return r;
}

Result bench_topk(const Options& o, const Pools& pools, int64_t M, int64_t W, int64_t K) {
  Result r;
  r.op = "topk";
  r.shape = "M=" + std::to_string(M) + " W=" + std::to_string(W) + " k=" + std::to_string(K);
  r.work.bytes = static_cast<double>(M) * W * 4 + static_cast<double>(M) * K * 4 + M * 4;
  const int sets = rotation_sets(o, static_cast<double>(M) * W * 4);
  Rng rng(12);
  std::vector<Buf> logits;
  bool ok = true;
  for (int s = 0; s < sets; ++s) {
    logits.emplace_back(static_cast<size_t>(M * W * 4));
    ok = ok && logits.back().ok() && pools.f32.fill(logits.back().get(), logits.back().bytes(), rng);
  }
  std::vector<int32_t> len(static_cast<size_t>(M), static_cast<int32_t>(W));
  Buf lengths(M * 4), idx(static_cast<size_t>(M * K * 4));
  ok = ok && lengths.ok() && idx.ok() && cudaMemcpy(lengths.get(), len.data(), M * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  if (!ok) { r.error = fail_alloc(); return r; }
  const dsa::Device d = dev0(o);
  auto params = [&](int s) {
    dsa::TopkParams p;
    p.logits = dsa::make_tensor(logits[s].get(), dsa::DType::kF32, {M, W}, d);
    p.lengths = dsa::make_tensor(lengths.get(), dsa::DType::kI32, {M}, d);
    p.k = K;
    p.indices = dsa::make_tensor(idx.get(), dsa::DType::kI32, {M, K}, d);
    return p;
  };
  Buf ws(dsa::topk_workspace_size(params(0)));
  if (!ws.ok()) { r.error = fail_alloc(); return r; }
  time_op(o, sets, [&](int s) {
    dsa::TopkParams p = params(s);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    return dsa::topk(p);
  }, &r);
  return r;
}

// An MLA cache of `tokens` slots (pages of 64) filled with random BF16 or FP8 tokens.
bool make_cache(const Pools& pools, bool fp8, int64_t tokens, Rng& rng, Buf* cache, dsa::MlaCacheDesc* desc,
                dsa::Device d) {
  const int64_t page = 64, blocks = (tokens + page - 1) / page;
  const int64_t tb = fp8 ? dsa::kMlaFp8TokenBytes : dsa::kMlaBf16TokenBytes;
  *cache = Buf(static_cast<size_t>(blocks * page * tb));
  if (!cache->ok()) return false;
  desc->data = cache->get();
  desc->dtype = fp8 ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
  desc->num_blocks = blocks;
  desc->page_size = page;
  desc->device = d;
  return (fp8 ? pools.mla_fp8 : pools.bf16).fill(cache->get(), cache->bytes(), rng);
}

// Sparse MLA: `seqs` sequences of `ctx` cached tokens each; T rows, rows_per_seq per sequence,
// each selecting K distinct positions spread over its sequence (stratified random sample).
Result bench_sparse(const Options& o, const Pools& pools, const char* op, const std::string& shape, int64_t seqs,
                    int64_t ctx, int64_t rows_per_seq, int64_t H, int64_t K, bool fp8) {
  Result r;
  r.op = op;
  r.shape = shape;
  const int64_t T = seqs * rows_per_seq;
  const int64_t tb = fp8 ? dsa::kMlaFp8TokenBytes : dsa::kMlaBf16TokenBytes;
  r.work.flops = static_cast<double>(T) * H * K * (kD + kDV) * 2;
  const double unique_keys = std::min(static_cast<double>(seqs) * ctx, static_cast<double>(T) * K);
  r.work.bytes = static_cast<double>(T) * H * (kD * 2 + kDV * 2 + 4) + static_cast<double>(T) * K * 4 +
                 std::max(unique_keys, static_cast<double>(seqs) * K) * tb;
  const int sets = rotation_sets(o, static_cast<double>(T) * H * kD * 2 + T * K * 4.0);
  const dsa::Device d = dev0(o);
  Rng rng(13);
  Buf cache;
  dsa::MlaCacheDesc cdesc;
  bool ok = make_cache(pools, fp8, seqs * ctx, rng, &cache, &cdesc, d);
  std::vector<Buf> q, idx;
  std::vector<int32_t> h_idx(static_cast<size_t>(T * K));
  for (int s = 0; s < sets && ok; ++s) {
    q.emplace_back(static_cast<size_t>(T * H * kD * 2));
    ok = q.back().ok() && pools.bf16.fill(q.back().get(), q.back().bytes(), rng);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t / rows_per_seq;
      // Causal: the last rows_per_seq * ... positions of the sequence are the rows themselves.
      const int64_t L = ctx - rows_per_seq + (t % rows_per_seq) + 1;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t pos = std::min<int64_t>(L - 1, static_cast<int64_t>((j + rng.uniform()) * L / K));
        h_idx[static_cast<size_t>(t * K + j)] = static_cast<int32_t>(j < L ? b * ctx + pos : -1);
      }
    }
    idx.emplace_back(h_idx.size() * 4);
    ok = ok && idx.back().ok() &&
         cudaMemcpy(idx.back().get(), h_idx.data(), h_idx.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  Buf out(static_cast<size_t>(T * H * kDV * 2)), lse(static_cast<size_t>(T * H * 4));
  ok = ok && out.ok() && lse.ok();
  if (!ok) { r.error = fail_alloc(); return r; }
  auto params = [&](int s) {
    dsa::SparseMlaParams p;
    p.q = dsa::make_tensor(q[s].get(), dsa::DType::kBF16, {T, H, kD}, d);
    p.kv.paged = cdesc;
    p.indices = dsa::make_tensor(idx[s].get(), dsa::DType::kI32, {T, K}, d);
    p.sm_scale = kSmScale;
    p.out = dsa::make_tensor(out.get(), dsa::DType::kBF16, {T, H, kDV}, d);
    p.lse = dsa::make_tensor(lse.get(), dsa::DType::kF32, {T, H}, d);
    return p;
  };
  Buf ws(dsa::sparse_mla_workspace_size(params(0)));
  if (!ws.ok()) { r.error = fail_alloc(); return r; }
  time_op(o, sets, [&](int s) {
    dsa::SparseMlaParams p = params(s);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    return dsa::sparse_mla(p);
  }, &r);
  return r;
}

// Dense MLA over a paged cache: `seqs` sequences, q_len new tokens each, kv_len keys each.
Result bench_dense(const Options& o, const Pools& pools, const char* op, const std::string& shape, int64_t seqs,
                   int64_t q_len, int64_t kv_len, int64_t H, bool fp8) {
  Result r;
  r.op = op;
  r.shape = shape;
  const int64_t T = seqs * q_len, page = 64, pages = (kv_len + page - 1) / page;
  const int64_t tb = fp8 ? dsa::kMlaFp8TokenBytes : dsa::kMlaBf16TokenBytes;
  double keys = 0;
  for (int64_t i = 0; i < q_len; ++i) keys += static_cast<double>(kv_len - q_len + i + 1);
  r.work.flops = keys * seqs * H * (kD + kDV) * 2;
  r.work.bytes = static_cast<double>(T) * H * (kD * 2 + kDV * 2 + 4) + static_cast<double>(seqs) * kv_len * tb;
  const int sets = rotation_sets(o, static_cast<double>(T) * H * kD * 2);
  const dsa::Device d = dev0(o);
  Rng rng(14);
  Buf cache;
  dsa::MlaCacheDesc cdesc;
  bool ok = make_cache(pools, fp8, seqs * pages * page, rng, &cache, &cdesc, d);
  std::vector<int32_t> cu(static_cast<size_t>(seqs + 1)), lens(static_cast<size_t>(seqs), static_cast<int32_t>(kv_len)),
      bt(static_cast<size_t>(seqs * pages));
  for (int64_t b = 0; b <= seqs; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b * q_len);
  for (int64_t i = 0; i < seqs * pages; ++i) bt[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  Buf dcu(cu.size() * 4), dlens(lens.size() * 4), dbt(bt.size() * 4);
  ok = ok && dcu.ok() && dlens.ok() && dbt.ok() &&
       cudaMemcpy(dcu.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dlens.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dbt.get(), bt.data(), bt.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  std::vector<Buf> q;
  for (int s = 0; s < sets && ok; ++s) {
    q.emplace_back(static_cast<size_t>(T * H * kD * 2));
    ok = q.back().ok() && pools.bf16.fill(q.back().get(), q.back().bytes(), rng);
  }
  Buf out(static_cast<size_t>(T * H * kDV * 2)), lse(static_cast<size_t>(T * H * 4));
  ok = ok && out.ok() && lse.ok();
  if (!ok) { r.error = fail_alloc(); return r; }
  auto params = [&](int s) {
    dsa::DenseMlaParams p;
    p.q = dsa::make_tensor(q[s].get(), dsa::DType::kBF16, {T, H, kD}, d);
    p.kv.paged = cdesc;
    p.cu_seqlens_q = dsa::make_tensor(dcu.get(), dsa::DType::kI32, {seqs + 1}, d);
    p.block_table = dsa::make_tensor(dbt.get(), dsa::DType::kI32, {seqs, pages}, d);
    p.kv_lens = dsa::make_tensor(dlens.get(), dsa::DType::kI32, {seqs}, d);
    p.sm_scale = kSmScale;
    p.out = dsa::make_tensor(out.get(), dsa::DType::kBF16, {T, H, kDV}, d);
    p.lse = dsa::make_tensor(lse.get(), dsa::DType::kF32, {T, H}, d);
    return p;
  };
  Buf ws(dsa::dense_mla_workspace_size(params(0)));
  if (!ws.ok()) { r.error = fail_alloc(); return r; }
  time_op(o, sets, [&](int s) {
    dsa::DenseMlaParams p = params(s);
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    return dsa::dense_mla(p);
  }, &r);
  return r;
}

// Dense prefill in MHA form (dense_mha_prefill): B sequences of len fresh tokens, H heads,
// qk = qk_nope + 64, v. attention_only: the attention over K/V that a full call left in the
// workspace (the anchors' SDPA row, same shape string); else decompression (gather + kv_b
// GEMM) + attention, shape suffixed " +kv_b" (against SDPA + kv_b_gemm).
Result bench_mha_prefill(const Options& o, const Pools& pools, int64_t B, int64_t len, int64_t H, int64_t nope,
                         int64_t dv, bool attention_only) {
  Result r;
  r.op = "dense_mla_prefill";
  r.shape = "B=" + std::to_string(B) + " len=" + std::to_string(len) + " H=" + std::to_string(H) +
            " form=mha qk=" + std::to_string(nope + 64) + " v=" + std::to_string(dv) + (attention_only ? "" : " +kv_b");
  const int64_t T = B * len, page = 64, pages = (len + page - 1) / page;
  const double pairs = static_cast<double>(B) * len * (len + 1) / 2;
  r.work.flops = pairs * H * (nope + 64 + dv) * 2 + (attention_only ? 0.0 : 2.0 * T * 512 * H * (nope + dv));
  r.work.bytes = static_cast<double>(T) * H * ((nope + 64 + dv) * 2 + (nope + dv) * 2 + 4) +
                 (attention_only ? 0.0 : static_cast<double>(T) * dsa::kMlaBf16TokenBytes);
  const dsa::Device d = dev0(o);
  Rng rng(15);
  Buf cache;
  dsa::MlaCacheDesc cdesc;
  bool ok = make_cache(pools, false, B * pages * page, rng, &cache, &cdesc, d);
  std::vector<int32_t> cu(static_cast<size_t>(B + 1)), lens(static_cast<size_t>(B), static_cast<int32_t>(len)),
      bt(static_cast<size_t>(B * pages));
  for (int64_t b = 0; b <= B; ++b) cu[static_cast<size_t>(b)] = static_cast<int32_t>(b * len);
  for (int64_t i = 0; i < B * pages; ++i) bt[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  Buf dcu(cu.size() * 4), dlens(lens.size() * 4), dbt(bt.size() * 4);
  Buf qn(static_cast<size_t>(T * H * nope * 2)), qp(static_cast<size_t>(T * H * 64 * 2)),
      w(static_cast<size_t>(H * (nope + dv) * 512 * 2)), out(static_cast<size_t>(T * H * dv * 2)),
      lse(static_cast<size_t>(T * H * 4));
  ok = ok && dcu.ok() && dlens.ok() && dbt.ok() && qn.ok() && qp.ok() && w.ok() && out.ok() && lse.ok() &&
       cudaMemcpy(dcu.get(), cu.data(), cu.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dlens.get(), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dbt.get(), bt.data(), bt.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
       pools.bf16.fill(qn.get(), qn.bytes(), rng) && pools.bf16.fill(qp.get(), qp.bytes(), rng) &&
       pools.bf16.fill(w.get(), w.bytes(), rng);
  if (!ok) { r.error = fail_alloc(); return r; }
  dsa::DenseMhaPrefillParams p;
  p.q_nope = dsa::make_tensor(qn.get(), dsa::DType::kBF16, {T, H, nope}, d);
  p.q_pe = dsa::make_tensor(qp.get(), dsa::DType::kBF16, {T, H, 64}, d);
  p.cache = cdesc;
  p.block_table = dsa::make_tensor(dbt.get(), dsa::DType::kI32, {B, pages}, d);
  p.kv_lens = dsa::make_tensor(dlens.get(), dsa::DType::kI32, {B}, d);
  p.kv_lens_host = dsa::make_tensor(lens.data(), dsa::DType::kI32, {B});
  p.cu_seqlens_q = dsa::make_tensor(dcu.get(), dsa::DType::kI32, {B + 1}, d);
  p.kv_b_proj = dsa::make_tensor(w.get(), dsa::DType::kBF16, {H * (nope + dv), 512}, d);
  p.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nope + 64)));
  p.out = dsa::make_tensor(out.get(), dsa::DType::kBF16, {T, H, dv}, d);
  p.lse = dsa::make_tensor(lse.get(), dsa::DType::kF32, {T, H}, d);
  Buf ws(dsa::dense_mha_prefill_workspace_size(p).batch_bytes);
  if (!ws.ok()) { r.error = fail_alloc(); return r; }
  p.workspace = ws.get();
  p.workspace_bytes = ws.bytes();
  const dsa::Status first = dsa::dense_mha_prefill(p);  // fills the workspace's K/V
  if (!first.ok()) { r.error = first.to_string(); return r; }
  dsa::gpu::set_mha_stages(attention_only ? 2 : 3);
  time_op(o, 1, [&](int) { return dsa::dense_mha_prefill(p); }, &r);
  dsa::gpu::set_mha_stages(3);
  return r;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  if (o.help) return 0;
  if (!ops_known(o)) return 2;
  if (o.cpu) return run_cpu(o);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    std::fprintf(stderr, "dsa bench: no CUDA device found (the benchmarks need a GPU)\n");
    return kNoDevice;
  }
  if (o.device >= n || cudaSetDevice(o.device) != cudaSuccess) {
    std::fprintf(stderr, "dsa bench: --device %d: expected a device index below %d\n", o.device, n);
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, o.device);

  std::vector<Case> cases;
  if (selected(o, "indexer_logits")) {
    const std::vector<int64_t> Ns = o.quick ? std::vector<int64_t>{32768} : std::vector<int64_t>{32768, 65536, 131072};
    const std::vector<int64_t> Hs = o.quick ? std::vector<int64_t>{64} : std::vector<int64_t>{32, 64};
    for (int64_t N : Ns)
      for (int64_t H : Hs) cases.push_back([&o, N, H](const Pools* pp) { const Pools& p = *pp; return bench_indexer_logits(o, p, 4096, N, H); });
  }
  if (selected(o, "indexer_logits_paged")) {
    // The anchors' order: H, then ctx, then next_n.
    const std::vector<int64_t> Hs = o.quick ? std::vector<int64_t>{32} : std::vector<int64_t>{32, 64};
    const std::vector<int64_t> ctxs = o.quick ? std::vector<int64_t>{32768} : std::vector<int64_t>{32768, 131072};
    const std::vector<int64_t> nns = o.quick ? std::vector<int64_t>{2} : std::vector<int64_t>{1, 2, 4};
    for (int64_t H : Hs)
      for (int64_t ctx : ctxs)
        for (int64_t nn : nns)
          cases.push_back([&o, H, ctx, nn](const Pools* pp) { const Pools& p = *pp; return bench_indexer_paged(o, p, 64, nn, H, ctx); });
  }
  if (selected(o, "topk")) {
    cases.push_back([&o](const Pools* pp) { const Pools& p = *pp; return bench_topk(o, p, 64, 65536, 2048); });
    if (!o.quick) {
      cases.push_back([&o](const Pools* pp) { const Pools& p = *pp; return bench_topk(o, p, 4096, 131072, 2048); });
      cases.push_back([&o](const Pools* pp) { const Pools& p = *pp; return bench_topk(o, p, 64, 1048576, 2048); });
    }
  }
  if (selected(o, "sparse_mla_prefill")) {
    const std::vector<int64_t> Hs = o.quick ? std::vector<int64_t>{16, 128} : std::vector<int64_t>{16, 32, 64, 128};
    for (int64_t H : Hs)
      cases.push_back([&o, H](const Pools* pp) { const Pools& p = *pp;
        return bench_sparse(o, p, "sparse_mla_prefill", "T=4096 H=" + std::to_string(H) + " K=2048 ctx=32768 kv=bf16", 1,
                            32768, 4096, H, 2048, false);
      });
  }
  if (selected(o, "sparse_mla_decode")) {
    for (const bool fp8 : {true, false}) {
      // quick: FP8 at 128 heads, BF16 at 16 (a tensor-parallel rank's share).
      const std::vector<int64_t> Hs = !o.quick ? std::vector<int64_t>{16, 32, 64, 128}
                                               : std::vector<int64_t>{fp8 ? int64_t{128} : int64_t{16}};
      for (int64_t H : Hs)
        cases.push_back([&o, H, fp8](const Pools* pp) { const Pools& p = *pp;
          return bench_sparse(o, p, "sparse_mla_decode",
                              "B=128 next_n=2 H=" + std::to_string(H) + " K=2048 ctx=8192 kv=" + (fp8 ? "fp8" : "bf16"), 128,
                              8192, 2, H, 2048, fp8);
        });
    }
  }
  if (selected(o, "dense_mla_decode")) {
    cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
      return bench_dense(o, p, "dense_mla_decode", "B=128 next_n=1 ctx=2048 H=128 kv=bf16", 128, 1, 2048, 128, false);
    });
    cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
      return bench_dense(o, p, "dense_mla_decode", "B=64 next_n=1 ctx=8192 H=128 kv=bf16", 64, 1, 8192, 128, false);
    });
    if (!o.quick) {
      cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
        return bench_dense(o, p, "dense_mla_decode", "B=1 next_n=1 ctx=131072 H=128 kv=bf16", 1, 1, 131072, 128, false);
      });
      cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
        return bench_dense(o, p, "dense_mla_decode", "B=128 next_n=1 ctx=2048 H=128 kv=fp8", 128, 1, 2048, 128, true);
      });
      cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
        return bench_dense(o, p, "dense_mla_decode", "B=64 next_n=1 ctx=8192 H=128 kv=fp8", 64, 1, 8192, 128, true);
      });
    }
  }
  if (selected(o, "dense_mla_prefill")) {
    cases.push_back([&o](const Pools* pp) { const Pools& p = *pp;
      return bench_dense(o, p, "dense_mla_prefill", "B=4 len=2048 H=128 kv=bf16", 4, 2048, 2048, 128, false);
    });
    for (const bool attn : {true, false}) {  // MHA form: attention part, then decompression + attention
      cases.push_back([&o, attn](const Pools* p) { return bench_mha_prefill(o, *p, 4, 2048, 128, 128, 128, attn); });
      cases.push_back([&o, attn](const Pools* p) { return bench_mha_prefill(o, *p, 4, 2048, 64, 192, 256, attn); });
    }
  }
  add_layer_cases(o, &cases);
  const Pools pools;
  return run_cases(o, prop.name, prop.multiProcessorCount, cases, &pools);
}

#endif  // DSA_WITH_CUDA
