"""Logits processing and the speculative acceptance kernel's one-row step (`acceptance.py` walks
chains and trees with it).

The kernel is exact (Leviathan et al. 2023; Chen et al. 2023): draft token x ~ q is accepted with
probability min(1, p(x)/q(x)); at the first rejection the replacement is drawn from
normalize(max(0, p - q)); after a fully accepted draft a bonus token is drawn from p. The emitted
token then follows p exactly. p and q are the *processed* distributions (temperature, top-k,
top-p applied to both), so the output follows what the target alone would sample.
Greedy (temperature 0) is the limit: accept while the draft token is the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1.0 means off

    def __post_init__(self):
        if not (self.temperature >= 0 and self.temperature <= 100):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """Rows of logits [n, V] -> processed probabilities [n, V] (float32)."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order,
                                                                 mass_before >= cfg.top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token id per row of probs [n, V] (or [V]): the row's cumulative sum, in float64,
    inverted at a uniform draw: the distribution torch.multinomial draws from, at a fraction of
    its cost on a vocabulary of 150k tokens, where multinomial's cost showed in every draft token's
    step. A token of probability 0 is never drawn."""
    cdf = probs.double().cumsum(-1)
    total = cdf[..., -1:]
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64)
    token = torch.searchsorted(cdf, u * total, right=True)
    beyond = token >= probs.shape[-1]  # u * total rounded up to total: the last token with mass
    if beyond.any():
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).long().argmax(-1, keepdim=True)
        token = torch.where(beyond, last, token)
    return token.squeeze(-1)


def acceptance_probability(p_x: Tensor, q_x: Tensor) -> Tensor:
    """min(1, p(x)/q(x)) for the drafted tokens x."""
    return torch.where(q_x > 0, (p_x / q_x).clamp(max=1.0), torch.ones_like(p_x))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """normalize(max(0, p - q)): where the replacement token comes from after a rejection.
    When p == q nothing can be rejected; fall back to p so the function is total."""
    r = (p - q).clamp(min=0.0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp(min=1e-30), p)
