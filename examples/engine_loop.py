#!/usr/bin/env python3
"""An engine loop over dsa.Planner / dsa.Attention (docs/engine-integration.md).

Serves a few requests through chunked prefill and decode over two main layers (a full layer and
a shared layer reusing its indices) and an MTP layer, with one Attention object and so one
workspace for every layer: prepare() once per model step, run() once per layer. Prefill steps
are host-planned (q_lens, kv_lens in host memory); decode steps use the graph-stable form
(next_n=1, q_lens=None, kv_lens on the plan's device). Random tensors stand in for the model.

On the CPU (numpy) it checks that every decode step in the graph-stable form equals the
host-planned step that scores everything. With torch and a GPU (--cuda, or DSA_EXAMPLE_CUDA=1)
it also captures one decode step in a CUDA graph below topk and replays it while the contexts
grow past topk, checking every replay against an eager step bit for bit.

    PYTHONPATH=build/python python3 examples/engine_loop.py [--cuda]
"""
import argparse
import os
import sys

import numpy as np

import dsa

GEOM = dict(name="deepseek-v3.2", num_heads=2, index_heads=2, topk=64)
PAGE, MAX_CONTEXT, MAX_SEQS, CHUNK = 16, 256, 4, 48
LAYERS = ("full", "shared", "mtp")  # the MTP layer owns an indexer cache, like a full layer


def cos_sin_table(n):
    p = np.arange(n, dtype=np.float64)[:, None]
    a = p * np.power(10000.0, -np.arange(32) / 32.0)[None, :]
    return np.concatenate([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


class Engine:
    """The state an engine keeps: page allocator, per-layer caches, per-request lengths."""

    def __init__(self, plan, num_blocks, xp=np, device=None):
        self.plan, self.xp, self.device = plan, xp, device
        self.attn = dsa.Attention(plan)  # one object: one workspace for every layer
        self.free = list(range(num_blocks))[::-1]
        self.pages = {}  # request -> its pages
        self.cached = {}  # request -> tokens in the cache
        self.mla = [self._zeros((num_blocks, PAGE, 1152), "uint8") for _ in LAYERS]
        self.idx = [self._zeros((num_blocks, PAGE, 132), "uint8") if r != "shared" else None for r in LAYERS]
        self.cos_sin = self._to(cos_sin_table(MAX_CONTEXT))
        self.rng = np.random.default_rng(7)

    def _zeros(self, shape, dtype):
        if self.xp is np:
            return np.zeros(shape, dtype)
        return self.xp.zeros(shape, dtype=getattr(self.xp, dtype), device=self.device)

    def _to(self, a):
        return a if self.xp is np else self.xp.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def block_table(self, reqs):
        mb = MAX_CONTEXT // PAGE
        t = np.full((len(reqs), mb), -1, np.int32)
        for i, r in enumerate(reqs):
            t[i, :len(self.pages[r])] = self.pages[r]
        return t

    def grow(self, r, n):
        need = -(-(self.cached.get(r, 0) + n) // PAGE)
        pages = self.pages.setdefault(r, [])
        while len(pages) < need:
            pages.append(self.free.pop())

    def inputs(self, T):
        f = lambda *s: self._to(self.rng.standard_normal(s).astype(np.float32))  # noqa: E731
        H, Hi = GEOM["num_heads"], GEOM["index_heads"]
        xs = [dict(q=f(T, H, 576), kv_c=f(T, 512), k_pe=f(T, 64), index_q=f(T, Hi, 128), index_k=f(T, 128),
                   index_w=f(T, Hi)) for _ in LAYERS]
        if self.xp is not np:  # CUDA takes bf16 queries
            for x in xs:
                x["q"] = x["q"].to(self.xp.bfloat16)
        return xs

    def model_step(self, q_lens, kv_lens, table, layer_inputs, next_n=None, force_score=False, caches=None,
                   outs=None, stream=None):
        """prepare once, run every layer; returns each layer's (out, lse) and the full layer's indices."""
        mla, idx = caches if caches else (self.mla, self.idx)
        self.attn.prepare(q_lens, kv_lens, table, next_n=next_n, stream=stream)
        T = layer_inputs[0]["q"].shape[0]
        indices = self._zeros((T, GEOM["topk"]), "int32")
        results = []
        for li, role in enumerate(LAYERS):
            x = layer_inputs[li]
            kw = dict(role=role, next_n=next_n, sm_scale=0.1, stream=stream)
            if outs:
                kw.update(out=outs[li][0], lse=outs[li][1])
            if role == "shared":
                kw.update(indices_in=indices)
            else:
                kw.update(index_q=x["index_q"], index_k=x["index_k"], index_w=x["index_w"], cos_sin=self.cos_sin,
                          index_cache=idx[li], force_score=force_score and role == "full")
                if role == "full":
                    kw.update(indices_out=indices)
            out, lse, _ = self.attn.run(x["q"], x["kv_c"], x["k_pe"], q_lens, kv_lens, table, mla[li], **kw)
            results.append((out, lse))
        return results, indices


def serve_cpu():
    plan = dsa.plan(GEOM, page_size=PAGE, max_tokens_per_step=CHUNK * MAX_SEQS, max_seqs_per_step=MAX_SEQS,
                    max_context=MAX_CONTEXT, max_next_n=1)
    eng = Engine(plan, num_blocks=MAX_SEQS * (MAX_CONTEXT // PAGE))
    prompts = {0: 100, 1: 40, 2: 70}
    # Chunked prefill: each step takes up to CHUNK new tokens of every unfinished prompt.
    steps = 0
    while any(eng.cached.get(r, 0) < n for r, n in prompts.items()):
        reqs = [r for r, n in prompts.items() if eng.cached.get(r, 0) < n]
        q = [min(CHUNK, prompts[r] - eng.cached.get(r, 0)) for r in reqs]
        for r, n in zip(reqs, q):
            eng.grow(r, n)
        kv = [eng.cached.get(r, 0) + n for r, n in zip(reqs, q)]
        eng.model_step(np.array(q, np.int32), np.array(kv, np.int32), eng.block_table(reqs), eng.inputs(sum(q)))
        for r, n in zip(reqs, q):
            eng.cached[r] = eng.cached.get(r, 0) + n
        steps += 1
    print("prefill: %d chunked steps, contexts %s" % (steps, [eng.cached[r] for r in prompts]))
    # Decode: one token per request per step, in the graph-stable form, checked against the
    # host-planned form (a copy of the caches) that scores everything.
    reqs = sorted(prompts)
    for step in range(30):
        for r in reqs:
            eng.grow(r, 1)
        kv = np.array([eng.cached[r] + 1 for r in reqs], np.int32)
        table = eng.block_table(reqs)
        x = eng.inputs(len(reqs))
        ref_caches = ([m.copy() for m in eng.mla], [c.copy() if c is not None else None for c in eng.idx])
        ref, ref_ind = eng.model_step(np.ones(len(reqs), np.int32), kv, table, x, force_score=True,
                                      caches=ref_caches)
        got, ind = eng.model_step(None, kv, table, x, next_n=1)
        # The full layer scores every row in both forms: equal bit for bit. The shared and MTP
        # layers attend short contexts densely in the host-planned form and sparsely over the
        # identity selection here: equal to rounding.
        assert np.array_equal(got[0][0], ref[0][0]) and np.array_equal(got[0][1], ref[0][1]), "step %d" % step
        assert np.array_equal(ind, ref_ind)
        for (o, l), (ro, rl) in zip(got[1:], ref[1:]):
            assert np.allclose(o, ro, rtol=1e-5, atol=1e-5) and np.allclose(l, rl, rtol=1e-5, atol=1e-5), step
        assert all(np.array_equal(a, b) for a, b in zip(eng.mla, ref_caches[0]))
        for r in reqs:
            eng.cached[r] += 1
    print("decode: 30 graph-stable steps equal the host-planned ones; contexts %s" % [eng.cached[r] for r in reqs])


def serve_cuda():
    import torch
    dev = torch.device("cuda")
    B = 3
    ctx = [10, 30, 52]  # every context below topk = 64 at capture
    # One plan serves the prompts' prefill step (sum(ctx) tokens) and the decode graph (B rows).
    plan = dsa.plan(GEOM, page_size=PAGE, max_tokens_per_step=sum(ctx), max_seqs_per_step=B,
                    max_context=MAX_CONTEXT, max_next_n=1, device="cuda")
    lanes = [Engine(plan, B * (MAX_CONTEXT // PAGE), xp=torch, device=dev) for _ in range(2)]  # graph | eager
    for eng in lanes:  # the prompts, one host-planned prefill step
        for r, n in enumerate(ctx):
            eng.grow(r, n)
        eng.rng = np.random.default_rng(11)
        table = torch.from_numpy(eng.block_table(range(B))).to(dev)
        eng.model_step(np.array(ctx, np.int32), np.array(ctx, np.int32), table, eng.inputs(sum(ctx)))
        for r, n in enumerate(ctx):
            eng.cached[r] = n
    torch.cuda.synchronize()
    g_eng, e_eng = lanes
    # Static buffers the graph reads; the engine rewrites them in place before each replay.
    kv_dev = torch.zeros(B, dtype=torch.int32, device=dev)
    table_dev = torch.zeros((B, MAX_CONTEXT // PAGE), dtype=torch.int32, device=dev)
    static_x = g_eng.inputs(B)
    # bf16 out like the eager lane's (bf16 queries), f32 lse.
    outs = [(torch.empty((B, 2, 512), dtype=torch.bfloat16, device=dev), torch.empty((B, 2), dtype=torch.float32,
                                                                                      device=dev)) for _ in LAYERS]

    def refresh(eng, step_rng):
        for r in range(B):
            eng.grow(r, 1)
        kv_dev.copy_(torch.tensor([eng.cached[r] + 1 for r in range(B)], dtype=torch.int32))
        table_dev.copy_(torch.from_numpy(eng.block_table(range(B))))
        fresh = [{k: torch.from_numpy(step_rng.standard_normal(tuple(v.shape)).astype(np.float32)) for k, v in x.items()}
                 for x in static_x]
        for x, f in zip(static_x, fresh):
            for k in x:
                x[k].copy_(f[k])
        return fresh

    rng_g, rng_e = np.random.default_rng(5), np.random.default_rng(5)
    refresh(g_eng, rng_g)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g_eng.model_step(None, kv_dev, table_dev, static_x, next_n=1, outs=outs)  # warm-up, eager
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=s):
            g_eng.model_step(None, kv_dev, table_dev, static_x, next_n=1, outs=outs)
    torch.cuda.synchronize()
    # The warm-up wrote step 0's tokens; replay it so both lanes start from the same step.
    e_kv = torch.zeros_like(kv_dev)
    e_table = torch.zeros_like(table_dev)
    for step in range(80):
        if step > 0:
            for r in range(B):
                g_eng.cached[r] += 1
            refresh(g_eng, rng_g)
        graph.replay()
        for r in range(B):
            e_eng.grow(r, 1)
        e_kv.copy_(torch.tensor([e_eng.cached[r] + 1 for r in range(B)], dtype=torch.int32))
        e_table.copy_(torch.from_numpy(e_eng.block_table(range(B))))
        fresh = [{k: torch.from_numpy(rng_e.standard_normal(tuple(v.shape)).astype(np.float32)).to(dev, v.dtype)
                  for k, v in x.items()} for x in static_x]
        got, _ = e_eng.model_step(None, e_kv, e_table, fresh, next_n=1)
        torch.cuda.synchronize()
        for (o, l), (ro, rl) in zip(outs, got):
            assert torch.equal(o, ro) and torch.equal(l, rl), "replay %d differs from the eager step" % step
        for r in range(B):
            e_eng.cached[r] += 1
    print("cuda: one decode graph replayed 80 steps, contexts %s (past topk %d), equal to eager steps"
          % ([g_eng.cached[r] + 1 for r in range(B)], GEOM["topk"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", action="store_true", help="also capture and replay a decode graph (torch + GPU)")
    a = ap.parse_args()
    serve_cpu()
    if a.cuda or os.environ.get("DSA_EXAMPLE_CUDA") == "1":
        try:
            import torch
        except ImportError:
            print("cuda: skipped (no torch)")
            return 0
        if not torch.cuda.is_available():
            print("cuda: skipped (no GPU)")
            return 0
        serve_cuda()
    return 0


if __name__ == "__main__":
    sys.exit(main())
