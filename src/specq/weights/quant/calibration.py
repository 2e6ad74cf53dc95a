"""Calibration inputs: token windows from a corpus, and running single decoder blocks on them.

Block running assumes the `specq.model.llama.Llama` layout (`tok_embeddings`, `layers`, rope tables
via `_ensure_rope`); RTN needs none of this and works on any module with `nn.Linear` layers.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn


def calibration_samples(token_ids: Sequence[Tensor], n_samples: int = 32, seq_len: int = 512,
                        seed: int = 0) -> list[Tensor]:
    """`n_samples` windows of `seq_len` tokens drawn (seeded) from the concatenated documents.

    Windows do not overlap, so no token is counted twice in the statistics. Fewer windows than
    asked for (a short corpus) gives a warning and all that fit."""
    if n_samples < 1 or seq_len < 1:
        raise ValueError(f"need n_samples >= 1 and seq_len >= 1, got {n_samples} and {seq_len}")
    stream = (torch.cat([t.reshape(-1).long() for t in token_ids])
              if token_ids else torch.zeros(0, dtype=torch.long))
    n_windows = stream.numel() // seq_len
    if n_windows == 0:
        raise ValueError(f"calibration corpus has {stream.numel()} tokens, fewer than "
                         f"seq_len={seq_len}")
    if n_windows < n_samples:
        warnings.warn(f"calibration corpus holds {n_windows} windows of {seq_len} tokens, "
                      f"fewer than the {n_samples} requested; using all of them", stacklevel=2)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(n_windows, generator=generator)[:n_samples].sort().values
    windows = stream[: n_windows * seq_len].view(n_windows, seq_len)
    return list(windows[picks])


def embed(model: nn.Module, samples: Sequence[Tensor]) -> list[Tensor]:
    """The inputs [1, n, hidden] of decoder block 0."""
    return [model.tok_embeddings(ids).unsqueeze(0) for ids in samples]


def run_block(model: nn.Module, index: int, x: Tensor) -> Tensor:
    """Decoder block `index` on a whole sequence x [1, n, hidden], without a KV cache."""
    n = x.shape[1]
    model._ensure_rope(n)
    return model.layers[index](x, model.rope_cos[:n], model.rope_sin[:n], None, index)
