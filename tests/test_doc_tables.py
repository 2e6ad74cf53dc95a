"""The docs' generated tables (specq.bench.doc_tables): every table matches its raw results file,
and each kind renders what its rows say."""

from __future__ import annotations

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
    """The README's one results table (specq beside llama.cpp on the coder pair) is a block of a
    raw results file, regenerated and checked like the docs' tables: a hand-edited number is put
    back."""
    blocks = list(doc_tables.BLOCK.finditer((ROOT / "README.md").read_text()))
    assert [m.group("spec").split()[1] for m in blocks] == ["llamacpp"]
    spec = blocks[0].group("spec")
    table = doc_tables.render(spec, ROOT)
    row = table.splitlines()[2]  # the first measurement
    cells = row.split(" | ")
    assert len(table.splitlines()) > 3 and len(cells) == 5
    cells[3] = "999.9 ms"  # specq's figure
    edited = block(spec, table.replace(row, " | ".join(cells)))
    assert doc_tables.regenerate(edited, ROOT) == block(spec, table)


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


def test_openvino_rows_are_paired_with_llama_cpps_plain_decoding_and_their_own():
    """OpenVINO's rows: tokens/s in the peer column, the median over rounds of each round's ratio
    to llama.cpp's plain decoding and to OpenVINO's own plain decoding."""
    rates = {("llama.cpp", "generate plain"): [30.0, 20.0],
             ("specq", "generate plain"): [45.0, 40.0],
             ("openvino", "openvino plain"): [15.0, 10.0],
             ("openvino", "openvino draft 3"): [30.0, 30.0]}
    lines = peer_tables.summary(_peer_rows(rates)).splitlines()
    assert "OpenVINO in its rows" in lines[0]
    draft = next(line for line in lines if "openvino draft 3" in line)
    # (1.0, 1.5); (2, 3)
    assert "| 30.0 tok/s | - | 1.25 (OpenVINO vs llama.cpp plain; 2.50 vs its plain) |" in draft
    specq = next(line for line in lines if "| generate plain |" in line)
    assert "| 1.75 |" in specq  # (1.5, 2.0)


def test_the_memory_read_rate_of_the_rows_is_one_line_only_where_rows_have_it():
    """A one-token step reads every weight, so the table gives the machine's read rate the rows ran
    at (median and range over rows); files from before the probe get no such line."""
    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": "generate plain", "round": r,
             "tokens_per_s": 30.0, "per_prompt": prompt, "read_gbps": rate}
            for r, tool, rate in [(0, "llama.cpp", 30.0), (0, "specq", 50.0),
                                  (1, "llama.cpp", 40.0), (1, "specq", 35.0)]]
    line = peer_tables.summary(rows).splitlines()[-1]
    assert line == ("| all | memory read rate before each row | - | - | 37.5 GB/s [30.0, 50.0] "
                    "(median [min, max]) |")
    stripped = [{k: v for k, v in row.items() if k != "read_gbps"} for row in rows]
    assert "read rate" not in peer_tables.summary(stripped)


def test_labelled_runs_are_one_line_each_paired_with_their_own_llama_cpp_plain_decoding():
    """Runs of several set-ups in one file (`--label`): a line per label in file order, each
    tool's median tokens/s and its rounds' median ratio to that set-up's llama.cpp."""
    rates = {"one env": {("llama.cpp", "generate plain"): [30.0, 20.0],
                         ("specq", "generate plain"): [45.0, 40.0],
                         ("specq", "generate gamma 2"): [60.0, 60.0],
                         ("specq", "generate gamma auto"): [90.0, 30.0]},
             "other": {("llama.cpp", "generate plain"): [10.0, 10.0],
                       ("specq", "generate plain"): [20.0, 20.0],
                       ("specq", "generate gamma 2"): [20.0, 40.0],
                       ("specq", "generate gamma auto"): [50.0, 50.0]}}
    rows = [row for label, by in rates.items() for row in _peer_rows(by, label=label)]
    lines = peer_tables.setups(rows).splitlines()
    assert lines[0] == ("| set-up | llama.cpp plain | specq plain | specq gamma 2 | "
                        "specq gamma auto |")
    assert lines[2] == ("| one env | 25.0 tok/s (1.00x) | 42.5 tok/s (1.75x) | "
                        "60.0 tok/s (2.50x) | 60.0 tok/s (2.25x) |")
    assert lines[3] == ("| other | 10.0 tok/s (1.00x) | 20.0 tok/s (2.00x) | "
                        "30.0 tok/s (3.00x) | 50.0 tok/s (5.00x) |")


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


def test_coder_draft_runs_of_one_draft_under_two_labels_are_two_lines():
    """Runs of one draft spec under two labels (e.g. the ranked list behind a narrowed head) are
    pooled apart, each line with its own step time."""
    def run(label, accepted):
        return {"kind": "run", "draft": "gguf-int4-head32k", "set": "chat", "prompt": 0, "gamma": 3,
                "label": label, "same_as_plain": True, "steps": 10, "emitted": 20, "drafted": 30,
                "accepted": accepted}

    step = {"kind": "step", "model": "qwen2.5-coder-0.5b@gguf-int4-head32k"}
    rows = [run("old list", 12), run("", 21), dict(step, label="old list", ms=7.0),
            dict(step, ms=6.0)]  # no label: older rows
    lines = result_tables.coder_drafts(rows).splitlines()[2:]
    assert len(lines) == 2
    assert lines[0].startswith("| gguf-int4-head32k | 3 | chat | 1 | 2.00 | 0.700")
    assert lines[0].endswith("| 6.0 |")
    assert lines[1].startswith("| gguf-int4-head32k (old list) |") and "| 0.400 " in lines[1]
    assert lines[1].endswith("| 7.0 |")
