"""Two commits of specq side by side: plain and speculative tokens/s of the built-in target (or
timed forward passes), each commit in its own process, alternated round by round (old, new, new,
old, old, new, ...: which commit goes first flips every round), so both see the same machine.
Checks that a change meant to leave behaviour alone (a refactor) left speed alone too.

    python benchmarks/bench_versions.py --old b5eb22f [--new HEAD] [--rounds 3] [--tokens 128]
        [--prompts 4] [--threads 2] [--configs "fp32 plain,gguf plain"] [--file PATH]
        [--passes 1,8 --contexts 128,1024 --calls 9] [--out benchmarks/results/versions-speed.jsonl]
    python benchmarks/bench_versions.py --table benchmarks/results/versions-speed.jsonl

Results: one JSON row per (commit, round, configuration) written to `--out` (replacing it;
default benchmarks/results/versions-speed.jsonl), each with the machine (`cpu`, `threads`), the
command and the date; prints, per configuration, the median over rounds of new/old paired by
round, end to end and for the prefill and decode times apart
(`specq.bench.tools.versions.summary`).

`--configs` picks configurations by name (default: the built-in target's, all but the coder
pair's). `--file PATH` adds two of a GGUF file of the user's: "file plain" and "file draft" (with
the coder pair's registered draft, for a file of the 1.5B's architecture and tokenizer).

With `--passes 1,8 --contexts 128,1024,2048` each configuration's target is timed instead on
single cached forward passes of that many rows after that many tokens of context (the median of
`--calls` passes, the cache cropped back after each), one row per (rows, context) named like
"coder plain, 8 rows at 1024", with passes/s in place of tokens/s and each row's top token in
place of the generated ids: what a change to the attention or the kernels does to a verify pass.

Each commit is checked out once into a git worktree under $SPECQ_CACHE/versions (its kernels
build into the shared kernel cache like any checkout's); one short untimed child per commit
first builds its kernels and fills its caches outside the rounds. A child process per (commit,
round) loads every configuration, in an order rotated by one every round (so no configuration is
always the first a fresh process times), runs one untimed warm-up, then greedy decoding of
`--tokens` new tokens (EOS ignored) on each chat prompt, and prints one JSON line per
configuration with its tokens/s (new tokens over decode wall time, prefill included), the prefill
and decode seconds its stats recorded, and the token ids (which must be equal across commits).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from specq import data
from specq.bench.tools.versions import (CONFIGS, DEFAULT_CONFIGS, RATES, file_configs, rate_key,
                                        summary)
from specq.kernels import build

ROOT = Path(__file__).resolve().parent.parent
GAMMA = 2

# The children run in each commit's worktree: they use only what every commit's API has.
CHILD = r"""
import json, sys, time, torch
import specq
torch.set_num_threads(int(sys.argv[1]))
tokens, prompts, configs = int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
loaded = {}
def model(ref):
    if ref not in loaded:
        loaded[ref] = specq.load(ref)
    return loaded[ref]
for name, target_ref, draft_ref in configs:
    target = model(target_ref)
    draft = None if draft_ref is None else model(draft_ref)
    run = lambda p: specq.generate(target, p, draft, gamma=%d, max_new_tokens=tokens,
                                   ignore_eos=True, chat=True)
    run(prompts[0])
    new, seconds, prefill, decode, ids = 0, 0.0, 0.0, 0.0, []
    for p in prompts:
        began = time.perf_counter()
        out = run(p)
        seconds += time.perf_counter() - began
        prefill, decode = prefill + out.stats.prefill_s, decode + out.stats.decode_s
        new += len(out.token_ids)
        ids.append(out.token_ids)
    print(json.dumps({"config": name, "tokens_per_s": new / seconds, "prefill_s": prefill,
                      "decode_s": decode, "new_tokens": new, "ids": ids}), flush=True)
""" % GAMMA

PASS_CHILD = r"""
import json, statistics, sys, time, torch
import specq
torch.set_num_threads(int(sys.argv[1]))
calls, passes = int(sys.argv[2]), json.loads(sys.argv[3])
contexts, configs = json.loads(sys.argv[4]), json.loads(sys.argv[5])
for name, target_ref, _ in configs:
    model = specq.load(target_ref)
    net = getattr(model, 'runner', None) or model.net  # a runner from 57868df on
    ids = torch.randint(100, 20000, (max(contexts) + max(passes),),
                        generator=torch.Generator().manual_seed(0))
    for context in contexts:
        cache = net.new_cache(context + max(passes))
        with torch.inference_mode():
            net(ids[:context], cache)
            for rows in passes:
                times = []
                for _ in range(calls + 1):  # the first untimed
                    began = time.perf_counter()
                    logits = net(ids[context:context + rows], cache)
                    times.append(time.perf_counter() - began)
                    cache.crop(context)
                top = logits.reshape(rows, -1).argmax(-1).tolist()
                ms = statistics.median(times[1:]) * 1000
                config = f"{name}, {rows} row{'s' * (rows > 1)} at {context}"
                print(json.dumps({"config": config, "passes_per_s": 1000 / ms, "ms": ms,
                                  "ids": top}), flush=True)
"""


def checkout(rev: str) -> tuple[str, Path]:
    """(full commit id, a worktree of it), created once."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    cache = Path(os.environ.get("SPECQ_CACHE", Path.home() / ".cache" / "specq"))
    tree = cache / "versions" / commit[:12]
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT,
                       check=True, capture_output=True)
    return commit, tree


def child(tree: Path, args: argparse.Namespace, texts: list[str], rotate: int = 0) -> list[dict]:
    """The rows one child process at `tree` prints: every chosen configuration, in turn."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    chosen = [c for c in CONFIGS + file_configs(args.file) if c[0] in args.configs]
    shift = rotate % len(chosen)
    configs = [list(c) for c in chosen[shift:] + chosen[:shift]]
    if args.passes:
        command = [PASS_CHILD, str(args.threads), str(args.calls), json.dumps(args.passes),
                   json.dumps(args.contexts)]
    else:
        command = [CHILD, str(args.threads), str(args.tokens), json.dumps(texts)]
    done = subprocess.run([sys.executable, "-c", *command, json.dumps(configs)], env=env,
                          cwd=tree, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the child at {tree} failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", help="the commit to compare against (required unless --table)")
    p.add_argument("--new", default="HEAD")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="configurations by name, comma-separated, of: "
                        f"{', '.join(c[0] for c in CONFIGS)}")
    p.add_argument("--passes", default="",
                   help="rows per timed forward pass, comma-separated (instead of generating)")
    p.add_argument("--contexts", default="128,1024",
                   help="with --passes: tokens of context before each pass")
    p.add_argument("--calls", type=int, default=9,
                   help="with --passes: timed passes per measurement (median)")
    p.add_argument("--file", type=Path,
                   help='a GGUF file: adds the configurations "file plain" and "file draft"')
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/versions-speed.jsonl")
    p.add_argument("--table", type=Path, default=None,
                   help="print the summary of a results file and exit")
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    if args.table:
        print(summary([json.loads(line) for line in args.table.read_text().splitlines()
                       if line.strip()]))
        return
    if args.old is None:
        p.error("--old is required")
    args.configs = args.configs.split(",")
    args.passes = [int(n) for n in args.passes.split(",") if n]
    args.contexts = [int(n) for n in args.contexts.split(",")]
    unknown = set(args.configs) - {c[0] for c in CONFIGS + file_configs(args.file)}
    if unknown:
        p.error(f"unknown configurations: {', '.join(sorted(unknown))}")
    texts = data.chat_prompts("held_out")[:args.prompts]
    commits = {label: checkout(rev) for label, rev in (("old", args.old), ("new", args.new))}
    command = "python benchmarks/bench_versions.py " + " ".join(sys.argv[1:])
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    warm = argparse.Namespace(**{**vars(args), "tokens": 8, "calls": 1, "contexts": [8]})
    for commit, tree in commits.values():  # builds its kernels, fills its caches: outside rounds
        child(tree, warm, texts[:1])
    rows = []
    for r in range(args.rounds):
        order = list(commits.items()) if r % 2 == 0 else list(commits.items())[::-1]
        for label, (commit, tree) in order:
            for out in child(tree, args, texts, rotate=r):
                rows.append({"round": r, "version": label, "commit": commit[:12], **out,
                             "threads": args.threads, "tokens": args.tokens,
                             "prompts": args.prompts, "gamma": GAMMA, "command": command,
                             "date": stamp, "cpu": build.cpu_model()})
                key = rate_key(out)
                print(f"round {r} {label:3} {out['config']:32} {out[key]:7.1f} {RATES[key]}",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(args.out)
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
