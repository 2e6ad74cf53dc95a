"""GGUF weight formats (`weights.gguf_formats`): every listed type read into the int8-activation
kernel's terms equals gguf's own dequantization bit for bit, the kernel holds exactly those
weights, and a tiny Llama GGUF file of these types runs at `@gguf` close to its float weights and
losslessly under speculative decoding."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specq import backends
from specq.backends import fastpath
from specq.kernels import build, gguf_repack, int8dot
from specq.loading.formats import gguf_io
from specq.core.types import Model
from specq.weights.gguf_formats import FORMATS, PACK, kernel_weight, stack_rows, to_float
from specq.weights.quant.modules import FileBlocks

from conftest import (assert_speculative_is_plain, perturbed, tiny_config, tiny_model,
                      tiny_tokenizer, without_stack)

QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
             "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "TQ1_0",
             "TQ2_0", "MXFP4"]
FORMS = {"Q4_0": (4, 32), "Q4_1": (4, 32), "Q5_0": (6, 32), "Q5_1": (6, 32), "Q8_0": (8, 32),
         "Q2_K": (2, 16), "Q3_K": (3, 16), "Q4_K": (4, 32), "Q5_K": (6, 32), "Q6_K": (6, 16),
         "IQ4_NL": (4, 32), "IQ4_XS": (4, 32), "IQ2_XXS": (3, 32), "IQ2_XS": (3, 16),
         "IQ2_S": (3, 16), "IQ3_XXS": (4, 32), "IQ3_S": (4, 32), "IQ1_S": (2, 32),
         "TQ1_0": (2, 256), "TQ2_0": (2, 256),
         "MXFP4": (4, 32)}  # the kernel's code bits and group size
# their 3- or 4-bit codes index a grid
GRID = {"IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "MXFP4"}
# codes with offsets of whole scales: +0 where gguf writes d * 0 for a code of zero (Q4_0, Q3_K, TQ)
# or for any code of a block whose d is 0 (IQ3_S, IQ1_S; see same_bits)
SIGNED_ZERO = {"Q4_0", "Q3_K", "TQ1_0", "TQ2_0", "IQ3_S", "IQ1_S"}
# a type without a row in the table: 256 weights in 56 bytes, its fp16 d spread over 4 scales
UNLISTED = "IQ1_M"
CODE_RANGES = {2: (0, 3), 3: (0, 7), 4: (0, 15), 6: (-32, 31), 8: (-128, 127)}


def fp16(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0,
         wide: bool = True) -> np.ndarray:
    """Random finite fp16 values: `wide`, of both signs over many magnitudes (fp16 subnormals
    included) and a few zero; else positive, within a factor 2 of `scale` (a model's scales)."""
    if not wide:
        return (rng.uniform(0.5, 1, shape) * scale).astype(np.float16)
    v = rng.uniform(-1, 1, shape) * scale * 2.0 ** rng.integers(-18, 3, shape)
    v[rng.random(shape) < 0.05] = 0
    return v.astype(np.float16)


def k_scale_bytes(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """8 sub-blocks' 6-bit scales and mins [n, 8] packed into 12 bytes as llama.cpp's
    quantize_row_q4_K_ref packs them."""
    out = np.zeros((len(scales), 12), np.uint8)
    for j in range(8):
        if j < 4:
            out[:, j], out[:, j + 4] = scales[:, j], mins[:, j]
        else:
            out[:, j + 4] = (scales[:, j] & 0xF) | ((mins[:, j] & 0xF) << 4)
            out[:, j - 4] |= (scales[:, j] >> 4) << 6
            out[:, j] |= (mins[:, j] >> 4) << 6
    return out


def low_nibble_bytes(codes: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K codes [n, 256] (their low 4 bits) -> 128 bytes: per 64 values, byte l holds
    value l in its low nibble and value 32 + l in its high one."""
    c = codes.reshape(-1, 4, 2, 32) & 0xF
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)


def two_bit_bytes(codes: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K codes [n, 256] (their low 2 bits) -> 64 bytes: per 128 values, value 32j + 16p +
    l in bits 2j of byte 16p + l."""
    c = codes.reshape(-1, 2, 4, 32) & 3
    return sum(c[:, :, j] << (2 * j) for j in range(4)).astype(np.uint8).reshape(-1, 64)


def q3_k_scale_bytes(scales: np.ndarray) -> np.ndarray:
    """16 6-bit scales [n, 16] packed into 12 bytes as llama.cpp's
    quantize_row_q3_K_ref packs them."""
    out = np.zeros((len(scales), 12), np.uint8)
    for i in range(16):
        out[:, i % 8] |= (scales[:, i] & 0xF) << (0 if i < 8 else 4)
        out[:, 8 + i % 4] |= (scales[:, i] >> 4) << (2 * (i // 4))
    return out


def low_bit_k_blocks(qtype: str, rng: np.random.Generator, n: int, d: np.ndarray, wide: bool):
    """k_blocks for Q2_K (2-bit codes, 4-bit sub-scales and mins) and Q3_K (3-bit codes: the low 2
    bits, a mask of high bits; 6-bit sub-scales minus 32)."""
    if qtype == "Q2_K":
        codes = rng.integers(0, 4, (n, 256), dtype=np.uint8)
        scales = rng.integers(0, 16, (n, 16), dtype=np.uint8)
        mins = rng.integers(0, 16, (n, 16), dtype=np.uint8) if wide else scales
        dmin = fp16(rng, (n, 1)) if wide else (d.astype(np.float32) * 1.5).astype(np.float16)
        blocks = np.concatenate([scales | (mins << 4), two_bit_bytes(codes), d.view(np.uint8),
                                 dmin.view(np.uint8)], 1)
        scaled = d.astype(np.float64) * np.repeat(scales, 16, axis=1) * codes
        offset = dmin.astype(np.float64) * np.repeat(mins, 16, axis=1)
        return blocks, scaled - offset, np.abs(scaled) + np.abs(offset)
    codes = rng.integers(0, 8, (n, 256), dtype=np.uint8)
    scales = rng.integers(0, 64, (n, 16), dtype=np.uint8)
    # [n, p, l, bit b]: value 16 (2b + p) + l
    high = (codes.reshape(n, 8, 2, 16) >> 2).transpose(0, 2, 3, 1)
    hmask = (high << np.arange(8, dtype=np.uint8)).sum(-1).astype(np.uint8).reshape(n, 32)
    blocks = np.concatenate([hmask, two_bit_bytes(codes), q3_k_scale_bytes(scales),
                             d.view(np.uint8)], 1)
    weights = d.astype(np.float64) * (np.repeat(scales, 16, axis=1) - 32.0) * (codes - 4.0)
    return blocks, weights, np.abs(weights)


# weight std per unit of d in a model-like block (the codes' spread times a typical sub-scale)
K_SPREAD = {"Q2_K": 10, "Q3_K": 42, "Q4_K": 166, "Q5_K": 330, "Q6_K": 1370}


def k_blocks(qtype: str, rng: np.random.Generator, n: int, scale: float = 1.0, wide: bool = True):
    """n random super-blocks of a K-quant, byte by byte, and what they hold: float64 weights [n,
    256] computed from the chosen d, sub-scales and codes, and the size of their terms (for a
    float32 rounding bound). Not `wide`: weights of std about `scale`, centred (mins = scales, dmin
    = d times the codes' middle), as a model's."""
    d = fp16(rng, (n, 1), scale if wide else scale / K_SPREAD[qtype], wide)
    if qtype in ("Q2_K", "Q3_K"):
        return low_bit_k_blocks(qtype, rng, n, d, wide)
    if qtype == "Q6_K":
        codes = rng.integers(0, 64, (n, 256), dtype=np.uint8)
        scales = rng.integers(-128, 128, (n, 16)).astype(np.int8)
        ql = np.zeros((n, 128), np.uint8)
        qh = np.zeros((n, 64), np.uint8)
        for h in range(2):  # llama.cpp's quantize_row_q6_K_ref, per 128 values
            c = codes[:, 128 * h:128 * h + 128]
            ql[:, 64 * h:64 * h + 64] = (c[:, :64] & 0xF) | ((c[:, 64:] & 0xF) << 4)
            qh[:, 32 * h:32 * h + 32] = sum((c[:, 32 * s:32 * s + 32] >> 4) << (2 * s)
                                            for s in range(4))
        blocks = np.concatenate([ql, qh, scales.view(np.uint8), d.view(np.uint8)], axis=1)
        weights = (d.astype(np.float64) * np.repeat(scales, 16, axis=1)
                   * (codes.astype(np.float64) - 32))
        return blocks, weights, np.abs(weights)
    top = 32 if qtype == "Q5_K" else 16
    codes = rng.integers(0, top, (n, 256), dtype=np.uint8)
    scales = rng.integers(0, 64, (n, 8), dtype=np.uint8)
    mins = rng.integers(0, 64, (n, 8), dtype=np.uint8) if wide else scales
    dmin = fp16(rng, (n, 1)) if wide else (d.astype(np.float32) * (top - 1) / 2).astype(np.float16)
    parts = [d.view(np.uint8), dmin.view(np.uint8), k_scale_bytes(scales, mins)]
    if qtype == "Q5_K":  # bit j of byte l: the fifth bit of value l of sub-block j
        high = (codes.reshape(n, 8, 32) >> 4).transpose(0, 2, 1)
        parts.append((high << np.arange(8, dtype=np.uint8)).sum(-1).astype(np.uint8))
    blocks = np.concatenate(parts + [low_nibble_bytes(codes)], axis=1)
    scaled = d.astype(np.float64) * np.repeat(scales, 32, axis=1) * codes
    offset = dmin.astype(np.float64) * np.repeat(mins, 32, axis=1)
    return blocks, scaled - offset, np.abs(scaled) + np.abs(offset)


# types read as random bytes: weights per block, bytes per block, where its fp16
# scales start, how many
RANDOM_BYTES = {"IQ4_NL": (32, 18, 0, 1), "IQ4_XS": (256, 136, 0, 1), "IQ2_XXS": (256, 66, 0, 1),
                "IQ2_XS": (256, 74, 0, 1), "IQ2_S": (256, 82, 0, 1), "IQ3_XXS": (256, 98, 0, 1),
                "IQ3_S": (256, 110, 0, 1), "IQ1_S": (256, 50, 0, 1), "TQ1_0": (256, 54, 52, 1),
                "TQ2_0": (256, 66, 64, 1), "MXFP4": (32, 17, 0, 0), UNLISTED: (256, 56, 0, 0)}


def random_tensor(qtype: str, rng: np.random.Generator, rows: int, cols: int, scale: float = 1.0,
                  wide: bool = False) -> np.ndarray:
    """A [rows, cols] tensor of `qtype` as a file stores it, uint8 [rows, row bytes]: K-quants byte
    by byte, the IQ, TQ and MXFP4 types and the unlisted one random bytes with finite scales (any
    other byte is valid),
    the others quantized by gguf from normal values (`wide`: rows of many magnitudes); one all-zero
    block."""
    if qtype in K_SPREAD:
        return k_blocks(qtype, rng, rows * cols // 256, scale, wide)[0].reshape(rows, -1)
    if qtype in RANDOM_BYTES:  # every byte pattern is a valid block; its fp16 scales made finite
        block, size, start, halves = RANDOM_BYTES[qtype]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        raw[..., start:start + 2 * halves] = fp16(rng, (rows, cols // block, halves), scale / 20,
                                                  wide).view(np.uint8)
        if qtype == "MXFP4":  # its e8m0 exponent byte: scales of 2^-16 to 2^7
            raw[..., 0] = rng.integers(112, 136, raw.shape[:2])
        if qtype == "IQ1_M":  # the top exponent bit of its d (bit 14, in byte 55) cleared: finite
            raw[..., 55] &= 0xBF
        return raw.reshape(rows, -1)
    x = rng.standard_normal((rows, cols)) * scale
    if wide:
        x *= 2.0 ** rng.integers(-12, 4, (rows, 1))
    x[0, :32] = 0
    return np.ascontiguousarray(quants.quantize(x.astype(np.float32),
                                                GGMLQuantizationType[qtype])).view(np.uint8)


def same_bits(ours: np.ndarray, reference: np.ndarray, zero_sign: bool = False) -> bool:
    """Bit for bit; with `zero_sign` (Q4_0), up to the sign of zero: gguf's d * (u - 8) is -0 where
    d < 0, the table's d * u - 8d is +0 (adding +0 makes every zero +0, other values stay)."""
    if zero_sign:
        ours, reference = ours + np.float32(0), reference + np.float32(0)
    return np.array_equal(*(np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
                            for w in (ours, reference)))


@pytest.mark.parametrize("qtype", QUANTIZED + ["F32", "F16", "BF16"])
def test_every_format_reads_as_gguf_dequantizes_bit_for_bit(qtype):
    rng = np.random.default_rng(sum(map(ord, qtype)))
    raw = random_tensor(qtype, rng, 12, 512, scale=3.0, wide=True)
    reference = quants.dequantize(raw, GGMLQuantizationType[qtype])
    fmt = FORMATS[qtype]
    assert same_bits(fmt.to_float(raw), reference, zero_sign=qtype in SIGNED_ZERO)
    if fmt.floats is None:
        kb = fmt.kernel_blocks(raw)
        assert (kb.bits, kb.group_size) == FORMS[qtype] and kb.codes.shape == (12, 512)
        assert (kb.grid is not None) == (qtype in GRID)
        assert kb.d.dtype == np.float32 and kb.d.shape == (12, 512 // kb.group_size)
        low, high = CODE_RANGES[kb.bits]
        assert kb.codes.dtype == (np.uint8 if kb.bits <= 4 else np.int8)
        assert low <= kb.codes.min() and kb.codes.max() <= high
        assert same_bits(kb.dequantize(), reference, zero_sign=qtype in SIGNED_ZERO)


def test_q4_0_differs_from_gguf_only_in_the_sign_of_zero():
    """The one exception `same_bits` allows is real and only that: a
    negative-scale block's code 8."""
    raw = random_tensor("Q4_0", np.random.default_rng(3), 8, 256)
    ours, reference = (FORMATS["Q4_0"].to_float(raw),
                       quants.dequantize(raw, GGMLQuantizationType.Q4_0))
    differ = ours.view(np.uint32) != reference.view(np.uint32)
    assert differ.any() and np.all(ours[differ] == 0) and np.all(np.signbit(reference[differ]))


@pytest.mark.parametrize("qtype", list(K_SPREAD))
def test_k_quant_blocks_hold_the_chosen_sub_scales_and_codes(qtype):
    """The byte-by-byte blocks above are what they claim (gguf reads back the weights the chosen d,
    6-bit scales and mins and codes define, up to float32 rounding); the table's per-group scales
    are d times the sub-scale exactly."""
    blocks, weights, size = k_blocks(qtype, np.random.default_rng(5), 40)
    assert np.all(np.abs(quants.dequantize(blocks, GGMLQuantizationType[qtype]) - weights)
                  <= 2 ** -22 * size)
    kb = FORMATS[qtype].kernel_blocks(blocks)
    if qtype == "Q2_K":
        d, dmin = (blocks[:, i:i + 2].copy().view(np.float16).astype(np.float64) for i in (80, 82))
        scales, mins = blocks[:, :16] & 0xF, blocks[:, :16] >> 4
        assert np.array_equal(kb.d, d * scales) and np.array_equal(kb.m, -(dmin * mins))
        return
    # every term exact in float32: the weights themselves, and the offset -4 scales
    if qtype == "Q3_K":
        assert (np.array_equal(kb.dequantize(), weights)
                and np.array_equal(kb.m, np.float32(-4) * kb.d))
        assert kb.codes.min() == 0 and kb.codes.max() == 7
        return
    if qtype == "Q6_K":
        d, scales = (blocks[:, 208:210].copy().view(np.float16),
                     blocks[:, 192:208].copy().view(np.int8))
        assert np.array_equal(kb.d, d.astype(np.float64) * scales) and kb.m is None
        return
    scales, mins = quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    d, dmin = (blocks[:, i:i + 2].copy().view(np.float16).astype(np.float64) for i in (0, 2))
    assert np.array_equal(kb.d, d * scales) and np.array_equal(kb.m, -(dmin * mins))


def test_unlisted_types_are_dequantized_by_gguf():
    raw = random_tensor(UNLISTED, np.random.default_rng(7), 4, 512, wide=True)
    assert UNLISTED not in FORMATS
    assert np.array_equal(to_float(raw, UNLISTED),
                          quants.dequantize(raw, GGMLQuantizationType[UNLISTED]))


@pytest.mark.parametrize("types,form",
                         [(["Q4_K", "Q6_K", "Q8_0", "Q5_1", "Q4_0"], (8, 16, True, False)),
                          (["Q4_K", "Q4_K", "Q6_K"], (6, 16, True, False)),
                          (["Q5_0", "Q4_0"], (6, 32, True, False)),
                          (["IQ4_XS", "IQ4_NL"], (4, 32, False, True)),
                          (["IQ4_XS", "IQ4_XS", "Q5_K"], (8, 32, True, False))])
def test_stacked_formats_keep_every_part_exactly(types, form):
    """A fused layer of parts in different formats (Q4_K_M files store attn_v as Q6_K beside Q4_K
    q and k; IQ4_XS files as Q5_K beside IQ4_XS) takes one form that holds each part's weights
    exactly: the widest codes, the finest groups, offsets (-0 for parts without: d * c + -0 keeps
    even the sign of a zero), grid codes where every part has them, else their values."""
    rng = np.random.default_rng(9)
    raws = [random_tensor(q, rng, 8 * (i + 1), 256, wide=True) for i, q in enumerate(types)]
    parts = [FORMATS[q].kernel_blocks(raw) for q, raw in zip(types, raws)]
    stacked = stack_rows(parts)
    assert ((stacked.bits, stacked.group_size, stacked.m is not None, stacked.grid is not None)
            == form)
    w, start = stacked.dequantize(), 0
    for q, raw in zip(types, raws):
        assert same_bits(w[start:start + len(raw)], quants.dequantize(raw, GGMLQuantizationType[q]),
                         q == "Q4_0"), q
        start += len(raw)
    assert stack_rows(parts[:1]) is parts[0]


def numpy_packed(parts: list[tuple[str, np.ndarray]], variant: str) -> int8dot.Int8DotWeight:
    """The reference path: the numpy decoders (checked against gguf above) and int8dot's packing."""
    kb = stack_rows([FORMATS[q].kernel_blocks(raw) for q, raw in parts])
    codes, d, m = (None if a is None else torch.from_numpy(a) for a in (kb.codes, kb.d, kb.m))
    if kb.grid is not None:
        return int8dot.pack_grid(codes, d, torch.from_numpy(kb.grid), variant, kb.bits)
    return PACK[kb.bits](codes, d, m, variant=variant)


def same_weight(a: int8dot.Int8DotWeight, b: int8dot.Int8DotWeight) -> bool:
    """The same form and weights: codes and each group's d and m to the bit (the sign of a zero
    included), whether the scales are kept in one level or two."""
    if (a.bits, a.group_size, a.out_features, a.in_features, a.variant) != (
            b.bits, b.group_size, b.out_features, b.in_features,
            b.variant) or (a.m is None) != (b.m is None):
        return False
    if ((a.grid is None) != (b.grid is None)
        or (a.grid is not None and not torch.equal(a.grid, b.grid))):
        return False
    (ca, *fa), (cb, *fb) = int8dot.unpack(a), int8dot.unpack(b)
    floats = [(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(fa, fb) if x is not None]
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in [(ca, cb), *floats])


K_ONLY = [["Q2_K"], ["Q3_K"], ["Q4_K"], ["Q5_K"], ["Q6_K"], ["IQ4_XS"], ["Q4_K", "Q4_K", "Q6_K"],
          ["Q3_K", "Q2_K", "Q4_K"], ["Q4_K", "IQ4_XS"], ["IQ4_XS", "IQ4_XS", "Q5_K"], ["IQ2_XXS"],
          ["IQ2_XS"],
          # two-level scales: every part a K-quant, IQ4_XS or IQ3_S (in C), or
          # IQ2 and IQ3 (in numpy)
          ["IQ2_S"], ["IQ3_XXS"], ["IQ3_S"], ["IQ2_XS", "IQ3_S"], ["IQ3_S", "IQ3_S", "Q4_K"]]


@pytest.mark.parametrize("parts", [[q] for q in QUANTIZED] + [p for p in K_ONLY if len(p) > 1] + [
    ["Q4_K", "Q6_K", "Q8_0", "Q5_1", "Q4_0", "Q5_K", "Q3_K", "IQ4_NL"], ["IQ4_XS", "IQ4_NL"]])
def test_repacking_in_c_lays_out_the_numpy_decoders_weights(parts, kernel_variant):
    """`kernel_weight` reads the file's bytes in C (`kernels/gguf_repack.c`) into the weights the
    numpy decoders and int8dot's packing give, on every variant's panels, with padded panels (rows
    not a multiple of 16) and fused parts of mixed formats; K-quants alone keep their scales in two
    levels, in fewer bytes; IQ4 parts alone keep their codes as indices into their grid."""
    rng = np.random.default_rng(len(parts) + sum(map(ord, parts[0])))
    raws = [(q, random_tensor(q, rng, 4 * i + 3, 512, scale=3.0, wide=True))
            for i, q in enumerate(parts)]
    fast, reference = kernel_weight(raws), numpy_packed(raws, kernel_variant)
    assert fast.variant == kernel_variant and same_weight(fast, reference)
    assert not same_weight(fast, numpy_packed([(q, raw ^ np.uint8(1)) for q, raw in raws],
                                              kernel_variant))
    assert (fast.sub is not None) == (parts in K_ONLY)
    assert (fast.grid is not None) == (set(parts) <= GRID)
    assert (fast.nbytes() < reference.nbytes()
            if parts in K_ONLY else fast.nbytes() == reference.nbytes())


@pytest.mark.parametrize("parts", K_ONLY)
def test_two_level_scales_give_the_one_level_outputs_on_every_variant(parts, kernel_variant):
    """The kernel multiplies a super-block's scale by the group's sub-scale into exactly the float32
    group scale the one-level layout stores: every row count (each tile size) gives the one-level
    weight's output on AVX2 bit for bit, so the layout changes no computed bit."""
    rng = np.random.default_rng(sum(map(ord, "".join(parts))))
    raws = [(q, random_tensor(q, rng, 8 * i + 5, 512, scale=0.3)) for i, q in enumerate(parts)]
    two, one = kernel_weight(raws), numpy_packed(raws, "avx2")
    assert two.sub is not None and one.sub is None
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(1)) * 3
    x[1], x[5], x[9] = 0, x[5] * 1e-20, x[9] * 1e20
    for rows in range(1, len(x) + 1):
        assert torch.equal(int8dot.linear(x[:rows], two), int8dot.linear(x[:rows], one)), rows


def test_without_specqs_kernels_the_numpy_path_lays_out_the_same_weight(monkeypatch):
    raws = [(q, random_tensor(q, np.random.default_rng(2), 5, 256, wide=True))
            for q in ("Q4_K", "Q6_K", "Q3_K", "IQ4_XS")]
    if not build.available():
        pytest.skip("needs AVX2 and a C compiler")
    fast = kernel_weight(raws)
    monkeypatch.setattr(build, "available", lambda: False)
    monkeypatch.setattr(gguf_repack, "repack", None)  # not called
    assert same_weight(kernel_weight(raws, fast.variant), fast)


def test_repacking_refuses_a_form_that_would_lose_bits():
    if not build.available():
        pytest.skip("needs AVX2 and a C compiler")
    raw = random_tensor("Q6_K", np.random.default_rng(4), 2, 256)
    # narrower codes, coarser groups
    for bits, group, offsets in [(4, 16, True), (6, 32, False), (8, 64, False)]:
        with pytest.raises(ValueError, match="cannot lay out"):
            gguf_repack.repack([(FORMATS["Q6_K"].ggml, raw)], 256, bits, group, offsets,
                               build.variant())
    with pytest.raises(ValueError, match="cannot lay out"):  # 8-bit codes in 6 bits
        gguf_repack.repack([(FORMATS["Q8_0"].ggml,
                             random_tensor("Q8_0", np.random.default_rng(4), 2, 256))], 256, 6,
                           32, False, build.variant())
    raw = random_tensor("Q4_K", np.random.default_rng(4), 2, 256)
    with pytest.raises(ValueError, match="cannot lay out"):  # 4-bit codes in 2 bits
        gguf_repack.repack([(FORMATS["Q4_K"].ggml, raw)], 256, 2, 32, True, build.variant())
    with pytest.raises(ValueError, match="cannot lay out"):  # offsets dropped
        gguf_repack.repack([(FORMATS["Q4_K"].ggml, raw)], 256, 8, 32, False, build.variant())
    grid = FORMATS["IQ4_NL"].grid
    with pytest.raises(ValueError, match="indexing a grid"):  # a format without a grid looked up
        gguf_repack.repack([(FORMATS["Q4_K"].ggml, raw)], 256, 4, 32, True, build.variant(),
                           grid=grid)
    raw = random_tensor("IQ4_NL", np.random.default_rng(4), 2, 256, wide=True)
    # values need 8 bits; IQ4 a lookup 4
    for bits, lookup in [(4, False), (6, False), (8, True), (3, True)]:
        with pytest.raises(ValueError, match="cannot lay out"):
            gguf_repack.repack([(FORMATS["IQ4_NL"].ggml, raw)], 256, bits, 32, False,
                               build.variant(), grid=grid if lookup else None)


# ------------------------------------------------------------------ a tiny GGUF file of these types

# GGUF tensor -> type, per layer: each listed type and float linears, fused parts mixed
LAYER_TYPES = {
    0: {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_K",
        "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": "Q8_0"},
    1: {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q4_0", "attn_output": "Q4_1",
        "ffn_gate": "Q5_1", "ffn_up": "Q5_1", "ffn_down": "Q6_K"},
    2: {"attn_q": "F16", "attn_k": "F16", "attn_v": "F16", "attn_output": "BF16",
        "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "F32"},
    3: {"attn_q": "Q3_K", "attn_k": "Q3_K", "attn_v": "Q2_K", "attn_output": "IQ4_XS",
        "ffn_gate": "Q2_K",
        "ffn_up": "Q2_K", "ffn_down": "IQ4_NL"},  # a low-bit file's layer
    4: {"attn_q": "IQ2_XXS", "attn_k": "IQ2_XXS", "attn_v": "IQ3_S", "attn_output": "IQ2_XS",
        "ffn_gate": "IQ3_XXS",
        "ffn_up": "IQ1_S", "ffn_down": "IQ2_S"},  # codes read through gguf
    5: {"attn_q": "TQ2_0", "attn_k": "TQ2_0", "attn_v": "TQ2_0", "attn_output": "MXFP4",
        "ffn_gate": "MXFP4", "ffn_up": "MXFP4", "ffn_down": "TQ1_0"},
}
VOCAB, HIDDEN = 40, 256  # K-quant rows need a multiple of 256 inputs


def write_formats_gguf(path, seed: int = 0, layer_types: dict = LAYER_TYPES,
                       output: str = "Q6_K") -> None:
    """A Llama GGUF file, a layer per entry of `layer_types`, whose linear layers hold random
    weights of the types above."""
    import gguf

    c = tiny_config(VOCAB, len(layer_types), HIDDEN)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(w.add_block_count, c.num_layers), (w.add_embedding_length, c.hidden_size),
                       (w.add_feed_forward_length, c.intermediate_size),
                       (w.add_head_count, c.num_heads), (w.add_head_count_kv, c.num_kv_heads),
                       (w.add_rope_freq_base, c.rope_theta),
                       (w.add_layer_norm_rms_eps, c.rms_norm_eps),
                       (w.add_context_length, c.max_position_embeddings),
                       (w.add_vocab_size, c.vocab_size)]:
        add(value)
    kv = c.num_kv_heads * c.head_dim
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (c.intermediate_size, HIDDEN),
              "ffn_up": (c.intermediate_size, HIDDEN), "ffn_down": (HIDDEN, c.intermediate_size)}

    def add_tensor(name: str, qtype: str, rows: int, cols: int, scale: float) -> None:
        t = GGMLQuantizationType[qtype]
        w.add_tensor(name, random_tensor(qtype, rng, rows, cols, scale), raw_dtype=t)

    add_tensor("token_embd.weight", "Q8_0", VOCAB, HIDDEN, 1.0)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    add_tensor("output.weight", output, VOCAB, HIDDEN, 0.3)
    for i, types in layer_types.items():
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        for name, qtype in types.items():
            add_tensor(f"blk.{i}.{name}.weight", qtype, *shapes[name],
                       0.3 / np.sqrt(shapes[name][1] / 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def float_twin(parsed: gguf_io.GGUFFile) -> Model:
    """The file's weights dequantized by gguf, as a float32 model."""
    model = tiny_model(vocab=VOCAB, layers=parsed.config.num_layers, hidden=HIDDEN)
    model.net.load_state_dict(parsed.float_state_dict())
    return model


@pytest.fixture(scope="module")
def formats_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "formats.gguf"
    write_formats_gguf(path)
    return gguf_io.read(path)


def test_every_linear_runs_the_files_own_weights(formats_file):
    """Each quantized linear layer is one `FileBlocks`, its kernel tensors d * code + m equal to
    gguf's dequantization of the file bit for bit; float linears stay float; nothing is noted."""
    net, notes = gguf_io.load_at_file_precision(formats_file)
    assert notes == []
    reference = formats_file.float_state_dict()
    forms = {"layers.0.attention.wqkv": (6, 16), "layers.0.attention.wo": (6, 32),
             "layers.0.feed_forward.w13": (6, 32), "layers.0.feed_forward.w2": (8, 32),
             "layers.1.attention.wqkv": (4, 32), "layers.1.attention.wo": (4, 32),
             "layers.1.feed_forward.w13": (6, 32), "layers.1.feed_forward.w2": (6, 16),
             "layers.2.feed_forward.w13": (4, 32), "layers.3.attention.wqkv": (3, 16),
             "layers.3.attention.wo": (4, 32), "layers.3.feed_forward.w13": (2, 16),
             "layers.3.feed_forward.w2": (4, 32), "layers.4.attention.wqkv": (8, 32),
             "layers.4.attention.wo": (3, 16), "layers.4.feed_forward.w13": (8, 32),
             "layers.4.feed_forward.w2": (3, 16), "layers.5.attention.wqkv": (2, 256),
             "layers.5.attention.wo": (4, 32), "layers.5.feed_forward.w13": (4, 32),
             "layers.5.feed_forward.w2": (2, 256), "output": (6, 16)}
    for name, (bits, group) in forms.items():
        module = net.get_submodule(name)
        assert isinstance(module, FileBlocks) and (module.bits, module.group_size) == (bits,
                                                                                       group), name
        codes, d, m = int8dot.unpack(module._blocks)
        w = codes.float().view(codes.shape[0], -1, group) * d[..., None]
        w = (w if m is None else w + m[..., None]).view_as(codes)
        signed_zero = name in ("layers.1.attention.wqkv", "layers.3.attention.wqkv",
                               "layers.5.attention.wqkv",
                               "layers.5.feed_forward.w2")  # Q4_0, Q3_K and TQ parts
        assert same_bits(w.numpy(), reference[f"{name}.weight"].numpy(), signed_zero), name
    assert "Q4_K+Q6_K blocks" in net.layers[0].attention.wqkv.kernel
    grids = {name for name in forms if net.get_submodule(name)._blocks.grid is not None}
    # IQ4, IQ2
    assert grids == {"layers.3.attention.wo", "layers.3.feed_forward.w2", "layers.4.attention.wo",
                     # MXFP4
                     "layers.4.feed_forward.w2", "layers.5.attention.wo",
                     "layers.5.feed_forward.w13"}
    for name in ("layers.2.attention.wqkv", "layers.2.attention.wo", "layers.2.feed_forward.w2"):
        linear = net.get_submodule(name)
        assert (type(linear) is torch.nn.Linear
                and torch.equal(linear.weight, reference[f"{name}.weight"])), name
    if int8dot.available():  # what --explain says: grid codes by name
        table = fastpath.kernels(net)
        assert all(("16-value grid" in table[net.get_submodule(name)].name) == (name in grids)
                   for name in forms)


def test_unlisted_types_run_dequantized_with_one_note(tmp_path):
    path = tmp_path / "unlisted.gguf"
    write_formats_gguf(path, layer_types={i: {**LAYER_TYPES[1], "attn_output": UNLISTED}
                                          for i in range(2)})
    parsed = gguf_io.read(path)
    net, notes = gguf_io.load_at_file_precision(parsed)
    assert (notes == [f"{UNLISTED} tensors run dequantized to float32 (specq has no kernel for "
                      f"{UNLISTED})"])
    for i in range(2):
        wo = net.layers[i].attention.wo
        assert type(wo) is torch.nn.Linear
        assert torch.equal(wo.weight, parsed.float_state_dict()[f"layers.{i}.attention.wo.weight"])
    assert isinstance(net.layers[0].attention.wqkv, FileBlocks)


@torch.inference_mode()
def test_each_layer_is_within_the_int8_activations_rounding(formats_file):
    """On the fast path each quantized layer computes x . w for the file's exact w with x rounded to
    int8 per block of 32: off by at most sum |w| * max|x_block| / 254 (half a step of each x)."""
    if not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    net, _ = gguf_io.load_at_file_precision(formats_file)
    table = fastpath.kernels(net)
    reference = formats_file.float_state_dict()
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0)) * 2
    for name, module in net.named_modules():
        if isinstance(module, FileBlocks):
            xs, w = x[:, :module.in_features], reference[f"{name}.weight"].double()
            step = xs.view(5, -1, 32).abs().amax(-1).repeat_interleave(32, -1).double() / 254
            bound = step @ w.abs().T * (1 + 1e-4) + 1e-6
            error = (table[module](xs).double() - xs.double() @ w.T).abs()
            assert (error <= bound).all() and error.max() > 0, name


@torch.inference_mode()
def test_logits_follow_the_float_weights_on_both_paths(formats_file):
    """@gguf on the fast path (int8 activations) and on the eager path (torch's int4 kernel, bf16
    weights) stays within a few percent of the file's float weights, the same greedy tokens wherever
    the float model's top two logits are further apart than twice that error (random weights make
    near ties)."""
    if not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    exact = float_twin(formats_file).net
    eager, _ = gguf_io.load_at_file_precision(formats_file)
    fast = backends.runner(eager, "kernels")
    assert len(fast.kernels) >= 10 and fast.stack is not None
    assert "int8dot" in fast.kernels[eager.layers[0].attention.wqkv].name
    assert "bf16" in eager.layers[0].attention.wqkv.kernel
    assert "int4 packed kernel" in eager.layers[1].attention.wqkv.kernel
    assert "int4 packed kernel" in eager.layers[5].attention.wqkv.kernel  # TQ2_0's 2-bit codes too
    ids = torch.tensor([1, 5, 9, 2, 7, 3, 30, 11])
    want = exact(ids)
    top2 = want.topk(2, dim=-1).values
    for net in (fast, eager):
        error = net(ids) - want
        rms = error.pow(2).mean().sqrt()
        assert 0 < rms <= 0.05 * want.pow(2).mean().sqrt()  # another kernel, close
        clear = top2[:, 0] - top2[:, 1] > 2 * rms
        assert (clear.sum() >= len(ids) // 2
                and (net(ids).argmax(-1) == want.argmax(-1))[clear].all())


@torch.inference_mode()
def test_the_layer_stack_runs_every_format_as_the_modules_do(formats_file):
    """decoder.Stack passes groups of 16 and 8-bit offsets to the kernel as the modules do: one
    call for all layers gives the torch modules' logits (relative RMS error: int8dot quantizes
    activations that the two round apart), and verify rows equal one-token steps bit for bit."""
    if not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    net, _ = gguf_io.load_at_file_precision(formats_file)
    stacked = backends.runner(net, "kernels")
    modules = without_stack(stacked)
    prompt, chain = torch.tensor([3, 1, 4, 1, 5, 9]), torch.tensor([2, 6, 5, 3, 5])
    out = []
    for net in (stacked, modules):
        cache = net.new_cache(32)
        out.append([net(prompt, cache), net(chain, cache)])
    # a rounding of the activations flipped early grows through six layers of random weights
    for a, b in zip(*out):
        assert (a - b).pow(2).mean().sqrt() <= 3e-2 * b.pow(2).mean().sqrt()
    cache = stacked.new_cache(32)
    stacked(prompt, cache)
    steps = torch.cat([stacked(chain[i:i + 1], cache) for i in range(len(chain))], dim=-2)
    assert torch.equal(steps, out[0][1])


def test_greedy_speculative_equals_plain_on_the_file(formats_file):
    if not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    net, _ = gguf_io.load_at_file_precision(formats_file)
    target = Model(ref="formats.gguf@gguf", net=net, tokenizer=tiny_tokenizer(VOCAB),
                   eos_ids=frozenset(), source="formats.gguf",
                   runner=backends.runner(net, "kernels"))
    draft = perturbed(float_twin(formats_file), 0.3)
    assert_speculative_is_plain(target, draft)


def test_counting_bytes_builds_no_eager_copy(formats_file):
    """A layer's executed bytes are known before its eager form exists, and
    equal that form's bytes."""
    net, _ = gguf_io.load_at_file_precision(formats_file)
    layers = [m for m in net.modules() if isinstance(m, FileBlocks)]
    assert {m._torch_int4() for m in layers} == {False, True}
    for m in layers:
        counted = m.executed_bytes()
        assert m._eager is None
        assert counted == sum(t.nbytes for t in m._eager_form())
