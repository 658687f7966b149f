"""The framework-free pieces of dsa.integrations.transformers (numpy; no torch or transformers):
weight splitting, RoPE, the cos_sin table, batch compaction, pages, config checks, and one MLA
layer pair (full + shared) through the real layer step against a float64 reference, over a
padded prefill and decode steps."""
from types import SimpleNamespace

import numpy as np
import pytest

import dsa
from dsa.integrations import _mla_math as mm
from dsa.integrations import _paged
from helpers import rng

import oracle


def bf16_round(x):
    return oracle.bf16_bits_to_f64(oracle.f32_to_bf16_bits(np.asarray(x, np.float32))).astype(np.float32)


def test_split_kv_b_views_the_per_head_blocks():
    r = rng(1)
    H, nope, v, R = 3, 5, 4, 8
    uk = r.standard_normal((H, nope, R))
    uv = r.standard_normal((H, v, R))
    w = np.concatenate([np.concatenate([uk[h], uv[h]], 0) for h in range(H)], 0)  # [H*(nope+v), R]
    a, b = mm.split_kv_b(w, H, nope, v)
    np.testing.assert_array_equal(a, uk)
    np.testing.assert_array_equal(b, uv)
    # kv_b_proj(c)[h*(nope+v) : ...] is W_UK[h] c then W_UV[h] c: what the model expands.
    c = r.standard_normal(R)
    full = (w @ c).reshape(H, nope + v)
    np.testing.assert_allclose(full[:, :nope], np.einsum("hnc,c->hn", a, c))
    with pytest.raises(ValueError, match="kv_b_proj.weight"):
        mm.split_kv_b(w[:-1], H, nope, v)


def _hf_cos_sin(inv, pos, scale=1.0):
    f = np.asarray(pos, np.float64)[:, None] * np.asarray(inv, np.float64)[None, :]
    emb = np.concatenate([f, f], 1)
    return np.cos(emb) * scale, np.sin(emb) * scale


def test_rope_styles_against_complex_rotation():
    r = rng(2)
    inv = 10000.0 ** (-np.arange(32) / 32.0)
    pos = np.arange(7)
    cos, sin = _hf_cos_sin(inv, pos)
    x = r.standard_normal((7, 64))
    y = r.standard_normal((7, 64))
    ang = pos[:, None] * inv[None, :]
    rot = np.exp(1j * ang)
    # half-split: pairs (i, i+32)
    zh = (x[:, :32] + 1j * x[:, 32:]) * rot
    np.testing.assert_allclose(mm.rope(x, cos, sin, "half_split"), np.concatenate([zh.real, zh.imag], 1), atol=1e-12)
    # interleaved: pairs (2i, 2i+1), returned as [evens | odds]
    zi = (x[:, 0::2] + 1j * x[:, 1::2]) * rot
    np.testing.assert_allclose(mm.rope(x, cos, sin, "interleaved"), np.concatenate([zi.real, zi.imag], 1), atol=1e-12)
    # the permutation is shared by q and k: dot products equal the in-place interleaved rotation's
    wi = (y[:, 0::2] + 1j * y[:, 1::2]) * rot
    dots = np.sum(zi.real * wi.real + zi.imag * wi.imag, axis=1)
    got = np.sum(mm.rope(x, cos, sin, "interleaved") * mm.rope(y, cos, sin, "interleaved"), axis=1)
    np.testing.assert_allclose(got, dots, rtol=1e-12)
    with pytest.raises(ValueError, match="style"):
        mm.rope(x, cos, sin, "neox")


def test_cos_sin_table_from_the_models_cos_sin():
    inv = (1.0 / 8e6) ** (np.arange(32) / 32.0)
    pos = np.arange(50)
    cos, sin = _hf_cos_sin(inv, pos, scale=1.25)   # attention scaling (YaRN mscale) comes along
    t = mm.cos_sin_table(cos, sin)
    assert t.shape == (50, 64) and t.dtype == np.float32
    np.testing.assert_allclose(t[:, :32], 1.25 * np.cos(pos[:, None] * inv[None, :]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(t[:, 32:], 1.25 * np.sin(pos[:, None] * inv[None, :]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(mm.cos_sin_from_inv_freq(inv, 50, 1.25), t, rtol=2e-5, atol=2e-5)
    bad = np.concatenate([cos[:, 0::2], cos[:, 1::2]], 1)  # not cat(freqs, freqs)
    with pytest.raises(mm.UnsupportedModelError, match="cat\\(freqs, freqs\\)"):
        mm.cos_sin_table(bad, bad)


def test_compact_batch_left_right_padding_and_decode():
    valid = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    c = mm.compact_batch(valid, [0, 0, 0])
    np.testing.assert_array_equal(c["q_lens"], [3, 5, 2])
    np.testing.assert_array_equal(c["kv_lens"], [3, 5, 2])
    np.testing.assert_array_equal(c["sel"], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(c["pos"], [0, 1, 2, 0, 1, 2, 3, 4, 0, 1])
    np.testing.assert_array_equal(c["seq"], [0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
    assert not c["all_valid"]
    d = mm.compact_batch(np.ones((3, 1), bool), c["kv_lens"])
    np.testing.assert_array_equal(d["q_lens"], [1, 1, 1])
    np.testing.assert_array_equal(d["kv_lens"], [4, 6, 3])
    np.testing.assert_array_equal(d["pos"], [3, 5, 2])
    assert d["all_valid"]


def test_page_table_hands_out_pages_in_order():
    t = mm.PageTable(2, 4)
    assert t.reserve([5, 3]) == 3
    np.testing.assert_array_equal(t.block_table(), [[0, 1], [2, -1]])
    assert t.reserve([6, 9]) == 5
    np.testing.assert_array_equal(t.block_table(), [[0, 1, -1], [2, 3, 4]])
    np.testing.assert_array_equal(t.slots([0, 1, 1], [5, 4, 8]), [5, 12, 16])


def _config(**over):
    c = dict(num_attention_heads=4, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=48,
             q_lora_rank=64, index_n_heads=8, index_head_dim=128, index_topk=64, num_hidden_layers=3,
             max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    c.update(over)
    return SimpleNamespace(**c)


def test_geometry_from_config_and_its_refusals():
    g = mm.geometry_from_config(_config(), "glm-5", index_rope="half_split")
    assert g["num_heads"] == 4 and g["topk"] == 64 and g["qk_nope_head_dim"] == 32 and g["v_head_dim"] == 48
    assert dsa.plan(g, page_size=16, max_tokens_per_step=64, max_seqs_per_step=4, max_context=256).workspace_bytes > 0
    with pytest.raises(mm.UnsupportedModelError) as e:
        mm.geometry_from_config(_config(kv_lora_rank=256, index_topk=100,
                                        rope_parameters={"rope_type": "dynamic"}), "deepseek-v3.2", index_rope="half_split")
    msg = str(e.value)
    assert "config.kv_lora_rank = 256" in msg and "config.index_topk = 100" in msg and "'dynamic'" in msg
    with pytest.raises(mm.UnsupportedModelError, match="q_lora_rank"):
        mm.geometry_from_config(_config(q_lora_rank=None), "glm-5", index_rope="half_split")
    assert mm.indexer_roles(_config(), 3) == ["full"] * 3
    assert mm.indexer_roles(_config(indexer_types=["full", "shared", "full"]), 3) == ["full", "shared", "full"]
    with pytest.raises(mm.UnsupportedModelError, match="indexer_types\\[0\\]"):
        mm.indexer_roles(_config(indexer_types=["shared", "full", "full"]), 3)


def test_detect_rope_styles_reads_code_not_comments():
    ds_attn = "def forward(self, x):\n    # not interleaved here\n    q, k = apply_rotary_pos_emb_interleave(q, k, cos, sin)\n"
    ds_idx = ('def forward(self, x):\n    """The indexer uses NON-interleaved RoPE."""\n'
              '    q, k = apply_rotary_pos_emb(q, k, cos, sin)\n    s = F.relu(s)\n')
    mla, idx, notes = mm.detect_rope_styles("deepseek-v3.2", _config(), ds_attn, ds_idx)
    assert (mla, idx) == ("interleaved", "half_split") and len(notes) == 1
    glm_idx_norelu = "def forward(self, x):\n    q = apply_rotary_pos_emb(q, cos, sin)\n    return q\n"
    mla, idx, notes = mm.detect_rope_styles("glm-5", _config(), "def f():\n    y = apply_rotary_pos_emb(x)\n",
                                            glm_idx_norelu)
    assert (mla, idx) == ("half_split", "half_split") and any("ReLU" in n for n in notes)
    flag = "def f(self):\n    if self.config.rope_interleave:\n        pass\n"
    assert mm.detect_rope_styles("glm-5", _config(rope_interleave=False), flag, None)[0] == "half_split"
    assert mm.detect_rope_styles("glm-5", _config(rope_interleave=True), flag, None)[0] == "interleaved"
    assert mm.detect_rope_styles("deepseek-v3.2", _config(), None, None)[:2] == ("interleaved", "half_split")


# ---- one full + one shared layer through the real layer step ------------------------------

needs_step = pytest.mark.skipif(not hasattr(dsa, "Attention"), reason="this build has no layer step")

H, NOPE, V, HI, TOPK, PAGE = 2, 16, 24, 4, 64, 16


class _Seq:
    """Per-token random inputs of one sequence (the same tokens whatever the step split)."""

    def __init__(self, r, n, cos_sin):
        self.q_nope = r.standard_normal((n, H, NOPE)).astype(np.float32)
        self.q_pe_raw = r.standard_normal((n, H, 64)).astype(np.float32)
        self.kv_c = bf16_round(r.standard_normal((n, 512)))
        self.k_pe_raw = r.standard_normal((n, 64)).astype(np.float32)
        self.iq = bf16_round(r.standard_normal((n, HI, 128)))
        self.ik = bf16_round(r.standard_normal((n, 128)))
        self.iw = r.standard_normal((n, HI)).astype(np.float32)


def _rot(x, pos, cos_sin, style):
    c = cos_sin[pos][:, :32]
    s = cos_sin[pos][:, 32:]
    cos = np.concatenate([c, c], 1)
    sin = np.concatenate([s, s], 1)
    if x.ndim == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    return mm.rope(x.astype(np.float64), cos, sin, style)


def _ref_indexer(sq, i, L, cos_sin):
    """Exact scores of token i against keys 0..L-1 (SPEC 3 without FP8), half-split RoPE."""
    pos = np.arange(L)
    q = np.concatenate([_rot(sq.iq[i:i + 1, :, :64], np.array([i]), cos_sin, "half_split"),
                        sq.iq[i:i + 1, :, 64:].astype(np.float64)], -1)[0]
    k = np.concatenate([_rot(sq.ik[:L, :64], pos, cos_sin, "half_split"), sq.ik[:L, 64:].astype(np.float64)], -1)
    d = np.maximum(q @ k.T, 0.0)  # [HI, L]
    w = sq.iw[i].astype(np.float64) * 128 ** -0.5 * HI ** -0.5
    return w @ d


def _ref_attention(sq, i, keys, w_uk, w_uv, sm, cos_sin):
    """float64 MLA in the expanded (per-head K/V) form of the model for token i over keys."""
    keys = np.asarray(keys)
    qpe = _rot(sq.q_pe_raw[i:i + 1], np.array([i]), cos_sin, "interleaved")[0]  # [H, 64]
    kpe = _rot(sq.k_pe_raw[keys], keys, cos_sin, "interleaved")                  # [n, 64]
    kpe = bf16_round(kpe).astype(np.float64)  # the MLA cache holds rope(k_pe) in bf16
    ckv = sq.kv_c[keys].astype(np.float64)
    out = np.zeros((H, V))
    for h in range(H):
        k_nope = ckv @ w_uk[h].T          # [n, NOPE]
        v = ckv @ w_uv[h].T               # [n, V]
        s = sm * (k_nope @ sq.q_nope[i, h] + kpe @ qpe[h])
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v
    return out


@needs_step
def test_full_and_shared_layer_over_padded_prefill_and_decode():
    r = rng(7)
    lens0 = [100, 40]                      # seq 0 sparse (> topk), seq 1 dense
    steps = 3
    inv = 10000.0 ** (-np.arange(32) / 32.0)
    cos_sin = mm.cos_sin_from_inv_freq(inv, 256)
    seqs = [_Seq(r, n + steps, cos_sin) for n in lens0]
    kvb = (r.standard_normal((H * (NOPE + V), 512)) / 16).astype(np.float32)
    w_uk, w_uv = mm.split_kv_b(kvb, H, NOPE, V)
    sm = 0.1
    geom = dict(name="glm-5", num_heads=H, qk_nope_head_dim=NOPE, v_head_dim=V, index_heads=HI, topk=TOPK,
                index_rope="half_split", num_layers=2, num_mtp_layers=0, shared_indexer_pattern=False, max_positions=256)
    plan = dsa.plan(geom, page_size=PAGE, max_tokens_per_step=256, max_seqs_per_step=4, max_context=256)
    runner = _paged.StepRunner(plan, hadamard=True)
    kv = _paged.PagedKV(["full", "shared"], 2, page_size=PAGE)

    # Calls: a left-padded prefill [2, 100], then `steps` decode calls [2, 1].
    calls = [(np.array([[True] * 100, [False] * 60 + [True] * 40]), None)] + [(np.ones((2, 1), bool), None)] * steps
    done = [0, 0]
    recall = []
    for valid, _ in calls:
        c = kv.begin(valid)
        T = int(c["q_lens"].sum())
        tok = [(int(b), int(p)) for b, p in zip(c["seq"], c["pos"])]
        runner.begin(c["q_lens"], c["kv_lens"], c["block_table"], c["pos"])
        g = lambda name: np.stack([getattr(seqs[b], name)[p] for b, p in tok])  # noqa: E731
        q_pe = np.stack([_rot(seqs[b].q_pe_raw[p:p + 1], np.array([p]), cos_sin, "interleaved")[0]
                         for b, p in tok]).astype(np.float32)
        k_pe = np.stack([_rot(seqs[b].k_pe_raw[p:p + 1], np.array([p]), cos_sin, "interleaved")[0]
                         for b, p in tok]).astype(np.float32)
        idx = np.full((T, TOPK), -7, np.int32)
        out0 = _paged.run_mla_layer(runner, kv, 0, q_nope=g("q_nope"), q_pe=q_pe, kv_c=g("kv_c"), k_pe=k_pe,
                                    w_uk=w_uk, w_uv=w_uv, sm_scale=sm, index_q=g("iq"), index_k=g("ik"),
                                    index_w=g("iw"), cos_sin=cos_sin, indices_out=idx)
        out1 = _paged.run_mla_layer(runner, kv, 1, q_nope=g("q_nope") * 0.5, q_pe=q_pe, kv_c=g("kv_c"), k_pe=k_pe,
                                    w_uk=w_uk, w_uv=w_uv, sm_scale=sm, indices_in=idx)
        runner.end()
        assert out0.shape == (T, H, V)
        for t, (b, p) in enumerate(tok):
            L = p + 1
            sel = idx[t][idx[t] >= 0]
            if L <= TOPK:
                np.testing.assert_array_equal(np.sort(sel), np.arange(L))
            else:
                assert len(sel) == TOPK and len(set(sel.tolist())) == TOPK and sel.max() < L
                exact = np.argsort(-_ref_indexer(seqs[b], p, L, cos_sin), kind="stable")[:TOPK]
                recall.append(len(set(exact.tolist()) & set(sel.tolist())) / TOPK)
            ref0 = _ref_attention(seqs[b], p, sel, w_uk, w_uv, sm, cos_sin)
            scale = np.abs(ref0).max()
            np.testing.assert_allclose(out0[t], ref0, rtol=0, atol=2e-4 * scale)
            s1 = _Seq.__new__(_Seq)
            s1.__dict__.update(seqs[b].__dict__)
            s1.q_nope = seqs[b].q_nope * 0.5
            ref1 = _ref_attention(s1, p, sel, w_uk, w_uv, sm, cos_sin)
            np.testing.assert_allclose(out1[t], ref1, rtol=0, atol=2e-4 * np.abs(ref1).max())
        for b in range(2):
            done[b] += int(c["q_lens"][b])
    assert done == [n + steps for n in lens0]
    np.testing.assert_array_equal(kv.lens, [n + steps for n in lens0])
    assert kv.index[1] is None and kv.index[0] is not None  # shared layers own no indexer cache
    # FP8 selection against the exact top-k (the C++ indexer tests hold it to >= 0.9 per row on
    # their data; here the mean over every sparse row).
    assert recall and np.mean(recall) >= 0.85, np.mean(recall)
    assert runner.last_report["seqs"]["shared"] + runner.last_report["seqs"]["dense"] == 2


@needs_step
def test_paged_kv_refuses_a_changed_batch():
    kv = _paged.PagedKV(["full"], 2, page_size=PAGE)
    kv.begin(np.ones((2, 3), bool))
    with pytest.raises(NotImplementedError, match="beam search"):
        kv.begin(np.ones((4, 1), bool))
