"""Cheaper Qwen2.5-Coder-0.5B drafts for the 1.5B Q4_K_M target: acceptance and draft step cost of
each draft precision (`loading/file_spec.py`), greedy, on the bench's code and edit prompts.

    python benchmarks/bench_coder_drafts.py [--drafts gguf,gguf-head32k,...] [--prompts 4] [--threads 2]
    python benchmarks/bench_coder_drafts.py --summary   # a Markdown table of --out

Acceptance (tau = emitted tokens per verify pass, acceptance rate = accepted / drafted) is
deterministic given the files, so it can be measured on a busy machine; the step times (`step`
rows: the draft's 1-token step at a 128-token context, median of --calls) and tok/s are only
meaningful on a quiet one. Every speculative output is checked against the target's plain output.
Rows append to --out (JSONL; a (draft, set, prompt, gamma) already there is skipped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import specq
from specq.bench.coding import CODE_TASKS, EDIT_TASKS

TARGET = "qwen2.5-coder-1.5b"
DRAFT = "qwen2.5-coder-0.5b"
SETS = {"code": CODE_TASKS, "edit": EDIT_TASKS}


def step_ms(model, calls: int, context: int = 128) -> float:
    """Median ms of a 1-token cached step after `context` tokens."""
    cache = model.net.new_cache(context + calls + 1)
    with torch.inference_mode():
        model.net(torch.arange(context) % 1000, cache)
        times = []
        for i in range(calls):
            start = time.perf_counter()
            model.net(torch.tensor([i + 7]), cache, last_only=True)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafts", default="gguf,gguf-head32k,gguf-int4,gguf-int4-head32k")
    parser.add_argument("--prompts", type=int, default=4, help="the first N prompts of each set")
    parser.add_argument("--gammas", default="2,4")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30, help="1-token steps timed per model")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/coder-drafts.jsonl"))
    parser.add_argument("--summary", action="store_true", help="print a table of --out and exit")
    args = parser.parse_args()
    if args.summary:
        return summary(args.out)
    torch.set_num_threads(args.threads)
    done = set()
    if args.out.exists():
        done = {(r["draft"], r["set"], r["prompt"], r["gamma"]) for r in map(json.loads, args.out.read_text().splitlines())
                if r["kind"] == "run"}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(row: dict) -> None:
        with args.out.open("a") as f:
            f.write(json.dumps({"threads": args.threads, "loadavg_1min": round(_loadavg(), 2), **row}) + "\n")

    target = specq.load(TARGET)
    write({"kind": "step", "model": TARGET, "ms": step_ms(target, args.calls)})
    plain = {}
    for spec in args.drafts.split(","):
        started = time.perf_counter()
        draft = specq.load(f"{DRAFT}@{spec}")
        write({"kind": "load", "model": f"{DRAFT}@{spec}", "s": time.perf_counter() - started})
        write({"kind": "step", "model": f"{DRAFT}@{spec}", "ms": step_ms(draft, args.calls)})
        for name, tasks in SETS.items():
            for i, prompt in enumerate(tasks[:args.prompts]):
                for gamma in map(int, args.gammas.split(",")):
                    if (spec, name, i, gamma) in done:
                        continue
                    if (name, i) not in plain:
                        plain[name, i] = specq.generate(target, prompt, max_new_tokens=args.tokens, chat=True).token_ids
                    out = specq.generate(target, prompt, draft, gamma=gamma, max_new_tokens=args.tokens, chat=True,
                                         draft_confidence=0.0)
                    s = out.stats
                    write({"kind": "run", "draft": spec, "set": name, "prompt": i, "gamma": gamma,
                           "same_as_plain": out.token_ids == plain[name, i], "new_tokens": s.new_tokens,
                           "steps": s.steps, "drafted": s.drafted, "accepted": s.accepted, "emitted": s.emitted,
                           "tau": s.emitted / max(s.steps, 1), "acceptance": s.accepted / max(s.drafted, 1),
                           "draft_s": s.draft_s, "verify_s": s.verify_s, "decode_s": s.decode_s})
        del draft


def summary(path: Path) -> None:
    """Per draft and gamma: tau and acceptance pooled over the runs of each prompt set, the draft's
    step, and whether every output was the target's."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    steps = {r["model"].rpartition("@")[2]: r["ms"] for r in rows if r["kind"] == "step" and "@" in r["model"]}
    runs = [r for r in rows if r["kind"] == "run"]
    print("| draft | gamma | set | runs | tau | acceptance | same as plain | draft step ms | draft ms per drafted token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted({(r["draft"], r["gamma"], r["set"]) for r in runs}, key=lambda k: (k[1], k[2], k[0])):
        group = [r for r in runs if (r["draft"], r["gamma"], r["set"]) == key]
        tau = sum(r["emitted"] for r in group) / sum(r["steps"] for r in group)
        rate = sum(r["accepted"] for r in group) / sum(r["drafted"] for r in group)
        same = all(r["same_as_plain"] for r in group)
        per_token = statistics.median(1000 * r["draft_s"] / r["drafted"] for r in group)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {len(group)} | {tau:.2f} | {rate:.3f} | {same} | "
              f"{steps.get(key[0], float('nan')):.1f} | {per_token:.1f} |")


def _loadavg() -> float:
    import os

    return os.getloadavg()[0]


if __name__ == "__main__":
    main()
