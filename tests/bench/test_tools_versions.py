"""Two commits side by side (benchmarks/bench_versions.py, through specq.bench.tools.versions):
the summary gives generation rows in tokens/s and timed passes in passes/s; a user's file runs
plain and with the coder pair's registered draft."""

from pathlib import Path

from specq.bench.tools import versions


def _rows(key: str, old: list[float], new: list[float], ids_new: list[int]) -> list[dict]:
    rows = []
    for r, (o, n) in enumerate(zip(old, new)):
        rows.append({"round": r, "version": "old", "commit": "aaaa", "config": "c", key: o,
                     "ids": [1, 2]})
        rows.append({"round": r, "version": "new", "commit": "bbbb", "config": "c", key: n,
                     "ids": ids_new})
    return rows


def test_generation_rows_are_summarised_in_tokens_per_second():
    rows = _rows("tokens_per_s", [10.0, 20.0, 10.0], [20.0, 30.0, 10.0], [1, 2])
    table = versions.summary(rows)
    assert "old (aaaa) tok/s" in table.splitlines()[0]
    assert "| c | 10.0 | 20.0 | 1.500 [1.000, 2.000] |  |  | yes |" in table


def test_timed_passes_are_summarised_in_passes_per_second_and_compare_top_tokens():
    rows = _rows("passes_per_s", [10.0, 10.0, 10.0], [12.0, 11.0, 13.0], [1, 3])
    table = versions.summary(rows)
    assert "new (bbbb) passes/s" in table.splitlines()[0]
    assert "| c | 10.0 | 12.0 | 1.200 [1.100, 1.300] |  |  | no |" in table


def test_a_users_file_runs_plain_and_with_the_coder_pairs_registered_draft():
    from specq.bench.config import registry_draft

    assert versions.file_configs(None) == []
    plain, draft = versions.file_configs(Path("/models/coder-1.5b-q2_k.gguf"))
    assert plain == ("file plain", "/models/coder-1.5b-q2_k.gguf", None)
    assert draft[:2] == ("file draft", "/models/coder-1.5b-q2_k.gguf")
    assert draft[2] == registry_draft("qwen2.5-coder-1.5b")
