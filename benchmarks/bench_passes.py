"""The cost of a one-token step and of 2-16-row verify passes of a model, beside how fast this
machine reads memory: speculative decoding pays where an N-row pass costs little more than a
1-row step, and a step whose weights are read at the machine's read rate cannot get faster
without fewer bytes.

    python benchmarks/bench_passes.py [--ref REF,... | --file PATH] [--rows 1,2,4,8,16]
        [--contexts 128,1024] [--backends kernels,eager] [--threads 2] [--rounds 5] [--calls 5]
        [--out benchmarks/results/passes.jsonl]
    python benchmarks/bench_passes.py --table benchmarks/results/passes.jsonl

Results: one JSON row per (model, backend, measurement, rows, context, round), with the median
ms of `--calls` calls, appended to `--out` (default benchmarks/results/passes.jsonl); each row
records the machine (`cpu`, `kernels`, `threads`), the model, the commit and the run's time.
Prints one table per model and backend (`specq.bench.tools.passes.table`): medians over rounds,
and each N-row pass over the 1-row step paired by round.

Measurements, each round interleaving all of them (a VM's memory speed drifts between runs):
- `pass`: one cached forward of N rows after C tokens of context (`--contexts`), logits for
  every row, the cache cut back after each call;
- `layers`: the decoder layers' one C call (`decoder.Stack`) timed inside that pass, at the
  first context: the pass's cost beside the embedding lookup, the final norm, the output head
  and Python (models that run one: the kernels backend);
- `linears`: every packed int8dot weight of the model read once, on inputs of N rows (models
  with such weights);
- `float32 sum of 1 GiB`: torch's sum over 1 GiB at the same threads, the machine's read rate.
A step whose linear layers read at the rate of a plain sum is bound by reading the weights; a
pass whose linear layers take longer at 8 rows than at 1 is bound by the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

import specq
from specq import backends
from specq.backends.fastpath import Int8DotKernel
from specq.bench.tools.passes import SUM, SUM_BYTES, table
from specq.kernels import build, int8dot

DEFAULT_REF = "smollm2-135m@gguf"  # the built-in target's own GGUF file, installed with specq
DEFAULT_OUT = Path("benchmarks/results/passes.jsonl")
Timed = Callable[[], float | None]


def median_ms(f: Timed, calls: int) -> float:
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


def packed(run, module: torch.nn.Module) -> list[int8dot.Int8DotWeight]:
    """The int8dot weights the runner `run` runs the linear layers under `module` on."""
    kernels = [run.kernels.get(m) for m in module.modules()]
    return [k.weight for k in kernels if isinstance(k, Int8DotKernel)]


def measurements(ref: str, backend: str, rows: list[int],
                 contexts: list[int]) -> tuple[dict[tuple, Timed], dict]:
    """({(measurement, rows, context): a call to time}, the model's fields of every row)."""
    run = specq.load(ref, backend=backend).runner
    weights, layer_weights = packed(run, run.net), packed(run, run.net.layers)
    stack = None
    if run.stack is not None:  # the same kernels, the layer stack timed
        stack = TimedStack(run.stack)
        run = type(run)(run.net, run.backend, run.kernels, stack)
    net = run
    ids = torch.randint(100, 20000, (max(contexts) + max(rows),),
                        generator=torch.Generator().manual_seed(0))
    caches = {}
    with torch.inference_mode():
        for context in contexts:
            caches[context] = net.new_cache(context + max(rows))
            net(ids[:context], caches[context])

    def step(n: int, context: int, layers_only: bool = False) -> Timed:
        def run() -> float | None:
            with torch.inference_mode():
                net(ids[context:context + n], caches[context])
            caches[context].crop(context)
            return stack.last if layers_only else None
        return run

    def linears(n: int) -> Timed:
        inputs = {w.in_features: torch.randn(n, w.in_features) for w in weights}

        def run() -> None:
            for w in weights:
                int8dot.linear(inputs[w.in_features], w)
        return run

    todo = {("pass", n, c): step(n, c) for c in contexts for n in rows}
    if stack is not None:
        todo |= {("layers", n, contexts[0]): step(n, contexts[0], layers_only=True) for n in rows}
    if weights:
        todo |= {("linears", n, 0): linears(n) for n in rows}
    fields = {"ref": ref, "backend": backend, "weight_bytes": sum(w.nbytes() for w in weights),
              "layer_weight_bytes": sum(w.nbytes() for w in layer_weights)}
    return todo, fields


def numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default=None,
                    help=f"model refs, comma-separated, timed interleaved (default {DEFAULT_REF})")
    ap.add_argument("--file", type=Path, default=None,
                    help="a GGUF file, run at its own precision (instead of --ref)")
    ap.add_argument("--rows", type=numbers, default=[1, 2, 4, 8, 16],
                    help="rows per pass: 1 is a decode step, N a verify pass of N - 1 drafts")
    ap.add_argument("--contexts", type=numbers, default=[128, 1024],
                    help="tokens of context before each pass")
    ap.add_argument("--backends", default="kernels",
                    help="backends to time each model on, comma-separated (kernels, eager)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5,
                    help="timed calls per measurement and round (their median)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="append the rows here")
    ap.add_argument("--table", type=Path, default=None,
                    help="print the tables of a results file and exit")
    return ap


def tables(rows: list[dict]) -> str:
    """One table per (model, backend), each with the read rates of its run."""
    out = []
    for ref, backend in dict.fromkeys((r["ref"], r.get("backend")) for r in rows
                                      if r["measurement"] != SUM):
        runs = {r.get("run") for r in rows if (r["ref"], r.get("backend")) == (ref, backend)}
        mine = [r for r in rows if (r["ref"], r.get("backend")) == (ref, backend)
                or (r["measurement"] == SUM and r.get("run") in runs)]
        out.append(f"{ref}, {backend or 'kernels'} backend\n\n{table(mine)}")
    return "\n\n".join(out)


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.table:
        print(tables([json.loads(line) for line in args.table.read_text().splitlines()
                      if line.strip()]))
        return
    if args.file is not None and args.ref is not None:
        ap.error("--file and --ref: give one")
    if args.file is not None and not args.file.is_file():
        ap.error(f"--file: no file at {args.file}")
    if not args.rows or not args.contexts or min(args.rows + args.contexts) < 1:
        ap.error("--rows and --contexts: positive numbers, comma-separated")
    chosen = args.backends.split(",")
    if unknown := [b for b in chosen if b not in backends.BACKENDS]:
        ap.error(f"--backends: unknown {', '.join(unknown)} (of {', '.join(backends.BACKENDS)})")
    refs = [str(args.file)] if args.file else (args.ref or DEFAULT_REF).split(",")
    torch.set_num_threads(args.threads)
    todo = {}  # (ref, backend, measurement, rows, context) -> (a call to time, its row's fields)
    for ref in refs:
        for backend in chosen:
            calls, fields = measurements(ref, backend, args.rows, args.contexts)
            todo |= {(ref, backend, *key): (call, fields) for key, call in calls.items()}
    floats = torch.ones(SUM_BYTES // 4)

    def float_sum() -> None:
        floats.sum()

    todo[(None, None, SUM, 1, 0)] = (float_sum, {"ref": None, "backend": None})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    base = {"run": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "threads": args.threads, "kernels": build.variant(), "cpu": build.cpu_model(),
            "calls": args.calls}
    rows = []
    for r in range(args.rounds):
        for (_, _, what, n, context), (call, fields) in todo.items():
            rows.append({**base, **fields, "measurement": what, "rows": n, "context": context,
                         "round": r, "ms": median_ms(call, args.calls)})
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(tables(rows))
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
