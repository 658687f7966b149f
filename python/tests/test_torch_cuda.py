"""CUDA through torch (>= 2.4): agreement with the CPU backend / oracle, torch's current stream,
torch.compile(fullgraph=True) and CUDA-graph capture. Skipped without a GPU or a CUDA build."""
import numpy as np
import pytest

import dsa
import oracle
from helpers import bf16_bits, random_e4m3, rng

torch = pytest.importorskip("torch")
if not (hasattr(torch.library, "custom_op") and torch.cuda.is_available() and "cuda" in dsa.compiled_backends()):
    pytest.skip("needs torch >= 2.4, a CUDA device and dsa built with -DDSA_CUDA=ON", allow_module_level=True)

import dsa.torch  # noqa: E402,F401  (registers torch.ops.dsa)

DEV = "cuda"
E4M3 = torch.float8_e4m3fn


def _logits_case(seed=40, M=8, H=4, N=300):
    r = rng(seed)
    q8 = random_e4m3(r, (M, H, 128))
    k8 = random_e4m3(r, (N, 128))
    w = r.standard_normal((M, H)).astype(np.float32)
    k_scale = (2.0 ** r.integers(-8, 0, size=N)).astype(np.float32)
    ks = r.integers(0, 50, size=M).astype(np.int32)
    ke = (ks + r.integers(0, N - 50, size=M)).astype(np.int32)
    return q8, w, k8, k_scale, ks, ke


def _cuda(a, fp8=False):
    t = torch.from_numpy(np.ascontiguousarray(a)).to(DEV)
    return t.view(E4M3) if fp8 else t


def test_indexer_logits_and_topk_match_cpu():
    q8, w, k8, k_scale, ks, ke = _logits_case()
    width = int((ke - ks).max())
    ref = dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, width=width)
    got = dsa.indexer_logits(_cuda(q8, True), _cuda(w), _cuda(k8, True), _cuda(k_scale), _cuda(ks), _cuda(ke),
                             width=width)
    assert got.device.type == "cuda" and got.dtype == torch.float32
    g = got.cpu().numpy()
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref))
    finite = ~np.isneginf(ref)
    absum = oracle.indexer_logits_abs(q8, w, k8, k_scale, ks, ke, width)
    assert np.all(np.abs(g[finite] - ref[finite]) <= 2 * 134 * 2.0 ** -24 * absum[finite] + 1e-30)
    lengths = (ke - ks).astype(np.int32)
    idx = dsa.topk(got, _cuda(lengths), 64)
    np.testing.assert_array_equal(idx.cpu().numpy(), oracle.topk(g, lengths, 64))


def test_caches_quantize_and_map_match_cpu():
    r = rng(41)
    x = r.standard_normal((5, 256)).astype(np.float32)
    a8, a_s = dsa.quantize_fp8(x)
    b8, b_s = dsa.quantize_fp8(_cuda(x))
    np.testing.assert_array_equal(b8.view(torch.uint8).cpu().numpy(), a8)
    np.testing.assert_array_equal(b_s.cpu().numpy(), a_s)
    kv_c = r.standard_normal((6, 512)).astype(np.float32)
    k_pe = r.standard_normal((6, 64)).astype(np.float32)
    slots = np.array([0, 9, 63, -1, 64, 100], np.int64)
    for width in (1152, 656):
        c_cpu = np.full((2, 64, width), 0xFF, np.uint8)
        c_gpu = _cuda(c_cpu)
        dsa.write_mla_cache(kv_c, k_pe, c_cpu, slots)
        dsa.write_mla_cache(_cuda(kv_c), _cuda(k_pe), c_gpu, _cuda(slots))
        np.testing.assert_array_equal(c_gpu.cpu().numpy(), c_cpu)
    idx = r.integers(-1, 100, size=(4, 64)).astype(np.int32)
    table = np.array([[1, 0], [0, 1]], np.int32)
    ref = dsa.map_indices(idx, block_table=table, page_size=64, rows_per_seq=2)
    got = dsa.map_indices(_cuda(idx), block_table=_cuda(table), page_size=64, rows_per_seq=2)
    np.testing.assert_array_equal(got.cpu().numpy(), ref)


def test_sparse_and_dense_mla_match_oracle():
    r = rng(42)
    T, H, S = 5, 4, 120
    q = bf16_bits(r.standard_normal((T, H, 576)))
    kv = bf16_bits(r.standard_normal((S, 576)))
    idx = r.integers(-1, S, size=(T, 64)).astype(np.int32)
    out, lse = dsa.sparse_mla(_cuda(q).view(torch.bfloat16), _cuda(kv).view(torch.bfloat16), _cuda(idx), 0.1)
    q64, kv64 = oracle.bf16_bits_to_f64(q), oracle.bf16_bits_to_f64(kv)
    keys = [kv64[[j for j in row if j >= 0]] for row in idx]
    ref_out, ref_lse = oracle.attention_rows(q64, keys, 0.1)
    got = out.float().cpu().numpy().astype(np.float64)
    assert np.all(np.abs(got - ref_out) <= 2.0 ** -7 * np.abs(ref_out) + 1e-3 * np.abs(kv64).max())
    assert np.all(np.abs(lse.cpu().numpy() - ref_lse) <= 1e-3 * (1 + np.abs(ref_lse)))
    cu = np.array([0, T], np.int32)
    cu_k = np.array([0, S], np.int32)
    d_out, d_lse = dsa.dense_mla(_cuda(q).view(torch.bfloat16), _cuda(kv).view(torch.bfloat16), _cuda(cu),
                                 _cuda(cu_k), 0.1)
    keys = [kv64[:S - T + i + 1] for i in range(T)]
    ref_out, ref_lse = oracle.attention_rows(q64, keys, 0.1)
    got = d_out.float().cpu().numpy().astype(np.float64)
    assert np.all(np.abs(got - ref_out) <= 2.0 ** -7 * np.abs(ref_out) + 1e-3 * np.abs(kv64).max())


def test_work_goes_on_torchs_current_stream():
    q8, w, k8, k_scale, ks, ke = _logits_case(seed=43)
    width = int((ke - ks).max())
    ref = dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, width=width)
    side = torch.cuda.Stream()
    args = [_cuda(q8, True), _cuda(w), _cuda(k8, True), _cuda(k_scale), _cuda(ks), _cuda(ke)]
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy ...
        w_late = args[1] * 1.0          # ... and produce an input on it afterwards
        out = dsa.indexer_logits(args[0], w_late, *args[2:], width=width)
    # Had the op run on another stream, it would have read w_late before it was written.
    side.synchronize()
    g = out.cpu().numpy()
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref))
    finite = ~np.isneginf(ref)
    assert np.allclose(g[finite], ref[finite], rtol=1e-5, atol=1e-6 * np.abs(ref[finite]).max())


def _step(q8, w, k8, k_scale, ks, ke, q, kv, width):
    logits = torch.ops.dsa.indexer_logits(q8, w, k8, k_scale, ks, ke, width)
    idx = torch.ops.dsa.topk(logits, ke - ks, 64)
    slots = torch.ops.dsa.map_indices_flat(idx, ks, None, 1)
    return torch.ops.dsa.sparse_mla(q, kv, slots, 0.1)


def _step_inputs(seed=44):
    q8, w, k8, k_scale, ks, ke = _logits_case(seed=seed)
    r = rng(seed + 1)
    M = q8.shape[0]
    q = torch.from_numpy(bf16_bits(r.standard_normal((M, 2, 576)))).to(DEV).view(torch.bfloat16)
    kv = torch.from_numpy(bf16_bits(r.standard_normal((k8.shape[0], 576)))).to(DEV).view(torch.bfloat16)
    return [_cuda(q8, True), _cuda(w), _cuda(k8, True), _cuda(k_scale), _cuda(ks), _cuda(ke), q, kv], \
        int((ke - ks).max())


def test_torch_compile_fullgraph():
    args, width = _step_inputs()
    eager = _step(*args, width)
    compiled = torch.compile(_step, fullgraph=True)
    got = compiled(*args, width)
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)


def test_cuda_graph_capture_and_replay():
    args, width = _step_inputs(seed=45)
    static = [a.clone() for a in args]
    _step(*static, width)  # warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = _step(*static, width)
    new_args, _ = _step_inputs(seed=46)
    for s, n in zip(static, new_args):
        if s.shape == n.shape:
            s.copy_(n)
    static[5].copy_(torch.minimum(static[5], static[4] + width))  # rows fit the captured width
    g.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = _step(*static, width)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
