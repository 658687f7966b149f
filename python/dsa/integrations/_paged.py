"""The paged DSA caches of a model and the calls to the layer step, framework-free.

``StepRunner`` is the one place that calls ``dsa.Attention.step``: a per-batch ``begin`` (the
step's lengths, block table and positions, once per forward for all layers) and a per-layer
``run``. It mirrors the per-batch preparation / per-layer run split of the engine-shaped step, so
moving onto that API changes this class only.

``PagedKV`` holds one sequence batch's caches (every layer's MLA cache, and the indexer cache
of every layer that owns one) in pages handed out by a ``PageTable``; tensors come from an
``ops`` object (``NumpyOps`` here, a torch one in dsa.integrations.transformers), so the same
code runs on numpy arrays (tests without torch) and torch tensors (CPU or CUDA).

``run_mla_layer`` is one layer of absorbed MLA on DSA: absorbed q in, ``[T, H, v]`` (the input
of o_proj) out.
"""
import numpy as np

from ._mla_math import absorb_q, compact_batch, PageTable, up_project

MLA_TOKEN_BYTES = {"bf16": 1152, "fp8": 656}
INDEX_TOKEN_BYTES = 132


class NumpyOps:
    """Array making for PagedKV / run_mla_layer on numpy (the CPU backend)."""

    def zeros_u8(self, shape):
        return np.zeros(shape, dtype=np.uint8)

    def empty_i32(self, shape):
        return np.empty(shape, dtype=np.int32)

    def device_i32(self, a):
        return np.ascontiguousarray(a, dtype=np.int32)


class StepRunner:
    """Calls of the layer step over one plan (one workspace for every layer of the model)."""

    def __init__(self, plan, *, hadamard=True):
        import dsa
        if not hasattr(dsa, "Attention"):
            raise NotImplementedError("dsa: this build has no layer step (dsa.Attention); rebuild from a tree "
                                      "with include/dsa/layer.h")
        self.plan = plan
        self.attention = dsa.Attention(plan)
        self.hadamard = bool(hadamard)
        self.batch = None
        self.last_report = None

    def begin(self, q_lens, kv_lens, block_table, positions=None):
        """The batch of one forward: q_lens / kv_lens host int32 [B], block_table [B, max_blocks]
        int32 on the device, positions [T] int32 on the device (the indexer's RoPE positions;
        None: the cache positions)."""
        self.batch = dict(q_lens=np.ascontiguousarray(q_lens, dtype=np.int32),
                          kv_lens=np.ascontiguousarray(kv_lens, dtype=np.int32),
                          block_table=block_table, positions=positions)

    def end(self):
        self.batch = None

    def run(self, q, kv_c, k_pe, mla_cache, *, role, sm_scale, index_q=None, index_k=None, index_w=None,
            cos_sin=None, index_cache=None, indices_in=None, indices_out=None):
        """One layer: writes the tokens into the caches and attends. Returns out [T, H, 512]."""
        b = self.batch
        if b is None:
            raise RuntimeError("StepRunner.run: no batch (call begin first)")
        kw = {}
        if role != "shared":
            kw = dict(index_q=index_q, index_k=index_k, index_w=index_w, cos_sin=cos_sin, index_cache=index_cache,
                      hadamard=self.hadamard, indices_out=indices_out)
        else:
            kw = dict(indices_in=indices_in)
        out, _lse, report = self.attention.step(q, kv_c, k_pe, b["q_lens"], b["kv_lens"], b["block_table"], mla_cache,
                                                role=role, positions=b["positions"], sm_scale=float(sm_scale), **kw)
        self.last_report = report
        return out


class PagedKV:
    """The DSA caches of one batch of sequences, for every layer.

    roles: per layer 'full' (MLA + indexer cache) or 'shared' (MLA cache only). Caches grow (by
    doubling, old pages copied) as sequences grow; pages are never freed while this lives.
    """

    def __init__(self, roles, batch_size, *, cache_dtype="bf16", page_size=64, ops=None):
        if cache_dtype not in MLA_TOKEN_BYTES:
            raise ValueError("cache_dtype: expected 'bf16' or 'fp8', got %r" % (cache_dtype,))
        self.roles = list(roles)
        self.cache_dtype = cache_dtype
        self.page_size = int(page_size)
        self.ops = ops if ops is not None else NumpyOps()
        self.table = PageTable(batch_size, page_size)
        self.lens = np.zeros(int(batch_size), dtype=np.int64)
        self.capacity = 0
        self.mla = [None] * len(self.roles)
        self.index = [None] * len(self.roles)
        self.broken = None  # set when a forward failed half-way (the caches no longer match lens)
        self.inflight = False  # a forward admitted its tokens and has not finished

    @property
    def batch_size(self):
        return self.table.batch_size

    def begin(self, valid):
        """Admits one forward's tokens. valid [B, S] bool: the real tokens among this call's
        columns. Returns compact_batch's dict plus block_table (host int32)."""
        if self.broken:
            raise RuntimeError("dsa: these caches are unusable: an earlier forward failed (%s); start a new "
                               "generate / cache" % self.broken)
        v = np.asarray(valid, dtype=bool)
        if v.shape[0] != self.batch_size:
            raise NotImplementedError(
                "dsa: the batch changed size (%d sequences, the caches hold %d): reordering or dropping "
                "sequences of a cache (beam search, contrastive search) is not supported" % (v.shape[0], self.batch_size))
        c = compact_batch(v, self.lens)
        need = self.table.reserve(c["kv_lens"])
        if need > self.capacity:
            self._grow(need)
        self.lens = c["kv_lens"].astype(np.int64)
        c["block_table"] = self.table.block_table()
        return c

    def _grow(self, need):
        cap = max(need, 2 * self.capacity, 4)
        for lst, width in ((self.mla, MLA_TOKEN_BYTES[self.cache_dtype]), (self.index, INDEX_TOKEN_BYTES)):
            for i, old in enumerate(lst):
                if old is None:
                    continue
                new = self.ops.zeros_u8((cap, self.page_size, width))
                new[:self.capacity] = old
                lst[i] = new
        self.capacity = cap

    def caches(self, layer):
        """(mla_cache, index_cache or None) of a layer, allocated on first use."""
        if self.mla[layer] is None:
            self.mla[layer] = self.ops.zeros_u8((self.capacity, self.page_size, MLA_TOKEN_BYTES[self.cache_dtype]))
        if self.roles[layer] == "full" and self.index[layer] is None:
            self.index[layer] = self.ops.zeros_u8((self.capacity, self.page_size, INDEX_TOKEN_BYTES))
        return self.mla[layer], self.index[layer]

    def bytes(self):
        n = 0
        for lst in (self.mla, self.index):
            for t in lst:
                if t is not None:
                    n += int(np.prod(t.shape))
        return n


def run_mla_layer(runner, kv, layer, *, q_nope, q_pe, kv_c, k_pe, w_uk, w_uv, sm_scale, index_q=None, index_k=None,
                  index_w=None, cos_sin=None, indices_in=None, indices_out=None):
    """One layer's attention on DSA for the T real tokens of the batch runner.begin() set.

    q_nope [T, H, qk_nope], q_pe [T, H, 64] (rotated), kv_c [T, 512] (after kv_a_layernorm),
    k_pe [T, 64] (rotated), w_uk / w_uv from split_kv_b. Full layers: index_q [T, H_idx, 128]
    and index_k [T, 128] before RoPE, index_w [T, H_idx] (weights_proj's output, unscaled: the
    step folds in 128^-0.5 · H_idx^-0.5 and the FP8 query scales, SPEC 3), cos_sin [N, 64].
    indices_out ([T, topk] int32) receives a full layer's selection (for the shared layers after
    it, or for inspection); shared layers take it as indices_in. Returns [T, H, v]."""
    role = kv.roles[layer]
    mla_cache, index_cache = kv.caches(layer)
    q = absorb_q(q_nope, q_pe, w_uk)
    out = runner.run(q, kv_c, k_pe, mla_cache, role=role, sm_scale=sm_scale, index_q=index_q, index_k=index_k,
                     index_w=index_w, cos_sin=cos_sin, index_cache=index_cache, indices_in=indices_in,
                     indices_out=indices_out)
    return up_project(out, w_uv)
