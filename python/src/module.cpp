// dsa._dsa: thin bindings over the public C++ API. Every tensor argument (inputs, outputs and
// caches) arrives already allocated; the Python layer (dsa/_ops.py) picks defaults and
// allocates outputs in the caller's framework. Here: import without copying, fill the params,
// run the op with the GIL released, and turn a failed Status into a Python exception.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "dsa/dsa.h"
#include "tensor_import.h"

namespace py = pybind11;
using dsa_py::Importer;
using dsa_py::Reinterpret;

namespace {

// A vector, not an initializer_list: lambdas below keep their own copy beyond module init.
using Renames = std::vector<std::pair<const char*, const char*>>;

// The core names some arguments after their params fields ("kv.flat", "where.slots",
// "logits"); the Python functions call them otherwise. Rewrite "op: from:" to "op: to:".
std::string python_names(std::string msg, const Renames& renames) {
  for (const auto& r : renames) {
    const std::string from = std::string(": ") + r.first + ":";
    const std::string from_idx = std::string(": ") + r.first + "[";
    for (const std::string& f : {from, from_idx}) {
      const auto pos = msg.find(f);
      if (pos != std::string::npos) {
        msg.replace(pos, f.size(), std::string(": ") + r.second + f.substr(f.size() - 1));
        break;
      }
    }
  }
  return msg;
}

void check(const dsa::Status& s, const Renames& renames = {}) {
  if (s.ok()) return;
  const std::string msg = python_names(s.message(), renames);
  switch (s.code()) {
    case dsa::StatusCode::kInvalidArgument:
      if (msg.find(": expected dtype ") != std::string::npos) throw py::type_error(msg);
      throw py::value_error(msg);
    case dsa::StatusCode::kLimitExceeded:
    case dsa::StatusCode::kWorkspaceTooSmall:
      throw py::value_error(python_names(s.to_string(), renames));
    case dsa::StatusCode::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, python_names(s.to_string(), renames).c_str());
      throw py::error_already_set();
    case dsa::StatusCode::kOutOfMemory:
      PyErr_SetString(PyExc_MemoryError, python_names(s.to_string(), renames).c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(python_names(s.to_string(), renames));
  }
}

template <typename F>
dsa::Status run_nogil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

void* as_stream(uintptr_t s) { return reinterpret_cast<void*>(s); }

// Scratch memory for ops that need it: allocated by the Python layer in the inputs' framework
// (so it lives in torch's caching allocator, also under CUDA-graph capture).
void* workspace(Importer& im, const py::object& alloc, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (alloc.is_none()) throw py::value_error("workspace: the call needs scratch memory but got no allocator");
  py::object buf = alloc(py::int_(bytes));
  return im.raw(buf, "workspace", true).data;
}

// The inputs both paged scorers take (indexer_logits_paged, indexer_topk).
template <typename P>
void import_paged(Importer& im, P* p, py::object q, py::object weights, py::object cache, int64_t page_size,
                  py::object block_table, py::object kv_lens, int64_t next_n, py::object row_seq, py::object row_len) {
  p->q = im.tensor(q, "q", Reinterpret::kE4M3);
  p->weights = im.tensor(weights, "weights");
  p->cache = im.indexer_cache(cache, "cache", page_size);
  p->block_table = im.tensor(block_table, "block_table");
  p->kv_lens = im.tensor(kv_lens, "kv_lens");
  p->next_n = next_n;
  p->row_seq = im.tensor(row_seq, "row_seq");
  p->row_len = im.tensor(row_len, "row_len");
}

}  // namespace

#if defined(DSA_PY_HAVE_LAYER)
void bind_layer(py::module_& m);  // layer_bindings.cpp
#endif

PYBIND11_MODULE(_dsa, m) {
  m.doc() = "DSA core bindings (internal: use the functions of the dsa package).";

  m.def("version", [] { return std::string(dsa::version()); });
  m.def("compiled_backends", &dsa::compiled_backends);
  m.def("cuda_available", &dsa::cuda_available);
  m.def("set_num_threads", [](int n) { check(dsa::set_num_threads(n)); }, py::arg("n"));
  m.def("num_threads", &dsa::num_threads);
  m.def("list_devices", [] {
    py::list out;
    for (const auto& d : dsa::list_devices()) {
      py::dict e;
      e["device"] = std::string(dsa::device_type_name(d.device.type)) +
                    (d.device.type == dsa::DeviceType::kCUDA ? ":" + std::to_string(d.device.index) : "");
      e["name"] = d.name;
      e["compute_capability"] = d.compute_capability;
      e["multiprocessors"] = d.multiprocessors;
      e["memory_bytes"] = d.memory_bytes;
      out.append(e);
    }
    return out;
  });
  m.def("geometry_preset_names", &dsa::geometry_preset_names);
  m.def("geometry_preset", [](const std::string& name) {
    dsa::ModelGeometry g;
    const dsa::Status s = dsa::geometry_preset(name, &g);
    if (!s.ok()) throw py::value_error("geometry_preset: name: " + s.message());
    py::dict d;
    d["name"] = g.name;
    d["num_heads"] = g.num_heads;
    d["kv_lora_rank"] = g.kv_lora_rank;
    d["qk_rope_head_dim"] = g.qk_rope_head_dim;
    d["qk_nope_head_dim"] = g.qk_nope_head_dim;
    d["v_head_dim"] = g.v_head_dim;
    d["q_lora_rank"] = g.q_lora_rank;
    d["index_heads"] = g.index_heads;
    d["index_head_dim"] = g.index_head_dim;
    d["topk"] = g.topk;
    d["index_rope"] = g.index_rope == dsa::RopeStyle::kInterleaved ? "interleaved" : "half_split";
    d["num_layers"] = g.num_layers;
    d["num_mtp_layers"] = g.num_mtp_layers;
    d["shared_indexer_pattern"] = g.shared_indexer_pattern;
    d["max_positions"] = g.max_positions;
    d["sm_scale"] = g.sm_scale;
    py::list roles;
    for (int i = 0; i < g.num_layers + g.num_mtp_layers; ++i) roles.append(dsa::indexer_role_name(g.layer_role(i)));
    d["layer_roles"] = roles;
    return d;
  }, py::arg("name"));

  // ---- indexer ------------------------------------------------------------------------
  m.def("quantize_fp8", [](py::object x, int64_t group, py::object out, py::object scale, uintptr_t stream) {
    Importer im("quantize_fp8", stream);
    dsa::QuantizeFp8Params p;
    p.x = im.tensor(x, "x", Reinterpret::kBF16);
    p.out = im.tensor(out, "out", Reinterpret::kE4M3, true);
    p.scale = im.tensor(scale, "scale", Reinterpret::kNone, true);
    p.group = group;
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::quantize_fp8(p); }));
  });

  m.def("prepare_indexer_q", [](py::object q, py::object weights, py::object positions, py::object cos_sin,
                                int rope, bool hadamard, py::object q_out, py::object weights_out,
                                py::object q_scale, uintptr_t stream) {
    Importer im("prepare_indexer_q", stream);
    dsa::PrepareIndexerQParams p;
    p.q = im.tensor(q, "q", Reinterpret::kBF16);
    p.weights = im.tensor(weights, "weights", Reinterpret::kBF16);
    p.positions = im.tensor(positions, "positions");
    p.cos_sin = im.tensor(cos_sin, "cos_sin");
    p.rope = static_cast<dsa::RopeStyle>(rope);
    p.hadamard = hadamard;
    p.q_out = im.tensor(q_out, "q_out", Reinterpret::kE4M3, true);
    p.weights_out = im.tensor(weights_out, "weights_out", Reinterpret::kNone, true);
    p.q_scale = im.tensor(q_scale, "q_scale", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::prepare_indexer_q(p); }));
  });

  m.def("prepare_indexer_k", [](py::object k, py::object positions, py::object cos_sin, int rope, bool hadamard,
                                py::object k_out, py::object k_scale, uintptr_t stream) {
    Importer im("prepare_indexer_k", stream);
    dsa::PrepareIndexerKParams p;
    p.k = im.tensor(k, "k", Reinterpret::kBF16);
    p.positions = im.tensor(positions, "positions");
    p.cos_sin = im.tensor(cos_sin, "cos_sin");
    p.rope = static_cast<dsa::RopeStyle>(rope);
    p.hadamard = hadamard;
    p.k_out = im.tensor(k_out, "k_out", Reinterpret::kE4M3, true);
    p.k_scale = im.tensor(k_scale, "k_scale", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::prepare_indexer_k(p); }));
  });

  m.def("indexer_logits", [](py::object q, py::object weights, py::object k, py::object k_scale, py::object ks,
                             py::object ke, int64_t col_offset, py::object logits, uintptr_t stream) {
    Importer im("indexer_logits", stream);
    dsa::IndexerLogitsParams p;
    p.q = im.tensor(q, "q", Reinterpret::kE4M3);
    p.weights = im.tensor(weights, "weights");
    p.k = im.tensor(k, "k", Reinterpret::kE4M3);
    p.k_scale = im.tensor(k_scale, "k_scale");
    p.ks = im.tensor(ks, "ks");
    p.ke = im.tensor(ke, "ke");
    p.col_offset = col_offset;
    p.logits = im.tensor(logits, "out", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::indexer_logits(p); }), {{"logits", "out"}});
  });

  m.def("indexer_logits_paged", [](py::object q, py::object weights, py::object cache, int64_t page_size,
                                   py::object block_table, py::object kv_lens, int64_t next_n, py::object row_seq,
                                   py::object row_len, int64_t col_offset, py::object logits, uintptr_t stream) {
    Importer im("indexer_logits_paged", stream);
    dsa::IndexerLogitsPagedParams p;
    import_paged(im, &p, q, weights, cache, page_size, block_table, kv_lens, next_n, row_seq, row_len);
    p.col_offset = col_offset;
    p.logits = im.tensor(logits, "out", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::indexer_logits_paged(p); }), {{"logits", "out"}});
  });

  m.def("indexer_topk", [](py::object q, py::object weights, py::object cache, int64_t page_size,
                           py::object block_table, py::object kv_lens, int64_t next_n, py::object row_seq,
                           py::object row_len, int64_t width, int64_t k, py::object indices, py::object alloc,
                           uintptr_t stream) {
    Importer im("indexer_topk", stream);
    dsa::IndexerTopkParams p;
    import_paged(im, &p, q, weights, cache, page_size, block_table, kv_lens, next_n, row_seq, row_len);
    p.width = width;
    p.k = k;
    p.indices = im.tensor(indices, "out", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    p.workspace_bytes = dsa::indexer_topk_workspace_size(p);
    p.workspace = workspace(im, alloc, p.workspace_bytes);
    check(run_nogil([&] { return dsa::indexer_topk(p); }), {{"indices", "out"}});
  });

  // ---- top-k and index mapping ------------------------------------------------------------
  m.def("topk", [](py::object logits, py::object lengths, int64_t k, py::object indices, py::object values,
                   py::object alloc, uintptr_t stream) {
    Importer im("topk", stream);
    dsa::TopkParams p;
    p.logits = im.tensor(logits, "logits");
    p.lengths = im.tensor(lengths, "lengths");
    p.k = k;
    p.indices = im.tensor(indices, "out", Reinterpret::kNone, true);
    p.values = im.tensor(values, "values", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    p.workspace_bytes = dsa::topk_workspace_size(p);
    p.workspace = workspace(im, alloc, p.workspace_bytes);
    check(run_nogil([&] { return dsa::topk(p); }), {{"indices", "out"}});
  });

  m.def("map_indices", [](py::object indices, py::object row_seq, int64_t rows_per_seq, py::object kv_start,
                          py::object block_table, int64_t page_size, int64_t num_blocks, py::object out,
                          uintptr_t stream) {
    Importer im("map_indices", stream);
    dsa::MapIndicesParams p;
    p.indices = im.tensor(indices, "indices");
    p.row_seq = im.tensor(row_seq, "row_seq");
    p.rows_per_seq = rows_per_seq;
    p.kind = block_table.is_none() ? dsa::IndexMapKind::kFlat : dsa::IndexMapKind::kPaged;
    p.kv_start = im.tensor(kv_start, "kv_start");
    p.block_table = im.tensor(block_table, "block_table");
    p.page_size = page_size;
    p.num_blocks = num_blocks;
    p.out = im.tensor(out, "out", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::map_indices(p); }));
  });

  // ---- caches -------------------------------------------------------------------------------
  auto where = [](Importer& im, py::object slots, py::object block_table, py::object token_seq, py::object token_pos) {
    dsa::CacheSlots w;
    w.slots = im.tensor(slots, "slots");
    w.block_table = im.tensor(block_table, "block_table");
    w.token_seq = im.tensor(token_seq, "token_seq");
    w.token_pos = im.tensor(token_pos, "token_pos");
    return w;
  };
  const Renames where_names = {{"where.slots", "slots"}, {"where.block_table", "block_table"},
                               {"where.token_seq", "token_seq"}, {"where.token_pos", "token_pos"},
                               {"where", "slots"}};

  m.def("write_indexer_cache", [where, where_names](py::object k, py::object k_scale, py::object cache, int64_t page_size,
                                                    py::object slots, py::object block_table, py::object token_seq,
                                                    py::object token_pos, uintptr_t stream) {
    Importer im("write_indexer_cache", stream);
    dsa::WriteIndexerCacheParams p;
    p.k = im.tensor(k, "k", Reinterpret::kE4M3);
    p.k_scale = im.tensor(k_scale, "k_scale");
    p.cache = im.indexer_cache(cache, "cache", page_size, true);
    p.where = where(im, slots, block_table, token_seq, token_pos);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::write_indexer_cache(p); }), where_names);
  });

  m.def("write_mla_cache", [where, where_names](py::object kv_c, py::object k_pe, py::object cache, int cache_dtype,
                                                int64_t page_size, py::object slots, py::object block_table,
                                                py::object token_seq, py::object token_pos, uintptr_t stream) {
    Importer im("write_mla_cache", stream);
    dsa::WriteMlaCacheParams p;
    p.kv_c = im.tensor(kv_c, "kv_c", Reinterpret::kBF16);
    p.k_pe = im.tensor(k_pe, "k_pe", Reinterpret::kBF16);
    p.cache = im.mla_cache(cache, "cache", cache_dtype, page_size, true);
    p.where = where(im, slots, block_table, token_seq, token_pos);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::write_mla_cache(p); }), where_names);
  });

  m.def("read_mla_cache", [](py::object cache, int cache_dtype, int64_t page_size, py::object slots, py::object out,
                             uintptr_t stream) {
    Importer im("read_mla_cache", stream);
    dsa::ReadMlaCacheParams p;
    p.cache = im.mla_cache(cache, "cache", cache_dtype, page_size);
    p.slots = im.tensor(slots, "slots");
    p.out = im.tensor(out, "out", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::read_mla_cache(p); }));
  });

  m.def("read_indexer_cache", [](py::object cache, int64_t page_size, py::object slots, py::object k,
                                 py::object k_scale, uintptr_t stream) {
    Importer im("read_indexer_cache", stream);
    dsa::ReadIndexerCacheParams p;
    p.cache = im.indexer_cache(cache, "cache", page_size);
    p.slots = im.tensor(slots, "slots");
    p.k = im.tensor(k, "k", Reinterpret::kE4M3, true);
    p.k_scale = im.tensor(k_scale, "k_scale", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    check(run_nogil([&] { return dsa::read_indexer_cache(p); }));
  });

  // ---- attention ----------------------------------------------------------------------------
  // kv: a flat [S, 576] tensor (2 dims) or a paged MLA cache (3 dims).
  auto mla_kv = [](Importer& im, py::object kv, int cache_dtype, int64_t page_size) {
    dsa::MlaKv k;
    if (kv.is_none()) throw py::value_error(std::string(im.op()) + ": kv: is required");
    const bool flat = py::hasattr(kv, "shape") && py::len(kv.attr("shape")) == 2;
    if (flat) k.flat = im.tensor(kv, "kv", Reinterpret::kBF16);
    else k.paged = im.mla_cache(kv, "kv", cache_dtype, page_size);
    return k;
  };
  const Renames attn_names = {{"kv.flat", "kv"}, {"kv.paged", "kv"}};

  m.def("sparse_mla", [mla_kv, attn_names](py::object q, py::object kv, int cache_dtype, int64_t page_size,
                                           py::object indices, py::object topk_length, py::object attn_sink,
                                           float sm_scale, py::object out, py::object lse, py::object alloc,
                                           uintptr_t stream) {
    Importer im("sparse_mla", stream);
    dsa::SparseMlaParams p;
    p.q = im.tensor(q, "q", Reinterpret::kBF16);
    p.kv = mla_kv(im, kv, cache_dtype, page_size);
    p.indices = im.tensor(indices, "indices");
    p.topk_length = im.tensor(topk_length, "topk_length");
    p.attn_sink = im.tensor(attn_sink, "attn_sink");
    p.sm_scale = sm_scale;
    p.out = im.tensor(out, "out", Reinterpret::kBF16, true);
    p.lse = im.tensor(lse, "lse", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    p.workspace_bytes = dsa::sparse_mla_workspace_size(p);
    p.workspace = workspace(im, alloc, p.workspace_bytes);
    check(run_nogil([&] { return dsa::sparse_mla(p); }), attn_names);
  });

  m.def("dense_mla", [mla_kv, attn_names](py::object q, py::object kv, int cache_dtype, int64_t page_size,
                                          py::object cu_seqlens_q, py::object cu_seqlens_k, py::object block_table,
                                          py::object kv_lens, py::object attn_sink, float sm_scale, py::object out,
                                          py::object lse, py::object alloc, uintptr_t stream) {
    Importer im("dense_mla", stream);
    dsa::DenseMlaParams p;
    p.q = im.tensor(q, "q", Reinterpret::kBF16);
    p.kv = mla_kv(im, kv, cache_dtype, page_size);
    p.cu_seqlens_q = im.tensor(cu_seqlens_q, "cu_seqlens_q");
    p.cu_seqlens_k = im.tensor(cu_seqlens_k, "cu_seqlens_k");
    p.block_table = im.tensor(block_table, "block_table");
    p.kv_lens = im.tensor(kv_lens, "kv_lens");
    p.attn_sink = im.tensor(attn_sink, "attn_sink");
    p.sm_scale = sm_scale;
    p.out = im.tensor(out, "out", Reinterpret::kBF16, true);
    p.lse = im.tensor(lse, "lse", Reinterpret::kNone, true);
    p.stream = as_stream(stream);
    p.workspace_bytes = dsa::dense_mla_workspace_size(p);
    p.workspace = workspace(im, alloc, p.workspace_bytes);
    check(run_nogil([&] { return dsa::dense_mla(p); }), attn_names);
  });

#if defined(DSA_PY_HAVE_LAYER)
  bind_layer(m);
#endif
}
