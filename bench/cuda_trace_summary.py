#!/usr/bin/env python3
"""Per-step tables from bench/cuda_trace.c's kernel records (a decode run of `osprey bench --device cuda`).

    python3 bench/cuda_trace_summary.py trace.csv [--skip 3] [--graph ID]

A decode step is one replay of a CUDA graph: the graph with the most kernel records is taken (another with
--graph), its records split into replays where its first node comes round again, and the first --skip replays
left out (capture and warm-up). Printed, over the replays kept:
  - each node in step order: kernel, grid and block, registers, mean time, the mean gap before it (the time
    from the previous kernel's end to its start; negative when it started before that end: programmatic
    dependent launch), and its share of the step: its end minus the previous kernel's end (the first: its
    time). A kernel that starts early waits inside its own time, so the shares, not the times, add up to the
    step's span;
  - the same by kernel name: launches a step, the shares a step, their part of the span, the times a step;
  - the step's span (first start to last end), the sum of its kernels' times, the idle time inside it (the union
    of the kernels' intervals against the span) and the time between steps.
"""
import argparse
import csv
import re
import shutil
import subprocess
import sys
from collections import OrderedDict, defaultdict


def demangle(names):
    names = list(names)
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def short(name):
    """A kernel's name without argument lists; template arguments kept, compacted."""
    name = re.sub(r"\(.*\)$", "", name)  # the parameter list
    name = re.sub(r"^void ", "", name)
    name = name.replace("(bool)1", "1").replace("(bool)0", "0").replace(", ", ",")
    return name[:70]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=3, help="replays left out first (capture, warm-up)")
    ap.add_argument("--graph", type=int, default=None, help="the graph id (default: the one with most records)")
    ap.add_argument("--top", type=int, default=25, help="rows of the by-kernel table")
    a = ap.parse_args()

    rows = []
    with open(a.trace, newline="") as f:
        for r in csv.DictReader(f):
            rows.append(r)
    if not rows:
        sys.exit("no kernel records in " + a.trace)
    per_graph = defaultdict(int)
    for r in rows:
        if r["graph_id"] != "0":
            per_graph[int(r["graph_id"])] += 1
    if not per_graph:
        sys.exit("no graph kernel records (graphs off?): nothing to split into steps")
    gid = a.graph if a.graph is not None else max(per_graph, key=per_graph.get)
    g = [r for r in rows if int(r["graph_id"]) == gid]
    g.sort(key=lambda r: int(r["start_ns"]))
    first = g[0]["graph_node_id"]
    steps, cur = [], []
    for r in g:
        if r["graph_node_id"] == first and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    n_nodes = max(len(s) for s in steps)
    steps = [s for s in steps if len(s) == n_nodes]  # whole replays only
    kept = steps[a.skip:] if len(steps) > a.skip else steps
    if not kept:
        sys.exit("no whole replays")
    names = demangle({r["name"] for s in kept for r in s})
    print(f"graph {gid}: {len(steps)} whole replays of {n_nodes} kernels, {len(kept)} kept "
          f"(other graphs: {', '.join(f'{k}:{v}' for k, v in sorted(per_graph.items()) if k != gid) or 'none'})")

    # each node in step order
    dur = [0.0] * n_nodes
    gap = [0.0] * n_nodes
    share = [0.0] * n_nodes
    for s in kept:
        for i, r in enumerate(s):
            dur[i] += (int(r["end_ns"]) - int(r["start_ns"])) / 1e3
            if i:
                gap[i] += (int(r["start_ns"]) - int(s[i - 1]["end_ns"])) / 1e3
                share[i] += (int(r["end_ns"]) - int(s[i - 1]["end_ns"])) / 1e3
            else:
                share[i] += (int(r["end_ns"]) - int(r["start_ns"])) / 1e3
    k = len(kept)
    print(f"\n{'#':>3} {'kernel':<70} {'grid':>12} {'block':>5} {'regs':>4} {'us':>7} {'gap us':>7} {'share':>7}")
    for i, r in enumerate(kept[0]):
        grid = f"{r['grid_x']}x{r['grid_y']}x{r['grid_z']}"
        print(f"{i:>3} {short(names[r['name']]):<70} {grid:>12} {r['block_x']:>5} {r['registers']:>4} "
              f"{dur[i] / k:>7.2f} {gap[i] / k if i else 0.0:>7.2f} {share[i] / k:>7.2f}")

    # by kernel
    by = OrderedDict()
    for i, r in enumerate(kept[0]):
        n = short(names[r["name"]])
        c = by.setdefault(n, [0, 0.0, 0.0])
        c[0] += 1
        c[1] += share[i] / k
        c[2] += dur[i] / k
    span = sum(int(s[-1]["end_ns"]) - int(s[0]["start_ns"]) for s in kept) / k / 1e3
    print(f"\n{'kernel':<70} {'a step':>6} {'share':>8} {'of span':>7} {'time':>8}")
    for n, (c, t, d) in sorted(by.items(), key=lambda x: -x[1][1])[: a.top]:
        print(f"{n:<70} {c:>6} {t:>8.1f} {t / span:>7.1%} {d:>8.1f}")

    # the step
    busy = 0.0
    for s in kept:
        iv = sorted((int(r["start_ns"]), int(r["end_ns"])) for r in s)
        lo, hi = iv[0]
        for x, y in iv[1:]:
            if x > hi:
                busy += hi - lo
                lo, hi = x, y
            else:
                hi = max(hi, y)
        busy += hi - lo
    busy /= k * 1e3
    between = [(int(kept[i + 1][0]["start_ns"]) - int(kept[i][-1]["end_ns"])) / 1e3 for i in range(len(kept) - 1)]
    ksum = sum(dur) / k
    print(f"\nstep span {span:.1f} us ({1e6 / span:.0f} steps/s inside a replay); kernels' sum {ksum:.1f} us; "
          f"some kernel running {busy:.1f} us, none {span - busy:.1f} us ({(span - busy) / span:.1%})")
    if between:
        print(f"between steps: mean {sum(between) / len(between):.1f} us, min {min(between):.1f}, "
              f"max {max(between):.1f} (the host's sampling, copies, the next replay's launch)")


if __name__ == "__main__":
    main()
