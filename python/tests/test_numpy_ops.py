"""Every op through numpy arrays (the CPU backend) against the float64 oracle of oracle.py."""
import numpy as np
import pytest

import dsa
import oracle
from helpers import (assert_logits_close, bf16_bits, cos_sin_table, decode_mla_cache_token, e4m3_ordinal,
                     paged_mla_cache, random_e4m3, rng)

# ---- quantize_fp8 ----------------------------------------------------------------------------


@pytest.mark.parametrize("rows,group", [(0, 128), (1, 128), (3, 64), (5, 128)])
def test_quantize_fp8_is_exact(rows, group):
    r = rng(1)
    x = (r.standard_normal((rows, 256)) * r.choice([1e-3, 1.0, 300.0], size=(rows, 1))).astype(np.float32)
    x8, scale = dsa.quantize_fp8(x, group)
    assert x8.dtype == np.uint8 and x8.shape == (rows, 256)
    assert scale.dtype == np.float32 and scale.shape == (rows, 256 // group)
    ref8, ref_s = oracle.quantize_groups(x, group)
    np.testing.assert_array_equal(x8, ref8)
    np.testing.assert_array_equal(scale.astype(np.float64), ref_s)


def test_quantize_fp8_bf16_bits_input_and_out_arguments():
    r = rng(2)
    x = r.standard_normal((4, 128)).astype(np.float32)
    bits = bf16_bits(x)  # uint16 read as bf16
    out = np.full((4, 128), 0xAB, np.uint8)
    scale = np.zeros((4, 1), np.float32)
    got8, got_s = dsa.quantize_fp8(bits, out=out, scale=scale)
    assert got8 is out and got_s is scale
    ref8, ref_s = oracle.quantize_groups(oracle.bf16_bits_to_f64(bits).astype(np.float32), 128)
    np.testing.assert_array_equal(out, ref8)
    np.testing.assert_array_equal(scale.astype(np.float64), ref_s)


def test_quantize_fp8_row_strided_input():
    r = rng(3)
    big = r.standard_normal((6, 128)).astype(np.float32)
    x8, s = dsa.quantize_fp8(big[::2])  # row stride 256 elements, last dim contiguous
    ref8, ref_s = oracle.quantize_groups(np.ascontiguousarray(big[::2]), 128)
    np.testing.assert_array_equal(x8, ref8)
    np.testing.assert_array_equal(s.astype(np.float64), ref_s)


# ---- prepare_indexer_q / _k --------------------------------------------------------------------


def _prep_inputs(T, H, seed=4):
    r = rng(seed)
    q = r.standard_normal((T, H, 128)).astype(np.float32)
    w = r.standard_normal((T, H)).astype(np.float32)
    pos = r.integers(0, 100, size=T).astype(np.int32)
    return q, w, pos, cos_sin_table(100)


def test_prepare_indexer_q_identity_rotation_is_exact():
    T, H = 5, 4
    q, w, pos, _ = _prep_inputs(T, H)
    cos_sin = np.concatenate([np.ones((100, 32)), np.zeros((100, 32))], axis=1).astype(np.float32)
    q8, w_out, s_q = dsa.prepare_indexer_q(q, w, pos, cos_sin, return_q_scale=True)
    ref8, ref_s = oracle.quantize_groups(q.reshape(T * H, 128), 128)
    np.testing.assert_array_equal(q8.reshape(T * H, 128), ref8)
    np.testing.assert_array_equal(s_q.reshape(-1).astype(np.float64), ref_s.reshape(-1))
    c = np.float32(1.0 / np.sqrt(128.0 * H))
    np.testing.assert_array_equal(w_out, (w * c).astype(np.float32) * s_q)


@pytest.mark.parametrize("rope", ["half_split", "interleaved"])
@pytest.mark.parametrize("hadamard", [False, True])
def test_prepare_indexer_q_matches_oracle(rope, hadamard):
    T, H = 6, 3
    q, w, pos, cos_sin = _prep_inputs(T, H, seed=5)
    q8, w_out, s_q = dsa.prepare_indexer_q(q, w, pos, cos_sin, rope=rope, hadamard=hadamard, return_q_scale=True)
    x = oracle.rope(q, pos, cos_sin, rope)
    if hadamard:
        x = oracle.hadamard128(x)
    x = x.astype(np.float32).reshape(T * H, 128)
    ref8, ref_s = oracle.quantize_groups(x, 128)
    # The library's f32 rotation may round differently from the float64 one: one e4m3 step.
    d = np.abs(e4m3_ordinal(q8.reshape(T * H, 128)) - e4m3_ordinal(ref8))
    assert d.max() <= 1
    np.testing.assert_array_equal(s_q.reshape(-1).astype(np.float64), ref_s.reshape(-1))
    c = np.float32(1.0 / np.sqrt(128.0 * H))
    np.testing.assert_array_equal(w_out, (w * c).astype(np.float32) * s_q)


def test_prepare_indexer_q_without_q_scale_returns_two():
    q, w, pos, cos_sin = _prep_inputs(2, 2)
    res = dsa.prepare_indexer_q(q, w, pos, cos_sin)
    assert len(res) == 2 and res[0].shape == (2, 2, 128) and res[1].shape == (2, 2)


@pytest.mark.parametrize("rope", ["half_split", "interleaved"])
def test_prepare_indexer_k_matches_oracle(rope):
    r = rng(6)
    T = 7
    k = r.standard_normal((T, 128)).astype(np.float32)
    pos = r.integers(0, 50, size=T).astype(np.int32)
    cos_sin = cos_sin_table(50)
    k8, k_s = dsa.prepare_indexer_k(k, pos, cos_sin, rope=rope)
    assert k8.shape == (T, 128) and k_s.shape == (T,)
    ref8, ref_s = oracle.quantize_groups(oracle.rope(k, pos, cos_sin, rope).astype(np.float32), 128)
    assert np.abs(e4m3_ordinal(k8) - e4m3_ordinal(ref8)).max() <= 1
    np.testing.assert_array_equal(k_s.astype(np.float64), ref_s[:, 0])


# ---- indexer_logits -----------------------------------------------------------------------------


def _logits_inputs(M=5, H=4, N=40, seed=7):
    r = rng(seed)
    q8 = random_e4m3(r, (M, H, 128))
    k8 = random_e4m3(r, (N, 128))
    w = r.standard_normal((M, H)).astype(np.float32)
    k_scale = (2.0 ** r.integers(-8, 0, size=N)).astype(np.float32)
    ks = np.array([0, 3, 10, 10, 0][:M], np.int32)
    ke = np.array([7, 20, 10, 40, 1][:M], np.int32)
    return q8, w, k8, k_scale, ks, ke


def test_indexer_logits_matches_oracle():
    q8, w, k8, k_scale, ks, ke = _logits_inputs()
    out = dsa.indexer_logits(q8, w, k8, k_scale, ks, ke)
    assert out.dtype == np.float32 and out.shape == (5, 30)  # width = max(ke - ks)
    ref = oracle.indexer_logits(q8, w, k8, k_scale, ks, ke, 30)
    absum = oracle.indexer_logits_abs(q8, w, k8, k_scale, ks, ke, 30)
    assert_logits_close(out, ref, absum, terms=128 + 4 + 2)


def test_indexer_logits_column_tile_and_out():
    q8, w, k8, k_scale, ks, ke = _logits_inputs(seed=8)
    out = np.full((5, 9), 7.0, np.float32)
    got = dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, col_offset=5, out=out)
    assert got is out
    ref = oracle.indexer_logits(q8, w, k8, k_scale, ks, ke, 9, col_offset=5)
    absum = oracle.indexer_logits_abs(q8, w, k8, k_scale, ks, ke, 9, col_offset=5)
    assert_logits_close(out, ref, absum, terms=134)


def test_indexer_logits_e4m3_table_through_the_binding():
    # Every non-NaN code once as a query value against a unit key: the binding reads uint8 as e4m3.
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    M = len(codes)
    q8 = np.zeros((M, 1, 128), np.uint8)
    q8[:, 0, 0] = codes
    k8 = np.zeros((1, 128), np.uint8)
    k8[0, 0] = 0x38  # 1.0
    w = np.ones((M, 1), np.float32)
    out = dsa.indexer_logits(q8, w, k8, np.ones(1, np.float32), np.zeros(M, np.int32), np.ones(M, np.int32))
    np.testing.assert_array_equal(out[:, 0].astype(np.float64), np.maximum(oracle.e4m3_to_f64(codes), 0.0))


def test_indexer_logits_empty_rows_and_zero_width():
    q8, w, k8, k_scale, _, _ = _logits_inputs()
    ks = np.full(5, 4, np.int32)
    out = dsa.indexer_logits(q8, w, k8, k_scale, ks, ks.copy())
    assert out.shape == (5, 0)
    out = dsa.indexer_logits(q8[:0], w[:0], k8, k_scale, ks[:0], ks[:0])
    assert out.shape == (0, 0)


def test_indexer_logits_paged_decode_matches_flat_oracle():
    r = rng(9)
    B, next_n, H, page = 2, 2, 3, 16
    kv_lens = np.array([21, 5], np.int32)
    block_table = np.array([[3, 0], [1, -1]], np.int32)
    cache = np.full((4, page, 132), 0xFF, np.uint8)  # NaN everywhere not written
    keys = {}
    for b in range(B):
        n = int(kv_lens[b])
        k8 = random_e4m3(r, (n, 128))
        ks = (2.0 ** r.integers(-6, 0, size=n)).astype(np.float32)
        slots = np.array([block_table[b, j // page] * page + j % page for j in range(n)], np.int64)
        dsa.write_indexer_cache(k8, ks, cache, slots)
        keys[b] = (k8, ks)
    R = B * next_n
    q8 = random_e4m3(r, (R, H, 128))
    w = r.standard_normal((R, H)).astype(np.float32)
    out = dsa.indexer_logits_paged(q8, w, cache, block_table, kv_lens, next_n, width=24)
    for row in range(R):
        b, i = divmod(row, next_n)
        L = int(kv_lens[b]) - next_n + i + 1
        k8, ks = keys[b]
        ref = oracle.indexer_logits(q8[row:row + 1], w[row:row + 1], k8, ks, [0], [L], 24)
        absum = oracle.indexer_logits_abs(q8[row:row + 1], w[row:row + 1], k8, ks, [0], [L], 24)
        assert_logits_close(out[row:row + 1], ref, absum, terms=128 + H + 2)


def test_indexer_topk_equals_logits_then_topk():
    # Fused score-and-select against the unfused path on the same paged inputs: decode form and
    # general form, rows below, at and above k, and a row of tied (zero-query) scores.
    r = rng(19)
    B, next_n, H, page, k = 3, 2, 2, 16, 64
    kv_lens = np.array([400, 65, 30], np.int32)
    blocks = [(int(n) + page - 1) // page for n in kv_lens]
    order = r.permutation(sum(blocks) + 2).astype(np.int32)
    block_table = np.full((B, max(blocks)), -1, np.int32)
    at = 0
    for b in range(B):
        block_table[b, :blocks[b]] = order[at:at + blocks[b]]
        at += blocks[b]
    cache = np.full((sum(blocks) + 2, page, 132), 0xFF, np.uint8)  # NaN everywhere not written
    for b in range(B):
        n = int(kv_lens[b])
        slots = np.array([block_table[b, j // page] * page + j % page for j in range(n)], np.int64)
        dsa.write_indexer_cache(random_e4m3(r, (n, 128)), (2.0 ** r.integers(-6, 0, size=n)).astype(np.float32),
                                cache, slots)
    R = B * next_n
    q8 = random_e4m3(r, (R, H, 128))
    q8[1] = 0  # every score of row 1 ties: the lowest k indices win
    w = r.standard_normal((R, H)).astype(np.float32)
    width = int(kv_lens.max())
    fused = dsa.indexer_topk(q8, w, cache, block_table, kv_lens, next_n, width=width, k=k)
    row_seq = np.repeat(np.arange(B, dtype=np.int32), next_n)
    row_len = np.array([kv_lens[b] - next_n + i + 1 for b in range(B) for i in range(next_n)], np.int32)
    logits = dsa.indexer_logits_paged(q8, w, cache, block_table, width=width, row_seq=row_seq, row_len=row_len)
    unfused = dsa.topk(logits, row_len, k)
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_array_equal(fused[1], np.arange(k))
    general = dsa.indexer_topk(q8, w, cache, block_table, width=width, k=k, row_seq=row_seq, row_len=row_len)
    np.testing.assert_array_equal(general, unfused)
    with pytest.raises(ValueError, match="width"):
        dsa.indexer_topk(q8, w, cache, block_table, kv_lens, next_n, width=width - 1, k=k)


# ---- topk ------------------------------------------------------------------------------------


def test_topk_matches_oracle_with_ties_nan_and_short_rows():
    r = rng(10)
    M, W, k = 6, 200, 64
    logits = r.integers(-5, 5, size=(M, W)).astype(np.float32)  # many ties
    logits[1, ::7] = np.nan
    logits[2, :] = -np.inf
    logits[2, 50] = 0.0
    lengths = np.array([200, 190, 120, 64, 10, 0], np.int32)
    idx, vals = dsa.topk(logits, lengths, k, return_values=True)
    assert idx.dtype == np.int32 and idx.shape == (M, k)
    ref = oracle.topk(logits, lengths, k)
    np.testing.assert_array_equal(idx, ref)
    for i in range(M):
        valid = idx[i] >= 0
        np.testing.assert_array_equal(vals[i, valid], logits[i, idx[i, valid]])
        assert np.all(np.isneginf(vals[i, ~valid]))


def test_topk_repeated_runs_identical_and_wider_k():
    r = rng(11)
    logits = r.standard_normal((3, 500)).astype(np.float32)
    lengths = np.array([500, 300, 129], np.int32)
    a = dsa.topk(logits, lengths, 128)
    b = dsa.topk(logits, lengths, 128)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, oracle.topk(logits, lengths, 128))


# ---- map_indices ------------------------------------------------------------------------------


def test_map_indices_flat_and_paged():
    r = rng(12)
    M, K = 6, 8
    idx = r.integers(-1, 40, size=(M, K)).astype(np.int32)
    kv_start = np.array([0, 100, 1000], np.int32)
    got = dsa.map_indices(idx, kv_start=kv_start, rows_per_seq=2)
    np.testing.assert_array_equal(got, oracle.map_flat(idx, kv_start, rows_per_seq=2))
    row_seq = np.array([2, 0, 1, 1, 0, 2], np.int32)
    got = dsa.map_indices(idx, kv_start=kv_start, row_seq=row_seq)
    np.testing.assert_array_equal(got, oracle.map_flat(idx, kv_start, row_seq=row_seq))
    table = np.array([[5, 2, -1], [0, 7, 1], [4, 3, 6]], np.int32)  # 3 blocks of 16: j >= 48 is past it
    idx[0, 0] = 47
    idx[1, 1] = 48
    got = dsa.map_indices(idx, block_table=table, page_size=16, row_seq=row_seq)
    np.testing.assert_array_equal(got, oracle.map_paged(idx, table, 16, row_seq=row_seq))


def test_map_indices_in_place():
    idx = np.array([[0, 5, -1, 3]], np.int32)
    ref = oracle.map_flat(idx, [10])
    out = dsa.map_indices(idx, kv_start=np.array([10], np.int32), out=idx)
    assert out is idx
    np.testing.assert_array_equal(idx, ref)


# ---- caches ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["3d", "2d"])
def test_write_indexer_cache_bytes(layout):
    r = rng(13)
    page, nb, T = 16, 3, 9
    k8 = random_e4m3(r, (T, 128))
    ks = r.random(T).astype(np.float32)
    slots = np.array([0, 17, 47, -1, 5, 33, 16, 15, 40], np.int64)
    if layout == "3d":
        cache = np.full((nb, page, 132), 0xFF, np.uint8)
        dsa.write_indexer_cache(k8, ks, cache, slots)
    else:
        cache = np.full((nb, page * 132), 0xFF, np.uint8)
        dsa.write_indexer_cache(k8, ks, cache, slots, page_size=page)
    flat = cache.reshape(nb, page * 132)
    expect = np.full_like(flat, 0xFF)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        b, o = divmod(int(s), page)
        expect[b, o * 128:(o + 1) * 128] = k8[t]
        expect[b, page * 128 + o * 4:page * 128 + o * 4 + 4] = ks[t:t + 1].view(np.uint8)
    np.testing.assert_array_equal(flat, expect)


def test_write_indexer_cache_block_table_form():
    r = rng(14)
    page = 64
    k8 = random_e4m3(r, (3, 128))
    ks = np.ones(3, np.float32)
    cache_a = np.zeros((4, page, 132), np.uint8)
    cache_b = np.zeros((4, page, 132), np.uint8)
    table = np.array([[2, 3], [0, 1]], np.int32)
    seq = np.array([0, 0, 1], np.int32)
    pos = np.array([0, 64, 5], np.int32)
    dsa.write_indexer_cache(k8, ks, cache_a, block_table=table, token_seq=seq, token_pos=pos)
    dsa.write_indexer_cache(k8, ks, cache_b, np.array([128, 192, 5], np.int64))
    np.testing.assert_array_equal(cache_a, cache_b)


@pytest.mark.parametrize("fp8", [False, True])
def test_write_and_read_mla_cache(fp8):
    r = rng(15)
    page, nb, T = 8, 3, 6
    kv_c = (r.standard_normal((T, 512)) * r.choice([0.01, 1.0, 50.0], size=(T, 1))).astype(np.float32)
    k_pe = r.standard_normal((T, 64)).astype(np.float32)
    slots = np.array([0, 9, 23, -1, 4, 16], np.int64)
    cache = paged_mla_cache(r, nb, page, fp8)
    dsa.write_mla_cache(kv_c, k_pe, cache, slots)
    flat = cache.reshape(nb * page, -1)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        tok = flat[s]
        if not fp8:
            np.testing.assert_array_equal(tok.view(np.uint16), np.concatenate([bf16_bits(kv_c[t]), bf16_bits(k_pe[t])]))
        else:
            codes, scales = oracle.quantize_groups(kv_c[t:t + 1], 128)
            np.testing.assert_array_equal(tok[:512], codes[0])
            np.testing.assert_array_equal(tok[512:528].view(np.float32).astype(np.float64), scales[0])
            np.testing.assert_array_equal(tok[528:].view(np.uint16), bf16_bits(k_pe[t]))
    untouched = np.setdiff1d(np.arange(nb * page), slots[slots >= 0])
    assert np.all(flat[untouched] == 0xFF)
    # Read back: f32 [T, 576], the independent decode of the bytes; rows of -1 slots untouched.
    out = np.full((T, 576), 3.0, np.float32)
    dsa.read_mla_cache(cache, slots, out=out)
    for t, s in enumerate(slots):
        if s < 0:
            assert np.all(out[t] == 3.0)
        else:
            np.testing.assert_array_equal(out[t].astype(np.float64), decode_mla_cache_token(flat[s], fp8))


def test_write_mla_cache_bf16_bits_cache_and_inputs():
    # A [num_blocks, page, 576] uint16 cache (torch-style bf16) and bf16 bit inputs.
    r = rng(16)
    kv_c = bf16_bits(r.standard_normal((2, 512)))
    k_pe = bf16_bits(r.standard_normal((2, 64)))
    cache = np.zeros((1, 4, 576), np.uint16)
    dsa.write_mla_cache(kv_c, k_pe, cache, np.array([3, 1], np.int64))
    np.testing.assert_array_equal(cache[0, 3], np.concatenate([kv_c[0], k_pe[0]]))
    np.testing.assert_array_equal(cache[0, 1], np.concatenate([kv_c[1], k_pe[1]]))


# ---- attention -------------------------------------------------------------------------------------

SCALE = dsa.deepseek_sm_scale()


def _check_attention(out, lse, ref_out, ref_lse, vmax, bf16_out=False):
    inf = np.isinf(ref_lse)
    np.testing.assert_array_equal(np.isinf(lse), inf)
    np.testing.assert_array_equal(lse[inf], ref_lse[inf])
    assert np.all(np.abs(lse[~inf] - ref_lse[~inf]) <= 1e-5 * (1 + np.abs(ref_lse[~inf])))
    got = oracle.bf16_bits_to_f64(out) if bf16_out else out.astype(np.float64)
    tol = 2e-5 * vmax + (2.0 ** -8 * np.abs(ref_out) if bf16_out else 0.0)
    assert np.all(np.abs(got - ref_out) <= tol), "max err %g" % np.max(np.abs(got - ref_out))
    assert np.all(got[inf] == 0.0)


def _flat_sparse_case(seed=17, T=6, H=3, S=50, K=64):
    r = rng(seed)
    q = r.standard_normal((T, H, 576)).astype(np.float32)
    kv = r.standard_normal((S + 5, 576)).astype(np.float32)
    idx = r.integers(0, S, size=(T, K)).astype(np.int32)
    idx[0, ::3] = -1
    idx[1, 5] = S + 100  # out of range: invalid, not an error
    idx[2, :] = -1        # no valid index at all
    topk_length = np.array([K, 40, K, 1, 0, K], np.int32)
    return q, kv[:S], idx, topk_length


def _sparse_ref_keys(kv, idx, topk_length):
    keys = []
    for t in range(idx.shape[0]):
        sel = [j for c, j in enumerate(idx[t]) if c < topk_length[t] and 0 <= j < kv.shape[0]]
        keys.append(kv[sel].astype(np.float64))
    return keys


def test_sparse_mla_flat_f32_matches_oracle():
    q, kv, idx, tl = _flat_sparse_case()
    out, lse = dsa.sparse_mla(q, kv, idx, SCALE, topk_length=tl)
    assert out.dtype == np.float32 and out.shape == (6, 3, 512) and lse.shape == (6, 3)
    ref_out, ref_lse = oracle.attention_rows(q, _sparse_ref_keys(kv, idx, tl), SCALE)
    _check_attention(out, lse, ref_out, ref_lse, np.abs(kv).max())


def test_sparse_mla_attn_sink():
    q, kv, idx, tl = _flat_sparse_case(seed=18)
    sink = np.array([0.5, -1.0, 3.0], np.float32)
    out, lse = dsa.sparse_mla(q, kv, idx, SCALE, tl, sink)
    ref_out, ref_lse = oracle.attention_rows(q, _sparse_ref_keys(kv, idx, tl), SCALE, sink=sink)
    _check_attention(out, lse, ref_out, ref_lse, np.abs(kv).max())


def test_sparse_mla_bf16_bits():
    q, kv, idx, tl = _flat_sparse_case(seed=19)
    qb, kvb = bf16_bits(q), bf16_bits(kv)
    out, lse = dsa.sparse_mla(qb, kvb, idx, SCALE, topk_length=tl)
    assert out.dtype == np.uint16  # bf16 bits back
    q64, kv64 = oracle.bf16_bits_to_f64(qb), oracle.bf16_bits_to_f64(kvb)
    ref_out, ref_lse = oracle.attention_rows(q64, _sparse_ref_keys(kv64, idx, tl), SCALE)
    _check_attention(out, lse, ref_out, ref_lse, np.abs(kv64).max(), bf16_out=True)


@pytest.mark.parametrize("fp8", [False, True])
def test_sparse_mla_paged_cache_with_nan_slots(fp8):
    r = rng(20)
    page, nb, T, H = 16, 4, 4, 2
    n_keys = 40
    slots = r.permutation(nb * page)[:n_keys].astype(np.int64)  # scattered; the rest stay NaN
    kv_c = r.standard_normal((n_keys, 512)).astype(np.float32)
    k_pe = r.standard_normal((n_keys, 64)).astype(np.float32)
    cache = paged_mla_cache(r, nb, page, fp8)
    dsa.write_mla_cache(kv_c, k_pe, cache, slots)
    q = bf16_bits(r.standard_normal((T, H, 576)))
    pick = r.integers(0, n_keys, size=(T, 64))
    idx = slots[pick].astype(np.int32)
    idx[1, :10] = -1
    out, lse = dsa.sparse_mla(q, cache, idx, SCALE)
    flat = cache.reshape(nb * page, -1)
    keys = [np.stack([decode_mla_cache_token(flat[j], fp8) for j in row if j >= 0]) for row in idx]
    ref_out, ref_lse = oracle.attention_rows(oracle.bf16_bits_to_f64(q), keys, SCALE)
    assert not np.any(np.isnan(oracle.bf16_bits_to_f64(out)))
    _check_attention(out, lse, ref_out, ref_lse, max(np.abs(k).max() for k in keys), bf16_out=True)


def test_sparse_mla_block_table_maps_request_positions():
    r = rng(21)
    page, T, H = 8, 3, 2
    table = np.array([[2, 0, 3], [1, -1, -1]], np.int32)
    cache = paged_mla_cache(r, 4, page, False)
    n = [20, 6]
    for b in range(2):
        kv_c = r.standard_normal((n[b], 512)).astype(np.float32)
        k_pe = r.standard_normal((n[b], 64)).astype(np.float32)
        slots = np.array([table[b, j // page] * page + j % page for j in range(n[b])], np.int64)
        dsa.write_mla_cache(kv_c, k_pe, cache, slots)
    q = bf16_bits(r.standard_normal((T, H, 576)))
    local = np.full((T, 64), -1, np.int32)
    local[0, :20] = np.arange(20)
    local[1, :5] = [0, 3, 7, 8, 19]
    local[2, :6] = np.arange(6)
    row_seq = np.array([0, 0, 1], np.int32)
    a = dsa.sparse_mla(q, cache, local, SCALE, block_table=table, row_seq=row_seq)
    slots = dsa.map_indices(local, block_table=table, page_size=page, row_seq=row_seq)
    np.testing.assert_array_equal(slots, oracle.map_paged(local, table, page, row_seq=row_seq))
    b = dsa.sparse_mla(q, cache, slots, SCALE)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def _dense_case(seed=22):
    r = rng(seed)
    q_lens, kv_lens = [3, 1, 4], [5, 1, 9]  # prefixes of 2, 0, 5 keys
    T, S, H = sum(q_lens), sum(kv_lens), 2
    q = r.standard_normal((T, H, 576)).astype(np.float32)
    kv = r.standard_normal((S, 576)).astype(np.float32)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    return q, kv, cu_q, cu_k, q_lens, kv_lens


def _dense_ref_keys(kv, cu_k, q_lens, kv_lens):
    keys = []
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        for i in range(ql):
            keys.append(kv[cu_k[b]:cu_k[b] + kl - ql + i + 1].astype(np.float64))
    return keys


def test_dense_mla_flat_matches_oracle_and_sparse():
    q, kv, cu_q, cu_k, q_lens, kv_lens = _dense_case()
    out, lse = dsa.dense_mla(q, kv, cu_q, cu_k, SCALE)
    ref_out, ref_lse = oracle.attention_rows(q, _dense_ref_keys(kv, cu_k, q_lens, kv_lens), SCALE)
    _check_attention(out, lse, ref_out, ref_lse, np.abs(kv).max())
    # Sparse over every visible key (kv_len <= topk): the same up to rounding.
    idx = np.full((q.shape[0], 64), -1, np.int32)
    t = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        for i in range(ql):
            L = kl - ql + i + 1
            idx[t, :L] = cu_k[b] + np.arange(L)
            t += 1
    s_out, s_lse = dsa.sparse_mla(q, kv, idx, SCALE)
    assert np.all(np.abs(s_out - out) <= 2e-5 * np.abs(kv).max())
    assert np.all(np.abs(s_lse - lse) <= 1e-5 * (1 + np.abs(lse)))


def test_dense_mla_paged():
    q, kv, cu_q, cu_k, q_lens, kv_lens = _dense_case(seed=23)
    page = 4
    table = np.array([[0, 1, -1], [2, -1, -1], [3, 4, 5]], np.int32)
    cache = np.full((6, page, 1152), 0xFF, np.uint8)
    slots = []
    for b, kl in enumerate(kv_lens):
        slots += [table[b, j // page] * page + j % page for j in range(kl)]
    kvb = bf16_bits(kv)
    dsa.write_mla_cache(kvb[:, :512], kvb[:, 512:], cache, np.array(slots, np.int64))
    qb = bf16_bits(q)
    out, lse = dsa.dense_mla(qb, cache, cu_q, None, SCALE, block_table=table,
                             kv_lens=np.array(kv_lens, np.int32))
    kv64 = oracle.bf16_bits_to_f64(kvb)
    ref_out, ref_lse = oracle.attention_rows(oracle.bf16_bits_to_f64(qb),
                                             _dense_ref_keys(kv64, cu_k, q_lens, kv_lens), SCALE)
    _check_attention(out, lse, ref_out, ref_lse, np.abs(kv64).max(), bf16_out=True)


def test_attention_outputs_into_out_arguments():
    q, kv, idx, tl = _flat_sparse_case(seed=24)
    out = np.zeros((6, 3, 512), np.float32)
    lse = np.zeros((6, 3), np.float32)
    o, l = dsa.sparse_mla(q, kv, idx, SCALE, tl, out=out, lse=lse)
    assert o is out and l is lse
    ref = dsa.sparse_mla(q, kv, idx, SCALE, tl)
    np.testing.assert_array_equal(out, ref[0])
    np.testing.assert_array_equal(lse, ref[1])


# ---- runtime ---------------------------------------------------------------------------------------


def test_runtime_facts():
    assert dsa.version() == dsa.__version__
    assert "cpu" in dsa.compiled_backends()
    assert dsa.list_devices()[0]["device"] == "cpu"
    g = dsa.geometry_preset("deepseek-v3.2")
    assert g["num_heads"] == 128 and g["index_heads"] == 64 and g["topk"] == 2048
    assert abs(g["sm_scale"] - dsa.deepseek_sm_scale()) < 1e-12
    roles = dsa.geometry_preset("glm-5.2")["layer_roles"]
    assert roles[:8] == ["full", "full", "full", "shared", "shared", "shared", "full", "shared"]
    assert roles[-1] == "mtp"
    n = dsa.num_threads()
    dsa.set_num_threads(1)
    assert dsa.num_threads() == 1
    dsa.set_num_threads(0)
    assert dsa.num_threads() == n


def test_read_indexer_cache_is_the_inverse_of_the_write():
    r = np.random.default_rng(81)
    page, blocks, T = 16, 4, 20
    k8 = r.integers(0, 256, (T, 128), dtype=np.uint8)
    ks = np.exp2(r.integers(-10, 3, T)).astype(np.float32)
    slots = r.permutation(page * blocks)[:T].astype(np.int64)
    cache = np.zeros((blocks, page, 132), np.uint8)
    dsa.write_indexer_cache(k8, ks, cache, slots)
    k_back, s_back = dsa.read_indexer_cache(cache, slots)
    np.testing.assert_array_equal(np.asarray(k_back).view(np.uint8), k8)
    np.testing.assert_array_equal(s_back, ks)
    with pytest.raises(ValueError, match="read_indexer_cache"):
        dsa.read_indexer_cache(cache, np.array([page * blocks], np.int64))
