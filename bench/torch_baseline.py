#!/usr/bin/env python3
"""Plain-PyTorch baseline for `dsa bench`: the same ops at the same shapes (same op and shape
strings, so the two JSON files join on them), timed the same way (CUDA events around each
run, warm-up first, median of the timed runs, inputs rotated between sets of fresh random data).

The implementations are what an engine without DSA's kernels would write: dequantise and use
dense matmuls (chunked so temporaries stay in a few GiB), torch.topk, gather + einsum + softmax
for sparse attention, masked math for dense attention.

    python3 bench/torch_baseline.py [--quick] [--op NAME[,NAME]] [--json PATH] [--iters N] [--warmup N]
"""
import argparse
import datetime
import json
import statistics
import sys

OPS = ["indexer_logits", "topk", "sparse_mla_prefill", "sparse_mla_decode", "dense_mla_decode", "dense_mla_prefill"]
D, DV, SM_SCALE = 576, 512, 0.13523
FP8_TOKEN_BYTES = 656
CHUNK_BYTES = 2 << 30  # budget for the largest temporary of a chunked op


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes and runs")
    ap.add_argument("--op", default="", help="comma-separated ops: " + ", ".join(OPS))
    ap.add_argument("--json", default="", help="write results as JSON to this path")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
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
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn((warmup + i) % sets)
        stops[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
    return statistics.median(ms), ms[0]


def random_fp8(torch, shape):
    # Random finite e4m3 values over the format's range (no NaN bytes), like the dsa bench pools.
    return (torch.randn(shape, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)


def pow2_scales(torch, n):
    return torch.pow(2.0, -4.0 - torch.randint(0, 6, (n,), device="cuda").float())


# ---- the ops ------------------------------------------------------------------------------------
def indexer_logits(torch, q8, w, k8, k_scale, ke, out):
    """logits[i, j] = sum_h w[i,h] relu(q[i,h] . k[j]) k_scale[j] for j < ke[i], else -inf."""
    M, H, _ = q8.shape
    N = k8.shape[0]
    kb = k8.to(torch.bfloat16)  # e4m3 -> bf16 is exact
    rows = max(1, CHUNK_BYTES // (H * N * 2))
    cols = torch.arange(N, device="cuda")
    for r0 in range(0, M, rows):
        r1 = min(M, r0 + rows)
        s = torch.matmul(q8[r0:r1].to(torch.bfloat16), kb.t())  # [r, H, N]
        s.relu_()
        lg = torch.einsum("rhn,rh->rn", s, w[r0:r1].to(torch.bfloat16)).float() * k_scale
        lg.masked_fill_(cols[None, :] >= ke[r0:r1, None], float("-inf"))
        out[r0:r1] = lg


def dequant_fp8_tokens(torch, raw):
    """[..., 656] uint8 FP8 MLA tokens -> [..., 576] bf16 (e4m3 * per-128 scale | bf16 k_pe)."""
    lead = raw.shape[:-1]
    c = raw[..., :512].contiguous().view(torch.float8_e4m3fn).float().view(*lead, 4, 128)
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
    pos_k = torch.arange(kv_len, device="cuda")
    rows = max(1, min(q_len, CHUNK_BYTES // (H * kv_len * 8)))
    for b in range(B):
        slots = (block_table[b][:, None] * page + torch.arange(page, device="cuda")[None, :]).flatten()[:kv_len]
        kv = cache[slots]  # [kv_len, 576]
        for i0 in range(0, q_len, rows):
            i1 = min(q_len, i0 + rows)
            qq = q[b * q_len + i0:b * q_len + i1]  # [r, H, 576]
            s = torch.einsum("rhd,kd->rhk", qq, kv).float() * SM_SCALE
            limit = kv_len - q_len + torch.arange(i0, i1, device="cuda") + 1
            s.masked_fill_(pos_k[None, None, :] >= limit[:, None, None], float("-inf"))
            l = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - l[..., None]).to(torch.bfloat16)
            out[b * q_len + i0:b * q_len + i1] = torch.einsum("rhk,kd->rhd", p, kv[:, :DV])
            lse[b * q_len + i0:b * q_len + i1] = l


# ---- cases (the same shapes and strings as tools/dsa/cmd_bench.cpp) ------------------------------
def cases(torch, quick):
    out = []

    def logits_case(M, N, H):
        def setup():
            sets = [(random_fp8(torch, (M, H, 128)), torch.randn(M, H, device="cuda"), random_fp8(torch, (N, 128)),
                     pow2_scales(torch, N)) for _ in range(2)]
            ke = N - M + torch.arange(M, device="cuda") + 1
            res = torch.empty(M, N, device="cuda")
            return lambda s: indexer_logits(torch, *sets[s], ke, res)
        return ("indexer_logits", f"M={M} N={N} H={H}", setup)

    for N in ([32768] if quick else [32768, 65536, 131072]):
        for H in ([64] if quick else [32, 64]):
            out.append(logits_case(4096, N, H))

    def topk_case(M, W, K):
        def setup():
            sets = [torch.randn(M, W, device="cuda") for _ in range(2)]
            return lambda s: torch.topk(sets[s], K, dim=-1, sorted=False)
        return ("topk", f"M={M} W={W} k={K}", setup)

    out.append(topk_case(64, 65536, 2048))
    if not quick:
        out.append(topk_case(4096, 131072, 2048))

    def sparse_case(op, shape, seqs, ctx, rows_per_seq, H, K, fp8):
        def setup():
            T = seqs * rows_per_seq
            if fp8:
                c = torch.randn(seqs * ctx, 512, device="cuda") * (64.0 / 64.0)
                raw = torch.empty(seqs * ctx, FP8_TOKEN_BYTES, dtype=torch.uint8, device="cuda")
                raw[:, :512] = (c * 64).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
                raw[:, 512:528] = torch.full((seqs * ctx, 4), 1.0 / 64, device="cuda").view(torch.uint8)
                raw[:, 528:] = torch.randn(seqs * ctx, 64, device="cuda").to(torch.bfloat16).view(torch.uint8)
                cache = raw
            else:
                cache = torch.randn(seqs * ctx, D, device="cuda").to(torch.bfloat16)
            sets = []
            for _ in range(2):
                q = torch.randn(T, H, D, device="cuda").to(torch.bfloat16)
                t = torch.arange(T, device="cuda")
                L = ctx - rows_per_seq + (t % rows_per_seq) + 1
                j = torch.arange(K, device="cuda")
                pos = ((j[None, :] + torch.rand(T, K, device="cuda")) * L[:, None] / K).long()
                pos = torch.minimum(pos, L[:, None] - 1)
                idx = torch.where(j[None, :] < L[:, None], (t // rows_per_seq)[:, None] * ctx + pos, -1)
                sets.append((q, idx))
            o = torch.empty(T, H, DV, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(T, H, device="cuda")
            return lambda s: sparse_mla(torch, sets[s][0], cache, fp8, sets[s][1], o, lse)
        return (op, shape, setup)

    for H in ([128] if quick else [64, 128]):
        out.append(sparse_case("sparse_mla_prefill", f"T=4096 H={H} K=2048 ctx=32768 kv=bf16", 1, 32768, 4096, H, 2048,
                               False))
    for H in ([128] if quick else [64, 128]):
        out.append(sparse_case("sparse_mla_decode", f"B=128 next_n=2 H={H} K=2048 ctx=8192 kv=fp8", 128, 8192, 2, H, 2048,
                               True))

    def dense_case(op, shape, seqs, q_len, kv_len, H):
        def setup():
            pages = (kv_len + 63) // 64
            cache = torch.randn(seqs * pages * 64, D, device="cuda").to(torch.bfloat16)
            bt = torch.arange(seqs * pages, device="cuda").view(seqs, pages)
            sets = [torch.randn(seqs * q_len, H, D, device="cuda").to(torch.bfloat16) for _ in range(2)]
            o = torch.empty(seqs * q_len, H, DV, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(seqs * q_len, H, device="cuda")
            if q_len == 1:
                # Decode: all sequences at once (one query each), batched over B.
                slots = (bt[:, :, None] * 64 + torch.arange(64, device="cuda")).view(seqs, -1)[:, :kv_len]

                def run(s):
                    kv = cache[slots]  # [B, kv_len, 576]
                    sc = torch.einsum("bhd,bkd->bhk", sets[s], kv).float() * SM_SCALE
                    l = torch.logsumexp(sc, dim=-1)
                    p = torch.exp(sc - l[..., None]).to(torch.bfloat16)
                    o.copy_(torch.einsum("bhk,bkd->bhd", p, kv[..., :DV]))
                    lse.copy_(l)
                return run
            return lambda s: dense_mla(torch, sets[s], cache, bt, q_len, kv_len, o, lse)
        return (op, shape, setup)

    out.append(dense_case("dense_mla_decode", "B=128 next_n=1 ctx=2048 H=128 kv=bf16", 128, 1, 2048, 128))
    if not quick:
        out.append(dense_case("dense_mla_decode", "B=1 next_n=1 ctx=131072 H=128 kv=bf16", 1, 1, 131072, 128))
    out.append(dense_case("dense_mla_prefill", "B=4 len=2048 H=128 kv=bf16", 4, 2048, 2048, 128))
    return out


def main():
    a = parse_args()
    try:
        import torch
    except ImportError:
        print("torch_baseline: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_baseline: no CUDA device found (the baseline needs a GPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0)
    results = []
    ok = True
    print(f"torch baseline on {name}, torch {torch.__version__}")
    print(f"{'op':<20} {'shape':<46} {'ms':>10} {'min ms':>10}")
    with torch.no_grad():
        for op, shape, setup in cases(torch, a.quick):
            if op not in a.ops:
                continue
            try:
                fn = setup()
                ms, ms_min = time_op(torch, fn, 2, a.warmup, a.iters)
                results.append({"op": op, "shape": shape, "ok": True, "ms": ms, "ms_min": ms_min})
                print(f"{op:<20} {shape:<46} {ms:>10.4f} {ms_min:>10.4f}", flush=True)
            except Exception as e:  # an out-of-memory shape is reported, the rest still run
                ok = False
                results.append({"op": op, "shape": shape, "ok": False, "error": str(e)[:300]})
                print(f"{op:<20} {shape:<46} FAILED: {str(e)[:120]}", flush=True)
            fn = None
            torch.cuda.empty_cache()
    if a.json:
        doc = {"tool": "torch_baseline", "torch": torch.__version__, "device": name,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "results": results}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
