"""AWQ (Lin et al., 2023): protect the input channels that carry large activations by scaling
them up in the weight before rounding and down in the activation, W x = (W s)(x / s).

`search_scale` picks s = mean|x|^alpha over a grid of alpha in [0, 1] by the output error of the
quantized layer on calibration activations (alpha = 0 is plain RTN, so the search never does
worse than RTN on its data). `search_clip` then shrinks each group's clipping range where that
lowers the group's output error. Errors are evaluated exactly from the input Hessian
(`stats.py`), i.e. on every calibration token. Where 1/s goes (folded into a norm or a previous
linear) is the caller's business; see `sequential.py`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rtn import fake_quantize
from .stats import output_error


def _fake_quantize_groups(w: Tensor, bits: int, group_size: int, symmetric: bool) -> Tensor:
    out, n_in = w.shape
    return fake_quantize(w.view(out, n_in // group_size, group_size), bits,
                         symmetric).view(out, n_in)


def search_scale(weight: Tensor, hessian: Tensor, act_mean: Tensor, bits: int, group_size: int,
                 symmetric: bool, grid: int = 20) -> Tensor:
    """Per-input-channel scale s [in] minimizing ||x W^T - (x/s) Q(W s)^T||^2.

    `hessian` is the inputs' 2/n X^T X; `act_mean` [in] is mean|x| per channel (callers average
    it over channels that must share a scale, e.g. heads sharing a KV head)."""
    w = weight.detach().float()
    best, best_err = torch.ones_like(act_mean), float("inf")
    for alpha in torch.linspace(0, 1, grid + 1).tolist():
        s = act_mean.float().pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        delta = _fake_quantize_groups(w * s, bits, group_size, symmetric) / s - w
        err = output_error(delta, hessian).item()
        if err < best_err:
            best, best_err = s, err
    return best


def search_clip(weight: Tensor, hessian: Tensor, bits: int, group_size: int, symmetric: bool,
                grid: int = 20, max_shrink: float = 0.5) -> Tensor:
    """`weight` with each (row, group) clamped to the shrunken range [-m, m], m = absmax*(1 -
    i/grid), that minimizes that group's share of the output error (its diagonal
    block of `hessian`)."""
    w = weight.detach().float()
    out, n_in = w.shape
    n_groups = n_in // group_size
    wg = w.view(out, n_groups, group_size)
    blocks = hessian.view(n_groups, group_size, n_groups,
                          group_size).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
    absmax = wg.abs().amax(-1, keepdim=True)
    best_max, best_err = absmax, torch.full(absmax.shape, float("inf"))
    for i in range(int(max_shrink * grid)):
        m = absmax * (1 - i / grid)
        delta = fake_quantize(wg.clamp(-m, m), bits, symmetric) - wg
        err = torch.einsum("ogi,gij,ogj->og", delta, blocks, delta).unsqueeze(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_max = torch.where(better, m, best_max)
    return wg.clamp(-best_max, best_max).view(out, n_in)
