"""dsa.plan / dsa.Planner / dsa.Attention (the planner issue's layer step), where built in."""
import numpy as np
import pytest

import dsa
from helpers import cos_sin_table, rng

if not hasattr(dsa, "plan"):
    pytest.skip("this build has no planner (dsa/planner.h, dsa/layer.h)", allow_module_level=True)

GEOM = dict(name="deepseek-v3.2", num_heads=2, index_heads=2, topk=64)


def test_plan_reports_and_refuses():
    p = dsa.plan("deepseek-v3.2", max_tokens_per_step=512, max_context=4096, score_budget_bytes="64MiB")
    d = p.as_dict()
    assert p.workspace_bytes == d["workspace_bytes"] > 0
    assert d["score_region_bytes"] <= d["score_budget_bytes"] == 64 << 20
    assert sum(b["bytes"] for b in d["buffers"]) == d["workspace_bytes"]
    assert d["config"]["geometry"] == "deepseek-v3.2"
    q = dsa.Planner("glm-5", cache_dtype="fp8", device_memory_bytes="8GiB", max_context=8192).plan()
    assert q.kv_pages > 0 and q.config["cache_dtype"] == "fp8"
    with pytest.raises(ValueError, match="plan: cache_dtype"):
        dsa.plan(cache_dtype="e4m3")
    with pytest.raises(ValueError, match="plan: device"):
        dsa.plan(device="tpu")
    with pytest.raises(ValueError, match="plan: score_budget_bytes"):
        dsa.plan(score_budget_bytes="lots")
    with pytest.raises(ValueError):
        dsa.plan(score_budget_bytes=1)  # cannot serve the limits: names the smallest budget


def test_plan_shows_both_selection_paths():
    # GLM-5 at 128K on the CPU: rows past the cost model's crossover are fused; all 8192 rows in
    # one chunk take O(rows * topk) fused against O(rows * N) unfused (docs/fused_select.md).
    d = dsa.plan("glm-5", max_context=131072).as_dict()
    assert d["config"]["select"] == "auto" and d["fused_select"]
    assert 2048 < d["fused_min_width"] < 131072
    assert d["fused_bytes_all_rows"] < 200 << 20 < 4 << 30 < d["unfused_bytes_all_rows"]
    assert sum(b["bytes"] for b in d["fused_buffers"]) == d["fused_region_bytes"]
    u = dsa.plan("glm-5", max_context=131072, select="unfused").as_dict()
    assert not u["fused_select"] and u["fused_min_width"] is None
    with pytest.raises(ValueError, match="plan: select"):
        dsa.plan(select="sometimes")


def _step_case(seed=60, q=(3, 2), kv=(10, 100)):
    r = rng(seed)
    page = 16
    q_lens = np.array(q, np.int32)
    kv_lens = np.array(kv, np.int32)  # seq 0: kv_len <= topk (dense); seq 1: sparse
    block_table = np.array([[6, -1, -1, -1, -1, -1, -1], [0, 1, 2, 3, 4, 5, 7]], np.int32)
    mla = np.zeros((8, page, 1152), np.uint8)
    idx_cache = np.zeros((8, page, 132), np.uint8)
    cos_sin = cos_sin_table(128)
    # The cached prefix of every sequence, written with the standalone ops.
    for b in range(2):
        n = int(kv_lens[b] - q_lens[b])
        pos = np.arange(n, dtype=np.int32)
        slots = np.array([block_table[b, j // page] * page + j % page for j in pos], np.int64)
        dsa.write_mla_cache(r.standard_normal((n, 512)).astype(np.float32),
                            r.standard_normal((n, 64)).astype(np.float32), mla, slots)
        k8, ks = dsa.prepare_indexer_k(r.standard_normal((n, 128)).astype(np.float32), pos, cos_sin)
        dsa.write_indexer_cache(k8, ks, idx_cache, slots)
    T = int(q_lens.sum())
    new = dict(q=r.standard_normal((T, 2, 576)).astype(np.float32),
               kv_c=r.standard_normal((T, 512)).astype(np.float32),
               k_pe=r.standard_normal((T, 64)).astype(np.float32),
               index_q=r.standard_normal((T, 2, 128)).astype(np.float32),
               index_k=r.standard_normal((T, 128)).astype(np.float32),
               index_w=r.standard_normal((T, 2)).astype(np.float32))
    return q_lens, kv_lens, block_table, mla, idx_cache, cos_sin, new


def test_attention_step_matches_the_standalone_ops():
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case()
    plan = dsa.plan(GEOM, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=112)
    attn = dsa.Attention(plan)
    T = new["q"].shape[0]
    indices_out = np.full((T, 64), -7, np.int32)
    out, lse, report = attn.step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla,
                                 index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"],
                                 cos_sin=cos_sin, index_cache=idx_cache, sm_scale=0.1, indices_out=indices_out)
    assert report["seqs"] == {"dense": 1, "sparse": 1, "shared": 0}
    assert report["rows"] == {"dense": 3, "sparse": 2, "shared": 0}
    assert report["score_high_water_bytes"] <= report["score_budget_bytes"]
    # Dense rows: dense MLA over the cache (which now holds the new tokens too).
    d_out, d_lse = dsa.dense_mla(new["q"][:3], mla, np.array([0, 3], np.int32), None, 0.1,
                                 block_table=table[:1], kv_lens=kv_lens[:1])
    np.testing.assert_allclose(out[:3], d_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse[:3], d_lse, rtol=1e-6, atol=1e-6)
    for i in range(3):
        L = 10 - 3 + i + 1
        np.testing.assert_array_equal(indices_out[i], np.r_[np.arange(L), np.full(64 - L, -1)])
    # Sparse rows: prepare -> paged logits -> top-k -> map -> sparse MLA.
    pos = np.array([98, 99], np.int32)
    q8, w = dsa.prepare_indexer_q(new["index_q"][3:], new["index_w"][3:], pos, cos_sin)
    row_len = np.array([99, 100], np.int32)
    row_seq = np.array([1, 1], np.int32)
    logits = dsa.indexer_logits_paged(q8, w, idx_cache, table, None, width=100, row_seq=row_seq, row_len=row_len)
    local = dsa.topk(logits, row_len, 64)
    np.testing.assert_array_equal(indices_out[3:], local)
    s_out, s_lse = dsa.sparse_mla(new["q"][3:], mla, local, 0.1, block_table=table, row_seq=row_seq)
    np.testing.assert_allclose(out[3:], s_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse[3:], s_lse, rtol=1e-6, atol=1e-6)
    # time_stages is accepted everywhere; on the CPU it measures nothing on a device (the host
    # times are the device times) and leaves the outputs as they were.
    assert report["gpu_timed"] is False
    out2, lse2, rep2 = attn.step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla,
                                 index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"],
                                 cos_sin=cos_sin, index_cache=idx_cache, sm_scale=0.1, time_stages=True)
    assert rep2["gpu_timed"] is False
    for k in ("cache", "prepare", "score", "select", "map", "sparse", "dense", "total"):
        assert rep2["gpu_ms_" + k] == 0.0
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(lse2, lse)


def test_attention_step_errors_name_arguments():
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case(seed=61)
    attn = dsa.Attention(dsa.plan(GEOM, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=112))
    with pytest.raises(ValueError, match="step: role"):
        attn.step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla, role="half")
    with pytest.raises(ValueError, match="kv_lens"):
        attn.step(new["q"], new["kv_c"], new["k_pe"], q_lens, np.array([10, 1000], np.int32), table, mla,
                  index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"], cos_sin=cos_sin,
                  index_cache=idx_cache)
    with pytest.raises(TypeError, match="Attention: plan"):
        dsa.Attention("plan")


def test_prepare_once_run_per_layer_equals_step():
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case(seed=62)
    plan = dsa.plan(GEOM, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=112)
    T = new["q"].shape[0]
    layer_args = dict(index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"], cos_sin=cos_sin,
                      sm_scale=0.1)
    ref_mla, ref_idx = mla.copy(), idx_cache.copy()
    ref_ind = np.full((T, 64), -7, np.int32)
    ref_out, ref_lse, ref_rep = dsa.Attention(plan).step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table,
                                                         ref_mla, index_cache=ref_idx, indices_out=ref_ind,
                                                         **layer_args)
    attn = dsa.Attention(plan)  # one object, one workspace, every layer
    prep = attn.prepare(q_lens, kv_lens, table)
    assert prep["host_us"] > 0
    ind = np.full((T, 64), -7, np.int32)
    out, lse, rep = attn.run(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla, index_cache=idx_cache,
                             indices_out=ind, **layer_args)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_array_equal(mla, ref_mla)
    np.testing.assert_array_equal(idx_cache, ref_idx)
    assert rep["seqs"] == ref_rep["seqs"] and rep["host_us"] > 0 and rep["gpu_timed"] is False
    # The next layer (shared, over the full layer's indices) reuses the preparation.
    mla2 = mla.copy()
    out2, lse2, rep2 = attn.run(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla2, role="shared",
                                indices_in=ind, sm_scale=0.1)
    assert rep2["seqs"] == {"dense": 1, "sparse": 0, "shared": 1}
    np.testing.assert_array_equal(out2, ref_out)  # the same selection, the same keys
    # A run whose batch was not prepared is refused, naming the field.
    with pytest.raises(ValueError, match="kv_lens"):
        attn.run(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens + 1, table, mla, index_cache=idx_cache,
                 **layer_args)


def test_device_lengths_decode_equals_the_host_planned_step():
    # Graph-stable decode (next_n=, q_lens=None): every row scored, short rows the identity;
    # equal bit for bit to the host-planned step that scores everything (force_score).
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case(seed=63, q=(2, 2), kv=(10, 100))
    plan = dsa.plan(GEOM, page_size=16, max_tokens_per_step=4, max_seqs_per_step=2, max_context=112, max_next_n=2)
    T = new["q"].shape[0]
    layer_args = dict(index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"], cos_sin=cos_sin,
                      sm_scale=0.1)
    ref_mla, ref_idx, ref_ind = mla.copy(), idx_cache.copy(), np.full((T, 64), -7, np.int32)
    ref_out, ref_lse, _ = dsa.Attention(plan).step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table,
                                                   ref_mla, index_cache=ref_idx, indices_out=ref_ind,
                                                   force_score=True, **layer_args)
    attn = dsa.Attention(plan)
    attn.prepare(None, kv_lens, table, next_n=2)
    ind = np.full((T, 64), -7, np.int32)
    out, lse, rep = attn.run(new["q"], new["kv_c"], new["k_pe"], None, kv_lens, table, mla, index_cache=idx_cache,
                             indices_out=ind, next_n=2, **layer_args)
    assert rep["seqs"]["dense"] == 0 and rep["rows"]["sparse"] == T
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_array_equal(mla, ref_mla)
    np.testing.assert_array_equal(idx_cache, ref_idx)
    with pytest.raises(ValueError, match="q_lens, cu_seqlens"):
        attn.prepare(q_lens, kv_lens, table, next_n=2)
    with pytest.raises(ValueError, match="next_n"):
        attn.prepare(None, kv_lens, table, next_n=3)


def test_plan_dict_shows_the_geometry_and_memory_semantics():
    p = dsa.plan(dict(name="glm-5", num_heads=4, topk=512), max_context=8192, device_memory_bytes="8GiB")
    d = p.as_dict()
    assert d["geometry"]["name"] == "glm-5" and d["geometry"]["num_heads"] == 4 and d["geometry"]["topk"] == 512
    assert d["geometry"]["index_rope"] in ("interleaved", "half_split")
    assert d["config"]["memory_is_exact"] is False and d["config"]["kv_cache_fraction"] == 0.9
    e = dsa.plan(dict(name="glm-5", num_heads=4, topk=512), max_context=8192, device_memory_bytes="8GiB",
                 memory_is_exact=True)
    assert e.as_dict()["config"]["memory_is_exact"] is True
    assert e.kv_budget_bytes == (8 << 30) - e.workspace_bytes > p.kv_budget_bytes


def test_slot_mapping_i64_positions_and_padded_tokens():
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case(seed=64)
    plan = dsa.plan(GEOM, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=112)
    T = new["q"].shape[0]
    args = dict(index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"], cos_sin=cos_sin, sm_scale=0.1)
    pos = np.concatenate([np.arange(k - q, k) for q, k in zip(q_lens, kv_lens)]).astype(np.int64)
    seq = np.repeat(np.arange(len(q_lens)), q_lens)
    slots = np.array([table[s, p // 16] * 16 + p % 16 for s, p in zip(seq, pos)], np.int64)
    ref_mla, ref_idx, ref_ind = mla.copy(), idx_cache.copy(), np.full((T, 64), -7, np.int32)
    ref_out, ref_lse, _ = dsa.Attention(plan).step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, ref_mla,
                                                   index_cache=ref_idx, indices_out=ref_ind, **args)
    m, c, ind = mla.copy(), idx_cache.copy(), np.full((T, 64), -7, np.int32)
    out, lse, _ = dsa.Attention(plan).step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, m,
                                           index_cache=c, indices_out=ind, positions=pos, slot_mapping=slots, **args)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(m, ref_mla)
    # The last sequence padded whole: written nowhere, rows 0 / +inf / -1, others unchanged.
    padded = slots.copy()
    last = np.arange(int(np.sum(q_lens[:-1])), T)
    padded[last] = -1
    m, c, ind = mla.copy(), idx_cache.copy(), np.full((T, 64), -7, np.int32)
    out, lse, _ = dsa.Attention(plan).step(new["q"], new["kv_c"], new["k_pe"], q_lens, kv_lens, table, m,
                                           index_cache=c, indices_out=ind, slot_mapping=padded, **args)
    real = np.setdiff1d(np.arange(T), last)
    np.testing.assert_array_equal(out[real], ref_out[real])
    np.testing.assert_array_equal(lse[real], ref_lse[real])
    np.testing.assert_array_equal(ind[real], ref_ind[real])
    assert (out[last] == 0).all() and np.isposinf(lse[last]).all() and (ind[last] == -1).all()
    flat, ref_flat, old_flat = m.reshape(-1, 1152), ref_mla.reshape(-1, 1152), mla.reshape(-1, 1152)
    np.testing.assert_array_equal(flat[slots[last]], old_flat[slots[last]])
    np.testing.assert_array_equal(flat[slots[real]], ref_flat[slots[real]])


def test_core_mode_equals_latent_step_with_projections():
    # Core mode: q_nope / q_pe / kv_b_proj in, [T, H, v] out (SPEC 6). Against the latent step fed
    # q_abs = [W_UK^T q_nope | q_pe] and followed by W_UV, both projections in numpy.
    q_lens, kv_lens, table, mla, idx_cache, cos_sin, new = _step_case(seed=61, q=(9, 2), kv=(9, 100))
    r = rng(62)
    T, H, nope, v = int(q_lens.sum()), 2, 128, 128
    q_nope = (0.5 * r.standard_normal((T, H, nope))).astype(np.float32)
    q_pe = (0.5 * r.standard_normal((T, H, 64))).astype(np.float32)
    w32 = (0.06 * r.standard_normal((H * (nope + v), 512))).astype(np.float32)
    w_bf16 = (w32.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16
    w = (w_bf16.astype(np.uint32) << 16).view(np.float32).reshape(H, nope + v, 512).astype(np.float64)
    w_uk, w_uv = w[:, :nope, :], w[:, nope:, :]
    q_abs = np.concatenate([np.einsum("thd,hdc->thc", q_nope.astype(np.float64), w_uk), q_pe], axis=2).astype(np.float32)
    plan = dsa.plan(GEOM, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=112, core_mode=True)
    assert plan.as_dict()["core_bytes"] > 0 and plan.as_dict()["config"]["core_mode"] is True
    attn = dsa.Attention(plan)
    common = dict(index_q=new["index_q"], index_k=new["index_k"], index_w=new["index_w"], cos_sin=cos_sin,
                  sm_scale=0.1)
    mla0, idx0 = mla.copy(), idx_cache.copy()
    lat, lat_lse, _ = attn.step(q_abs, new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla, index_cache=idx_cache, **common)
    ref = np.einsum("thc,hvc->thv", lat.astype(np.float64), w_uv)
    for form, mha_seqs in (("absorbed", 0), ("auto", 1)):
        m, ic = mla0.copy(), idx0.copy()
        out, lse, rep = attn.step(None, new["kv_c"], new["k_pe"], q_lens, kv_lens, table, m, index_cache=ic,
                                  q_nope=q_nope, q_pe=q_pe, kv_b_proj=w_bf16, dense_form=form, **common)
        assert out.shape == (T, H, v) and out.dtype == np.float32
        assert rep["mha_seqs"] == mha_seqs, form  # the fresh 9-token prompt goes MHA under "auto"
        np.testing.assert_array_equal(m, mla)
        scale = np.abs(ref).max(axis=2, keepdims=True)
        # absorbed: f32 sums in another order than numpy's; MHA rows also round K/V to bf16.
        tol = (1e-5 if form == "absorbed" else 2 ** -6) * scale + 1e-6
        assert np.all(np.abs(out - ref) <= tol), form
        np.testing.assert_allclose(lse, lat_lse, atol=1e-5 if form == "absorbed" else 2e-2)
    with pytest.raises(ValueError, match="attention_step: dense_form"):
        attn.step(None, new["kv_c"], new["k_pe"], q_lens, kv_lens, table, mla0.copy(), index_cache=idx0.copy(),
                  q_nope=q_nope, q_pe=q_pe, kv_b_proj=w_bf16, dense_form="fast", **common)
