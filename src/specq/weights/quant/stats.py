"""Streaming statistics of a linear layer's calibration inputs.

The output error of any weight change D on inputs X [n, in] is ||X D^T||^2 = n/2 * sum((D H) * D)
with H = 2/n X^T X (the GPTQ Hessian). So H and mean|x| are all GPTQ and AWQ need: activations
are folded in as they stream past and never kept, and the AWQ searches use every calibration
token at a cost independent of their number.
"""

from __future__ import annotations

import torch
from torch import Tensor


class InputStats:
    """Running H = 2/n * sum x x^T and mean|x| per input channel over all tokens seen."""

    def __init__(self, in_features: int):
        self.hessian = torch.zeros(in_features, in_features)
        self.abs_sum = torch.zeros(in_features)
        self.count = 0

    def add(self, x: Tensor) -> None:
        x = x.detach().reshape(-1, self.hessian.shape[0]).float()
        n = x.shape[0]
        self.abs_sum += x.abs().sum(0)
        self.hessian *= self.count / (self.count + n)
        self.count += n
        x = x * (2 / self.count) ** 0.5
        self.hessian += x.T @ x

    @property
    def abs_mean(self) -> Tensor:
        return self.abs_sum / max(self.count, 1)


def output_error(delta: Tensor, hessian: Tensor) -> Tensor:
    """||X delta^T||^2 up to the constant n/2, for a weight change delta [out, in]."""
    return ((delta @ hessian) * delta).sum()
