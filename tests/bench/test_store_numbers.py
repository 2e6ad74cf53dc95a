"""`specq report` reads numbers from a results file: every number it reads, made null (or text),
is refused in one line naming the file, the line and the field, before anything is written."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specq.bench.report import write_report
from specq.errors import SpecqError

RESULTS = Path(__file__).parent / "data" / "chains-before-trees.jsonl"
# numbers nothing in the report reads: the config as run is shown as written, the machine's
# core count and the cell's threads used are notes, a quality record's settings are not tabled
NOT_READ = {("run", "config"), ("run", "environment"), ("cell", "threads_used"),
            ("quality", "chunk_len"), ("quality", "result", "temperature")}
# numbers a cell may leave out (null): a lookup draft's early stop, a chain's tree
OPTIONAL = {("cell", "cell", "draft_confidence"), ("cell", "cell", "n_prompts"),
            ("cell", "cell", "seed")}


def _numbers(value, path=()):
    """Paths of the numbers in a record (the first item of each list: the rest are alike)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, (*path, key))
    elif isinstance(value, list) and value:
        yield from _numbers(value[0], (*path, 0))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


def _cases():
    records = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    seen = set()
    for i, record in enumerate(records):
        for path in _numbers(record):
            shape = (record["type"], *(p for p in path if isinstance(p, str)))
            kept = [k for k in NOT_READ | OPTIONAL if shape[:len(k)] == k]
            if shape not in seen and not kept:
                seen.add(shape)
                yield pytest.param(i, path, id="/".join(map(str, shape)))


@pytest.mark.parametrize("line,path", list(_cases()))
@pytest.mark.parametrize("bad", [None, "12"])
def test_a_number_made_null_or_text_is_refused_naming_its_field(tmp_path, line, path, bad):
    records = [json.loads(x) for x in RESULTS.read_text().splitlines()]
    record = copy.deepcopy(records[line])
    at = record
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = bad
    records[line] = record
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    field = next(p for p in reversed(path) if isinstance(p, str))
    with pytest.raises(SpecqError, match=f"{results}: line {line + 1} .*{field}"):
        write_report(results)
    assert not (tmp_path / "r.md").exists()


def test_the_file_as_written_is_reported(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(RESULTS.read_text())
    md, _ = write_report(results)
    assert md.is_file()
