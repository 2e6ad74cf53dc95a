"""Condensed tables of a sweep results file for docs/benchmarks.md: paired speedup and tau per
(target, draft) against gamma, and per output length.

    python benchmarks/sweep_tables.py docs/results/sweep.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specq.bench import store
from specq.bench.aggregate import summarize
from specq.core.gamma import sort_key as gamma_order
from specq.loading.refs import split_window


def draft_label(row: dict) -> str:
    stop = f", stop {row['draft_confidence']}" if row.get("draft_confidence") else ""  # early-stop threshold
    tree = f", tree {row['tree']} k{row['tree_topk']}" if row.get("tree") else ""  # a token tree: gamma is its depth
    levels = row["draft"].split(",")  # more than one: a hierarchy, cheapest level first
    precisions = ([split_window(level)[0].rpartition("@")[2] if "@" in level else None for level in levels]
                  if len(levels) > 1
                  else [row["draft_precision"]])  # None: an n-gram lookup, no model and no precision
    target = row["target"].split("@")[0]
    return " > ".join(_level_label(level, p, target) for level, p in zip(levels, precisions)) + stop + tree


def _level_label(level: str, precision: str | None, target: str) -> str:
    """A draft level's kind, precision and window (`MODEL:window=W`)."""
    model, window = split_window(level)
    return _kind(model, target) + (f" @{precision}" if precision else "") + (f", window {window}" if window else "")


def _kind(draft: str, target: str) -> str:
    name = Path(draft.split("@")[0]).name
    return "self" if name == target else {
        "smollm2-135m-draft": "seq", "smollm2-135m-draft-int4-g64-rtn": "seq, int4-cal",
        "smollm2-135m-feature": "feature", "smollm2-135m-feature-draft": "feature",
        "draft-s4": "feature, stage 4"}.get(name, name)


def cell(ci, with_ci: bool = False) -> str:
    if not ci:
        return "-"
    return f"{ci[0]:.2f} [{ci[1]:.2f}, {ci[2]:.2f}]" if with_ci and ci[1] != ci[2] else f"{ci[0]:.2f}"


def pivot(rows: list[dict], column: str, columns: list, value: str, title: str, with_ci: bool = False) -> str:
    keyed: dict[tuple, dict] = {}
    for r in rows:
        keyed.setdefault((r["target_precision"], draft_label(r)), {})[r[column]] = r
    head = "| target | draft | " + " | ".join(f"{column} {c}" for c in columns) + " |"
    lines = [f"**{title}**", "", head, "|" + "---|" * (len(columns) + 2)]
    order = ["fp32", "bf16", "int8", "int4", "int3", "int2"]
    rank = lambda key: (next((i for i, p in enumerate(order) if key[0].startswith(p)), 9), key[1])  # noqa: E731
    for (target, draft), by in sorted(keyed.items(), key=lambda kv: rank(kv[0])):
        best = max((c for c in columns if c in by and by[c]["speedup"]), default=None,
                   key=lambda c: by[c]["speedup"][0]) if value == "speedup" else None
        vals = []
        for c in columns:
            text = cell(by.get(c, {}).get(value), with_ci)
            vals.append(f"**{text}**" if c == best else text)
        lines.append(f"| {target} | {draft} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--tokens", type=int, default=64, help="output length of the gamma tables")
    ap.add_argument("--gamma", type=int, default=2, help="gamma of the length table")
    args = ap.parse_args()
    rows = [r for r in summarize(store.read(args.results)) if r["kind"] == "speculative"]
    at_len = [r for r in rows if r["max_new_tokens"] == args.tokens]
    gammas = sorted({r["gamma"] for r in at_len}, key=gamma_order)  # 1, 2, ..., then "auto"
    print(pivot(at_len, "gamma", gammas, "speedup", f"Paired speedup over the target alone, {args.tokens} tokens "
                "(best gamma in bold)"))
    print()
    print(pivot(at_len, "gamma", gammas, "tau", f"tau (tokens per target pass), {args.tokens} tokens"))
    print()
    at_gamma = [r for r in rows if r["gamma"] == args.gamma]
    lengths = sorted({r["max_new_tokens"] for r in at_gamma})
    print(pivot(at_gamma, "max_new_tokens", lengths, "speedup", f"Paired speedup by output length, gamma {args.gamma}"))
    print()
    print(pivot(at_gamma, "max_new_tokens", lengths, "tau", f"tau by output length, gamma {args.gamma}"))


if __name__ == "__main__":
    main()
