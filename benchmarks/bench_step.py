"""One decode step of the native module vs transformers' LlamaForCausalLM, interleaved, and whole
`generate` calls of both: where does specq's plain decoding lose or gain time?

    python benchmarks/bench_step.py [--threads 2] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig

import specq
from specq.loading.builtins import BUILTINS


def both_at_context(context: int = 128):
    """The built-in target as specq's native module and as transformers' model, each with a
    cache already holding the same `context` random tokens, and the 200 token ids they came from."""
    target = specq.load("smollm2-135m")
    hf = AutoModelForCausalLM.from_pretrained(BUILTINS["smollm2-135m"](), dtype=torch.float32).eval()
    ids = torch.randint(100, 40000, (200,), generator=torch.Generator().manual_seed(0))
    cache, past = target.net.new_cache(512), DynamicCache(config=hf.config)
    with torch.inference_mode():
        target.net(ids[:context], cache)
        hf(ids[None, :context], cache=past, use_cache=True)
    return target, hf, ids, cache, past


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, hf, ids, cache, past = both_at_context(128)
    with torch.inference_mode():
        native, theirs = [], []
        for _ in range(40):
            cache.crop(128)
            started = time.perf_counter()
            target.net(ids[128:129], cache)
            native.append(time.perf_counter() - started)
            started = time.perf_counter()
            hf(ids[None, 128:129], cache=past, use_cache=True)
            theirs.append(time.perf_counter() - started)
            past.crop(-1)
        print(f"1-token step at 128 tokens of context, {args.threads} threads, median of 40 interleaved: "
              f"specq native {1000 * statistics.median(native):.1f} ms, transformers {1000 * statistics.median(theirs):.1f} ms")
        prompt = specq.api.encode_prompt(target, "Explain in three sentences why the sky is blue.", chat=True)
        cfg = GenerationConfig(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        for _ in range(3):
            started = time.perf_counter()
            out = specq.generate(target, prompt, max_new_tokens=args.tokens, ignore_eos=True)
            ours = time.perf_counter() - started
            started = time.perf_counter()
            hf.generate(torch.tensor([prompt]), generation_config=cfg)
            hfs = time.perf_counter() - started
            print(f"generate {args.tokens}: specq {ours:.2f} s (prefill {1000 * out.stats.prefill_s:.0f} ms, "
                  f"{1000 * out.stats.decode_s / out.stats.steps:.1f} ms/step), transformers {hfs:.2f} s")


if __name__ == "__main__":
    main()
