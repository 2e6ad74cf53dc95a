from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..sampling import SamplingConfig, probabilities, sample

# Draft tokens per step when the caller does not say. On the 2-core CPU this project measures on,
# the shipped drafts pay best at gamma 1-2 (docs/benchmarks.md, "The shipped feature draft"):
# their acceptance falls with each position while every drafted token costs a draft step and a
# verify row. Drafts that agree more with their target pay at longer gammas: pass gamma.
DEFAULT_GAMMA = 2


class Proposal(NamedTuple):
    tokens: Tensor  # [g] draft token ids
    probs: Tensor | None  # [g, V] processed draft distributions q (None when greedy)


EMPTY = Proposal(torch.empty(0, dtype=torch.long), None)


def choose(logits: Tensor, sampling: SamplingConfig, generator: torch.Generator,
           min_confidence: float) -> tuple[Tensor, Tensor | None, bool]:
    """One draft token from [1, V] logits: (token [1], its processed distribution q [1, V] or
    None when greedy, whether the draft's probability for it reaches `min_confidence`)."""
    if sampling.greedy:
        token = logits.argmax(dim=-1)
        return token, None, not min_confidence or bool(logits.softmax(-1)[0, token] >= min_confidence)
    q = probabilities(logits, sampling)
    token = sample(q, generator)
    return token, q, bool(q[0, token] >= min_confidence)
