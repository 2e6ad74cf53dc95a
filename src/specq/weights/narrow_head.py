"""An output layer that scores only a subset of the vocabulary (a draft's narrowed head).

Why: a small draft's head is a large share of the bytes its step reads (the Qwen2.5 vocabulary has
151,936 rows), yet the tokens a target writes on a task are a small part of it (FR-Spec, Zhao et
al. 2025). Every other token scores -inf, so a draft proposes only kept tokens and its q is zero
elsewhere: the rejection rule stays exact (a dropped token costs acceptance, never correctness).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class NarrowHead(nn.Module):
    """`rows` computes the kept tokens' logits (any linear module of [len(keep), hidden]); the
    output is over the whole vocabulary, -inf outside `keep`."""

    def __init__(self, rows: nn.Module, keep: Tensor, vocab_size: int):
        """keep: int [k], the token ids of `rows`' outputs, in their order (unique)."""
        super().__init__()
        if keep.numel() != torch.unique(keep).numel() or int(keep.max()) >= vocab_size:
            raise ValueError("a narrowed head keeps distinct token ids below the vocabulary size")
        self.rows = rows
        self.register_buffer("keep", keep.long())
        self.vocab_size = vocab_size

    def forward(self, x: Tensor, linear=None) -> Tensor:
        """x [..., hidden] -> logits [..., vocab_size] (-inf outside the kept tokens);
        `linear(module, x)` runs the kept rows as the caller's execution does (default:
        their own torch op)."""
        kept = self.rows(x) if linear is None else linear(self.rows, x)
        out = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.keep, kept)

    def extra_repr(self) -> str:
        return f"{self.keep.numel()} of {self.vocab_size} tokens"


def narrow_linear(head: nn.Linear, keep: Tensor) -> NarrowHead:
    """A float head restricted to `keep` (its rows copied as they are)."""
    rows = nn.Linear(head.in_features, keep.numel(), bias=False, dtype=head.weight.dtype)
    rows.weight = nn.Parameter(head.weight.detach()[keep.long()].clone(), requires_grad=False)
    return NarrowHead(rows, keep, head.out_features)
