"""Two commits side by side (benchmarks/bench_versions.py) apart from its timing: the
configurations both commits run, and the table of its results, paired by round."""

from __future__ import annotations

import statistics
from pathlib import Path

# (name, target ref, draft ref or None): names both commits resolve the same way
CONFIGS = [
    ("fp32 plain", "smollm2-135m", None),
    ("fp32 sequence draft", "smollm2-135m", "smollm2-135m-draft"),
    ("fp32 feature draft", "smollm2-135m", "smollm2-135m-feature-draft@int8-head8"),
    ("int4 plain", "smollm2-135m@int4-g64-rtn-head8", None),
    ("int4 feature draft", "smollm2-135m@int4-g64-rtn-head8",
     "smollm2-135m-feature-draft@int8-head8"),
    ("gguf plain", "smollm2-135m@gguf", None),
    ("coder plain", "qwen2.5-coder-1.5b", None),
    ("coder draft", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b@gguf-int4-head32k"),
]
DEFAULT_CONFIGS = [name for name, target, _ in CONFIGS if not target.startswith("qwen")]
CODER_DRAFT = CONFIGS[-1][2]
RATES = {"tokens_per_s": "tok/s", "passes_per_s": "passes/s"}


def file_configs(path: Path | None) -> list[tuple[str, str, str | None]]:
    """The configurations of a GGUF file given by path (none without one): plain, and with the
    coder pair's registered draft (for a file of the 1.5B's architecture and tokenizer)."""
    if path is None:
        return []
    return [("file plain", str(path), None), ("file draft", str(path), CODER_DRAFT)]


def rate_key(row: dict) -> str:
    """The field a row's speed is in: tokens/s of generation, or passes/s of timed passes."""
    return "tokens_per_s" if "tokens_per_s" in row else "passes_per_s"


def summary(rows: list[dict]) -> str:
    """Per configuration: median tokens/s (passes/s) of each commit over rounds, the median and
    range of the new/old ratios paired by round, the same for the prefill and decode seconds apart
    (old / new, so above 1 is the new commit faster everywhere; rows without them leave those
    cells empty), and whether every round's tokens (a pass's top tokens) were the same."""
    rounds = sorted({row["round"] for row in rows})
    commits = {row["version"]: row["commit"] for row in rows}
    key = rate_key(rows[0])
    unit = RATES[key]
    lines = [f"| configuration | old ({commits['old']}) {unit} | new ({commits['new']}) {unit} | "
             "new / old, paired by round: median [min, max] | prefill old / new | "
             "decode old / new | same tokens |",
             "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(row["config"] for row in rows):
        by = {(row["version"], row["round"]): row for row in rows if row["config"] == name}
        same = all(by["new", r]["ids"] == by["old", r]["ids"] for r in rounds)
        old = statistics.median(by["old", r][key] for r in rounds)
        new = statistics.median(by["new", r][key] for r in rounds)
        ratio = _paired(by, rounds, key, lambda o, n: n / o)
        prefill = _paired(by, rounds, "prefill_s", lambda o, n: o / n)
        decode = _paired(by, rounds, "decode_s", lambda o, n: o / n)
        lines.append(f"| {name} | {old:.1f} | {new:.1f} | {ratio} | {prefill} | {decode} | "
                     f"{'yes' if same else 'no'} |")
    return "\n".join(lines)


def _paired(by: dict, rounds: list[int], key: str, ratio) -> str:
    """'median [min, max]' of ratio(old, new) over rounds for one field, '' where a row lacks
    it."""
    if any(key not in by[v, r] for v in ("old", "new") for r in rounds):
        return ""
    values = [ratio(by["old", r][key], by["new", r][key]) for r in rounds]
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
