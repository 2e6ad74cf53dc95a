"""The peer comparison (benchmarks/bench_llamacpp.py, through specq.bench.tools.llamacpp): its
set-up (`--weights` is a named set of weights or an existing GGUF file, anything else one line on
stderr and exit code 2 before llama.cpp's binding is imported; a binding that cannot load its
library is one line, not a traceback), llama.cpp's speculative log, and its tables."""

import sys

import pytest

from specq.bench.tools import llamacpp


@pytest.mark.parametrize("weights", ["q4_2", "q4_1,missing.gguf", "notes.txt"])
def test_unknown_weights_are_one_line_and_exit_2(weights, tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        llamacpp.check_weights(weights)
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert err.startswith("--weights: '") and len(err.strip().splitlines()) == 1


def test_an_existing_gguf_file_passes_the_check(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    llamacpp.check_weights(f"q4_1,{tmp_path / 'm.gguf'}")  # no exit
    with pytest.raises(SystemExit):
        llamacpp.check_weights(str(tmp_path / "other.gguf"))


def test_a_binding_without_its_library_is_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise FileNotFoundError(\"Shared library with base name 'llama' not found\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    with pytest.raises(SystemExit) as done:
        llamacpp.binding()
    message = done.value.code  # a string: Python prints it alone on stderr and exits 1
    assert isinstance(message, str) and "Traceback" not in message
    assert message.startswith("llama.cpp's Python binding cannot load its library (Shared library")
    assert "LLAMA_CPP_LIB_PATH" in message and len(message.strip().splitlines()) == 1


def test_the_speculative_examples_log_is_read():
    log = ("main: n_predict = 128\n"
           "encoded   42 tokens in    0.250 seconds, speed:  168.0 t/s\n"
           "decoded  128 tokens in    2.000 seconds, speed:   64.0 t/s\n"
           "n_draft   = 8\nn_predict = 128\nn_drafted = 96\nn_accept  = 70\naccept    = 72.917%\n")
    assert llamacpp.speculative_log(log) == (128, 0.25, 2.0, {"n_drafted": 96, "n_accept": 70})
    assert llamacpp.speculative_log("error: failed to load model\n") is None


def test_outputs_part_at_the_first_different_token():
    assert llamacpp.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert llamacpp.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert llamacpp.first_difference([1, 2], [1, 2, 3]) == 2


def _rows(rates: dict, **fields) -> list[dict]:
    """Rows of the qwen1.5b weights: {(tool, measurement): tokens/s per round}."""
    return [{"tool": tool, "weights": "qwen1.5b", "measurement": m, "round": r,
             "tokens_per_s": v, **fields}
            for (tool, m), values in rates.items() for r, v in enumerate(values)]


def test_openvino_rows_are_paired_with_llama_cpps_plain_decoding_and_their_own():
    """OpenVINO's rows: tokens/s in the peer column, the median over rounds of each round's ratio
    to llama.cpp's plain decoding and to OpenVINO's own plain decoding."""
    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    rates = {("llama.cpp", "generate plain"): [30.0, 20.0],
             ("specq", "generate plain"): [45.0, 40.0],
             ("openvino", "openvino plain"): [15.0, 10.0],
             ("openvino", "openvino draft 3"): [30.0, 30.0]}
    lines = llamacpp.summary(_rows(rates, per_prompt=prompt)).splitlines()
    assert "OpenVINO in its rows" in lines[0]
    draft = next(line for line in lines if "openvino draft 3" in line)
    # (1.0, 1.5); (2, 3)
    assert "| 30.0 tok/s | - | 1.25 (OpenVINO vs llama.cpp plain; 2.50 vs its plain) |" in draft
    # specq: (1.5, 2.0)
    assert "| 1.75 |" in next(line for line in lines if "| generate plain |" in line)


def test_the_memory_read_rate_of_the_rows_is_one_line_only_where_rows_have_it():
    """A one-token step reads every weight, so the table gives the machine's read rate the rows
    ran at (median and range over rows); files from before the probe get no such line."""
    prompt = [{"prompt_tokens": 10, "prefill_s": 0.1}]
    rows = [{"tool": tool, "weights": "qwen1.5b", "measurement": "generate plain", "round": r,
             "tokens_per_s": 30.0, "per_prompt": prompt, "read_gbps": rate}
            for r, tool, rate in [(0, "llama.cpp", 30.0), (0, "specq", 50.0),
                                  (1, "llama.cpp", 40.0), (1, "specq", 35.0)]]
    line = llamacpp.summary(rows).splitlines()[-1]
    assert line == ("| all | memory read rate before each row | - | - | 37.5 GB/s [30.0, 50.0] "
                    "(median [min, max]) |")
    without = [{k: v for k, v in row.items() if k != "read_gbps"} for row in rows]
    assert "read rate" not in llamacpp.summary(without)


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
    rows = [row for label, by in rates.items() for row in _rows(by, label=label)]
    lines = llamacpp.setups_summary(rows).splitlines()
    assert lines[0] == ("| set-up | llama.cpp plain | specq plain | specq gamma 2 | "
                        "specq gamma auto |")
    assert lines[2] == ("| one env | 25.0 tok/s (1.00x) | 42.5 tok/s (1.75x) | 60.0 tok/s (2.50x) "
                        "| 60.0 tok/s (2.25x) |")
    assert lines[3] == ("| other | 10.0 tok/s (1.00x) | 20.0 tok/s (2.00x) | 30.0 tok/s (3.00x) | "
                        "50.0 tok/s (5.00x) |")


def test_goals_take_specqs_fastest_mode_and_the_fastest_peer_mode_of_the_run():
    """The goals table: specq's fastest generation mode and the fastest speculative mode of
    llama.cpp or OpenVINO (the highest median of paired rounds' ratios to llama.cpp's plain
    decoding), each ratio the median of paired rounds, marked met or not against 2.0, 1.6 and 1.5;
    OpenVINO's and llama.cpp's plain decoding are not peers' speculative modes."""
    rates = {("llama.cpp", "generate plain"): [10.0, 20.0],
             ("llama.cpp", "llama.cpp ngram-mod"): [12.0, 16.0],
             ("openvino", "openvino plain"): [30.0, 30.0],
             ("openvino", "openvino draft 3"): [11.0, 15.0],
             ("specq", "generate plain"): [15.0, 25.0], ("specq", "generate gamma 2"): [24.0, 30.0],
             ("specq", "generate gamma auto"): [20.0, 28.0]}
    rows = _rows(rates)
    lines = llamacpp.goals_summary([("chat", rows)]).splitlines()
    # gamma 2: median 27.0, rounds' ratios to llama.cpp plain (2.4, 1.5), to ngram-mod (2.0,
    # 1.875); ngram-mod beats OpenVINO's draft 3 (1.2, 0.8 against 1.1, 0.75); auto: (2.0, 1.4)
    assert lines[2] == ("| chat | gamma 2, 27.0 tok/s | 1.95 (not met) | llama.cpp ngram-mod, "
                        "14.0 tok/s | 1.94 (met) | 1.70 (met) |")
    with pytest.raises(ValueError, match="a run of code prompts named chat"):
        llamacpp.goals_summary([("chat", [dict(r, prompt_set="code") for r in rows])])


def test_the_ngram_table_pairs_each_prompt_set_by_its_own_rounds():
    def row(tool, measurement, prompt_set, r, rate):
        return {"tool": tool, "weights": "w", "measurement": measurement, "prompt_set": prompt_set,
                "round": r, "tokens_per_s": rate}

    rows = [row("llama.cpp", "generate plain", "code", 0, 10.0),
            row("llama.cpp", "generate plain", "code", 1, 20.0),
            row("llama.cpp", "llama.cpp ngram-mod", "code", 0, 5.0),
            row("llama.cpp", "llama.cpp ngram-mod", "code", 1, 10.0),
            row("specq", "generate ngram", "code", 0, 30.0),
            row("specq", "generate ngram", "code", 1, 60.0),
            row("llama.cpp", "generate plain", "edit", 0, 100.0),
            row("specq", "generate ngram", "edit", 0, 150.0)]
    lines = llamacpp.ngram_summary(rows).splitlines()
    assert len(lines) == 4
    other = [{**r, "weights": "v"} for r in rows[:2]]
    grouped = llamacpp.ngram_summary(rows[:2] + other + rows[2:]).splitlines()
    assert [line.split(" | ")[:2] for line in grouped[2:]] == [["| w", "code"], ["| w", "edit"],
                                                              ["| v", "code"]]
    code = lines[2].split(" | ")
    assert code[1:3] == ["code", "15.0 tok/s"]
    assert code[4] == "0.50x" and code[3] == "-" and code[-1].startswith("3.00x")
    edit = lines[3].split(" | ")
    assert edit[1:3] == ["edit", "100.0 tok/s"] and edit[-1].startswith("1.50x")
