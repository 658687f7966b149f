#!/usr/bin/env python3
"""Join `dsa bench --json` with `bench/torch_baseline.py --json` (same device run) on (op, shape)
and print, per benchmark: DSA time, PyTorch time, speed-up over PyTorch, and DSA's ratio to the
floor. Exit status 1 if any DSA kernel is slower than its PyTorch baseline.

    python3 bench/compare.py dsa_bench.json torch_baseline.json [--markdown]
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return {(r["op"], r["shape"]): r for r in json.load(f)["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dsa_json")
    ap.add_argument("torch_json")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table (for docs/perf.md)")
    a = ap.parse_args()
    ours, base = load(a.dsa_json), load(a.torch_json)
    rows, slower = [], 0
    for key, r in ours.items():
        b = base.get(key)
        dsa_ms = r["ms"] if r.get("ok") else None
        torch_ms = b["ms"] if b and b.get("ok") else None
        speedup = torch_ms / dsa_ms if dsa_ms and torch_ms else None
        if speedup is not None and speedup < 1.0:
            slower += 1
        rows.append((key[0], key[1], dsa_ms, torch_ms, speedup, r.get("floor_ratio") if dsa_ms else None,
                     r.get("bound", "")))

    def f(x, spec):
        return format(x, spec) if x is not None else "-"

    if a.markdown:
        print("| op | shape | DSA ms | PyTorch ms | speed-up | DSA x floor | bound |")
        print("|---|---|---:|---:|---:|---:|---|")
        for op, shape, d, t, s, fr, bound in rows:
            print(f"| {op} | {shape} | {f(d, '.4f')} | {f(t, '.4f')} | {f(s, '.2f')} | {f(fr, '.2f')} | {bound} |")
    else:
        print(f"{'op':<20} {'shape':<50} {'dsa ms':>10} {'torch ms':>10} {'speed-up':>9} {'x floor':>8}")
        for op, shape, d, t, s, fr, bound in rows:
            print(f"{op:<20} {shape:<50} {f(d, '10.4f')} {f(t, '10.4f')} {f(s, '9.2f')} {f(fr, '8.2f')}")
    if slower:
        print(f"{slower} DSA kernel(s) slower than the PyTorch baseline", file=sys.stderr)
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
