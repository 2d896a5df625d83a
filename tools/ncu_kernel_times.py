#!/usr/bin/env python3
"""Where a step's GPU time goes: sums Nsight Compute's per-kernel durations by kernel and prints a table.

usage: ncu --nvtx --nvtx-include "decode b64/" --metrics gpu__time_duration.sum --csv \\
           --print-kernel-base function --log-file OUT.csv build-gpu/model_bench ...
       python3 tools/ncu_kernel_times.py OUT.csv [--top N]

Each kernel runs serialised under ncu, so the sum is the step's kernel time without overlap or
launch gaps; compare it with model_bench's ms/step to see what the gaps cost.
"""
import argparse
import collections
import csv
import sys

SCALE_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --csv output (other lines, such as ==PROF== ones, are skipped)")
    ap.add_argument("--top", type=int, default=20, help="kernels to list (the rest are summed in one row)")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"ncu_kernel_times: no CSV rows in {args.csv}")
    total = collections.Counter()
    count = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r["Metric Unit"].strip()
        if unit not in SCALE_MS:
            sys.exit(f"ncu_kernel_times: unknown time unit '{unit}' in {args.csv}")
        ms = float(r["Metric Value"].replace(",", "")) * SCALE_MS[unit]
        total[r["Kernel Name"]] += ms
        count[r["Kernel Name"]] += 1
    if not total:
        sys.exit(f"ncu_kernel_times: no gpu__time_duration.sum rows in {args.csv}")
    all_ms = sum(total.values())
    print(f"{sum(count.values())} kernels, {all_ms:.3f} ms of kernel time")
    print("| kernel | launches | ms | share |\n|---|---|---|---|")
    ranked = total.most_common()
    for name, ms in ranked[:args.top]:
        print(f"| {name} | {count[name]} | {ms:.3f} | {100 * ms / all_ms:.1f}% |")
    rest = ranked[args.top:]
    if rest:
        ms = sum(v for _, v in rest)
        print(f"| ({len(rest)} others) | {sum(count[n] for n, _ in rest)} | {ms:.3f} | {100 * ms / all_ms:.1f}% |")


if __name__ == "__main__":
    main()
