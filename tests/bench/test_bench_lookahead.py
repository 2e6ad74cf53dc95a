"""Lookahead drafts in bench sweeps: one cell for the fixed gammas (its shape sets the depth), no
trees or peer cells, lossless."""

from test_bench import bench, prompt_sets, summary

from specq.bench import aggregate, tables
from specq.bench.config import plan, validate

from conftest import tiny_model


def test_bench_plans_lookahead_cells():
    config = validate({"targets": ["tiny"], "drafts": ["lookahead", "lookahead:w=6:g=1"],
                       "gamma": [1, 2, "auto"], "tree": [0, 4], "draft_confidence": [0.0, 0.4],
                       "peer": True, "threads": [1], "prompt_sets": ["chat"]})
    cells, notes = plan(config, prompt_sets())
    assert not [c for c in cells if c.kind == "peer"]
    default = [c for c in cells if c.draft == "lookahead:w=4:n=3:g=3"]
    assert sorted(str(c.gamma) for c in default) == ["4", "auto"]  # a fixed gamma: its depth
    assert all(c.draft_confidence is None and not c.tree for c in default)
    wide = [c for c in cells if c.draft == "lookahead:w=6:n=3:g=1"]
    assert sorted(str(c.gamma) for c in wide) == ["6", "auto"]
    assert any("lookahead drafts" in note for note in notes)
    assert not any("n-gram drafts" in note for note in notes)


def test_bench_runs_lookahead_cells_losslessly(tmp_path):
    config = validate({"targets": ["tiny"], "drafts": ["lookahead"], "gamma": [2],
                       "max_new_tokens": [12], "prompt_sets": ["chat"], "threads": [1],
                       "results": str(tmp_path / "r.jsonl"), "resamples": 200})
    records = bench(config, {"tiny@fp32": tiny_model(scale=3.0, ref="tiny@fp32")})
    rows = [r for r in summary(records) if r["kind"] == "speculative"]
    assert {r["draft"] for r in rows} == {"lookahead:w=4:n=3:g=3"}
    assert all(not r["mismatches"] and r["unchecked"] == 0 for r in rows)
    assert {tables.short_draft(r) for r in rows} == {"lookahead:w=4:n=3:g=3"}
    assert aggregate.failures(rows) == []
