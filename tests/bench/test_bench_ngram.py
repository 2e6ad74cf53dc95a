"""N-gram drafts in bench sweeps: one cell per k, no trees or peer cells for a
lookup alone, lossless."""

import pytest
from test_bench import bench, prompt_sets, summary

from specq.bench import aggregate, tables
from specq.bench.config import plan, validate
from specq.errors import SpecqError

from conftest import perturbed, tiny_model


def test_bench_plans_ngram_cells():
    config = validate({"targets": ["tiny"], "drafts": ["ngram", "ngram:k=6+draft", "draft"],
                       "gamma": [1, 2, "auto"], "draft_quant": ["fp32"], "tree": [0, 4],
                       "draft_confidence": [0.0, 0.4], "peer": True, "threads": [1],
                       "prompt_sets": ["chat"]})
    cells, notes = plan(config, prompt_sets())
    spec = [c for c in cells if c.kind == "speculative"]
    alone = [c for c in spec if c.draft == "ngram:n=2-3:k=4:c=16"]
    assert sorted(str(c.gamma) for c in alone) == ["16", "auto"]  # a fixed gamma: its k or c
    assert all(c.draft_confidence is None and not c.tree for c in alone)
    both = [c for c in spec if c.draft == "ngram:n=2-3:k=6:c=16+draft@fp32"]
    assert len(both) == 3 * 2 + 3 * 1  # chains at each gamma and confidence, trees at each gamma
    assert not [c for c in cells if c.kind == "peer" and c.draft.startswith("ngram")]
    assert [c for c in cells if c.kind == "peer" and c.draft == "draft@fp32"]
    assert any("n-gram drafts" in note for note in notes)
    with pytest.raises(SpecqError, match="bench config 'drafts': draft 'ngram:k=0'"):
        validate({"drafts": ["ngram:k=0"]})


def test_bench_plans_windowed_drafts_alone_and_as_fallbacks():
    """`MODEL:window=W` in a sweep keeps its window through the precision,
    alone and after ngram+."""
    config = validate({"targets": ["tiny"],
                       "drafts": ["draft@fp32:window=8", "ngram+draft:window=16", "draft"],
                       "gamma": [2], "threads": [1], "prompt_sets": ["chat"]})
    drafts = {c.draft for c in plan(config, prompt_sets())[0] if c.kind == "speculative"}
    assert drafts == {"draft@fp32:window=8", "ngram:n=2-3:k=4:c=16+draft@fp32:window=16",
                      "draft@fp32"}
    with pytest.raises(SpecqError, match="bench config 'drafts'"):
        validate({"drafts": ["draft@int4-nope:window=8"]})
    with pytest.raises(SpecqError, match="window"):
        validate({"drafts": ["draft:window=0"]})


def test_bench_runs_ngram_cells_losslessly(pair, tmp_path):
    config = validate({"targets": ["tiny"], "drafts": ["ngram", "ngram+draft"], "gamma": [2],
                       "max_new_tokens": [12], "prompt_sets": ["chat"], "threads": [1],
                       "results": str(tmp_path / "r.jsonl"), "resamples": 200})
    records = bench(config, pair)
    rows = [r for r in summary(records) if r["kind"] == "speculative"]
    assert {r["draft"] for r in rows} == {"ngram:n=2-3:k=4:c=16", "ngram:n=2-3:k=4:c=16+draft@fp32"}
    assert all(not r["mismatches"] and r["unchecked"] == 0 for r in rows)
    assert {r["draft_precision"] for r in rows} == {None, "fp32"}
    assert {tables.short_draft(r) for r in rows} == {"ngram:n=2-3:k=4:c=16",
                                                     "ngram:n=2-3:k=4:c=16+draft"}
    assert aggregate.failures(rows) == []


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(scale=3.0, ref="tiny@fp32")
    return {"tiny@fp32": target, "draft@fp32": perturbed(target, 0.05, ref="draft@fp32")}
