"""The machine's int8 roof (specq.bench.tools.roof): the loop does the products it counts."""

from __future__ import annotations

import pytest

from specq.bench.tools import roof, shapes
from specq.kernels import build

VARIANTS = [pytest.param(v, marks=pytest.mark.skipif(
    v not in build.runnable(), reason=f"this CPU does not run {v}")) for v in build.VARIANTS]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_loop_does_every_product_it_counts(variant):
    """Products of ones: each chain's lane gains 4 per step, summed over chains and threads."""
    lib = roof.library(variant)
    assert lib.run(2, 1000) == 2 * roof.CHAINS * 1000 * 4
    assert lib.lanes() == (64 if variant == "avx512vnni" else 32)


def test_the_rate_is_positive_and_finite():
    variant = build.runnable()[-1] if build.runnable() else pytest.skip("no variant runs here")
    assert 0 < roof.gmacs(variant, threads=1, rounds=1, steps=10_000) < 1e6


def test_a_shapes_multiply_adds_per_row_are_its_matrices():
    """Qwen2.5-7B: 28 layers of q, k, v, o and three FFN matrices, and the head."""
    shape = shapes.SHAPES["qwen2.5-7b"]
    per_layer = 3584 * 3584 * 2 + 3584 * 512 * 2 + 3 * 3584 * 18944
    assert shape.macs_per_row == 28 * per_layer + 3584 * 152064
    assert roof.shape_of("benchmarks/results/shapes/qwen2.5-7b-Q4_K_M.gguf") is shape
    assert roof.shape_of("coder-1.5b-q2_k.gguf") is None


def test_the_table_sets_each_pass_beside_the_roof():
    weights = "shapes/qwen2.5-7b-Q4_K_M.gguf"
    base = {"machine": "m", "kernels": "avx512vnni", "threads": 2, "weights": weights}
    rows = [{**base, "tool": tool, "measurement": f"forward {n}", "round": k, "ms": ms * (1 + k)}
            for tool, n, ms in (("specq", 1, 100.0), ("specq", 8, 200.0), ("specq", 16, 400.0),
                                ("llama.cpp", 16, 800.0))
            for k in (0, 1)]
    rows += [{"kernel": "roof", "variant": "avx512vnni", "threads": 2, "gmacs": g, "machine": "m"}
             for g in (400.0, 500.0, 600.0)]
    rows.append({**base, "weights": "x.gguf", "tool": "specq", "measurement": "forward 1",
                 "ms": 1.0})  # no shape of a known model: left out
    lines = roof.table(rows).splitlines()
    assert len(lines) == 4 and "x" not in [c.strip() for c in lines[2].split("|")]
    macs = shapes.SHAPES["qwen2.5-7b"].macs_per_row
    assert lines[2].endswith("| 1.00 |")  # 8 rows at the roof take less than reading the weights
    cells = [c.strip() for c in lines[3].split("|")[1:-1]]
    # medians over the two rounds: step 150 ms, 16 rows 600 ms; roof 500 GMAC/s
    assert cells[5:] == ["16", "600.0 (4.00)", f"{16 * macs / 600 / 1e6:.0f}",
                         f"{16 * macs / 1200 / 1e6:.0f}", "500",
                         f"{16 * macs / 600 / 1e6 / 500:.2f}",
                         f"{16 * macs / 500 / 1e6 / 150:.2f}"]
