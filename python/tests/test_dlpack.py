"""The DLPack capsule path on the CPU, with a producer that is neither numpy nor torch."""
import numpy as np
import pytest

import dsa
from helpers import random_e4m3, rng


class Producer:
    """A minimal DLPack producer over a numpy array (as a foreign framework would be)."""

    def __init__(self, a):
        self._a = a
        self.shape = a.shape
        self.dtype = a.dtype
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_foreign_producer_matches_numpy_and_outputs_are_numpy():
    r = rng(50)
    q8 = random_e4m3(r, (3, 2, 128))
    k8 = random_e4m3(r, (20, 128))
    args = [q8, np.ones((3, 2), np.float32), k8, np.ones(20, np.float32), np.array([0, 2, 5], np.int32),
            np.array([20, 9, 5], np.int32)]
    ref = dsa.indexer_logits(*args)
    wrapped = [Producer(a) for a in args]
    got = dsa.indexer_logits(*wrapped)  # width from ks/ke read through np.from_dlpack
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, ref)
    assert all(w.calls >= 1 for w in wrapped)


def test_foreign_producer_strided_view():
    r = rng(51)
    logits = r.standard_normal((6, 300)).astype(np.float32)
    lengths = np.array([300, 10, 200], np.int32)
    ref = dsa.topk(np.ascontiguousarray(logits[::2]), lengths, 64)
    got = dsa.topk(Producer(logits[::2]), Producer(lengths), 64)  # row stride 600 elements
    np.testing.assert_array_equal(got, ref)


def test_foreign_producer_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="topk: logits: unsupported dtype float64"):
        dsa.topk(Producer(np.zeros((1, 10))), np.array([1], np.int32), 64)


def test_foreign_producer_bad_capsule_is_a_type_error():
    class Bad(Producer):
        def __dlpack__(self, stream=None):
            raise BufferError("cannot export")
    with pytest.raises(TypeError, match="topk: logits: could not export it through DLPack"):
        dsa.topk(Bad(np.zeros((1, 10), np.float32)), np.array([1], np.int32), 64)
