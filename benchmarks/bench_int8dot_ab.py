"""Two builds of int8dot.c side by side in one process: the same weights, the same inputs, calls
alternated sweep by sweep, so that a shared machine's drift falls on both alike. Why: a kernel
change worth a few percent is smaller than this VM's drift between two runs of `bench_int8dot.py`.

Build each side from its source first (only `linear_a8` is called), for example the committed
kernel against a changed one:

    git show HEAD:src/specq/kernels/int8dot.c > /tmp/a/int8dot.c   # and panel.h beside it
    cc -O3 -fopenmp -ffp-contract=off -fPIC -shared -mavx2 -mfma -mf16c -mavx512f -mavx512bw \\
       -mavx512vl -mavx512dq -mavx512vnni /tmp/a/int8dot.c -o /tmp/a.so -lm
    python benchmarks/bench_int8dot_ab.py /tmp/a.so /tmp/b.so --variant avx512vnni --threads 1 \\
       --rows 1,8 --layers w13,w2 --forms q4_k,q6_k --rounds 40

`--stream-mib` sets the weight bytes each sweep streams (default 160 MiB; on a machine whose
last-level cache is larger, several times that cache, so that the weights come from memory).

Both sides must lay weights out alike (same panel widths) for `--variant`'s packing. With one
thread the clock is the thread's CPU time. Prints, per layer, form and row count, the median
microseconds of each side, the paired median of B/A and the ratio of the two sides' fastest sweeps.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

from specq.kernels import int8dot

from bench_int8dot import SHAPES, STREAM_BYTES, layer_copies


def sweep_us(lib: ctypes.CDLL, x: torch.Tensor, y: torch.Tensor, weights: list[int8dot.Int8DotWeight],
             threads: int, clock) -> float:
    """Microseconds per call of one sweep over every copy, on `lib`."""
    started = clock()
    for w in weights:
        if lib.linear_a8(w.bits, x.data_ptr(), x.shape[0], *w._shape, *w.pointers, w.super_shift, y.data_ptr(),
                         threads):
            raise MemoryError("int8dot: out of memory")
    return (clock() - started) / len(weights) * 1e6


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", help="shared object A (int8dot.c built as above)")
    ap.add_argument("b", help="shared object B")
    ap.add_argument("--variant", default="avx512vnni", help="the variant whose layout both sides take")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--layers", default="w13,w2")
    ap.add_argument("--forms", default="q4_k,q6_k")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--stream-mib", type=int, default=STREAM_BYTES >> 20,
                    help="weight bytes per sweep, in MiB: several times the machine's last-level cache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    libs = [int8dot.bind(ctypes.CDLL(path)) for path in (args.a, args.b)]
    g = torch.Generator().manual_seed(0)
    for name in args.layers.split(","):
        for form in args.forms.split(","):
            out, n_in = SHAPES[name]
            copies = layer_copies(name, form, [args.variant], g, args.stream_mib << 20)[args.variant]
            for rows in map(int, args.rows.split(",")):
                x, y = torch.randn(rows, n_in, generator=g), torch.empty(rows, out)
                for lib in libs:  # page in, warm up
                    sweep_us(lib, x, y, copies, args.threads, clock)
                times: list[list[float]] = [[], []]
                for r in range(args.rounds):
                    for side in (0, 1) if r % 2 == 0 else (1, 0):
                        times[side].append(sweep_us(libs[side], x, y, copies, args.threads, clock))
                paired = statistics.median(b / a for a, b in zip(*times))
                print(f"{name} {form} rows {rows}: A {statistics.median(times[0]):.0f} us, "
                      f"B {statistics.median(times[1]):.0f} us, B/A paired median {paired:.3f}, "
                      f"fastest B/A {min(times[1]) / min(times[0]):.3f}")


if __name__ == "__main__":
    main()
