"""The decoder's work between its linear layers in one C call each (`decoder.c`): RMSNorm,
SiLU(gate) * up, and the attention of a cached pass's rows.

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

import ctypes
import functools

import torch
from torch import Tensor

from . import build


@functools.cache
def available() -> bool:
    """Whether this CPU has AVX2 and the kernels build; the fast path keeps torch's ops if not."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        _library()
    except build.KernelUnavailable:
        return False
    return True


@functools.cache
def _library() -> ctypes.CDLL:
    lib = build.load("decoder")
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.rms_norm.argtypes = [p, i, i, p, f, p]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [p, i, i, p]
    lib.silu_mul.restype = None
    lib.attend_rows.argtypes = [p, i, i, i, i, p, p, p, p, i, i, p, p, f, p, i]
    lib.attend_rows.restype = ctypes.c_int
    return lib


def takes(x: Tensor) -> bool:
    """Whether these kernels may compute from x: float32, and no gradients being recorded (their
    outputs have none: training takes torch's ops)."""
    return x.dtype == torch.float32 and not torch.is_grad_enabled()


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension; x, weight float32, contiguous."""
    y = torch.empty_like(x)
    _library().rms_norm(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], weight.data_ptr(), eps, y.data_ptr())
    return y


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up from [..., 2I] (gate first); float32, contiguous."""
    width = gate_up.shape[-1] // 2
    y = gate_up.new_empty(gate_up.shape[:-1] + (width,))
    _library().silu_mul(gate_up.data_ptr(), gate_up.numel() // gate_up.shape[-1], width, y.data_ptr())
    return y


def attend_rows(qkv: Tensor, heads: int, kv_heads: int, cos: Tensor, sin: Tensor, k_cache: Tensor,
                v_cache: Tensor, start: int, seen: list[Tensor] | None) -> Tensor:
    """The attention of n rows written at `start` of one layer's cache (see `decoder.c`).
    qkv [n, (heads + 2 kv_heads) head_dim] unrotated; cos, sin [n, head_dim]; k_cache, v_cache
    [kv_heads, capacity, head_dim], contiguous; `seen`: None for a chain, else each row's key slots.
    Returns [n, heads * head_dim]."""
    n, dim = qkv.shape[0], cos.shape[-1]
    out = qkv.new_empty(n, heads * dim)
    slots = offsets = None
    if seen is not None:
        slots = torch.cat(seen).to(torch.int32)
        offsets = torch.tensor([0] + [len(s) for s in seen], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    if _library().attend_rows(
            qkv.data_ptr(), n, heads, kv_heads, dim, cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
            v_cache.data_ptr(), k_cache.shape[1], start, None if slots is None else slots.data_ptr(),
            None if offsets is None else offsets.data_ptr(), dim ** -0.5, out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("decoder kernel: out of memory for the attention scores")
    return out
