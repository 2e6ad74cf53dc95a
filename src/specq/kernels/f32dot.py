"""Float32 linear layers for the few rows of decode steps and verify passes (`f32dot.c`).

Why by hand: a decode step of a float model reads every weight once for one row, so it is bound by
memory bandwidth, and a verify pass of a few rows should cost little more. MKL's sgemm grows about
linearly per row at small row counts, and oneDNN's pre-packed GEMM (the fast path's float kernel
before this one, and what inductor uses for frozen linears) read the weights of this model's
layers more slowly than this loop does at 1-8 rows on an AVX2 machine (docs/design.md). The
loop also lets `decoder.Stack` run float layers from C. Beyond `rows.ROW_BY_ROW_MAX` rows (prefills)
the layer goes back to torch's GEMM, which is compute-efficient there (`fastpath.FloatKernel`).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import build

available = build.available  # a variant this CPU runs and a C compiler: specq's kernels build here


@functools.cache
def _library(variant: str) -> ctypes.CDLL:
    lib = build.load(variant)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.linear_f32.argtypes = [p, i, i, i, p, p, i]
    lib.linear_f32.restype = None
    lib.f32_panel_width.argtypes = []
    lib.f32_panel_width.restype = i
    return lib


def _panel_major(weight: Tensor, width: int) -> Tensor:
    """weight [out, in] padded with zero outputs to whole panels of `width`, as
    [panels, in, width]."""
    w = weight.float()
    w = torch.cat([w, w.new_zeros(-w.shape[0] % width, w.shape[1])])
    return w.view(-1, width, w.shape[1]).transpose(1, 2).contiguous()


class FloatPanels:
    """A float32 weight [out, in] in the kernel's layout for the process's kernel variant: panels of
    `width` outputs (a vector's floats: 8 on AVX2, 16 on AVX-512), each holding for every input the
    panel's weights of that input (outputs padded with zeros to whole panels). The panels keep
    the variant they were laid out for and always run on it."""

    bits, group_size = 32, 0  # as `decoder.Stack` reads a weight

    def __init__(self, weight: Tensor):
        self.out_features, self.in_features = weight.shape
        self.variant = build.variant()
        self.width = _library(self.variant).f32_panel_width()
        self.panels = _panel_major(weight.detach(), self.width)
        self.pointers = (self.panels.data_ptr(), None, None, None, None)
        self.super_shift = 0

    def nbytes(self) -> int:
        return self.panels.nbytes


def linear(x: Tensor, w: FloatPanels) -> Tensor:
    """x [..., in] float32 times `w`, as float32."""
    x = x.contiguous()
    y = x.new_empty(x.shape[:-1] + (w.out_features,))
    _library(w.variant).linear_f32(x.data_ptr(), x.numel() // w.in_features, w.in_features,
                                   w.out_features, w.pointers[0], y.data_ptr(),
                                   torch.get_num_threads())
    return y
