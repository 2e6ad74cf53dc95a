"""The types every layer above shares: what `specq.load` returns (a `Model`, or a `Draft` of a
kind that only drafts), what a drafter is (`Drafter`) and what it proposes (`Proposal`).

They live at the bottom of the loop so that the loop, the drafters and loading all name them
without importing each other. A `Model` and a `Draft` are different types, so a draft is never
taken for a target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from .. import backends
from ..backends.runner import Runner
from .sampling import SamplingConfig


@dataclass
class Model:
    """A loaded model: the network, its tokenizer, and what the decoding loop needs to know (a
    target, or the model a sequence draft runs)."""

    ref: str
    # llama.Llama or hf_backend.HFCausalLM: the torch modules, as loaded (never changed)
    net: nn.Module
    tokenizer: object
    eos_ids: frozenset[int]
    source: str  # where the weights came from, for reports
    precision: str = "fp32"
    info: dict = field(default_factory=dict)
    # runs `net` (default: torch's ops)
    runner: Runner | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.runner is None and self.net is not None:
            self.runner = backends.runner(self.net, "eager")

    @property
    def vocab_size(self) -> int:
        """The vocabulary the model reads and scores (a feature draft's head covers a subset)."""
        return getattr(self.net, "target_vocab_size", None) or self.net.config.vocab_size

    def __repr__(self) -> str:
        return f"Model({self.ref!r}, {self.precision}, from {self.source})"


@dataclass(frozen=True, eq=False)
class Kind:
    """A kind of draft: how a ref or a folder names it, and what each part of specq does with one.
    The entries are `loading.kinds.KINDS`; each callable lives beside the code it runs."""

    name: str
    about: str  # one line: what it is, for errors and listings
    # a parsed draft ref (`loading.refs`: a model or n-gram ref) names this kind, or its folder does
    recognizes: Callable[[object], bool]
    load: Callable[..., object]  # (parsed ref, backend, target) -> the loaded draft
    # (draft, target, min_confidence, tree, gamma, suffix cache) -> a `Drafter`
    drafter: Callable[..., object]
    rows: Callable | None = None  # (runner, ids [n], cache): the draft's network alone on n rows
    # (target runner, draft runner, ids [n]) -> (target, draft logits, next ids)
    next_token_logits: Callable | None = None
    write: Callable | None = None  # (draft, folder, info): save it in its own format
    verifies: bool = False  # scores tokens on its own: it can be a hierarchy's intermediate level
    transformers: bool = False  # transformers' assisted generation runs it (the bench's peer)
    is_model: bool = False  # one loads as a plain `Model` (it can be a target too)


@dataclass(eq=False)
class Draft:
    """A loaded draft of a kind that cannot be a target (a feature draft, `self@SPEC`): its kind
    and the model it runs. A sequence draft is a plain `Model` (any model can draft)."""

    kind: Kind
    model: Model

    ref = property(lambda self: self.model.ref)
    net = property(lambda self: self.model.net)
    runner = property(lambda self: self.model.runner,
                      lambda self, run: setattr(self.model, "runner", run))
    tokenizer = property(lambda self: self.model.tokenizer)
    eos_ids = property(lambda self: self.model.eos_ids)
    source = property(lambda self: self.model.source)
    precision = property(lambda self: self.model.precision)
    info = property(lambda self: self.model.info)
    vocab_size = property(lambda self: self.model.vocab_size)

    def __repr__(self) -> str:
        return f"Draft({self.kind.name}, {self.model!r})"


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
        """The most nodes a proposal at most `gamma` deep can hold (verify rows: this plus one)."""

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        """At most `gamma` tokens deep, continuing `seq` (every token so far)."""

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """seq[:length + 1] is settled; `path` are the indices of the last proposal's accepted
        nodes (root to leaf), `features` the target's hidden states of the root and those nodes."""


@runtime_checkable
class SeesVerify(Protocol):
    """A drafter that learns from every verify row, not only from the accepted path: lookahead's
    Jacobi window takes the target's choices at the rows past a rejection as its next guesses."""

    def verified(self, choices: Tensor) -> None:
        """choices [rows]: the target's argmax at each row of the last verify pass (row 0 the
        root, row i + 1 node i of the proposal; one row after a plain step). Called before
        `rollback`."""


@runtime_checkable
class Routed(Protocol):
    """A drafter whose proposals come by routes that differ in cost and agreement (`ngram+MODEL`:
    a free lookup's and a model's; a lookup's copies and its short matches): which of them could
    propose next, so gamma "auto" keeps costs and acceptance per route (`decode.py`) and picks,
    each step, the route it expects the most tokens per second of, rather than one mix of them."""

    def routes(self, seq: list[int]) -> list[str]:
        """The names of the drafters that could propose next after `seq` (every token so far), the
        one that proposes when none is chosen first."""

    def use(self, route: str) -> None:
        """The next proposal is `route`'s (one of the last `routes`)."""

    def proposed(self) -> str:
        """The route the last proposal came from (the stats count each route's steps)."""

    def longest(self, route: str, gamma: int) -> int:
        """The longest proposal `route` makes in a run whose longest is `gamma`: gamma "auto"
        chooses each route's length up to its own."""
