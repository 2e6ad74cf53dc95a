"""The user docs stay true of the CLI: docs/reference.md lists every flag of every command, every
bench config key, every GGUF type specq reads and every server metric, and nothing that is gone
(checked against src/; benchmarks/reference_tables.py writes those parts, this test does not use
it); the example commands of the README and docs/guide.md parse, and the paths they name exist."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from specq.bench.config import BenchConfig
from specq.cli import build_parser, leaf_commands
from specq.serve.metrics import Metrics
from specq.weights.gguf_formats import FORMATS

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
USER_DOCS = ["README.md", "docs/guide.md", "docs/reference.md"]
BLOCK = re.compile(r"<!-- reference: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /reference -->",
                   re.DOTALL)
NAMED = re.compile(r"\*\*`([^`]+)`\*\*")  # a listed flag or argument: **`--target`**
REGENERATE = "run python benchmarks/reference_tables.py"


def blocks() -> dict[str, str]:
    return {m.group("spec"): m.group("body") for m in BLOCK.finditer(REFERENCE.read_text())}


@pytest.fixture
def commands(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    """Every leaf command by its words ("generate", "drafts add")."""
    monkeypatch.delenv("SPECQ_API_KEY", raising=False)  # --api-key's default
    return leaf_commands(build_parser())


def names(parser: argparse.ArgumentParser) -> set[str]:
    """A command's flags and arguments as the reference names them."""
    out = set()
    for a in parser._actions:
        if not isinstance(a, argparse._HelpAction):
            out |= set(a.option_strings) or {a.metavar or a.dest}
    return out


def listed(body: str) -> set[str]:
    return {name for line in body.splitlines() if line.startswith("- ")
            for name in NAMED.findall(line)}


def test_every_command_has_its_flags_listed_and_only_those(commands):
    found = blocks()
    missing = {f"flags {c}" for c in commands} - set(found)
    assert not missing, f"no flags list for {sorted(missing)}: {REGENERATE}"
    for command, parser in commands.items():
        keys = set(BenchConfig().to_dict()) if command == "bench" else set()
        expected, got = names(parser) | keys, listed(found[f"flags {command}"])
        assert got == expected, (f"specq {command}: missing {sorted(expected - got)}, "
                                 f"gone {sorted(got - expected)}: {REGENERATE}")


def test_each_flag_line_states_its_default(commands):
    """A flag with a number or word as its default says it in its line (a changed default shows)."""
    found = blocks()
    for command, parser in commands.items():
        lines = found[f"flags {command}"].splitlines()
        defaults = BenchConfig().to_dict() if command == "bench" else {}
        for a in parser._actions:
            default = defaults.get(a.dest, a.default)
            unstated = default in (None, [], argparse.SUPPRESS) or isinstance(default, bool)
            if not a.option_strings or unstated:
                continue
            line = next(line for line in lines if f"**`{a.option_strings[0]}`**" in line)
            for value in default if isinstance(default, (list, tuple)) else [default]:
                shown = str(value) in line or isinstance(value, float) and f"{value:g}" in line
                assert shown, f"specq {command} {a.option_strings[0]}: no default {value}: {line}"


def test_a_missing_flag_is_found(commands):
    """The check can fail: a reference without one of generate's flags is caught."""
    body = blocks()["flags generate"]
    dropped = "\n".join(line for line in body.splitlines() if "**`--tree-topk`**" not in line)
    assert names(commands["generate"]) - listed(dropped) == {"--tree-topk"}


def test_every_gguf_type_is_listed():
    rows = blocks()["gguf-formats"].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == list(FORMATS)


def test_every_metric_is_listed():
    rows = blocks()["metrics"].splitlines()[2:]
    expected = {m._name + ("_total" if m._type == "counter" else "")
                for m in vars(Metrics()).values() if isinstance(m, MetricWrapperBase)}
    assert {row.split("`")[1] for row in rows} == expected


@pytest.mark.parametrize("path", USER_DOCS)
def test_paths_the_user_docs_name_exist(path):
    """Every repository path a user doc names in backticks (src/, tests/, benchmarks/, docs/)."""
    text = (ROOT / path).read_text()
    named = set(re.findall(r"`((?:src|tests|benchmarks|docs)/[\w./-]+)`", text))
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []


def command_lines(text: str) -> list[str]:
    """The `specq ...` lines of a doc's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = (line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines())
    return [line for line in lines if line.startswith("specq ")]


@pytest.mark.parametrize("path", USER_DOCS)
def test_the_command_lines_of_the_user_docs_parse(path, monkeypatch):
    """Each example command is one the CLI takes (a renamed or dropped flag fails here)."""
    monkeypatch.delenv("SPECQ_API_KEY", raising=False)
    lines = command_lines((ROOT / path).read_text())
    for line in lines:
        build_parser().parse_args(shlex.split(line, comments=True)[1:])  # a bad one raises
    assert lines or path == "docs/reference.md"


def test_a_command_line_with_an_unknown_flag_fails():
    text = "```bash\nspecq generate hello \\\n    --no-such-flag 3   # a comment\n```\n"
    [line] = command_lines(text)
    with pytest.raises(Exception, match="no-such-flag"):
        build_parser().parse_args(shlex.split(line, comments=True)[1:])
