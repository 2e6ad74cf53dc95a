"""GGUF blocks straight into int8dot's layout (`gguf_repack.c`): a file's tensors become kernel
weights in one C pass over their bytes, the same bytes `int8dot.pack_int4` / `pack_int6` /
`pack_int8` lay out from `weights.gguf_formats`' decoders, without their intermediate
codes and float arrays."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from . import build, int8dot


@functools.cache
def _library(variant: str) -> ctypes.CDLL:
    lib = build.load(variant)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.gguf_repack.argtypes = [i, p, i, i, i, i, i, i, p, p, p, p, i, p, i, i]
    lib.gguf_repack.restype = ctypes.c_int
    return lib


# types whose 7-bit sign indices pick gguf's 128 sign bytes
SIGN_PATTERNS = ("IQ2_XXS", "IQ2_XS", "IQ3_XXS")


@functools.cache
def grid_table(kind: int) -> np.ndarray | None:
    """What the C decoder of ggml type `kind` reads beside the blocks: the grid they index (int8
    values as bytes, entry after entry), as gguf builds it from its tables, then for SIGN_PATTERNS
    gguf's 128 sign patterns (IQ2 and IQ3); None for a type without a grid."""
    from gguf import GGMLQuantizationType, quants

    name = GGMLQuantizationType(kind).name
    quant = getattr(quants, name, None)
    if quant is None or getattr(quant, "grid_hex", None) is None:
        return None
    quant.init_grid()
    parts = [quant.grid.reshape(-1).astype(np.int8).view(np.uint8)]
    if name in SIGN_PATTERNS:
        parts.append(np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8))
    return np.ascontiguousarray(np.concatenate(parts))


def repack(parts: list[tuple[int, np.ndarray]], n_in: int, bits: int, group_size: int,
           offsets: bool, variant: str, two_level: bool = False,
           grid: np.ndarray | None = None) -> int8dot.Int8DotWeight:
    """Tensors of `n_in` inputs concatenated by rows, each (ggml type id, its stored bytes uint8
    [rows, row bytes]), as one weight of `bits`-bit codes in groups of `group_size` (with offsets if
    `offsets`; with `two_level`, K-quants only, the scales as the file holds them:
    `int8dot.Int8DotWeight`'s `sub`; with `grid`, the int8 values of grid formats' codes, 4-bit
    codes that index it) laid out for `variant` (any of `build.VARIANTS` or `build.TORCH`; the C
    code is the process's, so specq's kernels must build here). The form must hold every part
    exactly (what `weights.gguf_formats.stack_rows` chooses); else ValueError."""
    lib = _library(build.variant())  # any variant's code lays out any variant's panels
    width, out = int8dot.panel_width(bits, variant), sum(len(raw) for _, raw in parts)
    panels, blocks, groups = -(-out // width), n_in // int8dot.BLOCK, n_in // group_size
    # bits chunks
    codes = torch.empty(panels, blocks, bits, width, 4,
                        dtype=torch.int8 if bits == 8 else torch.uint8)
    scales = n_in // int8dot.SUPER if two_level else groups
    d = torch.empty(panels, scales, width)
    m = torch.empty(panels, scales, width) if offsets else None
    sub = (torch.empty(panels, (2 if offsets else 1) * groups, width, dtype=torch.int8)
           if two_level else None)
    for t in (codes, d, m, sub):  # the padding outputs of the last panel: zeros, as pack_int4 pads
        if t is not None:
            t[-1].zero_()
    row = 0
    for kind, raw in parts:
        raw, table = np.ascontiguousarray(raw), grid_table(kind)
        status = lib.gguf_repack(kind, raw.ctypes.data, len(raw), n_in, bits, group_size,
                                 width, row, codes.data_ptr(), d.data_ptr(),
                                 None if m is None else m.data_ptr(),
                                 None if sub is None else sub.data_ptr(), grid is not None,
                                 None if table is None else table.ctypes.data,
                                 0 if table is None else table.nbytes, torch.get_num_threads())
        if status == -2:
            raise MemoryError("gguf_repack: out of memory for a row's codes")
        if status:
            raise ValueError(f"gguf_repack cannot lay out ggml type {kind} as {bits}-bit codes in "
                             f"groups of {group_size}{' with offsets' if offsets else ''}"
                             f"{' in two levels' if two_level else ''}"
                             f"{' indexing a grid' if grid is not None else ''}")
        row += len(raw)
    return int8dot.Int8DotWeight(bits, codes, d, m, group_size, out, n_in, variant, sub,
                                 grid=None if grid is None else torch.from_numpy(grid))

