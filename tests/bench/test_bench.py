"""specq bench: CIs, resume after a kill, lossless-ness check, config errors, report, CLI.
Tiny random models are injected, so the whole file runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from specq import api
from specq.bench import aggregate, quality, runner, store, tables, terminal
from specq.bench.cli import add_bench_parser, add_report_parser
from specq.bench.config import HELP, KEYS, load_config, plan, validate
from specq.bench.prompts import Prompt
from specq.bench.report import write_report
from specq.cli import _Parser
from specq.core.stats import bootstrap_ci
from specq.errors import SpecqError
from specq.kernels import build
from specq.loading.formats.save import save_native

from conftest import perturbed, tiny_model

PRESETS = Path(__file__).parents[2] / "benchmarks" / "presets"


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(scale=3.0, ref="tiny@fp32")
    return {"tiny@fp32": target, "draft@fp32": perturbed(target, 0.05, ref="draft@fp32")}


def prompt_sets() -> dict[str, list[Prompt]]:
    words = lambda i: " ".join(f"t{(5 * i + j) % 31 + 1}" for j in range(5))  # noqa: E731
    return {"chat": [Prompt("chat", i, words(i), False) for i in range(3)],
            "gsm8k": [Prompt("gsm8k", i, words(i + 7), False, "12") for i in range(2)]}


def sweep(path: Path, **extra):
    return validate({"targets": ["tiny"], "drafts": ["draft"], "gamma": [1, 3],
                     "max_new_tokens": [12], "prompt_sets": ["chat", "gsm8k"], "threads": [1],
                     "results": str(path), "resamples": 200, **extra})


def held_out(model, n: int) -> list[list[int]]:
    """`n` fixed token chunks standing in for held-out text."""
    g = np.random.default_rng(0)
    return [g.integers(1, 31, 24).tolist() for _ in range(n)]


def bench(config, pair, **kwargs):
    return runner.run(config, load=lambda ref: pair[ref], prompt_sets=prompt_sets(), progress=False,
                      console=Console(quiet=True), held_out=held_out, **kwargs)


def summary(records) -> list[dict]:
    return aggregate.summarize(records, resamples=200)


TIMING = ("tokens_per_s", "speedup", "decode_speedup", "predicted_speedup", "draft_share",
          "profile",
          "peer_tokens_per_s", "vs_peer", "ttft_ms", "itl_ms",
          "best_gamma")  # the best gamma is the fastest one


def deterministic(rows: list[dict]) -> list[dict]:
    """The rows without anything measured in seconds."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


# --------------------------------------------------------------------------------- statistics


def test_model_hash_tells_files_of_one_model_apart(tmp_path):
    """Two GGUF files of one model at different quant types share every tensor of the state dict
    (the norms): the hash must still differ, as it must not between loads of one file."""
    from specq.core.types import Model
    from specq.loading.formats import gguf_io

    from conftest import write_tiny_gguf

    model = tiny_model(vocab=32, hidden=64)

    def load(name: str, qtype: str | None = None) -> Model:
        if qtype:
            write_tiny_gguf(tmp_path / name, model, qtype)
        net, _ = gguf_io.load_at_file_precision(gguf_io.read(tmp_path / name))
        return Model(ref=f"{name}@gguf", net=net, tokenizer=model.tokenizer, eos_ids=frozenset(),
                     source=str(tmp_path / name))

    q8, q4 = load("q8.gguf", "Q8_0"), load("q4.gguf", "Q4_0")
    assert q8.net.state_dict().keys() == q4.net.state_dict().keys()
    assert runner.model_hash(q8) != runner.model_hash(q4)
    assert runner.model_hash(q8) == runner.model_hash(load("q8.gguf"))


def test_bootstrap_ci_covers_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(0)
    trials, hits = 300, 0
    for i in range(trials):
        data = rng.exponential(2.0, size=30)  # skewed, true mean 2.0
        _, low, high = bootstrap_ci(data, confidence=0.9, resamples=400, seed=i)
        hits += low <= 2.0 <= high
    assert 0.82 <= hits / trials <= 0.96  # percentile bootstrap at n=30 runs a little under nominal
    assert (bootstrap_ci([1.0, 2.0, 4.0], resamples=300, seed=5)
            == bootstrap_ci([1.0, 2.0, 4.0], resamples=300, seed=5))


def test_summary_cis_follow_the_configured_confidence(pair, tmp_path):
    records = bench(sweep(tmp_path / "r.jsonl"), pair)
    narrow = aggregate.summarize(records, confidence=0.6, resamples=300)
    wide = aggregate.summarize(records, confidence=0.99, resamples=300)
    for a, b in zip(narrow, wide):
        m, lo, hi = a["tokens_per_s"]
        assert (b["tokens_per_s"][0] == m and b["tokens_per_s"][1] <= lo
                and b["tokens_per_s"][2] >= hi)


def test_analytic_prediction_from_measured_parts():
    from specq.core.stats import DecodeStats

    # gamma 4, but the early stop cut every proposal to 2 tokens: 10 steps, 20 drafted, 10 accepted
    spec = DecodeStats(gamma=4, steps=10, drafted=20, accepted=10, draft_s=0.2, verify_s=1.0)
    spec.drafted_at, spec.reached_at, spec.accepted_at = [10, 10, 0, 0], [10, 5, 0, 0], [5, 5, 0, 0]
    base = DecodeStats(steps=10, verify_s=1.0)  # 0.1 s per target token
    # tokens/step = 1 + 10 / 10 = 2; step cost = 2 drafted * 0.01 + 0.1 = 0.12 s = 1.2 target tokens
    assert aggregate.predict(spec, base) == pytest.approx(2 / 1.2)


def test_decode_speedup_leaves_the_prefill_out():
    """A run whose prefill costs as much as plain's but whose steps take a third of plain's: 2x end
    to end, 3x decode alone."""
    import dataclasses

    from specq.core.stats import DecodeStats

    def runs(decode_s: float) -> list[dict]:
        stats = DecodeStats(new_tokens=11, prefill_s=1.0, decode_s=decode_s, steps=10)
        return [{"stats": dataclasses.asdict(stats)}]

    unit = aggregate.Unit("code", 0, runs(1.0), runs(3.0), [])
    assert unit.ratio(unit.base_runs) == pytest.approx(2.0)
    assert unit.ratio(unit.base_runs, "decode_tokens_per_s") == pytest.approx(3.0)


# --------------------------------------------------------------------------------- store and resume


def test_resume_after_a_killed_run_matches_an_uninterrupted_run(pair, tmp_path):
    whole = bench(sweep(tmp_path / "whole.jsonl"), pair)
    cells = len(store.cells(whole))
    assert cells == 6  # 2 sets x (baseline + 2 gammas)

    calls = 0

    def dies(*args, **kwargs):  # Ctrl-C in the middle of the third cell
        nonlocal calls
        calls += 1
        if calls == 9:
            raise KeyboardInterrupt
        return api.generate(*args, **kwargs)

    path = tmp_path / "killed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        bench(sweep(path), pair, generate=dies)
    done = len(store.cells(store.read(path)))
    assert 0 < done < cells
    with open(path, "ab") as f:  # and a line torn by the kill
        f.write(b'{"type": "cell", "key": "x", "runs": [{"tok')

    resumed = bench(sweep(path), pair)
    keys = [r["key"] for r in store.read(path) if r["type"] == "cell"]
    assert len(keys) == len(set(keys)) == cells
    assert deterministic(summary(resumed)) == deterministic(summary(whole))

    counted = 0

    def counting(*args, **kwargs):
        nonlocal counted
        counted += 1
        return api.generate(*args, **kwargs)

    lines = path.read_text().count("\n")
    bench(sweep(path), pair, generate=counting)  # all done: nothing runs, nothing is appended
    assert counted == 0 and path.read_text().count("\n") == lines


def test_gamma_auto_learns_across_a_targets_runs(pair, tmp_path):
    """Every run on one loaded target gets the same memory (gamma auto's estimates carry from
    prompt to prompt and cell to cell), kept by the sweep, not by the model."""
    memories = []

    def spying(target, prompt, draft=None, **kwargs):
        memories.append(kwargs["gamma_memory"])
        return api.generate(target, prompt, draft, **kwargs)

    bench(sweep(tmp_path / "r.jsonl", gamma=["auto"]), pair, generate=spying)
    assert len(memories) > 1 and all(m is memories[0] for m in memories)
    assert memories[0]._kept  # the auto runs kept what they learned there


def test_speedups_come_from_plain_runs_timed_next_to_each_speculative_run(pair, tmp_path):
    records = bench(sweep(tmp_path / "paired.jsonl"), pair)
    spec = [c for c in store.cells(records).values() if c["cell"]["kind"] == "speculative"]
    assert all("paired_stats" in r and r["paired_stats"]["drafted"] == 0 for c in spec
               for r in c["runs"])
    rows = [r for r in summary(records) if r["kind"] == "speculative"]
    assert rows and all(r["speedup_paired"] and r["speedup"] for r in rows)
    # from the baseline cell instead
    unpaired = bench(sweep(tmp_path / "unpaired.jsonl", paired=False), pair)
    rows = [r for r in summary(unpaired) if r["kind"] == "speculative"]
    assert rows and all(not r["speedup_paired"] and r["speedup"] for r in rows)


def test_store_ignores_a_torn_last_line_only(tmp_path):
    path = tmp_path / "s.jsonl"
    store.append(path, {"type": "cell", "key": "a"})
    path.write_bytes(path.read_bytes() + b'{"type": "ce')
    assert [r["key"] for r in store.read(path)] == ["a"]
    store.repair(path)
    store.append(path, {"type": "cell", "key": "b"})
    assert [r["key"] for r in store.read(path)] == ["a", "b"]
    path.write_bytes(b'{"broken\n' + path.read_bytes())
    with pytest.raises(SpecqError, match="line 1"):
        store.read(path)


# --------------------------------------------------------------------------------- correctness


def test_a_corrupted_speculative_output_is_a_reported_correctness_failure(pair, tmp_path):
    def corrupting(target, prompt, draft=None, **kwargs):
        out = api.generate(target, prompt, draft, **kwargs)
        if draft is not None and kwargs["gamma"] == 3:
            out.token_ids[-2] = (out.token_ids[-2] + 1) % target.vocab_size
        return out

    records = bench(sweep(tmp_path / "r.jsonl"), pair, generate=corrupting)
    rows = summary(records)
    bad = [r for r in rows if r["mismatches"]]
    assert [r["gamma"] for r in bad] == [3] and len(bad[0]["mismatches"]) == bad[0]["prompts"] == 5
    assert all(m["position"] == 10 for m in bad[0]["mismatches"])
    assert all(not r["mismatches"] for r in rows if r["gamma"] == 1)

    failures = aggregate.failures(rows)
    assert len(failures) == 5 and "differs from the baseline at token 10" in failures[0]
    # a failing gamma is shown even when not the best
    table = tables.brief(rows, 0.95, best_only=True)
    shown = [cells for cells, failed in zip(table.rows, table.failed) if failed]
    assert len(shown) == 1 and "FAIL 5" in shown[0]
    report = tables.summary(rows, 0.95)
    assert sum("FAIL: 5 differ" in cells for cells in report.rows) == 1
    console = Console(record=True, width=300)
    terminal.print_failures(failures, console)
    assert "CORRECTNESS FAILURE" in console.export_text()


def test_sampling_cells_are_not_checked_token_for_token(pair, tmp_path):
    rows = summary(bench(sweep(tmp_path / "r.jsonl", temperature=[0.8], gamma=[2]), pair))
    spec = [r for r in rows if r["kind"] == "speculative"]
    assert spec and all(not r["greedy"] and tables.exactness(r) == "n/a (sampling)" for r in spec)


def test_gsm8k_answers_are_extracted_and_normalised():
    assert quality.reference_answer("so 3 * 4 = 12 apples\n#### 1,200") == "1200"
    assert quality.extract_answer("The total is $18.00.") == "18"
    assert quality.extract_answer("first 3, then 4.5, so #### 7.") == "7"
    assert quality.extract_answer("no number here") is None
    assert quality.exact_match("She has 12 apples left.", "12")
    assert not quality.exact_match("12 apples, then 13", "12")
    assert quality.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert quality.first_mismatch([1, 5, 3], [1, 2, 3]) == 1
    assert quality.first_mismatch([1, 2], [1, 2, 3]) == 2


# --------------------------------------------------------------------------------- config


BAD_CONFIGS = [
    ("gama = [4]", "'gama'"),
    ("target_quant = ['int9']", "'target_quant'"),
    ("targets = ['smollm2-135m@int4-g0']", "'targets'"),
    ("gamma = ['four']", "'gamma'"),
    ("gamma = [0]", "'gamma'"),
    ("temperature = [-1.0]", "'temperature'"),
    ("prompt_sets = ['poems']", "'prompt_sets'"),
    ("prompt_sets = ['file']\nprompt_file = '/no/such/prompts.jsonl'", "'prompt_file'"),
    ("targets = ['./no/such/model']", "'targets'"),
    ("peer = 'yes'", "'peer'"),
    ("prompts = 0", "'prompts'"),
    ("confidence = 1.5", "'confidence'"),
    ("draft_confidence = [1.0]", "'draft_confidence'"),
    ("gamma = [", "invalid TOML"),
]


@pytest.mark.parametrize("text,needle", BAD_CONFIGS)
def test_a_bad_config_is_one_line_naming_the_key(text, needle, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecqError) as e:
        load_config(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_config_file_and_flag_overrides(tmp_path):
    with pytest.raises(SpecqError, match="not found"):
        load_config(str(tmp_path / "none.toml"))
    path = tmp_path / "ok.toml"
    path.write_text("gamma = [2, 4]\nmax_new_tokens = 32\ntarget_quant = ['fp32', "
                    "'int4-g64-rtn']\n")
    config = load_config(str(path), {"gamma": [3], "repeats": None})
    assert config.gamma == [3] and config.max_new_tokens == [32] and config.repeats == 1
    assert config.target_refs() == ["smollm2-135m@fp32", "smollm2-135m@int4-g64-rtn"]
    assert set(HELP) == set(KEYS)


def test_plan_resolves_the_registry_and_dedupes_drafts():
    sets = {"chat": prompt_sets()["chat"]}
    config = validate({"drafts": ["smollm2-135m-draft", "registry"], "peer": True,
                       "temperature": [0, 0.7], "gamma": [2]})
    cells, notes = plan(config, sets,
                        registry=lambda target, quantizable=False: "smollm2-135m-draft")
    kinds = [c.kind for c in cells]
    assert (kinds.count("baseline") == 2 and kinds.count("speculative") == 2
            and kinds.count("peer") == 1)
    assert len({c.key for c in cells}) == len(cells)
    # no shipped draft yet
    cells, notes = plan(config, sets, registry=lambda target, quantizable=False: None)
    assert {c.draft for c in cells} == {None, "smollm2-135m-draft@fp32"}
    assert any("registry has no draft" in n for n in notes)


def test_registry_cells_with_a_quantized_draft_ask_for_a_quantizable_draft():
    sets = {"chat": prompt_sets()["chat"]}
    config = validate({"drafts": ["registry"], "draft_quant": ["fp32", "int8"]})
    cells, _ = plan(config, sets, registry=lambda target, quantizable=False: "seq"
                    if quantizable else "feat")
    assert {c.draft for c in cells if c.kind == "speculative"} == {"feat@fp32", "seq@int8"}


def test_a_draft_confidence_sweep_doubles_speculative_and_peer_cells_only():
    sets = {"chat": prompt_sets()["chat"]}
    config = validate({"drafts": ["smollm2-135m-draft"], "peer": True, "draft_confidence": [0, 0.4],
                       "gamma": [2]})
    cells, _ = plan(config, sets)
    by_kind = {k: [c.draft_confidence for c in cells if c.kind == k]
               for k in ("baseline", "speculative", "peer")}
    assert by_kind == {"baseline": [None], "speculative": [0.0, 0.4], "peer": [0.0, 0.4]}


@pytest.mark.parametrize("name,expected", [
    # 2 targets x 2 sets x (baseline + speculative + peer), drafts deduped
    ("demo", 2 * 2 * (1 + 1 + 1)),
    # 5 targets x 3 lengths x 3 sets x (baseline + 3 drafts x 8 gammas x 2)
    ("full", 5 * 3 * 3 * (1 + 3 * 8 * 2)),

    # fp32 target x 2 sets x (baseline + 3 drafts x 8 gammas x 2)
    ("sweep-gamma", 1 * 2 * (1 + 3 * 8 * 2)),
    # 4 targets x 2 sets x (baseline + 3 drafts x 6 gammas), no peer
    ("sweep-gamma-quantized", 4 * 2 * (1 + 3 * 6)),
    # 5 targets x 2 lengths x 2 sets x (baseline + 3 drafts x 2)
    ("sweep-length", 5 * 2 * 2 * (1 + 3 * 2)),
    # 1 target x 1 set x (baseline + 2 n-gram drafts x without and with the suffix cache)
    ("suffix", 1 * 1 * (1 + 2 * 2)),
    # 1 target x 3 sets x (baseline + the model at 4 gammas + 2 lookups at their k and auto)
    ("projection-pair", 1 * 3 * (1 + 4 + 2 * 2)),
])
def test_presets_are_valid(name, expected, monkeypatch):
    monkeypatch.chdir(PRESETS.parents[1])  # a preset's prompt file is named from the repository
    config = load_config(str(PRESETS / f"{name}.toml"))
    sets = {s: prompt_sets()["chat"] for s in config.prompt_sets}
    cells, _ = plan(config, sets, registry=lambda target, quantizable=False: "smollm2-135m-draft")
    assert len(cells) == expected


# --------------------------------------------------------------------------------- report and CLI


def test_report_is_markdown_and_self_contained_html(pair, tmp_path):
    bench(sweep(tmp_path / "r.jsonl", max_new_tokens=[8, 16]), pair)
    md, html = write_report(tmp_path / "r.jsonl")
    text, page = md.read_text(), html.read_text()
    assert "tau (bonus incl.)" in text and "U_i (unconditional)" in text and "sha256" in text
    assert f"kernels {build.variant()}" in text  # which machine and kernels the speeds are of
    # per position, vs gamma, vs length, per precision
    assert page.count("data:image/png;base64,") >= 4
    assert ("<script" not in page and "<link" not in page and "src='http" not in page
            and 'src="http' not in page)
    with pytest.raises(SpecqError, match="not found"):
        write_report(tmp_path / "none.jsonl")


def test_gamma_auto_cells_are_lossless_and_reported(pair, tmp_path):
    """gamma 'auto' is one more value of the gamma axis: its rows carry the per-position
    acceptance up to its longest proposal, an analytic prediction from the tokens it actually
    drafted, and show up in the tables and the report."""
    rows = summary(bench(sweep(tmp_path / "r.jsonl", gamma=[2, "auto"]), pair))
    auto = [r for r in rows if r["gamma"] == "auto"]
    assert len(auto) == 1 and all(not r["mismatches"] and r["predicted_speedup"] > 0
                                  and len(r["U"]) == 4
                                  for r in auto)
    assert any(cells[2].startswith("auto") for cells in tables.summary(rows, 0.95).rows)
    md, _ = write_report(tmp_path / "r.jsonl")
    assert "| auto (stop" in md.read_text()
    with pytest.raises(SpecqError, match="or 'auto'"):
        sweep(tmp_path / "r.jsonl", gamma=["many"])


def _cli(argv: list[str]) -> int:
    parser = _Parser(prog="specq")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_bench_parser(sub)
    add_report_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_bench_with_peer_baseline_then_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich: one table row per line
    target = tiny_model(scale=3.0)
    save_native(target, tmp_path / "target")
    save_native(perturbed(target, 0.05), tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": f"t{i} t{i + 1} t{i + 2}"}) + "\n"
                               for i in range(1, 4)))
    results = tmp_path / "out.jsonl"
    argv = ["bench", "--targets", str(tmp_path / "target"), "--drafts", str(tmp_path / "draft"),
            "--gamma", "2", "--max-new-tokens", "10", "--prompt-sets", "file", "--prompt-file",
            str(prompts), "--no-prompt-file-chat", "--threads", "1", "--peer", "--profile",
            "--resamples", "100",
            # all the file holds
            "--draft-confidence", "0.3", "--results", str(results), "--prompts", "3"]
    assert _cli(argv) == 0
    out = capsys.readouterr().out
    assert "speedup [95% CI]" in out and "profile" in out and "3/3" in out
    records = store.read(results)
    peer = [c for c in store.cells(records).values() if c["cell"]["kind"] == "peer"]
    assert len(peer) == 1 and len(peer[0]["runs"]) == 3 and "skipped" not in peer[0]
    assert peer[0]["cell"]["draft_confidence"] == 0.3  # transformers gets the same stop as specq
    run = aggregate.run_records(records)[0]
    assert run["config"]["gamma"] == [2] and run["environment"]["torch"]
    assert (run["environment"]["kernels"] == build.variant()
            and run["environment"]["cpu"] == build.cpu_model())
    assert all(len(c["target"]["sha256"]) == 16 for c in store.cells(records).values())

    assert _cli(argv) == 0  # a re-run resumes: nothing left to do
    assert len(store.read(results)) == len(records)
    assert _cli(["report", str(results)]) == 0
    report = (tmp_path / "out.md").read_text()
    assert "HF assisted tok/s" in report and "quality per precision, held-out text" in report
    assert (tmp_path / "out.html").is_file()
    with pytest.raises(SpecqError, match="'gamma'"):
        _cli(argv[:5] + ["--gamma", "0"] + argv[7:])


def test_terminal_table_reads_at_80_columns(pair, tmp_path):
    """Long real names fold inside their column; headers and numbers stay whole, no line is wider
    than the terminal (the full table with every column is the report's)."""
    import io

    rows = summary(bench(sweep(tmp_path / "r.jsonl", draft_confidence=[0.0, 0.4],
                               max_new_tokens=[8, 12]), pair))
    for r in rows:
        r["target"] = "smollm2-135m@int4-g64-rtn"
        r["draft"] = r["draft"] and "/work/drafts/smollm2-135m-draft-int4-g64-rtn@int8"
    table = tables.brief(rows, 0.95)
    console = Console(width=80, record=True, file=io.StringIO())
    terminal.print_table(table, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    for header in table.headers:
        assert header in text
    numbers = [c for cells in table.rows for c in cells[2:] if c]
    assert numbers and all(c in text for c in numbers)
    assert "draft-int4" in text  # the name, shortened, keeps a readable width


def test_quality_stage_scores_each_precision_against_fp32(pair, tmp_path):
    """Perplexity from the model's own logits (a known value), top-1 agreement 1 for fp32 against
    itself and below 1 for a model that differs; a re-run adds no records."""
    import math

    import torch

    models = {**pair, "tiny@bf16": perturbed(pair["tiny@fp32"], 0.5, seed=3, ref="tiny@bf16")}
    config = sweep(tmp_path / "r.jsonl", gamma=[1], target_quant=["fp32", "bf16"], quality_chunks=3)
    records = bench(config, models)
    rows = aggregate.heldout_rows(records)
    assert [r["target"] for r in rows] == ["tiny@fp32", "tiny@bf16"]
    fp32, other = rows
    nll = []
    for chunk in held_out(None, 3):
        ids = torch.tensor(chunk)
        with torch.no_grad():
            logp = torch.log_softmax(models["tiny@fp32"].net(ids, None)[:-1].double(), -1)
        nll.append(float(-logp.gather(-1, ids[1:, None]).mean()))
    assert fp32["ppl"][0] == pytest.approx(math.exp(sum(nll) / 3), rel=1e-6)
    assert fp32["top1"] == [1.0, 1.0, 1.0] and fp32["tokens"] == 3 * 23
    assert other["top1"][0] < 0.9 and other["ppl"][0] != pytest.approx(fp32["ppl"][0], rel=1e-3)
    assert bench(config, models) == records  # resumed: nothing re-measured
    table = tables.heldout(rows)
    assert table.rows[0][3] == "1.000" and table.rows[1][0] == "tiny@bf16"


def test_bench_and_generate_share_the_default_gamma():
    from specq.bench.config import BenchConfig
    from specq.cli import _decode_gamma, build_parser
    from specq.drafters.base import DEFAULT_GAMMA, default_gamma

    args = build_parser().parse_args(["generate", "hi"])
    # resolved by the API, which knows the tree and the temperature
    assert _decode_gamma(args, None) is None
    assert BenchConfig().gamma == [default_gamma(None, greedy=True)] == [DEFAULT_GAMMA]
    assert BenchConfig().tree_topk == [args.tree_topk]


def test_a_gguf_files_own_precision_is_a_target_precision(tmp_path):
    """`target_quant = ["gguf"]` (a GGUF file at its own precision) is a precision like the others:
    accepted, crossed with every target, spelled as is; its cells skip the transformers peer
    (quantized blocks), and a typo is still a one-line error."""
    from specq.core.types import Model

    model = tmp_path / "model.gguf"
    model.touch()  # the config stage checks only that the file exists
    path = tmp_path / "sweep.toml"
    path.write_text(f'targets = ["{model}"]\ntarget_quant = ["gguf", "int8"]\n')
    config = load_config(str(path))
    assert config.target_refs() == [f"{model}@gguf", f"{model}@int8"]
    gguf_target = Model(ref=f"{model}@gguf", net=None, tokenizer=None, eos_ids=frozenset(),
                        source=str(model), precision="gguf")
    assert "quantized" in runner.peer_skip_reason(gguf_target)
    path.write_text(f'targets = ["{model}"]\ntarget_quant = ["ggfu"]\n')
    with pytest.raises(SpecqError, match="target_quant"):
        load_config(str(path))
