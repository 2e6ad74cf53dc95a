"""What a verify pass costs: one forward of n tokens (n = gamma + 1) at 128 tokens of context, for
the native module and for transformers' LlamaForCausalLM, interleaved, median of 15 per round.
Speculative decoding pays off only if the n-token pass costs little more than a 1-token step.

    python benchmarks/bench_verify.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_step import both_at_context


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, hf, ids, cache, past = both_at_context(128)
    sizes = (1, 2, 3, 5, 9)
    ms: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for n in sizes:
                ours, theirs = [], []
                for _ in range(15):
                    started = time.perf_counter()
                    target.net(ids[128:128 + n], cache)
                    ours.append(time.perf_counter() - started)
                    cache.crop(128)
                    started = time.perf_counter()
                    hf(ids[None, 128:128 + n], cache=past, use_cache=True)
                    theirs.append(time.perf_counter() - started)
                    past.crop(-n)
                ms[n].append((1000 * statistics.median(ours), 1000 * statistics.median(theirs)))
    print(f"{args.threads} thread(s); ms per forward, one value per round; cost relative to 1 token in brackets")
    print("| tokens | specq native | transformers |\n|---|---|---|")
    for n in sizes:
        rel = [(a / b, c / d) for (a, c), (b, d) in zip(ms[n], ms[1])]
        print(f"| {n} | {' / '.join(f'{a:.0f}' for a, _ in ms[n])} [{statistics.mean(r[0] for r in rel):.2f}x] | "
              f"{' / '.join(f'{b:.0f}' for _, b in ms[n])} [{statistics.mean(r[1] for r in rel):.2f}x] |")


if __name__ == "__main__":
    main()
