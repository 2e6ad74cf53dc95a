"""benchmarks/bench_attention_ab.py: two builds of decoder.c's attention timed alone, with whether
their outputs stayed bit-identical (the same sources are; a changed score is not)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specq.kernels import decoder

ROOT = Path(__file__).parent.parent.parent
KERNELS = ROOT / "src" / "specq" / "kernels"
TINY = ["--layers", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--rows", "1,3", "--contexts", "40",
        "--rounds", "2", "--calls", "1", "--threads", "1"]

pytestmark = pytest.mark.skipif(not decoder.available(), reason="needs AVX2 and a C compiler")


def run(a: Path, b: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_attention_ab.py"), str(a), str(b), *TINY],
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_same_attention_is_bit_identical_and_a_changed_one_is_not(tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(KERNELS, changed, ignore=shutil.ignore_patterns("__pycache__"))
    source = (changed / "decoder.c").read_text()
    assert source.count("vmul(lane_sums(acc), vset1(scale))") == 1
    (changed / "decoder.c").write_text(source.replace("vmul(lane_sums(acc), vset1(scale))",
                                                      "vmul(lane_sums(acc), vset1(scale * 1.5f))"))
    same, other = run(KERNELS, KERNELS), run(KERNELS, changed)
    assert [line.split(":")[0] for line in same] == ["1 rows at 40", "3 rows at 40"]
    assert all(line.endswith("outputs bit-identical") for line in same)
    assert all(line.endswith("outputs differ") for line in other)


def test_a_side_that_does_not_compile_is_named_in_one_line(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "decoder.c").write_text("this is not C\n")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_attention_ab.py"), str(KERNELS),
                           str(broken), *TINY], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().startswith(str(broken))
    assert len(done.stderr.strip().splitlines()) == 1
