"""Dense bit-packing of integer codes into uint8 buffers: the portable storage format.

Codes are written as one little-endian bit stream (code i occupies bits [i*bits, (i+1)*bits)),
so any width 1..8 packs to exactly ceil(n * bits / 8) bytes and odd widths such as 3 bits need
no straddling logic: every 8 codes fill exactly `bits` bytes, so they are assembled into one
int64 word (at most 56 bits below 8-bit codes) and split into bytes. 8-bit codes are the bytes.
This format is what gets saved; fast kernels repack from it at load.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"can pack 1..8 bits per code, got {bits}")


def pack_bits(codes: Tensor, bits: int) -> Tensor:
    """Pack integer codes in [0, 2**bits) (any shape, read flat) into a 1-D uint8 tensor."""
    _check_bits(bits)
    flat = codes.reshape(-1).to(torch.int64)
    n = flat.numel()
    if n and (int(flat.min()) < 0 or int(flat.max()) >= 1 << bits):
        raise ValueError(f"codes must lie in [0, {1 << bits}) to pack at {bits} bits")
    if bits == 8:
        return flat.to(torch.uint8)
    # disjoint fields
    words = (F.pad(flat, (0, -n % 8)).view(-1, 8) << (torch.arange(8) * bits)).sum(1)
    packed = ((words.unsqueeze(1) >> (torch.arange(bits) * 8)) & 0xFF).to(torch.uint8).reshape(-1)
    return packed[: (n * bits + 7) // 8]


def unpack_bits(packed: Tensor, bits: int, count: int, signed: bool = False) -> Tensor:
    """Inverse of `pack_bits`: the first `count` codes as int16, sign-extended if `signed`
    (codes stored in two's complement)."""
    _check_bits(bits)
    if packed.numel() * 8 < count * bits:
        raise ValueError(f"{packed.numel()} bytes cannot hold {count} codes of {bits} bits")
    if bits == 8:
        codes = packed.reshape(-1)[:count].to(torch.int16)
    else:
        chunks = packed.reshape(-1).to(torch.int64)
        chunks = F.pad(chunks, (0, -chunks.numel() % bits)).view(-1, bits)
        words = (chunks << (torch.arange(bits) * 8)).sum(1)
        codes = (words.unsqueeze(1) >> (torch.arange(8) * bits)) & ((1 << bits) - 1)
        codes = codes.reshape(-1)[:count].to(torch.int16)
    if signed:
        codes = torch.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
    return codes
