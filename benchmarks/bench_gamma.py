"""gamma `auto` against fixed gammas (and token trees), interleaved prompt by prompt in one process.

Why: `specq bench` runs one configuration's prompts together, one cell after another, so two
gammas are timed minutes apart on a VM whose speed drifts; each run is paired with a plain run of
its own, but the speedup itself moves with the machine's state (docs/benchmarks.md, "The
default"). Here each prompt runs plain and every gamma back to back, in an order that turns from
one prompt and round to the next, and every speculative run is divided by the plain run of the
same prompt and round. `auto` runs as users get it: its choosers carried from run to run
(`GammaMemory`, on the loaded target).

    python benchmarks/bench_gamma.py --target qwen2.5-coder-1.5b --sets chat,code,edit --out docs/results/gamma-interleaved.jsonl
    python benchmarks/bench_gamma.py --summary docs/results/gamma-interleaved.jsonl

A configuration is a gamma (a number or `auto`) or a token tree, `tree:SIZE:DEPTH:TOPK` (EAGLE-2
dynamic trees of the draft, `drafters/tree.py`; its gamma is its depth), optionally with its own
`--draft-confidence`: `auto@0.6` (the default elsewhere). With `--drafts NAME=REF,...` every
configuration runs with each of those drafts (`auto/NAME`), interleaved like the gammas, so two
drafts are compared on the same prompts, rounds and plain runs:

    python benchmarks/bench_gamma.py --gammas auto --drafts old=qwen2.5-coder-0.5b@gguf-int4-head32k,new=ADAPTER

Rows append to --out (JSONL): one per prompt, round and configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

import specq
from specq.bench.config import registry_draft
from specq.bench.prompts import load_set
from specq.core.gamma import sort_key
from specq.core.stats import bootstrap_ci
from specq.drafters.tree import TreeShape

PLAIN = "plain"


def is_tree(config) -> bool:
    return isinstance(config, str) and config.startswith("tree:")


def configs(gammas: str, drafts: list[str] = ()) -> list:
    """Plain decoding, then --gammas' configurations (whole numbers as ints), each once per named
    draft (`GAMMA/NAME`) when --drafts names some."""
    each = [int(g) if g.isdigit() else g for g in gammas.split(",")]
    return [PLAIN] + ([f"{g}/{name}" for g in each for name in drafts] if drafts else each)


def parse_drafts(text: str | None) -> dict[str, str]:
    """--drafts NAME=REF,... -> {NAME: REF}."""
    pairs = [item.partition("=") for item in (text or "").split(",") if item]
    if any(not name or not ref or "/" in name for name, _, ref in pairs):
        raise SystemExit("--drafts: NAME=REF,... (names without '/')")
    return {name: ref for name, _, ref in pairs}


def split_draft(config) -> tuple:
    """(configuration, draft name or None) of `GAMMA/NAME`."""
    if isinstance(config, str) and "/" in config:
        gamma, name = config.rsplit("/", 1)
        return (int(gamma) if gamma.isdigit() else gamma), name
    return config, None


def options(config) -> dict:
    """`specq.generate`'s draft options for a configuration."""
    if isinstance(config, str) and "@" in config:
        config, confidence = config.split("@")
        return options(int(config) if config.isdigit() else config) | {"draft_confidence": float(confidence)}
    if is_tree(config):
        size, depth, topk = map(int, config.split(":")[1:])
        return {"tree": TreeShape(size, depth, topk)}
    return {"gamma": config}


def _is_gamma(config) -> bool:
    """A plain gamma (a number or `auto`), not a tree or another confidence."""
    return isinstance(config, int) or config == "auto"


def _order(config) -> tuple:
    return (0, sort_key(config)) if _is_gamma(config) else (1, config)


def measure(target_ref: str, draft_ref: str | None, sets: list[str], prompts: int, rounds: int, gammas: list,
            tokens: int, threads: int, named: dict[str, str] | None = None):
    """Yield one row per prompt, round and configuration (`named`: the drafts of `GAMMA/NAME`)."""
    torch.set_num_threads(threads)
    draft_ref = draft_ref or registry_draft(target_ref)
    target = specq.load(target_ref)
    drafts = {name: specq.load(ref) for name, ref in (named or {None: draft_ref}).items()}
    for draft in drafts.values():
        specq.generate(target, "def f(x):", draft, max_new_tokens=16)  # first calls pay for lazy set-up: untimed
    base = {"run": datetime.now(timezone.utc).isoformat(timespec="seconds"), "target": target_ref,
            "draft": named or draft_ref, "tokens": tokens, "threads": threads, "torch": torch.__version__}
    turn = 0
    for set_name in sets:
        for r in range(rounds):
            for prompt in load_set(set_name, prompts):
                order = gammas[turn % len(gammas):] + gammas[:turn % len(gammas)]
                turn += 1
                for g in order:
                    config, name = split_draft(g)
                    out = specq.generate(target, prompt.text, None if g == PLAIN else drafts[name],
                                         **({} if g == PLAIN else options(config)), max_new_tokens=tokens,
                                         chat=prompt.chat, ignore_eos=True)
                    s = out.stats
                    yield {**base, "set": set_name, "prompt": prompt.index, "round": r, "config": g,
                           "tokens_per_s": s.new_tokens / s.decode_s, "tau": s.emitted / s.steps,
                           "token_ids": out.token_ids}


def summary(rows: list[dict]) -> str:
    """Per target and prompt set: plain tokens/s (median), then per gamma the mean of the runs'
    speedups over the plain run of the same prompt and round, with its 95% bootstrap CI (the
    best in bold), and tau. A speculative output that differs from its plain run fails."""
    gammas = sorted({r["config"] for r in rows if r["config"] != PLAIN}, key=_order)
    names = [f"gamma {g}" if _is_gamma(g) else g for g in gammas]
    lines = ["| target | prompts | plain tok/s | " + " | ".join(names) + " | "
             + " | ".join(f"tau, {n}" for n in names) + " |", "|" + "---|" * (3 + 2 * len(gammas))]
    for target, set_name in dict.fromkeys((r["target"], r["set"]) for r in rows):
        mine = [r for r in rows if (r["target"], r["set"]) == (target, set_name)]
        plain = {(r["prompt"], r["round"]): r for r in mine if r["config"] == PLAIN}
        cells, taus = {}, {}
        for g in gammas:
            runs = [r for r in mine if r["config"] == g and (r["prompt"], r["round"]) in plain]
            for r in runs:
                if r["token_ids"] != plain[(r["prompt"], r["round"])]["token_ids"]:
                    raise SystemExit(f"{target} {set_name} prompt {r['prompt']}: gamma {g} differs from plain decoding")
            cells[g] = bootstrap_ci([r["tokens_per_s"] / plain[(r["prompt"], r["round"])]["tokens_per_s"] for r in runs])
            taus[g] = statistics.mean(r["tau"] for r in runs)
        best = max(cells, key=lambda g: cells[g][0])
        shown = [("**{:.2f} [{:.2f}, {:.2f}]**" if g == best else "{:.2f} [{:.2f}, {:.2f}]").format(*cells[g])
                 for g in gammas]
        rate = statistics.median(r["tokens_per_s"] for r in plain.values())
        lines.append(f"| {target} | {set_name} ({len(plain)} runs) | {rate:.1f} | " + " | ".join(shown) + " | "
                     + " | ".join(f"{taus[g]:.2f}" for g in gammas) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default=None, help="a draft ref (default: the registry's for the target)")
    ap.add_argument("--drafts", default=None, help="NAME=REF,...: every configuration with each of these drafts")
    ap.add_argument("--sets", default="chat,code,edit", help="the bench's prompt sets, comma-separated")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per set")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gammas", default="1,2,3,auto",
                    help="configurations: gammas, auto, tree:SIZE:DEPTH:TOPK, each optionally @CONFIDENCE")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation (EOS ignored)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="append JSON rows here")
    ap.add_argument("--summary", type=Path, default=None, help="print the table of a results file and stop")
    args = ap.parse_args()
    if args.summary:
        print(summary([json.loads(line) for line in args.summary.read_text().splitlines() if line.strip()]))
        return
    rows = []
    named = parse_drafts(args.drafts)
    for row in measure(args.target, args.draft, args.sets.split(","), args.prompts, args.rounds,
                       configs(args.gammas, list(named)), args.tokens, args.threads, named or None):
        rows.append(row)
        print(row["set"], row["round"], row["prompt"], row["config"], f"{row['tokens_per_s']:.1f} tok/s", flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    print(summary(rows))


if __name__ == "__main__":
    main()
