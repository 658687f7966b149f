#!/usr/bin/env python3
"""Figures of the layer benchmarks (docs/perf.md), with matplotlib (Debian: python3-matplotlib).

  python3 bench/plot.py prefill BENCH.json [--anchors ANCHORS.json] [--out layer_prefill.png]
      (a) one layer's prefill time against context: every step of `dsa bench --op layer_prefill`
      stacked per stage (GPU ms when the step measured them, else the host enqueue split scaled
      to the step's GPU time, marked so), the step's GPU time, its floor, and the composed
      anchor (DeepGEMM logits + torch.topk + FlashMLA) as its mean per step over the same S.
  python3 bench/plot.py memory [--dsa build/tools/dsa] [--preset glm-5] [--step 8192]
                               [--budget 512MiB] [--out score_memory.png]
      (b) score memory against context for one prefill step of `step` rows: the unbounded
      [M, N] FP32 score matrix, the engines' chunked bound (the budget, plus the top-k
      temporaries they leave uncounted; assumptions below) and DSA's plan (`dsa plan --json`:
      workspace_bytes and its score region, at each context). Runs on the CPU.

Engines' chunked bound, as assumed here (the composed anchor's loop): rows per chunk
r = budget // (4 (N + 256)); the chunk's logits r N 4 bytes; torch.topk(k = 2048) returns
values f32 + indices i64 ([r, k], 12 B per entry), its sort/select scratch is assumed to be one
more values + indices pair (12 B), and the -1 masking (isfinite bool, full_like i64, where i64,
.int() i32) adds 21 B: 45 B per [r, k] entry on top of the logits.
"""
import argparse
import json
import subprocess
import sys

STAGES = ("cache", "prepare", "score", "select", "map", "sparse", "dense")
COLORS = ("#9e9e9e", "#bcaaa4", "#1f77b4", "#ff7f0e", "#8c564b", "#2ca02c", "#d62728")
TOPK_BYTES_PER_ENTRY = 4 + 8 + 12 + 21


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def layer_rows(bench):
    """The layer_prefill rows of a `dsa bench --json` file that ran, with their steps."""
    out = []
    for r in bench.get("results", []):
        if r.get("op") == "layer_prefill" and r.get("ok") and r.get("steps"):
            out.append(r)
    return out


def anchor_for(anchors, shape):
    if not anchors:
        return None
    for r in anchors.get("results", []):
        if r.get("op") == "layer_prefill" and r.get("shape") == shape and "ms" in r:
            return r
    return None


def plot_prefill(bench, anchors, out):
    rows = layer_rows(bench)
    if not rows:
        raise SystemExit("plot prefill: no layer_prefill result with steps in the bench JSON")
    plt = _plt()
    fig, axes = plt.subplots(1, len(rows), figsize=(7.5 * len(rows), 5.2), squeeze=False)
    for ax, r in zip(axes[0], rows):
        steps = r["steps"]
        ctx = [s["ctx"] for s in steps]
        width = 0.8 * (ctx[1] - ctx[0] if len(ctx) > 1 else ctx[0])
        gpu = bool(r.get("gpu_timed"))
        bottom = [0.0] * len(steps)
        for name, color in zip(STAGES, COLORS):
            vals = []
            for s in steps:
                st = s["stages"]
                v = st.get(name, 0.0)
                if not gpu:  # host split, scaled to the step's GPU time (shares only)
                    tot = sum(st.get(n, 0.0) for n in STAGES)
                    v = s["ms"] * v / tot if tot > 0 else 0.0
                vals.append(v)
            ax.bar(ctx, vals, width=width, bottom=bottom, color=color, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        cpu = bench.get("backend") == "cpu"
        ax.plot(ctx, [s["ms"] for s in steps], "k.-", label="DSA step (host time, CPU)" if cpu else "DSA step (GPU events)")
        ax.plot(ctx, [s["floor_ms"] for s in steps], "k--", label="floor of the step")
        a = anchor_for(anchors, r["shape"])
        title = f"{r['shape']}\nDSA {r['ms']:.1f} ms"
        if a:
            mean = a["ms"] / len(steps)
            ax.axhline(mean, color="m", lw=1.5, label=f"composed anchor, mean per step ({a['impl']})")
            title += f", anchor {a['ms']:.1f} ms"
        title += f", floor {r.get('floor_ms', 0):.1f} ms"
        if cpu:
            title += "\n(CPU backend: stage split from the host stage times)"
        elif not gpu:
            title += "\n(stage split: host enqueue shares; GPU stage times not measured)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("context after the step (tokens)")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7, loc="upper left")
    dev = bench.get("device", "")
    fig.suptitle(f"one layer prefill, per step of {steps[0]['rows']} tokens — {dev} {bench.get('date', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def parse_size(text):
    units = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    t = text.strip().lower()
    for u in ("kib", "mib", "gib", "b"):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def dsa_plan(dsa, preset, step, ctx, budget):
    cmd = [dsa, "plan", "--json", "--device", "cpu", "--preset", preset, "--max-tokens", str(step),
           "--max-seqs", "1", "--max-context", str(ctx), "--score-budget", str(budget)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def memory_series(dsa, preset, step, budget, contexts, topk=2048):
    rows = []
    for n in contexts:
        p = dsa_plan(dsa, preset, step, n, budget)
        m = step
        unbounded = m * n * 4
        r = max(1, min(m, budget // (4 * (n + 256))))
        engine = r * n * 4 + r * min(topk, n) * TOPK_BYTES_PER_ENTRY
        rows.append(dict(ctx=n, unbounded=unbounded, engine=engine, engine_rows=r,
                         dsa_workspace=p["workspace_bytes"], dsa_score_region=p["score_region_bytes"]))
    return rows


def plot_memory(rows, preset, step, budget, out):
    plt = _plt()
    gib = float(1 << 30)
    x = [r["ctx"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.plot(x, [r["unbounded"] / gib for r in rows], "r.-", label=f"unbounded [M={step}, N] FP32 scores")
    ax.plot(x, [r["engine"] / gib for r in rows], "m.-",
            label="engines' chunks: budget + uncounted top-k temporaries (assumed 45 B per [rows, k])")
    ax.plot(x, [r["dsa_workspace"] / gib for r in rows], "g.-", label="DSA plan: whole workspace (dsa plan)")
    ax.plot(x, [r["dsa_score_region"] / gib for r in rows], "g:", label="DSA plan: its score region (all scoring temporaries)")
    ax.axhline(budget / gib, color="k", lw=0.8, ls="--", label=f"score budget {budget >> 20} MiB")
    ax.set_yscale("log")
    ax.set_xlabel("context N (tokens)")
    ax.set_ylabel("GiB")
    ax.set_title(f"score memory of one {preset} prefill step of {step} rows", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("prefill")
    a.add_argument("bench")
    a.add_argument("--anchors")
    a.add_argument("--out", default="layer_prefill.png")
    b = sub.add_parser("memory")
    b.add_argument("--dsa", default="build/tools/dsa")
    b.add_argument("--preset", default="glm-5")
    b.add_argument("--step", type=int, default=8192)
    b.add_argument("--budget", default="512MiB")
    b.add_argument("--max-context", type=int, default=131072)
    b.add_argument("--json", help="also write the series as JSON here")
    b.add_argument("--out", default="score_memory.png")
    o = ap.parse_args(argv)
    if o.what == "prefill":
        bench = json.load(open(o.bench))
        anchors = json.load(open(o.anchors)) if o.anchors else None
        plot_prefill(bench, anchors, o.out)
    else:
        budget = parse_size(o.budget)
        contexts = list(range(o.step, o.max_context + 1, o.step))
        rows = memory_series(o.dsa, o.preset, o.step, budget, contexts)
        if o.json:
            json.dump(rows, open(o.json, "w"), indent=1)
        plot_memory(rows, o.preset, o.step, budget, o.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
