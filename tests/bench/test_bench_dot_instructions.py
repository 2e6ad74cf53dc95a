"""benchmarks/bench_dot_instructions.py: each dot-product instruction this CPU has timed alone, the
others named as absent, the float32 FMA the reference."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specq.kernels import build

ROOT = Path(__file__).parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_dot_instructions.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_dot_instructions  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available() or "avx512f" not in build.cpu_flags(),
                                reason="needs AVX-512 and a C compiler")


def test_every_instruction_is_timed_or_named_absent():
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "2", "--iterations", "20000"],
                          capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()[1:]
    assert [line.split(":")[0] for line in lines] == list(bench_dot_instructions.INSTRUCTIONS)
    for name, line in zip(bench_dot_instructions.INSTRUCTIONS, lines):
        if not bench_dot_instructions.runs_here(name):
            assert line.endswith("not on this CPU")
            continue
        per_second, macs, ratio = map(float, re.fullmatch(r".*: ([\d.]+) G instructions/s, ([\d.]+) G multiply-adds/s, "
                                                          r"([\d.]+)x vfmadd231ps zmm's", line).groups())
        assert per_second > 0 and macs == pytest.approx(per_second * bench_dot_instructions.INSTRUCTIONS[name][2],
                                                        rel=0.01, abs=0.1)
    assert lines[0].endswith("1.00x vfmadd231ps zmm's")


def test_bad_counts_are_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.strip() == "--rounds and --iterations must be positive"
