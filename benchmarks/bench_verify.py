"""What a verify pass costs: one forward of n tokens (n = gamma + 1) at 128 tokens of context, for
each target precision, on the eager path and on the fast path (`specq.backends.fastpath`), interleaved
call by call so both see the same machine. Speculative decoding pays off only if the n-token
pass costs little more than a 1-token step.

    python benchmarks/bench_verify.py [--threads 2] [--rounds 3] [--precisions fp32,int4-g64-rtn]
        [--sizes 1,2,3,4,5,8,9,16] [--out docs/results/verify.jsonl]

Writes one JSON row per (precision, path, tokens, round) with the median ms of `--calls` calls,
and prints a table of medians over rounds with each size's cost relative to 1 token.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

import specq
from specq.backends import fastpath

CONTEXT = 128


def timed(net, ids: torch.Tensor, cache) -> float:
    started = time.perf_counter()
    net(ids, cache)
    elapsed = time.perf_counter() - started
    cache.crop(CONTEXT)
    return elapsed * 1000


def bench_precision(spec: str, sizes: list[int], rounds: int, calls: int) -> list[dict]:
    eager = specq.load(f"smollm2-135m@{spec}", backend=None).net
    fast = copy.deepcopy(eager)
    fastpath.apply(fast)
    ids = torch.randint(100, 40000, (CONTEXT + max(sizes),), generator=torch.Generator().manual_seed(0))
    nets = {"eager": eager, "fast": fast}
    caches = {}
    rows = []
    with torch.inference_mode():
        for path, net in nets.items():
            caches[path] = net.new_cache(CONTEXT + max(sizes) + 1)
            net(ids[:CONTEXT], caches[path])
        for r in range(rounds):
            for n in sizes:
                x = ids[CONTEXT:CONTEXT + n]
                ms = {path: [] for path in nets}
                for _ in range(calls):
                    for path, net in nets.items():
                        ms[path].append(timed(net, x, caches[path]))
                rows += [{"precision": spec, "path": path, "tokens": n, "round": r, "ms": statistics.median(v),
                          "threads": torch.get_num_threads()} for path, v in ms.items()]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| precision | path | " + " | ".join(f"{n} tok" for n in sorted({r['tokens'] for r in rows})) + " |"]
    sizes = sorted({r["tokens"] for r in rows})
    lines.append("|---|---|" + "---|" * len(sizes))
    keys = dict.fromkeys((r["precision"], r["path"]) for r in rows)
    for spec, path in keys:
        med = {n: statistics.median(r["ms"] for r in rows if (r["precision"], r["path"], r["tokens"]) == (spec, path, n))
               for n in sizes}
        cells = [f"{med[n]:.1f} ({med[n] / med[sizes[0]]:.2f}x)" for n in sizes]
        lines.append(f"| {spec} | {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--precisions", default="fp32,bf16,int8,int8-head8,int4-g64-rtn,int4-g64-rtn-head8,gguf")
    ap.add_argument("--sizes", default="1,2,3,4,5,8,9,16")
    ap.add_argument("--out", default=None, help="append the raw rows here (JSON lines)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for spec in args.precisions.split(","):
        rows += bench_precision(spec, sizes, args.rounds, args.calls)
        if args.out:
            with Path(args.out).open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows if r["precision"] == spec)
    print(f"{args.threads} thread(s), {CONTEXT} tokens of context; ms per forward (median over {args.rounds} rounds "
          f"of the median of {args.calls} calls), cost relative to {sizes[0]} token(s) in brackets")
    print(table(rows))


if __name__ == "__main__":
    main()
