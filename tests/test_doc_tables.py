"""Every generated table in the docs matches its raw results file (benchmarks/doc_tables.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import doc_tables  # noqa: E402


@pytest.mark.parametrize("path", doc_tables.DOCS, ids=lambda p: p.name)
def test_doc_tables_match_their_results(path):
    text = path.read_text()
    assert text == doc_tables.regenerate(text), f"stale table in {path.name}: run python benchmarks/doc_tables.py"


def test_a_hand_edited_table_is_caught():
    spec = "docs/results/stage4-draft.jsonl pivot value=speedup by=gamma ci=1"
    table = doc_tables.render(spec)
    assert "1.30 [1.10, 1.45]" in table  # the fp32 stage-4 draft at gamma 2 in the raw file
    edited = f"<!-- table: {spec} -->\n{table.replace('1.30 [1.10, 1.45]', '1.35 [1.10, 1.45]')}\n<!-- /table -->"
    assert doc_tables.regenerate(edited) != edited
    assert "1.30 [1.10, 1.45]" in doc_tables.regenerate(edited)


def test_the_docs_hold_generated_tables():
    assert sum(doc_tables.BLOCK.search(p.read_text()) is not None for p in doc_tables.DOCS) >= 1


def test_the_readme_holds_one_generated_results_table():
    """The README's one results table (specq beside llama.cpp on the coder pair) is a block of a raw
    results file, regenerated and checked like the docs' tables: a hand-edited number is put back."""
    blocks = list(doc_tables.BLOCK.finditer((doc_tables.ROOT / "README.md").read_text()))
    assert [m.group("spec").split()[1] for m in blocks] == ["llamacpp"]
    spec = blocks[0].group("spec")
    table = doc_tables.render(spec)
    row = table.splitlines()[2]  # the first measurement
    cells = row.split(" | ")
    assert len(table.splitlines()) > 3 and len(cells) == 5
    cells[3] = "999.9 ms"  # specq's figure
    edited = f"<!-- table: {spec} -->\n{table.replace(row, ' | '.join(cells))}\n<!-- /table -->"
    assert doc_tables.regenerate(edited) == f"<!-- table: {spec} -->\n{table}\n<!-- /table -->"
