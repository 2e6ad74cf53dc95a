"""Would batching concurrent requests into one forward pass pay on this CPU?

A batch of B sequences shares each weight read among B rows; it pays where a pass over more rows
costs much less than that many passes over one row. specq's native Llama runs one sequence per
cache, so a batched step is estimated from two measurements of the built-in target, per precision:

  linear   every linear layer (the fused qkv, o, gate/up, down of each block, and the output head)
           in model order on [rows, in_features] inputs: the part of a step a batch would share
  forward  one forward pass of `rows` new tokens of one sequence at 128 tokens of context (what a
           speculative verify pass runs): attention and every other op included, so the closest
           existing measure of a batched step's cost

rows 1 vs 2 is plain decoding of two requests, one at a time vs batched; 3 vs 6 is speculative
decoding at gamma 2 (a verify pass of 3 rows per request). Medians of interleaved repeats; one
JSON line per (precision, measure, rows).

    python benchmarks/bench_batch_rows.py [--precisions fp32 int4-g64-rtn-head8] [--threads 2] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import specq

ROWS = (1, 2, 3, 6)
CONTEXT = 128


def linears(net: torch.nn.Module) -> list[torch.nn.Module]:
    """The leaf modules that multiply by a weight matrix, in model order."""
    return [m for m in net.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")
            and not list(m.children())]


def time_linears(layers, rows: int) -> float:
    xs = {n: torch.randn(rows, n) for n in {layer.in_features for layer in layers}}
    started = time.perf_counter()
    for layer in layers:
        layer(xs[layer.in_features])
    return time.perf_counter() - started


def time_forward(net, cache, ids: torch.Tensor, rows: int) -> float:
    cache.crop(CONTEXT)
    started = time.perf_counter()
    net(ids[CONTEXT:CONTEXT + rows], cache)
    return time.perf_counter() - started


@torch.inference_mode()
def measure(precision: str, repeats: int) -> list[dict]:
    model = specq.load(f"smollm2-135m@{precision}")
    layers = linears(model.net)
    ids = torch.randint(100, 40000, (CONTEXT + max(ROWS),), generator=torch.Generator().manual_seed(0))
    cache = model.net.new_cache(CONTEXT + max(ROWS) + 1)
    model.net(ids[:CONTEXT], cache)
    times = {(kind, rows): [] for kind in ("linear", "forward") for rows in ROWS}
    for repeat in range(repeats + 3):  # 3 untimed warm-up rounds
        for rows in ROWS:
            for kind in ("linear", "forward"):
                s = time_linears(layers, rows) if kind == "linear" else time_forward(model.net, cache, ids, rows)
                if repeat >= 3:
                    times[kind, rows].append(s)
    return [{"precision": precision, "measure": kind, "rows": rows, "layers": len(layers),
             "median_ms": 1000 * statistics.median(t), "repeats": repeats} for (kind, rows), t in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int4-g64-rtn-head8"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for precision in args.precisions:
        rows = measure(precision, args.repeats)
        one = {r["measure"]: r["median_ms"] for r in rows if r["rows"] == 1}
        three = {r["measure"]: r["median_ms"] for r in rows if r["rows"] == 3}
        for r in rows:
            # a batch of rows/base requests vs that many separate passes of `base` rows
            base = one if r["rows"] <= 2 else three
            per = 1 if r["rows"] <= 2 else 3
            r["vs_separate"] = r["median_ms"] / (r["rows"] // per * base[r["measure"]])
            print(json.dumps(r | {"threads": args.threads, "machine": platform.processor() or platform.machine(),
                                  "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
