"""Rotary embedding frequencies, with the rope scalings the native decoder computes exactly.

Why a table: a scaling is a rule that turns the base frequencies into the ones a checkpoint was
trained with. Those whose rule depends only on the configuration ("linear", Llama 3.1's "llama3")
give fixed frequencies and run natively; those that change with the sequence length (dynamic NTK,
Phi-3's longrope) or also rescale the attention (YaRN) are not here, and such models run on
transformers (`architectures.unsupported`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _linear(inv_freq: Tensor, p: dict, head_dim: int) -> Tensor:
    """Positions divided by `factor` (Kaiokendev's interpolation): every frequency divided by it."""
    return inv_freq / p["factor"]


def _llama3(inv_freq: Tensor, p: dict, head_dim: int) -> Tensor:
    """Llama 3.1: low frequencies (wavelengths past original / low_freq_factor) divided by `factor`,
    high ones (wavelengths under original / high_freq_factor) kept, a linear blend in 1/wavelength
    between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    blend = ((original / wavelength - low) / (high - low)).clamp(0, 1)
    return (1 - blend) * inv_freq / factor + blend * inv_freq


SCALINGS = {"linear": _linear, "llama3": _llama3}
# The keys of each scaling's parameters (as transformers' `rope_parameters` spells them).
SCALING_KEYS = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                           "original_max_position_embeddings")}


def inv_freq(theta: float, head_dim: int, scaling: dict | None = None) -> Tensor:
    """[head_dim / 2] float64 inverse frequencies of rotary base `theta`, scaled by `scaling`
    ({"rope_type": ..., its parameters}; None: unscaled)."""
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    return base if scaling is None else SCALINGS[scaling["rope_type"]](base, scaling, head_dim)


def llama3_from_divisors(divisors: Tensor, theta: float, head_dim: int) -> dict | None:
    """The llama3 scaling whose frequencies are base / `divisors` ([head_dim / 2]), or None if none
    is. Why: llama.cpp's converter writes a Llama 3.x file's scaling as those divisors (the
    `rope_freqs` tensor), not as its parameters. They fix the factor (the largest divisor) and the
    blend, which is linear in 1/wavelength between its two ends; two blended frequencies give the
    line, and low_freq_factor = 1 picks the one of the equivalent parameter sets
    that Llama 3.x uses."""
    d = divisors.double()
    factor = float(d.max())
    blended = ((d > 1 + 1e-5) & (d < factor * (1 - 1e-5))).nonzero()[:, 0]
    if factor <= 1 or blended.numel() < 2:
        return None
    x = inv_freq(theta, head_dim) / (2 * math.pi)  # 1 / wavelength
    blend = (1 / d - 1 / factor) / (1 - 1 / factor)
    i, j = int(blended[0]), int(blended[-1])
    slope = float((blend[j] - blend[i]) / (x[j] - x[i]))
    offset = float(blend[i] - slope * x[i])
    if offset >= 0:
        return None
    high, original = 1 - 1 / offset, -slope / offset
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": _round(high),
               "original_max_position_embeddings": _round(original)}
    exact = inv_freq(theta, head_dim) / d
    if not torch.allclose(inv_freq(theta, head_dim, scaling), exact, rtol=1e-5, atol=0):
        return None
    return scaling


def _round(value: float) -> float | int:
    """A fitted parameter as the integer it was written as, when it is one (up to
    the fit's rounding)."""
    nearest = round(value)
    return int(nearest) if abs(value - nearest) <= 1e-4 * max(1.0, abs(value)) else value
