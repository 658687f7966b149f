"""dsa.integrations.transformers' torch glue on a stand-in model (torch, no transformers).

The stand-in has the module names and call conventions of transformers' DSA attention (the
attention gets hidden_states, position_embeddings, attention_mask, past_key_values and
position_ids; the cache counts tokens through update()) and an eager reference written here
from the math: expanded per-head K/V, an exact indexer top-k mask over a dense softmax. It
checks what the real-transformers tests (test_transformers_integration.py, GPU machine) check,
on the CPU backend: logits against the reference, the dense route exactly selecting all, sparse
selections against the exact top-k, a padded batch with a cache over prefill + decode, and the
refusals. Skipped without torch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import dsa  # noqa: E402

if not hasattr(dsa, "Attention"):
    pytest.skip("this dsa build has no layer step", allow_module_level=True)

from dsa.integrations import transformers as dsa_hf  # noqa: E402

H, NOPE, V, HI, QL, D, VOCAB = 2, 32, 48, 8, 64, 64, 97


class Cfg:
    def __init__(self, model_type, topk, layers=2, indexer_types=None):
        self.model_type = model_type
        self.num_attention_heads = H
        self.kv_lora_rank = 512
        self.qk_rope_head_dim = 64
        self.qk_nope_head_dim = NOPE
        self.v_head_dim = V
        self.q_lora_rank = QL
        self.index_n_heads = HI
        self.index_head_dim = 128
        self.index_topk = topk
        self.num_hidden_layers = layers
        self.max_position_embeddings = 512
        self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        self.vocab_size = VOCAB
        if indexer_types is not None:
            self.indexer_types = indexer_types


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(32, dtype=torch.float32) / 32), persistent=False)

    def forward(self, x, position_ids):
        f = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat([f, f], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class RMS(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def apply_rope_half(x, cos, sin):
    x1, x2 = x[..., :32], x[..., 32:]
    return torch.cat([x1 * cos[..., :32] - x2 * sin[..., :32], x2 * cos[..., :32] + x1 * sin[..., :32]], -1)


def apply_rope_interleave(x, cos, sin):
    e, o = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., :32], sin[..., :32]
    return torch.stack([e * c - o * s, o * c + e * s], -1).flatten(-2)  # pairs stay in place


class Indexer(nn.Module):
    def __init__(self, topk):
        super().__init__()
        self.wq_b = nn.Linear(QL, HI * 128, bias=False)
        self.wk = nn.Linear(D, 128, bias=False)
        self.k_norm = nn.LayerNorm(128)
        self.weights_proj = nn.Linear(D, HI, bias=False)
        self.topk = topk

    def forward(self, x, q_resid, cos, sin, allowed, keys_so_far):
        B, S, _ = x.shape
        q = self.wq_b(q_resid).view(B, S, HI, 128)
        q = torch.cat([apply_rope_half(q[..., :64], cos[:, :, None], sin[:, :, None]), q[..., 64:]], -1)
        k = self.k_norm(self.wk(x))
        k = torch.cat([apply_rope_half(k[..., :64], cos, sin), k[..., 64:]], -1)
        keys = k if keys_so_far is None else torch.cat([keys_so_far, k], 1)
        s = torch.relu(torch.einsum("bshd,btd->bsht", q, keys)) * 128 ** -0.5
        w = self.weights_proj(x) * HI ** -0.5
        score = torch.einsum("bsht,bsh->bst", s, w).masked_fill(~allowed, float("-inf"))
        k_sel = min(self.topk, score.shape[-1])
        return score.topk(k_sel, dim=-1).indices, keys


class Attention(nn.Module):
    """MLA + indexer with transformers' module names; forward is the eager reference."""

    def __init__(self, cfg, layer_idx, style):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.qk_nope_head_dim, self.v_head_dim = H, NOPE, V
        self.kv_lora_rank, self.qk_rope_head_dim = 512, 64
        self.q_a_proj = nn.Linear(D, QL, bias=False)
        self.q_a_layernorm = RMS(QL)
        self.q_b_proj = nn.Linear(QL, H * (NOPE + 64), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, 512 + 64, bias=False)
        self.kv_a_layernorm = RMS(512)
        self.kv_b_proj = nn.Linear(512, H * (NOPE + V), bias=False)
        self.o_proj = nn.Linear(H * V, D, bias=False)
        self.shared = getattr(cfg, "indexer_types", ["full"] * 99)[layer_idx] == "shared"
        # A shared layer carries no indexer weights (as GLM-5.2's IndexShare layers).
        self.indexer = None if self.shared else Indexer(cfg.index_topk)
        self.scaling = (NOPE + 64) ** -0.5
        self.style = style

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        return self.reference(apply_rope_half, hidden_states, position_embeddings, attention_mask, past_key_values,
                              **kwargs)

    def reference(self, rope, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        B, S, _ = hidden_states.shape
        cos, sin = position_embeddings
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        q = self.q_b_proj(q_resid).view(B, S, H, NOPE + 64)
        q_nope, q_pe = q[..., :NOPE], rope(q[..., NOPE:], cos[:, :, None], sin[:, :, None])
        ckv = self.kv_a_proj_with_mqa(hidden_states)
        c = self.kv_a_layernorm(ckv[..., :512])
        k_pe = rope(ckv[..., 512:], cos, sin)
        kv = self.kv_b_proj(c).view(B, S, H, NOPE + V)
        k = torch.cat([kv[..., :NOPE], k_pe[:, :, None].expand(B, S, H, 64)], -1)
        v = kv[..., NOPE:]
        st = past_key_values.state(self.layer_idx) if past_key_values is not None else {}
        if st.get("k") is not None:
            k, v = torch.cat([st["k"], k], 1), torch.cat([st["v"], v], 1)
        T = k.shape[1]
        past = T - S
        cols = torch.arange(T)
        causal = cols[None, :] <= (past + torch.arange(S))[:, None]
        allowed = causal[None] & attention_mask[:, None, :T].bool()  # [B, S, T]
        if self.shared:
            sel = kwargs["shared_sel"][0]
            keys = None
        else:
            sel, keys = self.indexer(hidden_states, q_resid, cos, sin, allowed, st.get("ik"))
            kwargs["shared_sel"][0] = sel
        chosen = torch.zeros_like(allowed).scatter_(-1, sel, True) & allowed
        qq = torch.cat([q_nope, q_pe], -1)
        s = torch.einsum("bshd,bthd->bhst", qq, k) * self.scaling
        s = s.masked_fill(~chosen[:, None], float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1))
        o = torch.einsum("bhst,bthd->bshd", p, v).reshape(B, S, H * V)
        if past_key_values is not None:
            past_key_values.put(self.layer_idx, k=k, v=v, ik=keys)
        return self.o_proj(o), None


class AttentionInterleaved(Attention):
    """DeepSeek-V3.2's MLA RoPE (the glue reads the style from the forward's code)."""

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        return self.reference(apply_rope_interleave, hidden_states, position_embeddings, attention_mask,
                              past_key_values, **kwargs)


class MiniDynamicCache:
    """Counts tokens through update() like transformers' DynamicCache (the reference also
    keeps its expanded K/V here)."""

    def __init__(self):
        self.seen = {}
        self.ref = {}

    def update(self, k, v, layer_idx, cache_kwargs=None):
        self.seen[layer_idx] = self.seen.get(layer_idx, 0) + k.shape[-2]
        return k, v

    def get_seq_length(self, layer_idx=0):
        return self.seen.get(layer_idx, 0)

    def state(self, i):
        return self.ref.get(i, {})

    def put(self, i, **kw):
        self.ref[i] = kw
        self.seen[i] = kw["k"].shape[1]


class Layer(nn.Module):
    def __init__(self, cfg, i, style):
        super().__init__()
        self.input_layernorm = RMS(D)
        self.self_attn = (AttentionInterleaved if style == "interleaved" else Attention)(cfg, i, style)
        self.mlp = nn.Linear(D, D)

    def forward(self, x, **kw):
        h = x + self.self_attn(hidden_states=self.input_layernorm(x), **kw)[0]
        return h + torch.tanh(self.mlp(h))


class Base(nn.Module):
    def __init__(self, cfg, style):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Layer(cfg, i, style) for i in range(cfg.num_hidden_layers)])
        self.norm = RMS(D)
        self.rotary_emb = Rotary()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                inputs_embeds=None):
        x = self.embed_tokens(input_ids)
        B, S = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones((B, past + S), dtype=torch.long)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -S:]
        pe = self.rotary_emb(x, position_ids)
        shared_sel = [None]
        for layer in self.layers:
            x = layer(x, position_embeddings=pe, attention_mask=attention_mask, past_key_values=past_key_values,
                      position_ids=position_ids, shared_sel=shared_sel)
        return self.norm(x)


class MiniLM(nn.Module):
    def __init__(self, family, topk, layers=2, indexer_types=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        mt = {"glm-5": "glm_moe_dsa", "deepseek-v3.2": "deepseek_v32"}[family]
        self.config = Cfg(mt, topk, layers, indexer_types)
        self.model = Base(self.config, "interleaved" if family == "deepseek-v3.2" else "half_split")
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.08)
        self.eval()

    def forward(self, input_ids, attention_mask=None, past_key_values=None):
        return self.lm_head(self.model(input_ids=input_ids, attention_mask=attention_mask,
                                       past_key_values=past_key_values))


def _rel(a, b):
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())


@pytest.mark.parametrize("family", ["glm-5", "deepseek-v3.2"])
def test_dense_route_matches_the_reference(family):
    m = MiniLM(family, topk=256)
    ids = torch.randint(0, VOCAB, (2, 70))
    with torch.no_grad():
        ref = m(ids)
        owner = dsa_hf.use_dsa(m, record_indices=True)
        got = m(ids)
    dsa_hf.remove_dsa(m)
    assert owner.mla_rope == ("interleaved" if family == "deepseek-v3.2" else "half_split")
    assert owner.index_rope == "half_split"
    assert owner.last_report["seqs"]["dense"] == 2
    for rec in owner.last_indices.values():  # dense rows: 0 .. L-1
        for t, p in enumerate(rec["pos"]):
            np.testing.assert_array_equal(rec["indices"][t][:p + 1], np.arange(p + 1))
    assert _rel(got, ref) <= 1e-2   # the MLA cache holds c_kv / rope(k_pe) in bf16
    with torch.no_grad():
        again = m(ids)
    assert torch.equal(again, ref)  # remove_dsa gave the reference back


@pytest.mark.parametrize("family", ["glm-5", "deepseek-v3.2"])
def test_sparse_route_selections_and_logits(family):
    m = MiniLM(family, topk=64, layers=3, indexer_types=["full", "shared", "full"])
    ids = torch.randint(0, VOCAB, (1, 150))
    taps = {}
    hooks = [l.self_attn.indexer.register_forward_hook(
        lambda mod, a, out, i=i: taps.__setitem__(i, out[0][0].numpy()))
        for i, l in enumerate(m.model.layers) if l.self_attn.indexer is not None]
    with torch.no_grad():
        ref = m(ids)
    for h in hooks:
        h.remove()
    owner = dsa_hf.use_dsa(m, record_indices=True)
    with torch.no_grad():
        got = m(ids)
    dsa_hf.remove_dsa(m)
    assert owner.roles == ["full", "shared", "full"]
    assert set(owner.last_indices) == {0, 2}
    rec = owner.last_indices[0]
    recall, agree_rows = [], []
    for t, p in enumerate(rec["pos"]):
        mine = set(int(j) for j in rec["indices"][t] if j >= 0)
        if p + 1 <= 64:
            assert mine == set(range(p + 1))
            continue
        theirs = set(int(j) for j in taps[0][p])
        recall.append(len(mine & theirs) / 64)
    assert np.mean(recall) >= 0.85, np.mean(recall)
    # rows up to topk are dense in every layer: the logits there agree like the dense route's
    assert _rel(got[0, :64], ref[0, :64]) <= 1e-2
    am = (got.argmax(-1) == ref.argmax(-1)).float().mean()
    assert am >= 0.9, am


def _decode_run(m, prompts, steps, use):
    """A left-padded batch: prefill, then greedy decode through the cache. Returns the tokens
    [B, steps] and the per-step logits [B, steps, V]."""
    B, S = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((B, S), dtype=torch.long)
    mask = torch.zeros((B, S), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, S - len(p):] = torch.tensor(p)
        mask[b, S - len(p):] = 1
    if use:
        dsa_hf.use_dsa(m)
    cache = MiniDynamicCache()
    toks, logs = [], []
    try:
        with torch.no_grad():
            lg = m(ids, attention_mask=mask, past_key_values=cache)[:, -1]
            for _ in range(steps):
                nxt = lg.argmax(-1)
                toks.append(nxt)
                logs.append(lg)
                mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], 1)
                lg = m(nxt[:, None], attention_mask=mask, past_key_values=cache)[:, -1]
    finally:
        if use:
            dsa_hf.remove_dsa(m)
    return torch.stack(toks, 1), torch.stack(logs, 1), cache


@pytest.mark.parametrize("family", ["glm-5", "deepseek-v3.2"])
def test_padded_batch_prefill_and_decode_match(family):
    m = MiniLM(family, topk=256)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (40, 23, 9)]
    ref_t, ref_l, _ = _decode_run(m, prompts, 6, use=False)
    got_t, got_l, cache = _decode_run(m, prompts, 6, use=True)
    assert cache.get_seq_length() == 40 + 6      # transformers' own count of columns kept right
    kv = cache._dsa_kv
    np.testing.assert_array_equal(kv.lens, [46, 29, 15])  # real tokens only
    assert _rel(got_l, ref_l) <= 1e-2
    # each prompt alone gives the same logits as in the batch
    for b, p in enumerate(prompts):
        _, alone_l, _ = _decode_run(m, [p], 6, use=True)
        assert _rel(alone_l[0], got_l[b]) <= 1e-3


def test_refusals_name_what_is_unsupported():
    m = MiniLM("glm-5", topk=100)
    with pytest.raises(dsa_hf.UnsupportedModelError, match="index_topk = 100"):
        dsa_hf.use_dsa(m)
    m = MiniLM("glm-5", topk=64)
    m.model.layers[1].self_attn.kv_b_proj.weight_scale_inv = torch.ones(1)
    with pytest.raises(dsa_hf.UnsupportedModelError, match="layer 1: kv_b_proj is quantised"):
        dsa_hf.use_dsa(m)
    del m.model.layers[1].self_attn.kv_b_proj.weight_scale_inv
    ix, m.model.layers[1].self_attn.indexer = m.model.layers[1].self_attn.indexer, None
    with pytest.raises(dsa_hf.UnsupportedModelError, match="layer 1: the attention .* has no indexer "):
        dsa_hf.use_dsa(m)  # a full layer (no indexer_types) needs its indexer; a shared one may lack it
    m.model.layers[1].self_attn.indexer = ix
    owner = dsa_hf.use_dsa(m)
    try:
        class StaticCache(MiniDynamicCache):
            pass
        with pytest.raises(dsa_hf.UnsupportedModelError, match="StaticCache"):
            with torch.no_grad():
                m(torch.ones((1, 4), dtype=torch.long), past_key_values=StaticCache())
        with pytest.raises(RuntimeError, match="outside a forward"):
            m.model.layers[0].self_attn(torch.zeros(1, 2, D), (torch.zeros(1, 2, 64), torch.zeros(1, 2, 64)), None)
        cache = MiniDynamicCache()
        with torch.no_grad():
            m(torch.ones((2, 4), dtype=torch.long), past_key_values=cache)
            with pytest.raises(NotImplementedError, match="beam search"):
                m(torch.ones((3, 1), dtype=torch.long), attention_mask=torch.ones((3, 5), dtype=torch.long),
                  past_key_values=cache)
        assert owner.plan.workspace_bytes > 0
    finally:
        dsa_hf.remove_dsa(m)


def test_bf16_model_takes_the_bf16_step():
    """The dtypes CUDA runs (bf16 q / latents into the step, bf16 out), here on the CPU backend."""
    m = MiniLM("deepseek-v3.2", topk=256)
    ids = torch.randint(0, VOCAB, (2, 50))
    with torch.no_grad():
        ref = m(ids)
        m.to(torch.bfloat16)
        eager16 = m(ids).float()
        owner = dsa_hf.use_dsa(m)
        got = m(ids).float()
    dsa_hf.remove_dsa(m)
    assert owner.step_dtype == torch.bfloat16
    # against the f32 model: within twice the eager bf16 model's own error
    assert _rel(got, ref) <= 2 * _rel(eager16, ref), (_rel(got, ref), _rel(eager16, ref))
