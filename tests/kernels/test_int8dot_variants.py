"""kernels/int8dot on every kernel variant this CPU runs: the same bits as the AVX2 variant for
every weight form and row count (VNNI's vpdpbusd and AVX-512's panels of 16 outputs change how the
exact integer block products are summed, never the float operations on them), every row the same
whatever the row count, and each weight laid out for the variant it was packed on."""

from __future__ import annotations

import pytest
import torch

from specq import backends
from specq.backends import fastpath
from specq.kernels import build, int8dot
from specq.weights.quant import quantize_model

from conftest import tiny_model

pytestmark = pytest.mark.skipif("avx2" not in build.runnable(), reason="needs AVX2")

PACK = int8dot.PACKS  # code bits -> packing of (codes, d, m)
# code bits -> [low, high) of their codes
CODES = {2: (0, 4), 3: (0, 8), 4: (0, 16), 6: (-32, 32), 8: (-128, 128)}
# bits, group, offsets: 2- to 4-bit codes always have offsets (Q2_K, TQ2_0, Q3_K, Q4_K, Q4_1); 6-
# and 8-bit ones with (Q5_1, Q5_K, a fused Q4_K q/k with a Q6_K v) or without (Q8_0, Q6_K at groups
# of 16, Q5_0)
FORMS = [(4, 32, True), (4, 16, True), (4, 64, True), (4, 128, True), (6, 16, False), (6, 16, True),
         (6, 32, False), (6, 32, True), (6, 128, False), (8, 16, False), (8, 16, True),
         (8, 32, False), (8, 32, True), (8, 64, False), (8, 128, True), (2, 16, True),
         (2, 32, True), (2, 128, True), (3, 16, True), (3, 32, True), (3, 64, True)]


def weight_and_rows(bits: int, group: int, offsets: bool, out: int, n_in: int, seed: int):
    """Random codes, scales and offsets with extreme codes (3, 7, 15, -128) and rows of 1 to 17 with
    an all-zero row, a tiny row and a huge one."""
    g = torch.Generator().manual_seed(seed)
    low, high = CODES[bits]
    codes = torch.randint(low, high, (out, n_in), generator=g)
    codes[:, :32], codes[:, 32:64] = (high - 1, low) if bits <= 4 else (low, high - 1)
    scale = torch.rand(out, n_in // group, generator=g) * 0.02
    offset = torch.randn(out, n_in // group, generator=g) * 0.05 if offsets else None
    x = torch.randn(17, n_in, generator=g) * 3
    x[1], x[5], x[9] = 0, x[5] * 1e-20, x[9] * 1e20
    return (codes, scale, offset), x


@pytest.mark.parametrize("bits,group,offsets", FORMS)
# last panels of 2, 8, 8
@pytest.mark.parametrize("out,n_in", [(64, 256), (18, 128), (40, 384), (8, 128)])
def test_every_variant_gives_the_avx2_bits(bits, group, offsets, out, n_in, kernel_variant):
    if n_in % group:
        pytest.skip("the group does not divide the inputs")
    parts, x = weight_and_rows(bits, group, offsets, out, n_in, seed=bits * group + out)
    ours, avx2 = PACK[bits](*parts, variant=kernel_variant), PACK[bits](*parts, variant="avx2")
    for rows in range(1, len(x) + 1):
        assert torch.equal(int8dot.linear(x[:rows], ours), int8dot.linear(x[:rows], avx2)), rows


@pytest.mark.parametrize("bits,group,offsets", FORMS)
def test_every_row_is_the_same_whatever_the_row_count(bits, group, offsets, kernel_variant):
    """1 to 17 rows: every row tile (1-4 rows on AVX2, 1-8 on AVX-512) and splits of 9 and 17."""
    parts, x = weight_and_rows(bits, group, offsets, 40, 256, seed=group)
    w = PACK[bits](*parts, variant=kernel_variant)
    alone = torch.cat([int8dot.linear(x[i:i + 1], w) for i in range(len(x))])
    for rows in range(1, len(x) + 1):
        for start in (0, len(x) - rows):
            assert torch.equal(int8dot.linear(x[start:start + rows], w),
                               alone[start:start + rows]), (rows, start)
    assert torch.equal(alone[1], torch.zeros(40))


# 2, 3, 4, 6, 8 bits
WIDTHS = {"avx2": (8,) * 5, "avxvnni": (8,) * 5, "avx512": (16, 16, 16, 8, 8),
          "avx512vnni": (16,) * 5}


def test_each_variant_lays_weights_out_in_its_own_panels(kernel_variant):
    """Panels of 16 outputs where the variant has 512-bit code for the weight's bits (6- and 8-bit
    codes need VNNI for it), else AVX2's 8; unpacking gives back what was
    packed in either layout."""
    assert (tuple(int8dot.panel_width(b, kernel_variant) for b in (2, 3, 4, 6, 8))
            == WIDTHS[kernel_variant])
    for bits, group, offsets in FORMS[:2] + FORMS[4:6] + FORMS[9:11] + FORMS[15:17] + FORMS[18:20]:
        (codes, scale, offset), _ = weight_and_rows(bits, group, offsets, 21, 128, seed=3)
        w = PACK[bits](codes, scale, offset)
        assert (w.variant == kernel_variant
                and w.codes.shape[3] == int8dot.panel_width(bits, kernel_variant))
        back = int8dot.unpack(w)
        assert torch.equal(back[0].long(), codes) and torch.equal(back[1], scale)
        assert back[2] is None if offset is None else torch.equal(back[2], offset)


VNNI256 = {**build.VARIANTS["avx2"], "avx512vl": "-mavx512vl", "avx512_vnni": "-mavx512vnni"}


def test_the_256_bit_vnni_code_gives_the_avx2_bits(monkeypatch):
    """The avxvnni variant (AVX2 machines with AVX-VNNI) multiplies on 256-bit vpdpbusd. Without
    AVX512BW the same code compiles with AVX-512 VNNI's 256-bit form of the instruction, so a CPU
    with AVX-512 VNNI checks it too, as a variant of its own made for this test."""
    if not VNNI256.keys() <= build.cpu_flags():
        pytest.skip("this CPU lacks AVX-512 VNNI")
    monkeypatch.setitem(build.VARIANTS, "vnni256", VNNI256)
    assert {int8dot.panel_width(bits, "vnni256") for bits in (2, 3, 4, 6, 8)} == {8}
    for bits, group, offsets in FORMS:
        parts, x = weight_and_rows(bits, group, offsets, 40, 256, seed=group + bits)
        ours, avx2 = PACK[bits](*parts, variant="vnni256"), PACK[bits](*parts, variant="avx2")
        for rows in (1, 3, 4, 7, 17):
            assert torch.equal(int8dot.linear(x[:rows], ours),
                               int8dot.linear(x[:rows], avx2)), (bits, group, rows)
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(1)) * 3
    for group, two_level, bits in [(32, False, 4), (16, True, 4), (16, True, 3)]:
        ours, eight, _ = grid_weight(group, two_level, EXTREME_GRID, 40, 512, 5, "vnni256", bits)
        for rows in (1, 3, 4, 7, 17):
            assert torch.equal(int8dot.linear(x[:rows], ours),
                               int8dot.linear(x[:rows], eight)), ("grid", group, rows)


@pytest.mark.parametrize("group,offsets", [(16, False), (16, True), (32, False), (64, True)])
def test_6_bit_codes_give_the_8_bit_forms_bits_in_fewer_bytes(group, offsets, kernel_variant):
    """The same codes in [-32, 31] packed at 6 bits (their top two bits apart) and at 8 give the
    same outputs bit for bit for every row count: the 6-bit form changes the
    bytes read, not a result."""
    parts, x = weight_and_rows(6, group, offsets, 40, 256, seed=group + 6)
    six, eight = (int8dot.pack_int6(*parts, variant=kernel_variant),
                  int8dot.pack_int8(*parts, variant=kernel_variant))
    assert six.codes.numel() * 8 == eight.codes.numel() * 6
    for rows in range(1, len(x) + 1):
        assert torch.equal(int8dot.linear(x[:rows], six), int8dot.linear(x[:rows], eight)), rows


@pytest.mark.parametrize("bits", [2, 3])
@pytest.mark.parametrize("group", [16, 32, 128])
def test_2_and_3_bit_codes_give_the_4_bit_forms_bits_in_fewer_bytes(bits, group, kernel_variant):
    """The same codes in [0, 2^bits) packed at their bits and at 4 give the same outputs bit for bit
    for every row count, with one- and two-level scales (Q2_K's, Q3_K's): the narrow form changes
    the bytes read, not a result."""
    (codes, d, m), x = weight_and_rows(bits, group, True, 40, 512, seed=group + bits)
    two, four = (int8dot.PACKS[bits](codes, d, m, variant=kernel_variant),
                 int8dot.pack_int4(codes, d, m, variant=kernel_variant))
    assert two.codes.numel() * 4 == four.codes.numel() * bits
    g = torch.Generator().manual_seed(group)
    supers, sub = (torch.rand(40, 2, generator=g) * 1e-3,
                   torch.randint(0, 16, (2, 40, 512 // group), generator=g))
    two_level = [int8dot.pack_two_level(b, codes, supers, -supers, sub[0].to(torch.int8),
                                        sub[1].to(torch.int8), int8dot.SUPER_SHIFT, kernel_variant)
                 for b in (bits, 4)]
    for rows in range(1, len(x) + 1):
        assert torch.equal(int8dot.linear(x[:rows], two), int8dot.linear(x[:rows], four)), rows
        assert torch.equal(int8dot.linear(x[:rows], two_level[0]),
                           int8dot.linear(x[:rows], two_level[1])), rows
    assert not torch.equal(int8dot.linear(x, two), int8dot.linear(x, two_level[0]))


IQ4_GRID = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                        dtype=torch.int8)
EXTREME_GRID = torch.tensor([-128, 127, -1, 0, 1, -127, 64, -64, 3, -3, 100, -100, 126, -126, 5, 2],
                            dtype=torch.int8)


def grid_weight(group: int, two_level: bool, grid: torch.Tensor, out: int, n_in: int, seed: int,
                variant: str, bits: int = 4):
    """Random `bits`-bit indices into `grid` (every index in the first inputs) with one- or
    two-level scales, packed as grid codes, and the same weights as 8-bit codes
    (the values they index)."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, 1 << bits, (out, n_in), generator=g, dtype=torch.uint8)
    indices[:, :1 << bits] = torch.arange(1 << bits, dtype=torch.uint8)
    values = grid[indices.long()]
    if two_level:  # IQ4_XS, IQ2: a float per super-block of 256 times an int8 per group
        d = torch.rand(out, -(-n_in // 256), generator=g) * 1e-3
        sub = torch.randint(-32, 32, (out, n_in // group), generator=g, dtype=torch.int8)
        lookup = int8dot.pack_two_level(bits, indices, d, None, sub, None, int8dot.SUPER_SHIFT,
                                        variant, grid)
        eight = int8dot.pack_two_level(8, values, d, None, sub, None, int8dot.SUPER_SHIFT, variant)
    else:  # IQ4_NL
        d = torch.rand(out, n_in // group, generator=g) * 0.02
        lookup = int8dot.pack_grid(indices, d, grid, variant, bits)
        eight = int8dot.pack_int8(values, d, variant=variant)
    return lookup, eight, indices


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("grid", [IQ4_GRID, EXTREME_GRID], ids=["iq4", "extremes"])
@pytest.mark.parametrize("group,two_level",
                         [(32, False), (16, False), (64, False), (32, True), (16, True)])
def test_grid_codes_give_the_8_bit_values_bits_in_fewer_bytes(group, two_level, grid, bits,
                                                              kernel_variant):
    """4-bit codes indexing a grid of 16 int8 values (GGUF's IQ4_NL / IQ4_XS), or 3-bit codes its
    first 8 (IQ2's six values), looked up in registers, give the outputs of the values themselves as
    8-bit codes bit for bit, on every variant and for every row count (so every row equals its
    one-row step): the lookup changes the bytes read, not a result."""
    seed = group + two_level + bits
    lookup, eight, indices = grid_weight(group, two_level, grid, 40, 512, seed,
                                         kernel_variant, bits)
    # per output
    code_bytes = [w.codes.numel() // (w.codes.shape[0] * w.codes.shape[3]) for w in (lookup, eight)]
    assert code_bytes == [512 * bits // 8, 512]
    back = int8dot.unpack(lookup)
    assert torch.equal(back[0], grid[indices.long()]) and back[2] is None
    avx2 = grid_weight(group, two_level, grid, 40, 512, seed, "avx2", bits)[0]
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(group)) * 3
    x[1], x[5], x[9] = 0, x[5] * 1e-20, x[9] * 1e20
    for rows in range(1, len(x) + 1):
        y = int8dot.linear(x[:rows], lookup)
        assert torch.equal(y, int8dot.linear(x[:rows], eight)), rows
        assert torch.equal(y, int8dot.linear(x[:rows], avx2)), rows


def test_a_grid_is_16_int8_values_without_offsets():
    indices, d = torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 1)
    for bad in (IQ4_GRID[:8], IQ4_GRID.float()):
        with pytest.raises(ValueError, match="16 int8 values"):
            int8dot.pack_grid(indices, d, bad, "avx2")
    with pytest.raises(ValueError, match="without offsets"):
        int8dot._pack(4, indices, d, d, 1, "avx2", grid=IQ4_GRID)


@pytest.mark.parametrize("bits,group,offsets",
                         [(4, 32, True), (6, 16, False), (6, 32, True), (8, 32, False)])
@pytest.mark.parametrize("out,n_in", [(40, 224), (21, 896), (16, 256)])
def test_one_super_block_per_row_gives_the_one_level_outputs(bits, group, offsets, out, n_in,
                                                             kernel_variant):
    """Codes whose group scales (and offsets) are int8 multiples of one float per row (what
    `gguf-int4` requantizes to, for any number of inputs, 896 included) give, for every row count,
    the output of the one-level weight holding the same float32 products, bit for bit."""
    if n_in % group:
        pytest.skip("the group does not divide the inputs")
    g = torch.Generator().manual_seed(n_in + bits)
    groups = n_in // group
    low, high = CODES[bits]
    codes = torch.randint(low, high, (out, n_in), generator=g).to(torch.uint8
                                                                  if bits == 4 else torch.int8)
    d, m = (torch.rand(out, 1, generator=g) * 1e-3,
            torch.randn(out, 1, generator=g) * 1e-3 if offsets else None)
    sub_d = torch.randint(0, 128, (out, groups), generator=g, dtype=torch.int8)
    sub_m = (torch.randint(-127, 128, (out, groups), generator=g, dtype=torch.int8)
             if offsets else None)
    two = int8dot.pack_two_level(bits, codes, d, m, sub_d, sub_m, int8dot.ROW_SHIFT,
                                 variant=kernel_variant)
    one_parts = (codes, d * sub_d.float(), None if m is None else m * sub_m.float())
    one = PACK[bits](*one_parts, variant="avx2")
    assert two.nbytes() < PACK[bits](*one_parts, variant=kernel_variant).nbytes()
    back = int8dot.unpack(two)
    assert torch.equal(back[0], codes) and torch.equal(back[1], d * sub_d.float())
    x = torch.randn(17, n_in, generator=g) * 3
    x[1], x[5] = 0, x[5] * 1e20
    for rows in range(1, len(x) + 1):
        assert torch.equal(int8dot.linear(x[:rows], two), int8dot.linear(x[:rows], one)), rows


@pytest.mark.parametrize("two_level,grid",
                         [(False, False), (True, False), (False, True), (True, True)],
                         ids=["one level", "two levels", "grid, one level", "grid, two levels"])
def test_taking_rows_of_a_4_bit_weight_packs_those_rows(two_level, grid, kernel_variant):
    """`take_rows` (a narrowed head from a 4-bit one) gives the weight packing the kept outputs
    alone would, on every variant's panels: the same bytes, so the same outputs."""
    g = torch.Generator().manual_seed(7)
    out, n_in, groups = 37, 224, 7
    codes = torch.randint(0, 16, (out, n_in), generator=g, dtype=torch.uint8)
    keep = torch.tensor([0, 3, 4, 17, 18, 19, 36])
    if grid and two_level:
        parts = (codes, torch.rand(out, 1, generator=g),
                 torch.randint(-32, 32, (out, groups), generator=g,
                               dtype=torch.int8))
        pack = lambda c, d, s: int8dot.pack_two_level(4, c, d, None, s, None,  # noqa: E731
                                                      int8dot.ROW_SHIFT, kernel_variant, IQ4_GRID)
    elif grid:
        parts = (codes, torch.rand(out, groups, generator=g))
        pack = lambda *t: int8dot.pack_grid(*t, IQ4_GRID, kernel_variant)  # noqa: E731
    elif two_level:
        d, m = torch.rand(out, 1, generator=g), torch.randn(out, 1, generator=g)
        sub_d = torch.randint(0, 128, (out, groups), generator=g, dtype=torch.int8)
        sub_m = torch.randint(-127, 128, (out, groups), generator=g, dtype=torch.int8)
        parts = (codes, d, m, sub_d, sub_m)
        pack = lambda *t: int8dot.pack_int4_two_level(*t, int8dot.ROW_SHIFT,  # noqa: E731
                                                      variant=kernel_variant)
    else:
        parts = (codes, torch.rand(out, groups, generator=g), torch.randn(out, groups, generator=g))
        pack = lambda *t: int8dot.pack_int4(*t, variant=kernel_variant)  # noqa: E731
    taken, direct = int8dot.take_rows(pack(*parts), keep), pack(*(t[keep] for t in parts))
    for name in ("codes", "d", "m", "sub", "grid"):
        a, b = getattr(taken, name), getattr(direct, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
    assert (taken.out_features, taken.super_shift, taken.variant) == (7, direct.super_shift,
                                                                      kernel_variant)
    with pytest.raises(ValueError, match="4-bit"):
        int8dot.take_rows(int8dot.pack_int8(*weight_and_rows(8, 32, False, 8, 64, 1)[0]), keep[:2])


def test_a_stack_refuses_int8dot_weights_of_another_variant(force_kernels):
    """int8dot weights have the layout of the variant they were packed on (panels of 8 or 16
    outputs): a stack made on another variant would read them wrongly, so it refuses them."""
    wide = [name for name in build.runnable() if int8dot.panel_width(4, name) != 8]
    if not wide:
        pytest.skip("this CPU runs no variant with panels of 16")
    force_kernels("avx2")
    model = tiny_model(scale=3.0, hidden=64)
    quantize_model(model.net, "int4-g32-rtn-head8", progress=False)
    run = backends.runner(model.net, "kernels")
    assert run.stack.variant == "avx2"
    force_kernels(wide[-1])
    with pytest.raises(ValueError,
                       match=f"int8dot weights laid out for the avx2 kernels, not {wide[-1]}"):
        fastpath.layer_stack(model.net, run.kernels)
