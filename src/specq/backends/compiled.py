"""The torch.compile backend: padded fixed-shape chain steps (`Llama.compile`)."""

from __future__ import annotations

from ..model.llama import Llama
from . import fastpath


def compile(net: Llama, capacity: int = 1024, backend: str = "inductor") -> None:
    """Compile `net`'s cached steps, in place. The fast path is reverted first: inductor cannot
    trace specq's C kernels or oneDNN's opaque packed weights (and packs frozen weights itself
    when asked to)."""
    fastpath.revert(net)
    net.compile(capacity, backend)
