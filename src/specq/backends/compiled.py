"""The torch.compile backend: padded fixed-shape chain steps of the native decoder (`Llama.compile`)."""

from __future__ import annotations

import os

from torch import nn

from ..model.llama import Llama
from ..paths import cache_dir


def takes(net: nn.Module) -> bool:
    """Only the native decoder's steps compile; a feature draft (one small layer fed the target's
    features) and transformers' modules do not."""
    return isinstance(net, Llama)


def compile(net: Llama, backend: str = "inductor") -> None:
    """Compile `net`'s cached steps, in place, on plain torch modules (inductor cannot trace
    specq's C kernels or oneDNN's opaque packed weights, and packs frozen weights itself). Its
    graph and autotuning caches live under $SPECQ_CACHE, so a second process reuses every
    compiled shape (unless the user points inductor elsewhere)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    net.compile(backend)
