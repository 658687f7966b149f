"""torch CPU tensors through DLPack (any torch version), and dsa.torch where torch >= 2.4."""
import numpy as np
import pytest

import dsa
import oracle
from helpers import bf16_bits, random_e4m3, rng

torch = pytest.importorskip("torch")

TORCH_2_4 = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def _bits_of(t):
    """uint16 numpy bits of a torch.bfloat16 tensor."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_torch_in_torch_out_matches_numpy():
    r = rng(30)
    logits = r.standard_normal((4, 300)).astype(np.float32)
    lengths = np.array([300, 100, 64, 0], np.int32)
    ref = dsa.topk(logits, lengths, 128)
    got = dsa.topk(torch.from_numpy(logits), torch.from_numpy(lengths), 128)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32 and got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy(), ref)


def test_torch_bf16_attention_matches_uint16_bits():
    r = rng(31)
    q = torch.randn(3, 2, 576, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    kv = torch.randn(40, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    idx = torch.from_numpy(r.integers(-1, 40, size=(3, 64)).astype(np.int32))
    out, lse = dsa.sparse_mla(q, kv, idx, 0.1)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and out.shape == (3, 2, 512)
    ref_out, ref_lse = dsa.sparse_mla(_bits_of(q), _bits_of(kv), idx.numpy(), 0.1)
    np.testing.assert_array_equal(_bits_of(out), ref_out)
    np.testing.assert_array_equal(lse.numpy(), ref_lse)


def test_requires_grad_views_and_offsets():
    r = rng(32)
    x = torch.from_numpy(r.standard_normal((6, 256)).astype(np.float32)).requires_grad_(True)
    x8, s = dsa.quantize_fp8(x[2:])  # storage offset, requires grad
    ref8, ref_s = oracle.quantize_groups(x.detach().numpy()[2:], 128)
    got8 = x8.view(torch.uint8) if x8.dtype != torch.uint8 else x8
    np.testing.assert_array_equal(got8.numpy(), ref8)
    np.testing.assert_array_equal(s.numpy().astype(np.float64), ref_s)


def test_torch_strided_last_dim_is_rejected_not_copied():
    q = torch.zeros(1, 2, 576)
    kv = torch.zeros(576, 10).t()  # [10, 576] with last-dim stride 10
    with pytest.raises(ValueError, match="sparse_mla: kv: expected the last dim to be contiguous"):
        dsa.sparse_mla(q, kv, torch.zeros(1, 64, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="sparse_mla: q: expected the last dim to be contiguous"):
        dsa.sparse_mla(torch.zeros(1, 2, 576, 2)[..., 0], kv.contiguous(), torch.zeros(1, 64, dtype=torch.int32), 0.1)


def test_torch_uint8_fp8_inputs():
    r = rng(33)
    q8 = random_e4m3(r, (2, 2, 128))
    k8 = random_e4m3(r, (9, 128))
    args = (q8, np.ones((2, 2), np.float32), k8, np.ones(9, np.float32), np.zeros(2, np.int32),
            np.array([9, 4], np.int32))
    ref = dsa.indexer_logits(*args)
    got = dsa.indexer_logits(*[torch.from_numpy(a) for a in args])
    np.testing.assert_array_equal(got.numpy(), ref)


@pytest.mark.skipif(TORCH_2_4, reason="torch >= 2.4 has custom_op")
def test_dsa_torch_refuses_old_torch():
    with pytest.raises(ImportError, match="dsa.torch needs torch >= 2.4"):
        import dsa.torch  # noqa: F401


@pytest.mark.skipif(not TORCH_2_4, reason="needs torch >= 2.4")
def test_dsa_torch_ops_registered_and_opcheck_cpu():
    import dsa.torch as dt
    for name in dt.OPS:
        assert hasattr(torch.ops.dsa, name)
    r = rng(34)
    logits = torch.from_numpy(r.standard_normal((3, 200)).astype(np.float32))
    lengths = torch.tensor([200, 50, 0], dtype=torch.int32)
    torch.library.opcheck(torch.ops.dsa.topk.default, (logits, lengths, 64))
    q = torch.randn(2, 2, 576)
    kv = torch.randn(30, 576)
    idx = torch.from_numpy(r.integers(-1, 30, size=(2, 64)).astype(np.int32))
    torch.library.opcheck(torch.ops.dsa.sparse_mla.default, (q, kv, idx, 0.1))


@pytest.mark.skipif(not TORCH_2_4, reason="needs torch >= 2.4")
def test_dsa_torch_compiles_fullgraph_cpu():
    import dsa.torch as dt  # noqa: F401
    r = rng(35)
    q8 = torch.from_numpy(random_e4m3(r, (4, 2, 128))).view(torch.float8_e4m3fn)
    k8 = torch.from_numpy(random_e4m3(r, (100, 128))).view(torch.float8_e4m3fn)
    w = torch.randn(4, 2)
    k_scale = torch.ones(100)
    ks = torch.zeros(4, dtype=torch.int32)
    ke = torch.tensor([100, 80, 64, 1], dtype=torch.int32)

    def step(q8, w, k8, k_scale, ks, ke):
        logits = torch.ops.dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, 100)
        return torch.ops.dsa.topk(logits, ke - ks, 64)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q8, w, k8, k_scale, ks, ke), step(q8, w, k8, k_scale, ks, ke), rtol=0, atol=0)
