"""What a drafter is (`Drafter`) and what it proposes (`Proposal`): the loop's only view of drafts."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..core.gamma import AUTO, AUTO_MAX_GAMMA
from ..core.sampling import SamplingConfig, probabilities, sample

# Draft tokens per step when the caller does not say: "auto", each step's length (0, plain
# decoding, up to AUTO_MAX_GAMMA) chosen from the run's measured acceptance and costs, so that
# speculation is on where it pays and off where it does not: no fixed gamma is best for every
# target, draft and text (docs/benchmarks.md, "The default"). Sampling keeps a fixed gamma: the
# tokens a seed draws depend on the steps' lengths, and auto's follow timings, so a seeded request
# would no longer repeat its output. A tree's default is its own depth.
DEFAULT_GAMMA = AUTO
SAMPLING_GAMMA = 2  # the best fixed gamma measured with the shipped drafts (docs/benchmarks.md)
LONGEST_DEFAULT = AUTO_MAX_GAMMA  # the longest proposal the default plans for


def default_gamma(tree, greedy: bool) -> int | str:
    """gamma when the caller gives none: a tree's (`tree.TreeShape`) own depth; for chains "auto"
    when greedy, SAMPLING_GAMMA when sampling."""
    return tree.depth if tree is not None else DEFAULT_GAMMA if greedy else SAMPLING_GAMMA


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

    def longest(self, route: str, gamma: int) -> int:
        """The longest proposal `route` makes in a run whose longest is `gamma`: gamma "auto"
        chooses each route's length up to its own."""


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
