"""Cheaper Qwen2.5-Coder-0.5B drafts for the 1.5B Q4_K_M target: acceptance and draft step cost of
each draft precision (`loading/file_spec.py`), greedy, on the bench's code, edit and chat prompts.

    python benchmarks/bench_coder_drafts.py [--drafts gguf,gguf-head32k,...] [--sets code,edit] [--prompts 4] [--threads 2]
    python benchmarks/bench_coder_drafts.py --summary   # a Markdown table of --out

A `--drafts` item is a precision of the 0.5B, or a whole ref (with `@`): another model, such as the
1.5B itself at fewer bits (a draft of the target's size), or a feature draft's folder at a precision.

Acceptance (tau = emitted tokens per verify pass, acceptance rate = accepted / drafted) is
deterministic given the files, so it can be measured on a busy machine; the step times (`step`
rows: the draft's 1-token step at a 128-token context, median of --calls) and tok/s are only
meaningful on a quiet one. Every speculative output is checked against the target's plain output.
Rows append to --out (JSONL; a (draft, set, prompt, gamma, label) already there is skipped);
`--label` names what else differs between runs of one draft (e.g. the ranked list behind a narrowed
head) and is shown beside the draft.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

import specq
from specq.bench.prompts import load_set
from specq.loading import kinds

TARGET = "qwen2.5-coder-1.5b"
DRAFT = "qwen2.5-coder-0.5b"


def step_ms(model, calls: int, context: int = 128) -> float:
    """Median ms of a 1-token cached step after `context` tokens (a feature draft's rows read
    target states as well: `kinds`' rows of its kind)."""
    rows = kinds.kind_of(model).rows
    cache = model.net.new_cache(context + calls + 1)
    with torch.inference_mode():
        rows(model.net, torch.arange(context) % 1000, cache)
        times = []
        for i in range(calls):
            start = time.perf_counter()
            rows(model.net, torch.tensor([i + 7]), cache)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafts", default="gguf,gguf-head32k,gguf-int4,gguf-int4-head32k")
    parser.add_argument("--sets", default="code,edit", help="the bench's prompt sets (code, edit, chat)")
    parser.add_argument("--prompts", type=int, default=4, help="the first N prompts of each set")
    parser.add_argument("--gammas", default="2,4")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30, help="1-token steps timed per model")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/coder-drafts.jsonl"))
    parser.add_argument("--label", default="", help="recorded in every row, shown beside the draft")
    parser.add_argument("--summary", action="store_true", help="print a table of --out and exit")
    args = parser.parse_args()
    if args.summary:
        return summary(args.out)
    torch.set_num_threads(args.threads)
    done = set()
    if args.out.exists():
        done = {(r["draft"], r["set"], r["prompt"], r["gamma"], r.get("label", ""))
                for r in map(json.loads, args.out.read_text().splitlines()) if r["kind"] == "run"}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(row: dict) -> None:
        with args.out.open("a") as f:
            f.write(json.dumps({"threads": args.threads, "loadavg_1min": round(_loadavg(), 2), "label": args.label,
                                **row}) + "\n")

    target = specq.load(TARGET)
    write({"kind": "step", "model": TARGET, "ms": step_ms(target, args.calls)})
    plain = {}
    for spec in args.drafts.split(","):
        ref = spec if "@" in spec else f"{DRAFT}@{spec}"
        started = time.perf_counter()
        draft = specq.load(ref)
        write({"kind": "load", "model": ref, "s": time.perf_counter() - started})
        if kinds.kind_of(draft) is kinds.FEATURE:
            draft.net.attach(target.net)  # it looks its tokens up in the target's embedding
        write({"kind": "step", "model": ref, "ms": step_ms(draft, args.calls), "bytes": _bytes_read(draft)})
        for name in args.sets.split(","):
            for i, prompt in enumerate(p.text for p in load_set(name, args.prompts)):
                for gamma in map(int, args.gammas.split(",")):
                    if (spec, name, i, gamma, args.label) in done:
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


def _bytes_read(model) -> int:
    """The bytes of weights a step of `model` reads, as `weight_bytes` counts them, less a float
    embedding table (a step reads one row of it; a GGUF file's stays in the file, uncounted)."""
    from specq.weights.quant.apply import weight_bytes

    embedding = getattr(model.net, "tok_embeddings", None)
    tied = embedding is not None and getattr(model.net, "output", None) is not None and \
        getattr(model.net.output, "weight", None) is embedding.weight
    table = sum(p.nbytes for p in embedding.parameters()) if embedding is not None and not tied else 0
    return weight_bytes(model.net).executed - table


def _pooled_ci(group: list[dict], rounds: int = 2000) -> tuple[float, float, float]:
    """The acceptance rate pooled over the runs (accepted / drafted) and a 95% bootstrap interval
    over the runs (prompts), seeded."""
    rng = random.Random(0)
    rate = lambda g: sum(r["accepted"] for r in g) / max(1, sum(r["drafted"] for r in g))  # noqa: E731
    boot = sorted(rate([rng.choice(group) for _ in group]) for _ in range(rounds))
    return rate(group), boot[int(0.025 * rounds)], boot[int(0.975 * rounds) - 1]


def table(rows: list[dict]) -> str:
    """Per draft and gamma: tau and acceptance pooled over the runs of each prompt set (with a 95%
    bootstrap interval over prompts), the draft's step, and whether every output was the target's."""
    steps = {(r["model"], r.get("label", "")): r for r in rows if r["kind"] == "step"}
    runs = [r for r in rows if r["kind"] == "run"]
    key_of = lambda r: (r["draft"], r["gamma"], r["set"], r.get("label", ""))  # noqa: E731
    lines = ["| draft | gamma | set | runs | tau | acceptance [95% CI] | same as plain | draft step ms |",
             "|---|---|---|---|---|---|---|---|"]
    for key in sorted({key_of(r) for r in runs}, key=lambda k: (k[1], k[2], k[0], k[3])):
        group = [r for r in runs if key_of(r) == key]
        tau = sum(r["emitted"] for r in group) / sum(r["steps"] for r in group)
        rate, low, high = _pooled_ci(group)
        same = all(r["same_as_plain"] for r in group)
        step = steps.get((key[0] if "@" in key[0] else f"{DRAFT}@{key[0]}", key[3]), {})
        draft = f"{key[0]} ({key[3]})" if key[3] else key[0]
        lines.append(f"| {draft} | {key[1]} | {key[2]} | {len(group)} | {tau:.2f} | {rate:.3f} [{low:.3f}, {high:.3f}] | "
                     f"{same} | {step.get('ms', float('nan')):.1f} |")
    return "\n".join(lines)


def summary(path: Path) -> None:
    print(table([json.loads(line) for line in path.read_text().splitlines()]))


def _loadavg() -> float:
    import os

    return os.getloadavg()[0]


if __name__ == "__main__":
    main()
