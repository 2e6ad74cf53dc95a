"""Plain greedy decoding of the built-in target, one implementation per process, so neither
run shares a process (allocator, caches) with the other. Run it twice, alternating:

    for i in 1 2; do python benchmarks/bench_plain_solo.py specq; python benchmarks/bench_plain_solo.py hf; done
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specq
from specq.models import BUILTINS

PROMPTS = ["Explain in three sentences why the sky is blue.", "Write a short story about a robot who learns to paint.",
           "List five tips for staying productive when working from home."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("implementation", choices=["specq", "hf"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specq.load("smollm2-135m")
    prompts = [specq.api.encode_prompt(target, p, chat=True) for p in PROMPTS]
    if args.implementation == "hf":
        from transformers import AutoModelForCausalLM, GenerationConfig

        hf = AutoModelForCausalLM.from_pretrained(BUILTINS["smollm2-135m"](), dtype=torch.float32).eval()
        del target
        config = GenerationConfig(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)

        def run(ids):
            with torch.inference_mode():
                hf.generate(torch.tensor([ids]), generation_config=config)
    else:
        def run(ids):
            specq.generate(target, ids, max_new_tokens=args.tokens, ignore_eos=True)
    run(prompts[0][:8])  # warm-up
    rates = []
    for ids in prompts:
        started = time.perf_counter()
        run(ids)
        rates.append(args.tokens / (time.perf_counter() - started))
    print(f"{args.implementation}: {statistics.mean(rates):.2f} tok/s (per prompt: "
          f"{', '.join(f'{r:.1f}' for r in rates)}), {args.tokens} tokens, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
