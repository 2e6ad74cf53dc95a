"""benchmarks/bench_kernels_ab.py: paired rounds (the first side flipping), and the summary: paired B/A ratios per
(rows, context) and whether the two builds' logits stayed bit-identical."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))

import bench_kernels_ab  # noqa: E402


def test_rounds_are_paired_and_differing_logits_are_named():
    ms = {(8, 1024): [(10.0, 11.0), (20.0, 24.0), (10.0, 10.0)], (1, 128): [(5.0, 5.0)]}
    lines = bench_kernels_ab.summary(ms, {(8, 1024): False, (1, 128): True})
    assert lines[0] == ("8 rows at 1024: A 10.0 ms, B 11.0 ms, B/A paired median 1.100 [1.000, 1.200], "
                        "logits differ")
    assert lines[1].endswith("B/A paired median 1.000 [1.000, 1.000], logits bit-identical")


def test_paired_rounds_flip_the_first_side_and_compare_outputs():
    calls = []

    def timed(side, n, c):
        calls.append(side)
        return float(10 * side + n), torch.tensor([1.0 if side == 0 or c == 128 else 2.0])

    ms, same = bench_kernels_ab.paired_rounds(timed, [1, 8], [128, 1024], 2)
    assert calls == [0, 1] * 4 + [1, 0] * 4
    assert ms[(8, 1024)] == [(8.0, 18.0), (8.0, 18.0)]
    assert same == {(1, 128): True, (1, 1024): False, (8, 128): True, (8, 1024): False}
