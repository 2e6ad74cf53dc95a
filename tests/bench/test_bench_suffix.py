"""The bench's `suffix_cache`: n-gram cells with and without earlier prompts' text, apart in the
plan, the store and the report; each repeat its own cache, never fed by the warm-up or the plain
runs; outputs still the target's own."""

from __future__ import annotations

import pytest
from test_bench import _cli, bench, pair, prompt_sets, summary, sweep  # noqa: F401 (fixture)

from specq import api
from specq.bench import store, tables
from specq.bench.config import plan, validate
from specq.drafters.suffix import SuffixCache
from specq.errors import SpecqError


def test_only_ngram_cells_are_crossed_with_the_cache_and_old_keys_stay():
    sets = {"chat": prompt_sets()["chat"]}
    before, _ = plan(validate({"drafts": ["ngram", "d"], "gamma": [2]}), sets)
    cells, notes = plan(validate({"drafts": ["ngram", "d"], "gamma": [2],
                                  "suffix_cache": [False, True]}), sets)
    spec = [(c.draft, c.suffix_cache) for c in cells if c.kind == "speculative"]
    default = "ngram:n=2-3:k=4:c=16"
    assert spec == [(default, False), (default, True), ("d@fp32", False)]
    assert {c.key for c in before} < {c.key for c in cells}  # results stored before still count
    assert "suffix_cache" not in cells[1].params() and cells[2].params()["suffix_cache"] is True
    assert any("only n-gram drafts read one" in n for n in notes)


def test_a_bad_value_is_one_error(tmp_path):
    with pytest.raises(SpecqError, match="'suffix_cache'"):
        sweep(tmp_path / "r.jsonl", suffix_cache=["yes"])
    with pytest.raises(SpecqError, match="--suffix-cache: expected true or false, got 'maybe'"):
        _cli(["bench", "--suffix-cache", "maybe"])


def test_each_repeat_drafts_from_its_own_earlier_prompts_only(pair, tmp_path):  # noqa: F811
    """Per call: which cache the run got. The warm-up and every plain run get none; each repeat's
    speculative runs share one, which holds exactly the earlier prompts' runs of that repeat; the
    outputs match the baseline's token for token."""
    calls = []

    def spying(target, prompt, draft=None, **kwargs):
        cache = kwargs["suffix_cache"]
        calls.append((draft is not None, cache, len(cache) if cache is not None else None))
        return api.generate(target, prompt, draft, **kwargs)

    config = sweep(tmp_path / "r.jsonl", drafts=["ngram"], gamma=["auto"], prompt_sets=["chat"],
                   suffix_cache=[True], repeats=2)
    records = bench(config, pair, generate=spying)
    spec = [(cache, held) for drafted, cache, held in calls if drafted]
    assert all(cache is None for drafted, cache, _ in calls if not drafted)
    assert spec[0][0] is None  # the warm-up
    caches = [cache for cache, _ in spec[1:]]
    assert all(isinstance(c, SuffixCache) for c in caches)
    assert len(caches) == 6 and caches[0] is not caches[1]  # 3 prompts x 2 repeats, alternating
    assert caches[0::2] == [caches[0]] * 3 and caches[1::2] == [caches[1]] * 3
    held = [h for _, h in spec[1:]]
    assert held[:2] == [0, 0] and held[2] > 0 and held[2:4] == [held[2]] * 2
    rows = summary(records)
    brief = tables.brief(rows, 0.95)
    assert [cells[2] for cells in brief.rows] == ["-", "auto +suffix"]
    assert "+suffix:" in brief.caption
    rows = [r for r in rows if r["kind"] == "speculative"]
    assert len(rows) == 1 and rows[0]["suffix_cache"] and not rows[0]["mismatches"]
    assert tables.gamma_label(rows[0]) == "auto + suffix cache"
    cell = next(c for c in store.cells(records).values() if c["cell"]["kind"] == "speculative")
    assert cell["cell"]["suffix_cache"] is True
