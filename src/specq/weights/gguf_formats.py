"""GGUF weight formats as one table (ggml's `type_traits`): a row per GGML type, so a new format is
a row, not a branch.

A row knows its block (`block_size` weights stored in `type_size` bytes) and turns a [rows, cols]
tensor's stored bytes into the terms of specq's int8-activation kernel (`kernels/int8dot`): integer
codes and, per group of inputs, a float32 scale d and offset m, w = d * code + m. Computed in
float32, that equals `gguf.quants.dequantize` of the same bytes bit for bit (Q4_0 up to the sign of
zero: gguf writes d * (u - 8) and its zeros of negative-scale blocks are -0, here d * u - 8d is +0;
the kernel multiplies integer codes, so no product sees the difference). Why exact: the file's
weights are what the model was quantized to, and a second rounding is a different model. The
K-quants' super-blocks of 256 become groups of 32 (Q4_K, Q5_K) or 16 (Q2_K, Q3_K, Q6_K) with the
sub-scale already applied: an fp16 d times a 4-, 6- or 8-bit sub-scale is exact in float32, and
gguf computes the same product in float32 before it multiplies the codes, so nothing rounds
differently (the load path keeps the two factors and lets the kernel multiply
them: `kernel_weight`).

5-bit (Q5_0, Q5_1, Q5_K) and 6-bit (Q6_K) codes go to the kernel's 6-bit codes (signed, in [-32,
31]), 6.25 bits a weight beside the file's 5.5-6.6: decoding reads every weight once a step, so the
bytes are most of its time. 2- and 3-bit codes (Q2_K, Q3_K's q - 4 as q with an offset of -4
scales) stay 2- and 3-bit codes with offsets: with the K-quants' two-level
scales 3.25 and 4.25 bits a weight beside the files' 2.6 and 3.4 (a float32 copy would be 32).
IQ4_NL and IQ4_XS index a non-linear grid of 16 values; their 4-bit codes stay indices, which the
kernel looks up in registers (its grid codes: the file's 4.25-4.5 bits a weight), except where a
tensor is concatenated with another format's (a fused q/k/v with a Q5_K v): there the values become
8-bit codes. IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, TQ1_0, TQ2_0 and MXFP4 are integer
codes times exact group scales too (grid values with signs, ternary digits, e2m1 values), each
format's codes 16 or fewer values: 4-bit codes, indices into a grid of those values (IQ3_XXS, MXFP4)
or codes with offsets (IQ3_S's odd values); 3-bit indices into IQ2's grid of six values; or 2-bit
codes with offsets (IQ1_S's three values, the ternary digits), read through gguf's own decoders for
their grids (`_scaled_by_gguf`; gguf_repack.c reads them with gguf's grids): 2.25-6 bits a weight
with their scales, beside the files' 1.6-3.4. F32, F16 and BF16 are float rows
(`floats`); a type without a row (IQ1_M, whose scale is spread over its sub-scales) is dequantized
by gguf (`to_float`).

The decoders here are vectorized numpy over all blocks of a tensor at once (the reference, the
embedding's row lookups, and machines where specq's kernels do not build); a file's load reads its
blocks with `kernels/gguf_repack.c` instead, straight into int8dot's layout with the same bits
(`kernel_weight`): a 1.5B model holds ~1.5e9 weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from ..kernels import build, gguf_repack, int8dot

# 2 to 4 bits unsigned
CODE_DTYPES = {2: np.uint8, 3: np.uint8, 4: np.uint8, 6: np.int8, 8: np.int8}
PACK = int8dot.PACKS  # code bits -> their packing


# Two-level scales of a weight of super-blocks of 256 inputs (int8dot's): float32 D and Mneg
# [rows, supers] (Mneg None: no offsets), int8 sub-scales and sub-offsets [rows, groups]; a group's
# d is D times its sub-scale, its m Mneg times its sub-offset, exactly the one-level values
Levels = tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class KernelBlocks:
    """A [rows, cols] weight in the int8-activation kernel's terms: w = d * code + m per group of
    `group_size` consecutive inputs of a row; with `levels`, d and m in two levels too."""

    bits: int  # 2, 3, 4, 6 or 8
    codes: np.ndarray  # [rows, cols], CODE_DTYPES[bits]
    d: np.ndarray  # [rows, cols // group_size] float32
    m: np.ndarray | None  # like d, or None: no offsets (6- and 8-bit only, and grid codes)
    group_size: int
    # int8 [16]: what 4-bit codes index
    grid: np.ndarray | None = field(default=None, compare=False)
    levels: Levels | None = field(default=None, compare=False)

    def values(self) -> np.ndarray:
        """The codes, or for grid codes the values they index (int8)."""
        return self.codes if self.grid is None else self.grid[self.codes]

    def dequantize(self) -> np.ndarray:
        """d * code + m in float32, [rows, cols]."""
        rows, cols = self.codes.shape
        w = self.values().reshape(rows, -1, self.group_size).astype(np.float32) * self.d[..., None]
        if self.m is not None:
            w = w + self.m[..., None]
        return w.reshape(rows, cols)

    def widened(self, bits: int, group_size: int, offsets: bool,
                lookup: bool = False) -> KernelBlocks:
        """The same weights as `bits`-bit codes in groups of `group_size` (dividing this one's),
        with offsets if `offsets` (-0 where there were none: d * code + -0 is d * code, even a
        zero's sign), grid codes kept as indices if `lookup`: exact, only more bytes."""
        repeat = self.group_size // group_size
        d = np.repeat(self.d, repeat, axis=1)
        m = (None if not offsets else np.full_like(d, -0.0)
             if self.m is None else np.repeat(self.m, repeat, axis=1))
        codes = self.codes if lookup else self.values()
        levels = None
        if self.levels is not None:  # -0 times a sub-offset of 0 is the -0 offset
            D, Mneg, sub_d, sub_m = self.levels
            sub_d = np.repeat(sub_d, repeat, axis=1)
            sub_m = (None if not offsets else np.zeros_like(sub_d)
                     if sub_m is None else np.repeat(sub_m, repeat, axis=1))
            levels = (D, None if not offsets else np.full_like(D, -0.0) if Mneg is None else Mneg,
                      sub_d, sub_m)
        return KernelBlocks(bits, codes.astype(CODE_DTYPES[bits], copy=False), d, m, group_size,
                            self.grid if lookup else None, levels)


# The kernel's terms of a format, or of parts concatenated by rows: code bits, group size, offsets,
# and the grid 4-bit codes index (its bytes; None: the codes are the values)
Form = tuple[int, int, bool, bytes | None]


def common_form(forms: list[Form]) -> tuple[int, int, bool, bool]:
    """Of parts concatenated by rows (a fused q/k/v or gate/up of a file that stores the parts in
    different formats), the one form that holds each exactly: the widest codes, the finest groups,
    offsets if any part has them; grid codes where every part indexes the same grid (the last item:
    whether they do), else the values as 8-bit codes."""
    lookup = forms[0][3] is not None and all(f[3] == forms[0][3] for f in forms)
    bits = max(8 if f[3] is not None and not lookup else f[0] for f in forms)
    return bits, math.gcd(*(f[1] for f in forms)), any(f[2] for f in forms), lookup


def stack_rows(parts: list[KernelBlocks]) -> KernelBlocks:
    """Tensors concatenated by rows, in their `common_form`."""
    if len(parts) == 1:
        return parts[0]
    bits, group, offsets, lookup = common_form([(p.bits, p.group_size, p.m is not None,
                                                 None if p.grid is None else p.grid.tobytes())
                                                for p in parts])
    parts = [p.widened(bits, group, offsets, lookup) for p in parts]
    levels = None
    if all(p.levels is not None for p in parts):  # else one level, as gguf_repack.c does
        levels = tuple(None if p0 is None else np.concatenate([p.levels[i] for p in parts])
                       for i, p0 in enumerate(parts[0].levels))
    return KernelBlocks(bits, np.concatenate([p.codes for p in parts]),
                        np.concatenate([p.d for p in parts]),
                        np.concatenate([p.m for p in parts]) if offsets else None, group,
                        parts[0].grid if lookup else None, levels)


# A block decoder: blocks [n, type_size] uint8 -> codes [n, block_size], d and m (or None)
# [n, block_size // group_size] float32 (each decoder's docstring gives its format's layout), and
# for blocks of 256 the same scales in two levels where the decoder gives them
Decoded = (tuple[np.ndarray, np.ndarray, np.ndarray | None]
           | tuple[np.ndarray, np.ndarray, np.ndarray | None, Levels])


@dataclass(frozen=True)
class Format:
    """One GGML type: `block_size` weights in `type_size` bytes, read either into the kernel's terms
    (`kernel`, `bits`-bit codes in groups of `group_size`) or, for float types, straight into
    float32 (`floats`: values [n, type_size] uint8 -> float32 [n, 1])."""

    name: str
    # ggml's type id (the file's number for it; `kernels/gguf_repack.c` reads blocks by it)
    ggml: int
    block_size: int
    type_size: int
    bits: int = 0
    group_size: int = 0
    kernel: Callable[[np.ndarray], Decoded] | None = None
    floats: Callable[[np.ndarray], np.ndarray] | None = None
    offsets: bool = False  # whether `kernel` gives offsets m
    # K-quants: the kernel can keep their scales as the file does (a float32 per super-block of 256
    # times an int8 sub-scale per group: the same float32 group scales, fewer bytes)
    two_level: bool = False
    # int8 [16]: what `kernel`'s 4-bit codes index
    grid: np.ndarray | None = field(default=None, compare=False)

    def form(self) -> Form:
        """The kernel's terms: code bits, group size, offsets, the grid the codes index."""
        return (self.bits, self.group_size, self.offsets,
                None if self.grid is None else self.grid.tobytes())

    def kernel_blocks(self, raw: np.ndarray) -> KernelBlocks:
        """A tensor's stored bytes, uint8 [rows, row bytes], in the kernel's terms."""
        rows = raw.shape[0]
        codes, d, m, *levels = self.kernel(np.ascontiguousarray(raw).reshape(-1, self.type_size))
        levels = (tuple(None if t is None else t.reshape(rows, -1) for t in levels[0])
                  if levels else None)
        return KernelBlocks(self.bits, codes.reshape(rows, -1), d.reshape(rows, -1),
                            None if m is None else m.reshape(rows, -1), self.group_size,
                            self.grid, levels)

    def to_float(self, raw: np.ndarray) -> np.ndarray:
        """A tensor's stored bytes, uint8 [rows, row bytes], as float32 [rows, cols]."""
        if self.floats is None:
            return self.kernel_blocks(raw).dequantize()
        rows = raw.shape[0]
        return self.floats(np.ascontiguousarray(raw).reshape(-1, self.type_size)).reshape(rows, -1)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 values, bytes [n, 2k] -> float32 [n, k]."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes [..., k] -> 4-bit values [..., 2k]: the low nibbles first, then the high ones (how
    ggml packs 2k values in k bytes)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's 4 bytes of high bits [n, 4] -> [n, 32]: bit i (little-endian) of value i."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0(b: np.ndarray) -> Decoded:
    """fp16 d, 16 bytes of codes u: w = d * (u - 8) = d * u - 8d."""
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:]), d, np.float32(-8) * d


def _q4_1(b: np.ndarray) -> Decoded:
    """fp16 d and m, 16 bytes of codes u: w = d * u + m."""
    return _nibbles(b[:, 4:]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_0(b: np.ndarray) -> Decoded:
    """fp16 d, 4 bytes of fifth bits, 16 of nibbles: w = d * (q - 16), q in [0, 31]."""
    q = _nibbles(b[:, 6:])
    q |= _fifth_bits(b[:, 2:6]) << 4
    q -= np.uint8(16)  # q - 16 modulo 256: the int8 value read as two's complement
    return q.view(np.int8), _f16(b[:, 0:2]), None


def _q5_1(b: np.ndarray) -> Decoded:
    """fp16 d and m, 4 bytes of fifth bits, 16 of nibbles: w = d * q + m, q in [0, 31]."""
    q = _nibbles(b[:, 8:]) | (_fifth_bits(b[:, 4:8]) << 4)
    return q.astype(np.int8), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> Decoded:
    """fp16 d, 32 int8 codes c: w = d * c."""
    return np.ascontiguousarray(b[:, 2:]).view(np.int8), _f16(b[:, 0:2]), None


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes [n, 12] -> the 8 sub-blocks' 6-bit scales and mins [n, 8], as float32.
    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; sub-blocks 4-7 keep their low
    4 bits in bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits in the top 2 bits
    of bytes 0-3 (scales) and 4-7 (mins)."""
    first, second, rest = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([first & 0x3F, (rest & 0x0F) | ((first >> 6) << 4)], axis=-1)
    mins = np.concatenate([second & 0x3F, (rest >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 128 bytes [n, 128] -> 256 4-bit values: each 32 bytes hold sub-block 2i in
    their low nibbles and 2i + 1 in their high ones."""
    q = qs.reshape(-1, 4, 1, 32)  # a view: one pass per nibble into the output
    out = np.empty((q.shape[0], 4, 2, 32), np.uint8)
    np.bitwise_and(q, 0x0F, out=out[:, :, :1])
    np.right_shift(q, 4, out=out[:, :, 1:])
    return out.reshape(-1, 256)


def _k_scale_min(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q4_K / Q5_K super-block's fp16 d and dmin and packed sub-scales -> per-32 d * scale and
    offset -(dmin * min) [n, 8] (gguf: w = (d * scale) * q - dmin * min)."""
    scales, mins = _k_scales(b[:, 4:16])
    return _f16(b[:, 0:2]) * scales, -(_f16(b[:, 2:4]) * mins)


def _k_two_bits(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K's 64 bytes of 2-bit values [n, 64] -> [n, 256]: per half of 128 values, 32 bytes;
    group 2j + p of the half (16 values each) sits at bits 2j of bytes 16p..16p + 15."""
    # half, j, p, byte
    q = qs.reshape(-1, 2, 1, 2, 16) >> np.arange(0, 8, 2, dtype=np.uint8)[:, None, None]
    q &= 3
    return q.reshape(-1, 256)


def _q2_k(b: np.ndarray) -> Decoded:
    """16 bytes of 4-bit sub-scales (low nibble) and sub-mins (high), 64 of 2-bit codes u, fp16 d,
    dmin: w = (d * scale) * u - dmin * min, 16 groups of 16."""
    scales = b[:, :16]
    return (_k_two_bits(b[:, 16:80]), _f16(b[:, 80:82]) * (scales & 0x0F).astype(np.float32),
            -(_f16(b[:, 82:84]) * (scales >> 4).astype(np.float32)))


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes [n, 12] -> 16 6-bit scales minus 32 [n, 16], float32: scale i's low 4 bits
    are byte i % 8's low (i < 8) or high nibble, its top 2 bits bits 2 (i // 4) of byte 8 +
    i % 4."""
    low = (s[:, None, :8] >> np.array([[0], [4]], dtype=np.uint8)).reshape(-1, 16) & 0x0F
    high = (s[:, None, 8:] >> np.array([[0], [2], [4], [6]], dtype=np.uint8)).reshape(-1, 16) & 3
    return (low | (high << 4)).astype(np.float32) - np.float32(32)


def _q3_k(b: np.ndarray) -> Decoded:
    """32 bytes of high bits, 64 of 2-bit low bits, 12 of 6-bit sub-scales, fp16 d: w = (d * (scale
    - 32)) * (q - 4), q = low + 4 high in [0, 7], 16 groups of 16; value 16p + l of group 2b + p has
    its high bit in bit b of byte 16p + l. As codes q with offset -4 (d * scale), exact: every term
    has at most 19 significant bits (up to the sign of zero, as Q4_0)."""
    high = (b[:, None, :32] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [n, bit b, byte]
    q = _k_two_bits(b[:, 32:96]) | (high.reshape(-1, 256) << 2)
    d = _f16(b[:, 108:110]) * _q3_k_scales(b[:, 96:108])
    return q, d, np.float32(-4) * d


def _q4_k(b: np.ndarray) -> Decoded:
    """fp16 d, dmin, 12 bytes of sub-scales, 128 of codes: 8 groups of 32."""
    return (_k_low_nibbles(b[:, 16:]), *_k_scale_min(b))


def _q5_k(b: np.ndarray) -> Decoded:
    """Q4_K's layout with 32 bytes of fifth bits before the nibbles: bit j of byte i is value i's of
    sub-block j. 8 groups of 32, q in [0, 31]."""
    high = (b[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, value i, sub-block j]
    q = _k_low_nibbles(b[:, 48:]) | (high.transpose(0, 2, 1).reshape(-1, 256) << 4)
    return (q.astype(np.int8), *_k_scale_min(b))


def _q6_k(b: np.ndarray) -> Decoded:
    """128 bytes of low nibbles, 64 of top 2 bits, 16 int8 sub-scales, fp16 d: w = (d * scale) *
    (q - 32), 16 groups of 16. Each half of 128 values takes 64 low-nibble bytes (values 0-63 in the
    low nibbles, 64-127 in the high) and 32 top-bit bytes (value 32s + i in bits 2s, 2s +
    1 of byte i)."""
    low = b[:, :128].reshape(-1, 2, 1, 64)  # views; each step below is one pass into q
    q = np.empty((low.shape[0], 2, 2, 64), np.uint8)  # half, nibble, byte
    np.bitwise_and(low, 0x0F, out=q[:, :, :1])
    np.right_shift(low, 4, out=q[:, :, 1:])
    # half, s, i
    high = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.arange(0, 8, 2, dtype=np.uint8)[:, None]
    high &= 3
    high <<= 4
    q = q.reshape(-1, 256)
    q |= high.reshape(-1, 256)
    q -= np.uint8(32)  # q - 32 modulo 256: the int8 value read as two's complement
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    return q.view(np.int8), _f16(b[:, 208:210]) * scales, None


# IQ4_NL and IQ4_XS's 16 code values, a non-linear grid (ggml's kvalues_iq4nl)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      np.int8)


def _iq4_nl(b: np.ndarray) -> Decoded:
    """fp16 d, 16 bytes of 4-bit indices (low nibbles first) into IQ4_VALUES: w = d *
    IQ4_VALUES[q]."""
    return _nibbles(b[:, 2:]), _f16(b[:, 0:2]), None


def _iq4_xs(b: np.ndarray) -> Decoded:
    """fp16 d, 2 bytes of the sub-scales' top 2 bits (sub-block i at bits 2i), 4 of their low 4
    (sub-block 2k in byte k's low nibble, 2k + 1 in its high), then per sub-block of 32 values 16
    bytes of indices into IQ4_VALUES as IQ4_NL's: w = (d * (scale - 32)) *
    IQ4_VALUES[q], 8 groups of 32."""
    low = (b[:, 4:8, None] >> np.array([0, 4], dtype=np.uint8)).reshape(-1, 8) & 0x0F
    high = (np.ascontiguousarray(b[:, 2:4]).view(np.uint16) >> np.arange(0, 16, 2,
                                                                         dtype=np.uint16)) & 3
    scales = (low | (high.astype(np.uint8) << 4)).astype(np.float32) - np.float32(32)
    return _nibbles(b[:, 8:].reshape(-1, 8, 16)).reshape(-1, 256), _f16(b[:, 0:2]) * scales, None


# What `_scaled_by_gguf` makes of a group's integer codes v [n, groups, G]: 4-bit indices into a
# grid (`_indices_into`), or 4-bit codes u with v = low + step * u (`_affine`: low [n, groups])
Recode = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None, int]]


def _indices_into(grid: np.ndarray) -> Recode:
    """Codes -> their indices into `grid` (16 int8 values holding every code)."""
    inverse = np.zeros(256, np.uint8)
    inverse[grid.view(np.uint8)] = np.arange(16, dtype=np.uint8)
    return lambda v: (inverse[v.view(np.uint8)], None, 1)


def _affine(step: int, low: Callable[[np.ndarray], np.ndarray]) -> Recode:
    """Codes v -> u = (v - low) / step in [0, 15], `low` per group from the group's codes."""
    def recode(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        lows = low(v)
        return ((v - lows[..., None]) // step).astype(np.uint8), lows.astype(np.float32), step
    return recode


def _scaled_by_gguf(name: str, d_at: int, units: Callable[[np.ndarray], np.ndarray], recode: Recode,
                    per_unit: int = 1, denominator: int | None = None) -> Callable:
    """The decoder of a type whose weights gguf computes as d (an fp16 at byte `d_at`) times a
    per-group unit times a small integer code v over `per_unit` (IQ2/IQ3's grid values with signs,
    IQ1_S's grid values plus or minus 1/8, the ternary types' -1, 0, 1): every product is exact in
    float32 (at most 22 significant bits), so gguf's dequantization of the blocks with d set to 1 is
    unit * v / per_unit exactly and the codes follow by division. They become the kernel's 4-bit
    codes (`recode`): indices into a grid of their 16 or fewer values, with the exact group scale
    d * unit / per_unit; or u with v = low + step * u, with the exact scale d * unit * step /
    per_unit and offset d * unit * low / per_unit. `units`: blocks [n, type_size] -> float32 units
    [n, groups]. With `denominator` (a power of two making every unit an integer below 128, and a
    constant `low`), the scales also in two levels, as int8dot keeps K-quants': D = d * step /
    (denominator * per_unit) and Mneg = d * low / (denominator * per_unit) per block, the units
    times `denominator` as int8 sub-scales and sub-offsets, whose products are the same exact
    values. Why through gguf: these formats' grids of 256 to 2048 entries and sign tables are gguf's
    to read; what is specq's is only that their weights are 4-bit codes times a scale, which int8dot
    multiplies."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[name]

    def codes(b: np.ndarray, unit: np.ndarray) -> np.ndarray:
        ones = b.copy()
        ones[:, d_at:d_at + 2] = np.array([1.0], np.float16).view(np.uint8)
        n, groups = unit.shape
        # gguf decodes 16 rows of bytes per numpy call: rows of up to 256 blocks, not one (its own
        # loop over the blocks would otherwise cost more than the decoding)
        v = dequantize(ones.reshape(-1, math.gcd(n, 256) * b.shape[1]), qtype).reshape(n,
                                                                                       groups, -1)
        # the codes, within a rounding of the exact quotient
        v *= np.float32(per_unit) / unit[..., None]
        return np.rint(v, out=v).astype(np.int8)

    def decode(b: np.ndarray) -> Decoded:
        unit = units(b)
        # numpy releases the GIL: the blocks in as many parts as torch has threads, decoded at once
        parts = [p for p in np.array_split(np.arange(len(b)), torch.get_num_threads()) if len(p)]
        with ThreadPoolExecutor(len(parts)) as pool:
            v = np.concatenate(
                list(pool.map(lambda p: codes(b[p[0]:p[-1] + 1], unit[p[0]:p[-1] + 1]), parts)))
        u, low, step = recode(v)
        d = _f16(b[:, d_at:d_at + 2])
        scaled = d * unit  # d * unit, exact
        m = None if low is None else scaled * low * np.float32(1 / per_unit)
        decoded = u.reshape(len(b), -1), scaled * np.float32(step / per_unit), m
        if denominator is None:
            return decoded
        sub = np.rint(unit * np.float32(denominator)).astype(np.int8)
        below = np.float32(1 / (denominator * per_unit))
        mneg = None if low is None else d * (low[:, :1] * below)
        return (*decoded, (d * np.float32(step * below), mneg, sub, None if low is None else sub))

    return decode


def _top_nibbles(words: np.ndarray) -> np.ndarray:
    """Little-endian uint32 words as bytes [n, 4k] -> their top 4 bits [n, k], float32."""
    return (np.ascontiguousarray(words).view(np.uint32) >> 28).astype(np.float32)


def _nibble_scales(s: np.ndarray) -> np.ndarray:
    """Bytes [n, k] of two 4-bit scales each (low nibble first) -> [n, 2k], float32."""
    return ((s[..., None] >> np.array([0, 4], dtype=np.uint8))
            & 0x0F).reshape(len(s), -1).astype(np.float32)


def _iq2_units(scales: np.ndarray) -> np.ndarray:
    """IQ2's units (0.5 + scale) / 4 from their 4-bit scales."""
    return (np.float32(0.5) + scales) * np.float32(0.25)


def _iq1_s_units(b: np.ndarray) -> np.ndarray:
    """IQ1_S's per-32 units 2 * k + 1, k bits 12-14 of the sub-block's uint16 at byte 34."""
    return (2 * ((np.ascontiguousarray(b[:, 34:50]).view(np.uint16) >> 12) & 7)
            + 1).astype(np.float32)


def _one_unit(b: np.ndarray) -> np.ndarray:
    return np.ones((len(b), 1), np.float32)


# MXFP4's 16 code values (e2m1, doubled; gguf's MXFP4.kvalues)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
# The signed grid values of IQ2's grids ({8, 25, 43}: gguf's IQ2_XXS.grid_map) and IQ3_XXS's, as
# 4-bit codes' grids (IQ2's 6 padded with zeros)
IQ2_VALUES = np.array([-43, -25, -8, 8, 25, 43] + [0] * 10, np.int8)
IQ3_VALUES = np.array([-62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62],
                      np.int8)


def _mxfp4(b: np.ndarray) -> Decoded:
    """An e8m0 exponent byte e (the scale 2^(e - 128), ggml's half of 2^(e - 127)), then 16 bytes
    of 4-bit indices into MXFP4_VALUES (low nibbles first): w = scale * MXFP4_VALUES[q]."""
    e = b[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    return _nibbles(b[:, 1:]), bits.view(np.float32), None


def _iq1_low(v: np.ndarray) -> np.ndarray:
    """IQ1_S's codes 8 g + delta (g in -1, 0, 1; delta +-1 per sub-block): each
    group's lowest, delta - 8."""
    first = v[..., 0].astype(np.int16)
    return first - 8 * np.rint(first / 8).astype(np.int16) - 8


def _bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32."""
    return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


FORMATS = {f.name: f for f in (
    Format("F32", 0, 1, 4, floats=lambda b: b.view(np.float32)),
    Format("F16", 1, 1, 2, floats=lambda b: b.view(np.float16).astype(np.float32)),
    Format("BF16", 30, 1, 2, floats=_bf16),
    Format("Q4_0", 2, 32, 18, 4, 32, _q4_0, offsets=True),
    Format("Q4_1", 3, 32, 20, 4, 32, _q4_1, offsets=True),
    Format("Q5_0", 6, 32, 22, 6, 32, _q5_0),
    Format("Q5_1", 7, 32, 24, 6, 32, _q5_1, offsets=True),
    Format("Q8_0", 8, 32, 34, 8, 32, _q8_0),
    Format("Q2_K", 10, 256, 84, 2, 16, _q2_k, offsets=True, two_level=True),
    Format("Q3_K", 11, 256, 110, 3, 16, _q3_k, offsets=True, two_level=True),
    Format("Q4_K", 12, 256, 144, 4, 32, _q4_k, offsets=True, two_level=True),
    Format("Q5_K", 13, 256, 176, 6, 32, _q5_k, offsets=True, two_level=True),
    Format("Q6_K", 14, 256, 210, 6, 16, _q6_k, two_level=True),
    Format("IQ4_NL", 20, 32, 18, 4, 32, _iq4_nl, grid=IQ4_VALUES),
    Format("IQ4_XS", 23, 256, 136, 4, 32, _iq4_xs, two_level=True, grid=IQ4_VALUES),
    # 4-bit codes times exact group scales (in numpy through gguf: `_scaled_by_gguf`)
    Format("IQ2_XXS", 16, 256, 66, 3, 32, _scaled_by_gguf("IQ2_XXS", 0, lambda b: _iq2_units(
        _top_nibbles(np.ascontiguousarray(b[:, 2:66]).view(np.uint32)[:, 1::2])),
                                                          _indices_into(IQ2_VALUES),
        denominator=8), grid=IQ2_VALUES, two_level=True),
    Format("IQ2_XS", 17, 256, 74, 3, 16, _scaled_by_gguf("IQ2_XS", 0, lambda b: _iq2_units(
        _nibble_scales(b[:, 66:74])), _indices_into(IQ2_VALUES), denominator=8), grid=IQ2_VALUES,
        two_level=True),
    Format("IQ2_S", 22, 256, 82, 3, 16, _scaled_by_gguf("IQ2_S", 0, lambda b: _iq2_units(
        _nibble_scales(b[:, 74:82])), _indices_into(IQ2_VALUES), denominator=8), grid=IQ2_VALUES,
        two_level=True),
    Format("IQ3_XXS", 18, 256, 98, 4, 32, _scaled_by_gguf("IQ3_XXS", 0, lambda b: (
        np.float32(0.5) + _top_nibbles(b[:, 66:98])) * np.float32(0.5), _indices_into(IQ3_VALUES),
                                                          denominator=4),
        grid=IQ3_VALUES, two_level=True),
    Format("IQ3_S", 21, 256, 110, 4, 32, _scaled_by_gguf(  # odd codes -15..15 = -15 + 2u
        "IQ3_S", 0, lambda b: 1 + 2 * _nibble_scales(b[:, 106:110]),
        _affine(2, lambda v: np.full(v.shape[:2], -15)), denominator=1), offsets=True,
           two_level=True),
    Format("IQ1_S", 19, 256, 50, 2, 32,
           _scaled_by_gguf("IQ1_S", 0, _iq1_s_units, _affine(8, _iq1_low), per_unit=8),
           offsets=True),
    Format("TQ1_0", 34, 256, 54, 2, 256,
           _scaled_by_gguf("TQ1_0", 52, _one_unit, _affine(1, lambda v: np.full(
        v.shape[:2], -1))), offsets=True),
    Format("TQ2_0", 35, 256, 66, 2, 256,
           _scaled_by_gguf("TQ2_0", 64, _one_unit, _affine(1, lambda v: np.full(
        v.shape[:2], -1))), offsets=True),
    Format("MXFP4", 39, 32, 17, 4, 32, _mxfp4, grid=MXFP4_VALUES),
)}


def to_float(raw: np.ndarray, type_name: str) -> np.ndarray:
    """A [rows, cols] tensor's stored bytes (uint8 [rows, row bytes]) as float32, by its row of the
    table, or by gguf's dequantization for a type without one."""
    if type_name in FORMATS:
        return FORMATS[type_name].to_float(raw)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.ascontiguousarray(dequantize(raw, GGMLQuantizationType[type_name]), dtype=np.float32)


def kernel_weight(parts: list[tuple[str, np.ndarray]],
                  variant: str | None = None) -> int8dot.Int8DotWeight:
    """Tensors concatenated by rows, each (type name, its stored bytes uint8 [rows, row bytes]), as
    one int8dot weight in their `common_form`, laid out for `variant` (by default the process's).
    Where specq's kernels build, read by `kernels/gguf_repack.c` straight from the bytes (a file's
    load is mostly this), K-quants, IQ2 and IQ3 with their scales in two levels; elsewhere by the
    numpy decoders above and `int8dot`'s packing, one float32 per group or two levels where the
    decoder gives them: the same weights and outputs bit for bit."""
    variant = variant or build.variant()
    formats = [FORMATS[name] for name, _ in parts]
    bits, group, offsets, lookup = common_form([f.form() for f in formats])
    grid = formats[0].grid if lookup else None
    if build.available():
        n_in = parts[0][1].shape[1] // formats[0].type_size * formats[0].block_size
        return gguf_repack.repack([(f.ggml, raw) for f, (_, raw) in zip(formats, parts)], n_in,
                                  bits, group, offsets, variant,
                                  all(f.two_level for f in formats), grid)
    kb = stack_rows([f.kernel_blocks(raw) for f, (_, raw) in zip(formats, parts)])
    codes, d, m = (None if a is None else torch.from_numpy(a) for a in (kb.codes, kb.d, kb.m))
    grid = None if kb.grid is None else torch.from_numpy(kb.grid)
    if kb.levels is not None:
        return int8dot.pack_two_level(kb.bits, codes, *(None if a is None else torch.from_numpy(a)
                                                        for a in kb.levels),
                                      int8dot.SUPER_SHIFT, variant, grid)
    if grid is not None:
        return int8dot.pack_grid(codes, d, grid, variant)
    return PACK[kb.bits](codes, d, m, variant=variant)
