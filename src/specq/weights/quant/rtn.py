"""Group-wise integer grids and round-to-nearest (RTN) quantization.

The one representation every method produces (`QuantizedWeight`):

* symmetric: signed codes q in [-(2^(b-1)-1), 2^(b-1)-1], w = q * scale. The grid is the
  restricted symmetric one (it never uses -2^(b-1)), so +-absmax and 0 are exact; at 8 bits the
  codes are exactly the int8 weights of the packed int8 kernel.
* asymmetric: unsigned codes u in [0, 2^b-1] with an integer zero point z per group,
  w = (u - z) * scale. The range always contains 0 (as in the GPTQ reference).

Scales are rounded up to bf16 *before* codes are computed, so the simulated weights, the packed
kernels (which take bf16 scales) and saved checkpoints all use exactly the same grid, and the
grid still covers the group (no extra clipping; RTN error stays within half a step). Inside
`fp16_offsets()` they are rounded up further, so that GGUF's fp16 block numbers hold them exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class QuantizedWeight:
    """Codes [out, in] (int16), bf16 scales [out, in/group], uint8 zero points (asymmetric only)."""

    codes: Tensor
    scales: Tensor
    zeros: Tensor | None
    bits: int
    group_size: int

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def dequantize(self) -> Tensor:
        """The float32 weight these codes stand for."""
        out, n_in = self.codes.shape
        codes = self.codes.float().view(out, -1, self.group_size)
        if self.zeros is not None:
            codes = codes - self.zeros.float().unsqueeze(-1)
        return (codes * self.scales.float().unsqueeze(-1)).view(out, n_in)


def max_code(bits: int, symmetric: bool) -> int:
    """Largest code: 2^(b-1)-1 for the symmetric grid, 2^b-1 for the unsigned one."""
    return (1 << (bits - 1)) - 1 if symmetric else (1 << bits) - 1


def fit_grid(w: Tensor, bits: int, symmetric: bool) -> tuple[Tensor, Tensor | None]:
    """Scale (bf16-representable float32) and zero point (float integer, asymmetric only) for the
    groups along the last dimension of `w`, each of shape [..., 1]."""
    qmax = max_code(bits, symmetric)
    if symmetric:
        span = w.abs().amax(-1, keepdim=True)
        scale = _to_bf16(span / qmax)
        return scale, None
    lo = w.amin(-1, keepdim=True).clamp(max=0)
    hi = w.amax(-1, keepdim=True).clamp(min=0)
    scale = _to_bf16((hi - lo) / qmax)
    zero = (-lo / scale).round().clamp(0, qmax)
    return scale, zero


_FP16_OFFSETS = ContextVar("fp16_offsets", default=False)
FP16_FLOOR = 2.0 ** -18  # the smallest scale whose 11-bit multiples fp16 still holds exactly


@contextmanager
def fp16_offsets() -> Iterator[None]:
    """Grids fitted inside (RTN, GPTQ, AWQ) whose numbers GGUF's fp16 blocks hold exactly: scales
    of at most 7 significant bits (bf16 with an even mantissa) and at least 2^-18, so that a 4-bit
    zero point times the scale (Q4_1's offset, 11 bits) is an fp16 value too. Why: a bf16 scale
    has 8 significant bits, and some of its offsets need 12 (`weights.gguf_blocks`)."""
    token = _FP16_OFFSETS.set(True)
    try:
        yield
    finally:
        _FP16_OFFSETS.reset(token)


def _to_bf16(scale: Tensor) -> Tensor:
    """Round positive scales up to the next bf16 value (inside `fp16_offsets`, the next with 7
    significant bits, at least FP16_FLOOR); an all-zero group gets scale 1."""
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if _FP16_OFFSETS.get():
        scale = scale.clamp(min=FP16_FLOOR)
    rounded = scale.to(torch.bfloat16)
    up = (rounded.view(torch.int16) + 1).view(torch.bfloat16)  # next bf16 above a positive value
    rounded = torch.where(rounded.float() < scale, up, rounded)
    if _FP16_OFFSETS.get():  # an odd mantissa up to the next even one (a carry is a power of 2)
        bits = rounded.view(torch.int16)
        rounded = (bits + (bits & 1)).view(torch.bfloat16)
    return rounded.float()


def quantize_codes(w: Tensor, scale: Tensor, zero: Tensor | None, bits: int) -> Tensor:
    """Nearest grid codes (float tensor of integers) of `w` under `scale`/`zero`."""
    if zero is None:
        qmax = max_code(bits, True)
        return (w / scale).round().clamp(-qmax, qmax)
    return ((w / scale).round() + zero).clamp(0, max_code(bits, False))


def dequantize_codes(codes: Tensor, scale: Tensor, zero: Tensor | None) -> Tensor:
    return (codes - zero if zero is not None else codes) * scale


def fake_quantize(w: Tensor, bits: int, symmetric: bool) -> Tensor:
    """RTN of the groups along the last dimension, returned dequantized (for error searches)."""
    scale, zero = fit_grid(w, bits, symmetric)
    return dequantize_codes(quantize_codes(w, scale, zero, bits), scale, zero)


def quantize_rtn(weight: Tensor, bits: int, group_size: int, symmetric: bool) -> QuantizedWeight:
    """Round every weight to the nearest point of its group's min/max (or absmax) grid."""
    out, n_in = weight.shape
    w = weight.detach().float().view(out, n_in // group_size, group_size)
    scale, zero = fit_grid(w, bits, symmetric)
    codes = quantize_codes(w, scale, zero, bits).view(out, n_in)
    return make_quantized(codes, scale.squeeze(-1), None if zero is None else zero.squeeze(-1),
                          bits, group_size)


def make_quantized(codes: Tensor, scales: Tensor, zeros: Tensor | None, bits: int,
                   group_size: int) -> QuantizedWeight:
    """Pack float-valued codes/scales/zeros [out, n_groups] into the storage dtypes."""
    return QuantizedWeight(
        codes=codes.to(torch.int16),
        scales=scales.to(torch.bfloat16).contiguous(),
        zeros=None if zeros is None else zeros.to(torch.uint8).contiguous(),
        bits=bits,
        group_size=group_size,
    )


class TwoLevel(NamedTuple):
    """Codes u [out, in] uint8 with w ~ d * u + m per group, each group's d and m a float32 per row
    ([out, 1]) times an int8 per group ([out, groups]): sub_d in [0, 127], sub_m in [-127, 127]."""

    codes: Tensor
    d: Tensor
    m: Tensor
    sub_d: Tensor
    sub_m: Tensor


def quantize_two_level(weight: Tensor, bits: int, group_size: int) -> TwoLevel:
    """Asymmetric RTN over each group's min/max, its scale and offset then stored as int8 multiples
    of one float per row (`int8dot`'s two-level form with one super-block per row). Why: a float
    scale and offset per group of 32 cost 2 bits a weight, these half a bit; the codes are fitted to
    the rounded d and m, so the error grows only by those roundings."""
    out, n_in = weight.shape
    qmax = max_code(bits, False)
    w = weight.detach().float().view(out, n_in // group_size, group_size)
    lo = w.amin(-1)
    step = (w.amax(-1) - lo) / qmax  # each group's own scale, before rounding
    d_row = step.amax(-1, keepdim=True) / 127
    m_row = lo.abs().amax(-1, keepdim=True) / 127
    sub_d = torch.where(d_row > 0, step / d_row, 0).round().clamp(0, 127)
    sub_m = torch.where(m_row > 0, lo / m_row, 0).round().clamp(-127, 127)
    # float32 products, as the kernel's
    d, m = (d_row * sub_d)[..., None], (m_row * sub_m)[..., None]
    codes = torch.where(d > 0, (w - m) / d, 0).round().clamp(0, qmax)
    return TwoLevel(codes.view(out, n_in).to(torch.uint8), d_row, m_row, sub_d.to(torch.int8),
                    sub_m.to(torch.int8))
