"""Linear layers with 4- or 8-bit weights and int8 activations (`int8dot.c`), llama.cpp's scheme.

torch's packed CPU ops (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`) turn the weights
into floats and multiply in float, so on AVX2 their time grows with every row: a 4-token verify
of an int4 target costs well over a one-token step (docs/fastpath.md), and speculative decoding
cannot pay. No library op on x86 without AVX512-VNNI multiplies int8 activations by grouped int4
weights, so specq carries this small kernel: activations are quantized per row and per block of
32 to int8 (as llama.cpp does), each block is an exact integer dot product, and a weight block
is unpacked once for a tile of up to two rows and four outputs. Every row is computed the same
way whatever the row count, so verify rows equal one-token steps bit for bit.

This is a different rounding of the activations than the torch ops' bf16 cast, so a model on
this kernel is not bit-identical to the same model on torch's ops; `specq compare` measures what
it does to quality (docs/fastpath.md).
"""

from __future__ import annotations

import copy
import ctypes
import functools

import torch
from torch import Tensor

from . import build

BLOCK = 32  # activations are quantized per 32 values; groups must be multiples of this


@functools.cache
def available() -> bool:
    """Whether this CPU has AVX2 and the kernel builds; the fast path falls back to torch's ops if not."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        _library()
    except build.KernelUnavailable:
        return False
    return True


@functools.cache
def _library() -> ctypes.CDLL:
    lib = build.load("int8dot")
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.linear_a8.argtypes = [i, p, i, i, i, i, p, p, p, p, i]
    lib.linear_a8.restype = ctypes.c_int
    return lib


def shape_blocker(out_features: int, in_features: int, group_size: int) -> str | None:
    """Why the kernel cannot take this weight shape (None when it can)."""
    if group_size % BLOCK or in_features % group_size:
        return f"the int8-activation kernel needs groups of a multiple of {BLOCK} dividing in_features"
    return None


class Int8DotWeight:
    """A weight in the kernel's layout: per output row, its codes (4-bit: 16 bytes of nibbles per
    block of 32, low nibbles first; 8-bit: one byte per value), then per group a float scale `d`
    and, for 4 bits, an offset `m`: w = d * code + m.

    The call's constant arguments are prepared once (a decode step makes over a hundred calls, so
    the Python side of each call matters); copies rebuild them for their own tensors."""

    def __init__(self, bits: int, codes: Tensor, d: Tensor, m: Tensor | None, group_size: int):
        self.bits, self.codes, self.d, self.m, self.group_size = bits, codes, d, m, group_size
        self.out_features = codes.shape[0]
        self.in_features = codes.shape[1] * (2 if bits == 4 else 1)
        self._shape = (self.in_features, self.out_features, group_size)
        self._pointers = tuple(None if t is None else t.data_ptr() for t in (codes, d, m))

    def __deepcopy__(self, memo: dict) -> "Int8DotWeight":
        return Int8DotWeight(self.bits, *(copy.deepcopy(t, memo) for t in (self.codes, self.d, self.m)),
                             self.group_size)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.codes, self.d, self.m) if t is not None)


def pack_int4(unsigned: Tensor, d: Tensor, m: Tensor) -> Int8DotWeight:
    """From codes u in [0, 15] [out, in] and float d, m [out, groups] with w = d * u + m."""
    out, n_in = unsigned.shape
    blocks = unsigned.to(torch.uint8).view(out, n_in // BLOCK, 2, BLOCK // 2)
    codes = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(out, n_in // 2).contiguous()
    return Int8DotWeight(4, codes, d.float().contiguous(), m.float().contiguous(), n_in // d.shape[1])


def pack_int8(codes: Tensor, d: Tensor) -> Int8DotWeight:
    """From signed codes c [out, in] and float d [out, groups] with w = d * c."""
    return Int8DotWeight(8, codes.to(torch.int8).contiguous(), d.float().contiguous(), None,
                         codes.shape[1] // d.shape[1])


def linear(x: Tensor, w: Int8DotWeight) -> Tensor:
    """x [..., in] (any float dtype) times `w`, in x's dtype."""
    dtype = x.dtype
    if dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    y = torch.empty(x.shape[:-1] + (w.out_features,))
    if _library().linear_a8(w.bits, x.data_ptr(), x.numel() // w.in_features, *w._shape, *w._pointers, y.data_ptr(),
                            torch.get_num_threads()):
        raise MemoryError("int8dot: out of memory for the quantized activations")
    return y if dtype == torch.float32 else y.to(dtype)
