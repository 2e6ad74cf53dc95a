"""Linear layers with 2-, 3-, 4-, 6- or 8-bit weights and int8 activations
(`int8dot.c`), llama.cpp's scheme.

torch's packed CPU ops (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) turn the weights
into floats and multiply in float, so on AVX2 their time grows with every row: a 4-token verify
of an int4 target costs well over a one-token step (docs/design.md), and speculative decoding
cannot pay. No library op on x86 without AVX512-VNNI multiplies int8 activations by grouped int4
weights, so specq carries this small kernel: activations are quantized per row and per block of
32 to int8 (as llama.cpp does), each block is an exact integer dot product (vpmaddubsw, or
vpdpbusd where the CPU has VNNI), and the weights are laid out in panels of 8 outputs (as
llama.cpp repacks Q4_0 for its AVX2 kernels; 16 on AVX-512), unpacked once for tiles of up to 4
rows (8 on AVX-512). Every row is computed the same way whatever the row count, so verify rows
equal one-token steps bit for bit, and every kernel variant gives the same bits.

This is a different rounding of the activations than the torch ops' bf16 cast, so a model on
this kernel is not bit-identical to the same model on torch's ops; `specq compare` measures what
it does to quality (docs/performance.md, "Quantization quality").
"""

from __future__ import annotations

import copy
import ctypes
import functools

import torch
from torch import Tensor

from . import build

BLOCK = 32  # activations are quantized per 32 values; groups must be multiples of this, or HALF
HALF = 16  # groups of 16 (GGUF's Q6_K): each half of an activation block has its own weight scale
# two-level scales: a float32 per super-block of this many inputs times an int8 per group
SUPER = 256
SUPER_SHIFT = 8  # log2(SUPER): GGUF's K-quants
ROW_SHIFT = 31  # super_shift for one super-block per row, whatever the inputs (in < 2^31)


available = build.available  # AVX2 and a C compiler: specq's kernels build here


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib`'s int8dot functions given their C signatures (a build of int8dot.c)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.linear_a8.argtypes = [i, p, i, i, i, i, p, p, p, p, p, i, p, i]
    lib.linear_a8.restype = i
    lib.a8_panel_width.argtypes = [i]
    lib.a8_panel_width.restype = i
    return lib


@functools.cache
def _library(variant: str) -> ctypes.CDLL:
    return bind(build.load(variant))


# outputs per panel where specq's kernels are off (the layout then only stores the weights)
PANEL = 8


def panel_width(bits: int, variant: str) -> int:
    """Outputs per panel of `bits`-bit weights on `variant` (`build.VARIANTS`, or `build.TORCH`): 8,
    one per 32-bit lane of an AVX2 vector, or 16 where the variant multiplies them with AVX-512."""
    return PANEL if variant == build.TORCH else _library(variant).a8_panel_width(bits)


def shape_blocker(out_features: int, in_features: int, group_size: int) -> str | None:
    """Why the kernel cannot take this weight shape (None when it can)."""
    if ((group_size % BLOCK and group_size != HALF) or in_features % group_size
        or in_features % BLOCK):
        return (f"the int8-activation kernel needs groups of {HALF} or a multiple of {BLOCK} "
                f"dividing in_features, and in_features a multiple of {BLOCK}")
    return None


class Int8DotWeight:
    """A weight in the kernel's layout (`int8dot.c`) for the kernel variant it was packed on:
    panels of `panel_width` outputs, each panel's codes interleaved so that one vector holds a few
    inputs of all its outputs (2-bit: four codes per byte, 4-bit: two; 3-bit: 2-bit codes and a
    plane of top bits), then per panel and group the float scales `d` and offsets `m` (always for 2
    to 4 bits; None for 6- and 8-bit codes without them):
    w = d * code + m. Outputs are padded to whole panels with zeros. The weight always runs on its
    variant. With `sub` (int8 [panels, groups, width], then with offsets [.., 2 groups, ..]: the
    sub-offsets after the sub-scales) the scales are two-level: `d` and `m` are [panels, supers,
    width], one per super-block, and a group's scale or offset is that times its int8 sub-scale
    (`int8dot.c`). Group g's super-block is (g * group_size) >> super_shift: SUPER_SHIFT for GGUF's
    K-quants (the same float32 as the file's scales, with fewer bytes), ROW_SHIFT for one per row.
    With `grid` (int8 [16]; 3- or 4-bit codes, no offsets) the codes index its values: w = d *
    grid[code] (GGUF's IQ4_NL and IQ4_XS at their files' 4 bits a code, IQ2's six values at 3).

    The call's constant arguments are prepared once (a decode step makes over a hundred calls, so
    the Python side of each call matters); copies rebuild them for their own tensors."""

    def __init__(self, bits: int, codes: Tensor, d: Tensor, m: Tensor | None, group_size: int,
                 out_features: int, in_features: int, variant: str, sub: Tensor | None = None,
                 super_shift: int = SUPER_SHIFT, grid: Tensor | None = None):
        if grid is not None and (bits not in (3, 4) or m is not None or grid.dtype != torch.int8
                                 or grid.shape != (16,)):
            raise ValueError("a grid is 16 int8 values indexed by 3- or 4-bit codes without "
                             "offsets")
        self.bits, self.codes, self.d, self.m, self.group_size = bits, codes, d, m, group_size
        self.out_features, self.in_features, self.variant, self.sub = (out_features, in_features,
                                                                       variant, sub)
        self.super_shift, self.grid = super_shift, None if grid is None else grid.contiguous()
        self._shape = (in_features, out_features, group_size)
        self.pointers = tuple(None if t is None else t.data_ptr()
                              for t in (codes, d, m, sub, self.grid))

    def __deepcopy__(self, memo: dict) -> "Int8DotWeight":
        codes, d, m, sub, grid = (copy.deepcopy(t, memo)
                                  for t in (self.codes, self.d, self.m, self.sub, self.grid))
        return Int8DotWeight(self.bits, codes, d, m, self.group_size, self.out_features,
                             self.in_features, self.variant, sub, self.super_shift, grid)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.codes, self.d, self.m, self.sub, self.grid)
                   if t is not None)

    def group_terms(self) -> tuple[Tensor, Tensor | None]:
        """d and m per group, float32 [panels, groups, width] (two-level: each product computed as
        the kernel computes it)."""
        if self.sub is None:
            return self.d, self.m
        groups = self.in_features // self.group_size
        # each group's super-block
        supers = (torch.arange(groups) * self.group_size) >> self.super_shift
        spread = [t[:, supers] for t in (self.d, self.m) if t is not None]
        return spread[0] * self.sub[:, :groups].float(), (spread[1] * self.sub[:, groups:].float()
                                                           if self.m is not None else None)


def _panels(t: Tensor, width: int) -> Tensor:
    """t [out, ...] padded with zero rows to a whole number of panels, as [panels, width, ...]."""
    pad = -t.shape[0] % width
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.view(-1, width, *t.shape[1:])


def panel_major(t: Tensor, width: int) -> Tensor:
    """Floats [out, k] as [panels, k, width]: for each k, a panel's outputs side by side."""
    return _panels(t.float(), width).transpose(1, 2).contiguous()


def _nibble_chunks(unsigned: Tensor, width: int) -> Tensor:
    """Codes in [0, 15] [out, in] as 4-bit chunks [panels, blocks, 4, width, 4]: input 32b + 8j +
    4h + t of output o -> panel, block b, chunk j, byte 4o + t, nibble h."""
    n_in = unsigned.shape[1]
    u = _panels(unsigned.to(torch.uint8), width).view(-1, width, n_in // BLOCK, 4, 2,
                                                      4).permute(0, 2, 3, 1, 5, 4)
    return u[..., 0] | (u[..., 1] << 4)


def _from_nibble_chunks(chunks: Tensor, out: int, n_in: int) -> Tensor:
    """The inverse of `_nibble_chunks`: codes [out, in] uint8."""
    nibbles = torch.stack([chunks & 0x0F, chunks >> 4], -1).permute(0, 3, 1, 2, 5, 4)
    return nibbles.reshape(-1, n_in)[:out]


def _crumb_chunks(unsigned: Tensor, width: int) -> Tensor:
    """Codes in [0, 3] [out, in] as 2-bit chunks [panels, blocks, 2, width, 4]: input 32b + 16v +
    4c + t of output o -> panel, block b, chunk v, byte 4o + t, bits 2c and 2c + 1."""
    n_in = unsigned.shape[1]
    u = _panels(unsigned.to(torch.uint8), width).view(-1, width, n_in // BLOCK, 2, 4,
                                                      4).permute(0, 2, 3, 1, 5, 4)
    return u[..., 0] | (u[..., 1] << 2) | (u[..., 2] << 4) | (u[..., 3] << 6)


def _from_crumb_chunks(chunks: Tensor, out: int, n_in: int) -> Tensor:
    """The inverse of `_crumb_chunks`: codes [out, in] uint8."""
    crumbs = torch.stack([(chunks >> s) & 3 for s in (0, 2, 4, 6)], -1).permute(0, 3, 1, 2, 5, 4)
    return crumbs.reshape(-1, n_in)[:out]


def _three_bit_chunks(unsigned: Tensor, width: int) -> Tensor:
    """Codes in [0, 7] [out, in] as 3-bit chunks [panels, blocks, 3, width, 4]: the low 2 bits as
    2-bit chunks; the top bit of input 32b + 4i + t of output o -> chunk 2, byte 4o + t, bit i."""
    n_in, u = unsigned.shape[1], unsigned.to(torch.uint8)
    top = _panels(u >> 2, width).view(-1, width, n_in // BLOCK, 8, 4).permute(0, 2, 1, 4, 3)
    top = sum(top[..., i] << i for i in range(8)).to(torch.uint8).unsqueeze(2)
    return torch.cat([_crumb_chunks(u & 3, width), top], dim=2)


def _from_three_bit_chunks(chunks: Tensor, out: int, n_in: int) -> Tensor:
    """The inverse of `_three_bit_chunks`: codes [out, in] uint8."""
    top = torch.stack([(chunks[:, :, 2] >> i) & 1 for i in range(8)], -1).permute(0, 2, 1, 4, 3)
    return _from_crumb_chunks(chunks[:, :, :2], out, n_in) | (top.reshape(-1, n_in)[:out] << 2)


def _six_bit_chunks(codes: Tensor, width: int) -> Tensor:
    """Codes in [-32, 31] [out, in] as unsigned c + 32 in 6-bit chunks [panels, blocks, 6, width,
    4]: the low 4 bits as 4-bit chunks; the top 2 of input 32b + 16k + 4i + t of output o -> chunk
    4 + k, byte 4o + t, bits 2i and 2i + 1."""
    n_in = codes.shape[1]
    biased = (codes + 32).to(torch.uint8)
    top = _panels(biased >> 4, width).view(-1, width, n_in // BLOCK, 2, 4, 4).permute(0, 2,
                                                                                      3, 1, 5, 4)
    top = top[..., 0] | (top[..., 1] << 2) | (top[..., 2] << 4) | (top[..., 3] << 6)
    return torch.cat([_nibble_chunks(biased & 0x0F, width), top], dim=2)


def _byte_chunks(codes: Tensor, width: int) -> Tensor:
    """Codes in [-128, 127] [out, in] as 8-bit chunks [panels, blocks, 8, width, 4]: input 32b + 4j
    + t of output o -> panel, block b, chunk j, byte 4o + t."""
    return _panels(codes.to(torch.int8), width).view(-1, width, codes.shape[1] // BLOCK, 8,
                                                     4).permute(0, 2, 3, 1, 4)


# code bits -> the kernel's code layout
CHUNKS = {2: _crumb_chunks, 3: _three_bit_chunks, 4: _nibble_chunks, 6: _six_bit_chunks,
          8: _byte_chunks}


def _pack(bits: int, codes: Tensor, d: Tensor, m: Tensor | None, groups: int, variant: str | None,
          sub: tuple[Tensor, ...] = (), super_shift: int = SUPER_SHIFT,
          grid: Tensor | None = None) -> Int8DotWeight:
    """`bits`-bit codes [out, in] in `groups` groups a row, with scales d (and offsets m) and, for
    two-level scales, int8 `sub` (sub-scales, then sub-offsets) [out, groups], and 4-bit codes'
    `grid`, laid out for `variant` (by default the process's)."""
    variant = variant or build.variant()
    width, (out, n_in) = panel_width(bits, variant), codes.shape
    subs = (torch.cat([_panels(t, width).transpose(1, 2) for t in sub], dim=1).contiguous()
            if sub else None)
    return Int8DotWeight(bits, CHUNKS[bits](codes, width).contiguous(), panel_major(d, width),
                         None if m is None else panel_major(m, width), n_in // groups, out, n_in,
                         variant, subs, super_shift, grid)


def pack_int2(unsigned: Tensor, d: Tensor, m: Tensor, variant: str | None = None) -> Int8DotWeight:
    """From codes u in [0, 3] [out, in] and float d, m [out, groups] with w = d * u + m, laid out
    for `variant`: GGUF's Q2_K and TQ2_0 at their own 2 bits a code. Why not as 4-bit codes: a step
    reads every weight once, so its time is mostly the bytes read."""
    return _pack(2, unsigned, d, m, d.shape[1], variant)


def pack_int3(unsigned: Tensor, d: Tensor, m: Tensor, variant: str | None = None) -> Int8DotWeight:
    """From codes u in [0, 7] [out, in] and float d, m [out, groups] with w = d * u + m, laid out
    for `variant`: GGUF's Q3_K at its own 3 bits a code (its low 2 bits apart from its top bit)."""
    return _pack(3, unsigned, d, m, d.shape[1], variant)


def pack_int4(unsigned: Tensor, d: Tensor, m: Tensor, variant: str | None = None) -> Int8DotWeight:
    """From codes u in [0, 15] [out, in] and float d, m [out, groups] with w = d * u + m, laid out
    for `variant` (by default the process's)."""
    return _pack(4, unsigned, d, m, d.shape[1], variant)


def pack_int4_two_level(unsigned: Tensor, d: Tensor, m: Tensor, sub_d: Tensor, sub_m: Tensor,
                        super_shift: int, variant: str | None = None) -> Int8DotWeight:
    """From codes u in [0, 15] [out, in], float d, m [out, supers] and int8 sub_d, sub_m [out,
    groups]: group g's w = d[(g * G) >> super_shift] * sub_d[g] * u + m[..] * sub_m[g]."""
    return pack_two_level(4, unsigned, d, m, sub_d, sub_m, super_shift, variant)


def pack_two_level(bits: int, codes: Tensor, d: Tensor, m: Tensor | None, sub_d: Tensor,
                   sub_m: Tensor | None, super_shift: int, variant: str | None = None,
                   grid: Tensor | None = None) -> Int8DotWeight:
    """`bits`-bit codes [out, in] (as the `PACKS` and `pack_grid` take
    them) with two-level scales: float d (and m) [out, supers], int8 sub_d (and sub_m) [out,
    groups]; group g's w = d[(g * G) >> super_shift] * sub_d[g] * code (+ m[..] * sub_m[g]), the
    code through `grid` where given."""
    sub = tuple(t for t in (sub_d, sub_m) if t is not None)
    return _pack(bits, codes, d, m, sub_d.shape[1], variant, sub, super_shift, grid)


def pack_grid(indices: Tensor, d: Tensor, grid: Tensor, variant: str | None = None,
              bits: int = 4) -> Int8DotWeight:
    """From `bits`-bit codes (3 or 4) [out, in] indexing `grid` (int8 [16]) and float d [out,
    groups] with w = d * grid[code], laid out for `variant`: GGUF's IQ4_NL at
    its 4 bits a weight."""
    return _pack(bits, indices, d, None, d.shape[1], variant, grid=grid)


def pack_int6(codes: Tensor, d: Tensor, m: Tensor | None = None,
              variant: str | None = None) -> Int8DotWeight:
    """From codes c in [-32, 31] [out, in] and float d (and m) [out, groups] with w = d * c (+ m),
    laid out for `variant`: GGUF's Q6_K and 5-bit formats at 6 bits a code instead of 8. Why:
    decoding reads every weight once per step, so its time is mostly the bytes read."""
    return _pack(6, codes, d, m, d.shape[1], variant)


def pack_int8(codes: Tensor, d: Tensor, m: Tensor | None = None,
              variant: str | None = None) -> Int8DotWeight:
    """From codes c in [-128, 127] [out, in] and float d (and m) [out, groups] with w = d * c (+ m),
    laid out for `variant` (by default the process's)."""
    return _pack(8, codes, d, m, d.shape[1], variant)


# code bits -> packing of one-level weights
PACKS = {2: pack_int2, 3: pack_int3, 4: pack_int4, 6: pack_int6, 8: pack_int8}
# code bits -> the inverse of their unsigned layout (2 to 4 bits: codes or a grid's indices)
UNSIGNED_CHUNKS = {2: _from_crumb_chunks, 3: _from_three_bit_chunks, 4: _from_nibble_chunks}


def unpack(w: Int8DotWeight) -> tuple[Tensor, Tensor, Tensor | None]:
    """The inverse of the `PACKS`: codes [out, in] (uint8 for 2 to 4 bits,
    int8 for 6 and 8, and for a grid's the int8 values they index) and float d, m [out, groups] (m
    None where the weight has no offsets). Why: the eager path builds its torch form from the
    kernel's tensors, so a layer need not keep a second copy of its codes."""
    out, n_in = w.out_features, w.in_features
    if w.bits in UNSIGNED_CHUNKS:
        codes = UNSIGNED_CHUNKS[w.bits](w.codes, out, n_in)
        if w.grid is not None:
            codes = w.grid[codes.long()]
    elif w.bits == 6:  # pack_int6's two parts
        top = torch.stack([(w.codes[:, :, 4:] >> s) & 3 for s in (0, 2, 4, 6)],
                          -1).permute(0, 3, 1, 2, 5, 4)
        biased = (_from_nibble_chunks(w.codes[:, :, :4], out, n_in)
                  | (top.reshape(-1, n_in)[:out] << 4))
        codes = (biased.to(torch.int16) - 32).to(torch.int8)
    else:  # panel, block, chunk j, output o, byte t -> input 32b + 4j + t of o
        codes = w.codes.permute(0, 3, 1, 2, 4).reshape(-1, n_in)[:out]
    return (codes, *(None if t is None else _per_output(t, out) for t in w.group_terms()))


def dequantize(w: Int8DotWeight, rows: Tensor | None = None) -> Tensor:
    """The weight the kernel multiplies, float32 [out, in] (only `rows` of the outputs when given):
    d * code + m in each group, with the group terms as the kernel computes them."""
    codes, d, m = unpack(w)
    if rows is not None:
        codes, d, m = codes[rows], d[rows], None if m is None else m[rows]
    groups = codes.float().view(codes.shape[0], -1, w.group_size) * d[..., None]
    return (groups if m is None else groups + m[..., None]).view(codes.shape[0], -1)


def _per_output(t: Tensor, out: int) -> Tensor:
    """A panel-major tensor [panels, k, width] as [out, k]: the inverse of `panel_major`."""
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:out]


def take_rows(w: Int8DotWeight, rows: Tensor) -> Int8DotWeight:
    """The 4-bit weight `w` restricted to the outputs `rows`, each with its own codes, scales and
    offsets as they are (two-level ones too, and a grid), laid out for w's variant."""
    if w.bits != 4:
        raise ValueError(f"take_rows takes 4-bit weights, not {w.bits}-bit ones")
    codes = _from_nibble_chunks(w.codes, w.out_features, w.in_features)[rows]
    d, m = (None if t is None else _per_output(t, w.out_features)[rows] for t in (w.d, w.m))
    groups = w.in_features // w.group_size
    if w.sub is None:
        return _pack(4, codes, d, m, groups, w.variant, grid=w.grid)
    sub = _per_output(w.sub, w.out_features)[rows]
    return pack_two_level(4, codes, d, m, sub[:, :groups],
                          sub[:, groups:] if m is not None else None, w.super_shift,
                          w.variant, w.grid)


def linear(x: Tensor, w: Int8DotWeight) -> Tensor:
    """x [..., in] (any float dtype) times `w`, in x's dtype, on the variant `w` was packed for."""
    dtype = x.dtype
    if dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    y = torch.empty(x.shape[:-1] + (w.out_features,))
    if _library(w.variant).linear_a8(w.bits, x.data_ptr(), x.numel() // w.in_features, *w._shape,
                                     *w.pointers, w.super_shift, y.data_ptr(),
                                     torch.get_num_threads()):
        raise MemoryError("int8dot: out of memory for the quantized activations")
    return y if dtype == torch.float32 else y.to(dtype)
