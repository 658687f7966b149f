"""Bad input: ValueError / TypeError naming the op and the argument, never a crash."""
import re

import numpy as np
import pytest

import dsa
from helpers import random_e4m3, rng


def raises(exc, op, arg):
    """pytest.raises whose message must name 'op: arg'."""
    return pytest.raises(exc, match=re.escape("%s: %s" % (op, arg)))


def _logits_args():
    r = rng(0)
    return dict(q=random_e4m3(r, (2, 2, 128)), weights=np.ones((2, 2), np.float32), k=random_e4m3(r, (8, 128)),
                k_scale=np.ones(8, np.float32), ks=np.zeros(2, np.int32), ke=np.full(2, 8, np.int32))


def call_logits(**over):
    a = _logits_args()
    a.update(over)
    return dsa.indexer_logits(a.pop("q"), a.pop("weights"), a.pop("k"), a.pop("k_scale"), a.pop("ks"), a.pop("ke"), **a)


def test_indexer_logits_dtype_errors_are_type_errors():
    with raises(TypeError, "indexer_logits", "q"):
        call_logits(q=np.zeros((2, 2, 128), np.float32))
    with raises(TypeError, "indexer_logits", "weights"):
        call_logits(weights=np.ones((2, 2), np.float64))  # float64 is not a DSA dtype
    with raises(TypeError, "indexer_logits", "ks"):
        call_logits(ks=np.zeros(2, np.int64))
    with raises(TypeError, "indexer_logits", "k_scale"):
        call_logits(k_scale=[1.0] * 8)  # not an array


def test_indexer_logits_shape_range_and_stride_errors():
    with raises(ValueError, "indexer_logits", "weights"):
        call_logits(weights=np.ones((2, 3), np.float32))
    with raises(ValueError, "indexer_logits", "ke[1]"):
        call_logits(ke=np.array([8, 9], np.int32))  # past N = 8
    with raises(ValueError, "indexer_logits", "ks[0]"):
        call_logits(ks=np.array([5, 0], np.int32), ke=np.array([4, 8], np.int32))
    with raises(ValueError, "indexer_logits", "k"):
        call_logits(k=random_e4m3(rng(1), (8, 256))[:, ::2])  # last dim strided
    with raises(ValueError, "indexer_logits", "out"):
        call_logits(out=np.zeros((3, 8), np.float32))
    with raises(ValueError, "indexer_logits", "ks"):
        call_logits(ks=None)
    with raises(ValueError, "indexer_logits", "col_offset"):
        call_logits(col_offset=-1)
    with raises(ValueError, "indexer_logits", "q"):
        call_logits(q=np.zeros((2, 128), np.uint8))


def test_read_only_output_and_negative_strides():
    out = np.zeros((2, 8), np.float32)
    out.setflags(write=False)
    with raises(ValueError, "indexer_logits", "out"):
        call_logits(out=out)
    with raises(ValueError, "indexer_logits", "k_scale"):
        call_logits(k_scale=np.ones(8, np.float32)[::-1])


def test_uint16_only_where_bf16_is_taken():
    with raises(TypeError, "indexer_logits", "weights"):
        call_logits(weights=np.ones((2, 2), np.uint16))
    with raises(TypeError, "quantize_fp8", "x"):
        dsa.quantize_fp8(np.zeros((1, 128), np.int32))


def test_topk_errors():
    logits = np.zeros((2, 100), np.float32)
    with raises(ValueError, "topk", "k"):
        dsa.topk(logits, np.zeros(2, np.int32), 50)
    with raises(ValueError, "topk", "k"):
        dsa.topk(logits, np.zeros(2, np.int32), 1 << 40)  # refused before any allocation
    with raises(ValueError, "topk", "lengths[1]"):
        dsa.topk(logits, np.array([1, 101], np.int32), 64)
    with raises(TypeError, "topk", "lengths"):
        dsa.topk(logits, np.zeros(2, np.float32), 64)
    with raises(ValueError, "topk", "logits"):
        dsa.topk(np.zeros(100, np.float32), np.zeros(1, np.int32), 64)
    with raises(TypeError, "topk", "k"):
        dsa.topk(logits, np.zeros(2, np.int32), "64")


def test_map_indices_errors():
    idx = np.zeros((2, 4), np.int32)
    with raises(ValueError, "map_indices", "kv_start, block_table"):
        dsa.map_indices(idx)
    with raises(ValueError, "map_indices", "kv_start, block_table"):
        dsa.map_indices(idx, kv_start=np.zeros(2, np.int32), block_table=np.zeros((2, 1), np.int32))
    with raises(ValueError, "map_indices", "kv_start"):
        dsa.map_indices(idx, kv_start=np.zeros(1, np.int32))  # 2 rows, 1 sequence
    with raises(ValueError, "map_indices", "row_seq[0]"):
        dsa.map_indices(idx, kv_start=np.zeros(1, np.int32), row_seq=np.array([3, 0], np.int32))
    with raises(ValueError, "map_indices", "page_size"):
        dsa.map_indices(idx, block_table=np.zeros((2, 1), np.int32), page_size=0)


def test_cache_errors():
    k8 = np.zeros((2, 128), np.uint8)
    ks = np.ones(2, np.float32)
    with raises(ValueError, "write_indexer_cache", "cache: expected 132 bytes"):
        dsa.write_indexer_cache(k8, ks, np.zeros((2, 64, 130), np.uint8), np.zeros(2, np.int64))
    with raises(ValueError, "write_indexer_cache", "slots: expected -1 (skip) or 0 <= slot < num_slots = 128"):
        dsa.write_indexer_cache(k8, ks, np.zeros((2, 64, 132), np.uint8), np.array([0, 128], np.int64))
    with raises(TypeError, "write_indexer_cache", "slots"):
        dsa.write_indexer_cache(k8, ks, np.zeros((2, 64, 132), np.uint8), np.array([0, 1], np.int32))
    with raises(ValueError, "write_indexer_cache", "slots"):
        dsa.write_indexer_cache(k8, ks, np.zeros((2, 64, 132), np.uint8))  # no slots, no block table
    ro = np.zeros((2, 64, 132), np.uint8)
    ro.setflags(write=False)
    with raises(ValueError, "write_indexer_cache", "cache: the array is read-only"):
        dsa.write_indexer_cache(k8, ks, ro, np.zeros(2, np.int64))
    kv_c, k_pe = np.zeros((2, 512), np.float32), np.zeros((2, 64), np.float32)
    with raises(ValueError, "write_mla_cache", "cache: expected 1152 bytes (bf16) or 656 bytes (fp8)"):
        dsa.write_mla_cache(kv_c, k_pe, np.zeros((2, 4, 1000), np.uint8), np.zeros(2, np.int64))
    with raises(ValueError, "write_mla_cache", "cache: cache_dtype fp8"):
        dsa.write_mla_cache(kv_c, k_pe, np.zeros((2, 4, 1152), np.uint8), np.zeros(2, np.int64), cache_dtype="fp8")
    with raises(ValueError, "write_mla_cache", "cache_dtype"):
        dsa.write_mla_cache(kv_c, k_pe, np.zeros((2, 4, 1152), np.uint8), np.zeros(2, np.int64), cache_dtype="e4m3")
    with raises(ValueError, "write_mla_cache", "k_pe"):
        dsa.write_mla_cache(kv_c, np.zeros((2, 32), np.float32), np.zeros((2, 4, 1152), np.uint8),
                            np.zeros(2, np.int64))
    with raises(ValueError, "write_mla_cache", "cache: expected contiguous pages"):
        big = np.zeros((2, 8, 1152), np.uint8)
        dsa.write_mla_cache(kv_c, k_pe, big[:, ::2], np.zeros(2, np.int64))


def test_prep_errors():
    q = np.zeros((2, 2, 128), np.float32)
    w = np.zeros((2, 2), np.float32)
    pos = np.zeros(2, np.int32)
    cs = np.zeros((4, 64), np.float32)
    with raises(ValueError, "prepare_indexer_q", "rope"):
        dsa.prepare_indexer_q(q, w, pos, cs, rope="yarn")
    with raises(ValueError, "prepare_indexer_q", "q"):
        dsa.prepare_indexer_q(q[:, :, :64], w, pos, cs)
    with raises(TypeError, "prepare_indexer_q", "positions"):
        dsa.prepare_indexer_q(q, w, pos.astype(np.float32), cs)
    dsa.prepare_indexer_q(q, w, pos.astype(np.int64), cs)  # i64 positions (engines' dtype) are accepted
    with raises(ValueError, "quantize_fp8", "group"):
        dsa.quantize_fp8(np.zeros((1, 128), np.float32), 0)
    with raises(ValueError, "quantize_fp8", "x"):
        dsa.quantize_fp8(np.zeros((1, 100), np.float32), 64)


def test_attention_errors():
    q = np.zeros((2, 2, 576), np.float32)
    kv = np.zeros((10, 576), np.float32)
    idx = np.zeros((2, 64), np.int32)
    with raises(ValueError, "sparse_mla", "sm_scale"):
        dsa.sparse_mla(q, kv, idx, -1.0)
    with raises(TypeError, "sparse_mla", "sm_scale"):
        dsa.sparse_mla(q, kv, idx, "x")
    with raises(ValueError, "sparse_mla", "kv"):
        dsa.sparse_mla(q, np.zeros((10, 512), np.float32), idx, 0.1)
    with raises(ValueError, "sparse_mla", "attn_sink"):
        dsa.sparse_mla(q, kv, idx, 0.1, attn_sink=np.zeros(3, np.float32))
    with raises(ValueError, "sparse_mla", "topk_length"):
        dsa.sparse_mla(q, kv, idx, 0.1, topk_length=np.array([65, 0], np.int32))
    with raises(ValueError, "sparse_mla", "block_table"):
        dsa.sparse_mla(q, kv, idx, 0.1, block_table=np.zeros((1, 1), np.int32))
    with raises(ValueError, "sparse_mla", "q"):
        dsa.sparse_mla(np.zeros((2, 576), np.float32), kv, idx, 0.1)
    cu = np.array([0, 2], np.int32)
    with raises(ValueError, "dense_mla", "sm_scale"):
        dsa.dense_mla(q, kv, cu, cu)
    with raises(ValueError, "dense_mla", "cu_seqlens_k"):
        dsa.dense_mla(q, kv, cu, np.array([0, 1], np.int32), 0.1)  # q_len 2 > kv_len 1
    with raises(ValueError, "dense_mla", "cu_seqlens_q"):
        dsa.dense_mla(q, kv, np.array([0, 3], np.int32), cu, 0.1)


def test_not_an_array_and_unknown_devices():
    with raises(ValueError, "sparse_mla", "q: is required"):
        dsa.sparse_mla(None, None, None, 0.1)
    with raises(ValueError, "write_mla_cache", "cache"):
        dsa.write_mla_cache(np.zeros((1, 512), np.float32), np.zeros((1, 64), np.float32), None,
                            np.zeros(1, np.int64))
    with raises(TypeError, "topk", "logits"):
        dsa.topk([[1.0]], np.zeros(1, np.int32), 64)
    from dsa._frameworks import _stream_handle
    with pytest.raises(TypeError, match="stream: expected an int"):
        _stream_handle(object())
    with raises(ValueError, "dense_mla", "kv: is required"):
        dsa.dense_mla(np.zeros((1, 1, 576), np.float32), None, np.array([0, 1], np.int32), None, 0.1)
