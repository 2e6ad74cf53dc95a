"""The docs' generated tables (specq.bench.doc_tables): every table matches its raw results file,
and each kind renders what its rows say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specq.bench import doc_tables, peer_tables, result_tables

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def block(spec: str, table: str) -> str:
    return f"<!-- table: {spec} -->\n{table}\n<!-- /table -->"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_tables_match_their_results(path):
    text = path.read_text()
    assert text == doc_tables.regenerate(text, ROOT), \
        f"stale table in {path.name}: run python benchmarks/doc_tables.py"


def test_a_hand_edited_table_is_caught():
    spec = "docs/results/coder-window.jsonl cells"
    table = doc_tables.render(spec, ROOT)
    assert "| 1.23 [1.22, 1.24] |" in table  # n-gram lookup alone on long prompts, in the raw file
    edited = block(spec, table.replace("1.23 [1.22, 1.24]", "1.32 [1.22, 1.24]"))
    assert doc_tables.regenerate(edited, ROOT) != edited
    assert "1.23 [1.22, 1.24]" in doc_tables.regenerate(edited, ROOT)


def test_the_performance_page_is_generated_from_its_results():
    """docs/performance.md's figures are tables of results files, not typed by hand."""
    blocks = list(doc_tables.BLOCK.finditer((ROOT / "docs" / "performance.md").read_text()))
    assert len(blocks) >= 10
    for found in blocks:
        for path in found.group("spec").split()[0].split(","):
            assert (ROOT / path).is_file(), path


def test_the_readme_holds_one_generated_results_table():
    """The README's one results table (specq beside llama.cpp on the coder pair, a column per
    prompt kind) is a block of raw results files, regenerated and checked like the docs' tables: a
    hand-edited number is put back."""
    blocks = list(doc_tables.BLOCK.finditer((ROOT / "README.md").read_text()))
    assert [m.group("spec").split()[1] for m in blocks] == ["headline"]
    spec = blocks[0].group("spec")
    table = doc_tables.render(spec, ROOT)
    assert table.splitlines()[0] == "| qwen1.5b | code | edit | chat |"
    row = table.splitlines()[2]  # llama.cpp's plain decoding
    cells = row.split(" | ")
    assert len(table.splitlines()) == 2 + len(doc_tables.HEADLINE_ROWS) and len(cells) == 4
    cells[1] = "999.9 tok/s"  # its figure on code prompts
    edited = block(spec, table.replace(row, " | ".join(cells)))
    assert doc_tables.regenerate(edited, ROOT) == block(spec, table)


def _headline_rows(rates: dict, **fields) -> list[dict]:
    """bench_llamacpp rows of the 1.5B, tokens/s in round order, a 0.5B row and a forward beside."""
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r, "tokens_per_s": v,
             **fields}
            for (tool, m), values in rates.items() for r, v in enumerate(values)]
    return rows + [dict(rows[0], weights="qwen0.5b", tokens_per_s=1000.0),
                   dict(rows[0], measurement="forward 1", tokens_per_s=None, ms=1.0)]


HEADLINE_CODE = {("llama.cpp", "generate plain"): [10.0, 20.0],
                 ("llama.cpp", "llama.cpp ngram-mod"): [12.0, 16.0],
                 ("llama.cpp", "llama.cpp draft n-max 2"): [14.0, 10.0],
                 ("specq", "generate plain"): [15.0, 25.0],
                 ("specq", "generate gamma auto"): [20.0, 28.0],
                 ("specq", "generate gamma 2"): [24.0, 30.0],
                 ("specq", "generate gamma auto, draft ngram+m"): [30.0, 20.0]}


def test_the_headline_is_a_column_per_file_of_paired_ratios_and_named_fastest_modes():
    """Each cell: the median over rounds and the median of the rounds' ratios to llama.cpp's plain
    decoding; the fastest mode by that ratio, named as llama.cpp's mode or specq's flags; a file
    without a measurement shows "-"; other weights' rows stay out."""
    code = _headline_rows(HEADLINE_CODE, prompt_set="code")
    chat = _headline_rows({("llama.cpp", "generate plain"): [10.0, 10.0],
                           ("specq", "generate ngram"): [11.0, 13.0]}, prompt_set="chat")
    lines = doc_tables.headline([code, chat]).splitlines()
    # ngram-mod: ratios 1.2, 0.8 (median 1.0) beat draft n-max 2's 1.4, 0.5 (0.95); specq plain
    # 1.5, 1.25; auto 2.0, 1.4; draft ngram+m's 3.0, 1.0 (2.0) beat gamma 2's 2.4, 1.5 (1.95):
    # the ratios decide, not the tokens/s (25.0 against 27.0)
    assert lines == [
        "| qwen1.5b | code | chat |", "|---|---|---|",
        "| llama.cpp, plain decoding | 15.0 tok/s | 10.0 tok/s |",
        "| llama.cpp, its fastest speculative mode | 14.0 tok/s (1.00x), ngram-mod | - |",
        "| specq, plain decoding (`--no-speculative`) | 20.0 tok/s (1.38x) | - |",
        ("| specq, the registered draft with gamma `auto` | 24.0 tok/s (1.70x) "
         "| - |"),
        ("| specq, its fastest mode | 25.0 tok/s (2.00x), `--draft ngram+m` "
         "| 12.0 tok/s (1.20x), `--draft ngram` |")]


def test_specq_modes_are_named_by_their_generate_flags():
    assert doc_tables.specq_flags("generate gamma auto") == "the registered draft"
    assert doc_tables.specq_flags("generate gamma 2") == "`--gamma 2`"
    assert doc_tables.specq_flags("generate plain") == "`--no-speculative`"
    flags = doc_tables.specq_flags("generate gamma auto, draft m:window=32")
    assert flags == "`--draft m:window=32`"


def test_the_headline_takes_its_machines_rows_and_refuses_two_runs_in_one_file(tmp_path):
    """`machine=` drops the other machines' rows (else their rounds would pair with these); two
    runs of one file on one machine are refused, their rounds not being one another's; files
    without the 1.5B make no table."""
    ours = _headline_rows(HEADLINE_CODE, prompt_set="code", machine="m", run="1")
    theirs = _headline_rows({k: [v * 10 for v in vs] for k, vs in HEADLINE_CODE.items()},
                            prompt_set="code", machine="other", run="2")
    draft = [dict(r, weights="qwen0.5b") for r in ours]
    for name, rows in [("ours.jsonl", ours), ("both.jsonl", ours + theirs),
                       ("draft.jsonl", draft)]:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    alone = doc_tables.render("ours.jsonl headline", tmp_path)
    assert doc_tables.render("both.jsonl headline machine=m", tmp_path) == alone
    assert "| 15.0 tok/s |" in alone
    with pytest.raises(SystemExit, match="several runs"):
        doc_tables.render("both.jsonl headline", tmp_path)
    with pytest.raises(SystemExit, match="no rows"):
        doc_tables.render("both.jsonl headline machine=none", tmp_path)
    with pytest.raises(SystemExit, match="no rows"):  # the 1.5B's table, and no row of it
        doc_tables.render("draft.jsonl headline", tmp_path)


def test_a_table_takes_the_rows_of_its_machine_and_refuses_unknown_kinds_and_options():
    spec = "docs/results/llamacpp-coder-chat.jsonl llamacpp"
    xeon = doc_tables.render(f"{spec} machine=xeon-avx512", ROOT)
    epyc = doc_tables.render(f"{spec} machine=epyc-zen4-avx512", ROOT)
    assert xeon != epyc and "| qwen1.5b | forward 1 |" in xeon
    with pytest.raises(SystemExit, match="no rows"):
        doc_tables.render(f"{spec} machine=no-such-machine", ROOT)
    with pytest.raises(SystemExit, match="unknown kind"):
        doc_tables.render("docs/results/llamacpp-coder.jsonl pivot", ROOT)
    with pytest.raises(SystemExit, match="takes no option tokens"):
        doc_tables.render(f"{spec} tokens=64", ROOT)


def _peer_rows(rates: dict, **fields) -> list[dict]:
    """bench_llamacpp rows: one per (tool, measurement) and round, tokens/s in round order."""
    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    return [{"tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r, "tokens_per_s": v,
             "per_prompt": prompt, **fields}
            for (tool, m), values in rates.items() for r, v in enumerate(values)]





def test_peers_is_one_line_per_run_and_never_pools_the_rounds_of_two_files():
    """The fastest modes by their rounds' median ratio to llama.cpp's plain decoding (a peer's
    plain decoding is not one of its speculative modes); two files' runs on one machine stay two
    lines; the 8-row pass in one-row steps of the same tool."""
    rates = {("llama.cpp", "generate plain"): [10.0, 20.0],
             ("llama.cpp", "llama.cpp ngram-mod"): [12.0, 16.0],
             ("openvino", "openvino plain"): [30.0, 30.0],
             ("openvino", "openvino draft 3"): [11.0, 15.0],
             ("specq", "generate plain"): [15.0, 25.0], ("specq", "generate gamma 2"): [24.0, 30.0],
             ("specq", "generate gamma auto"): [20.0, 28.0]}
    forwards = [{"tool": tool, "weights": "qwen1.5b", "measurement": f"forward {n}", "round": 0,
                 "ms": ms}
                for tool, n, ms in [("specq", 1, 10.0), ("specq", 8, 15.0),
                                    ("llama.cpp", 1, 12.0), ("llama.cpp", 8, 60.0)]]
    run = [dict(r, machine="m", kernels="avx2", prompt_set="chat", run="2026-12-01T10:00:00")
           for r in _peer_rows(rates) + forwards]
    lines = peer_tables.peers([run, run]).splitlines()
    # specq plain (1.5, 1.25); gamma 2: median 27.0, ratios (2.4, 1.5); auto (2.0, 1.4); llama.cpp's
    # ngram-mod (1.2, 0.8) beats OpenVINO's draft 3 (1.1, 0.75); prefill 1; 8 rows: 1.5 and 5 steps
    assert lines[2] == ("| m | avx2 | 2026-12-01 | chat | qwen1.5b | 15.0 tok/s | 20.0 (1.38x) | "
                        "24.0 (1.70x) | gamma 2, 1.95x | llama.cpp ngram-mod, 1.00x | 1.00x | "
                        "10.0 / 12.0 ms | 1.50 / 5.00 |")
    assert lines[3] == lines[2] and len(lines) == 4


def test_passes_give_each_runs_forwards_by_rows_and_context():
    rows = [{"tool": tool, "weights": "/m/coder-q2_k.gguf", "measurement": m, "round": r, "ms": ms,
             "machine": "m", "kernels": "avx2"}
            for tool, m, ms in [("specq", "forward 1", 10.0), ("specq", "forward 4", 20.0),
                                ("llama.cpp", "forward 1", 12.0),
                                ("specq", "forward 1 at 1024", 11.0)]
            for r in (0, 1)]
    lines = peer_tables.passes([rows]).splitlines()
    assert lines[0] == "| machine | kernels | weights | context | tool | 1 row | 4 rows |"
    assert lines[2:] == ["| m | avx2 | coder-q2_k | 128 | llama.cpp | 12.0 | - |",
                         "| m | avx2 | coder-q2_k | 128 | specq | 10.0 | 20.0 |",
                         "| m | avx2 | coder-q2_k | 1024 | llama.cpp | - | - |",
                         "| m | avx2 | coder-q2_k | 1024 | specq | 11.0 | - |"]


def test_interleaved_gammas_are_paired_with_the_plain_run_of_their_prompt_and_round():
    """Per target and set, each configuration's mean speedup over the plain run of the same prompt
    and round (best in bold), tau; an output that differs from plain decoding fails."""
    def row(prompt, rnd, config, rate, tau=1.0, ids=(1, 2)):
        return {"target": "t", "set": "code", "prompt": prompt, "round": rnd, "config": config,
                "tokens_per_s": rate, "tau": tau, "token_ids": list(ids)}

    rows = [row(0, 0, "plain", 10.0), row(0, 0, 2, 20.0, 2.0), row(0, 0, "auto", 15.0, 3.0),
            row(1, 0, "plain", 40.0), row(1, 0, 2, 40.0, 2.0), row(1, 0, "auto", 80.0, 1.0)]
    lines = result_tables.gamma_interleaved(rows).splitlines()
    assert lines[0].startswith("| target | prompts | plain tok/s | gamma 2 | gamma auto |")
    assert lines[2].startswith("| t | code (2 runs) | 25.0 | 1.50 [1.00, 2.00] | "
                               "**1.75 [1.50, 2.00]** | 2.00 | 2.00 |")
    differs = [row(2, 0, "plain", 10.0), row(2, 0, 2, 20.0, ids=(1, 3))]
    with pytest.raises(SystemExit, match="differs from plain decoding"):
        result_tables.gamma_interleaved(rows + differs)
    trees = rows + [row(0, 0, "tree:6:3:2", 30.0), row(1, 0, "tree:6:3:2", 40.0)]
    header = result_tables.gamma_interleaved(trees).splitlines()[0]
    assert header.startswith("| target | prompts | plain tok/s | gamma 2 | gamma auto | "
                             "tree:6:3:2 | tau, gamma 2 |")
    two = [row(0, 0, "plain", 10.0), row(0, 0, "auto/old", 15.0), row(0, 0, "auto/new", 20.0)]
    lines = result_tables.gamma_interleaved(two).splitlines()
    assert "| auto/new | auto/old |" in lines[0]
    assert "| **2.00 [2.00, 2.00]** | 1.50 [1.50, 1.50] |" in lines[2]


def test_temperature_keeps_one_temperatures_rows():
    """precision-pair.jsonl holds greedy and temperature-0.7 cells of the same targets:
    `temperature=` keeps one temperature's rows, and together they are the whole table."""
    spec = "docs/results/precision-pair.jsonl acceptance"
    temperatures = {t: {row.split(" | ")[2] for row in
                        doc_tables.render(f"{spec} temperature={t}", ROOT).splitlines()[2:]}
                    for t in ("0", "0.7")}
    assert temperatures == {"0": {"0"}, "0.7": {"0.7"}}
    both = doc_tables.render(spec, ROOT).splitlines()[2:]
    assert len(both) == sum(len(doc_tables.render(f"{spec} temperature={t}", ROOT).splitlines()[2:])
                            for t in ("0", "0.7"))
    with pytest.raises(SystemExit, match="no rows"):
        doc_tables.render(f"{spec} temperature=0.5", ROOT)
