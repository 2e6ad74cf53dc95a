"""The results store: a JSONL file, one record per line, appended as each cell finishes.

Each append is one write of one line, flushed and fsynced, so a crash or kill loses at most the
line being written. A torn last line (no newline, or not valid JSON) is ignored on read and cut
off before the next append, so resuming never glues a new record onto a broken one. Records:
{"type": "run", ...} once per invocation that runs cells (config, machine, versions), and
{"type": "cell", "key": ..., ...} per finished cell, and {"type": "quality", "key": ..., ...} per
target precision's held-out quality (`heldout.py`); the first record of a key wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
            if number == len(lines):  # torn last line: the write that was cut short
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
CELL_FIELDS = ("kind", "target", "draft", "gamma", "max_new_tokens", "temperature", "threads", "set", "repeats")
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
    if kind == "cell":
        if not isinstance(record.get("runs", [] if "skipped" in record else None), list):
            return "(cell record): field 'runs' is missing or not a list"
        missing = [f for f in CELL_FIELDS if f not in record["cell"]]
        missing += [f"runs[].{f}" for f in RUN_FIELDS if any(not isinstance(r, dict) or f not in r
                                                            for r in record.get("runs", []))]
        if missing:
            return f"(cell record): missing field '{missing[0]}'"
    return None


def cells(records: list[dict]) -> dict[str, dict]:
    """Finished cells by key (first wins)."""
    out: dict[str, dict] = {}
    for r in records:
        if r.get("type") == "cell":
            out.setdefault(r["key"], r)
    return out


def repair(path: Path | str) -> None:
    """Cut a torn last line off, so the next append starts on a fresh line."""
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
