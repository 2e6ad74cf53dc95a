"""Where the time of a one-token step and of an 8-row verify pass goes, for a GGUF target on
specq's kernels: the whole cached pass at two context lengths, the linear layers alone (every
packed weight read once, on inputs of the same shapes), and how fast this machine reads memory at
all (torch's float32 sum over 1 GiB, the same threads); and, timed inside the whole pass, its one C
call through every decoder layer (`decoder.Stack`: what the pass costs beside the embedding lookup,
the final norm, the output head and Python). Whether a step is bound by reading the
weights or by arithmetic shows in the last two: a one-row step whose linear layers read at the rate
of a plain sum cannot get faster without fewer bytes, and a pass whose linear layers take longer
at 8 rows than at 1 is bound by the arithmetic. Rounds interleave every measurement (this VM's
memory speed drifts between runs); the table gives medians and the 8-row / 1-row ratio paired per
round.

    python benchmarks/profile_step.py --ref qwen2.5-coder-1.5b --threads 2 --rounds 7 --out docs/results/step-profile-coder.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

import specq
from specq.kernels import build, int8dot

ROWS = (1, 8)
CONTEXTS = (128, 1024)
SUM_BYTES = 1 << 30


def median_ms(f: Callable[[], float | None], calls: int) -> float:
    """The median of `calls` timed calls, after one untimed; a call that returns seconds is timed
    by what it returns (a part of its work), else by its wall time."""
    f()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        part = f()
        times.append((time.perf_counter() - began if part is None else part) * 1000)
    return statistics.median(times)


class TimedStack:
    """A model's `decoder.Stack` that keeps the wall time of its last call."""

    def __init__(self, stack):
        self.stack, self.last = stack, 0.0

    def __call__(self, *args):
        began = time.perf_counter()
        out = self.stack(*args)
        self.last = time.perf_counter() - began
        return out


def measurements(ref: str) -> tuple[dict[tuple[str, int, int], Callable[[], float | None]], int, int]:
    """({(measurement, rows, context): a call to time}, the packed weights' bytes, those of the
    decoder layers alone)."""
    net = specq.load(ref).net
    weights = [w for m in net.modules() if (w := getattr(m, "int8dot_weight", lambda: None)()) is not None]
    layer_weights = [w for m in net.layers.modules() if (w := getattr(m, "int8dot_weight", lambda: None)()) is not None]
    net.stack = stack = TimedStack(net.stack)
    ids = torch.randint(100, 40000, (max(CONTEXTS) + max(ROWS),), generator=torch.Generator().manual_seed(0))
    caches = {}
    with torch.inference_mode():
        for context in CONTEXTS:
            caches[context] = net.new_cache(context + max(ROWS))
            net(ids[:context], caches[context])

    def step(rows: int, context: int, layers_only: bool = False) -> Callable[[], float | None]:
        def run() -> float | None:
            with torch.inference_mode():
                net(ids[context:context + rows], caches[context])
            caches[context].crop(context)
            return stack.last if layers_only else None
        return run

    def linears(rows: int) -> Callable[[], None]:
        inputs = {w.in_features: torch.randn(rows, w.in_features) for w in weights}
        def run() -> None:
            for w in weights:
                int8dot.linear(inputs[w.in_features], w)
        return run

    floats = torch.ones(SUM_BYTES // 4)
    out = {("pass", n, c): step(n, c) for c in CONTEXTS for n in ROWS}
    out |= {("layers", n, CONTEXTS[0]): step(n, CONTEXTS[0], layers_only=True) for n in ROWS}
    out |= {("linears", n, 0): linears(n) for n in ROWS}
    def float_sum() -> None:
        floats.sum()

    out[("float32 sum of 1 GiB", 1, 0)] = float_sum
    return out, sum(w.nbytes() for w in weights), sum(w.nbytes() for w in layer_weights)


def table(rows: list[dict]) -> str:
    """One line per measurement: medians at 1 and 8 rows, their paired ratio; read rates."""
    def ms(what: str, n: int, context: int) -> list[float]:
        return [r["ms"] for r in sorted(rows, key=lambda r: r["round"])
                if (r["measurement"], r["rows"], r["context"]) == (what, n, context)]

    weight_mb = rows[0]["weight_bytes"] / 1e6
    lines = ["| measurement | 1 row | 8 rows | 8 rows / 1 row (paired, median) |", "|---|---|---|---|"]
    labels = [(("pass", c), f"whole pass, {c} tokens of context") for c in CONTEXTS]
    layers = [r for r in rows if r["measurement"] == "layers"]  # absent from rows of older runs
    if layers:
        labels.append((("layers", CONTEXTS[0]), f"decoder layers' C call within the pass, {CONTEXTS[0]} tokens of context"))
    labels.append((("linears", 0), f"linear layers alone ({weight_mb:.0f} MB of packed weights)"))
    for (what, context), label in labels:
        one, eight = ms(what, 1, context), ms(what, 8, context)
        ratio = statistics.median(b / a for a, b in zip(one, eight))
        lines.append(f"| {label} | {statistics.median(one):.1f} ms | {statistics.median(eight):.1f} ms | {ratio:.2f} |")
    read = statistics.median(weight_mb / m for m in ms("linears", 1, 0))
    summed = statistics.median(SUM_BYTES / 1e6 / m for m in ms("float32 sum of 1 GiB", 1, 0))
    lines.append(f"| read rate: the linear layers at 1 row | {read:.1f} GB/s | | |")
    if layers:
        layer_mb = layers[0]["layer_weight_bytes"] / 1e6
        rate = statistics.median(layer_mb / m for m in ms("layers", 1, CONTEXTS[0]))
        lines.append(f"| read rate: the decoder layers' C call at 1 row ({layer_mb:.0f} MB) | {rate:.1f} GB/s | | |")
    lines.append(f"| read rate: torch's float32 sum of 1 GiB | {summed:.1f} GB/s | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="qwen2.5-coder-1.5b", help="the target ref (default the 1.5B coder file)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="timed calls per measurement and round (median)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows here (replacing the file)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    todo, weight_bytes, layer_bytes = measurements(args.ref)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    base = {"run": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit, "ref": args.ref,
            "threads": args.threads, "kernels": build.variant(), "weight_bytes": weight_bytes,
            "layer_weight_bytes": layer_bytes}
    rows = [{**base, "measurement": what, "rows": n, "context": context, "round": r, "ms": median_ms(f, args.calls)}
            for r in range(args.rounds) for (what, n, context), f in todo.items()]
    print(table(rows))
    if args.out:
        args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
