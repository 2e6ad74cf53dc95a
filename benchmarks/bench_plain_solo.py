"""Plain greedy decoding of the built-in target, one implementation per process, so neither
run shares a process (allocator, caches) with the other. Run it twice, alternating:

    for i in 1 2; do python benchmarks/bench_plain_solo.py specq; python benchmarks/bench_plain_solo.py hf; done
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_generate import PROMPTS, _specq, hf_generate

import specq
from specq.loading.builtins import BUILTINS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("implementation", choices=["specq", "hf"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specq.load("smollm2-135m")
    prompts = [specq.api.encode_prompt(target, p, chat=True) for p in PROMPTS[:3]]
    if args.implementation == "hf":
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(BUILTINS["smollm2-135m"](), dtype=torch.float32).eval()
        del target

        def run(ids, n):
            return hf_generate(hf, ids, n)[1]
    else:
        def run(ids, n):
            return _specq(target, None, ids, n, gamma=1)[1]
    run(prompts[0][:8], args.tokens)  # warm-up
    rates = []
    for ids in prompts:
        rates.append(args.tokens / run(ids, args.tokens))
    print(f"{args.implementation}: {statistics.mean(rates):.2f} tok/s (per prompt: "
          f"{', '.join(f'{r:.1f}' for r in rates)}), {args.tokens} tokens, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
