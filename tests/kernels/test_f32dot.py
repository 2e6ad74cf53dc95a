"""kernels/f32dot: float32 linear layers for decoding's few rows, against torch on every kernel
variant this CPU runs, every row bit-identical whatever the row count, the same bits on every
variant, and the fast path's float layer around it."""

from __future__ import annotations


import pytest
import torch

from specq.backends import fastpath
from specq.kernels import build, f32dot
from specq.kernels.rows import ROW_BY_ROW_MAX

pytestmark = pytest.mark.skipif(not f32dot.available(), reason="needs AVX2 and a C compiler")


# 21 x 33: a last panel of 5 outputs, an odd input
@pytest.mark.parametrize("out,n_in", [(64, 96), (21, 33)])
def test_matches_torch(out, n_in, kernel_variant):
    g = torch.Generator().manual_seed(out)
    w, x = torch.randn(out, n_in, generator=g), torch.randn(7, n_in, generator=g)
    torch.testing.assert_close(f32dot.linear(x, f32dot.FloatPanels(w)), x @ w.T, rtol=1e-5,
                               atol=1e-5)


def test_every_row_is_bit_identical_whatever_the_row_count(kernel_variant):
    g = torch.Generator().manual_seed(0)
    weight = f32dot.FloatPanels(torch.randn(44, 75, generator=g))
    assert weight.variant == kernel_variant
    x = torch.randn(19, 75, generator=g)
    alone = torch.cat([f32dot.linear(x[i:i + 1], weight) for i in range(len(x))])
    for rows in range(1, len(x) + 1):  # row tiles of 2 to 4 (AVX2) or 8 (AVX-512), and 1 alone
        for start in (0, len(x) - rows):
            assert torch.equal(f32dot.linear(x[start:start + rows], weight),
                               alone[start:start + rows]), (rows, start)


def test_every_variant_gives_the_same_bits(force_kernels):
    """Panels of 8 outputs (AVX2) or 16 (AVX-512) sum each output in the same order, so every
    variant gives the same bits; panels laid out for one variant run on it after the process
    switches to another."""
    names = build.runnable()
    if len(names) < 2:
        pytest.skip(f"this CPU runs one kernel variant only ({', '.join(names)})")
    g = torch.Generator().manual_seed(3)
    # a last panel of 5 outputs
    w, x = torch.randn(37, 75, generator=g), torch.randn(9, 75, generator=g)
    panels = {}
    for name in names:
        force_kernels(name)
        panels[name] = f32dot.FloatPanels(w)
    assert {name: p.width for name, p in panels.items()} == {n: 16 if n.startswith("avx512") else 8
                                                             for n in names}
    # all on the last variant's process
    y = {name: f32dot.linear(x, p) for name, p in panels.items()}
    torch.testing.assert_close(y[names[0]], x @ w.T, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(y[name], y[names[0]]) for name in names)


def test_the_fast_float_layer_hands_long_inputs_to_torch():
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(40, 24, bias=False)
    layer = fastpath.FloatKernel(linear.weight.detach())
    assert "f32dot" in layer.name
    x = torch.randn(1, ROW_BY_ROW_MAX + 3, 40, generator=g)
    with torch.no_grad():
        short, long = layer(x[:, :ROW_BY_ROW_MAX]), layer(x)
        torch.testing.assert_close(long, linear(x), rtol=1e-5, atol=1e-5)  # a prefill: torch's GEMM
        assert torch.equal(short, f32dot.linear(x[:, :ROW_BY_ROW_MAX], layer.panels))
