"""specq's integer weights (`quant.rtn.QuantizedWeight`) as GGUF blocks of 32, written without
requantizing: the blocks' fp16 numbers are specq's scales (and offsets), the blocks' codes are
specq's codes, so gguf's dequantization gives back specq's weights bit for bit.

    symmetric, 2-4 bits     Q4_0: w = d * (q - 8), d = scale, q = code + 8
    asymmetric, 2-4 bits    Q4_1: w = d * q + m, d = scale, q = code, m = -zero * scale
    5-8 bits (8: symmetric) Q8_0: w = d * q, d = scale, q = code (minus the zero point)

A group of 32 * k weights is k blocks with the same numbers. What has no exact block is a
`ValueError` saying why: groups that do not split into blocks of 32, asymmetric 8-bit codes (their
code minus zero point leaves int8), and scales or offsets that fp16 does not hold
(`rtn.fp16_offsets` makes grids whose numbers it does).
"""

from __future__ import annotations

import numpy as np
import torch

from .quant.rtn import QuantizedWeight

BLOCK = 32


def block_type(bits: int, symmetric: bool) -> str:
    """The GGUF type of a weight of this format (ValueError: none holds it exactly)."""
    if bits <= 4:
        return "Q4_0" if symmetric else "Q4_1"
    if bits == 8 and not symmetric:
        raise ValueError("asymmetric int8 codes minus their zero point span [-255, 255], more "
                         "than Q8_0's int8 holds")
    return "Q8_0"


def check_group(group_size: int | None) -> None:
    """A group size whose scales repeat per block of 32 (None: per channel, checked per layer)."""
    if group_size is not None and group_size % BLOCK:
        raise ValueError(f"group size {group_size} is not a multiple of GGUF's blocks of {BLOCK}")


def _fp16(values: torch.Tensor, what: str) -> np.ndarray:
    """float32 values as fp16 bytes, each exactly (else ValueError)."""
    half = values.to(torch.float16)
    bad = int((half.float() != values).sum())
    if bad:
        raise ValueError(f"{bad} of {values.numel()} {what} are not fp16 values")
    return half.numpy().view(np.uint8).reshape(*values.shape, 2)


def _nibbles(q: torch.Tensor) -> np.ndarray:
    """Codes [blocks, 32] in [0, 15] as ggml's 16 bytes a block: byte j = q[j] | q[j + 16] << 4."""
    q = q.to(torch.uint8)
    return (q[:, :16] | (q[:, 16:] << 4)).numpy()


def to_blocks(qw: QuantizedWeight) -> tuple[str, np.ndarray]:
    """(GGUF type name, blocks as uint8 [out, in / 32 * block bytes]) holding `qw` exactly."""
    kind = block_type(qw.bits, qw.symmetric)
    out, n_in = qw.codes.shape
    check_group(qw.group_size)
    repeat = qw.group_size // BLOCK
    scale = qw.scales.float().repeat_interleave(repeat, 1).reshape(-1)  # [out * in / 32]
    codes = qw.codes.to(torch.int32).reshape(-1, BLOCK)
    d = _fp16(scale, "scales")
    if kind == "Q4_0":
        body = _nibbles(codes + 8)
    elif kind == "Q4_1":
        zero = qw.zeros.float().repeat_interleave(repeat, 1).reshape(-1)
        body = np.concatenate([_fp16(-zero * scale, "zero-point offsets (-zero * scale)"),
                               _nibbles(codes)], 1)
    else:
        if qw.zeros is not None:
            codes = codes - qw.zeros.to(torch.int32).repeat_interleave(repeat * BLOCK, 1).view(
                -1, BLOCK)
        body = codes.to(torch.int8).numpy().view(np.uint8)
    blocks = np.concatenate([d, body], 1)
    return kind, np.ascontiguousarray(blocks.reshape(out, -1))
