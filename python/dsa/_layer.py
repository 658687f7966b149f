"""The planner and the layer step (SPEC 6): dsa.Planner / dsa.plan and dsa.Attention."""
from . import _dsa
from ._frameworks import Context, dtype_name
from ._ops import _shape


def _bytes(name, v):
    if isinstance(v, str):
        try:
            return _dsa.parse_byte_size(v)
        except ValueError as e:
            raise ValueError("plan: %s: %s" % (name, e)) from None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("plan: %s: expected a byte count (int >= 0 or a string like '512MiB'), got %r" % (name, v))
    return v


class Plan:
    """A plan (dsa/planner.h): the workspace a step within the declared limits needs, and the KV
    cache pages that fit after it. Attributes mirror the C++ Plan (workspace_bytes, score_region_bytes,
    min_score_budget_bytes, kv_pages, buffers, ...); as_dict() gives all of them."""

    def __init__(self, impl):
        self._impl = impl
        self._dict = impl.as_dict()

    def as_dict(self):
        return dict(self._dict)

    def __getattr__(self, name):
        d = self.__dict__.get("_dict")
        if d is not None and name in d:
            return d[name]
        raise AttributeError("Plan has no attribute %r" % name)

    def rows_per_chunk(self, context_len):
        """Rows of one scoring chunk when every row sees context_len keys (0: rows are tiled)."""
        return self._impl.rows_per_chunk(int(context_len))

    def tile_width_for(self, context_len):
        return self._impl.tile_width_for(int(context_len))

    def __repr__(self):
        return "dsa.Plan(workspace=%s, score_region=%s, kv_pages=%d)" % (
            _dsa.format_byte_size(self.workspace_bytes), _dsa.format_byte_size(self.score_region_bytes), self.kv_pages)


class Planner:
    """Declared limits of a deployment; plan() fixes the workspace before the KV cache is sized.

    geometry: a preset name ('deepseek-v3.2', 'glm-5', 'glm-5.2') or a dict like
    dsa.geometry_preset() returns. Byte sizes take ints or strings ('512MiB', '141GiB').
    device: 'cpu', 'cuda' or 'cuda:N'. Memory: the KV cache gets kv_cache_fraction (default 0.9) of
    device_memory_bytes less the workspace; memory_is_exact=True gives it all of that (device_memory_bytes
    is exactly DSA's share). plan.as_dict()["geometry"] has every geometry field, overrides included.
    core_mode=True reserves what steps in core mode need (Attention.step's q_nope / q_pe / kv_b_proj).
    select: 'auto' (default: fused or unfused selection per chunk by the cost model, among what the
    device has), 'unfused' or 'fused' (docs/fused_select.md).
    plan() raises ValueError for limits the score budget cannot
    serve, naming the smallest budget that works.
    """

    def __init__(self, geometry="deepseek-v3.2", *, cache_dtype="bf16", page_size=64, max_tokens_per_step=8192,
                 max_seqs_per_step=256, max_context=0, max_next_n=1, score_budget_bytes=512 << 20,
                 device_memory_bytes=0, kv_cache_fraction=0.9, memory_is_exact=False, device="cpu",
                 core_mode=False, select="auto"):
        self.geometry = geometry
        self.config = dict(cache_dtype=cache_dtype, page_size=int(page_size),
                           max_tokens_per_step=int(max_tokens_per_step), max_seqs_per_step=int(max_seqs_per_step),
                           max_context=int(max_context), max_next_n=int(max_next_n),
                           score_budget_bytes=_bytes("score_budget_bytes", score_budget_bytes),
                           device_memory_bytes=_bytes("device_memory_bytes", device_memory_bytes),
                           kv_cache_fraction=float(kv_cache_fraction), memory_is_exact=bool(memory_is_exact),
                           core_mode=bool(core_mode), select=str(select), device=str(device))

    def plan(self):
        return Plan(_dsa.make_plan(self.geometry, dict(self.config)))


def plan(geometry="deepseek-v3.2", **limits):
    """Planner(geometry, **limits).plan()."""
    return Planner(geometry, **limits).plan()


# The one prefix of every refusal of Attention.step / prepare / run (the C++ entry points' own).
_STEP = "attention_step"


def _next_n(next_n, q_lens, cu_seqlens):
    """0 (host-planned) or the graph-stable decode form's tokens per sequence."""
    if next_n is None:
        return 0
    if isinstance(next_n, bool) or not isinstance(next_n, int):
        raise TypeError("%s: next_n: expected an int >= 1 (graph-stable decode), got %s" % (_STEP, type(next_n).__name__))
    if next_n < 1:
        raise ValueError("%s: next_n: expected an int >= 1 (graph-stable decode), got %r" % (_STEP, next_n))
    if q_lens is not None or cu_seqlens is not None:
        raise ValueError("%s: q_lens, cu_seqlens: expected None with next_n (every sequence has next_n tokens)" % _STEP)
    return next_n


class Attention:
    """One DSA layer step at a time over a plan (dsa/layer.h). The workspace (plan.workspace_bytes)
    is allocated on the first step in the framework and device of q and reused; pass workspace= to
    own it (and before CUDA-graph capture, run one step or pass it, so capture allocates nothing
    of dsa's)."""

    def __init__(self, plan):
        if not isinstance(plan, Plan):
            raise TypeError("Attention: plan: expected a dsa.Plan, got %s" % type(plan).__name__)
        self.plan = plan
        self._impl = _dsa.Attention(plan._impl)
        self._workspace = {}

    def step(self, q, kv_c, k_pe, q_lens, kv_lens, block_table, mla_cache, *, role="full", index_q=None,
             index_k=None, index_w=None, cos_sin=None, index_cache=None, positions=None, hadamard=False,
             attn_sink=None, sm_scale=0.0, indices_in=None, indices_out=None, force_score=False, out=None,
             lse=None, workspace=None, stream=None, time_stages=False, cu_seqlens=None, next_n=None,
             slot_mapping=None, q_nope=None, q_pe=None, kv_b_proj=None,
             dense_form="auto"):
        """One step of the layer (SPEC 6): writes the new tokens into mla_cache (and index_cache),
        routes each sequence (dense when kv_len <= topk and nothing consumes its indices, else
        scored sparse; 'shared' layers reuse indices_in), and attends.

        q [T, H, 576] bf16 (f32 on the CPU); kv_c [T, 512], k_pe [T, 64]; q_lens, kv_lens [B] i32 in
        host memory; block_table [B, max_blocks] i32 (pages of both caches); caches as
        write_mla_cache / write_indexer_cache take them, with the plan's page size and MLA layout.
        full / mtp layers need index_q [T, H_idx, 128], index_k [T, 128], index_w [T, H_idx],
        cos_sin [max_positions, 64] and index_cache. indices_out ([T, topk] i32) receives this
        layer's request-local selection.

        Returns (out [T, H, 512], lse [T, H] f32, report): report is a dict (sequences and rows per
        route, chunks, tiles, workspace and score-region high-water marks, per-stage host ms
        ms_*, host_us; with time_stages=True on CUDA also GPU ms per stage gpu_ms_*, gpu_timed True
        when they were measured: the step then waits for its last stage; ignored while capturing).

        Graph-stable decode: next_n=N (with q_lens=None) makes the batch B sequences of N tokens
        each with kv_lens a [B] i32 tensor on the plan's device, read by the device; one CUDA graph
        captured at batch size B then serves every later decode step of that size (update kv_lens,
        block_table, positions and the inputs in place between replays). See
        docs/engine-integration.md.

        slot_mapping ([T] int64 on the plan's device, optional): each token's cache slot (vLLM
        slot_mapping, SGLang out_cache_loc), equal to its block-table slot, or -1 for a padded token:
        written nowhere, its rows out = 0, lse = +inf, indices_out = -1; a sequence is padded whole
        or not at all (pad with sequences of their own).

        Core mode (a plan made with core_mode=True; SPEC 6): pass q=None and the un-absorbed query
        q_nope [T, H, qk_nope], q_pe [T, H, 64] with the layer's kv_b_proj [H * (qk_nope + v), 512]
        bf16 (HF kv_b_proj.weight); out is then [T, H, v], the input of o_proj. Sparse and decode
        rows are absorbed with W_UK and up-projected with W_UV inside the step; dense rows take
        the MHA form where the cost model prefers it (dense_form "auto"; "mha" or "absorbed"
        force it). report["mha_seqs"] / ["mha_rows"] say how many went MHA.
        """
        return self._layer("step", q, kv_c, k_pe, q_lens, kv_lens, block_table, mla_cache, role, index_q, index_k,
                           index_w, cos_sin, index_cache, positions, hadamard, attn_sink, sm_scale, indices_in,
                           indices_out, force_score, out, lse, workspace, stream, time_stages, cu_seqlens, next_n,
                           slot_mapping, q_nope, q_pe, kv_b_proj, dense_form)

    def prepare(self, q_lens, kv_lens, block_table, *, positions=None, workspace=None, stream=None,
                time_stages=False, cu_seqlens=None, next_n=None):
        """Plan once per step: validates the batch (q_lens, kv_lens, block_table, positions), builds
        its row tables and uploads them into the workspace, once for all layers of the step. Then
        run(...) each layer with the same batch arguments. The workspace is this object's (one
        for every layer; allocated in block_table's framework and device) unless given.
        next_n=N (q_lens=None): the graph-stable decode form (see step).
        Returns the report dict (host_us: the host cost of the preparation)."""
        _shape(_STEP, "block_table", block_table, 2, "[B, max_blocks]")
        ctx = Context(_STEP, block_table, "block_table", stream)
        workspace = self._workspace_for(ctx, workspace)
        p = ctx.prep
        args = dict(q_lens=p(q_lens), cu_seqlens=p(cu_seqlens), kv_lens=p(kv_lens), block_table=p(block_table),
                    positions=p(positions), workspace=p(workspace), time_stages=bool(time_stages),
                    next_n=_next_n(next_n, q_lens, cu_seqlens))
        with ctx.device_guard():
            return self._impl.step(args, ctx.stream, "prepare")

    def run(self, q, kv_c, k_pe, q_lens, kv_lens, block_table, mla_cache, *, role="full", index_q=None,
            index_k=None, index_w=None, cos_sin=None, index_cache=None, positions=None, hadamard=False,
            attn_sink=None, sm_scale=0.0, indices_in=None, indices_out=None, force_score=False, out=None,
            lse=None, workspace=None, stream=None, time_stages=False, cu_seqlens=None, next_n=None,
            slot_mapping=None, q_nope=None, q_pe=None, kv_b_proj=None,
            dense_form="auto"):
        """Run per layer: one layer over the batch prepare() prepared, with step()'s arguments; the
        batch arguments (q_lens, kv_lens, block_table, positions, workspace) must be prepare's.
        Returns (out, lse, report); report["host_us"] is the layer's host cost."""
        return self._layer("run", q, kv_c, k_pe, q_lens, kv_lens, block_table, mla_cache, role, index_q, index_k,
                           index_w, cos_sin, index_cache, positions, hadamard, attn_sink, sm_scale, indices_in,
                           indices_out, force_score, out, lse, workspace, stream, time_stages, cu_seqlens, next_n,
                           slot_mapping, q_nope, q_pe, kv_b_proj, dense_form)

    def _workspace_for(self, ctx, workspace):
        if workspace is None and self.plan.workspace_bytes > 0:
            key = (ctx.fw, ctx.cuda, ctx.index)
            workspace = self._workspace.get(key)
            if workspace is None:
                workspace = ctx.empty((self.plan.workspace_bytes,), "u8")
                self._workspace[key] = workspace
        return workspace

    def _layer(self, op, q, kv_c, k_pe, q_lens, kv_lens, block_table, mla_cache, role, index_q, index_k, index_w,
               cos_sin, index_cache, positions, hadamard, attn_sink, sm_scale, indices_in, indices_out,
               force_score, out, lse, workspace, stream, time_stages, cu_seqlens, next_n=None, slot_mapping=None,
               q_nope=None, q_pe=None, kv_b_proj=None, dense_form="auto"):
        core = q is None and (q_nope is not None or q_pe is not None or kv_b_proj is not None)
        if core:  # core mode: [T, H, v] out, v from kv_b_proj's rows per head
            T, H, nope = _shape(_STEP, "q_nope", q_nope, 3, "[T, H, qk_nope]")
            rows_w, _ = _shape(_STEP, "kv_b_proj", kv_b_proj, 2, "[H * (qk_nope + v), 512]")
            ctx = Context(_STEP, q_nope, "q_nope", stream)
            width, lead = rows_w // max(H, 1) - nope, q_nope
        else:
            T, H, _ = _shape(_STEP, "q", q, 3, "[T, H, 576]")
            ctx = Context(_STEP, q, "q", stream)
            width, lead = 512, q
        if out is None:
            out = ctx.empty((T, H, width), "f32" if dtype_name(lead) == "float32" else "bf16", rep=lead)
        if lse is None:
            lse = ctx.empty((T, H), "f32")
        workspace = self._workspace_for(ctx, workspace)
        p = ctx.prep
        args = dict(role=role, q_lens=p(q_lens), cu_seqlens=p(cu_seqlens), kv_lens=p(kv_lens), block_table=p(block_table),
                    positions=p(positions), kv_c=p(kv_c), k_pe=p(k_pe), q=p(q), index_q=p(index_q),
                    index_k=p(index_k), index_w=p(index_w), cos_sin=p(cos_sin), hadamard=bool(hadamard),
                    attn_sink=p(attn_sink), sm_scale=float(sm_scale), mla_cache=p(mla_cache),
                    index_cache=p(index_cache), indices_in=p(indices_in), indices_out=p(indices_out),
                    force_score=bool(force_score), out=p(out), lse=p(lse), workspace=p(workspace),
                    time_stages=bool(time_stages), next_n=_next_n(next_n, q_lens, cu_seqlens),
                    slot_mapping=p(slot_mapping), q_nope=p(q_nope), q_pe=p(q_pe), kv_b_proj=p(kv_b_proj),
                    dense_form=str(dense_form))
        with ctx.device_guard():
            report = self._impl.step(args, ctx.stream, op)
        return out, lse, report
