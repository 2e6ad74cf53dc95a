"""Every decoder layer of a cached pass in one C call (`Stack`, `decoder.c`), where every linear
layer runs on int8dot or f32dot: norms, rotary embedding, cache writes, each row's attention and
the activations between the linear layers, for every architecture of the Llama family.

Why by hand: a decode step of a 135M model runs 30 thin layers, and in eager PyTorch the dozen
small ops between the linear layers of each (norms, rotary embedding, cache writes, attention,
activations) cost about as much as the linear layers themselves, nearly all of it per-op dispatch,
not arithmetic (docs/design.md). torch.compile removes that only per fixed shape, at about a
minute of compiling per shape on two cores, while a verify pass takes any of 1-65 rows, a tree mask,
and a cache of any length; and speculative decoding needs each verify row to equal the one-token
step at its position bit for bit, which a kernel compiled per row count does not promise. This
loop computes every row the same way whatever the row count. float32 only, no gradients: other
passes run the modules' torch ops.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from . import build

available = build.available  # a variant this CPU runs and a C compiler: specq's kernels build here


@functools.cache
def _library(variant: str) -> ctypes.CDLL:
    return typed(build.load(variant))


def typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    """lib with the argument and result types of this module's C functions set."""
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.decoder_layers.argtypes = [i, p, p, i, i, i, i, i, i, f, f, i, p, p, p, p, i, p, i]
    lib.decoder_layers.restype = ctypes.c_int
    lib.rms_norm_rows.argtypes = [p, i, i, p, f, p]
    lib.rms_norm_rows.restype = None
    return lib


def takes(x: Tensor) -> bool:
    """Whether these kernels may compute from x: float32, and no gradients being recorded (their
    outputs have none: training takes torch's ops)."""
    return x.dtype == torch.float32 and not torch.is_grad_enabled()


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [..., hidden] / sqrt(mean(x^2) + eps) * weight [hidden] per row (float32), as the layers'
    own norms compute it in `Stack`: a new tensor (a model's final norm, `Llama._final_norm`)."""
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    _library(build.variant()).rms_norm_rows(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1],
                                            weight.data_ptr(), eps, out.data_ptr())
    return out


def _seen_arrays(seen: list[Tensor] | None) -> tuple[Tensor | None, Tensor | None]:
    """Each row's key slots, flat, and where each row's start (int32), for the C side."""
    if seen is None:
        return None, None
    slots = torch.cat(seen).to(torch.int32)
    offsets = torch.tensor([0] + [len(s) for s in seen],
                           dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return slots, offsets


class KernelWeight(Protocol):
    """A linear layer's weight as `decoder_layers` reads it: `int8dot.Int8DotWeight` (bits 4 or 8)
    or `f32dot.FloatPanels` (bits 32)."""

    bits: int
    group_size: int  # int8dot's scale groups (0 for float panels)
    # codes or float panels, scales, offsets, sub-scales, the grid 4-bit codes index
    pointers: tuple[int | None, int | None, int | None, int | None, int | None]
    # two-level scales: a group's super-block is (group * group_size) >> super_shift
    super_shift: int
    variant: str  # the kernel variant whose layout the weight has


# a layer's linear layers, in the order `decoder_layers` runs them
LINEARS = ("wqkv", "wo", "w13", "w2")


class _QuantWeight(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int), ("group", ctypes.c_int), ("codes", ctypes.c_void_p),
                ("d", ctypes.c_void_p), ("m", ctypes.c_void_p), ("sub", ctypes.c_void_p),
                ("grid", ctypes.c_void_p), ("super_shift", ctypes.c_int)]


class _Part(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_int), ("start", ctypes.c_int), ("capacity", ctypes.c_int),
                ("layer_stride", ctypes.c_long), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("seen", ctypes.c_void_p), ("offsets", ctypes.c_void_p)]


# The weights a layer may lack (NULL in C), in C's order.
OPTIONAL = ("qkv_bias", "q_norm", "k_norm", "post_attention_norm", "post_ffn_norm")
# the gate's activations by transformers' name, numbered as in C
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


class _Layer(ctypes.Structure):
    _fields_ = [("attention_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p)] + [
        (name, _QuantWeight) for name in LINEARS] + [(name, ctypes.c_void_p)
                                                     for name in OPTIONAL] + [
        ("window", ctypes.c_int), ("local_rope", ctypes.c_int)]


class LayerWeights(NamedTuple):
    """One decoder layer as `decoder_layers` takes it: float32 norm weights, the linear layers'
    kernel weights, and where the architecture has them the q/k/v bias (Qwen2), the per-head q and k
    norm weights (Qwen3, Gemma 3) and the norms of the attention and feed-forward outputs (Gemma 3),
    float32 and contiguous; a sliding layer's window, and whether it rotates by the local rope."""

    attention_norm: Tensor
    ffn_norm: Tensor
    wqkv: KernelWeight
    wo: KernelWeight
    w13: KernelWeight
    w2: KernelWeight
    qkv_bias: Tensor | None = None  # [(heads + 2 kv_heads) head_dim]
    q_norm: Tensor | None = None  # [head_dim]
    k_norm: Tensor | None = None  # [head_dim]
    post_attention_norm: Tensor | None = None  # [hidden]
    post_ffn_norm: Tensor | None = None  # [hidden]
    window: int | None = None  # None: every earlier key
    local_rope: bool = False


class Shape(NamedTuple):
    """What every layer of a model shares: its sizes, the norms' epsilon, the attention scores'
    scale and the gate's activation (one of ACTIVATIONS)."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    activation: str


class Stack:
    """Every decoder layer of a model whose linear layers all run on int8dot or f32dot, in one C
    call per cached pass (`decoder_layers`), of one sequence or several stacked
    (the server's batches).
    Why: with the layers' work in C, what is left of a decode step in eager PyTorch is Python
    calling a dozen modules per layer; this removes it. Rows are computed the same whatever rows
    are beside them, so a verify row equals the one-token step at its position bit for bit
    (tests/kernels/test_decoder_kernels.py); the modules' torch ops (prefills, long passes) round
    differently, within float tolerance. The weights' addresses are read once. It runs on the
    kernel variant of the process at its making, which every weight must have been laid out
    for."""

    def __init__(self, layers: list[LayerWeights], shape: Shape):
        if shape.activation not in ACTIVATIONS:
            raise ValueError(f"no C loop for the activation '{shape.activation}' (valid: "
                             f"{', '.join(ACTIVATIONS)})")
        self.layers, self.shape = layers, shape
        self.variant = build.variant()
        table = (_Layer * len(layers))()
        for row, layer in zip(table, layers):
            row.attention_norm, row.ffn_norm = (layer.attention_norm.data_ptr(),
                                                layer.ffn_norm.data_ptr())
            for name in LINEARS:
                w = getattr(layer, name)
                if w.variant != self.variant:
                    kind = "float panels" if w.bits == 32 else "int8dot weights"
                    raise ValueError(f"{kind} laid out for the {w.variant} kernels, not "
                                     f"{self.variant}")
                setattr(row, name, _QuantWeight(w.bits, w.group_size, *w.pointers, w.super_shift))
            for pair in (("q_norm", "k_norm"), ("post_attention_norm", "post_ffn_norm")):
                if len({getattr(layer, name) is None for name in pair}) > 1:
                    raise ValueError(f"a layer has both of {' and '.join(pair)}, or neither")
            for name in OPTIONAL:
                t = getattr(layer, name)
                setattr(row, name, None if t is None else t.data_ptr())
            row.window, row.local_rope = layer.window or 0, layer.local_rope
        self._table = table
        self.local_rope = any(layer.local_rope for layer in layers)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, segments: list,
                 local: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """x [1, n, hidden] (float32, contiguous, updated in place) through every layer; cos, sin
        [n, head_dim] the rows' rope angles, `local` the same for layers with a rope of their own.
        `segments`: each sequence's `llama.Segment` (its cache, its consecutive rows of x, the keys
        each row sees), in order; their rows are written at the end of their caches, and each
        attends to its own cache only."""
        n, hidden = x.shape[1], x.shape[2]
        if local is None and self.local_rope:
            raise ValueError("a layer rotates by the local rope, and no local angles were given")
        rope = [t.contiguous() for t in (cos, sin, *(local or ()))]  # held here while C reads them
        # cos, sin, local cos, local sin
        angles = [t.data_ptr() for t in rope] + [None] * (4 - len(rope))
        parts = (_Part * len(segments))()
        held = []  # the seen-slot arrays, alive while C reads them
        for part, s in zip(parts, segments):
            slots, offsets = _seen_arrays(s.seen.rows)
            held += [slots, offsets]
            k, v = s.cache.k, s.cache.v
            part.rows, part.start, part.capacity = (s.rows.stop - s.rows.start, s.cache.length,
                                                    k.shape[3])
            part.layer_stride, part.k, part.v = k[0].numel(), k.data_ptr(), v.data_ptr()
            part.seen = None if slots is None else slots.data_ptr()
            part.offsets = None if offsets is None else offsets.data_ptr()
        c = self.shape
        if _library(self.variant).decoder_layers(
                len(self.layers), ctypes.addressof(self._table), x.data_ptr(), n, hidden, c.heads,
                c.kv_heads, c.head_dim, c.intermediate, c.eps, c.scale,
                ACTIVATIONS.index(c.activation), *angles, len(segments), ctypes.addressof(parts),
                torch.get_num_threads()):
            raise MemoryError("decoder kernel: out of memory for a pass's activations")
        return x
