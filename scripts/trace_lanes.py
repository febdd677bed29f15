#!/usr/bin/env python3
"""Busy time per lane and the overlap of two lanes, from an operator trace (`--trace FILE`).

    python3 scripts/trace_lanes.py trace.jsonl [dense sparse]

Each record has a lane (the thread's lane name), start_ns and end_ns; busy time is the union of
a lane's operator intervals; the overlap is the time both lanes were busy at once.
"""
import json
import sys
from collections import defaultdict


def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(x, y):
    i = j = 0
    ov = 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            ov += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return ov


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    a, b = (argv[2], argv[3]) if len(argv) >= 4 else ("dense", "sparse")
    lanes = defaultdict(list)
    with open(argv[1]) as f:
        next(f)  # header
        for line in f:
            r = json.loads(line)
            lanes[r["lane"]].append((r["start_ns"], r["end_ns"]))
    busy = {k: union(v) for k, v in lanes.items()}
    for k, v in sorted(busy.items()):
        print(f"{k:>10}: {len(lanes[k]):6d} ops, busy {sum(e - s for s, e in v) / 1e6:9.1f} ms")
    if a in busy and b in busy:
        ov = overlap(busy[a], busy[b])
        tb = sum(e - s for s, e in busy[b])
        print(f"{a} ∥ {b}: {ov / 1e6:.1f} ms both busy = {100 * ov / max(tb, 1):.0f}% of {b}'s busy time")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
