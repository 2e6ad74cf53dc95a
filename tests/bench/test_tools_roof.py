"""The machine's int8 roof (specq.bench.tools.roof): the loop does the products it counts."""

from __future__ import annotations

import pytest

from specq.bench.tools import roof
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
