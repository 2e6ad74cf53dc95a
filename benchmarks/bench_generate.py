"""specq vs Hugging Face transformers on the built-in pair, measured side by side in one run.

For each prompt and output length, interleaved (so machine noise hits every row alike):
  hf-plain      transformers generate(), greedy, target alone
  hf-assisted   transformers generate(assistant_model=draft), greedy, num_assistant_tokens=gamma
  specq-plain   specq, target alone
  specq-spec    specq speculative, gamma draft tokens per step
Every run generates exactly N new tokens (EOS ignored) after one untimed warm-up per row.
Speedups are per prompt, then averaged. Usage:
  python benchmarks/bench_generate.py [--tokens 128 256] [--gamma 4] [--repeats 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import statistics
import sys
import time

import torch

import specq
from specq.loading.builtins import BUILTINS
from specq.loading.drafts import default_draft_ref

PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "List five tips for staying productive when working from home.",
    "What is the difference between a list and a tuple in Python?",
]


def hf_models(target: specq.Model, draft: specq.Model):
    from transformers import AutoModelForCausalLM

    hf_target = AutoModelForCausalLM.from_pretrained(BUILTINS["smollm2-135m"](), dtype=torch.float32).eval()
    if draft.source.startswith("truncated"):
        hf_draft = copy.deepcopy(hf_target)
        hf_draft.model.layers = hf_draft.model.layers[: draft.net.config.num_layers]
        hf_draft.config.num_hidden_layers = draft.net.config.num_layers
    else:
        hf_draft = AutoModelForCausalLM.from_pretrained(draft.source, dtype=torch.float32).eval()
    return hf_target, hf_draft


def truncated_draft(target: specq.Model, layers: int = 4) -> specq.Model:
    net = copy.deepcopy(target.net)
    net.layers = net.layers[:layers]
    net.config = dataclasses.replace(net.config, num_layers=layers)
    return specq.Model(ref=f"smollm2-135m-first{layers}layers", net=net, tokenizer=target.tokenizer,
                       eos_ids=target.eos_ids, source=f"truncated target ({layers} layers)")


def hf_generate(model, ids, n, assistant=None, gamma=4, confidence=0.0):
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    kwargs = {}
    if assistant is not None:
        assistant.generation_config.num_assistant_tokens = gamma
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        # 0.0 turns the stop off; None would mean transformers' default (0.4)
        assistant.generation_config.assistant_confidence_threshold = confidence
        kwargs["assistant_model"] = assistant
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), generation_config=cfg, **kwargs)
    elapsed = time.perf_counter() - started
    return out[0, len(ids):].tolist(), elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--draft-confidence", type=float, default=0.0,
                    help="early draft stop below this draft probability, for both specq (draft_confidence) and "
                         "transformers (assistant_confidence_threshold); 0 = off (transformers' own default is 0.4)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--json", default=None, help="also write the raw rows here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    target = specq.load("smollm2-135m")
    draft_ref = default_draft_ref("smollm2-135m")
    draft = specq.load(draft_ref) if draft_ref else truncated_draft(target)
    hf_target, hf_draft = hf_models(target, draft)
    prompts = [specq.api.encode_prompt(target, p, chat=True) for p in PROMPTS[: args.prompts]]

    rows = {name: {} for name in ("hf-plain", "hf-assisted", "specq-plain", "specq-spec")}
    runs = {
        "hf-plain": lambda ids, n: hf_generate(hf_target, ids, n),
        "hf-assisted": lambda ids, n: hf_generate(hf_target, ids, n, hf_draft, args.gamma, args.draft_confidence),
        "specq-plain": lambda ids, n: _specq(target, None, ids, n, args.gamma),
        "specq-spec": lambda ids, n: _specq(target, draft, ids, n, args.gamma, args.draft_confidence),
    }
    for name, run in runs.items():  # warm-up, untimed
        run(prompts[0], 8)
    extra = {}
    for n in args.tokens:
        for i, ids in enumerate(prompts):
            for _ in range(args.repeats):
                outputs = {}
                for name, run in runs.items():
                    tokens, elapsed, *more = run(ids, n)
                    rows[name].setdefault((n, i), []).append(n / elapsed)
                    outputs[name] = tokens
                    if more:
                        extra.setdefault((n, i), []).append(more[0])
                same = outputs["specq-spec"] == outputs["specq-plain"]
                if not same:
                    print(f"LOSSLESS VIOLATION: prompt {i}, {n} tokens", file=sys.stderr)
                    sys.exit(1)
                agree = outputs["specq-plain"] == outputs["hf-plain"]
                print(f"n={n} prompt={i} " + " ".join(f"{k}={rows[k][(n, i)][-1]:.1f}" for k in rows)
                      + f" tok/s; specq==hf greedy: {agree}", file=sys.stderr, flush=True)

    print(f"\nmachine: {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
          f"threads {args.threads}, specq {specq.__version__}")
    print(f"target: smollm2-135m fp32 | draft: {draft.ref} ({draft.source}) | gamma {args.gamma} | "
          f"greedy, chat prompts: {len(prompts)}, repeats {args.repeats}, draft confidence stop "
          f"{args.draft_confidence} (both specq and transformers)\n")
    print("| new tokens | hf plain tok/s | hf assisted tok/s | specq plain tok/s | specq spec tok/s "
          "| specq spec / hf assisted | specq plain / hf plain | specq spec / specq plain | tau | accept rate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.tokens:
        keys = [(n, i) for i in range(len(prompts))]
        mean = {k: statistics.mean(statistics.mean(rows[k][key]) for key in keys) for k in rows}

        def ratio(a, b):
            return statistics.mean(statistics.mean(rows[a][key]) / statistics.mean(rows[b][key]) for key in keys)

        taus = [s.tau for key in keys for s in extra[key]]
        acc = [s.acceptance_rate for key in keys for s in extra[key]]
        print(f"| {n} | {mean['hf-plain']:.1f} | {mean['hf-assisted']:.1f} | {mean['specq-plain']:.1f} | "
              f"{mean['specq-spec']:.1f} | {ratio('specq-spec', 'hf-assisted'):.2f}x | "
              f"{ratio('specq-plain', 'hf-plain'):.2f}x | {ratio('specq-spec', 'specq-plain'):.2f}x | "
              f"{statistics.mean(taus):.2f} | {statistics.mean(acc):.2f} |")
    if args.json:
        specq.atomic.write_text(args.json, json.dumps({f"{k}|{n}|{i}": v for k, d in rows.items()
                                                       for (n, i), v in d.items()}, indent=1))


def _specq(target, draft, ids, n, gamma, draft_confidence=0.0):
    started = time.perf_counter()  # the whole call, as for transformers
    out = specq.generate(target, ids, draft, gamma=gamma, max_new_tokens=n, ignore_eos=True,
                         draft_confidence=draft_confidence)
    elapsed = time.perf_counter() - started
    if draft is None:
        return out.token_ids, elapsed
    return out.token_ids, elapsed, out.stats


if __name__ == "__main__":
    main()
