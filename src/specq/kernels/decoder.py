"""The decoder's work between its linear layers in one C call each (`decoder.c`): RMSNorm,
SiLU(gate) * up, and the attention of a cached pass's rows; and, where every linear layer runs on
int8dot or f32dot, all layers of a pass in one call (`Stack`).

Why by hand: a decode step of a 135M model runs 30 thin layers, and in eager PyTorch the dozen
small ops between the linear layers of each (norms, rotary embedding, cache writes, attention,
activations) cost about as much as the linear layers themselves, nearly all of it per-op dispatch,
not arithmetic (docs/fastpath.md). torch.compile removes that only per fixed shape, at about a
minute of compiling per shape on two cores, while a verify pass takes any of 1-65 rows, a tree mask,
and a cache of any length; and speculative decoding needs each verify row to equal the one-token
step at its position bit for bit, which a kernel compiled per row count does not promise. These
loops compute every row the same way whatever the row count. float32 only: other dtypes keep
torch's ops.
"""

from __future__ import annotations

import copy
import ctypes
import functools
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from . import build

available = build.available  # a variant this CPU runs and a C compiler: specq's kernels build here


@functools.cache
def _library(variant: str) -> ctypes.CDLL:
    lib = build.load(variant)
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.rms_norm.argtypes = [p, i, i, p, f, p]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [p, i, i, p]
    lib.silu_mul.restype = None
    lib.attend_rows.argtypes = [p, i, i, i, i, p, p, p, p, i, i, p, p, f, p, i]
    lib.attend_rows.restype = ctypes.c_int
    lib.decoder_layers.argtypes = [i, p, p, i, i, i, i, i, i, f, f, p, p, i, p, i]
    lib.decoder_layers.restype = ctypes.c_int
    return lib


def takes(x: Tensor) -> bool:
    """Whether these kernels may compute from x: float32, and no gradients being recorded (their
    outputs have none: training takes torch's ops)."""
    return x.dtype == torch.float32 and not torch.is_grad_enabled()


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension; x, weight float32, contiguous."""
    y = torch.empty_like(x)
    _library(build.variant()).rms_norm(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], weight.data_ptr(), eps,
                                       y.data_ptr())
    return y


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up from [..., 2I] (gate first); float32, contiguous."""
    width = gate_up.shape[-1] // 2
    y = gate_up.new_empty(gate_up.shape[:-1] + (width,))
    _library(build.variant()).silu_mul(gate_up.data_ptr(), gate_up.numel() // gate_up.shape[-1], width, y.data_ptr())
    return y


def attend_rows(qkv: Tensor, heads: int, kv_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor,
                v_cache: Tensor, start: int, seen: list[Tensor] | None) -> Tensor:
    """The attention of n rows written at `start` of one layer's cache (see `decoder.c`).
    qkv [n, (heads + 2 kv_heads) head_dim] unrotated; cos, sin [n, head_dim]; k_cache, v_cache
    [kv_heads, capacity, head_dim], contiguous; `seen`: None for a chain, else each row's key slots.
    Returns [n, heads * head_dim]."""
    n, dim = qkv.shape[0], cos.shape[-1]
    out = qkv.new_empty(n, heads * dim)
    slots, offsets = _seen_arrays(seen)
    if _library(build.variant()).attend_rows(
            qkv.data_ptr(), n, heads, kv_heads, dim, cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
            v_cache.data_ptr(), k_cache.shape[1], start, None if slots is None else slots.data_ptr(),
            None if offsets is None else offsets.data_ptr(), dim ** -0.5, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("decoder kernel: out of memory for the attention scores")
    return out


def _seen_arrays(seen: list[Tensor] | None) -> tuple[Tensor | None, Tensor | None]:
    """Each row's key slots, flat, and where each row's start (int32), for the C side."""
    if seen is None:
        return None, None
    slots = torch.cat(seen).to(torch.int32)
    offsets = torch.tensor([0] + [len(s) for s in seen], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return slots, offsets


class KernelWeight(Protocol):
    """A linear layer's weight as `decoder_layers` reads it: `int8dot.Int8DotWeight` (bits 4 or 8)
    or `f32dot.FloatPanels` (bits 32)."""

    bits: int
    group_size: int  # int8dot's scale groups (0 for float panels)
    pointers: tuple[int | None, int | None, int | None, int | None]  # codes or float panels, scales, offsets, sub-scales
    variant: str  # the kernel variant whose layout the weight has


LINEARS = ("wqkv", "wo", "w13", "w2")  # a layer's linear layers, in the order `decoder_layers` runs them


class _QuantWeight(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int), ("group", ctypes.c_int), ("codes", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("m", ctypes.c_void_p), ("sub", ctypes.c_void_p)]


class _Part(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_int), ("start", ctypes.c_int), ("capacity", ctypes.c_int),
                ("layer_stride", ctypes.c_long), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("seen", ctypes.c_void_p), ("offsets", ctypes.c_void_p)]


PROJECTION = ("qkv_bias", "q_norm", "k_norm")  # what a layer may apply to its q/k/v projection, in C's order


class _Layer(ctypes.Structure):
    _fields_ = [("attention_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p)] + [
        (name, _QuantWeight) for name in LINEARS] + [(name, ctypes.c_void_p) for name in PROJECTION]


class LayerWeights(NamedTuple):
    """One decoder layer as `decoder_layers` takes it: float32 norm weights, the linear layers' kernel
    weights, and where the architecture has them the q/k/v bias (Qwen2) and the per-head q and k norm
    weights (Qwen3), float32 and contiguous."""

    attention_norm: Tensor
    ffn_norm: Tensor
    wqkv: KernelWeight
    wo: KernelWeight
    w13: KernelWeight
    w2: KernelWeight
    qkv_bias: Tensor | None = None  # [(heads + 2 kv_heads) head_dim]
    q_norm: Tensor | None = None  # [head_dim]
    k_norm: Tensor | None = None  # [head_dim]


class Stack:
    """Every decoder layer of a model whose linear layers all run on int8dot or f32dot, in one C call
    per cached pass (`decoder_layers`), of one sequence or several stacked (the server's batches). Why: with the layers' work in C, what is left of a decode step
    in eager PyTorch is Python calling a dozen modules per layer; this removes it. The call makes
    the same kernel calls in the same order as the modules do, so the result is bit-identical to
    theirs (tests/test_decoder_kernels.py): a pass may take either way. The weights' addresses are
    read once; a copy of the model gets a `Stack` of its own copied weights. It runs on the kernel
    variant of the process at its making, which every weight must have been laid out for."""

    def __init__(self, layers: list[LayerWeights], heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 eps: float):
        self.layers, self.heads, self.kv_heads = layers, heads, kv_heads
        self.head_dim, self.intermediate, self.eps = head_dim, intermediate, eps
        self.variant = build.variant()
        table = (_Layer * len(layers))()
        for row, layer in zip(table, layers):
            row.attention_norm, row.ffn_norm = layer.attention_norm.data_ptr(), layer.ffn_norm.data_ptr()
            for name in LINEARS:
                w = getattr(layer, name)
                if w.variant != self.variant:
                    kind = "float panels" if w.bits == 32 else "int8dot weights"
                    raise ValueError(f"{kind} laid out for the {w.variant} kernels, not {self.variant}")
                setattr(row, name, _QuantWeight(w.bits, w.group_size, *w.pointers))
            if (layer.q_norm is None) != (layer.k_norm is None):
                raise ValueError("a layer normalizes both queries and keys per head, or neither")
            for name in PROJECTION:
                t = getattr(layer, name)
                setattr(row, name, None if t is None else t.data_ptr())
        self._table = table

    def __deepcopy__(self, memo: dict) -> "Stack":
        return Stack(copy.deepcopy(self.layers, memo), self.heads, self.kv_heads, self.head_dim, self.intermediate,
                     self.eps)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, segments: list) -> Tensor:
        """x [1, n, hidden] (float32, contiguous, updated in place) through every layer. `segments`:
        each sequence's `llama.Segment` (its cache, its consecutive rows of x, the keys each row
        sees), in order; their rows are written at the end of their caches, and each attends to its
        own cache only (see `attend_rows`)."""
        n, hidden = x.shape[1], x.shape[2]
        cos, sin = cos.contiguous(), sin.contiguous()  # held here while C reads them
        parts = (_Part * len(segments))()
        held = []  # the seen-slot arrays, alive while C reads them
        for part, s in zip(parts, segments):
            slots, offsets = _seen_arrays(s.seen.rows)
            held += [slots, offsets]
            k, v = s.cache.k, s.cache.v
            part.rows, part.start, part.capacity = s.rows.stop - s.rows.start, s.cache.length, k.shape[3]
            part.layer_stride, part.k, part.v = k[0].numel(), k.data_ptr(), v.data_ptr()
            part.seen = None if slots is None else slots.data_ptr()
            part.offsets = None if offsets is None else offsets.data_ptr()
        if _library(self.variant).decoder_layers(
                len(self.layers), ctypes.addressof(self._table), x.data_ptr(), n, hidden, self.heads, self.kv_heads,
                self.head_dim, self.intermediate, self.eps, self.head_dim ** -0.5, cos.data_ptr(), sin.data_ptr(),
                len(segments), ctypes.addressof(parts), torch.get_num_threads()):
            raise MemoryError("decoder kernel: out of memory for a pass's activations")
        return x
