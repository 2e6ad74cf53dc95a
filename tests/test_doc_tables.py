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


def test_openvino_rows_are_paired_with_llama_cpps_plain_decoding_and_their_own():
    """bench_llamacpp's OpenVINO rows: tokens/s in the peer column, the median over rounds of each
    round's ratio to llama.cpp's plain decoding and to OpenVINO's own plain decoding."""
    from bench_llamacpp import summary

    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    rates = {("llama.cpp", "generate plain"): [30.0, 20.0], ("specq", "generate plain"): [45.0, 40.0],
             ("openvino", "openvino plain"): [15.0, 10.0], ("openvino", "openvino draft 3"): [30.0, 30.0]}
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r, "tokens_per_s": v, "per_prompt": prompt}
            for (tool, m), values in rates.items() for r, v in enumerate(values)]
    lines = summary(rows).splitlines()
    assert "OpenVINO in its rows" in lines[0]
    draft = next(line for line in lines if "openvino draft 3" in line)
    assert "| 30.0 tok/s | - | 1.25 (OpenVINO vs llama.cpp plain; 2.50 vs its plain) |" in draft  # (1.0, 1.5); (2, 3)
    assert "| 1.75 |" in next(line for line in lines if "| generate plain |" in line)  # specq: (1.5, 2.0)


def test_the_memory_read_rate_of_the_rows_is_one_line_only_where_rows_have_it():
    """A one-token step reads every weight, so the table gives the machine's read rate the rows ran
    at (median and range over rows); files from before the probe get no such line."""
    from bench_llamacpp import summary

    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": "generate plain", "round": r, "tokens_per_s": 30.0,
             "per_prompt": prompt, "read_gbps": rate}
            for r, tool, rate in [(0, "llama.cpp", 30.0), (0, "specq", 50.0), (1, "llama.cpp", 40.0), (1, "specq", 35.0)]]
    line = summary(rows).splitlines()[-1]
    assert line == "| all | memory read rate before each row | - | - | 37.5 GB/s [30.0, 50.0] (median [min, max]) |"
    assert "read rate" not in summary([{k: v for k, v in row.items() if k != "read_gbps"} for row in rows])


def test_labelled_runs_are_one_line_each_paired_with_their_own_llama_cpp_plain_decoding():
    """bench_llamacpp's runs of several set-ups in one file (`--label`): a line per label in file
    order, each tool's median tokens/s and its rounds' median ratio to that set-up's llama.cpp."""
    from bench_llamacpp import setups_summary

    rates = {"one env": {("llama.cpp", "generate plain"): [30.0, 20.0], ("specq", "generate plain"): [45.0, 40.0],
                         ("specq", "generate gamma 2"): [60.0, 60.0], ("specq", "generate gamma auto"): [90.0, 30.0]},
             "other": {("llama.cpp", "generate plain"): [10.0, 10.0], ("specq", "generate plain"): [20.0, 20.0],
                       ("specq", "generate gamma 2"): [20.0, 40.0], ("specq", "generate gamma auto"): [50.0, 50.0]}}
    rows = [{"label": label, "tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r, "tokens_per_s": v}
            for label, by in rates.items() for (tool, m), values in by.items() for r, v in enumerate(values)]
    lines = setups_summary(rows).splitlines()
    assert lines[0] == ("| set-up | llama.cpp plain | specq plain | specq gamma 2 | specq gamma auto |")
    assert lines[2] == "| one env | 25.0 tok/s (1.00x) | 42.5 tok/s (1.75x) | 60.0 tok/s (2.50x) | 60.0 tok/s (2.25x) |"
    assert lines[3] == "| other | 10.0 tok/s (1.00x) | 20.0 tok/s (2.00x) | 30.0 tok/s (3.00x) | 50.0 tok/s (5.00x) |"


def test_goals_take_specqs_fastest_mode_and_the_fastest_peer_mode_of_the_run():
    """The goals table: specq's fastest generation mode and the fastest speculative mode of
    llama.cpp or OpenVINO (the highest median of paired rounds' ratios to llama.cpp's plain
    decoding), each ratio the median of paired rounds, marked met or not against 2.0, 1.6 and 1.5;
    OpenVINO's and llama.cpp's plain decoding are not peers' speculative modes."""
    from bench_llamacpp import goals_summary

    rates = {("llama.cpp", "generate plain"): [10.0, 20.0], ("llama.cpp", "llama.cpp ngram-mod"): [12.0, 16.0],
             ("openvino", "openvino plain"): [30.0, 30.0], ("openvino", "openvino draft 3"): [11.0, 15.0],
             ("specq", "generate plain"): [15.0, 25.0], ("specq", "generate gamma 2"): [24.0, 30.0],
             ("specq", "generate gamma auto"): [20.0, 28.0]}
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r, "tokens_per_s": v}
            for (tool, m), values in rates.items() for r, v in enumerate(values)]
    lines = goals_summary([("chat", rows)]).splitlines()
    # gamma 2: median 27.0, rounds' ratios to llama.cpp plain (2.4, 1.5), to ngram-mod (2.0, 1.875);
    # ngram-mod beats OpenVINO's draft 3 (1.2, 0.8 against 1.1, 0.75); auto: (2.0, 1.4)
    assert lines[2] == ("| chat | gamma 2, 27.0 tok/s | 1.95 (not met) | llama.cpp ngram-mod, 14.0 tok/s | "
                        "1.94 (met) | 1.70 (met) |")
    with pytest.raises(ValueError, match="a run of code prompts named chat"):
        goals_summary([("chat", [dict(r, prompt_set="code") for r in rows])])


def test_interleaved_gammas_are_paired_with_the_plain_run_of_their_prompt_and_round():
    """bench_gamma's table: per target and set, each gamma's mean speedup over the plain run of the
    same prompt and round (best in bold), tau; an output that differs from plain decoding fails."""
    import bench_gamma

    def row(prompt, rnd, config, rate, tau=1.0, ids=(1, 2)):
        return {"target": "t", "set": "code", "prompt": prompt, "round": rnd, "config": config,
                "tokens_per_s": rate, "tau": tau, "token_ids": list(ids)}

    rows = [row(0, 0, "plain", 10.0), row(0, 0, 2, 20.0, 2.0), row(0, 0, "auto", 15.0, 3.0),
            row(1, 0, "plain", 40.0), row(1, 0, 2, 40.0, 2.0), row(1, 0, "auto", 80.0, 1.0)]
    lines = bench_gamma.summary(rows).splitlines()
    assert lines[0].startswith("| target | prompts | plain tok/s | gamma 2 | gamma auto |")
    assert lines[2].startswith("| t | code (2 runs) | 25.0 | 1.50 [1.00, 2.00] | **1.75 [1.50, 2.00]** | 2.00 | 2.00 |")
    with pytest.raises(SystemExit, match="differs from plain decoding"):
        bench_gamma.summary(rows + [row(2, 0, "plain", 10.0), row(2, 0, 2, 20.0, ids=(1, 3))])
    trees = bench_gamma.configs("auto,1,tree:6:3:2,auto@0.6")
    assert trees == ["plain", "auto", 1, "tree:6:3:2", "auto@0.6"] and bench_gamma.options(trees[3])["tree"].size == 6
    assert bench_gamma.options("auto@0.6") == {"gamma": "auto", "draft_confidence": 0.6}
    assert bench_gamma.options("3@0.2") == {"gamma": 3, "draft_confidence": 0.2}
    header = bench_gamma.summary(rows + [row(0, 0, "tree:6:3:2", 30.0), row(1, 0, "tree:6:3:2", 40.0)]).splitlines()[0]
    assert header.startswith("| target | prompts | plain tok/s | gamma 2 | gamma auto | tree:6:3:2 | tau, gamma 2 |")
    # --drafts: each configuration once per named draft, paired with the same plain runs
    named = bench_gamma.parse_drafts("old=a@gguf,new=./lora")
    assert named == {"old": "a@gguf", "new": "./lora"}
    assert bench_gamma.configs("auto,2", list(named)) == ["plain", "auto/old", "auto/new", "2/old", "2/new"]
    assert bench_gamma.split_draft("2/new") == (2, "new") and bench_gamma.split_draft("auto@0.6") == ("auto@0.6", None)
    with pytest.raises(SystemExit, match="NAME=REF"):
        bench_gamma.parse_drafts("old")
    two = [row(0, 0, "plain", 10.0), row(0, 0, "auto/old", 15.0), row(0, 0, "auto/new", 20.0)]
    lines = bench_gamma.summary(two).splitlines()
    assert "| auto/new | auto/old |" in lines[0] and "| **2.00 [2.00, 2.00]** | 1.50 [1.50, 1.50] |" in lines[2]


def test_coder_draft_runs_of_one_draft_under_two_labels_are_two_lines():
    """bench_coder_drafts' `--label` (e.g. the ranked list behind a narrowed head): runs of one draft
    spec under two labels are pooled apart, each line with its own step time."""
    from bench_coder_drafts import table

    def run(label, accepted):
        return {"kind": "run", "draft": "gguf-int4-head32k", "set": "chat", "prompt": 0, "gamma": 3, "label": label,
                "same_as_plain": True, "steps": 10, "emitted": 20, "drafted": 30, "accepted": accepted}

    rows = [run("old list", 12), run("", 21),
            {"kind": "step", "model": "qwen2.5-coder-0.5b@gguf-int4-head32k", "label": "old list", "ms": 7.0},
            {"kind": "step", "model": "qwen2.5-coder-0.5b@gguf-int4-head32k", "ms": 6.0}]  # no label: older rows
    lines = table(rows).splitlines()[2:]
    assert len(lines) == 2
    assert lines[0].startswith("| gguf-int4-head32k | 3 | chat | 1 | 2.00 | 0.700") and lines[0].endswith("| 6.0 |")
    assert lines[1].startswith("| gguf-int4-head32k (old list) |") and "| 0.400 " in lines[1] and lines[1].endswith("| 7.0 |")
