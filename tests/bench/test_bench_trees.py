"""specq bench with token trees: the `tree` / `tree_topk` sweep keys, tree cells end to end (their
own rows, labelled, lossless against the baseline), a drafter's refusal, and chain cells exactly
as they were before trees (keys, stored params, rendering)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from specq import api
from specq.bench import aggregate, runner, store, tables, terminal
from specq.bench.cli import add_bench_parser
from specq.bench.config import KEYS, Cell, cell_key, load_config, plan, related, validate
from specq.bench.prompts import Prompt
from specq.bench.report import write_report
from specq.cli import _Parser
from specq.drafters import TreeShape
from specq.drafters.tree import DEFAULT_TREE
from specq.errors import SpecqError

from conftest import perturbed, tiny_model, tiny_tokenizer

# cells of a `specq bench` run made before token trees (2026-12-01): fixed gammas and auto
OLD_CHAINS = Path(__file__).parent / "data" / "chains-before-trees.jsonl"


def prompt_sets() -> dict[str, list[Prompt]]:
    words = lambda i: " ".join(f"t{(5 * i + j) % 31 + 1}" for j in range(5))  # noqa: E731
    return {"chat": [Prompt("chat", i, words(i), False) for i in range(3)],
            "gsm8k": [Prompt("gsm8k", i, words(i + 7), False, "12") for i in range(2)]}


def sweep(path: Path, **extra):
    return validate({"targets": ["tiny"], "drafts": ["draft"], "gamma": [2, "auto"], "tree": [0, 6],
                     "tree_topk": [2], "max_new_tokens": [12], "prompt_sets": ["chat", "gsm8k"],
                     "threads": [1], "results": str(path), "resamples": 200, "quality_chunks": 0,
                     "draft_confidence": [0.0], **extra})


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(scale=3.0, ref="tiny@fp32")
    return {"tiny@fp32": target, "draft@fp32": perturbed(target, 0.05, ref="draft@fp32")}


def bench(config, models, **kwargs):
    return runner.run(config, load=lambda ref: models[ref], prompt_sets=prompt_sets(),
                      progress=False, console=Console(quiet=True), **kwargs)


# --------------------------------------------------------------------------------- config


def test_tree_keys_default_to_chains_only():
    config = validate({})
    assert config.tree == [0] and config.tree_topk == [DEFAULT_TREE.topk]
    cells, _ = plan(config, {"chat": prompt_sets()["chat"]})
    assert all(c.tree == 0 and "tree" not in c.params() for c in cells)


def test_a_tree_cells_gamma_is_its_depth():
    """gamma [2, 4, auto] x tree [8, 16] x topk [3]: trees of depth 2 and 4, and auto-depth trees up
    to 4, of 8 and 16 nodes; no chain cells (0 is not in `tree`), no early stop for trees."""
    config = validate({"drafts": ["d"], "gamma": [2, 4, "auto"], "tree": [8, 16], "tree_topk": 3})
    cells, notes = plan(config, {"chat": prompt_sets()["chat"]})
    spec = [c for c in cells if c.kind == "speculative"]
    assert {(c.tree_shape(), c.gamma) for c in spec} == {(TreeShape(n, d, 3), g) for n in (8, 16)
                                                         for d, g in ((2, 2), (4, 4), (4, "auto"))}
    assert all(c.draft_confidence is None for c in spec)
    assert any("ignore draft_confidence" in n for n in notes)
    baseline = [c for c in cells if c.kind == "baseline"]
    assert (len(baseline) == 1 and baseline[0].tree_shape() is None
            and "tree" not in baseline[0].params())


def test_chain_and_tree_cells_side_by_side_and_no_peer_for_trees():
    config = validate({"drafts": ["d"], "gamma": [2, 3], "tree": [0, 16], "tree_topk": [2, 4],
                       "peer": True, "draft_confidence": [0.0, 0.4]})
    cells, notes = plan(config, {"chat": prompt_sets()["chat"]})
    kinds = {k: [c for c in cells if c.kind == k] for k in ("baseline", "speculative", "peer")}
    chains = [c for c in kinds["speculative"] if not c.tree]
    trees = [c for c in kinds["speculative"] if c.tree]
    assert len(chains) == 2 * 2 and len(trees) == 2 * 2  # gamma x confidence; gamma x topk
    assert len(kinds["peer"]) == 4 and all(not c.tree for c in kinds["peer"])
    assert len({c.key for c in cells}) == len(cells)
    assert any("none for token tree cells" in n for n in notes)
    # a tree cell is compared with the same baseline as the chains
    for c in trees:
        assert cell_key(related(c.params(), "baseline")) == kinds["baseline"][0].key


def test_tree_keys_from_toml_and_flags(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("tree = [0, 16]\ntree_topk = 2\n")
    config = load_config(str(path))
    assert config.tree == [0, 16] and config.tree_topk == [2]
    parser = _Parser(prog="specq")
    add_bench_parser(parser.add_subparsers(dest="command", parser_class=_Parser))
    args = parser.parse_args(["bench", str(path), "--tree", "8", "--tree-topk", "3", "5"])
    config = load_config(args.config, {k: getattr(args, k) for k in KEYS})
    assert config.tree == [8] and config.tree_topk == [3, 5]  # flags win
    with pytest.raises(SpecqError, match="'tree'"):
        load_config(None,
                    {k: getattr(parser.parse_args(["bench", "--tree", "65"]), k) for k in KEYS})


BAD_TREES = [
    ("tree = [65]", "'tree'"),
    ("tree = [-1]", "'tree'"),
    ("tree = [16.5]", "'tree'"),
    ("tree = ['big']", "'tree'"),
    ("tree = [true]", "'tree'"),
    ("tree = []", "'tree'"),
    ("tree_topk = [0]", "'tree_topk'"),
    ("tree_topk = [65]", "'tree_topk'"),
    ("tree_topk = ['wide']", "'tree_topk'"),
    ("tree_topk = []", "'tree_topk'"),
    ("tree_depth = [4]", "'tree_depth'"),  # the depth is gamma
]


@pytest.mark.parametrize("text,needle", BAD_TREES)
def test_a_bad_tree_key_is_one_line_naming_the_key(text, needle, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecqError) as e:
        load_config(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------------- chains as before


def test_stored_chain_cells_keep_their_keys():
    """Every cell of a results file written before token trees has the key it had then, and a chain
    cell's stored params hold no tree fields."""
    records = [json.loads(line) for line in OLD_CHAINS.read_text().splitlines()]
    cells = [r for r in records if r.get("type") == "cell"]
    assert cells
    for r in cells:
        cell = Cell(**r["cell"])
        assert cell.params() == r["cell"] and cell.key == r["key"]
    tree = Cell(**{**cells[0]["cell"], "kind": "speculative", "draft": "d", "gamma": 2, "tree": 16,
                   "tree_topk": 4})
    assert tree.params()["tree"] == 16 and tree.key != Cell(**{**tree.params(), "tree": 0}).key


def test_old_results_aggregate_as_chains():
    rows = aggregate.summarize(store.read(OLD_CHAINS), resamples=50)
    assert rows and all(r["tree"] == 0 and r["tree_topk"] is None for r in rows)
    for table in (tables.summary(rows, 0.95), tables.brief(rows, 0.95), tables.per_position(rows),
                  tables.profile(rows)):
        text = json.dumps([table.headers, table.rows, table.caption])
        assert "tree" not in text and "nodes per pass" not in text


# --------------------------------------------------------------------------------- end to end


def test_tree_cells_run_losslessly_and_show_up_labelled(pair, tmp_path, monkeypatch):
    shapes = []

    def spying(target, prompt, draft=None, **kwargs):
        if draft is not None:
            shapes.append((kwargs.get("tree"), kwargs["gamma"]))
        return api.generate(target, prompt, draft, **kwargs)

    path = tmp_path / "r.jsonl"
    records = bench(sweep(path), pair, generate=spying)
    assert {s for s in shapes if s[0]} == {(TreeShape(6, 2, 2), 2), (TreeShape(6, 4, 2), "auto")}
    assert {s[1] for s in shapes if s[0] is None} == {2, "auto"}  # the chains stay chains

    # the stored greedy outputs of every tree cell are the baseline's, token for token
    cells = list(store.cells(records).values())
    base = {(r["set"], r["prompt"]): r["token_ids"] for c in cells
            if c["cell"]["kind"] == "baseline"
            for r in c["runs"]}
    tree_cells = [c for c in cells if c["cell"].get("tree")]
    assert len(tree_cells) == 2 * 2 and len(base) == 5  # 2 depths x 2 sets
    for c in tree_cells:
        for r in c["runs"]:
            assert r["token_ids"] == base[(r["set"], r["prompt"])]
            assert "paired_stats" in r and r["paired_stats"]["drafted"] == 0

    rows = aggregate.summarize(records, resamples=200)
    trees = [r for r in rows if r["tree"]]
    assert [(r["gamma"], r["tree"], r["tree_topk"]) for r in trees] == [(2, 6, 2), ("auto", 6, 2)]
    for r in trees:
        assert (not r["mismatches"] and r["unchecked"] == 0
                and tables.exactness(r) == "5/5 identical")
        assert len(r["U"]) == len(r["a"]) == (2 if r["gamma"] == 2 else 4)  # per depth
    # a depth-2 tree of 6 nodes, topk 2: more than a chain's 2 per pass
    assert trees[0]["nodes_per_pass"][0] > 2.5
    chains = [r for r in rows if r["kind"] == "speculative" and not r["tree"]]
    assert len(chains) == 2 and all(r["nodes_per_pass"][0] <= 4 for r in chains)

    summary = tables.summary(rows, 0.95)
    assert summary.headers[2] == "gamma / tree" and "nodes per pass" in summary.headers
    labels = [cells[2] for cells in summary.rows]
    assert ("tree 6 (d2, k2)" in labels and "tree 6 (d auto, k2)" in labels and "2" in labels
            and "auto" in labels)
    per_position = tables.per_position(rows)
    assert sum(cells[2] == "tree 6 (d2, k2)" for cells in per_position.rows) == 2  # U_i and a_i
    assert "depth" in per_position.caption

    brief = tables.brief(rows, 0.95, best_only=False)
    assert ([cells[2] for cells in brief.rows if cells[2].startswith("tree")]
            == ["tree 6 d2 k2", "tree 6 d auto k2"])
    console = Console(width=80, record=True, file=io.StringIO())
    terminal.print_table(brief, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "tree 6 d2 k2" in text

    md, html = write_report(path)
    report = md.read_text()
    assert "| tree 6 (d2, k2) |" in report and "nodes per pass" in report
    assert "tree 6 (d auto, k2)" in html.read_text()
    from specq.bench.report import plots

    titles = [title for title, _ in plots(rows)]
    assert "Tau and speedup vs tree size" in titles
    assert ("Tau and speedup vs tree size"
            not in [t for t, _ in plots([r for r in rows if not r["tree"]])])


def test_a_corrupted_tree_output_is_a_correctness_failure_of_its_row(pair, tmp_path):
    def corrupting(target, prompt, draft=None, **kwargs):
        out = api.generate(target, prompt, draft, **kwargs)
        if kwargs.get("tree") is not None and kwargs["gamma"] == 2:
            out.token_ids[3] = (out.token_ids[3] + 1) % target.vocab_size
        return out

    rows = aggregate.summarize(bench(sweep(tmp_path / "r.jsonl", gamma=[2]), pair,
                                     generate=corrupting),
                               resamples=100)
    bad = [r for r in rows if r["mismatches"]]
    assert [(r["tree"], r["gamma"]) for r in bad] == [(6, 2)] and len(bad[0]["mismatches"]) == 5
    failures = aggregate.failures(rows)
    assert len(failures) == 5 and "gamma=2 tree=6 topk=2" in failures[0]


def test_a_drafter_that_cannot_grow_trees_fails_its_cell_in_one_line(pair, tmp_path):
    """Token trees need specq's own Llama module: a transformers draft is refused by `for_pair`,
    the sweep stops at that cell with its one-line message, and what finished stays stored."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specq.core.types import Model
    from specq.model.hf_backend import HFCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    hf = Model(ref="qwen@fp32", net=HFCausalLM(Qwen2ForCausalLM(cfg).eval()),
               tokenizer=tiny_tokenizer(32), eos_ids=frozenset(), source="random")
    path = tmp_path / "r.jsonl"
    config = sweep(path, drafts=["qwen"], gamma=[2], tree=[4])
    with pytest.raises(SpecqError) as e:
        bench(config, {"tiny@fp32": pair["tiny@fp32"], "qwen@fp32": hf})
    assert ("token trees need a Llama-architecture draft" in str(e.value)
            and "\n" not in str(e.value))
    kinds = [c["cell"]["kind"] for c in store.cells(store.read(path)).values()]
    assert kinds == ["baseline", "baseline"]  # both sets' baselines ran before the tree cell


def test_self_drafts_resolve_to_each_target_at_their_spec():
    from specq.bench.config import BenchConfig, _drafts_for

    config = BenchConfig(targets=["smollm2-135m"], drafts=["self@int8", "self@int4-g64-rtn-head8"])
    notes = []
    assert _drafts_for("smollm2-135m@fp32", config, lambda *a: None, notes) == [
        "smollm2-135m@int8", "smollm2-135m@int4-g64-rtn-head8"]
