"""A small float64 numpy oracle of SPEC.md, written independently of the library.

Number formats are decoded from their bit definitions (bf16: the top 16 bits of a float32;
e4m3fn: bias 7, 3 mantissa bits, no infinities, NaN = S.1111.111) and encoded by nearest-value
search over the decoded table with ties to the even code, not by bit tricks.
"""
import numpy as np

# ---- number formats ---------------------------------------------------------------------------


def bf16_bits_to_f64(bits):
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even of float32 values to bfloat16, as uint16 bits: pick the nearer of
    the two bf16 neighbours (truncation, and one step away from zero), ties to the even code.
    (Not exact for values that round to infinity; the tests stay far from them.)"""
    x = np.asarray(x, dtype=np.float32)
    v = x.astype(np.float64)
    lo = (x.view(np.uint32) >> 16).astype(np.uint16)
    lo_v = bf16_bits_to_f64(lo)
    hi = np.where(lo_v != v, lo + np.uint16(1), lo).astype(np.uint16)
    hi_v = bf16_bits_to_f64(hi)
    d_lo, d_hi = np.abs(v - lo_v), np.abs(hi_v - v)
    out = np.where((d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0)), lo, hi).astype(np.uint16)
    return np.where(np.isnan(v), np.uint16(0x7FC0), out).astype(np.uint16)


def round_bf16(x):
    return bf16_bits_to_f64(f32_to_bf16_bits(x))


def _e4m3_table():
    vals = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 0x7
        if e == 0xF and m == 0x7:
            vals[code] = np.nan
        elif e == 0:
            vals[code] = sign * m * 2.0 ** -9
        else:
            vals[code] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return vals


E4M3 = _e4m3_table()
_POS_CODES = np.array([c for c in range(0x7F)], dtype=np.int64)  # 0 .. 448, ascending values
_POS_VALS = E4M3[_POS_CODES]


def e4m3_to_f64(codes):
    return E4M3[np.asarray(codes, dtype=np.uint8).astype(np.int64)]


def f64_to_e4m3(x):
    """Nearest e4m3fn code of values already clamped to [-448, 448]; ties to the even code."""
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    idx = np.searchsorted(_POS_VALS, mag)  # first value >= mag
    idx = np.clip(idx, 0, len(_POS_VALS) - 1)
    below = np.clip(idx - 1, 0, None)
    d_hi = _POS_VALS[idx] - mag
    d_lo = mag - _POS_VALS[below]
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & (_POS_CODES[below] % 2 == 0))
    code = np.where(pick_lo & (idx > 0), _POS_CODES[below], _POS_CODES[idx])
    code = np.where(np.signbit(x), code | 0x80, code)
    return code.astype(np.uint8)


def ue8m0_scale(amax):
    """2^ceil(log2(max(amax, 1e-4) / 448)) with the ratio rounded to float32 (docs/design.md)."""
    a = np.maximum(np.asarray(amax, dtype=np.float32), np.float32(1e-4))
    r = (a / np.float32(448.0)).astype(np.float64)
    return 2.0 ** np.ceil(np.log2(r))


def quantize_groups(x, group):
    """SPEC 3.3 per group of the last dim: bf16 first, then scale and e4m3 codes."""
    xb = round_bf16(np.asarray(x, dtype=np.float32))
    R, D = xb.shape
    g = xb.reshape(R, D // group, group)
    amax = np.max(np.abs(g), axis=2)
    s = ue8m0_scale(amax)
    y = np.clip(g / s[:, :, None], -448.0, 448.0)
    return f64_to_e4m3(y).reshape(R, D), s


# ---- indexer ------------------------------------------------------------------------------------


def indexer_logits(q8, w, k8, k_scale, ks, ke, width, col_offset=0):
    q = e4m3_to_f64(q8)  # [M, H, 128]
    k = e4m3_to_f64(k8)  # [N, 128]
    M = q.shape[0]
    out = np.full((M, width), -np.inf)
    for i in range(M):
        for c in range(width):
            j = ks[i] + col_offset + c
            if j >= ke[i]:
                continue
            dots = q[i] @ k[j]  # [H]
            out[i, c] = np.sum(w[i].astype(np.float64) * np.maximum(dots, 0.0)) * float(k_scale[j])
    return out


def indexer_logits_abs(q8, w, k8, k_scale, ks, ke, width, col_offset=0):
    """sum |terms|, for the rounding bound of the f32 accumulation."""
    q = e4m3_to_f64(q8)
    k = e4m3_to_f64(k8)
    out = np.zeros((q.shape[0], width))
    for i in range(q.shape[0]):
        for c in range(width):
            j = ks[i] + col_offset + c
            if j < ke[i]:
                dots = np.abs(q[i]) @ np.abs(k[j])
                out[i, c] = np.sum(np.abs(w[i].astype(np.float64)) * dots) * abs(float(k_scale[j]))
    return out


def rope(x, pos, cos_sin, style):
    """RoPE on dims 0..63 of the last axis; pair i rotates by (cos[i], sin[i])."""
    x = np.array(x, dtype=np.float64)
    c = cos_sin[pos, :32].astype(np.float64)
    s = cos_sin[pos, 32:].astype(np.float64)
    while c.ndim < x.ndim:
        c, s = c[:, None], s[:, None]
    if style == "half_split":
        a, b = x[..., 0:32].copy(), x[..., 32:64].copy()
        x[..., 0:32] = a * c - b * s
        x[..., 32:64] = b * c + a * s
    else:
        a, b = x[..., 0:64:2].copy(), x[..., 1:64:2].copy()
        x[..., 0:64:2] = a * c - b * s
        x[..., 1:64:2] = b * c + a * s
    return x


def hadamard128(x):
    n = 128
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return x @ h.T / np.sqrt(n)


# ---- top-k and mapping ------------------------------------------------------------------------


def topk(logits, lengths, k):
    M = logits.shape[0]
    out = np.full((M, k), -1, dtype=np.int64)
    for i in range(M):
        L = int(lengths[i])
        if L <= k:
            sel = list(range(L))
        else:
            row = logits[i, :L].astype(np.float64)
            # rank: larger first; NaN below everything; lower index first on ties.
            keys = [(0 if np.isnan(v) else 1, v if not np.isnan(v) else 0.0, -j) for j, v in enumerate(row)]
            order = sorted(range(L), key=lambda j: keys[j], reverse=True)
            sel = sorted(order[:k])
        out[i, :len(sel)] = sel
    return out


def map_flat(indices, kv_start, row_seq=None, rows_per_seq=1):
    out = np.full(indices.shape, -1, dtype=np.int64)
    for i in range(indices.shape[0]):
        b = row_seq[i] if row_seq is not None else i // rows_per_seq
        for c in range(indices.shape[1]):
            j = indices[i, c]
            if j >= 0:
                out[i, c] = kv_start[b] + j
    return out


def map_paged(indices, block_table, page, row_seq=None, rows_per_seq=1):
    out = np.full(indices.shape, -1, dtype=np.int64)
    for i in range(indices.shape[0]):
        b = row_seq[i] if row_seq is not None else i // rows_per_seq
        for c in range(indices.shape[1]):
            j = indices[i, c]
            if j < 0 or j // page >= block_table.shape[1]:
                continue
            blk = block_table[b, j // page]
            if blk >= 0:
                out[i, c] = blk * page + j % page
    return out


# ---- attention ------------------------------------------------------------------------------------


def attention_rows(q, keys_per_row, sm_scale, sink=None):
    """q [T, H, 576]; keys_per_row[t] = [n, 576] float64 keys (values = first 512 dims).
    Returns (out [T, H, 512], lse [T, H])."""
    T, H, _ = q.shape
    out = np.zeros((T, H, 512))
    lse = np.full((T, H), np.inf)
    for t in range(T):
        kv = keys_per_row[t]
        if kv.shape[0] == 0:
            continue
        s = sm_scale * (q[t].astype(np.float64) @ kv.T)  # [H, n]
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        z = e.sum(axis=1, keepdims=True)
        out[t] = (e / z) @ kv[:, :512]
        lse[t] = (m + np.log(z))[:, 0]
        if sink is not None:
            out[t] *= (1.0 / (1.0 + np.exp(sink.astype(np.float64) - lse[t])))[:, None]
    return out, lse
