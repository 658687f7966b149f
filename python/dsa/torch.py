"""DSA ops as PyTorch custom operators: ``torch.ops.dsa.<name>`` (torch >= 2.4).

Each op is registered with ``torch.library.custom_op`` and a fake (meta) implementation, so a
module calling them compiles under ``torch.compile(fullgraph=True)`` and runs inside CUDA-graph
capture. Unlike the framework-neutral ``dsa.<name>`` functions, every output size is an explicit
argument (``width`` of the logits): nothing is read back from the device, so nothing syncs.

Outputs are allocated with torch.empty on the inputs' device; the work goes on torch's current
CUDA stream. FP8 tensors are torch.float8_e4m3fn (uint8 is accepted as its bits).

    import dsa.torch  # registers torch.ops.dsa.*
    logits = torch.ops.dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, width)
    out, lse = dsa.torch.sparse_mla(q, kv_cache, indices, sm_scale)
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops


def _version_tuple(v):
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version_tuple(torch.__version__) < (2, 4) or not hasattr(torch.library, "custom_op"):
    raise ImportError("dsa.torch needs torch >= 2.4 (torch.library.custom_op), found torch %s; the "
                      "framework-neutral dsa.* functions work with any torch" % torch.__version__)

_CACHE_DTYPES = {-1: None, 0: "bf16", 1: "fp8"}
_E4M3 = torch.float8_e4m3fn


def _cd(cache_dtype):
    return _CACHE_DTYPES.get(cache_dtype, cache_dtype)


def _ps(page_size):
    return None if page_size <= 0 else page_size


# ---- indexer -----------------------------------------------------------------------------------

@torch.library.custom_op("dsa::quantize_fp8", mutates_args=())
def quantize_fp8(x: Tensor, group: int = 128) -> Tuple[Tensor, Tensor]:
    return _ops.quantize_fp8(x, group)


@quantize_fp8.register_fake
def _(x, group=128):
    return (x.new_empty(x.shape, dtype=_E4M3),
            x.new_empty((x.shape[0], x.shape[1] // group), dtype=torch.float32))


@torch.library.custom_op("dsa::prepare_indexer_q", mutates_args=())
def prepare_indexer_q(q: Tensor, weights: Tensor, positions: Tensor, cos_sin: Tensor, rope: int = 0,
                      hadamard: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    return _ops.prepare_indexer_q(q, weights, positions, cos_sin, rope, hadamard, return_q_scale=True)


@prepare_indexer_q.register_fake
def _(q, weights, positions, cos_sin, rope=0, hadamard=False):
    T, H = q.shape[0], q.shape[1]
    return (q.new_empty(q.shape, dtype=_E4M3), q.new_empty((T, H), dtype=torch.float32),
            q.new_empty((T, H), dtype=torch.float32))


@torch.library.custom_op("dsa::prepare_indexer_k", mutates_args=())
def prepare_indexer_k(k: Tensor, positions: Tensor, cos_sin: Tensor, rope: int = 0,
                      hadamard: bool = False) -> Tuple[Tensor, Tensor]:
    return _ops.prepare_indexer_k(k, positions, cos_sin, rope, hadamard)


@prepare_indexer_k.register_fake
def _(k, positions, cos_sin, rope=0, hadamard=False):
    return k.new_empty(k.shape, dtype=_E4M3), k.new_empty((k.shape[0],), dtype=torch.float32)


@torch.library.custom_op("dsa::indexer_logits", mutates_args=())
def indexer_logits(q: Tensor, weights: Tensor, k: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor, width: int,
                   col_offset: int = 0) -> Tensor:
    return _ops.indexer_logits(q, weights, k, k_scale, ks, ke, width=width, col_offset=col_offset)


@indexer_logits.register_fake
def _(q, weights, k, k_scale, ks, ke, width, col_offset=0):
    return q.new_empty((q.shape[0], width), dtype=torch.float32)


@torch.library.custom_op("dsa::indexer_logits_paged", mutates_args=())
def indexer_logits_paged(q: Tensor, weights: Tensor, cache: Tensor, block_table: Tensor, kv_lens: Optional[Tensor],
                         next_n: int, width: int, row_seq: Optional[Tensor] = None,
                         row_len: Optional[Tensor] = None, col_offset: int = 0, page_size: int = -1) -> Tensor:
    return _ops.indexer_logits_paged(q, weights, cache, block_table, kv_lens, next_n, width=width, row_seq=row_seq,
                                     row_len=row_len, col_offset=col_offset, page_size=_ps(page_size))


@indexer_logits_paged.register_fake
def _(q, weights, cache, block_table, kv_lens, next_n, width, row_seq=None, row_len=None, col_offset=0,
      page_size=-1):
    return q.new_empty((q.shape[0], width), dtype=torch.float32)


# ---- top-k and index mapping --------------------------------------------------------------------

@torch.library.custom_op("dsa::topk", mutates_args=())
def topk(logits: Tensor, lengths: Tensor, k: int) -> Tensor:
    return _ops.topk(logits, lengths, k)


@topk.register_fake
def _(logits, lengths, k):
    return logits.new_empty((logits.shape[0], k), dtype=torch.int32)


@torch.library.custom_op("dsa::topk_with_values", mutates_args=())
def topk_with_values(logits: Tensor, lengths: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    return _ops.topk(logits, lengths, k, return_values=True)


@topk_with_values.register_fake
def _(logits, lengths, k):
    M = logits.shape[0]
    return logits.new_empty((M, k), dtype=torch.int32), logits.new_empty((M, k), dtype=torch.float32)


@torch.library.custom_op("dsa::map_indices_flat", mutates_args=())
def map_indices_flat(indices: Tensor, kv_start: Tensor, row_seq: Optional[Tensor] = None,
                     rows_per_seq: int = 1) -> Tensor:
    return _ops.map_indices(indices, kv_start=kv_start, row_seq=row_seq, rows_per_seq=rows_per_seq)


@map_indices_flat.register_fake
def _(indices, kv_start, row_seq=None, rows_per_seq=1):
    return torch.empty_like(indices, dtype=torch.int32)


@torch.library.custom_op("dsa::map_indices_paged", mutates_args=())
def map_indices_paged(indices: Tensor, block_table: Tensor, page_size: int, row_seq: Optional[Tensor] = None,
                      rows_per_seq: int = 1) -> Tensor:
    return _ops.map_indices(indices, block_table=block_table, page_size=page_size, row_seq=row_seq,
                            rows_per_seq=rows_per_seq)


@map_indices_paged.register_fake
def _(indices, block_table, page_size, row_seq=None, rows_per_seq=1):
    return torch.empty_like(indices, dtype=torch.int32)


def map_indices(indices, *, kv_start=None, block_table=None, page_size=64, row_seq=None, rows_per_seq=1):
    """dsa.map_indices through torch.ops.dsa.map_indices_flat / _paged."""
    if (kv_start is None) == (block_table is None):
        raise ValueError("map_indices: kv_start, block_table: expected exactly one (flat form: kv_start, paged "
                         "form: block_table)")
    if kv_start is not None:
        return map_indices_flat(indices, kv_start, row_seq, rows_per_seq)
    return map_indices_paged(indices, block_table, page_size, row_seq, rows_per_seq)


# ---- caches (mutating) ---------------------------------------------------------------------------

@torch.library.custom_op("dsa::write_indexer_cache", mutates_args=("cache",))
def write_indexer_cache(k: Tensor, k_scale: Tensor, cache: Tensor, slots: Optional[Tensor] = None,
                        block_table: Optional[Tensor] = None, token_seq: Optional[Tensor] = None,
                        token_pos: Optional[Tensor] = None, page_size: int = -1) -> None:
    _ops.write_indexer_cache(k, k_scale, cache, slots, block_table=block_table, token_seq=token_seq,
                             token_pos=token_pos, page_size=_ps(page_size))


@write_indexer_cache.register_fake
def _(k, k_scale, cache, slots=None, block_table=None, token_seq=None, token_pos=None, page_size=-1):
    return None


@torch.library.custom_op("dsa::write_mla_cache", mutates_args=("cache",))
def write_mla_cache(kv_c: Tensor, k_pe: Tensor, cache: Tensor, slots: Optional[Tensor] = None,
                    block_table: Optional[Tensor] = None, token_seq: Optional[Tensor] = None,
                    token_pos: Optional[Tensor] = None, cache_dtype: int = -1, page_size: int = -1) -> None:
    _ops.write_mla_cache(kv_c, k_pe, cache, slots, block_table=block_table, token_seq=token_seq, token_pos=token_pos,
                         cache_dtype=_cd(cache_dtype), page_size=_ps(page_size))


@write_mla_cache.register_fake
def _(kv_c, k_pe, cache, slots=None, block_table=None, token_seq=None, token_pos=None, cache_dtype=-1,
      page_size=-1):
    return None


@torch.library.custom_op("dsa::read_mla_cache", mutates_args=())
def read_mla_cache(cache: Tensor, slots: Tensor, cache_dtype: int = -1, page_size: int = -1) -> Tensor:
    # Rows of invalid slots are left as they are: start from zeros so the result is defined.
    out = torch.zeros((slots.shape[0], 576), dtype=torch.float32, device=cache.device)
    return _ops.read_mla_cache(cache, slots, cache_dtype=_cd(cache_dtype), page_size=_ps(page_size), out=out)


@read_mla_cache.register_fake
def _(cache, slots, cache_dtype=-1, page_size=-1):
    return cache.new_empty((slots.shape[0], 576), dtype=torch.float32)


# ---- attention ---------------------------------------------------------------------------------------

def _attn_fake(q):
    out_dtype = torch.float32 if q.dtype == torch.float32 else torch.bfloat16
    return (q.new_empty((q.shape[0], q.shape[1], 512), dtype=out_dtype),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


@torch.library.custom_op("dsa::sparse_mla", mutates_args=())
def sparse_mla(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, topk_length: Optional[Tensor] = None,
               attn_sink: Optional[Tensor] = None, cache_dtype: int = -1,
               page_size: int = -1) -> Tuple[Tensor, Tensor]:
    return _ops.sparse_mla(q, kv, indices, sm_scale, topk_length, attn_sink, cache_dtype=_cd(cache_dtype),
                           page_size=_ps(page_size))


@sparse_mla.register_fake
def _(q, kv, indices, sm_scale, topk_length=None, attn_sink=None, cache_dtype=-1, page_size=-1):
    return _attn_fake(q)


@torch.library.custom_op("dsa::dense_mla", mutates_args=())
def dense_mla(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor], sm_scale: float,
              block_table: Optional[Tensor] = None, kv_lens: Optional[Tensor] = None,
              attn_sink: Optional[Tensor] = None, cache_dtype: int = -1,
              page_size: int = -1) -> Tuple[Tensor, Tensor]:
    return _ops.dense_mla(q, kv, cu_seqlens_q, cu_seqlens_k, sm_scale, block_table=block_table, kv_lens=kv_lens,
                          attn_sink=attn_sink, cache_dtype=_cd(cache_dtype), page_size=_ps(page_size))


@dense_mla.register_fake
def _(q, kv, cu_seqlens_q, cu_seqlens_k, sm_scale, block_table=None, kv_lens=None, attn_sink=None,
      cache_dtype=-1, page_size=-1):
    return _attn_fake(q)


OPS = ("quantize_fp8", "prepare_indexer_q", "prepare_indexer_k", "indexer_logits", "indexer_logits_paged", "topk",
       "topk_with_values", "map_indices_flat", "map_indices_paged", "write_indexer_cache", "write_mla_cache",
       "read_mla_cache", "sparse_mla", "dense_mla")
