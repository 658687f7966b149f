#!/usr/bin/env python3
"""Plain-PyTorch baseline for `dsa bench`: the same ops at the same shapes (same op and shape
strings, so the two JSON files join on them), timed the same way (CUDA events around each
run, warm-up first, median of the timed runs, inputs rotated between sets of fresh random data).

The implementations are what an engine without DSA's kernels would write: dequantise and use
dense matmuls (chunked so temporaries stay in a few GiB), torch.topk, gather + einsum + softmax
for sparse attention, masked math for dense attention.

When `import dsa` works (PYTHONPATH=<build>/python of a -DDSA_BUILD_PYTHON=ON -DDSA_CUDA=ON build),
each shape is also timed through the dsa Python module in this process, on the same random data
(seen in dsa's layouts: the caches as pages of 64, indices as int32), the same way; the table and
JSON add dsa_ms, speedup (torch ms / dsa ms) and agree: dsa's result against torch's on input set 0,
as max |dsa - torch| / max |torch| over finite entries (non-finite entries must match), top-k as
index sets. That check catches a wrong mapping (indices, layout, scales), not small numeric
differences: torch's math here rounds to bf16. --no-dsa times torch only.

    python3 bench/torch_baseline.py [--quick] [--op NAME[,NAME]] [--json PATH] [--iters N] [--warmup N] [--no-dsa]
    python3 bench/torch_baseline.py --device cpu --tiny     # smoke test of every code path, no GPU needed
"""
import argparse
import datetime
import json
import statistics
import sys
import time

OPS = ["indexer_logits", "topk", "sparse_mla_prefill", "sparse_mla_decode", "dense_mla_decode", "dense_mla_prefill"]
D, DV, SM_SCALE = 576, 512, 0.13523
FP8_TOKEN_BYTES = 656
CHUNK_BYTES = 2 << 30  # budget for the largest temporary of a chunked op
DEV = "cuda"  # --device cpu: a smoke run of every code path (with --tiny), not a measurement


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes and runs")
    ap.add_argument("--op", default="", help="comma-separated ops: " + ", ".join(OPS))
    ap.add_argument("--json", default="", help="write results as JSON to this path")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--no-dsa", action="store_true", help="time plain torch only, not also through `import dsa`")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test (with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="toy shapes: checks every code path, measures nothing")
    a = ap.parse_args()
    a.ops = [s for s in a.op.split(",") if s] or OPS
    for s in a.ops:
        if s not in OPS:
            ap.error(f"--op: unknown op '{s}'")
    if a.warmup is None:
        a.warmup = 2 if a.quick else 3
    if a.iters is None:
        a.iters = 10 if a.quick else 30
    return a


def time_op(torch, fn, sets, warmup, iters):
    for i in range(warmup):
        fn(i % sets)
    if DEV != "cuda":  # smoke mode: wall clock, the work is synchronous
        ms = []
        for i in range(iters):
            t0 = time.perf_counter()
            fn((warmup + i) % sets)
            ms.append((time.perf_counter() - t0) * 1e3)
        ms.sort()
        return statistics.median(ms), ms[0]
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn((warmup + i) % sets)
        stops[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    return statistics.median(ms), ms[0]


# torch without float8_e4m3fn (Debian's 1.13, CPU smoke runs only) keeps e4m3 as uint8 bits and
# converts through a 256-entry table; with float8 support the ops below are plain torch casts.
_E4M3_LUT = {}


def _e4m3_table(torch):
    if DEV not in _E4M3_LUT:
        b = torch.arange(256)
        e, m = (b >> 3) & 15, (b & 7).double()
        v = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
        v = torch.where(b >= 128, -v, v)
        v[(b & 0x7F) == 0x7F] = float("nan")
        _E4M3_LUT[DEV] = v.float().to(DEV)
    return _E4M3_LUT[DEV]


def has_fp8(torch):
    return hasattr(torch, "float8_e4m3fn")


def fp8_bits(torch, x):
    """float tensor -> its nearest e4m3 (saturated to +-448) as uint8 bits."""
    if has_fp8(torch):
        return x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    pos = _e4m3_table(torch)[:127]  # bytes 0x00..0x7e: the finite non-negative values, ascending
    a = x.float().abs().clamp(max=448)
    i = torch.searchsorted(pos, a.contiguous()).clamp(1, 126)
    i = torch.where((a - pos[i - 1]) <= (pos[i] - a), i - 1, i)
    return (i | torch.where(x < 0, 128, 0)).to(torch.uint8)


def fp8_to(torch, x, dtype):
    """e4m3 tensor (float8 or uint8 bits) -> dtype (exact for float32 and bfloat16)."""
    if x.dtype == torch.uint8:
        return x.view(torch.float8_e4m3fn).to(dtype) if has_fp8(torch) else _e4m3_table(torch)[x.long()].to(dtype)
    return x.to(dtype)


def random_fp8(torch, shape):
    # Random finite e4m3 values over the format's range (no NaN bytes), like the dsa bench pools.
    x = torch.randn(shape, device=DEV) * 64
    return x.clamp(-448, 448).to(torch.float8_e4m3fn) if has_fp8(torch) else fp8_bits(torch, x)


def pow2_scales(torch, n):
    return torch.pow(2.0, -4.0 - torch.randint(0, 6, (n,), device=DEV).float())


# ---- the ops ------------------------------------------------------------------------------------
def indexer_logits(torch, q8, w, k8, k_scale, ke, out):
    """logits[i, j] = sum_h w[i,h] relu(q[i,h] . k[j]) k_scale[j] for j < ke[i], else -inf."""
    M, H, _ = q8.shape
    N = k8.shape[0]
    kb = fp8_to(torch, k8, torch.bfloat16)  # e4m3 -> bf16 is exact
    rows = max(1, CHUNK_BYTES // (H * N * 2))
    cols = torch.arange(N, device=DEV)
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        s = torch.matmul(fp8_to(torch, q8[r0:r1], torch.bfloat16), kb.t())  # [r, H, N]
        s.relu_()
        lg = torch.einsum("rhn,rh->rn", s, w[r0:r1].to(torch.bfloat16)).float() * k_scale
        lg.masked_fill_(cols[None, :] >= ke[r0:r1, None], float("-inf"))
        out[r0:r1] = lg


def dequant_fp8_tokens(torch, raw):
    """[..., 656] uint8 FP8 MLA tokens -> [..., 576] bf16 (e4m3 * per-128 scale | bf16 k_pe)."""
    lead = raw.shape[:-1]
    c = fp8_to(torch, raw[..., :512].contiguous(), torch.float32).view(*lead, 4, 128)
    sc = raw[..., 512:528].contiguous().view(torch.float32).view(*lead, 4, 1)
    pe = raw[..., 528:656].contiguous().view(torch.bfloat16)
    return torch.cat([(c * sc).view(*lead, 512).to(torch.bfloat16), pe], dim=-1)


def sparse_mla(torch, q, cache, fp8, idx, out, lse):
    """Gather the selected keys, scores, softmax over valid ones, weighted sum of values."""
    T, H, _ = q.shape
    K = idx.shape[1]
    tb = FP8_TOKEN_BYTES if fp8 else D * 2
    per_token = K * (tb + D * 2) + H * K * 8
    rows = max(1, min(T, CHUNK_BYTES // per_token))
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        ix = idx[t0:t1]
        valid = ix >= 0
        kv = cache[ix.clamp(min=0)]
        if fp8:
            kv = dequant_fp8_tokens(torch, kv)
        s = torch.einsum("thd,tkd->thk", q[t0:t1], kv).float() * SM_SCALE
        s.masked_fill_(~valid[:, None, :], float("-inf"))
        l = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - l[..., None]).to(torch.bfloat16)
        out[t0:t1] = torch.einsum("thk,tkd->thd", p, kv[..., :DV])
        lse[t0:t1] = l


def dense_mla(torch, q, cache, block_table, q_len, kv_len, out, lse):
    """Per sequence: gather its pages, causal masked attention (queries are the last q_len)."""
    B = block_table.shape[0]
    H = q.shape[1]
    page = 64
    pos_k = torch.arange(kv_len, device=DEV)
    rows = max(1, min(q_len, CHUNK_BYTES // (H * kv_len * 8)))
    for b in range(B):
        slots = (block_table[b][:, None] * page + torch.arange(page, device=DEV)[None, :]).flatten()[:kv_len]
        kv = cache[slots]  # [kv_len, 576]
        for i0 in range(0, q_len, rows):
            i1 = min(q_len, i0 + rows)
            qq = q[b * q_len + i0:b * q_len + i1]  # [r, H, 576]
            s = torch.einsum("rhd,kd->rhk", qq, kv).float() * SM_SCALE
            limit = kv_len - q_len + torch.arange(i0, i1, device=DEV) + 1
            s.masked_fill_(pos_k[None, None, :] >= limit[:, None, None], float("-inf"))
            l = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - l[..., None]).to(torch.bfloat16)
            out[b * q_len + i0:b * q_len + i1] = torch.einsum("rhk,kd->rhd", p, kv[:, :DV])
            lse[b * q_len + i0:b * q_len + i1] = l


# ---- the same ops through the dsa Python module, and the agreement check ------------------------
# Each case's setup(dsa) returns (torch_run, dsa_run, agree): dsa_run(s) runs the op through dsa on
# the dsa-layout view of input set s (same random data, own output buffers), agree() runs both on
# set 0 once and compares. dsa_run is a string saying why when the op does not map (or dsa is None).
AGREE_TOL = 5e-2  # normalised error past which a mapping is certainly wrong (bf16 math is ~1e-2)


def max_err(torch, a, b):
    """max |a - b| over finite entries / max |b|; None when the non-finite entries differ."""
    a, b = a.float(), b.float()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb) or not torch.equal(a[~fa], b[~fb]):
        return None
    if not bool(fa.any()):
        return 0.0
    return float((a[fa] - b[fa]).abs().max() / b[fa].abs().max().clamp(min=1e-30))


def err_text(name, e):
    return f"{name} non-finite differ" if e is None else f"{name} {e:.1e}"


def agree_attention(torch, o_t, lse_t, o_d, lse_d):
    eo, el = max_err(torch, o_d, o_t), max_err(torch, lse_d, lse_t)
    ok = eo is not None and el is not None and eo <= AGREE_TOL and el <= AGREE_TOL
    return f"{err_text('out', eo)} {err_text('lse', el)}", ok


def paged_view(cache):
    # The flat [slots, token] cache of the torch side, seen as pages of 64 (same bytes, slot = row).
    return cache.view(cache.shape[0] // 64, 64, cache.shape[1])


# ---- cases (the same shapes and strings as tools/dsa/cmd_bench.cpp) ------------------------------
def cases(torch, quick, tiny=False):
    out = []

    def logits_case(M, N, H):
        def setup(dsa):
            sets = [(random_fp8(torch, (M, H, 128)), torch.randn(M, H, device=DEV), random_fp8(torch, (N, 128)),
                     pow2_scales(torch, N)) for _ in range(2)]
            ke = N - M + torch.arange(M, device=DEV) + 1
            res = torch.empty(M, N, device=DEV)
            run = lambda s: indexer_logits(torch, *sets[s], ke, res)
            if dsa is None:
                return run, "dsa not used", None
            ks32, ke32, res_d = torch.zeros(M, dtype=torch.int32, device=DEV), ke.int(), torch.empty(M, N, device=DEV)
            run_d = lambda s: dsa.indexer_logits(*sets[s], ks32, ke32, out=res_d)

            def agree():
                run(0)
                run_d(0)
                e = max_err(torch, res_d, res)
                return err_text("logits", e), e is not None and e <= AGREE_TOL
            return run, run_d, agree
        return ("indexer_logits", f"M={M} N={N} H={H}", setup)

    def topk_case(M, W, K):
        def setup(dsa):
            sets = [torch.randn(M, W, device=DEV) for _ in range(2)]
            run = lambda s: torch.topk(sets[s], K, dim=-1, sorted=False)
            if dsa is None:
                return run, "dsa not used", None
            lengths, idx_d = torch.full((M,), W, dtype=torch.int32, device=DEV), torch.empty(M, K, dtype=torch.int32,
                                                                                              device=DEV)
            run_d = lambda s: dsa.topk(sets[s], lengths, K, out=idx_d)

            def agree():
                idx_t = run(0).indices.sort(dim=-1).values
                run_d(0)
                differ = (idx_t != idx_d.long()).any(dim=-1)
                n = int(differ.sum())
                if n == 0:
                    return "sets equal", True
                # Different sets can still be right when the k-th value ties: compare the values.
                vt = sets[0].gather(1, idx_t).sort(dim=-1).values
                vd = sets[0].gather(1, idx_d.long().clamp(min=0)).sort(dim=-1).values
                same = torch.equal(vt, vd) and bool((idx_d >= 0).all())
                return f"sets differ in {n} rows ({'tied values equal' if same else 'VALUES DIFFER'})", same
            return run, run_d, agree
        return ("topk", f"M={M} W={W} k={K}", setup)

    def sparse_case(op, shape, seqs, ctx, rows_per_seq, H, K, fp8):
        def setup(dsa):
            T = seqs * rows_per_seq
            if fp8:
                c = torch.randn(seqs * ctx, 512, device=DEV) * (64.0 / 64.0)
                raw = torch.empty(seqs * ctx, FP8_TOKEN_BYTES, dtype=torch.uint8, device=DEV)
                raw[:, :512] = fp8_bits(torch, c * 64)
                raw[:, 512:528] = torch.full((seqs * ctx, 4), 1.0 / 64, device=DEV).view(torch.uint8)
                raw[:, 528:] = torch.randn(seqs * ctx, 64, device=DEV).to(torch.bfloat16).view(torch.uint8)
                cache = raw
            else:
                cache = torch.randn(seqs * ctx, D, device=DEV).to(torch.bfloat16)
            sets = []
            for _ in range(2):
                q = torch.randn(T, H, D, device=DEV).to(torch.bfloat16)
                t = torch.arange(T, device=DEV)
                L = ctx - rows_per_seq + (t % rows_per_seq) + 1
                j = torch.arange(K, device=DEV)
                pos = ((j[None, :] + torch.rand(T, K, device=DEV)) * L[:, None] / K).long()
                pos = torch.minimum(pos, L[:, None] - 1)
                idx = torch.where(j[None, :] < L[:, None], (t // rows_per_seq)[:, None] * ctx + pos, -1)
                sets.append((q, idx))
            o = torch.empty(T, H, DV, device=DEV, dtype=torch.bfloat16)
            lse = torch.empty(T, H, device=DEV)
            run = lambda s: sparse_mla(torch, sets[s][0], cache, fp8, sets[s][1], o, lse)
            if dsa is None:
                return run, "dsa not used", None
            # The torch cache rows are already SPEC 4 tokens (BF16 [576], or FP8 [512 e4m3][4 f32][64 bf16]):
            # seen as pages of 64, the indices (cache rows) are dsa's cache slots.
            kv = paged_view(cache)
            idx32 = [s[1].int() for s in sets]
            o_d, lse_d = torch.empty_like(o), torch.empty_like(lse)
            run_d = lambda s: dsa.sparse_mla(sets[s][0], kv, idx32[s], SM_SCALE, out=o_d, lse=lse_d)

            def agree():
                run(0)
                run_d(0)
                return agree_attention(torch, o, lse, o_d, lse_d)
            return run, run_d, agree
        return (op, shape, setup)

    def dense_case(op, shape, seqs, q_len, kv_len, H):
        def setup(dsa):
            pages = (kv_len + 63) // 64
            cache = torch.randn(seqs * pages * 64, D, device=DEV).to(torch.bfloat16)
            bt = torch.arange(seqs * pages, device=DEV).view(seqs, pages)
            sets = [torch.randn(seqs * q_len, H, D, device=DEV).to(torch.bfloat16) for _ in range(2)]
            o = torch.empty(seqs * q_len, H, DV, device=DEV, dtype=torch.bfloat16)
            lse = torch.empty(seqs * q_len, H, device=DEV)
            if q_len == 1:
                # Decode: all sequences at once (one query each), batched over B.
                slots = (bt[:, :, None] * 64 + torch.arange(64, device=DEV)).view(seqs, -1)[:, :kv_len]

                def run(s):
                    kv = cache[slots]  # [B, kv_len, 576]
                    sc = torch.einsum("bhd,bkd->bhk", sets[s], kv).float() * SM_SCALE
                    l = torch.logsumexp(sc, dim=-1)
                    p = torch.exp(sc - l[..., None]).to(torch.bfloat16)
                    o.copy_(torch.einsum("bhk,bkd->bhd", p, kv[..., :DV]))
                    lse.copy_(l)
            else:
                run = lambda s: dense_mla(torch, sets[s], cache, bt, q_len, kv_len, o, lse)
            if dsa is None:
                return run, "dsa not used", None
            kv = paged_view(cache)
            cu_q = (torch.arange(seqs + 1, device=DEV) * q_len).int()
            bt32, kv_lens = bt.int(), torch.full((seqs,), kv_len, dtype=torch.int32, device=DEV)
            o_d, lse_d = torch.empty_like(o), torch.empty_like(lse)
            run_d = lambda s: dsa.dense_mla(sets[s], kv, cu_q, None, SM_SCALE, block_table=bt32, kv_lens=kv_lens,
                                            out=o_d, lse=lse_d)

            def agree():
                run(0)
                run_d(0)
                return agree_attention(torch, o, lse, o_d, lse_d)
            return run, run_d, agree
        return (op, shape, setup)

    if tiny:  # --tiny: every code path at toy sizes (smoke test, e.g. on the CPU)
        return [logits_case(8, 256, 4), topk_case(4, 512, 64),
                sparse_case("sparse_mla_prefill", "T=8 H=2 K=64 ctx=256 kv=bf16", 1, 256, 8, 2, 64, False),
                sparse_case("sparse_mla_decode", "B=2 next_n=2 H=2 K=64 ctx=128 kv=fp8", 2, 128, 2, 2, 64, True),
                dense_case("dense_mla_decode", "B=2 next_n=1 ctx=100 H=2 kv=bf16", 2, 1, 100, 2),
                dense_case("dense_mla_prefill", "B=2 len=70 H=2 kv=bf16", 2, 70, 70, 2)]

    for N in ([32768] if quick else [32768, 65536, 131072]):
        for H in ([64] if quick else [32, 64]):
            out.append(logits_case(4096, N, H))
    out.append(topk_case(64, 65536, 2048))
    if not quick:
        out.append(topk_case(4096, 131072, 2048))
    for H in ([128] if quick else [64, 128]):
        out.append(sparse_case("sparse_mla_prefill", f"T=4096 H={H} K=2048 ctx=32768 kv=bf16", 1, 32768, 4096, H, 2048,
                               False))
    for H in ([128] if quick else [64, 128]):
        out.append(sparse_case("sparse_mla_decode", f"B=128 next_n=2 H={H} K=2048 ctx=8192 kv=fp8", 128, 8192, 2, H, 2048,
                               True))
    out.append(dense_case("dense_mla_decode", "B=128 next_n=1 ctx=2048 H=128 kv=bf16", 128, 1, 2048, 128))
    if not quick:
        out.append(dense_case("dense_mla_decode", "B=1 next_n=1 ctx=131072 H=128 kv=bf16", 1, 1, 131072, 128))
    out.append(dense_case("dense_mla_prefill", "B=4 len=2048 H=128 kv=bf16", 4, 2048, 2048, 128))
    return out


def load_dsa(a):
    """The dsa module when it can time these ops here, else (None, why)."""
    if a.no_dsa:
        return None, "--no-dsa"
    try:
        import dsa
    except ImportError as e:
        return None, f"import dsa failed ({e}); set PYTHONPATH=<build>/python of a -DDSA_BUILD_PYTHON=ON build"
    if DEV == "cuda" and not dsa.cuda_available():
        return None, f"dsa {dsa.version()} has no CUDA backend here (build with -DDSA_CUDA=ON)"
    return dsa, f"dsa {dsa.version()} from {dsa.__file__}"


def main():
    global DEV
    a = parse_args()
    DEV = a.device
    try:
        import torch
    except ImportError:
        print("torch_baseline: PyTorch is not installed", file=sys.stderr)
        return 2
    if DEV == "cuda" and not torch.cuda.is_available():
        print("torch_baseline: no CUDA device found (the baseline needs a GPU; --device cpu --tiny is a smoke test)",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"
    dsa, dsa_note = load_dsa(a)
    results = []
    ok = True
    print(f"torch baseline on {name}, torch {torch.__version__}; {dsa_note}")
    head = f"{'op':<20} {'shape':<46} {'ms':>10} {'min ms':>10}"
    print(head + (f" {'dsa ms':>10} {'speed-up':>9}  agree (dsa vs torch, set 0)" if dsa else ""))
    with torch.no_grad():
        for op, shape, setup in cases(torch, a.quick, a.tiny):
            if op not in a.ops:
                continue
            rec = {"op": op, "shape": shape}
            line = f"{op:<20} {shape:<46}"
            run = run_d = agree = None
            try:
                run, run_d, agree = setup(dsa)
                ms, ms_min = time_op(torch, run, 2, a.warmup, a.iters)
                rec.update({"ok": True, "ms": ms, "ms_min": ms_min})
                line += f" {ms:>10.4f} {ms_min:>10.4f}"
            except Exception as e:  # an out-of-memory shape is reported, the rest still run
                ok = False
                rec.update({"ok": False, "error": str(e)[:300]})
                line += f" FAILED: {str(e)[:120]}"
            if dsa is not None and run_d is not None:
                if isinstance(run_d, str):  # an op that does not map onto dsa: said, not faked
                    rec.update({"dsa_ok": False, "dsa_error": run_d})
                    line += f"  dsa: not mapped: {run_d}"
                else:
                    try:
                        dms, dms_min = time_op(torch, run_d, 2, a.warmup, a.iters)
                        rec.update({"dsa_ok": True, "dsa_ms": dms, "dsa_ms_min": dms_min})
                        line += f" {dms:>10.4f}"
                        if rec["ok"]:
                            rec["speedup"] = ms / dms if dms > 0 else None
                            line += f" {rec['speedup']:>9.2f}" if rec["speedup"] else f" {'-':>9}"
                            try:
                                rec["agree"], rec["agree_ok"] = agree()
                            except Exception as e:  # e.g. out of memory for the comparison's temporaries
                                rec["agree"], rec["agree_ok"] = f"check failed: {str(e)[:100]}", False
                            line += f"  {rec['agree']}" + ("" if rec["agree_ok"] else "  <-- DISAGREE")
                            ok = ok and rec["agree_ok"]
                    except Exception as e:
                        ok = False
                        rec.update({"dsa_ok": False, "dsa_error": str(e)[:300]})
                        line += f"  dsa FAILED: {str(e)[:120]}"
            results.append(rec)
            print(line, flush=True)
            run = run_d = agree = None
            if DEV == "cuda":
                torch.cuda.empty_cache()
    if a.json:
        doc = {"tool": "torch_baseline", "torch": torch.__version__, "device": name,
               "dsa": dsa.version() if dsa else None, "dsa_note": dsa_note,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "results": results}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
