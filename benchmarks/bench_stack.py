"""What running every layer in one C call (`kernels/decoder.Stack`) saves over calling the layer
modules one by one (the linear layers on specq's kernels, torch's ops between them: what a pass
the stack does not take runs), on the built-in target: one forward of n tokens at 128 tokens of
context, the two ways alternated, and the largest difference of their logits (float rounding).

    python benchmarks/bench_stack.py [--precisions fp32,int4-g64-rtn-head8,gguf] [--threads 2]

Prints, per precision and row count, the best of two rounds of the median of 30 calls each way.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specq

CONTEXT = 128


def median_ms(net, ids: torch.Tensor, n: int, calls: int = 30) -> tuple[float, torch.Tensor]:
    cache = net.new_cache(CONTEXT + 64)
    net(ids[:CONTEXT], cache)
    times = []
    for i in range(calls + 5):
        started = time.perf_counter()
        logits = net(ids[CONTEXT:CONTEXT + n], cache)
        if i >= 5:
            times.append((time.perf_counter() - started) * 1000)
        cache.crop(CONTEXT)
    return statistics.median(times), logits


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="fp32,int4-g64-rtn-head8,gguf")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(100, 40000, (CONTEXT + 16,), generator=torch.Generator().manual_seed(0))
    print(f"{args.threads} threads, {CONTEXT} tokens of context; ms per forward, best of 2 rounds of the median of 30")
    for spec in args.precisions.split(","):
        net = specq.load(f"smollm2-135m@{spec}").net
        stack = net.stack
        if stack is None:
            print(f"{spec}: no stack (a linear layer is not on specq's kernels)")
            continue
        for n in map(int, args.sizes.split(",")):
            ms, logits = {True: [], False: []}, {}
            for on in (False, True, False, True):
                net.stack = stack if on else None
                t, logits[on] = median_ms(net, ids, n)
                ms[on].append(t)
            net.stack = stack
            print(f"{spec} {n} tokens: modules {min(ms[False]):.2f} ms, stack {min(ms[True]):.2f} ms, "
                  f"largest logit difference {(logits[True] - logits[False]).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
