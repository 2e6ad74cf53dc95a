"""The results store: a JSONL file, one record per line, appended as each cell finishes.

Each append is one write of one line, flushed and fsynced, so a crash or kill loses at most the
line being written. A torn last line (no newline, or not valid JSON) after valid records is
ignored on read and cut off before the next append, so resuming never glues a new record onto a
broken one; a file that is not a results file is refused by `read` and never modified. Records:
{"type": "run", ...} once per invocation that runs cells (config, machine, versions), and
{"type": "cell", "key": ..., ...} per finished cell, and {"type": "quality", "key": ..., ...} per
target precision's held-out quality (`heldout.py`); the first record of a key wins.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path

from ..core.stats import DecodeStats
from ..errors import SpecqError


def read(path: Path | str, complete: bool = False) -> list[dict]:
    """The records of a results file; every line a JSON object, and with `complete` a run or
    cell record holding the fields the tables and the report use."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if number == len(lines) and records:  # torn last line: the write that was cut short
                break
            raise SpecqError(f"results file {path}: line {number} is not valid JSON") from None
        problem = _problem(record, complete)
        if problem:
            raise SpecqError(f"results file {path}: line {number} {problem}")
        records.append(record)
    return records


# the fields readers use, per record type (a record may hold more)
FIELDS = {"run": {"run_id": str, "started": str, "config": dict, "environment": dict},
          "cell": {"key": str, "cell": dict, "target": dict},
          "quality": {"key": str, "target": dict, "reference": dict, "result": dict}}
CELL_FIELDS = ("kind", "target", "draft", "gamma", "max_new_tokens", "temperature", "threads",
               "set", "repeats")
RUN_FIELDS = ("set", "prompt", "repeat", "token_ids", "text", "stats")


def _problem(record, complete: bool) -> str | None:
    """What makes a parsed line unusable as a record, or None."""
    if not isinstance(record, dict):
        return f"is not a JSON object but {type(record).__name__}"
    if not complete:
        return None
    kind = record.get("type")
    if kind not in FIELDS:
        return f"has an unknown record type {kind!r} (expected {', '.join(map(repr, FIELDS))})"
    for name, type_ in FIELDS[kind].items():
        if not isinstance(record.get(name), type_):
            return f"({kind} record): field '{name}' is missing or not a {type_.__name__}"
    if kind == "run":
        for name in RUN_CONFIG_NUMBERS:  # the report's defaults
            if name in record["config"] and not _number(record["config"][name]):
                value = json.dumps(record["config"][name])
                return f"(run record): config.{name} is {value}, not a number"
    if kind == "cell":
        if not isinstance(record.get("runs", [] if "skipped" in record else None), list):
            return "(cell record): field 'runs' is missing or not a list"
        missing = [f for f in CELL_FIELDS if f not in record["cell"]]
        missing += [f"runs[].{f}" for f in RUN_FIELDS if any(not isinstance(r, dict) or f not in r
                                                            for r in record.get("runs", []))]
        if missing:
            return f"(cell record): missing field '{missing[0]}'"
        problem = _cell_problem(record)
        if problem:
            return f"(cell record): {problem}: a row without its data"
        for i, run in enumerate(record.get("runs", [])):
            problem = _run_problem(run)
            if problem:
                return f"(cell record): runs[{i}].{problem}: a row without its data"
    if kind == "quality":
        result = record["result"]
        for name in ("tokens", "chunks"):
            if not _number(result.get(name)):
                value = json.dumps(result.get(name))
                return f"(quality record): result.{name} is {value}, not a number"
        triples = [*QUALITY_NUMBERS, *(k for k, v in result.items() if isinstance(v, dict))]
        for name in dict.fromkeys(triples):
            value = result.get(name)
            if not (isinstance(value, dict)
                    and all(_number(value.get(k)) for k in ("mean", "low", "high"))):
                return f"(quality record): result.{name} is not a mean, low and high number each"
    return None


# numbers a run record's config may hold, read by `specq report` as its defaults
RUN_CONFIG_NUMBERS = ("resamples", "confidence", "seed")
# a cell's parameters the tables read: numbers always, or numbers where given (None: not given)
CELL_NUMBERS = ("max_new_tokens", "temperature", "threads", "repeats")
CELL_OPTIONAL_NUMBERS = ("draft_confidence", "tree", "tree_topk", "n_prompts", "seed")


def _cell_problem(record: dict) -> str | None:
    """What makes a cell's own numbers unusable (its parameters, its prefill times), or None."""
    params = record["cell"]
    for name in CELL_NUMBERS:
        if not _number(params[name]):
            return f"cell.{name} is {json.dumps(params[name])}, not a number"
    for name in CELL_OPTIONAL_NUMBERS:
        if params.get(name) is not None and not _number(params[name]):
            return f"cell.{name} is {json.dumps(params[name])}, not a number"
    # a number, "auto", or none on a baseline (no draft) and on a server that sets its own
    gamma = params["gamma"]
    unset = params["kind"] == "baseline" or params.get("engine") == "openai"
    if not (_number(gamma) or gamma == "auto" or gamma is None and unset):
        return f"cell.gamma is {json.dumps(gamma)}, not a number or \"auto\""
    prefill = record.get("prefill_ms", {})
    if not isinstance(prefill, dict):
        return "prefill_ms is not an object"
    for side, times in prefill.items():  # per model: its prefill times
        if not (isinstance(times, list) and all(map(_number, times))):
            return f"prefill_ms.{side} is not a list of numbers"
    return None


# the quality table's columns (`aggregate.heldout_rows`)
QUALITY_NUMBERS = ("ppl_b", "top1", "kl_ab")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _run_problem(run: dict) -> str | None:
    """What makes one generation of a cell unusable (a null number, a token that is not an id), or
    None: the tables compare token ids and add up the stats, so each must be what it says."""
    if not isinstance(run["token_ids"], list) or not all(isinstance(t, int)
                                                         and not isinstance(t, bool)
                                                         for t in run["token_ids"]):
        return "token_ids is not a list of token ids"
    if not isinstance(run["text"], str):
        return "text is not a string"
    for key in ("prompt", "repeat"):
        if not _number(run[key]):
            return f"{key} is {json.dumps(run[key])}, not a number"
    for key in ("stats", "paired_stats"):
        # only paired cells time a plain run beside each
        if key not in run and key == "paired_stats":
            continue
        stats = run[key]
        if not isinstance(stats, dict):
            return f"{key} is not an object"
        for f in fields(DecodeStats):
            value, counts = stats.get(f.name), f.type == "list[int]"
            if f.name == "routes":  # per route, counts (results written before it have none)
                if value is not None and not (isinstance(value, dict) and all(
                        isinstance(c, dict) and all(map(_number, c.values()))
                        for c in value.values())):
                    return f"{key}.routes is {json.dumps(value)}, not counts per route"
                continue
            if not (isinstance(value, list) and all(map(_number, value))
                    if counts else _number(value)):
                return (f"{key}.{f.name} is {json.dumps(value)}, not "
                        f"{'a list of numbers' if counts else 'a number'}")
    return None


def cells(records: list[dict]) -> dict[str, dict]:
    """Finished cells by key (first wins)."""
    out: dict[str, dict] = {}
    for r in records:
        if r.get("type") == "cell":
            out.setdefault(r["key"], r)
    return out


def repair(path: Path | str) -> None:
    """Cut a torn last line off, so the next append starts on a fresh line; call it only on a file
    that `read` accepted."""
    path = Path(path)
    if not path.is_file():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    if tail.strip():
        try:
            json.loads(tail)
        except (json.JSONDecodeError, UnicodeDecodeError):
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            return
        with open(path, "ab") as f:  # a complete record missing only its newline
            f.write(b"\n")
            os.fsync(f.fileno())


def append(path: Path | str, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
