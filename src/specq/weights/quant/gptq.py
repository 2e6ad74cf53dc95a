"""GPTQ (Frantar et al., 2022): quantize one column at a time and push each column's rounding
error onto the not-yet-quantized columns, weighted by the inverse Hessian of the layer's
reconstruction error ||W X - Q X||^2, whose Hessian is H = 2 X^T X over calibration inputs.

Follows the reference implementation: dampening of H, lazy batch updates in blocks of 128
columns, and group scales fitted when the algorithm reaches a group (on the error-updated
weights). With act-order the columns are visited by decreasing diag(H), but groups stay the
contiguous input ranges the storage format and kernels expect: a group's grid is fitted the
first time any of its columns is reached (no g_idx indirection at inference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rtn import QuantizedWeight, dequantize_codes, fit_grid, make_quantized, quantize_codes


def gptq_quantize(weight: Tensor, hessian: Tensor, bits: int, group_size: int, symmetric: bool,
                  damp: float = 0.01, act_order: bool = False,
                  block_size: int = 128) -> QuantizedWeight:
    """Quantize `weight` [out, in] given the Hessian [in, in] of its inputs."""
    w = weight.detach().float().clone()
    rows, cols = w.shape
    h = hessian.detach().float().clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(cols)
    position = torch.argsort(perm)  # position[c]: where original column c is visited
    w, h = w[:, perm], h[perm][:, perm]
    h.diagonal().add_(damp * h.diagonal().mean())
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    n_groups = cols // group_size
    scales = torch.zeros(rows, n_groups)
    zeros = None if symmetric else torch.zeros(rows, n_groups)
    fitted = [False] * n_groups
    group_of = (perm // group_size).tolist()
    codes = torch.zeros(rows, cols)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            g = group_of[i1 + i]
            if not fitted[g]:
                scale, zero = fit_grid(w[:, position[g * group_size:(g + 1) * group_size]], bits,
                                       symmetric)
                scales[:, g] = scale[:, 0]
                if zeros is not None:
                    zeros[:, g] = zero[:, 0]
                fitted[g] = True
            scale = scales[:, g]
            zero = None if zeros is None else zeros[:, g]
            col = w1[:, i]
            q = quantize_codes(col, scale, zero, bits)
            codes[:, i1 + i] = q
            err = (col - dequantize_codes(q, scale, zero)) / hinv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) * hinv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    return make_quantized(codes[:, position], scales, zeros, bits, group_size)
