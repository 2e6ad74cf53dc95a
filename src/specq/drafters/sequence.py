"""The classic sequence draft: a small model proposes gamma tokens one after another."""

from __future__ import annotations

import torch
from torch import Tensor

from ..models import Model
from ..sampling import SamplingConfig, probabilities, sample
from .base import Proposal


class SequenceDrafter:
    def __init__(self, draft: Model, target_vocab_size: int):
        self.model = draft
        self.net = draft.net
        self.vocab = target_vocab_size
        self.cache = None

    def start(self, prompt: Tensor, capacity: int) -> None:
        self.cache = self.net.new_cache(capacity)
        if prompt.shape[0] > 1:  # the last prompt token is fed with the first proposal
            self.net(prompt[:-1], self.cache)

    def _align(self, logits: Tensor) -> Tensor:
        """Draft logits on the target's vocabulary: drop extra rows, pad missing with -inf."""
        v = logits.shape[-1]
        if v == self.vocab:
            return logits
        if v > self.vocab:
            return logits[..., : self.vocab]
        return torch.nn.functional.pad(logits, (0, self.vocab - v), value=float("-inf"))

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        pending = torch.tensor(seq[self.cache.length:], dtype=torch.long)
        tokens, dists = [], []
        for _ in range(gamma):
            logits = self._align(self.net(pending, self.cache, last_only=True))
            if sampling.greedy:
                token = logits.argmax(dim=-1)
            else:
                q = probabilities(logits, sampling)
                token = sample(q, generator)
                dists.append(q)
            tokens.append(token)
            pending = token
        return Proposal(torch.cat(tokens), torch.cat(dists) if dists else None)

    def rollback(self, length: int) -> None:
        self.cache.crop(min(self.cache.length, length))
