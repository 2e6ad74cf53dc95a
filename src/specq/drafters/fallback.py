"""Two drafters as one: the first one's proposal when it has one, else the second's.

Built for `ngram+MODEL`: the n-gram lookup costs nothing and is right where the text repeats
itself; the model drafts the other steps. With gamma "auto" the loop chooses the route each step
(`types.Routed`): where a lookup matches but has been wrong on this text, the model drafts.
Only one proposal is verified per step, so the target never pays verify rows for both. Each step
both drafters learn what settled (`rollback`): the one that proposed keeps its accepted nodes;
the other is told, as after a plain step, that none of its own were (a model draft's cache holds
settled tokens only and takes the rest with its next proposal; a feature draft still receives
the target's hidden states of every accepted row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.sampling import SamplingConfig
from ..core.types import EMPTY, Drafter, Proposal
from .ngram import NgramDrafter

MODEL = "model"  # the model's route (`types.Routed`), beside the lookup's own (`ngram.py`)


class FallbackDrafter:
    """`first` proposes; where it proposes nothing, `then` does, at most `then_gamma` deep (the
    model draft's own gamma; the run's cap may be longer for the first)."""

    def __init__(self, first: NgramDrafter, then: Drafter, then_gamma: int):
        self.first, self.then, self.then_gamma = first, then, then_gamma
        self.needs_target_features = first.needs_target_features or then.needs_target_features
        self.proposer: Drafter | None = None  # whose proposal this step's verify pass checks
        self.chosen: str | None = None  # the route `use` chose for the next proposal

    def nodes(self, gamma: int) -> int:
        return max(self.first.nodes(gamma), self.then.nodes(min(gamma, self.then_gamma)))

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None) -> None:
        self.first.start(prompt, capacity, features)
        self.then.start(prompt, capacity, features)

    def routes(self, seq: list[int]) -> list[str]:
        """The lookup's route first where it has a proposal (a copy's or a match's); MODEL
        always."""
        route = self.first.route_after(seq)
        return [route, MODEL] if route else [MODEL]

    def use(self, route: str) -> None:
        self.chosen = route

    def proposed(self) -> str:
        return self.first.proposed() if self.proposer is self.first else MODEL

    def longest(self, route: str, gamma: int) -> int:
        """The lookup route's own length, or the model draft's gamma (each at most the run's
        `gamma`)."""
        return min(gamma, self.then_gamma) if route == MODEL else self.first.longest(route, gamma)

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        chosen, self.chosen = self.chosen, None
        proposal = (self.first.propose(seq, gamma, sampling, generator) if chosen != MODEL
                    else EMPTY)
        self.proposer = self.first
        if not len(proposal.tokens):
            proposal = self.then.propose(seq, min(gamma, self.then_gamma), sampling, generator)
            self.proposer = self.then
        return proposal

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        for drafter in (self.first, self.then):
            drafter.rollback(length, features, path if drafter is self.proposer else [])
        self.proposer = None  # a plain step next (no proposal) accepts nobody's nodes
