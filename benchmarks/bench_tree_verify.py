"""What verifying a token tree costs against its node count, per target precision, on the fast path:
one forward of the root plus N nodes at 128 tokens of context, against a one-token step, interleaved
call by call so all see the same machine. A tree pays only where the extra nodes cost less than
the tokens they add (seed 002, SpecMQuant, found trees losing on 4-bit targets on GPU).

    python benchmarks/bench_tree_verify.py [--threads 2] [--rounds 3] [--precisions fp32,int4-g64-rtn-head8]
        [--nodes 1,4,8,16,32,64] [--out docs/results/tree-verify.jsonl]

The tree is the first N nodes, breadth first, of a complete 4-ary tree (depth 3 holds 84 nodes),
the shape of `--tree-topk 4`. Writes one JSON row per (precision, nodes, round) with the median ms
of `--calls` calls of the tree pass and of the one-token step, and prints medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import specq
from specq.core.acceptance import depths, verify_layout

CONTEXT = 128
BRANCHING = 4


def bfs_tree(nodes: int) -> torch.Tensor:
    """parents [nodes] of the first `nodes` nodes, breadth first, of a complete BRANCHING-ary tree."""
    return torch.tensor([-1 if i < BRANCHING else i // BRANCHING - 1 for i in range(nodes)])


def timed(net, ids: torch.Tensor, cache, parents: torch.Tensor | None) -> float:
    tree = {} if parents is None else verify_layout(parents, cache.length)
    started = time.perf_counter()
    net(ids, cache, **tree)
    elapsed = time.perf_counter() - started
    cache.crop(CONTEXT)
    return elapsed * 1000


def bench_precision(spec: str, sizes: list[int], rounds: int, calls: int) -> list[dict]:
    net = specq.load(f"smollm2-135m@{spec}").net  # the fast path
    ids = torch.randint(100, 40000, (CONTEXT + max(sizes) + 1,), generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode():
        cache = net.new_cache(CONTEXT + max(sizes) + 2)
        net(ids[:CONTEXT], cache)
        for r in range(rounds):
            for n in sizes:
                parents = bfs_tree(n)
                tree, step = [], []
                for _ in range(calls):
                    step.append(timed(net, ids[CONTEXT:CONTEXT + 1], cache, None))
                    tree.append(timed(net, ids[CONTEXT:CONTEXT + n + 1], cache, parents))
                rows.append({"precision": spec, "nodes": n, "depth": int(depths(parents).max()), "round": r,
                             "tree_ms": statistics.median(tree), "step_ms": statistics.median(step),
                             "threads": torch.get_num_threads()})
    return rows


def table(rows: list[dict]) -> str:
    sizes = sorted({r["nodes"] for r in rows})
    lines = ["| precision | 1-token step (ms) | " + " | ".join(f"{n} nodes" for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for spec in dict.fromkeys(r["precision"] for r in rows):
        mine = [r for r in rows if r["precision"] == spec]
        step = statistics.median(r["step_ms"] for r in mine)
        cells = []
        for n in sizes:
            ms = statistics.median(r["tree_ms"] for r in mine if r["nodes"] == n)
            ratio = statistics.median(r["tree_ms"] / r["step_ms"] for r in mine if r["nodes"] == n)
            cells.append(f"{ms:.1f} ({ratio:.2f}x)")
        lines.append(f"| {spec} | {step:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=7)
    ap.add_argument("--precisions", default="fp32,int4-g64-rtn-head8")
    ap.add_argument("--nodes", default="1,2,4,8,16,32,64")
    ap.add_argument("--out", default=None, help="append the raw rows here (JSON lines)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.nodes.split(",")]
    rows = []
    for spec in args.precisions.split(","):
        rows += bench_precision(spec, sizes, args.rounds, args.calls)
        if args.out:
            with Path(args.out).open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows if r["precision"] == spec)
    print(f"{args.threads} thread(s), {CONTEXT} tokens of context, fast path; ms per tree verify pass (root + N "
          f"nodes; x its paired one-token step), median over {args.rounds} rounds of {args.calls} calls")
    print(table(rows))


if __name__ == "__main__":
    main()
