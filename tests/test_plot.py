#!/usr/bin/env python3
"""CPU test of bench/plot.py: the score-memory series from the real planner (`dsa plan`), and both
figures drawn. The prefill figure is drawn from a real CPU run of `dsa bench --backend cpu --op
layer_prefill` at a tiny size, and from a JSON in the same schema with GPU-timed stages whose
numbers are test inputs, not measurements (the GPU branch of the figure).
    python3 tests/test_plot.py path/to/dsa        (exit 77: matplotlib absent, a skip)"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

try:
    import matplotlib  # noqa: F401
except ImportError:
    print("matplotlib not installed: skipped")
    sys.exit(77)

import plot  # noqa: E402

STAGES = plot.STAGES


def fixture(gpu_timed):
    steps = []
    for i in range(4):
        st = {n: 0.1 * (j + 1) * (i + 1) for j, n in enumerate(STAGES)}
        st["total"] = sum(st.values())
        st["source"] = "gpu" if gpu_timed else "host"
        steps.append(dict(ctx=4096 * (i + 1), rows=4096, ms=st["total"] * 1.1, flops=1e12, flops_fp8=5e11,
                          floor_ms=st["total"] * 0.3, stages=st))
    tot = {n: sum(s["stages"][n] for s in steps) for n in STAGES}
    row = dict(op="layer_prefill", shape="glm-5 S=16384 step=4096 budget=512MiB", kernel="", ok=True,
               ms=sum(s["ms"] for s in steps), floor_ms=sum(s["floor_ms"] for s in steps), gpu_timed=gpu_timed,
               stages=tot, steps=steps)
    return dict(tool="dsa bench", device="test fixture", date="", results=[row, dict(op="topk", shape="x", ok=True, ms=1.0)])


def main():
    dsa = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for gpu in (True, False):
            out = os.path.join(d, f"prefill_{gpu}.png")
            anchors = dict(results=[dict(op="layer_prefill", shape="glm-5 S=16384 step=4096 budget=512MiB",
                                         impl="fixture", ms=3.0)])
            plot.plot_prefill(fixture(gpu), anchors if gpu else None, out)
            with open(out, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    failures.append(f"prefill figure {out} is not a PNG")
        # A real run on the CPU: 4 steps of 64 tokens (dense route: within topk).
        cpu_json = os.path.join(d, "cpu_bench.json")
        subprocess.run([dsa, "bench", "--backend", "cpu", "--op", "layer_prefill", "--preset", "glm-5",
                        "--prefill", "256,64", "--warmup", "0", "--json", cpu_json], check=True,
                       stdout=subprocess.DEVNULL)
        bench = json.load(open(cpu_json))
        rows = plot.layer_rows(bench)
        if len(rows) != 1 or [s["ctx"] for s in rows[0]["steps"]] != [64, 128, 192, 256]:
            failures.append("CPU layer_prefill JSON: unexpected rows/steps")
        elif abs(sum(s["ms"] for s in rows[0]["steps"]) - rows[0]["ms"]) > 1e-3 * rows[0]["ms"] + 1e-6:
            failures.append("CPU layer_prefill: ms is not the sum of the steps")
        out = os.path.join(d, "prefill_cpu.png")
        plot.plot_prefill(bench, None, out)
        if not os.path.getsize(out):
            failures.append("empty prefill figure from the CPU run")
        if plot.layer_rows(dict(results=[dict(op="layer_prefill", ok=False)])):
            failures.append("a failed layer_prefill row was plotted")

        budget = 512 << 20
        rows = plot.memory_series(dsa, "glm-5", 8192, budget, [8192, 65536, 131072])
        for r in rows:
            if r["unbounded"] != 8192 * r["ctx"] * 4:
                failures.append(f"unbounded at {r['ctx']}: {r['unbounded']}")
            if not (r["dsa_score_region"] <= budget):
                failures.append(f"DSA score region {r['dsa_score_region']} over the budget at {r['ctx']}")
            if not (0 < r["dsa_workspace"] and r["dsa_score_region"] <= r["dsa_workspace"]):
                failures.append(f"DSA workspace {r['dsa_workspace']} at {r['ctx']}")
            if r["engine_rows"] * r["ctx"] * 4 > budget:
                failures.append(f"engine chunk over the budget at {r['ctx']}")
        if rows[0]["unbounded"] >= rows[-1]["unbounded"]:
            failures.append("unbounded scores do not grow with the context")
        out = os.path.join(d, "mem.png")
        plot.plot_memory(rows, "glm-5", 8192, budget, out)
        if not os.path.getsize(out):
            failures.append("empty memory figure")
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else "FAIL")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
