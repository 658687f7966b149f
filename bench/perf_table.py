#!/usr/bin/env python3
"""Markdown table of a `dsa bench --json` run for docs/perf.md: time, rate, time over the
floor and the kernel that ran, with the public anchors' time and `anchor ms / dsa ms` when an
anchors JSON (from ../shared/anchors, timed in the same device run) is given.

    python3 bench/perf_table.py dsa_bench.json [anchors.json] [--baseline other_dsa_bench.json]

--baseline adds a column with an earlier DSA run's time at the same (op, shape) (for example
the mma.sync kernels forced with DSA_FORCE_KERNEL=mma_sync DSA_CUDA_LOGITS=mma
DSA_CUDA_TOPK=legacy) and the speed-up of this run over it. Rows are joined on (op, shape).
"""
import argparse
import json


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dsa")
    ap.add_argument("anchors", nargs="?")
    ap.add_argument("--baseline")
    a = ap.parse_args()
    dsa = load(a.dsa)
    anchors = {}
    if a.anchors:
        for r in load(a.anchors).get("results", []):
            if "ms" in r:
                # Several anchors can time one shape (e.g. SDPA and the kv_b GEMM): keep each.
                anchors.setdefault((r["op"], r["shape"]), []).append(r)
    base = {}
    if a.baseline:
        base = {(r["op"], r["shape"]): r for r in load(a.baseline)["results"] if r.get("ok")}
    head = "| op | shape | kernel | DSA ms | TFLOP/s | x floor |"
    sep = "|---|---|---|---:|---:|---:|"
    if a.baseline:
        head += " before ms | speed-up |"
        sep += "---:|---:|"
    if a.anchors:
        head += " anchor | anchor ms | anchor / DSA |"
        sep += "---|---:|---:|"
    print(f"GPU: {dsa.get('device', '?')}, {dsa.get('date', '?')}\n")
    print(head)
    print(sep)
    for r in dsa["results"]:
        key = (r["op"], r["shape"])
        if not r.get("ok"):
            print(f"| {key[0]} | {key[1]} | {r.get('kernel', '')} | failed: {r.get('error', '')[:50]} | | |")
            continue
        row = (f"| {key[0]} | {key[1]} | {r.get('kernel', '')} | {r['ms']:.4f} | {r.get('tflops', 0):.0f} | "
               f"{r.get('floor_ratio', 0):.2f} |")
        if a.baseline:
            b = base.get(key)
            row += f" {b['ms']:.4f} | {b['ms'] / r['ms']:.2f} |" if b else " | |"
        if a.anchors:
            ans = anchors.get(key)
            if ans:
                row += " " + "<br>".join(x["impl"] for x in ans) + " | " + "<br>".join(f"{x['ms']:.4f}" for x in ans)
                row += " | " + "<br>".join(f"{x['ms'] / r['ms']:.2f}" for x in ans) + " |"
            else:
                row += " (none) | | |"
        print(row)


if __name__ == "__main__":
    main()
