"""Projected speculation from results files (specq.bench.tools.projection, for
benchmarks/project_speed.py): pass costs from bench_llamacpp.py's rows, a bench store's cells
pooled with their plain runs, the check's and the projection's records and tables. The numbers
are made so that each expected figure is worked out by hand."""

import json

import pytest

from specq.bench.projection import Chain, PassCosts
from specq.bench.tools import projection
from specq.core.stats import DecodeStats

TARGET = "qwen2.5-coder-1.5b@gguf"
DRAFT = "qwen2.5-coder-0.5b@gguf-int4-head32k"


def _forwards(weights: str, tool: str, ms_by_round: dict[int, list[float]]) -> list[dict]:
    """bench_llamacpp rows: per row count, one pass's ms in each round."""
    return [{"run": "r", "round": k, "tool": tool, "weights": weights,
             "measurement": f"forward {n}", "ms": ms, "machine": "m", "kernels": "k", "threads": 2}
            for n, times in ms_by_round.items() for k, ms in enumerate(times)]


def test_pass_costs_are_medians_of_paired_ratios_and_a_stall_is_priced_at_more_rows_cost():
    rows = _forwards("w", "specq", {1: [100.0, 200.0, 100.0], 4: [150.0, 260.0, 130.0],
                                    8: [160.0, 300.0, 170.0]})
    # round 0: 4 rows 1.5, 8 rows 1.6; round 1: 1.3, 1.5; round 2: 1.3, 1.7
    costs = projection.pass_costs(rows, "w")
    assert costs.table == pytest.approx({1: 1.0, 4: 1.3, 8: 1.6})
    stalled = _forwards("w", "specq", {1: [100.0], 4: [250.0], 8: [160.0]})
    assert projection.pass_costs(stalled, "w").table == pytest.approx({1: 1.0, 4: 1.6, 8: 1.6})
    assert projection.step_ms(rows, "w") == 100.0
    with pytest.raises(ValueError, match="no one-row pass"):
        projection.pass_costs(rows, "other")


def test_llama_cpp_step_is_paired_by_round():
    rows = (_forwards("w", "specq", {1: [100.0, 200.0, 150.0]})
            + _forwards("w", "llama.cpp", {1: [120.0, 260.0, 150.0]}))
    assert projection.llama_cpp_step(rows, "w") == pytest.approx(1.2)  # of 1.2, 1.3, 1.0


def _stats(steps: list[tuple[int, int, str]], gamma: int, verify_ms: float, draft_ms: float,
           other_s: float) -> dict:
    """One run of (drafted, accepted, route) steps, each verify pass and drafted token at the
    given ms, after one prefill token."""
    s = DecodeStats(gamma=gamma)
    for drafted, accepted, route in steps:
        s.record_step(drafted, accepted, route=route)
    s.new_tokens = 1 + s.emitted
    s.prefill_s = 0.05
    s.verify_s = len(steps) * verify_ms / 1000
    s.draft_s = s.drafted * draft_ms / 1000
    s.decode_s = s.verify_s + s.draft_s + other_s
    return s.to_dict()


PLAIN = _stats([(0, 0, "draft")] * 10, 0, 100.0, 0.0, 0.0)  # 10 tokens at 100 ms
# gamma 2: 4 steps of 3-row passes at 150 ms, 2 + 2 + 1 + 1 accepted (10 tokens), 10 ms a token
SPEC = _stats([(2, 2, "draft"), (2, 2, "draft"), (2, 1, "draft"), (2, 1, "draft")], 2, 150.0,
              10.0, 0.02)


def _store(tmp_path, draft: str = DRAFT, gamma=2, spec: dict = SPEC) -> str:
    params = {"kind": "speculative", "target": TARGET, "draft": draft, "gamma": gamma,
              "draft_confidence": 0.0, "max_new_tokens": 11, "temperature": 0.0, "threads": 2,
              "set": "code", "n_prompts": 1, "repeats": 1, "paired": True}
    record = {"type": "cell", "key": "k", "cell": params, "finished": "2026-12-07",
              "runs": [{"set": "code", "prompt": 0, "repeat": 0, "token_ids": [], "text": "",
                        "stats": spec, "paired_stats": PLAIN}]}
    path = tmp_path / "cells.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


# the 1.5B's passes: 3 rows cost 1.5 steps, as the cell measured (150 ms against 100)
COSTS = {1: 1.0, 2: 1.25, 4: 1.75}


def test_the_check_on_the_pair_that_ran(tmp_path):
    [m] = projection.read_cells(_store(tmp_path), TARGET, name="docs/results/cells.jsonl")
    assert m.tokens == 10 and m.step_ms == pytest.approx(100.0)
    assert m.draft_ms == pytest.approx(10.0) and m.overhead_ms == pytest.approx(5.0)
    assert m.passes() == {3: 4} and m.counted
    record = projection.check_record(m, PassCosts(COSTS), "passes.jsonl")
    # plain 1.0 s, speculative 0.6 + 0.08 + 0.02 s for the same 10 tokens
    assert record["measured"] == pytest.approx(1.0 / 0.7)
    # re-priced at the table's costs: 4 passes of 1.5 steps, 1 step of drafting and overhead
    assert record["predicted"]["replayed"] == pytest.approx(10 / 7)
    # chain counted per step: 2.5 tokens for 1.5 + 2 * 0.1 + 0.05 steps
    assert record["predicted"]["modelled"] == pytest.approx(2.5 / 1.75)
    assert record["modelled_gamma"] == 2
    # aggregate.predict: 2.5 tokens a step for (80 + 600) / 4 ms over 100 ms (no overhead)
    assert record["predicted"]["own"] == pytest.approx(2.5 / 1.7)
    assert record["error"]["replayed"] == pytest.approx(0.0, abs=1e-9)
    assert record["file"] == "docs/results/cells.jsonl" and record["method"] == DRAFT
    assert record["end_to_end"]["measured"] == pytest.approx(1.05 / 0.75)
    table = projection.check_table([record]).splitlines()
    assert table[2] == (f"| cells | code | {DRAFT} | 2 | 11 | 1.43 | 1.47 | 1.43 | 1.43 (2) | "
                        "+3% / +0% / +0% |")
    assert table[3].endswith("| 3% (1) / 0% (1) / 0% (1) |")


def test_a_cell_projected_onto_a_shape_file(tmp_path):
    [m] = projection.read_cells(_store(tmp_path), TARGET)
    # specq's step 200 ms, 2 rows 1.1 steps, 4 rows 1.5; llama.cpp's step 1.5 specq steps
    rows = (_forwards("big.gguf", "specq", {1: [200.0], 2: [220.0], 4: [300.0]})
            + _forwards("big.gguf", "llama.cpp", {1: [300.0]}))
    r = projection.shape_record(m, "big", rows, "big.gguf")
    # a draft token 10 / 200 steps, overhead 5 / 200; gamma 1: 2 / 1.175, gamma 2: 2.5 / 1.425
    assert r["inputs"]["draft_in_steps"] == pytest.approx(0.05)
    assert r["gamma"] == 2
    assert r["vs_specq_plain"] == pytest.approx(2.5 / 1.425)
    assert r["vs_llama_cpp_plain"] == pytest.approx(1.5 * 2.5 / 1.425)
    assert r["tokens_per_s"] == pytest.approx(5 * 2.5 / 1.425)
    assert not r["meets_goal"]
    # the same steps re-priced: 4 passes of 1.3 steps and 0.1 + 0.025 * 4 steps, for 10 tokens
    assert r["replayed"] == pytest.approx(10 / (4 * 1.3 + 0.5))
    assert any("no acceptance was measured" in a for a in r["assumes"])
    # a draft of the target's family on a file of the family's shape; not on another family's
    notes = [len(projection.shape_assumes(m, s)) for s in ("qwen2.5-7b-Q4_K_M",
                                                            "llama-3.1-8b-Q4_K_M")]
    assert notes[1] == notes[0] + 1
    line = projection.shape_table([r]).splitlines()[2]
    assert line == (f"| big | code | {DRAFT} | cells, gamma 2 | 1.43 | 0.050 | 2 | 1.75 | 1.75 | "
                    "8.8 | 2.63 | no |")


def test_a_longer_fixed_gamma_stands_for_a_cell_that_did_not_count_its_chain(tmp_path):
    longer = _stats([(4, 4, "draft"), (4, 1, "draft"), (4, 3, "draft")], 4, 150.0, 10.0, 0.0)
    [short] = projection.read_cells(_store(tmp_path), TARGET)
    [long] = projection.read_cells(_store(tmp_path, gamma=4, spec=longer), TARGET)
    auto = _stats([(2, 2, "model"), (3, 3, "lookup"), (0, 0, "plain")], 4, 150.0, 10.0, 0.0)
    [mixed] = projection.read_cells(_store(tmp_path, f"ngram+{DRAFT}", "auto", auto), TARGET)
    assert mixed.model == DRAFT and mixed.method == f"ngram:n=2-3:k=4:c=16+{DRAFT}"
    assert not mixed.counted and mixed.draft_ms == pytest.approx(10.0 * 5 / 2)
    found = projection.longest_chain([short, long, mixed], mixed)
    assert found[1] is long and found[0].accepted == (1.0, 2 / 3, 2 / 3, 1 / 3)
    assert projection.longest_chain([short, mixed], mixed)[1] is short
    # the text's shares: 3 tokens by the model, 4 by the lookup, 1 plain
    assert mixed.shares() == pytest.approx({"model": 3 / 8, "lookup": 4 / 8, "plain": 1 / 8})
    # the model's route at its best cap for a chain accepting 0.9, then 0.5, a draft token a
    # quarter of a step: gamma 1, 1.9 / 1.5 (gamma 2: 2.35 / 2.0); the lookup's 4 tokens a
    # 4-row pass, 4 / 1.75; plain steps 1
    chain = Chain.from_rates([0.9, 0.5])
    p = projection.project(mixed, PassCosts(COSTS), 100.0, True, chain)
    assert p.gamma == 1
    assert p.modelled == pytest.approx(1 / (3 / 8 / (1.9 / 1.5) + 4 / 8 / (4 / 1.75) + 1 / 8))


def test_the_docs_table_keeps_the_shapes_and_drafts_it_names(tmp_path):
    import json

    from specq.bench import doc_tables

    [m] = projection.read_cells(_store(tmp_path), TARGET)
    rows = []
    for shape in ("big", "small"):
        rows += (_forwards(f"{shape}.gguf", "specq", {1: [200.0], 2: [220.0], 4: [300.0]})
                 + _forwards(f"{shape}.gguf", "llama.cpp", {1: [300.0]}))
    records = [projection.shape_record(m, shape, rows, f"{shape}.gguf")
               for shape in ("big", "small")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def shapes(options: str) -> list[str]:
        table = doc_tables.render(f"p.jsonl projection {options}", tmp_path)
        return [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]]

    assert shapes("results=cells") == ["big", "small"]
    assert shapes("shapes=small") == ["small"]
    assert shapes(f"shapes=big,small drafts={DRAFT}") == ["big", "small"]
    with pytest.raises(SystemExit):  # no rows: another draft's
        shapes("drafts=ngram")
