"""Adapter that lets any Hugging Face causal LM run in the speculative loop.

The native module in `llama.py` is faster, but what its table (`architectures.py`) does not
cover runs here, with transformers' own DynamicCache, rolled back with `crop`.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn


class HFCache:
    """A DynamicCache plus the bookkeeping the loop needs: `length` and `crop(n)`."""

    def __init__(self, config):
        from transformers import DynamicCache

        self.inner = DynamicCache(config=config)
        self.length = 0

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        if length < self.length:
            self.inner.crop(length - self.length)  # transformers 5: negative = tokens to drop
        self.length = length

    def keep(self, start: int, rows: Tensor) -> None:
        """Keep rows start + rows (a prefix: token trees need the native Llama module)."""
        if not torch.equal(rows, torch.arange(rows.shape[0])):
            raise ValueError("a transformers target verifies chains only, not token trees")
        self.crop(start + rows.shape[0])


class HFCausalLM(nn.Module):
    """Same calling convention as `llama.Llama`: forward(ids, cache, last_only) -> logits."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model.eval()
        self.config = hf_model.config

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf.parameters()).dtype

    def new_cache(self, capacity: int) -> HFCache:
        return HFCache(self.config)

    def forward(self, ids: Tensor, cache: HFCache | None = None, last_only: bool = False) -> Tensor:
        n = ids.shape[0]
        if cache is None:
            return self.hf(ids[None]).logits[0].float()
        positions = torch.arange(cache.length, cache.length + n)[None]
        with warnings.catch_warnings():  # transformers 5.2x renames past_key_values to cache
            warnings.simplefilter("ignore", FutureWarning)
            out = self.hf(ids[None], past_key_values=cache.inner, use_cache=True,
                          position_ids=positions, logits_to_keep=1 if last_only else 0)
        cache.length += n
        return out.logits[0].float()

    def forward_many(self, seqs: list, return_hidden: bool = False) -> list[tuple[Tensor, None]]:
        """`Llama.forward_many`'s contract, one sequence per pass (chains only, no hidden states:
        token trees and feature drafts need the native module)."""
        if return_hidden or any(s.positions is not None or s.mask is not None for s in seqs):
            raise ValueError("a transformers target verifies chains only and has no hidden states "
                             "to hand out")
        return [(self(s.ids, s.cache, s.last_only), None) for s in seqs]
