"""specq's linear-layer kernels alone, at real layer shapes: microseconds per call at 1 to 16 rows
(a decode step and verify passes) and the weight bytes streamed per second.

    python benchmarks/bench_kernels.py int8dot [--variants avx2,avx512vnni] [--layers w13,head]
        [--forms q6-g16,q8-g16] [--cpu-time] [--threads 2] [--rounds 7]
        [--out benchmarks/results/kernels.jsonl]
    python benchmarks/bench_kernels.py f32dot [--threads 2] [--rounds 20]
    python benchmarks/bench_kernels.py roof [--variants avx512vnni] [--threads 2] [--rounds 7]

Results: one JSON row per (kernel, layer, form or variant, rows) appended to `--out` (default
benchmarks/results/kernels.jsonl), each with the machine (`cpu`, `threads`) and the run's time; the
same numbers printed as a table.

- `int8dot`: the int8dot kernel's variants side by side at the Qwen2.5-Coder-1.5B layer shapes,
  in each weight form (4/6/8-bit codes in groups of 16 or 32, GGUF's K-quants' two-level
  scales): us per call at 1, 2, 4, 8 and 16 rows, the ratio to 1 row, and GB/s of weights at 1
  row. Each layer is timed over enough copies of its weight that they do not fit in the
  last-level cache (a decode step reads every weight from memory once), the variants alternated
  round by round so that a busy machine slows them alike; each cell is the median over rounds.
  With one thread, `--cpu-time` times the calling thread's CPU time instead of the wall clock:
  a machine busy with other work then deschedules the kernel without counting it.
- `f32dot`: the float32 kernel against oneDNN's packed GEMM (the fast path's float kernel before
  it) at the built-in target's float32 layer shapes, side by side: us per call at 1, 4 and 8
  rows, each the median of `--rounds` rounds over 8 copies of the weight (1 of the head), so the
  weights come from memory as in a decode step.
- `roof`: the machine's int8 multiply-add rate, GMAC/s, per variant (`specq.bench.tools.roof`):
  what a multi-row pass whose weights are already read at the memory's rate cannot beat.
  int8dot's rows carry their own GMAC/s (`gmacs`) to set beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from specq.backends import fastpath
from specq.bench.tools import add_machine_option, roof
from specq.kernels import build, f32dot, int8dot

# int8dot: the Qwen2.5-Coder-1.5B layers, name: (out, in)
HIDDEN = 1536
SHAPES = {"wqkv": (2048, HIDDEN), "wo": (HIDDEN, HIDDEN), "w13": (17920, HIDDEN),
          "w2": (HIDDEN, 8960), "head": (151936, HIDDEN)}
# name: (bits, group, offsets, two-level scales as GGUF's K-quants keep them)
FORMS = {"q4-g32": (4, 32, True, False), "q6-g16": (6, 16, False, False),
         "q6-g32": (6, 32, False, False), "q8-g16": (8, 16, False, False),
         "q8-g32": (8, 32, False, False), "q4_k": (4, 32, True, True),
         "q5_k": (6, 32, True, True), "q6_k": (6, 16, False, True)}
LAYERS = [(name, form) for name in SHAPES for form in FORMS
          if name != "head" or form in ("q6-g16", "q6_k")]  # the head is Q6_K
ROWS = (1, 2, 4, 8, 16)
STREAM_BYTES = 160 * 2**20  # at least this many weight bytes per timed sweep: 5x a 32 MiB L3
# f32dot: the built-in target's float32 layers, name: (out, in)
FLOAT_SHAPES = {"wqkv": (960, 576), "wo": (576, 576), "w13": (3072, 576), "w2": (576, 1536),
                "head": (49152, 576)}
FLOAT_ROWS = (1, 4, 8)


# ------------------------------------------------------------------------------- int8dot

def weight(out: int, n_in: int, bits: int, group: int, offsets: bool, two_level: bool,
           variants: list[str], g: torch.Generator) -> dict[str, int8dot.Int8DotWeight]:
    """Random codes and scales of one layer, in each variant's layout."""
    if bits == 4:
        codes = torch.randint(0, 16, (out, n_in), generator=g, dtype=torch.uint8)
    else:
        low = -(1 << (bits - 1))
        codes = torch.randint(low, -low, (out, n_in), generator=g, dtype=torch.int8)
    if two_level:  # a float32 per 256 inputs times an int8 per group
        d, m = (torch.rand(out, n_in // int8dot.SUPER, generator=g) * 1e-3 for _ in range(2))
        sub_d, sub_m = (torch.randint(0, 64, (out, n_in // group), generator=g, dtype=torch.int8)
                        for _ in range(2))
        return {v: int8dot.pack_two_level(bits, codes, d, m if offsets else None, sub_d,
                                          sub_m if offsets else None, int8dot.SUPER_SHIFT, v)
                for v in variants}
    scale = torch.rand(out, n_in // group, generator=g) * 0.02
    if bits == 4:
        offset = -8 * scale
    else:
        offset = torch.randn(out, n_in // group, generator=g) * 1e-3 if offsets else None
    return {v: int8dot.PACKS[bits](codes, scale, offset, variant=v) for v in variants}


def layer_copies(name: str, form: str, variants: list[str], g: torch.Generator,
                 stream_bytes: int = STREAM_BYTES) -> dict[str, list[int8dot.Int8DotWeight]]:
    """Per variant, enough random copies of one layer that a sweep over them streams at least
    `stream_bytes` from memory (a decode step reads every weight from memory once)."""
    (out, n_in), (bits, group, offsets, two_level) = SHAPES[name], FORMS[form]
    copies = [weight(out, n_in, bits, group, offsets, two_level, variants, g)]
    more = math.ceil(stream_bytes / copies[0][variants[0]].nbytes()) - 1
    copies += [weight(out, n_in, bits, group, offsets, two_level, variants, g)
               for _ in range(more)]
    return {v: [c[v] for c in copies] for v in variants}


def sweep_us(x: torch.Tensor, weights: list[int8dot.Int8DotWeight],
             clock=time.perf_counter) -> float:
    """Microseconds per call of one sweep over every copy."""
    started = clock()
    for w in weights:
        int8dot.linear(x, w)
    return (clock() - started) / len(weights) * 1e6


def run_int8dot(args: argparse.Namespace, ap: argparse.ArgumentParser) -> list[dict]:
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time times the calling thread only: use it with --threads 1")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    variants = args.variants.split(",")
    if not set(variants) <= set(build.runnable()):
        ap.error(f"--variants: choose from those this CPU runs ({', '.join(build.runnable())})")
    layers = [(name, form) for name, form in LAYERS
              if (not args.layers or name in args.layers.split(","))
              and (not args.forms or form in args.forms.split(","))]
    if not layers:
        ap.error(f"--layers, --forms: choose from {', '.join(SHAPES)} and {', '.join(FORMS)}")
    rounds = args.rounds or 7
    g = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads, {rounds} rounds, {'CPU' if args.cpu_time else 'wall'} time; "
          "us per call (x the 1-row time), GB/s of weights at 1 row")
    print(f"{'layer':<6} {'form':<7} {'variant':<11}" + "".join(f"{r:>15}" for r in ROWS)
          + f"{'GB/s':>7}")
    rows = []
    for name, form in layers:
        out, n_in = SHAPES[name]
        weights = layer_copies(name, form, variants, g)
        xs = {n: torch.randn(n, n_in, generator=g) for n in ROWS}
        times = {(v, n): [] for v in variants for n in ROWS}
        for v in variants:  # warm up: page in
            sweep_us(xs[1], weights[v])
        for _ in range(rounds):
            for n in ROWS:
                for v in variants:
                    times[v, n].append(sweep_us(xs[n], weights[v], clock))
        for v in variants:
            us = {n: statistics.median(times[v, n]) for n in ROWS}
            nbytes = weights[v][0].nbytes()
            print(f"{name:<6} {form:<7} {v:<11}"
                  + "".join(f"{us[n]:>8.0f} ({us[n] / us[1]:4.2f})" for n in ROWS)
                  + f"{nbytes / us[1] / 1e3:>7.1f}")
            rows += [{"kernel": "int8dot", "layer": name, "out": out, "in": n_in, "form": form,
                      "variant": v, "threads": args.threads,
                      "clock": "cpu" if args.cpu_time else "wall", "rows": n, "us": us[n],
                      "ratio_to_1_row": us[n] / us[1], "weight_bytes": nbytes,
                      "gmacs": n * out * n_in / us[n] / 1e3, "copies": len(weights[v])}
                     for n in ROWS]
        del weights
    return rows


# ------------------------------------------------------------------------------- f32dot

def median_us(call, copies: int, rounds: int) -> float:
    """Median over rounds of the us per call of a sweep over `copies` weights, after one."""
    for j in range(copies):
        call(j)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for j in range(copies):
            call(j)
        times.append((time.perf_counter() - started) / copies * 1e6)
    return statistics.median(times)


def run_f32dot(args: argparse.Namespace) -> list[dict]:
    rounds = args.rounds or 20
    g = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads, {rounds} rounds; us per call (weights GB/s)")
    rows = []
    for name, (out, n_in) in FLOAT_SHAPES.items():
        copies = 1 if out > 10000 else 8
        weights = [torch.randn(out, n_in, generator=g) for _ in range(copies)]
        panels = [f32dot.FloatPanels(w) for w in weights]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, fastpath.PACK_ROWS_HINT)
                  for w in weights]
        for n in FLOAT_ROWS:
            x = torch.randn(n, n_in, generator=g)
            ours = median_us(lambda j: f32dot.linear(x, panels[j]), copies, rounds)
            theirs = median_us(lambda j: torch.ops.mkldnn._linear_pointwise(
                x, onednn[j], None, "none", [], ""), copies, rounds)
            kb = out * n_in * 4 / 1e3
            print(f"{out}x{n_in} {n} rows: f32dot {ours:7.1f} us ({kb / ours:4.1f} GB/s), "
                  f"oneDNN {theirs:7.1f} us ({kb / theirs:4.1f} GB/s), ratio {ours / theirs:.2f}")
            rows.append({"kernel": "f32dot", "layer": name, "out": out, "in": n_in,
                         "threads": args.threads, "rows": n, "us": ours, "onednn_us": theirs,
                         "ratio_to_onednn": ours / theirs, "weight_bytes": out * n_in * 4,
                         "copies": copies})
    return rows


# ------------------------------------------------------------------------------- roof

def run_roof(args: argparse.Namespace, ap: argparse.ArgumentParser) -> list[dict]:
    variants = [v for v in args.variants.split(",") if v]
    if not set(variants) <= set(build.runnable()):
        ap.error(f"--variants: choose from those this CPU runs ({', '.join(build.runnable())})")
    rounds, iters = args.rounds or 7, 20_000_000
    rows = []
    for v in variants:
        gmacs = roof.gmacs(v, args.threads, rounds, iters)
        print(f"{v}: {gmacs:.0f} GMAC/s at {args.threads} threads (median of {rounds})")
        rows.append({"kernel": "roof", "variant": v, "threads": args.threads, "gmacs": gmacs,
                     "rounds": rounds, "chain_steps": iters})
    return rows


# ------------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=["int8dot", "f32dot", "roof"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per cell (default 7 for int8dot, 20 for f32dot)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels.jsonl"),
                    help="append the rows here")
    add_machine_option(ap)
    g = ap.add_argument_group("int8dot and roof")
    g.add_argument("--variants", default="avx2,avx512vnni",
                   help="comma-separated, of those this CPU runs")
    g.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    g.add_argument("--forms", default="",
                   help=f"comma-separated weight forms of {', '.join(FORMS)} (default: all)")
    g.add_argument("--cpu-time", action="store_true",
                   help="time the thread's CPU time (with --threads 1)")
    return ap


@torch.no_grad()
def main() -> None:
    ap = parser()
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = {"int8dot": run_int8dot, "roof": run_roof}.get(args.kernel)
    rows = run(args, ap) if run else run_f32dot(args)
    base = {"run": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": args.machine, "cpu": build.cpu_model()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.writelines(json.dumps({**base, **row}) + "\n" for row in rows)
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
