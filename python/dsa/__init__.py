"""DSA: DeepSeek Sparse Attention inference ops (DeepSeek-V3.2, GLM-5) for Python.

Tensors come in through DLPack (numpy arrays, torch tensors on CPU and CUDA, CuPy arrays) and
are never copied; outputs come back in the caller's framework. ``import dsa`` imports neither
torch nor CuPy and never touches CUDA. ``import dsa.torch`` (torch >= 2.4) registers the ops as
``torch.ops.dsa.*`` for torch.compile and CUDA graphs. See docs/python.md.
"""
from . import _dsa
from ._ops import (
    deepseek_sm_scale,
    dense_mla,
    indexer_logits,
    indexer_logits_paged,
    indexer_topk,
    map_indices,
    prepare_indexer_k,
    prepare_indexer_q,
    quantize_fp8,
    read_indexer_cache,
    read_mla_cache,
    sparse_mla,
    topk,
    write_indexer_cache,
    write_mla_cache,
)

if hasattr(_dsa, "make_plan"):  # built from a tree with the planner (dsa/planner.h, dsa/layer.h)
    from ._layer import Attention, Plan, Planner, plan  # noqa: F401

__version__ = _dsa.version()

# Byte sizes of the cache layouts (SPEC 4).
MLA_BF16_TOKEN_BYTES = 1152
MLA_FP8_TOKEN_BYTES = 656
INDEXER_TOKEN_BYTES = 132
DEFAULT_PAGE_SIZE = 64


def version():
    """The library version, e.g. '0.1.0'."""
    return _dsa.version()


def compiled_backends():
    """Backends built into this module: ['cpu'] or ['cpu', 'cuda']."""
    return list(_dsa.compiled_backends())


def cuda_available():
    """True when this build has the CUDA backend and the driver reports a device.
    (This asks the CUDA runtime; importing dsa does not.)"""
    return bool(_dsa.cuda_available())


def list_devices():
    """The CPU, then every CUDA device: dicts with device, name, compute_capability,
    multiprocessors, memory_bytes. Queries the CUDA runtime in CUDA builds."""
    return list(_dsa.list_devices())


def set_num_threads(n):
    """Threads of the CPU backend (n <= 0: all hardware threads, the default)."""
    import operator
    n = operator.index(n)  # TypeError for a non-integer
    if not -2**31 <= n < 2**31:
        raise ValueError("set_num_threads: n: expected <= 1024 (or <= 0 for all hardware threads), got %d" % n)
    _dsa.set_num_threads(n)


def num_threads():
    """Threads the CPU backend uses."""
    return _dsa.num_threads()


def geometry_preset(name):
    """Model geometry (SPEC 2) as a dict: 'deepseek-v3.2', 'glm-5' or 'glm-5.2'. layer_roles lists
    each layer's indexer role ('full', 'shared', 'mtp')."""
    return _dsa.geometry_preset(str(name))


def geometry_preset_names():
    return list(_dsa.geometry_preset_names())


def __getattr__(name):
    # `dsa.torch` without an explicit `import dsa.torch`: import it on first use only, so that
    # `import dsa` itself never imports torch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'dsa' has no attribute %r" % name)


__all__ = [
    "compiled_backends", "cuda_available", "deepseek_sm_scale", "dense_mla", "geometry_preset",
    "geometry_preset_names", "indexer_logits", "indexer_logits_paged", "indexer_topk", "list_devices", "map_indices",
    "num_threads", "prepare_indexer_k", "prepare_indexer_q", "quantize_fp8", "read_indexer_cache", "read_mla_cache",
    "set_num_threads", "sparse_mla", "topk", "version", "write_indexer_cache", "write_mla_cache",
]
if hasattr(_dsa, "make_plan"):
    __all__ += ["Attention", "Plan", "Planner", "plan"]
