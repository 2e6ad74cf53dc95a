"""benchmarks/bench_kernels_ab.py's summary: paired B/A ratios per (rows, context), and whether the
two builds' logits stayed bit-identical."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))

import bench_kernels_ab  # noqa: E402


def test_rounds_are_paired_and_differing_logits_are_named():
    ms = {(8, 1024): [(10.0, 11.0), (20.0, 24.0), (10.0, 10.0)], (1, 128): [(5.0, 5.0)]}
    lines = bench_kernels_ab.summary(ms, {(8, 1024): False, (1, 128): True})
    assert lines[0] == ("8 rows at 1024: A 10.0 ms, B 11.0 ms, B/A paired median 1.100 [1.000, 1.200], "
                        "logits differ")
    assert lines[1].endswith("B/A paired median 1.000 [1.000, 1.000], logits bit-identical")
