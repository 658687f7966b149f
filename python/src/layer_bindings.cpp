// Bindings of the planner and the layer step (dsa/planner.h, dsa/layer.h). Built only when the
// tree has them (python/CMakeLists.txt).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "dsa/dsa.h"
#include "dsa/layer.h"
#include "dsa/planner.h"
#include "tensor_import.h"

namespace py = pybind11;
using dsa_py::Importer;
using dsa_py::Reinterpret;

namespace {

// The prefix of every refusal of Attention.step / prepare / run (the C++ entry points' own).
constexpr const char* kStep = "attention_step";

void check(const dsa::Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case dsa::StatusCode::kInvalidArgument:
      if (s.message().find(": expected dtype ") != std::string::npos) throw py::type_error(s.message());
      throw py::value_error(s.message());
    // The message alone: it starts with its entry point's prefix ("plan:", "attention_step:");
    // the exception type carries the status class.
    case dsa::StatusCode::kLimitExceeded:
    case dsa::StatusCode::kWorkspaceTooSmall: throw py::value_error(s.message());
    case dsa::StatusCode::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, s.message().c_str());
      throw py::error_already_set();
    case dsa::StatusCode::kOutOfMemory:
      PyErr_SetString(PyExc_MemoryError, s.message().c_str());
      throw py::error_already_set();
    default: throw std::runtime_error(s.to_string());
  }
}

// d[key] as T, or fallback when absent / None; a value that does not convert (a string for an
// int, an int past the field's range) is a TypeError naming the key.
template <typename T>
T get(const py::dict& d, const char* key, T fallback, const char* who = "plan") {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  auto bad = [&]() {
    return py::type_error(std::string(who) + ": " + std::string(key) + ": expected " +
                          (std::is_same<T, std::string>::value ? "a string"
                           : std::is_same<T, bool>::value      ? "a bool"
                           : std::is_floating_point<T>::value  ? "a number"
                                                               : "an integer in range (" + std::to_string(sizeof(T) * 8) + "-bit)") +
                          ", got " + py::repr(d[key]).cast<std::string>());
  };
  if constexpr (std::is_integral<T>::value && !std::is_same<T, bool>::value) {
    // Range-checked here rather than through pybind11's cast error, whose type differs between
    // build configurations.
    const py::object v = d[key];
    if (!PyLong_Check(v.ptr())) throw bad();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || (x == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      throw bad();
    }
    if (x < static_cast<long long>(std::numeric_limits<T>::min()) || x > static_cast<long long>(std::numeric_limits<T>::max()))
      throw bad();
    return static_cast<T>(x);
  }
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    throw bad();
  }
}

dsa::ModelGeometry geometry_from(const py::object& g) {
  dsa::ModelGeometry m;
  if (py::isinstance<py::str>(g)) {
    const dsa::Status s = dsa::geometry_preset(g.cast<std::string>(), &m);
    if (!s.ok()) throw py::value_error("plan: geometry: " + s.message());
    return m;
  }
  if (!py::isinstance<py::dict>(g)) throw py::type_error("plan: geometry: expected a preset name or a dict");
  const py::dict d = g.cast<py::dict>();
  if (d.contains("name")) {
    const std::string name = d["name"].cast<std::string>();
    if (!dsa::geometry_preset(name, &m).ok()) m.name = name;  // a custom geometry: fields below
  }
  m.num_heads = get<int>(d, "num_heads", m.num_heads);
  m.kv_lora_rank = get<int>(d, "kv_lora_rank", m.kv_lora_rank);
  m.qk_rope_head_dim = get<int>(d, "qk_rope_head_dim", m.qk_rope_head_dim);
  m.qk_nope_head_dim = get<int>(d, "qk_nope_head_dim", m.qk_nope_head_dim);
  m.v_head_dim = get<int>(d, "v_head_dim", m.v_head_dim);
  m.q_lora_rank = get<int>(d, "q_lora_rank", m.q_lora_rank);
  m.index_heads = get<int>(d, "index_heads", m.index_heads);
  m.index_head_dim = get<int>(d, "index_head_dim", m.index_head_dim);
  m.topk = get<int>(d, "topk", m.topk);
  if (d.contains("index_rope")) {
    const std::string r = d["index_rope"].cast<std::string>();
    if (r != "half_split" && r != "interleaved") {
      throw py::value_error("plan: geometry: index_rope: expected 'half_split' or 'interleaved', got '" + r + "'");
    }
    m.index_rope = r == "interleaved" ? dsa::RopeStyle::kInterleaved : dsa::RopeStyle::kHalfSplit;
  }
  m.num_layers = get<int>(d, "num_layers", m.num_layers);
  m.num_mtp_layers = get<int>(d, "num_mtp_layers", m.num_mtp_layers);
  m.shared_indexer_pattern = get<bool>(d, "shared_indexer_pattern", m.shared_indexer_pattern);
  m.max_positions = get<int64_t>(d, "max_positions", m.max_positions);
  m.sm_scale = get<double>(d, "sm_scale", m.sm_scale);
  return m;
}

dsa::Device device_from(const std::string& s) {
  if (s == "cpu") return dsa::cpu_device();
  if (s == "cuda") return dsa::cuda_device(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return dsa::cuda_device(std::stoi(s.substr(5)));
    } catch (const std::exception&) {
    }
  }
  throw py::value_error("plan: device: expected 'cpu', 'cuda' or 'cuda:N', got '" + s + "'");
}

py::list buffers(const std::vector<dsa::PlanBuffer>& bs) {
  py::list l;
  for (const auto& b : bs) {
    py::dict e;
    e["name"] = b.name;
    e["bytes"] = b.bytes;
    e["what"] = b.what;
    l.append(e);
  }
  return l;
}

py::dict plan_dict(const dsa::Plan& p) {
  py::dict d;
  const dsa::PlannerConfig& c = p.config;
  py::dict cfg;
  cfg["geometry"] = c.geometry.name;
  cfg["cache_dtype"] = dsa::mla_cache_dtype_name(c.cache_dtype);
  cfg["page_size"] = c.page_size;
  cfg["max_tokens_per_step"] = c.max_tokens_per_step;
  cfg["max_seqs_per_step"] = c.max_seqs_per_step;
  cfg["max_context"] = c.max_context;
  cfg["max_next_n"] = c.max_next_n;
  cfg["score_budget_bytes"] = c.score_budget_bytes;
  cfg["device_memory_bytes"] = c.device_memory_bytes;
  cfg["kv_cache_fraction"] = c.kv_cache_fraction;
  cfg["memory_is_exact"] = c.memory_is_exact;
  cfg["core_mode"] = c.core_mode;
  cfg["select"] = dsa::select_path_name(c.select);
  {
    // The geometry the plan was made for, every field (preset values and overrides alike).
    const dsa::ModelGeometry& g = c.geometry;
    py::dict gd;
    gd["name"] = g.name;
    gd["num_heads"] = g.num_heads;
    gd["kv_lora_rank"] = g.kv_lora_rank;
    gd["qk_rope_head_dim"] = g.qk_rope_head_dim;
    gd["qk_nope_head_dim"] = g.qk_nope_head_dim;
    gd["v_head_dim"] = g.v_head_dim;
    gd["q_lora_rank"] = g.q_lora_rank;
    gd["index_heads"] = g.index_heads;
    gd["index_head_dim"] = g.index_head_dim;
    gd["topk"] = g.topk;
    gd["index_rope"] = g.index_rope == dsa::RopeStyle::kInterleaved ? "interleaved" : "half_split";
    gd["num_layers"] = g.num_layers;
    gd["num_mtp_layers"] = g.num_mtp_layers;
    gd["shared_indexer_pattern"] = g.shared_indexer_pattern;
    gd["max_positions"] = g.max_positions;
    gd["sm_scale"] = g.sm_scale;
    d["geometry"] = gd;
  }
  cfg["device"] = c.device.type == dsa::DeviceType::kCUDA ? "cuda:" + std::to_string(c.device.index) : "cpu";
  d["config"] = cfg;
#define DSA_PY_FIELD(f) d[#f] = p.f
  DSA_PY_FIELD(max_rows);
  DSA_PY_FIELD(workspace_bytes);
  DSA_PY_FIELD(host_bytes);
  DSA_PY_FIELD(score_budget_bytes);
  DSA_PY_FIELD(score_region_bytes);
  DSA_PY_FIELD(min_score_budget_bytes);
  DSA_PY_FIELD(attention_scratch_bytes);
  DSA_PY_FIELD(core_bytes);
  DSA_PY_FIELD(mha_max_context);
  DSA_PY_FIELD(fused_select);
  DSA_PY_FIELD(unfused_max_width);
  DSA_PY_FIELD(unfused_region_bytes);
  DSA_PY_FIELD(fused_region_bytes);
  DSA_PY_FIELD(fused_max_context_rows_per_chunk);
  DSA_PY_FIELD(unfused_bytes_all_rows);
  DSA_PY_FIELD(fused_bytes_all_rows);
  DSA_PY_FIELD(tile_width);
  DSA_PY_FIELD(max_tiles);
  DSA_PY_FIELD(mla_layers);
  DSA_PY_FIELD(indexer_layers);
  DSA_PY_FIELD(mla_page_bytes);
  DSA_PY_FIELD(indexer_page_bytes);
  DSA_PY_FIELD(kv_budget_bytes);
  DSA_PY_FIELD(kv_pages);
  DSA_PY_FIELD(kv_tokens);
  DSA_PY_FIELD(mla_cache_bytes);
  DSA_PY_FIELD(indexer_cache_bytes);
#undef DSA_PY_FIELD
  d["buffers"] = buffers(p.buffers);
  d["score_buffers"] = buffers(p.score_buffers);
  d["fused_buffers"] = buffers(p.fused_buffers);
  // Rows wider than this take the fused path; None when no row does.
  d["fused_min_width"] = p.fused_select ? py::object(py::int_(p.fused_min_width)) : py::object(py::none());
  return d;
}

py::dict report_dict(const dsa::StepReport& r) {
  py::dict d;
  static const char* kRoutes[3] = {"dense", "sparse", "shared"};
  py::dict seqs, rows;
  for (int i = 0; i < 3; ++i) {
    seqs[kRoutes[i]] = r.seqs[i];
    rows[kRoutes[i]] = r.rows[i];
  }
  d["seqs"] = seqs;
  d["rows"] = rows;
#define DSA_PY_FIELD(f) d[#f] = r.f
  DSA_PY_FIELD(score_chunks);
  DSA_PY_FIELD(fused_chunks);
  DSA_PY_FIELD(fused_rows);
  DSA_PY_FIELD(tiled_rows);
  DSA_PY_FIELD(score_tiles);
  DSA_PY_FIELD(workspace_high_water_bytes);
  DSA_PY_FIELD(score_high_water_bytes);
  DSA_PY_FIELD(workspace_plan_bytes);
  DSA_PY_FIELD(score_budget_bytes);
  DSA_PY_FIELD(ms_cache);
  DSA_PY_FIELD(ms_prepare);
  DSA_PY_FIELD(ms_score);
  DSA_PY_FIELD(ms_select);
  DSA_PY_FIELD(ms_map);
  DSA_PY_FIELD(ms_sparse);
  DSA_PY_FIELD(ms_dense);
  DSA_PY_FIELD(ms_project);
  DSA_PY_FIELD(ms_total);
  DSA_PY_FIELD(mha_seqs);
  DSA_PY_FIELD(mha_rows);
  DSA_PY_FIELD(host_us);
  // GPU ms per stage (the step's time_stages on CUDA); gpu_timed says whether they were measured.
  DSA_PY_FIELD(gpu_timed);
  DSA_PY_FIELD(gpu_ms_cache);
  DSA_PY_FIELD(gpu_ms_prepare);
  DSA_PY_FIELD(gpu_ms_score);
  DSA_PY_FIELD(gpu_ms_select);
  DSA_PY_FIELD(gpu_ms_map);
  DSA_PY_FIELD(gpu_ms_sparse);
  DSA_PY_FIELD(gpu_ms_dense);
  DSA_PY_FIELD(gpu_ms_project);
  DSA_PY_FIELD(gpu_ms_total);
#undef DSA_PY_FIELD
  return d;
}

// Attention is not re-entrant (its host staging is shared by steps); the GIL is released during
// a step, so a mutex keeps two Python threads from stepping one object at once.
struct PyAttention {
  explicit PyAttention(const dsa::Plan& plan) {
    check(dsa::Attention::create(plan, &attn));  // a failed construction is an exception (MemoryError, ...)
  }
  std::unique_ptr<dsa::Attention> attn;
  std::mutex mu;
};

py::object item(const py::dict& d, const char* key) {
  return d.contains(key) ? py::reinterpret_borrow<py::object>(d[key]) : py::none();
}

}  // namespace

void bind_layer(py::module_& m) {
  py::class_<dsa::Plan>(m, "Plan")
      .def_property_readonly("workspace_bytes", [](const dsa::Plan& p) { return p.workspace_bytes; })
      .def_property_readonly("page_size", [](const dsa::Plan& p) { return p.config.page_size; })
      .def_property_readonly("device", [](const dsa::Plan& p) {
        return p.config.device.type == dsa::DeviceType::kCUDA ? "cuda:" + std::to_string(p.config.device.index)
                                                              : std::string("cpu");
      })
      .def("as_dict", &plan_dict)
      .def("rows_per_chunk", &dsa::Plan::rows_per_chunk, py::arg("context_len"))
      .def("tile_width_for", &dsa::Plan::tile_width_for, py::arg("context_len"));

  m.def("make_plan", [](py::object geometry, py::dict c) {
    dsa::PlannerConfig cfg;
    cfg.geometry = geometry_from(geometry);
    const std::string cd = get<std::string>(c, "cache_dtype", "bf16");
    if (cd != "bf16" && cd != "fp8") throw py::value_error("plan: cache_dtype: expected 'bf16' or 'fp8', got '" + cd + "'");
    cfg.cache_dtype = cd == "fp8" ? dsa::MlaCacheDtype::kFP8 : dsa::MlaCacheDtype::kBF16;
    cfg.page_size = get<int64_t>(c, "page_size", cfg.page_size);
    cfg.max_tokens_per_step = get<int64_t>(c, "max_tokens_per_step", cfg.max_tokens_per_step);
    cfg.max_seqs_per_step = get<int64_t>(c, "max_seqs_per_step", cfg.max_seqs_per_step);
    cfg.max_context = get<int64_t>(c, "max_context", cfg.max_context);
    cfg.max_next_n = get<int64_t>(c, "max_next_n", cfg.max_next_n);
    cfg.score_budget_bytes = get<int64_t>(c, "score_budget_bytes", cfg.score_budget_bytes);
    cfg.device_memory_bytes = get<int64_t>(c, "device_memory_bytes", cfg.device_memory_bytes);
    cfg.kv_cache_fraction = get<double>(c, "kv_cache_fraction", cfg.kv_cache_fraction);
    cfg.memory_is_exact = get<bool>(c, "memory_is_exact", cfg.memory_is_exact);
    cfg.core_mode = get<bool>(c, "core_mode", cfg.core_mode);
    const std::string sel = get<std::string>(c, "select", "auto");
    if (sel == "auto") cfg.select = dsa::SelectPath::kAuto;
    else if (sel == "unfused") cfg.select = dsa::SelectPath::kUnfused;
    else if (sel == "fused") cfg.select = dsa::SelectPath::kFused;
    else throw py::value_error("plan: select: expected 'auto', 'unfused' or 'fused', got '" + sel + "'");
    cfg.device = device_from(get<std::string>(c, "device", "cpu"));
    dsa::Plan plan;
    check(dsa::make_plan(cfg, &plan));
    return plan;
  });

  m.def("parse_byte_size", [](const std::string& text) {
    int64_t bytes = 0;
    const dsa::Status s = dsa::parse_byte_size(text, &bytes);
    if (!s.ok()) throw py::value_error(s.message());
    return bytes;
  });
  m.def("format_byte_size", &dsa::format_byte_size);

  py::class_<PyAttention>(m, "Attention")
      .def(py::init<const dsa::Plan&>(), py::arg("plan"))
      .def("step", [](PyAttention& self, py::dict a, uintptr_t stream, const std::string& call) {
        // call: "step" (one layer's whole step), "prepare" (the batch fields only) or "run"
        // (a layer over the prepared batch): dsa/layer.h.
        if (call != "step" && call != "prepare" && call != "run")
          throw py::value_error("attention_step: call: expected 'step', 'prepare' or 'run', got '" + call + "'");
        const bool batch_only = call == "prepare";
        Importer im(kStep, stream);  // one prefix for every refusal of the step
        dsa::StepParams p;
        const std::string role = get<std::string>(a, "role", "full", kStep);
        if (role == "full") p.role = dsa::IndexerRole::kFull;
        else if (role == "shared") p.role = dsa::IndexerRole::kShared;
        else if (role == "mtp") p.role = dsa::IndexerRole::kMtp;
        else throw py::value_error("attention_step: role: expected 'full', 'shared' or 'mtp', got '" + role + "'");
        p.q_lens = im.tensor(item(a, "q_lens"), "q_lens");
        p.cu_seqlens = im.tensor(item(a, "cu_seqlens"), "cu_seqlens");
        p.kv_lens = im.tensor(item(a, "kv_lens"), "kv_lens");
        p.next_n = get<int64_t>(a, "next_n", 0, kStep);
        p.device_lengths = p.next_n > 0;  // graph-stable decode (dsa/layer.h)
        p.block_table = im.tensor(item(a, "block_table"), "block_table");
        p.positions = im.tensor(item(a, "positions"), "positions");
        p.slot_mapping = im.tensor(item(a, "slot_mapping"), "slot_mapping");
        p.kv_c = im.tensor(item(a, "kv_c"), "kv_c", Reinterpret::kBF16);
        p.k_pe = im.tensor(item(a, "k_pe"), "k_pe", Reinterpret::kBF16);
        p.q = im.tensor(item(a, "q"), "q", Reinterpret::kBF16);
        // Core mode (dsa/layer.h): the un-absorbed query and the layer's kv_b_proj instead of q.
        p.q_nope = im.tensor(item(a, "q_nope"), "q_nope", Reinterpret::kBF16);
        p.q_pe = im.tensor(item(a, "q_pe"), "q_pe", Reinterpret::kBF16);
        p.kv_b_proj = im.tensor(item(a, "kv_b_proj"), "kv_b_proj", Reinterpret::kBF16);
        {
          const std::string form = get<std::string>(a, "dense_form", "auto", kStep);
          if (form == "auto") p.dense_form = dsa::DenseForm::kAuto;
          else if (form == "mha") p.dense_form = dsa::DenseForm::kMha;
          else if (form == "absorbed") p.dense_form = dsa::DenseForm::kAbsorbed;
          else throw py::value_error("attention_step: dense_form: expected 'auto', 'mha' or 'absorbed', got '" + form + "'");
        }
        p.index_q = im.tensor(item(a, "index_q"), "index_q", Reinterpret::kBF16);
        p.index_k = im.tensor(item(a, "index_k"), "index_k", Reinterpret::kBF16);
        p.index_w = im.tensor(item(a, "index_w"), "index_w", Reinterpret::kBF16);
        p.cos_sin = im.tensor(item(a, "cos_sin"), "cos_sin");
        p.hadamard = get<bool>(a, "hadamard", false, kStep);
        p.attn_sink = im.tensor(item(a, "attn_sink"), "attn_sink");
        p.sm_scale = get<float>(a, "sm_scale", 0.0f, kStep);
        const int cache_dtype = self.attn->plan().config.cache_dtype == dsa::MlaCacheDtype::kFP8 ? 1 : 0;
        const int64_t page = self.attn->plan().config.page_size;
        if (!batch_only) p.mla_cache = im.mla_cache(item(a, "mla_cache"), "mla_cache", cache_dtype, page, true);
        if (!item(a, "index_cache").is_none()) {
          p.index_cache = im.indexer_cache(item(a, "index_cache"), "index_cache", page, true);
        }
        p.indices_in = im.tensor(item(a, "indices_in"), "indices_in");
        p.indices_out = im.tensor(item(a, "indices_out"), "indices_out", Reinterpret::kNone, true);
        p.force_score = get<bool>(a, "force_score", false, kStep);
        if (!batch_only) {
          p.out = im.tensor(item(a, "out"), "out", Reinterpret::kBF16, true);
          p.lse = im.tensor(item(a, "lse"), "lse", Reinterpret::kNone, true);
        }
        p.time_stages = get<bool>(a, "time_stages", false, kStep);
        if (!item(a, "workspace").is_none()) {
          const dsa_py::Imported ws = im.raw(item(a, "workspace"), "workspace", true);
          // The step takes one flat byte range: only a C-contiguous array is one (a reversed or
          // strided view would be written past its end).
          int64_t n = ws.itemsize, expect = 1;
          for (int i = ws.ndim - 1; i >= 0; --i) {
            if (ws.shape[i] > 1 && ws.stride[i] != expect) {
              throw py::value_error("attention_step: workspace: expected a C-contiguous array (one flat byte range), got stride " +
                                    std::to_string(ws.stride[i]) + " elements in dim " + std::to_string(i) +
                                    " (use a contiguous buffer of plan.workspace_bytes bytes)");
            }
            expect *= ws.shape[i];
          }
          for (int i = 0; i < ws.ndim; ++i) {
            if (__builtin_mul_overflow(n, ws.shape[i], &n)) throw py::value_error("attention_step: workspace: its byte size overflows int64");
          }
          p.workspace = ws.data;
          p.workspace_bytes = static_cast<size_t>(n);
        }
        p.stream = reinterpret_cast<void*>(stream);
        dsa::StepReport report;
        dsa::Status s;
        {
          py::gil_scoped_release release;
          std::lock_guard<std::mutex> lock(self.mu);
          s = call == "step" ? self.attn->step(p, &report)
              : call == "prepare" ? self.attn->prepare(p, &report) : self.attn->run(p, &report);
        }
        check(s);
        return report_dict(report);
      }, py::arg("args"), py::arg("stream") = 0, py::arg("call") = "step");
}
