"""specq's int8-activation kernel (`kernels/int8dot.c`): the same numbers as a float64 reference of
its scheme, every row bit-identical whatever the row count (what keeps verify passes lossless), and
the fast path's switch to it and back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specq.backends import fastpath
from specq.kernels import int8dot
from specq.weights.quant.modules import FileBlocks, make_quant_linear
from specq.weights.quant.rtn import quantize_rtn

pytestmark = pytest.mark.skipif(not int8dot.available(), reason="needs AVX2 and a C compiler")

# code bits -> packing of (codes, d, m)
PACK = {4: int8dot.pack_int4, 6: int8dot.pack_int6, 8: int8dot.pack_int8}
CODES = {4: (0, 16), 6: (-32, 32), 8: (-128, 128)}  # code bits -> [low, high) of their codes


def reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
              offset: torch.Tensor | None) -> torch.Tensor:
    """The kernel's scheme in float64: x rounded to int8 per block of 32 (scale max|x| / 127),
    times w = scale * code (+ offset)."""
    blocks = x.double().view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    xq = (torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)) * amax / 127).view_as(x)
    group = w.shape[1] // scale.shape[1]
    weight = (w.double().view(w.shape[0], -1, group) * scale.double()[..., None]).view_as(w)
    y = xq @ weight.T
    if offset is not None:
        y += xq.view(x.shape[0], -1, group).sum(-1) @ offset.double().T
    return y


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("out", [64, 18])  # 18: a last panel of 2 outputs, padded to 8
def test_int4_weights_match_the_reference(group, out):
    g = torch.Generator().manual_seed(group + out)
    codes = torch.randint(0, 16, (out, 256), generator=g)
    scale = torch.rand(out, 256 // group, generator=g) * 0.02
    offset = -8 * scale + torch.randn(out, 256 // group, generator=g) * 1e-3
    x = torch.randn(9, 256, generator=g)
    x[3] = 0  # an all-zero row: scale 0, no division by zero
    y = int8dot.linear(x, int8dot.pack_int4(codes, scale, offset))
    torch.testing.assert_close(y.double(), reference(x, codes, scale, offset), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[3], torch.zeros(out))
    # no rows: no work
    assert int8dot.linear(x[:0], int8dot.pack_int4(codes, scale, offset)).shape == (0, out)


@pytest.mark.parametrize("bits", [2, 3])
@pytest.mark.parametrize("group", [16, 32, 256])
def test_int2_and_int3_weights_match_the_reference(bits, group):
    """GGUF's Q2_K, Q3_K (groups of 16) and TQ2_0 (256) codes at their own bits: codes in [0,
    2^bits) with offsets."""
    g = torch.Generator().manual_seed(group + bits)
    codes = torch.randint(0, 1 << bits, (40, 512), generator=g)
    scale = torch.rand(40, 512 // group, generator=g) * 0.05
    offset = torch.randn(40, 512 // group, generator=g) * 0.05
    x = torch.randn(9, 512, generator=g)
    y = int8dot.linear(x, int8dot.PACKS[bits](codes, scale, offset))
    torch.testing.assert_close(y.double(), reference(x, codes, scale, offset), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 256])
def test_int8_weights_match_the_reference(group):
    g = torch.Generator().manual_seed(group)
    codes = torch.randint(-128, 128, (36, 256), generator=g)
    codes[0, :32] = -128  # |w| = 128 goes through the kernel's unsigned-times-signed product
    scale = torch.rand(36, 256 // group, generator=g) * 0.01
    x = torch.randn(7, 256, generator=g) * 4
    y = int8dot.linear(x, int8dot.pack_int8(codes, scale))
    torch.testing.assert_close(y.double(), reference(x, codes, scale, None), rtol=1e-5, atol=1e-5)


def random_weight(bits: int, group: int, offsets: bool, out: int, n_in: int, g: torch.Generator):
    """Random codes [out, n_in] of `bits` bits, scales and (if `offsets`) offsets
    [out, n_in / group]."""
    codes = torch.randint(*CODES[bits], (out, n_in), generator=g)
    scale = torch.rand(out, n_in // group, generator=g) * 0.02
    offset = torch.randn(out, n_in // group, generator=g) * 0.05 if offsets else None
    return codes, scale, offset


FORMS = [(4, 64, True), (8, 192, False), (8, 32, True), (8, 16, False), (8, 16, True),
         (4, 16, True),
         (6, 16, False), (6, 32, True), (6, 64, False)]  # bits, group, offsets


@pytest.mark.parametrize("bits,group,offsets", FORMS[2:])
def test_offsets_and_groups_of_16_match_the_reference(bits, group, offsets):
    """6- and 8-bit codes with offsets (GGUF's Q5_1 / Q5_K) and groups of 16 (Q6_K), where each half
    of an activation block of 32 meets its own weight scale."""
    g = torch.Generator().manual_seed(bits * group)
    codes, scale, offset = random_weight(bits, group, offsets, 36, 256, g)
    if bits > 4:  # the extreme codes: through unsigned-times-signed products as |c| or c + bias
        codes[0, :32], codes[1, 32:64] = CODES[bits][0], CODES[bits][1] - 1
    x = torch.randn(7, 256, generator=g) * 4
    x[2] = 0
    y = int8dot.linear(x, PACK[bits](codes, scale, offset))
    torch.testing.assert_close(y.double(), reference(x, codes, scale, offset), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[2], torch.zeros(36))


@pytest.mark.parametrize("bits,group,offsets", FORMS)
def test_every_row_is_bit_identical_whatever_the_row_count(bits, group, offsets):
    g = torch.Generator().manual_seed(bits + group)
    out, n_in = 44, 192
    weight = PACK[bits](*random_weight(bits, group, offsets, out, n_in, g))
    x = torch.randn(11, n_in, generator=g)
    alone = torch.cat([int8dot.linear(x[i:i + 1], weight) for i in range(len(x))])
    for rows in range(1, len(x) + 1):  # row tiles of 4, 2 and 1; a last panel of 4 of 8 outputs
        for start in (0, len(x) - rows):
            assert torch.equal(int8dot.linear(x[start:start + rows], weight),
                               alone[start:start + rows]), (rows, start)


@pytest.mark.parametrize("bits,group,offsets", FORMS)
def test_unpack_gives_back_what_was_packed(bits, group, offsets):
    g = torch.Generator().manual_seed(group)
    codes, scale, offset = random_weight(bits, group, offsets, 21, 192, g)
    back = int8dot.unpack(PACK[bits](codes, scale, offset))
    assert torch.equal(back[0].long(), codes) and torch.equal(back[1], scale)
    assert back[2] is None if offset is None else torch.equal(back[2], offset)


@pytest.mark.parametrize("bits,symmetric",
                         [(4, False), (4, True), (3, False), (3, True), (2, False), (2, True),
                          (8, True)])
def test_the_fast_path_runs_integer_layers_on_int8dot_beside_their_torch_op(bits, symmetric):
    g = torch.Generator().manual_seed(bits)
    weight = torch.randn(48, 128, generator=g) * 0.05
    qw = quantize_rtn(weight, bits, 128 if bits == 8 else 64, symmetric)
    net = torch.nn.Sequential(make_quant_linear(qw, None, packed=True, dtype=torch.float32))
    x = torch.randn(5, 128, generator=g)
    torch_op = net(x)
    table = fastpath.kernels(net)
    assert list(table) == [net[0]] and "int8dot" in table[net[0]].name
    assert table[net[0]].weight.bits == bits  # 2- and 3-bit codes at their own bits a code
    fast = table[net[0]](x)
    exact = x @ qw.dequantize().float().T
    # both differ from the exact product only by the rounding of the activations (bf16 or int8)
    for y in (fast, torch_op):
        torch.testing.assert_close(y, exact, rtol=0.05, atol=0.05 * exact.abs().max().item())
    assert not torch.equal(fast, torch_op)  # a different kernel really ran
    # the module is as it was
    assert "int8dot" not in net[0].kernel and torch.equal(net(x), torch_op)


def test_gguf_blocks_use_the_files_own_scales():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (32, 64), generator=g)
    d, m = torch.rand(32, 2, generator=g) * 0.01, -torch.rand(32, 2, generator=g) * 0.05
    layer = FileBlocks(int8dot.pack_int4(codes, d, m), "Q4_1")
    kernel = fastpath.kernels(layer)[layer]
    assert "Q4_1" in kernel.name
    x = torch.randn(3, 64, generator=g)
    torch.testing.assert_close(kernel(x).double(), reference(x, codes, d, m), rtol=1e-5, atol=1e-5)


def test_torch_ops_run_where_the_kernel_is_unavailable(monkeypatch):
    qw = quantize_rtn(torch.randn(32, 64), 4, 64, False)
    net = torch.nn.Sequential(make_quant_linear(qw, None, packed=True, dtype=torch.float32))
    monkeypatch.setattr(int8dot, "available", lambda: False)
    assert fastpath.kernels(net) == {} and "_weight_int4pack_mm" in net[0].kernel


def test_the_kernels_compile_once_per_cache(tmp_path):
    code = ("from specq.kernels import decoder, int8dot; assert int8dot.available() and "
            "decoder.available()")
    env = {**os.environ, "SPECQ_CACHE": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stderr.count("compiling specq's CPU kernels") == 1 and runs[1].stderr == ""
    assert len(list((tmp_path / "kernels").glob("specq-*.so"))) == 1
