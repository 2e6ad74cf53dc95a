"""The built-in target at every precision: decode-step time, tokens/s, weight bytes, peak memory,
perplexity and agreement with fp32, in one run.

Speed rows are measured side by side in one process, in interleaved rounds (machine noise hits
every spec alike); peak resident memory is measured per spec in a fresh subprocess.
  python benchmarks/bench_quant.py [--specs fp32 bf16 int8 int4-g64-rtn ...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

import specq
from specq.core.stats import bootstrap_ci
from specq.training.divergence import held_out_chunks, token_divergences
from specq.weights.quant import weight_bytes

DEFAULT_SPECS = ["fp32", "bf16", "int8", "int4-g64-rtn", "int4-g64-gptq", "int4-g64-awq", "int4-g32-rtn",
                 "int3-g64-rtn", "int3-g64-gptq", "int3-g64-awq", "int2-g32-rtn", "int2-g32-gptq", "int2-g32-awq"]


def step_ms(net, n_tokens: int, context: int = 128, repeats: int = 20) -> float:
    ids = torch.randint(100, 40000, (context + n_tokens,), generator=torch.Generator().manual_seed(0))
    cache = net.new_cache(context + n_tokens + 1)
    with torch.inference_mode():
        net(ids[:context], cache)
        times = []
        for _ in range(repeats):
            cache.crop(context)
            started = time.perf_counter()
            net(ids[context:context + n_tokens], cache)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def peak_rss_mib(spec: str) -> float:
    """Load the spec and generate 32 tokens in a fresh process; its peak resident memory (VmHWM:
    ru_maxrss would include the forked parent's pages)."""
    code = ("import specq; m = specq.load('smollm2-135m@%s'); "
            "specq.generate(m, 'Hello there', max_new_tokens=32, ignore_eos=True); "
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))" % spec)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    models = {spec: specq.load(f"smollm2-135m@{spec}") for spec in args.specs}  # quantizes once, cached
    reference = models.get("fp32") or specq.load("smollm2-135m")
    chunks = held_out_chunks(reference, args.chunks, 256, n_chat=4)
    rows = {spec: {"step1": [], "step5": [], "tps": []} for spec in args.specs}
    prompt = specq.api.encode_prompt(reference, "Tell me about the history of the printing press.", chat=True)
    for spec, m in models.items():  # warm-up
        specq.generate(m, prompt, max_new_tokens=4)
    for r in range(args.rounds):
        for spec, m in models.items():
            rows[spec]["step1"].append(step_ms(m.net, 1))
            rows[spec]["step5"].append(step_ms(m.net, 5))
            out = specq.generate(m, prompt, max_new_tokens=args.tokens, ignore_eos=True)
            rows[spec]["tps"].append(out.stats.tokens_per_s)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    with torch.inference_mode():
        ref_logits = [reference.net(torch.tensor(c), None)[:-1] for c in chunks]
        for spec, m in models.items():
            nll, top1, beta = [], [], []
            for c, ref in zip(chunks, ref_logits):
                ids = torch.tensor(c)
                logits = m.net(ids, None)[:-1]
                nll.append(float(torch.nn.functional.cross_entropy(logits.double(), ids[1:])))
                d = token_divergences(ref, logits)
                top1.append(float(d["top1"].mean()))
                beta.append(float(d["beta"].mean()))
            rows[spec]["ppl"] = bootstrap_ci([float(torch.tensor(x).exp()) for x in nll])
            rows[spec]["top1"] = bootstrap_ci(top1)
            rows[spec]["beta"] = bootstrap_ci(beta)
            size = weight_bytes(m.net)
            rows[spec]["stored_mib"] = size.stored / 2**20
            rows[spec]["executed_mib"] = size.executed / 2**20
            rows[spec]["kernel"] = kernel_of(m.net)
    for spec in args.specs:
        rows[spec]["peak_rss_mib"] = peak_rss_mib(spec)

    base = statistics.median(rows[args.specs[0]]["step1"])
    print(f"\ntorch {torch.__version__}, threads {args.threads}, specq {specq.__version__}, {args.rounds} rounds, "
          f"{len(chunks)} held-out chunks ({sum(len(c) for c in chunks)} tokens)\n")
    print(f"| spec | kernel | 1-token step ms | vs {args.specs[0]} | 5-token verify / 1-token | tokens/s ({args.tokens} new) "
          "| weights stored MiB | executed MiB | peak RSS MiB | perplexity (95% CI) | top-1 agree w/ fp32 | beta vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.specs:
        r = rows[spec]
        s1, s5 = statistics.median(r["step1"]), statistics.median(r["step5"])
        p, t, b = r["ppl"], r["top1"], r["beta"]
        print(f"| {spec} | {r['kernel']} | {s1:.1f} | {base / s1:.2f}x | {s5 / s1:.2f} | "
              f"{statistics.median(r['tps']):.1f} | {r['stored_mib']:.0f} | {r['executed_mib']:.0f} | "
              f"{r['peak_rss_mib']:.0f} | {p[0]:.1f} [{p[1]:.1f}, {p[2]:.1f}] | {t[0]:.3f} | {b[0]:.3f} |")
    if args.json:
        specq.atomic.write_text(args.json, json.dumps(rows, indent=1, default=str))


def kernel_of(net) -> str:
    from specq.weights.quant import quantized_layers

    layers = quantized_layers(net)
    if not layers:
        return f"{net.dtype} dense".replace("torch.", "")
    return sorted({getattr(m, "kernel", type(m).__name__) for m in layers.values()})[0]


if __name__ == "__main__":
    main()
