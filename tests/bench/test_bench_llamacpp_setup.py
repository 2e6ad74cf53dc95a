"""benchmarks/bench_llamacpp.py's set-up: `--weights` is a named set of weights or an existing GGUF
file (anything else is one line on stderr and exit code 2, before llama.cpp's binding is imported),
and a binding that cannot load its library is one line, not a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent.parent / "benchmarks" / "bench_llamacpp.py"


@pytest.mark.parametrize("weights", ["q4_2", "q4_1,missing.gguf", "notes.txt"])
def test_unknown_weights_are_one_line_and_exit_2(weights, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    done = subprocess.run([sys.executable, str(SCRIPT), "--weights", weights, "--quick"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("--weights: '") and len(done.stderr.strip().splitlines()) == 1


def test_an_existing_gguf_file_passes_the_check(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_llamacpp

    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    bench_llamacpp.check_weights(f"q4_1,{tmp_path / 'm.gguf'}")  # no exit
    with pytest.raises(SystemExit):
        bench_llamacpp.check_weights(str(tmp_path / "other.gguf"))


def test_a_binding_without_its_library_is_one_line(tmp_path):
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise FileNotFoundError(\"Shared library with base name 'llama' not found\")\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--weights", "q4_1", "--quick"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("llama.cpp's Python binding cannot load its library (Shared library")
    assert "LLAMA_CPP_LIB_PATH" in done.stderr and len(done.stderr.strip().splitlines()) == 1
