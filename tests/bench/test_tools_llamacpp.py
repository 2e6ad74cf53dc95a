"""The peer comparison's set-up (benchmarks/bench_llamacpp.py, through specq.bench.tools.llamacpp):
`--weights` is a named set of weights or an existing GGUF file (anything else is one line on
stderr and exit code 2, before llama.cpp's binding is imported), a binding that cannot load its
library is one line, not a traceback, and llama.cpp's speculative example's log is read."""

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
