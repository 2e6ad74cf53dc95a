"""specq's int8dot kernel variants side by side at the real Qwen2.5-Coder-1.5B layer shapes: time
per call at 1, 2, 4, 8 and 16 rows (a decode step and verify passes), the ratio to 1 row, and the
weight bytes streamed per second at 1 row.

Each layer is timed over enough copies of its weight that they do not fit in the last-level cache
(a decode step reads every weight from memory once), the variants alternated round by round so
that a busy machine slows them alike; each cell is the median over rounds. With one thread,
`--cpu-time` times the calling thread's CPU time instead of the wall clock: a machine busy with
other work then deschedules the kernel without counting it (caches and memory stay shared).

    python benchmarks/bench_int8dot.py [--threads 2] [--rounds 7] [--variants avx2,avx512vnni]
        [--layers w13,head] [--forms q6-g16,q8-g16] [--cpu-time] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from specq.kernels import build, int8dot

HIDDEN = 1536
SHAPES = {"wqkv": (2048, HIDDEN), "wo": (HIDDEN, HIDDEN), "w13": (17920, HIDDEN), "w2": (HIDDEN, 8960),
          "head": (151936, HIDDEN)}  # name: (out, in)
FORMS = {"q4-g32": (4, 32, True, False), "q6-g16": (6, 16, False, False), "q6-g32": (6, 32, False, False),
         "q8-g16": (8, 16, False, False), "q8-g32": (8, 32, False, False),
         "q4_k": (4, 32, True, True), "q5_k": (6, 32, True, True), "q6_k": (6, 16, False, True)}
# name: (bits, group, offsets, two-level scales as GGUF's K-quants keep them)
LAYERS = [(name, form) for name in SHAPES for form in FORMS
          if name != "head" or form in ("q6-g16", "q6_k")]  # the head is Q6_K
ROWS = (1, 2, 4, 8, 16)
STREAM_BYTES = 160 * 2**20  # at least this many weight bytes per timed sweep: 5x a 32 MiB L3


def weight(out: int, n_in: int, bits: int, group: int, offsets: bool, two_level: bool, variants: list[str],
           g: torch.Generator) -> dict[str, int8dot.Int8DotWeight]:
    """Random codes and scales of one layer, in each variant's layout."""
    if bits == 4:
        codes = torch.randint(0, 16, (out, n_in), generator=g, dtype=torch.uint8)
    else:
        low = -(1 << (bits - 1))
        codes = torch.randint(low, -low, (out, n_in), generator=g, dtype=torch.int8)
    if two_level:  # a float32 per 256 inputs times an int8 per group
        supers = (torch.rand(out, n_in // int8dot.SUPER, generator=g) * 1e-3 for _ in range(2))
        subs = (torch.randint(0, 64, (out, n_in // group), generator=g, dtype=torch.int8) for _ in range(2))
        (d, m), (sub_d, sub_m) = supers, subs
        return {v: int8dot.pack_two_level(bits, codes, d, m if offsets else None, sub_d, sub_m if offsets else None,
                                          int8dot.SUPER_SHIFT, v) for v in variants}
    scale = torch.rand(out, n_in // group, generator=g) * 0.02
    offset = -8 * scale if bits == 4 else torch.randn(out, n_in // group, generator=g) * 1e-3 if offsets else None
    return {v: int8dot.PACKS[bits](codes, scale, offset, variant=v) for v in variants}


def layer_copies(name: str, form: str, variants: list[str], g: torch.Generator, stream_bytes: int = STREAM_BYTES
                 ) -> dict[str, list[int8dot.Int8DotWeight]]:
    """Per variant, enough random copies of one layer that a sweep over them streams at least
    `stream_bytes` from memory (a decode step reads every weight from memory once)."""
    (out, n_in), (bits, group, offsets, two_level) = SHAPES[name], FORMS[form]
    copies = [weight(out, n_in, bits, group, offsets, two_level, variants, g)]
    copies += [weight(out, n_in, bits, group, offsets, two_level, variants, g)
               for _ in range(math.ceil(stream_bytes / copies[0][variants[0]].nbytes()) - 1)]
    return {v: [c[v] for c in copies] for v in variants}


def sweep_us(x: torch.Tensor, weights: list[int8dot.Int8DotWeight], clock=time.perf_counter) -> float:
    """Microseconds per call of one sweep over every copy."""
    started = clock()
    for w in weights:
        int8dot.linear(x, w)
    return (clock() - started) / len(weights) * 1e6


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", default="avx2,avx512vnni", help="comma-separated, of those this CPU runs")
    ap.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    ap.add_argument("--forms", default="", help=f"comma-separated weight forms of {', '.join(FORMS)} (default: all)")
    ap.add_argument("--cpu-time", action="store_true", help="time the thread's CPU time (with --threads 1)")
    ap.add_argument("--out", help="append one JSON row per cell to this file")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time times the calling thread only: use it with --threads 1")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    variants = args.variants.split(",")
    if not set(variants) <= set(build.runnable()):
        ap.error(f"--variants: choose from those this CPU runs ({', '.join(build.runnable())})")
    layers = [(name, form) for name, form in LAYERS if (not args.layers or name in args.layers.split(","))
              and (not args.forms or form in args.forms.split(","))]
    if not layers:
        ap.error(f"--layers, --forms: choose from {', '.join(SHAPES)} and {', '.join(FORMS)}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads, {args.rounds} rounds, {'CPU' if args.cpu_time else 'wall'} time; "
          "us per call (x the 1-row time), GB/s of weights at 1 row")
    print(f"{'layer':<6} {'form':<7} {'variant':<11}" + "".join(f"{r:>15}" for r in ROWS) + f"{'GB/s':>7}")
    rows_out = []
    for name, form in layers:
        out, n_in = SHAPES[name]
        weights = layer_copies(name, form, variants, g)
        xs = {rows: torch.randn(rows, n_in, generator=g) for rows in ROWS}
        times = {(v, rows): [] for v in variants for rows in ROWS}
        for v in variants:  # warm up: page in
            sweep_us(xs[1], weights[v])
        for _ in range(args.rounds):
            for rows in ROWS:
                for v in variants:
                    times[v, rows].append(sweep_us(xs[rows], weights[v], clock))
        for v in variants:
            us = {rows: statistics.median(times[v, rows]) for rows in ROWS}
            nbytes = weights[v][0].nbytes()
            gbs = nbytes / us[1] / 1e3
            print(f"{name:<6} {form:<7} {v:<11}" + "".join(f"{us[r]:>8.0f} ({us[r] / us[1]:4.2f})" for r in ROWS)
                  + f"{gbs:>7.1f}")
            rows_out += [{"layer": name, "out": out, "in": n_in, "form": form, "variant": v, "threads": args.threads,
                          "clock": "cpu" if args.cpu_time else "wall", "rows": r, "us": us[r],
                          "ratio_to_1_row": us[r] / us[1], "weight_bytes": nbytes, "copies": len(weights[v])}
                         for r in ROWS]
        del weights
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows_out)


if __name__ == "__main__":
    main()
