"""The results store: a JSONL file, one record per line, appended as each cell finishes.

Each append is one write of one line, flushed and fsynced, so a crash or kill loses at most the
line being written. A torn last line (no newline, or not valid JSON) is ignored on read and cut
off before the next append, so resuming never glues a new record onto a broken one. Records:
{"type": "run", ...} once per invocation that runs cells (config, machine, versions), and
{"type": "cell", "key": ..., ...} per finished cell; the first record of a key wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecqError


def read(path: Path | str) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if number == len(lines):  # torn last line: the write that was cut short
                break
            raise SpecqError(f"results file {path}: line {number} is not valid JSON") from None
    return records


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
