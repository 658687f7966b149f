"""The DSA ops over any DLPack array (numpy, torch, CuPy).

Conventions shared by every function (see docs/python.md):

* dtypes: ``f32`` = float32, ``bf16`` = bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, or its bits
  as uint16), ``e4m3`` = float8_e4m3fn (torch.float8_e4m3fn, ml_dtypes, or its bits as uint8),
  ``i32``/``i64`` = int32/int64.
* Nothing is copied: every tensor is read in place through DLPack (numpy through its buffer).
  Strides are honoured where the C++ op allows them (usually: any stride but the last dim must
  be contiguous); other layouts raise ValueError naming the argument -- call ``.contiguous()``
  / ``np.ascontiguousarray`` yourself if you want a copy.
* Outputs are allocated in the framework and on the device of the leading tensor argument
  (numpy in -> numpy out, torch CUDA in -> torch CUDA out), unless given through ``out=`` (and
  the other output keywords), which are written in place and returned.
* CUDA work goes on torch's current stream when the inputs are torch tensors, CuPy's current
  stream for CuPy arrays, else on ``stream=`` (an int cudaStream_t or a stream object; default:
  the legacy default stream). The call does not synchronise. CPU work is done on return.
* Errors: ValueError (shape, stride, range, length), TypeError (dtype, not an array), each
  naming the op and the argument; NotImplementedError for a device this build lacks.
"""
import math

from . import _dsa
from ._frameworks import Context, dtype_name

_ROPE = {"half_split": 0, "neox": 0, "interleaved": 1}
_CACHE_DTYPE = {None: -1, "bf16": 0, "fp8": 1}


def _shape(op, name, x, ndim=None, labels=None):
    if x is None:
        raise ValueError("%s: %s: is required%s" % (op, name, " (expected a tensor of shape %s)" % labels if labels else ""))
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError("%s: %s: expected an array or tensor, got %s" % (op, name, type(x).__name__))
    shape = tuple(int(s) for s in shape)
    if ndim is not None and len(shape) != ndim:
        raise ValueError("%s: %s: expected %d dims %s, got shape %s" % (op, name, ndim, labels or "", list(shape)))
    return shape


def _rope(op, rope):
    if isinstance(rope, str) and rope in _ROPE:
        return _ROPE[rope]
    if rope in (0, 1) and not isinstance(rope, bool):
        return int(rope)
    raise ValueError("%s: rope: expected 'half_split' (NeoX, DeepSeek-V3.2) or 'interleaved' (GLM-5), got %r" % (op, rope))


def _cache_dtype(op, cache_dtype):
    if cache_dtype in _CACHE_DTYPE:
        return _CACHE_DTYPE[cache_dtype]
    raise ValueError("%s: cache_dtype: expected None (infer from the cache shape), 'bf16' or 'fp8', got %r" % (op, cache_dtype))


def _page_size(op, page_size):
    if page_size is None:
        return -1
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError("%s: page_size: expected a positive int or None, got %r" % (op, page_size))
    return page_size


def _int(op, name, v, minimum=None):
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import operator
            v = operator.index(v)
        except TypeError:
            raise TypeError("%s: %s: expected an int, got %s" % (op, name, type(v).__name__)) from None
    if minimum is not None and v < minimum:
        raise ValueError("%s: %s: expected >= %d, got %d" % (op, name, minimum, v))
    return int(v)


def _float(op, name, v):
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError("%s: %s: expected a float, got %s" % (op, name, type(v).__name__)) from None


def _max_span(ctx, op, ks, ke):
    """max(ke - ks) over rows, read on the host (a device sync for CUDA tensors)."""
    if ctx.fw == "torch":
        if ks.numel() == 0:
            return 0
        return max(int((ke.long() - ks.long()).max().item()), 0)
    if ctx.fw == "cupy":
        if ks.size == 0:
            return 0
        return max(int((ke.astype("int64") - ks.astype("int64")).max()), 0)
    if ctx.cuda:
        raise ValueError("%s: width: required for CUDA arrays of type %s" % (op, type(ks).__name__))
    import numpy as np
    a = np.from_dlpack(ks) if ctx.fw == "dlpack" else ks
    b = np.from_dlpack(ke) if ctx.fw == "dlpack" else ke
    if a.size == 0:
        return 0
    return max(int((b.astype(np.int64) - a.astype(np.int64)).max()), 0)


# ---- indexer ------------------------------------------------------------------------------

def quantize_fp8(x, group=128, *, out=None, scale=None, stream=None):
    """Per-group FP8 quantisation (SPEC 3.3).

    x: [R, D] f32 or bf16, last dim contiguous, D % group == 0. Inputs are rounded to bf16 first;
    each run of ``group`` values gets ``s = 2^ceil(log2(max(amax, 1e-4) / 448))`` and
    ``x8 = e4m3(clamp(x / s, +-448))``.

    Returns (out [R, D] e4m3, scale [R, D // group] f32).
    """
    op = "quantize_fp8"
    group = _int(op, "group", group, 1)
    R, D = _shape(op, "x", x, 2, "[R, D]")
    ctx = Context(op, x, "x", stream)
    if out is None:
        out = ctx.empty((R, D), "e4m3", rep=None)
    if scale is None:
        scale = ctx.empty((R, D // group), "f32")
    with ctx.device_guard():
        _dsa.quantize_fp8(ctx.prep(x), group, ctx.prep(out), ctx.prep(scale), ctx.stream)
    return out, scale


def prepare_indexer_q(q, weights, positions, cos_sin, rope="half_split", hadamard=False, *,
                      return_q_scale=False, q_out=None, weights_out=None, q_scale=None, stream=None):
    """Indexer queries (SPEC 3.1-3.3): RoPE on dims 0..63, optional Hadamard-128, bf16, FP8.

    q: [T, H_idx, 128] f32 or bf16 (last dim contiguous); weights: [T, H_idx] f32 or bf16 (the
    per-head gate w); positions: [T] i32; cos_sin: [max_positions, 64] f32, per position
    ``[cos 32 | sin 32]`` (vLLM's cos_sin_cache convention); rope: 'half_split' (NeoX,
    DeepSeek-V3.2) or 'interleaved' (GLM-5).

    Returns (q_out [T, H_idx, 128] e4m3, weights_out [T, H_idx] f32) -- and q_scale [T, H_idx] f32
    when return_q_scale -- where ``weights_out = fl(w * c) * s_q``, ``c = fl(1/sqrt(128 * H_idx))``:
    the folded gate that indexer_logits takes.
    """
    op = "prepare_indexer_q"
    T, H, D = _shape(op, "q", q, 3, "[T, H_idx, 128]")
    ctx = Context(op, q, "q", stream)
    rope = _rope(op, rope)
    if q_out is None:
        q_out = ctx.empty((T, H, D), "e4m3")
    if weights_out is None:
        weights_out = ctx.empty((T, H), "f32")
    if q_scale is None and return_q_scale:
        q_scale = ctx.empty((T, H), "f32")
    with ctx.device_guard():
        _dsa.prepare_indexer_q(ctx.prep(q), ctx.prep(weights), ctx.prep(positions), ctx.prep(cos_sin), rope,
                               bool(hadamard), ctx.prep(q_out), ctx.prep(weights_out), ctx.prep(q_scale), ctx.stream)
    if q_scale is not None:
        return q_out, weights_out, q_scale
    return q_out, weights_out


def prepare_indexer_k(k, positions, cos_sin, rope="half_split", hadamard=False, *, k_out=None, k_scale=None,
                      stream=None):
    """Indexer keys (after the model's LayerNorm): RoPE, optional Hadamard, bf16, FP8, one scale
    per token.

    k: [T, 128] f32 or bf16; positions [T] i32; cos_sin as in prepare_indexer_q.
    Returns (k_out [T, 128] e4m3, k_scale [T] f32), ready for write_indexer_cache.
    """
    op = "prepare_indexer_k"
    T, D = _shape(op, "k", k, 2, "[T, 128]")
    ctx = Context(op, k, "k", stream)
    rope = _rope(op, rope)
    if k_out is None:
        k_out = ctx.empty((T, D), "e4m3")
    if k_scale is None:
        k_scale = ctx.empty((T,), "f32")
    with ctx.device_guard():
        _dsa.prepare_indexer_k(ctx.prep(k), ctx.prep(positions), ctx.prep(cos_sin), rope, bool(hadamard),
                               ctx.prep(k_out), ctx.prep(k_scale), ctx.stream)
    return k_out, k_scale


def indexer_logits(q, weights, k, k_scale, ks, ke, *, width=None, col_offset=0, out=None, stream=None):
    """Ragged indexer logits against a flat key buffer (SPEC 3.4).

    q: [M, H_idx, 128] e4m3; weights: [M, H_idx] f32 (the folded gates w'); k: [N, 128] e4m3;
    k_scale: [N] f32; ks, ke: [M] i32 with ``0 <= ks[i] <= ke[i] <= N``.

    ``out[i, c] = sum_h weights[i, h] * relu(q[i, h] . k[j]) * k_scale[j]`` with
    ``j = ks[i] + col_offset + c`` for ``j < ke[i]``; columns at or past ``ke[i] - ks[i]`` (less
    col_offset) hold -inf.

    Returns out [M, width] f32, ``width = max(ke - ks)`` by default: computing it reads ks/ke on the
    host, which synchronises a CUDA stream (and cannot be captured in a CUDA graph) -- pass
    ``width=`` (or ``out=``) to avoid it. col_offset (>= 0) computes one tile of columns.
    """
    op = "indexer_logits"
    M = _shape(op, "q", q, 3, "[M, H_idx, 128]")[0]
    ctx = Context(op, q, "q", stream)
    col_offset = _int(op, "col_offset", col_offset, 0)
    if out is None:
        if width is None:
            _shape(op, "ks", ks, 1, "[M]")
            _shape(op, "ke", ke, 1, "[M]")
            if not ctx.cuda:
                # Validate ks/ke (and every other argument) before sizing the output from them: a
                # zero-width call runs the op's checks and computes nothing.
                with ctx.device_guard():
                    _dsa.indexer_logits(ctx.prep(q), ctx.prep(weights), ctx.prep(k), ctx.prep(k_scale), ctx.prep(ks),
                                        ctx.prep(ke), col_offset, ctx.prep(ctx.empty((M, 0), "f32")), ctx.stream)
            span = _max_span(ctx, op, ks, ke)
            N = _shape(op, "k", k, 2, "[N, 128]")[0]
            if span > N:
                raise ValueError("%s: ke: expected 0 <= ks[i] <= ke[i] <= N = %d, got a row spanning %d keys" % (op, N, span))
            width = max(span - col_offset, 0)
        out = ctx.empty((M, _int(op, "width", width, 0)), "f32")
    with ctx.device_guard():
        _dsa.indexer_logits(ctx.prep(q), ctx.prep(weights), ctx.prep(k), ctx.prep(k_scale), ctx.prep(ks), ctx.prep(ke),
                            col_offset, ctx.prep(out), ctx.stream)
    return out


def indexer_logits_paged(q, weights, cache, block_table, kv_lens=None, next_n=1, *, width, row_seq=None,
                         row_len=None, col_offset=0, page_size=None, out=None, stream=None):
    """Paged indexer logits against the indexer K cache (decode, or any rows via row_seq/row_len).

    q: [R, H_idx, 128] e4m3; weights: [R, H_idx] f32; cache: the indexer K cache
    [num_blocks, page_size, 132] uint8 (or [num_blocks, block_bytes] with page_size=);
    block_table: [B, max_blocks] i32.
    Decode form: kv_lens [B] i32 and next_n, R == B * next_n; row ``b * next_n + i`` sees keys
    ``j < kv_lens[b] - next_n + i + 1``. General form: row_seq [R] i32 and row_len [R] i32 (row r
    of sequence row_seq[r] sees keys ``j < row_len[r]``).
    Returns out [R, width] f32, ``out[r, c]`` = score of key ``col_offset + c``, -inf past the row's
    keys. width is required (the host cannot know it without reading device data).
    """
    op = "indexer_logits_paged"
    R = _shape(op, "q", q, 3, "[R, H_idx, 128]")[0]
    ctx = Context(op, q, "q", stream)
    if out is None:
        out = ctx.empty((R, _int(op, "width", width, 0)), "f32")
    with ctx.device_guard():
        _dsa.indexer_logits_paged(ctx.prep(q), ctx.prep(weights), ctx.prep(cache), _page_size(op, page_size),
                                  ctx.prep(block_table), ctx.prep(kv_lens), _int(op, "next_n", next_n),
                                  ctx.prep(row_seq), ctx.prep(row_len), _int(op, "col_offset", col_offset, 0),
                                  ctx.prep(out), ctx.stream)
    return out


def indexer_topk(q, weights, cache, block_table, kv_lens=None, next_n=1, *, width, k, row_seq=None, row_len=None,
                 page_size=None, out=None, stream=None):
    """Score and select in one pass (docs/fused_select.md): the top-k of indexer_logits_paged's rows
    without writing the [R, width] scores.

    Inputs as indexer_logits_paged (decode form with kv_lens and next_n, or general form with
    row_seq and row_len); width bounds every row's key count; k a positive multiple of 64 (up to
    16384). Returns out [R, k] i32: the set topk gives on the same scores (ties to the lower
    index), ascending, then -1; rows with at most k keys get 0 .. L-1. CPU tensors only for now
    (on CUDA it raises, naming what exists).
    """
    op = "indexer_topk"
    R = _shape(op, "q", q, 3, "[R, H_idx, 128]")[0]
    k = _int(op, "k", k)
    ctx = Context(op, q, "q", stream)
    if out is None and 0 < k <= 16384:  # else allocate nothing: the C++ check names k
        out = ctx.empty((R, k), "i32")
    with ctx.device_guard():
        _dsa.indexer_topk(ctx.prep(q), ctx.prep(weights), ctx.prep(cache), _page_size(op, page_size),
                          ctx.prep(block_table), ctx.prep(kv_lens), _int(op, "next_n", next_n), ctx.prep(row_seq),
                          ctx.prep(row_len), _int(op, "width", width, 0), k, ctx.prep(out),
                          ctx.workspace_allocator(), ctx.stream)
    return out


# ---- top-k and index mapping -----------------------------------------------------------------

def topk(logits, lengths, k, *, return_values=False, out=None, values=None, stream=None):
    """Top-k selection (SPEC 3.5).

    logits: [M, W] f32 (last dim contiguous); lengths: [M] i32 with ``lengths[i] <= W``; k: a
    positive multiple of 64 (up to 16384).

    Row i holds the k best of ``logits[i, :lengths[i]]``: if ``lengths[i] <= k`` that is
    ``0 .. lengths[i]-1``; otherwise the k largest, ties at the k-th value going to the lower index,
    NaN ranking below every number. Indices come in ascending order, then ``-1`` fill.
    Deterministic on every backend.

    Returns out [M, k] i32, and (out, values [M, k] f32: the selected logits, -inf at -1 entries)
    when return_values (or values=) is given.
    """
    op = "topk"
    M = _shape(op, "logits", logits, 2, "[M, W]")[0]
    k = _int(op, "k", k)
    ctx = Context(op, logits, "logits", stream)
    k_ok = 0 < k <= 16384  # else allocate nothing: the C++ check names k
    if out is None and k_ok:
        out = ctx.empty((M, k), "i32")
    if values is None and return_values and k_ok:
        values = ctx.empty((M, k), "f32")
    with ctx.device_guard():
        _dsa.topk(ctx.prep(logits), ctx.prep(lengths), k, ctx.prep(out), ctx.prep(values),
                  ctx.workspace_allocator(), ctx.stream)
    return (out, values) if values is not None else out


def map_indices(indices, *, kv_start=None, block_table=None, page_size=64, row_seq=None, rows_per_seq=1,
                num_blocks=None, out=None, stream=None):
    """Map request-local key positions to cache addresses (SPEC 3.6).

    indices: [M, k] i32 (request-local positions, -1 = none). Row i belongs to sequence
    ``row_seq[i]`` ([M] i32) if given, else ``i // rows_per_seq``. Exactly one form:

    * flat: kv_start [B] i32 -> ``kv_start[b] + j`` (addresses in a gathered/flat KV buffer);
    * paged: block_table [B, max_blocks] i32 and page_size ->
      ``block_table[b][j // page_size] * page_size + j % page_size`` (cache slots).

    Negative entries, positions past the block table and negative block-table entries give -1.
    For host arrays, an address that does not fit int32 raises ValueError, and so does a
    block-table entry the indices use that is >= num_blocks (paged; the cache's page count, when
    given). Returns out [M, k] i32; ``out=indices`` maps in place.
    """
    op = "map_indices"
    if (kv_start is None) == (block_table is None):
        raise ValueError("map_indices: kv_start, block_table: expected exactly one (flat form: kv_start, paged "
                         "form: block_table)")
    shape = _shape(op, "indices", indices, 2, "[M, k]")
    ctx = Context(op, indices, "indices", stream)
    if out is None:
        out = ctx.empty(shape, "i32")
    with ctx.device_guard():
        _dsa.map_indices(ctx.prep(indices), ctx.prep(row_seq), _int(op, "rows_per_seq", rows_per_seq),
                         ctx.prep(kv_start), ctx.prep(block_table), _int(op, "page_size", page_size),
                         0 if num_blocks is None else _int(op, "num_blocks", num_blocks, 1), ctx.prep(out), ctx.stream)
    return out


# ---- caches -------------------------------------------------------------------------------------

def write_indexer_cache(k, k_scale, cache, slots=None, *, block_table=None, token_seq=None, token_pos=None,
                        page_size=None, stream=None):
    """Write prepared indexer keys into the paged indexer K cache (SPEC 4), in place.

    k: [T, 128] e4m3; k_scale: [T] f32 (from prepare_indexer_k). cache: [num_blocks, page_size, 132]
    uint8 -- the bytes of a page are ``[page_size x 128 e4m3][page_size x f32 scale]`` (8448 B for
    64 tokens; the 3-dim shape only counts bytes) -- or [num_blocks, block_bytes] with page_size=
    (default 64). Where each token goes: slots [T] i64 (``block * page_size + offset``, -1 skips
    the token), or block_table [B, max_blocks] i32 with token_seq [T] i32 and token_pos [T] i32.
    Returns None.
    """
    op = "write_indexer_cache"
    ctx = Context(op, k, "k", stream)
    with ctx.device_guard():
        _dsa.write_indexer_cache(ctx.prep(k), ctx.prep(k_scale), ctx.prep(cache), _page_size(op, page_size),
                                 ctx.prep(slots), ctx.prep(block_table), ctx.prep(token_seq), ctx.prep(token_pos),
                                 ctx.stream)


def write_mla_cache(kv_c, k_pe, cache, slots=None, *, block_table=None, token_seq=None, token_pos=None,
                    cache_dtype=None, page_size=None, stream=None):
    """Write MLA latents into the paged MLA cache in its dtype (SPEC 4), in place.

    kv_c: [T, 512] bf16 or f32; k_pe: [T, 64] bf16 or f32 (f32 is rounded to bf16 first).
    cache: [num_blocks, page_size, 576] bf16/uint16 or [num_blocks, page_size, 1152] uint8 (BF16
    layout ``[c_kv 512 | k_pe 64]``), or [num_blocks, page_size, 656] uint8 (FP8 layout
    ``[512 e4m3][4 f32 scales][64 bf16 k_pe]``: each 128-value tile of c_kv quantised with its own
    power-of-two scale); the layout follows from the last dim unless cache_dtype ('bf16'/'fp8')
    says it for a [num_blocks, block_bytes] cache. slots / block_table + token_seq + token_pos as in
    write_indexer_cache. Returns None.
    """
    op = "write_mla_cache"
    ctx = Context(op, kv_c, "kv_c", stream)
    with ctx.device_guard():
        _dsa.write_mla_cache(ctx.prep(kv_c), ctx.prep(k_pe), ctx.prep(cache), _cache_dtype(op, cache_dtype),
                             _page_size(op, page_size), ctx.prep(slots), ctx.prep(block_table), ctx.prep(token_seq),
                             ctx.prep(token_pos), ctx.stream)


def read_mla_cache(cache, slots, *, cache_dtype=None, page_size=None, out=None, stream=None):
    """Read tokens back out of an MLA cache as f32 [T, 576] (FP8 dequantised: e4m3 * tile scale).

    slots: [T] i64 cache slots; rows of invalid slots (-1) are left untouched in out.
    """
    op = "read_mla_cache"
    T = _shape(op, "slots", slots, 1, "[T]")[0]
    ctx = Context(op, cache, "cache", stream)
    if out is None:
        out = ctx.empty((T, 576), "f32")
    with ctx.device_guard():
        _dsa.read_mla_cache(ctx.prep(cache), _cache_dtype(op, cache_dtype), _page_size(op, page_size),
                            ctx.prep(slots), ctx.prep(out), ctx.stream)
    return out


def read_indexer_cache(cache, slots, *, page_size=None, k=None, k_scale=None, stream=None):
    """Read indexer keys back out of an indexer cache (the inverse of write_indexer_cache).

    slots: [T] i64 cache slots. Returns (k [T, 128] e4m3 bytes, k_scale [T] f32), as written;
    rows of invalid slots (-1) are left untouched in k / k_scale.
    """
    op = "read_indexer_cache"
    T = _shape(op, "slots", slots, 1, "[T]")[0]
    ctx = Context(op, cache, "cache", stream)
    if k is None:
        k = ctx.empty((T, 128), "u8")
    if k_scale is None:
        k_scale = ctx.empty((T,), "f32")
    with ctx.device_guard():
        _dsa.read_indexer_cache(ctx.prep(cache), _page_size(op, page_size), ctx.prep(slots), ctx.prep(k),
                                ctx.prep(k_scale), ctx.stream)
    return k, k_scale


# ---- attention -----------------------------------------------------------------------------------

def _attn_outputs(ctx, op, q, out, lse):
    T, H, _ = _shape(op, "q", q, 3, "[T, H, 576]")
    if out is None:
        out = ctx.empty((T, H, 512), "f32" if dtype_name(q) == "float32" else "bf16", rep=q)
    if lse is None:
        lse = ctx.empty((T, H), "f32")
    return out, lse


def sparse_mla(q, kv, indices, sm_scale, topk_length=None, attn_sink=None, *, block_table=None, row_seq=None,
               rows_per_seq=1, cache_dtype=None, page_size=None, out=None, lse=None, stream=None):
    """Sparse MLA attention in absorbed (MQA) form (SPEC 5).

    q: [T, H, 576] bf16 (f32 on the CPU too), last dim contiguous: per head
    ``[q_nope . W_UK (512) | rope(q_pe) (64)]``.
    kv: flat [S, 576] bf16 (f32 on the CPU) -- indices are rows of kv -- or a paged MLA cache
    (3 dims, see write_mla_cache; BF16 or FP8 layout) -- indices are cache slots.
    indices: [T, K] i32. An index is invalid if < 0, >= the key count (S, or num_blocks * page_size),
    or at a position >= topk_length[t] (optional [T] i32); invalid indices and unused cache slots
    (which may hold NaN) never reach the output.
    With block_table= ([B, max_blocks] i32, paged kv only), indices are request-local positions,
    first mapped as map_indices does (row_seq= / rows_per_seq= give each row's sequence).

    ``out[t, h] = sum_j softmax_j(sm_scale * q[t, h] . kv[j]) * kv[j][:512]`` over the valid indices;
    ``lse[t, h]`` = natural-log sum-exp of the scaled scores (without sink). A row with no valid
    index gives out = 0 and lse = +inf. attn_sink ([H] f32, optional) multiplies the output by
    ``exp(lse) / (exp(lse) + exp(sink[h]))``.

    Returns (out [T, H, 512] bf16 -- f32 for f32 q --, lse [T, H] f32).
    """
    op = "sparse_mla"
    ctx = Context(op, q, "q", stream)
    sm_scale = _float(op, "sm_scale", sm_scale)
    kv_dims = len(_shape(op, "kv", kv))
    if block_table is not None:
        if kv_dims != 3:
            raise ValueError("sparse_mla: block_table: given, but kv is not a paged cache (expected 3 dims "
                             "[num_blocks, page_size, token], got %d)" % kv_dims)
        kv_blocks, kv_page = _shape(op, "kv", kv)[:2]
        # num_blocks: a table entry past the cache is an error, not a silently empty row.
        try:
            indices = map_indices(indices, block_table=block_table, page_size=kv_page, row_seq=row_seq,
                                  rows_per_seq=rows_per_seq, num_blocks=kv_blocks, stream=stream)
        except (ValueError, TypeError) as e:
            raise type(e)("sparse_mla: (mapping indices through block_table) %s" % e) from None
    out, lse = _attn_outputs(ctx, op, q, out, lse)
    with ctx.device_guard():
        _dsa.sparse_mla(ctx.prep(q), ctx.prep(kv), _cache_dtype(op, cache_dtype), _page_size(op, page_size),
                        ctx.prep(indices), ctx.prep(topk_length), ctx.prep(attn_sink), sm_scale, ctx.prep(out),
                        ctx.prep(lse), ctx.workspace_allocator(), ctx.stream)
    return out, lse


def dense_mla(q, kv, cu_seqlens_q, cu_seqlens_k=None, sm_scale=None, *, block_table=None, kv_lens=None,
              attn_sink=None, cache_dtype=None, page_size=None, out=None, lse=None, stream=None):
    """Dense causal varlen MLA attention with prefix offsets (SPEC 5).

    q: [T, H, 576] bf16 (f32 on the CPU too). cu_seqlens_q: [B + 1] i32, starting at 0 and ending
    at T. Sequence b has ``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` new tokens and kv_len keys
    in all (``q_len <= kv_len``); its query i sees keys ``0 .. kv_len - q_len + i``. Keys:

    * flat: kv [S, 576] and cu_seqlens_k [B + 1] i32 (rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]);
    * paged: kv a paged MLA cache (3 dims), block_table [B, max_blocks] i32, kv_lens [B] i32.

    sm_scale is required (it is positional after cu_seqlens_k, which is None for the paged form).
    Returns (out [T, H, 512], lse [T, H] f32), as sparse_mla. For a sequence with kv_len <= topk,
    sparse_mla over all its keys gives the same result up to rounding.
    """
    op = "dense_mla"
    ctx = Context(op, q, "q", stream)
    if sm_scale is None:
        raise ValueError("dense_mla: sm_scale: required (the softmax scale, e.g. 192**-0.5 * mscale**2)")
    sm_scale = _float(op, "sm_scale", sm_scale)
    out, lse = _attn_outputs(ctx, op, q, out, lse)
    with ctx.device_guard():
        _dsa.dense_mla(ctx.prep(q), ctx.prep(kv), _cache_dtype(op, cache_dtype), _page_size(op, page_size),
                       ctx.prep(cu_seqlens_q), ctx.prep(cu_seqlens_k), ctx.prep(block_table), ctx.prep(kv_lens),
                       ctx.prep(attn_sink), sm_scale, ctx.prep(out), ctx.prep(lse), ctx.workspace_allocator(),
                       ctx.stream)
    return out, lse


def deepseek_sm_scale(qk_head_dim=192, mscale_factor=0.1, factor=40.0):
    """The softmax scale of DeepSeek-V3.2 / GLM-5: ``qk_head_dim^-0.5 * (1 + 0.1 ln 40)^2``."""
    m = 1.0 + mscale_factor * math.log(factor)
    return qk_head_dim ** -0.5 * m * m
