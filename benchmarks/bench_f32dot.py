"""specq's f32dot against oneDNN's packed GEMM (the fast path's float kernel before it) on the
built-in target's float32 layer shapes, side by side in one process: microseconds per call at 1,
4 and 8 rows, each the median of 20 rounds over 8 copies of the weight (1 of the head), so the
weights come from memory as in a decode step.

    python benchmarks/bench_f32dot.py [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specq.backends import fastpath
from specq.kernels import f32dot

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # (out, in): wqkv, wo, w13, w2, head


def median_us(call, copies: int) -> float:
    for j in range(copies):
        call(j)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        for j in range(copies):
            call(j)
        times.append((time.perf_counter() - started) / copies * 1e6)
    return statistics.median(times)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads; us per call (weights GB/s)")
    for out, n_in in SHAPES:
        copies = 1 if out > 10000 else 8
        weights = [torch.randn(out, n_in, generator=g) for _ in range(copies)]
        panels = [f32dot.FloatPanels(w) for w in weights]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, fastpath.PACK_ROWS_HINT) for w in weights]
        for rows in (1, 4, 8):
            x = torch.randn(rows, n_in, generator=g)
            ours = median_us(lambda j: f32dot.linear(x, panels[j]), copies)
            theirs = median_us(lambda j: torch.ops.mkldnn._linear_pointwise(x, onednn[j], None, "none", [], ""), copies)
            gbs = out * n_in * 4 / 1e3
            print(f"{out}x{n_in} {rows} rows: f32dot {ours:7.1f} us ({gbs / ours:4.1f} GB/s), "
                  f"oneDNN {theirs:7.1f} us ({gbs / theirs:4.1f} GB/s), ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
