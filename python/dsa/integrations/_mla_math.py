"""Framework-free pieces of the transformers integration (numpy arrays or torch tensors alike).

Everything here is plain array math or host bookkeeping, so it is tested with numpy where
transformers and torch are absent (python/tests/test_hf_pieces.py):

* ``split_kv_b``: W_UK / W_UV from ``kv_b_proj.weight`` (SPEC 5b layout).
* ``rope``: rotary embedding of a 64-wide slice with transformers' ``cos``/``sin`` (the
  ``cat(freqs, freqs)`` layout), half-split or interleaved.
* ``absorb_q`` / ``up_project``: the absorbed query ``[q_nope·W_UK | rope(q_pe)]`` and
  ``W_UV·out_latent``.
* ``cos_sin_table``: the DSA ``cos_sin [N, 64] = [cos 32 | sin 32]`` table (docs/design.md)
  from a model's cos/sin.
* ``compact_batch``: which tokens of a padded ``[B, S]`` batch are real, and the per-sequence
  ``q_lens`` / ``kv_lens`` of the step.
* ``PageTable``: pages of the paged caches per sequence and the block table.
* ``geometry_from_config`` / ``indexer_roles``: the DSA geometry of a transformers config, with
  clear errors for what DSA does not serve.
"""
import sys

import numpy as np

ROPE_STYLES = ("half_split", "interleaved")
LATENT = 512
ROPE = 64
INDEX_HEAD_DIM = 128
# RoPE variants whose frequencies do not depend on the sequence length (one table serves all).
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "deepseek_yarn")


class UnsupportedModelError(NotImplementedError):
    """A model, config or option the DSA integration does not serve; the message names it."""


def _is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _cat(xs, axis=-1):
    if _is_torch(xs[0]):
        return sys.modules["torch"].cat(xs, dim=axis)
    return np.concatenate(xs, axis=axis)


def _einsum(eq, a, b):
    if _is_torch(a):
        return sys.modules["torch"].einsum(eq, a, b)
    return np.einsum(eq, a, b)


def split_kv_b(weight, num_heads, qk_nope_head_dim, v_head_dim):
    """W_UK [H, qk_nope, 512] and W_UV [H, v, 512] as views of kv_b_proj.weight
    [H·(qk_nope + v), 512] (per head h, rows h·(qk_nope+v) .. +qk_nope are W_UK[h], the next v
    rows W_UV[h]: SPEC 5b, the layout of transformers' kv_b_proj)."""
    per = qk_nope_head_dim + v_head_dim
    shape = tuple(weight.shape)
    if len(shape) != 2 or shape[0] != num_heads * per:
        raise ValueError("kv_b_proj.weight: expected [H·(qk_nope + v) = %d, kv_lora_rank], got %s"
                         % (num_heads * per, list(shape)))
    w = weight.reshape(num_heads, per, shape[1])
    return w[:, :qk_nope_head_dim, :], w[:, qk_nope_head_dim:, :]


def rope(x, cos, sin, style):
    """Rotary embedding of x [..., 64] with cos/sin broadcastable to it, in transformers' layout
    (cat(freqs, freqs): column i and i + 32 hold frequency i).

    half_split pairs (x[i], x[i+32]) and returns them in place (transformers' rotate_half form,
    the same operations, so the same bits in the same dtype). interleaved pairs (x[2i], x[2i+1])
    and returns [rotated evens | rotated odds]: a fixed permutation of the interleaved result,
    harmless because queries and keys get the same one (their dot products are what count)."""
    d = x.shape[-1]
    h = d // 2
    if style == "half_split":
        rot = _cat([-x[..., h:], x[..., :h]])
        return x * cos + rot * sin
    if style == "interleaved":
        c, s = cos[..., :h], sin[..., :h]
        xe, xo = x[..., 0::2], x[..., 1::2]
        return _cat([xe * c - xo * s, xo * c + xe * s])
    raise ValueError("rope: style: expected one of %s, got %r" % (ROPE_STYLES, style))


def absorb_q(q_nope, q_pe, w_uk):
    """[T, H, 512 + 64] = [q_nope[t,h]·W_UK[h] | q_pe[t,h]] (q_pe already rotated). Computed in
    the inputs' dtype (bf16 in, bf16 out; the matmul accumulates in f32 on GPUs)."""
    lat = _einsum("thn,hnc->thc", q_nope, w_uk)
    if _is_torch(lat) and lat.dtype != q_pe.dtype:
        lat = lat.to(q_pe.dtype)
    elif not _is_torch(lat) and lat.dtype != q_pe.dtype:
        lat = lat.astype(q_pe.dtype)
    return _cat([lat, q_pe])


def up_project(out_latent, w_uv):
    """[T, H, v] = W_UV[h]·out_latent[t,h] (the input of o_proj, per head)."""
    return _einsum("thc,hvc->thv", out_latent, w_uv)


def cos_sin_table(cos, sin):
    """DSA's cos_sin [N, 64] f32 = [cos 32 | sin 32] from a model's cos/sin [N, 64] in
    transformers' cat(freqs, freqs) layout (attention scaling, YaRN and all, already in them).
    Raises UnsupportedModelError when the two halves differ (a layout this does not know)."""
    c = np.asarray(cos, dtype=np.float64)
    s = np.asarray(sin, dtype=np.float64)
    if c.ndim != 2 or c.shape != s.shape or c.shape[1] != ROPE:
        raise ValueError("cos_sin_table: expected cos and sin [N, 64], got %s and %s" % (list(c.shape), list(s.shape)))
    h = ROPE // 2
    if not (np.array_equal(c[:, :h], c[:, h:]) and np.array_equal(s[:, :h], s[:, h:])):
        raise UnsupportedModelError(
            "rotary embedding: expected cos/sin in the cat(freqs, freqs) layout (columns i and i+32 equal); "
            "this model's rotary embedding lays them out otherwise")
    return np.ascontiguousarray(np.concatenate([c[:, :h], s[:, :h]], axis=1).astype(np.float32))


def cos_sin_from_inv_freq(inv_freq, n, attention_scaling=1.0):
    """The same table from the inverse frequencies [32] (what a default/YaRN rotary embedding
    holds), computed in f32 like transformers does (positions · inv_freq, then cos/sin)."""
    inv = np.asarray(inv_freq, dtype=np.float32).reshape(-1)
    if inv.shape[0] != ROPE // 2:
        raise ValueError("cos_sin_from_inv_freq: expected 32 inverse frequencies, got %d" % inv.shape[0])
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
    sc = np.float32(attention_scaling)
    return np.ascontiguousarray(np.concatenate([np.cos(ang) * sc, np.sin(ang) * sc], axis=1).astype(np.float32))


def compact_batch(valid, prev_lens):
    """The real tokens of a padded step.

    valid [B, S] bool: which of this call's S columns of each row are real tokens (the last S
    columns of the 2-D attention mask; padding is 0 there, wherever it sits). prev_lens [B]:
    real tokens each sequence already has in the cache.

    Returns a dict: sel [T] int64 (flat b·S + s of the real tokens, ordered by sequence, the
    order of the step's rows), q_lens / kv_lens [B] int32, pos [T] int32 (each token's position
    in its sequence's cache, i.e. the compacted position), seq [T] int32, all_valid (no padding).
    """
    v = np.asarray(valid, dtype=bool)
    if v.ndim != 2:
        raise ValueError("compact_batch: valid: expected [B, S], got %s" % list(v.shape))
    B, S = v.shape
    prev = np.asarray(prev_lens, dtype=np.int64).reshape(-1)
    if prev.shape[0] != B:
        raise ValueError("compact_batch: prev_lens: expected [B = %d], got %d" % (B, prev.shape[0]))
    q_lens = v.sum(axis=1).astype(np.int64)
    kv_lens = prev + q_lens
    sel = np.flatnonzero(v.reshape(-1)).astype(np.int64)
    seq = (sel // max(S, 1)).astype(np.int32)
    # Rank of each real token within its row, plus the row's cached length.
    rank = np.cumsum(v, axis=1) - 1
    pos = (rank.reshape(-1)[sel] + prev[seq]).astype(np.int32)
    return dict(sel=sel, q_lens=q_lens.astype(np.int32), kv_lens=kv_lens.astype(np.int32), pos=pos, seq=seq,
                all_valid=bool(v.all()), B=B, S=S)


class PageTable:
    """Pages of the paged MLA / indexer caches, per sequence (one block table serves every layer
    and both caches: SPEC 4). Pages are handed out in order and never freed while the table
    lives (one generate call); num_pages is how many the cache tensors must hold."""

    def __init__(self, batch_size, page_size):
        if page_size <= 0:
            raise ValueError("PageTable: page_size: expected > 0, got %d" % page_size)
        self.page_size = int(page_size)
        self.pages = [[] for _ in range(int(batch_size))]
        self.num_pages = 0

    @property
    def batch_size(self):
        return len(self.pages)

    def reserve(self, kv_lens):
        """Gives each sequence the pages its kv_lens[b] tokens need; returns num_pages."""
        lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)
        if lens.shape[0] != len(self.pages):
            raise ValueError("PageTable.reserve: expected %d lengths, got %d" % (len(self.pages), lens.shape[0]))
        for b, n in enumerate(lens):
            need = -(-int(n) // self.page_size)
            while len(self.pages[b]) < need:
                self.pages[b].append(self.num_pages)
                self.num_pages += 1
        return self.num_pages

    def block_table(self):
        """[B, max_blocks] int32, -1 past each sequence's pages (at least one column)."""
        width = max([1] + [len(p) for p in self.pages])
        t = np.full((len(self.pages), width), -1, dtype=np.int32)
        for b, p in enumerate(self.pages):
            t[b, :len(p)] = p
        return t

    def slots(self, seq, pos):
        """Cache slot (page · page_size + offset) of token pos of sequence seq (arrays)."""
        seq = np.asarray(seq, dtype=np.int64)
        pos = np.asarray(pos, dtype=np.int64)
        t = self.block_table()
        return t[seq, pos // self.page_size].astype(np.int64) * self.page_size + pos % self.page_size


def _cfg(config, name, default=None):
    return getattr(config, name, default)


def rope_type_of(config):
    """The config's rope type: rope_parameters['rope_type'] (transformers 5) or rope_scaling's."""
    for attr in ("rope_parameters", "rope_scaling"):
        rp = _cfg(config, attr)
        if isinstance(rp, dict):
            t = rp.get("rope_type", rp.get("type"))
            if t is not None:
                return str(t)
    return "default"


def indexer_roles(config, num_layers):
    """'full' / 'shared' per layer from config.indexer_types (GLM-5.2-style configs), else all
    'full'. A shared layer reuses the indices of the last full layer before it."""
    types = _cfg(config, "indexer_types")
    if types is None:
        return ["full"] * num_layers
    roles = [str(t) for t in list(types)[:num_layers]]
    if len(roles) < num_layers:
        raise UnsupportedModelError("config.indexer_types: expected one entry per layer (%d), got %d"
                                    % (num_layers, len(roles)))
    for i, r in enumerate(roles):
        if r not in ("full", "shared"):
            raise UnsupportedModelError("config.indexer_types[%d]: expected 'full' or 'shared', got %r" % (i, r))
    if roles and roles[0] == "shared":
        raise UnsupportedModelError("config.indexer_types[0]: a 'shared' first layer has no full layer to share")
    return roles


def geometry_from_config(config, family, *, index_rope):
    """The DSA geometry dict (for dsa.plan) of a transformers config of `family` ('glm-5' or
    'deepseek-v3.2'). Raises UnsupportedModelError naming each field DSA cannot serve."""
    problems = []

    def need(name, ok, expect):
        v = _cfg(config, name)
        if not ok(v):
            problems.append("config.%s = %r (DSA needs %s)" % (name, v, expect))
        return v

    H = need("num_attention_heads", lambda v: isinstance(v, int) and v > 0, "> 0")
    need("kv_lora_rank", lambda v: v == LATENT, "512: the latent width of the MLA cache")
    need("qk_rope_head_dim", lambda v: v == ROPE, "64")
    nope = need("qk_nope_head_dim", lambda v: isinstance(v, int) and v > 0, "> 0")
    vdim = need("v_head_dim", lambda v: isinstance(v, int) and v > 0, "> 0")
    need("q_lora_rank", lambda v: isinstance(v, int) and v > 0, "a q_lora_rank (the indexer reads q_a's output)")
    Hi = need("index_n_heads", lambda v: isinstance(v, int) and v > 0, "> 0")
    need("index_head_dim", lambda v: v == INDEX_HEAD_DIM, "128")
    K = need("index_topk", lambda v: isinstance(v, int) and 0 < v <= 16384 and v % 64 == 0,
             "a positive multiple of 64 up to 16384")
    L = need("num_hidden_layers", lambda v: isinstance(v, int) and v > 0, "> 0")
    P = need("max_position_embeddings", lambda v: isinstance(v, int) and v > 0, "> 0")
    rt = rope_type_of(config)
    if rt not in STATIC_ROPE_TYPES:
        problems.append("rope type %r (DSA's cos_sin table is one fixed table; supported: %s)"
                        % (rt, ", ".join(STATIC_ROPE_TYPES)))
    if index_rope not in ROPE_STYLES:
        problems.append("index_rope = %r (expected one of %s)" % (index_rope, ROPE_STYLES))
    if problems:
        raise UnsupportedModelError("dsa.integrations.transformers: unsupported %s config: %s"
                                    % (family, "; ".join(problems)))
    return dict(name=family, num_heads=H, kv_lora_rank=LATENT, qk_rope_head_dim=ROPE, qk_nope_head_dim=nope,
                v_head_dim=vdim, q_lora_rank=int(_cfg(config, "q_lora_rank")), index_heads=Hi,
                index_head_dim=INDEX_HEAD_DIM, topk=K, index_rope=index_rope, num_layers=L, num_mtp_layers=0,
                shared_indexer_pattern=False, max_positions=P)


def code_names(source):
    """The identifiers of Python source, comments and strings left out (so a docstring that says
    "non-interleaved" does not count); None when source is None or does not tokenize."""
    if source is None:
        return None
    import io
    import textwrap
    import tokenize
    try:
        toks = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
        return {t.string for t in toks if t.type == tokenize.NAME}
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def detect_rope_styles(family, config, attention_source=None, indexer_source=None):
    """RoPE styles (MLA, indexer) of a transformers DSA attention, from the identifiers its
    forward's source uses where it can be read, else the family's defaults. The versions of
    transformers read for this (docs/transformers.md): DeepSeek-V3.2 rotates q_pe/k_pe
    interleaved and the indexer half-split; GLM-5 rotates both half-split. Source that reads
    config.rope_interleave / config.indexer_rope_interleave gets the config's value (default
    True). Returns (mla, index, notes)."""
    notes = []

    def style_from(src, flag, default_interleaved):
        names = code_names(src)
        if names is None:
            return ("interleaved" if default_interleaved else "half_split"), "family default"
        if flag in names:
            v = bool(_cfg(config, flag, True))
            return ("interleaved" if v else "half_split"), "config.%s" % flag
        if any("interleave" in n for n in names):
            return "interleaved", "forward source"
        return "half_split", "forward source"

    mla, why_m = style_from(attention_source, "rope_interleave", family == "deepseek-v3.2")
    idx, why_i = style_from(indexer_source, "indexer_rope_interleave", False)
    notes.append("MLA RoPE %s (%s), indexer RoPE %s (%s)" % (mla, why_m, idx, why_i))
    names = code_names(indexer_source)
    relu = None if names is None else "relu" in names
    if relu is False:
        notes.append("this transformers indexer scores without ReLU; DSA applies it (SPEC 3, the reference "
                     "model): sparse selections will differ from transformers' eager forward")
    return mla, idx, notes
