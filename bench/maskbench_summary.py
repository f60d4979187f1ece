#!/usr/bin/env python3
"""The MaskBench table row from a runner's per-schema JSON lines (osprey maskbench, bench/maskbench_peer.mjs,
bench/maskbench_llamacpp_mask.c), also from a partial run; --ids FILE keeps only the schemas whose id is in
FILE's lines (another run's output), so two engines are compared on the same schemas.

Usage: python3 bench/maskbench_summary.py OUT.jsonl [--ids OTHER.jsonl] [--label NAME]
"""
import argparse
import json


def pct(v, p):
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))] if v else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ids")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    keep = None
    if a.ids:
        with open(a.ids) as f:
            keep = {json.loads(l)["id"] for l in f if l.strip()}
    n = npass = ncerr = ntimeout = ninv = 0
    masks, compiles = [], []
    with open(a.out) as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            if keep is not None and o.get("id") not in keep:
                continue
            n += 1
            masks += o.get("all_mask_us", [])
            if "compile_error" in o:
                ncerr += 1
                continue
            c = o.get("compile_us", o.get("ttfm_us"))
            if c is not None:
                compiles.append(c)
            ntimeout += bool(o.get("timeout"))
            ninv += bool(o.get("invalid_accepted"))
            npass += not o.get("timeout") and "validation_error" not in o
    masks.sort(), compiles.sort()
    print(f"| {a.label} | {npass} of {n} ({100 * npass / max(1, n):.1f}%) | {ninv} | "
          f"{pct(masks, .5):,.1f} / {pct(masks, .99):,.1f} / {pct(masks, .999):,.1f} | {pct(compiles, .5):,.0f} | "
          f"{ncerr} compile errors, {ntimeout} timeouts, {len(masks)} tokens |")


if __name__ == "__main__":
    main()
