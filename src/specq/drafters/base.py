"""What a drafter is (`Drafter`) and what it proposes (`Proposal`): the loop's only view of drafts."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..core.sampling import SamplingConfig, probabilities, sample

# Draft tokens per step when the caller does not say. On the 2-core CPU this project measures on,
# the shipped drafts pay best at gamma 1-2 (docs/benchmarks.md, "The shipped feature draft"):
# their acceptance falls with each position while every drafted token costs a draft step and a
# verify row. Drafts that agree more with their target pay at longer gammas: pass gamma.
DEFAULT_GAMMA = 2


class Proposal(NamedTuple):
    """Draft tokens as a tree rooted at the sequence's last token; a chain is the special case.

    Nodes are in topological order (a parent before its children, siblings best first)."""

    tokens: Tensor  # [N] draft token ids
    parents: Tensor  # [N] each node's parent index in `tokens`; -1: a child of the root
    probs: Tensor | None  # [N, V] the processed draft distribution each node was sampled from;
    # None when greedy or when the nodes were chosen, not sampled (then each is a point mass)

    @classmethod
    def chain(cls, tokens: Tensor, probs: Tensor | None = None) -> "Proposal":
        return cls(tokens, torch.arange(-1, tokens.shape[0] - 1), probs)


EMPTY = Proposal.chain(torch.empty(0, dtype=torch.long))


class Drafter(Protocol):
    """Proposes draft tokens for the target to verify; keeps whatever state it needs (a cache)."""

    needs_target_features: bool  # the loop passes the target's final hidden states when set

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None) -> None:
        """Prefill on the prompt ids; `features`: the target's hidden states of the prompt rows."""

    def nodes(self, gamma: int) -> int:
        """The most nodes a proposal at most `gamma` deep can hold (verify rows are this plus one)."""

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        """At most `gamma` tokens deep, continuing `seq` (every token so far)."""

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """seq[:length + 1] is settled; `path` are the indices of the last proposal's accepted
        nodes (root to leaf), `features` the target's hidden states of the root and those nodes."""


@runtime_checkable
class Routed(Protocol):
    """A drafter made of drafters that differ in cost and agreement (`ngram+MODEL`): which of them
    would propose next, so gamma "auto" keeps costs and acceptance per route (`core/decode.py`)
    rather than one mix of a free lookup's and a model's."""

    def route(self, seq: list[int]) -> str:
        """The name of the drafter that proposes next after `seq` (every token so far)."""


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
