"""DSA as the attention of HF transformers' GLM-5 (glm_moe_dsa) and DeepSeek-V3.2 (deepseek_v32)
models (docs/transformers.md).

    import dsa.integrations.transformers as dsa_hf
    dsa_hf.use_dsa(model)                 # every attention layer now runs on DSA
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=32)
    dsa_hf.remove_dsa(model)              # back to transformers' own attention

The layers' projections stay transformers' modules (q_a/q_b, kv_a, kv_b, the indexer's
wq_b/wk/k_norm/weights_proj, o_proj). DSA holds the paged MLA and indexer caches, plans one
workspace for the whole model, and runs each layer's step in absorbed form: q = [q_nope·W_UK |
rope(q_pe)] with W_UK/W_UV taken from kv_b_proj.weight (SPEC 5b), out_latent -> W_UV -> o_proj.
The cache transformers passes around (a DynamicCache) only counts tokens: each layer appends a
[B, 1, S, 1] placeholder so generate's lengths and masks stay right, while the keys live in
DSA's pages attached to that cache object.

``python -m dsa.integrations.transformers --demo`` builds a small random-weight model of each
family from its config class (nothing is downloaded), generates with and without DSA and prints
the agreement and the time of each.
"""
import argparse
import inspect
import json
import sys
import time
import types

import numpy as np

from . import _mla_math as mm
from ._mla_math import UnsupportedModelError
from ._paged import PagedKV, StepRunner, run_mla_layer

FAMILIES = {"glm_moe_dsa": "glm-5", "deepseek_v32": "deepseek-v3.2"}
_ATTN_PARTS = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
_INDEXER_PARTS = ("wq_b", "wk", "k_norm", "weights_proj")

__all__ = ["use_dsa", "remove_dsa", "UnsupportedModelError", "DsaModel", "tiny_model", "main"]


def _torch():
    import torch
    return torch


class TorchOps:
    """Tensor making for PagedKV on a torch device."""

    def __init__(self, device):
        self.torch = _torch()
        self.device = device

    def zeros_u8(self, shape):
        return self.torch.zeros(shape, dtype=self.torch.uint8, device=self.device)

    def empty_i32(self, shape):
        return self.torch.empty(shape, dtype=self.torch.int32, device=self.device)

    def device_i32(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(self.device)


def _source(fn):
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def _family(model):
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in FAMILIES:
        raise UnsupportedModelError("use_dsa: model: expected a transformers model of type %s, got model_type %r (%s)"
                                    % (" or ".join(sorted(FAMILIES)), mt, type(model).__name__))
    return FAMILIES[mt], cfg


def _base_model(model):
    for cand in (getattr(model, "model", None), model):
        if cand is not None and hasattr(cand, "layers") and hasattr(cand, "rotary_emb"):
            return cand
    raise UnsupportedModelError("use_dsa: model: found no decoder with .layers and .rotary_emb (%s)" % type(model).__name__)


def _check_attention(i, attn, role):
    """The layer's MLA projections, and its indexer where it selects (role 'full'): a 'shared'
    layer reuses the selection before it and may carry no indexer (GLM-5.2 IndexShare layers
    have indexer None)."""
    missing = [p for p in _ATTN_PARTS if getattr(attn, p, None) is None]
    if not missing and role == "full":
        ix = getattr(attn, "indexer", None)
        missing = ["indexer"] if ix is None else ["indexer." + p for p in _INDEXER_PARTS if getattr(ix, p, None) is None]
    if missing:
        raise UnsupportedModelError("use_dsa: layer %d: the attention (%s) has no %s (DSA needs the q_lora MLA "
                                    "projections and the DSA indexer)" % (i, type(attn).__name__, ", ".join(missing)))
    w = getattr(attn.kv_b_proj, "weight", None)
    torch = _torch()
    if w is None or w.dtype not in (torch.bfloat16, torch.float16, torch.float32) or w.device.type == "meta":
        raise UnsupportedModelError(
            "use_dsa: layer %d: kv_b_proj.weight: expected a bf16/f16/f32 tensor (W_UK/W_UV are read from it), got %s"
            % (i, None if w is None else "%s on %s" % (w.dtype, w.device)))
    if hasattr(attn.kv_b_proj, "weight_scale_inv") or hasattr(attn.kv_b_proj, "weight_scale"):
        raise UnsupportedModelError("use_dsa: layer %d: kv_b_proj is quantised (%s); DSA reads W_UK/W_UV from a "
                                    "float weight" % (i, type(attn.kv_b_proj).__name__))
    return w.device


class DsaModel:
    """What use_dsa attaches to a model (model._dsa): the plan, the step runner, the cos_sin
    table, the layers' RoPE styles, and the forward in flight. Attributes worth reading:
    plan, styles, notes, last_report (the last step's report), last_indices (per layer, when
    use_dsa(record_indices=True): the [T, topk] request-local selection of the last forward and
    the token map)."""

    def __init__(self, model, *, cache_dtype, device, max_tokens_per_step, max_seqs_per_step, max_context, score_budget,
                 page_size, hadamard, mla_rope, index_rope, record_indices):
        import dsa
        torch = _torch()
        self.family, self.config = _family(model)
        self.model = model
        self.base = _base_model(model)
        layers = list(self.base.layers)
        self.attns = [getattr(layer, "self_attn", None) for layer in layers]
        if not self.attns or any(a is None for a in self.attns):
            raise UnsupportedModelError("use_dsa: every decoder layer needs a self_attn module")
        # Roles: the module's own skip_topk (GLM-5.2-style shared indexers) where it has one.
        roles = mm.indexer_roles(self.config, len(self.attns))
        for i, a in enumerate(self.attns):
            if hasattr(a, "skip_topk"):
                roles[i] = "shared" if a.skip_topk else "full"
        if roles[0] != "full":
            raise UnsupportedModelError("use_dsa: layer 0 is a shared-indexer layer: nothing before it selects")
        self.roles = roles
        devices = {_check_attention(i, a, roles[i]) for i, a in enumerate(self.attns)}
        if len(devices) != 1:
            raise UnsupportedModelError("use_dsa: the attention layers sit on several devices (%s): one DSA plan serves "
                                        "one device" % ", ".join(sorted(str(d) for d in devices)))
        wdev = devices.pop()
        self.device = torch.device(device) if device is not None else wdev
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device != wdev:
            raise UnsupportedModelError("use_dsa: device %s: the attention weights are on %s (move the model first)"
                                        % (self.device, wdev))
        if self.device.type == "cuda" and "cuda" not in dsa.compiled_backends():
            raise UnsupportedModelError("use_dsa: the model is on %s but this dsa build has no CUDA backend "
                                        "(rebuild with -DDSA_CUDA=ON, or move the model to the CPU)" % self.device)
        if self.device.type not in ("cpu", "cuda"):
            raise UnsupportedModelError("use_dsa: device %s: DSA runs on 'cpu' or 'cuda'" % self.device)
        if cache_dtype not in ("bf16", "fp8"):
            raise ValueError("use_dsa: cache_dtype: expected 'bf16' or 'fp8', got %r" % (cache_dtype,))
        a0 = self.attns[0]
        det_mla, det_idx, self.notes = mm.detect_rope_styles(self.family, self.config, _source(type(a0).forward),
                                                             _source(type(a0.indexer).forward))
        self.mla_rope = mla_rope or det_mla
        self.index_rope = index_rope or det_idx
        if self.mla_rope not in mm.ROPE_STYLES:
            raise ValueError("use_dsa: mla_rope: expected one of %s, got %r" % (mm.ROPE_STYLES, self.mla_rope))
        geom = mm.geometry_from_config(self.config, self.family, index_rope=self.index_rope)
        self.num_heads = geom["num_heads"]
        self.nope, self.vdim, self.topk = geom["qk_nope_head_dim"], geom["v_head_dim"], geom["topk"]
        self.index_heads = geom["index_heads"]
        for i, a in enumerate(self.attns):
            for name, want in (("num_heads", self.num_heads), ("qk_nope_head_dim", self.nope), ("v_head_dim", self.vdim),
                               ("kv_lora_rank", mm.LATENT), ("qk_rope_head_dim", mm.ROPE)):
                got = getattr(a, name, want)
                if got != want:
                    raise UnsupportedModelError("use_dsa: layer %d: %s = %r differs from the config's %r" % (i, name, got, want))
        self.sm_scales = [float(getattr(a, "scaling")) for a in self.attns]
        geom["sm_scale"] = self.sm_scales[0]
        max_context = int(max_context or geom["max_positions"])
        self.max_context = max_context
        dev_name = "cpu" if self.device.type == "cpu" else "cuda:%d" % self.device.index
        self.plan = dsa.plan(geom, cache_dtype=cache_dtype, page_size=int(page_size),
                             max_tokens_per_step=int(max_tokens_per_step), max_seqs_per_step=int(max_seqs_per_step),
                             max_context=max_context, score_budget_bytes=score_budget, device=dev_name)
        self.cache_dtype = cache_dtype
        self.page_size = int(page_size)
        self.runner = StepRunner(self.plan, hadamard=hadamard)
        self.ops = TorchOps(self.device)
        self.cos_sin = self._cos_sin_table(max_context)
        # The dtype the step gets: bf16 on CUDA; on the CPU f32 for an f32 model, else bf16.
        wdt = a0.kv_b_proj.weight.dtype
        self.step_dtype = torch.float32 if (self.device.type == "cpu" and wdt == torch.float32) else torch.bfloat16
        self.record_indices = bool(record_indices)
        self.last_indices = {}
        self.last_report = None
        self.ctx = None
        self._forward_sig = inspect.signature(self.base.forward)
        self._orig_forward = {}
        self._orig_base_forward = None

    # ---- setup ------------------------------------------------------------------------
    def _cos_sin_table(self, n):
        """The model's own rotary embedding at positions 0..n-1, as DSA's [n, 64] table."""
        torch = _torch()
        rt = mm.rope_type_of(self.config)
        if rt not in mm.STATIC_ROPE_TYPES:
            raise UnsupportedModelError("use_dsa: rope type %r changes with the sequence length" % rt)
        emb = self.base.rotary_emb
        x = torch.zeros(1, dtype=torch.float32, device=self.device)
        pos = torch.arange(n, device=self.device)[None, :]
        with torch.no_grad():
            cos, sin = emb(x, position_ids=pos)
        if cos.shape[-1] != mm.ROPE:
            raise UnsupportedModelError("use_dsa: rotary embedding: expected cos/sin of width 64, got %d" % cos.shape[-1])
        table = mm.cos_sin_table(cos.reshape(n, -1).float().cpu().numpy(), sin.reshape(n, -1).float().cpu().numpy())
        return torch.from_numpy(table).to(self.device)

    def install(self):
        for i, a in enumerate(self.attns):
            self._orig_forward[i] = a.__dict__.get("forward")
            a.forward = types.MethodType(_make_forward(self, i), a)
        # The decoder's forward, wrapped (not hooked: a hook does not see a forward that raised):
        # the batch of each forward is read before its first layer and released after its last.
        self._orig_base_forward = self.base.__dict__.get("forward")
        inner = self.base.forward
        owner = self

        def forward(*args, **kwargs):
            owner._pre_forward(args, kwargs)
            ok = False
            try:
                out = inner(*args, **kwargs)
                ok = True
                return out
            finally:
                owner._post_forward(ok)
        self.base.forward = forward

    def uninstall(self):
        if self._orig_base_forward is None:
            self.base.__dict__.pop("forward", None)
        else:
            self.base.forward = self._orig_base_forward
        for i, a in enumerate(self.attns):
            orig = self._orig_forward.get(i)
            if orig is None:
                a.__dict__.pop("forward", None)
            else:
                a.forward = orig

    # ---- one forward of the decoder ----------------------------------------------------
    def _pre_forward(self, args, kwargs):
        torch = _torch()
        try:
            bound = self._forward_sig.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = dict(kwargs)
        extra = bound.get("kwargs")
        if isinstance(extra, dict):
            bound = {**extra, **bound}
        ids, embeds = bound.get("input_ids"), bound.get("inputs_embeds")
        src = ids if ids is not None else embeds
        if src is None:
            raise ValueError("dsa: the model got neither input_ids nor inputs_embeds")
        B, S = int(src.shape[0]), int(src.shape[1])
        mask = bound.get("attention_mask")
        if mask is None:
            valid = np.ones((B, S), dtype=bool)
        elif isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] == B and mask.shape[1] >= S:
            valid = (mask[:, -S:] != 0).cpu().numpy()
        else:
            raise UnsupportedModelError("dsa: attention_mask: expected None or a 2-D [B, past + S] padding mask, got %s"
                                        % (list(mask.shape) if hasattr(mask, "shape") else type(mask).__name__))
        if self.model.training:
            raise UnsupportedModelError("dsa: the model is in training mode; DSA serves inference (model.eval())")
        self.ctx = dict(valid=valid, B=B, S=S, position_ids=bound.get("position_ids"), prepared=False, kv=None,
                        indices=None)

    def _post_forward(self, ok):
        ctx = self.ctx
        if ctx is not None and ctx.get("kv") is not None:
            ctx["kv"].inflight = False
            if not ok:
                ctx["kv"].broken = "a forward raised after its tokens were admitted"
        self.runner.end()
        self.ctx = None

    def _prepare(self, ctx, past_key_values, position_ids):
        """Per forward, at its first layer: binds the caches and admits the tokens."""
        torch = _torch()
        if past_key_values is None:
            kv = PagedKV(self.roles, ctx["B"], cache_dtype=self.cache_dtype, page_size=self.page_size, ops=self.ops)
        else:
            name = type(past_key_values).__name__
            if "Dynamic" not in name or not hasattr(past_key_values, "update"):
                raise UnsupportedModelError(
                    "dsa: past_key_values of type %s: DSA keeps the keys in its own pages and counts tokens in a "
                    "dynamic cache (leave cache_implementation unset; static, offloaded and quantised caches are not "
                    "supported)" % name)
            kv = getattr(past_key_values, "_dsa_kv", None)
            if kv is None:
                if past_key_values.get_seq_length() != 0:
                    raise UnsupportedModelError("dsa: past_key_values already holds %d tokens written without DSA"
                                                % past_key_values.get_seq_length())
                kv = PagedKV(self.roles, ctx["B"], cache_dtype=self.cache_dtype, page_size=self.page_size, ops=self.ops)
                past_key_values._dsa_kv = kv
                past_key_values._dsa_owner = self
            elif getattr(past_key_values, "_dsa_owner", None) is not self:
                raise UnsupportedModelError("dsa: past_key_values belongs to another model's DSA caches")
        batch = kv.begin(ctx["valid"])
        kv.inflight = True
        T = int(batch["q_lens"].sum())
        if T > self.plan.as_dict()["config"]["max_tokens_per_step"]:
            kv.broken = "too many tokens"
            raise UnsupportedModelError("dsa: %d tokens in one forward exceed use_dsa(max_tokens_per_step=%d)"
                                        % (T, self.plan.as_dict()["config"]["max_tokens_per_step"]))
        if int(batch["kv_lens"].max(initial=0)) > self.max_context:
            kv.broken = "past max_context"
            raise UnsupportedModelError("dsa: a sequence reaches %d tokens, past use_dsa(max_context=%d)"
                                        % (int(batch["kv_lens"].max()), self.max_context))
        B, S = ctx["B"], ctx["S"]
        sel = None if batch["all_valid"] else torch.from_numpy(batch["sel"]).to(self.device)
        if position_ids is not None:
            pid = position_ids.to(self.device).expand(B, S).reshape(-1)
            if sel is not None:
                pid = pid.index_select(0, sel)
            positions = pid.to(torch.int32)
            if T and int(positions.max()) >= self.cos_sin.shape[0]:
                raise UnsupportedModelError("dsa: position %d is past use_dsa(max_context=%d)"
                                            % (int(positions.max()), self.cos_sin.shape[0]))
        else:
            positions = torch.from_numpy(batch["pos"]).to(self.device)
        self.runner.begin(batch["q_lens"], batch["kv_lens"], self.ops.device_i32(batch["block_table"]), positions)
        ctx.update(prepared=True, kv=kv, batch=batch, sel=sel, T=T)
        if self.record_indices:
            self.last_indices = {}

    # ---- one layer ---------------------------------------------------------------------
    def layer_forward(self, i, attn, hidden_states, position_embeddings, past_key_values, position_ids):
        torch = _torch()
        ctx = self.ctx
        if ctx is None:
            raise RuntimeError("dsa: a DSA attention layer was called outside a forward of its model (call the model)")
        if not ctx["prepared"]:
            self._prepare(ctx, past_key_values, position_ids if position_ids is not None else ctx["position_ids"])
        B, S = ctx["B"], ctx["S"]
        if tuple(hidden_states.shape[:2]) != (B, S):
            raise RuntimeError("dsa: layer %d got hidden states %s in a forward of [%d, %d]" % (i, list(hidden_states.shape), B, S))
        sel, T = ctx["sel"], ctx["T"]
        D = hidden_states.shape[-1]
        x = hidden_states.reshape(B * S, D)
        if sel is not None:
            x = x.index_select(0, sel)
        cos, sin = position_embeddings
        cos = cos.expand(B, S, cos.shape[-1]).reshape(B * S, -1)
        sin = sin.expand(B, S, sin.shape[-1]).reshape(B * S, -1)
        if sel is not None:
            cos, sin = cos.index_select(0, sel), sin.index_select(0, sel)
        sd = self.step_dtype
        H, nope = self.num_heads, self.nope
        with torch.no_grad():
            q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
            q = attn.q_b_proj(q_resid).view(T, H, nope + mm.ROPE)
            q_nope, q_pe = q[..., :nope], q[..., nope:]
            q_pe = mm.rope(q_pe, cos[:, None, :].to(q_pe.dtype), sin[:, None, :].to(q_pe.dtype), self.mla_rope)
            ckv = attn.kv_a_proj_with_mqa(x)
            kv_c = attn.kv_a_layernorm(ckv[..., :mm.LATENT])
            k_pe = mm.rope(ckv[..., mm.LATENT:], cos.to(ckv.dtype), sin.to(ckv.dtype), self.mla_rope)
            w_uk, w_uv = mm.split_kv_b(attn.kv_b_proj.weight, H, nope, self.vdim)
            role = self.roles[i]
            kw = {}
            if role == "full":
                ix = attn.indexer
                kw["index_q"] = ix.wq_b(q_resid).view(T, self.index_heads, mm.INDEX_HEAD_DIM).to(sd).contiguous()
                kw["index_k"] = ix.k_norm(ix.wk(x)).to(sd).contiguous()
                kw["index_w"] = ix.weights_proj(x.to(ix.weights_proj.weight.dtype)).float().contiguous()
                kw["cos_sin"] = self.cos_sin
                nxt = self.roles[i + 1] if i + 1 < len(self.roles) else None
                if nxt == "shared" or self.record_indices:
                    ctx["indices"] = torch.empty((T, self.topk), dtype=torch.int32, device=self.device)
                    kw["indices_out"] = ctx["indices"]
            else:
                if ctx["indices"] is None:
                    raise RuntimeError("dsa: layer %d shares indices but no full layer before it selected" % i)
                kw["indices_in"] = ctx["indices"]
            if T == 0:
                o = x.new_zeros((0, D))
            else:
                heads = run_mla_layer(self.runner, ctx["kv"], i, q_nope=q_nope.to(sd).contiguous(),
                                      q_pe=q_pe.to(sd).contiguous(), kv_c=kv_c.to(sd).contiguous(),
                                      k_pe=k_pe.to(sd).contiguous(), w_uk=w_uk.to(sd), w_uv=w_uv.to(sd),
                                      sm_scale=self.sm_scales[i], **kw)
                self.last_report = self.runner.last_report
                o = attn.o_proj(heads.reshape(T, H * self.vdim).to(x.dtype))
            if self.record_indices and role == "full":
                self.last_indices[i] = dict(indices=ctx["indices"].cpu().numpy(), seq=ctx["batch"]["seq"].copy(),
                                            pos=ctx["batch"]["pos"].copy(), sel=ctx["batch"]["sel"].copy(), B=B, S=S)
            if sel is None:
                out = o.reshape(B, S, D)
            else:
                out = o.new_zeros((B * S, D))
                out.index_copy_(0, sel, o)
                out = out.reshape(B, S, D)
            if past_key_values is not None:
                # transformers' own bookkeeping of lengths (generate, masks): a 1-wide placeholder.
                ph = hidden_states.new_zeros((B, 1, S, 1))
                try:
                    past_key_values.update(ph, ph, getattr(attn, "layer_idx", i))
                except Exception as e:  # a cache layer that wants real keys
                    ctx["kv"].broken = "the cache refused its placeholder"
                    raise UnsupportedModelError("dsa: layer %d: %s.update refused the [B, 1, S, 1] placeholder that "
                                                "counts tokens (%s: %s)" % (i, type(past_key_values).__name__,
                                                                             type(e).__name__, e)) from e
        return out


def _make_forward(owner, i):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, *args,
                **kwargs):
        if position_embeddings is None:
            raise UnsupportedModelError("dsa: layer %d: the attention got no position_embeddings (cos, sin)" % i)
        if kwargs.get("output_attentions"):
            raise UnsupportedModelError("dsa: output_attentions: DSA does not materialise attention weights")
        out = owner.layer_forward(i, self, hidden_states, position_embeddings, past_key_values, kwargs.get("position_ids"))
        # GLM-5's attention (glm_moe_dsa) returns its top-k too, and its decoder layer unpacks
        # three values whether or not the config shares indexers (transformers 5.17 on the H200
        # raised "expected 3, got 2" when this keyed on next_skip_topk alone).
        if hasattr(self, "next_skip_topk") or hasattr(self, "skip_topk") or "glm_moe_dsa" in type(self).__module__:
            return out, None, None
        return out, None
    return forward


def use_dsa(model, cache_dtype="bf16", device=None, *, max_tokens_per_step=8192, max_seqs_per_step=256,
            max_context=None, score_budget="512MiB", page_size=64, hadamard=True, mla_rope=None, index_rope=None,
            record_indices=False):
    """Makes every attention layer of a transformers GLM-5 / DeepSeek-V3.2 model run on DSA.

    cache_dtype: 'bf16' (default) or 'fp8' MLA cache (SPEC 4). device: the model's device
    (default: where its attention weights are); 'cpu' runs the CPU backend on torch CPU tensors.
    max_tokens_per_step (real tokens of one forward), max_seqs_per_step, max_context (default
    config.max_position_embeddings) and score_budget are the plan's limits (docs/planner.md).
    hadamard: the Hadamard-128 rotation before FP8 in the indexer (the reference model's; exact
    scores do not change). mla_rope / index_rope: 'half_split' or 'interleaved' to override the
    RoPE styles read from the model's code. record_indices: keep each full layer's selection of
    the last forward in model._dsa.last_indices.

    Returns the DsaModel (also model._dsa). Raises UnsupportedModelError naming what is not
    supported (family, geometry, quantised kv_b_proj, several devices, cache type, ...)."""
    if getattr(model, "_dsa", None) is not None:
        raise ValueError("use_dsa: this model already runs on DSA (remove_dsa(model) first)")
    owner = DsaModel(model, cache_dtype=cache_dtype, device=device, max_tokens_per_step=max_tokens_per_step,
                     max_seqs_per_step=max_seqs_per_step, max_context=max_context, score_budget=score_budget,
                     page_size=page_size, hadamard=hadamard, mla_rope=mla_rope, index_rope=index_rope,
                     record_indices=record_indices)
    owner.install()
    model._dsa = owner
    return owner


def remove_dsa(model):
    """Gives the model its own attention back."""
    owner = getattr(model, "_dsa", None)
    if owner is None:
        return
    owner.uninstall()
    model._dsa = None


# ---- small random-weight models and the demo ----------------------------------------------

def _config_class(family):
    import transformers
    names = {"glm-5": ("GlmMoeDsaConfig", "glm_moe_dsa"), "deepseek-v3.2": ("DeepseekV32Config", "deepseek_v32")}[family]
    cls = getattr(transformers, names[0], None)
    if cls is None:
        import importlib
        mod = importlib.import_module("transformers.models.%s.configuration_%s" % (names[1], names[1]))
        cls = getattr(mod, names[0])
    return cls


def _model_class(family):
    import transformers
    names = {"glm-5": ("GlmMoeDsaForCausalLM", "glm_moe_dsa"), "deepseek-v3.2": ("DeepseekV32ForCausalLM", "deepseek_v32")}[family]
    cls = getattr(transformers, names[0], None)
    if cls is None:
        import importlib
        mod = importlib.import_module("transformers.models.%s.modeling_%s" % (names[1], names[1]))
        cls = getattr(mod, names[0])
    return cls


def tiny_config(family, *, index_topk=64, num_layers=2, shared=False, heads=4, index_heads=16, hidden=256,
                vocab=512, initializer_range=0.05, max_positions=1024):
    """A small config of the family from its config class (DSA's fixed widths kept: latent 512,
    rope 64, indexer head 128). shared=True makes odd layers share the indexer of the layer
    before (GLM configs that have indexer_types)."""
    cls = _config_class(family)
    want = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=heads, n_shared_experts=1,
                n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                kv_lora_rank=512, q_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
                index_topk=index_topk, index_head_dim=128, index_n_heads=index_heads,
                max_position_embeddings=max_positions, initializer_range=initializer_range, tie_word_embeddings=False,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=True)
    default = cls()
    kwargs = {k: v for k, v in want.items() if hasattr(default, k)}
    if shared:
        if not hasattr(default, "indexer_types"):
            raise UnsupportedModelError("tiny_config: this %s config class has no indexer_types" % family)
        kwargs["indexer_types"] = ["full" if i % 2 == 0 else "shared" for i in range(num_layers)]
    if hasattr(default, "mlp_layer_types"):
        kwargs["mlp_layer_types"] = ["dense"] + ["sparse"] * (num_layers - 1)
    return cls(**kwargs)


def tiny_model(family, *, device="cpu", dtype=None, seed=0, **config_kw):
    """A random-weight model of the family, eager attention, in eval mode."""
    torch = _torch()
    cfg = tiny_config(family, **config_kw)
    torch.manual_seed(seed)
    cls = _model_class(family)
    try:
        model = cls._from_config(cfg, attn_implementation="eager")
    except (TypeError, AttributeError, ValueError):
        cfg._attn_implementation = "eager"
        model = cls(cfg)
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def _generate(model, ids, mask, n):
    torch = _torch()
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                              pad_token_id=model.config.pad_token_id)


def _prompts(vocab, lens, device, seed=0):
    """Left-padded prompts of the given lengths: (input_ids, attention_mask)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    S = max(lens)
    ids = torch.zeros((len(lens), S), dtype=torch.long)
    mask = torch.zeros((len(lens), S), dtype=torch.long)
    for b, n in enumerate(lens):
        ids[b, S - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, S - n:] = 1
    return ids.to(device), mask.to(device)


def _sync(device):
    torch = _torch()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def demo(device=None, new_tokens=32, lens=(200, 150, 90), cache_dtype="bf16", families=("glm-5", "deepseek-v3.2"),
         topks=(64, 256), out=print):
    """For each family and index_topk: a small random model, greedy generate with transformers'
    eager attention and with DSA, the agreement and the times. index_topk 64 < the prompts: the
    sparse path and the indexer run; 256 > them: the dense route."""
    torch = _torch()
    if device is None:
        import dsa
        device = "cuda" if (torch.cuda.is_available() and "cuda" in dsa.compiled_backends()) else "cpu"
    results = []
    for fam, topk in [(f, k) for f in families for k in topks]:
        model = tiny_model(fam, device=device, index_topk=topk)
        ids, mask = _prompts(model.config.vocab_size, list(lens), device)
        _generate(model, ids, mask, 2)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        ref = _generate(model, ids, mask, new_tokens)
        _sync(device)
        t_eager = time.perf_counter() - t0
        with torch.no_grad():
            logits_ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        owner = use_dsa(model, cache_dtype=cache_dtype, max_tokens_per_step=4096)
        _generate(model, ids, mask, 2)
        _sync(device)
        t0 = time.perf_counter()
        got = _generate(model, ids, mask, new_tokens)
        _sync(device)
        t_dsa = time.perf_counter() - t0
        with torch.no_grad():
            logits_dsa = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        remove_dsa(model)
        m = mask.bool()
        a = logits_ref[m]
        b = logits_dsa[m]
        rel = float((a - b).norm() / a.norm())
        argmax = float((a.argmax(-1) == b.argmax(-1)).float().mean())
        gen_ref, gen_dsa = ref[:, ids.shape[1]:], got[:, ids.shape[1]:]
        same = (gen_ref == gen_dsa)
        first = [int(torch.nonzero(~row)[0]) if (~row).any() else new_tokens for row in same]
        r = dict(family=fam, device=str(device), cache_dtype=cache_dtype, prompt_lens=list(lens), new_tokens=new_tokens,
                 index_topk=model.config.index_topk, prompt_logits_rel_err=rel, prompt_argmax_agreement=argmax,
                 generated_tokens_equal=float(same.float().mean()), first_divergence=first,
                 eager_generate_s=t_eager, dsa_generate_s=t_dsa, notes=owner.notes,
                 styles=dict(mla=owner.mla_rope, index=owner.index_rope))
        results.append(r)
        out("%-14s topk %-4d %-5s %s cache | prompt logits rel err %.2e, argmax agree %.3f | generate %d tokens: "
            "equal %.3f (first divergence per prompt %s) | eager %.3f s, dsa %.3f s"
            % (fam, topk, device, cache_dtype, rel, argmax, new_tokens, r["generated_tokens_equal"], first, t_eager,
               t_dsa))
        for n in owner.notes:
            out("    note: " + n)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsa.integrations.transformers",
                                description="DSA as the attention of transformers' GLM-5 / DeepSeek-V3.2 models")
    p.add_argument("--demo", action="store_true", help="random-weight models of both families: eager vs DSA")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--cache-dtype", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--lens", default="200,150,90", help="prompt lengths of the batch (comma-separated)")
    p.add_argument("--topks", default="64,256", help="index_topk values to build models with (comma-separated)")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    if not a.demo:
        p.print_help()
        return 0
    res = demo(device=a.device, new_tokens=a.new_tokens, lens=tuple(int(x) for x in a.lens.split(",")),
               cache_dtype=a.cache_dtype, topks=tuple(int(x) for x in a.topks.split(",")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
