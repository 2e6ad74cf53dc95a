"""Regenerate the generated parts of docs/reference.md from specq itself, so the reference cannot
drift from the code: every CLI flag (from the argparse parsers), the bench config keys, the GGUF
types read, the server's metrics.

A generated part sits between two markers; the first names its kind:

    <!-- reference: flags generate -->     a list of one command's flags (`flags drafts add`)
    <!-- reference: gguf-formats -->       the GGUF types specq reads, and what it runs them as
    <!-- reference: metrics -->            the Prometheus metrics of `specq serve`
    ...
    <!-- /reference -->

`flags bench` is the bench config: every key is also a flag, with its TOML type and default.

    python benchmarks/reference_tables.py            # rewrite the generated parts
    python benchmarks/reference_tables.py --check    # exit 1, with a diff, when one is stale

tests/test_reference_doc.py checks the same document against the parsers without this script.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
BLOCK = re.compile(r"(<!-- reference: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /reference -->)",
                   re.DOTALL)

# What a flag without a help string of its own means (the same wherever it appears)
UNHELPED = {
    "--max-new-tokens": "tokens to generate at most",
    "--top-k": "sample from the k most likely tokens only (0: off)",
    "--top-p": "sample from the most likely tokens holding this probability mass (1: off)",
    "--seed": "random seed",
    "--threads": "torch CPU threads (default: torch's own count)",
    "--json": "print one JSON object",
    "--temperature": "temperature of both models' distributions, in (0, 100]",
    "--lr": "peak learning rate",
    "--gamma": "draft length of the held-out speculative runs that measure acceptance",
    "--batch": "sequences per training step",
    "--checkpoint-every": "steps between checkpoints",
}


@functools.cache
def commands() -> dict[str, argparse.ArgumentParser]:
    """Every leaf command of `specq` by its words ("generate", "drafts add")."""
    os.environ.pop("SPECQ_API_KEY", None)  # --api-key's default reads it: keep a key out of the doc
    from specq.cli import build_parser, leaf_commands

    return leaf_commands(build_parser())


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = (argparse._HelpAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


def _text(text: str) -> str:
    """Help text as one line of Markdown: `|` and `*` escaped (a table cell, emphasis)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("*", "\\*")


def _value(action: argparse.Action) -> str:
    """What follows a flag: its metavar, repeated as nargs says; nothing for a switch."""
    if action.nargs == 0:
        return ""
    choices = "{" + ",".join(action.choices) + "}" if action.choices else None
    name = action.metavar or choices or action.dest.upper()
    return {"+": f" {name} ...", "*": f" [{name} ...]"}.get(action.nargs, f" {name}")


def _default(value) -> str:
    """`, default X` for a flag that has one worth saying (not a switch's off, not none)."""
    if value is None or value is False or value == []:
        return ""
    if value is True:
        return ", default on"
    shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return f", default `{shown}`"


def _flags(action: argparse.Action) -> str:
    return ", ".join(f"**`{s}`**" for s in action.option_strings)


def flags_list(command: str, parser: argparse.ArgumentParser) -> str:
    """One line per flag, in the parser's order: `- **`--flag`** VALUE, default `D`: meaning`."""
    if command == "bench":
        return bench_list(parser)
    lines = []
    for a in options(parser):
        if a.option_strings:  # a help that states its default says it better
            told = "default" in (a.help or "")
            head = _flags(a) + _value(a) + ("" if told else _default(a.default))
        else:
            head = f"**`{a.metavar or a.dest}`** ({'argument' if a.nargs is None else 'optional'})"
        meaning = a.help or UNHELPED.get(a.option_strings[0] if a.option_strings else "", "")
        lines.append(f"- {head}: {_text(meaning)}")
    return "\n".join(lines)


def bench_list(parser: argparse.ArgumentParser) -> str:
    """`specq bench`: each config key as its TOML key and its flag, with its type and default."""
    from specq.bench.config import LIST_KEYS, BenchConfig

    defaults = BenchConfig().to_dict()
    lines = []
    for a in options(parser):
        key = a.dest
        if key in defaults:
            listed = LIST_KEYS.get(key)
            scalar = "str" if defaults[key] is None else type(defaults[key]).__name__  # a path
            kind = f"list of {listed.__name__}" if listed else scalar
            kind += ' or "auto"' if key == "gamma" else ""
            default = ", default off" if defaults[key] is False else _default(defaults[key])
            head = f"**`{key}`** / {_flags(a)} ({kind}{default})"
        elif a.option_strings:
            head = f"{_flags(a)} (flag only)"
        else:
            head = f"**`{key}`** (optional)"
        lines.append(f"- {head}: {_text(a.help)}")
    from specq.bench.config import FILE_ONLY, HELP

    for key in sorted(FILE_ONLY):  # the file's alone (a list of tables)
        lines.append(f"- **`{key}`** (file only, list of tables): {_text(HELP[key])}")
    return "\n".join(lines)


def gguf_formats_table() -> str:
    """Each GGUF type specq reads: its bits a weight in the file, and what specq's kernels run."""
    from specq.weights.gguf_formats import FORMATS

    lines = ["| GGUF type | bits a weight in the file | runs as |", "|---|---|---|"]
    for f in FORMATS.values():
        bits = f"{f.type_size * 8 / f.block_size:.4g}"
        if f.floats is not None:
            runs = "float32 rows" + ("" if f.name == "F32" else " (converted at load)")
        else:
            codes = "indices into a grid of values" if f.grid is not None else \
                "codes with offsets" if f.offsets else "signed codes"
            levels = ", two-level scales" if f.two_level else ""
            runs = f"{f.bits}-bit {codes}, a scale per {f.group_size}{levels}"
        lines.append(f"| {f.name} | {bits} | {runs} |")
    return "\n".join(lines)


def metrics_table() -> str:
    """The metrics `/metrics` exposes, as Prometheus names them (a counter's `_total`)."""
    from prometheus_client.metrics import MetricWrapperBase

    from specq.serve.metrics import Metrics

    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in vars(Metrics()).values():
        if isinstance(m, MetricWrapperBase):
            name = m._name + ("_total" if m._type == "counter" else "")
            labels = ", ".join(m._labelnames)
            lines.append(f"| `{name}` | {m._type} | {labels} | {_text(m._documentation)} |")
    return "\n".join(lines)


def render(spec: str) -> str:
    kind, *words = spec.split()
    if kind == "flags":
        command = " ".join(words)
        if command not in commands():
            raise SystemExit(f"reference part '{spec}': no command '{command}' "
                             f"(commands: {', '.join(commands())})")
        return flags_list(command, commands()[command])
    if kind == "gguf-formats":
        return gguf_formats_table()
    if kind == "metrics":
        return metrics_table()
    raise SystemExit(f"reference part '{spec}': unknown kind {kind!r} "
                     "(flags, gguf-formats or metrics)")


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("spec")) + "\n" + m.group(4), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report a stale part and exit 1")
    args = ap.parse_args()
    old = REFERENCE.read_text()
    new = regenerate(old)
    if new == old:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                   "docs/reference.md", "regenerated"))
        print("\ndocs/reference.md is stale: run python benchmarks/reference_tables.py")
        return 1
    REFERENCE.write_text(new)
    print("rewrote the generated parts of docs/reference.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
