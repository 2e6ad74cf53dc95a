"""benchmarks/bench_llamacpp.py's `--weights`: a named set of weights or an existing GGUF file; anything
else is one line on stderr and exit code 2, before llama.cpp's binding is imported."""

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
