"""The decoding loop: propose -> verify in one target pass -> accept -> roll back.

Plain decoding is the same loop with no drafter (gamma 0): one target pass per token. The loop
knows nothing about which drafter or quantization it runs with, nor whether it proposes a chain
or a token tree: a chain is a tree whose nodes each have one child.

A `Sequence` is one generation in progress. `step` advances several sequences by one verify pass
each, all in one target forward (how `specq serve` batches concurrent requests); `decode` is the
one-sequence case (`specq generate`). Each sequence drafts, accepts and rolls back on its own, so
its output is the same alone or in a batch.

Cache invariant: the target's KV cache holds every token of `seq` except the last one, which is
fed (as the root, with the draft nodes after it) to the next verify pass.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import Tensor

from ..model.llama import Rows
from .acceptance import accept_greedy, accept_sampling, depths, is_chain, verify_layout
from .gamma import LONGEST_DEFAULT, CostAwareGamma, GammaMemory
from .sampling import SamplingConfig, probabilities, sample
from .stats import DecodeStats
from .stopping import StopChecker
from .types import EMPTY, Drafter, Model, Proposal, Routed, SeesVerify


def decode(target: Model, prompt_ids: list[int], **options) -> tuple[list[int], str, DecodeStats]:
    """Generate from `target`, speculatively when a drafter is given (`Sequence` has the options).
    Returns (new token ids, finish reason 'eos' | 'stop' | 'length' | 'cancelled', stats)."""
    return run(Sequence(target, prompt_ids, **options))


def run(sequence: Sequence) -> tuple[list[int], str, DecodeStats]:
    """Decode one sequence to its end."""
    sequence.prefill()
    while not sequence.done:
        step([sequence])
    return sequence.result()


@torch.inference_mode()
def step(sequences: list[Sequence], speculate: bool = True) -> None:
    """One verify pass for each sequence (all prefilled, none done, one target): each drafts, one
    target forward verifies every proposal (rows stacked: `Runner.forward_many`), each accepts.
    `speculate=False`: every sequence takes a plain step this time (a server under load, where
    draft rows cost more than they save); lossless either way."""
    run = sequences[0].target.runner
    if any(s.target.runner is not run for s in sequences):
        raise ValueError("sequences stepped together must share their target")
    rows = [s.propose(speculate) for s in sequences]
    started = time.perf_counter()
    outputs = run.forward_many(rows, return_hidden=any(s.wants_features for s in sequences))
    verify_s = time.perf_counter() - started
    for sequence, (logits, features) in zip(sequences, outputs):
        sequence.accept(logits, features, verify_s)


class Sequence:
    """One generation: its target cache, drafter, sampling state, stop rule and stats. A step is
    split in two so that `step` can verify several sequences in one target pass: `propose` (draft,
    then the rows to verify) and `accept` (the target's logits -> accepted path, roll back, emit).

    `adaptive`: gamma is the longest proposal and each step's length is chosen from measured costs
    (`gamma.py`), starting from what `memory` kept under `memory_key` (the target's earlier runs
    with the same draft) and keeping what this run learned there when it ends. `ignore_eos` runs
    to max_new_tokens (as in vLLM), for benchmarks at a fixed output length. `on_tokens`
    (streaming) gets each step's new tokens, up to a stop; returning False ends the run with
    reason 'cancelled' (a client that went away)."""

    def __init__(self, target: Model, prompt_ids: list[int], *, drafter: Drafter | None = None,
                 gamma: int = LONGEST_DEFAULT, adaptive: bool = False,
                 sampling: SamplingConfig = SamplingConfig(), max_new_tokens: int = 128,
                 stop_strings: list[str] | None = None, ignore_eos: bool = False,
                 generator: torch.Generator | None = None, on_tokens: Callable[[list[int]], bool]
                 | None = None, memory: GammaMemory | None = None, memory_key: str = ""):
        self.target, self.prompt_ids, self.drafter, self.sampling = (target, list(prompt_ids),
                                                                     drafter, sampling)
        self.generator = generator or torch.Generator().manual_seed(0)
        self.gamma = gamma if drafter is not None else 0
        self.adaptive = adaptive and self.gamma > 0
        self.choosers: dict[str, CostAwareGamma] = {}  # gamma auto's, per route (`types.Routed`)
        self.verify_s: dict[int, float] = {}  # their one table of verify costs per row count
        self.memory, self.memory_key = memory or GammaMemory(), memory_key
        self.chooser: CostAwareGamma | None = None  # this step's
        self.asked: list[CostAwareGamma] = []  # the other routes' choosers asked this step
        self.route = "draft"  # which drafter proposed this step (`stats.routes`)
        self.max_new_tokens, self.on_tokens = max_new_tokens, on_tokens
        self.stats = DecodeStats(gamma=self.gamma, prompt_tokens=len(prompt_ids))
        self.stopper = StopChecker(target.tokenizer, frozenset() if ignore_eos else target.eos_ids,
                                   stop_strings, max_new_tokens)
        self.capacity = len(prompt_ids) + max_new_tokens + (drafter.nodes(self.gamma)
                                                            if drafter else 0) + 1
        self.wants_features = drafter is not None and drafter.needs_target_features
        self.seq: list[int] = []  # prompt and every token generated
        self.generated: list[int] = []
        self.stop: tuple[int, str] | None = None  # (tokens to keep, reason) once decided
        self.sent = 0  # tokens passed to on_tokens
        self.proposal: Proposal = EMPTY  # this step's
        self.cap = 0  # this step's cap on the proposal (gamma auto)
        self.chosen = False  # whether gamma auto chose this step's cap
        self.draft_s = 0.0  # this step's drafting time

    @property
    def done(self) -> bool:
        return self.stop is not None

    @torch.inference_mode()
    def prefill(self) -> None:
        """Run the prompt through both models; the target's last logits give the first new token."""
        started = time.perf_counter()
        self.cache = self.target.runner.new_cache(self.capacity)
        prompt = torch.tensor(self.prompt_ids, dtype=torch.long)
        [(logits, features)] = self.target.runner.forward_many(
            [Rows(prompt, self.cache, last_only=True)],
            return_hidden=self.wants_features)
        first = int(logits.argmax(-1)) if self.sampling.greedy else \
            int(sample(probabilities(logits, self.sampling), self.generator))
        if self.drafter is not None:
            self.drafter.start(prompt, self.capacity, features)
        self.stats.prefill_s = time.perf_counter() - started
        self.seq = self.prompt_ids + [first]
        self.generated = [first]
        self.decode_started = time.perf_counter()
        self._emit(1)

    def propose(self, speculate: bool = True) -> Rows:
        """Draft (never past the token budget; nothing when not `speculate`) and return the rows the
        target verifies: the last token (the root) and every draft node, a tree's with its
        positions and mask."""
        self.chosen = speculate and self.adaptive  # gamma auto learns from its own choices only
        cap = self._choose() if self.chosen else (self.gamma if speculate else 0)
        self.cap = min(cap, self.max_new_tokens - len(self.generated) - 1)
        started = time.perf_counter()
        self.proposal = (self.drafter.propose(self.seq, self.cap, self.sampling, self.generator)
                         if self.cap > 0
                         else EMPTY)
        self.draft_s = time.perf_counter() - started
        self.route = (self.drafter.proposed() if isinstance(self.drafter, Routed)
                      else getattr(self.drafter, "route", "draft"))
        tokens, parents = self.proposal.tokens, self.proposal.parents
        tree = {} if is_chain(parents) else verify_layout(parents, self.cache.length)
        return Rows(torch.cat([torch.tensor(self.seq[-1:]), tokens]), self.cache, **tree)

    def _choose(self) -> int:
        """gamma auto's cap on this step's proposal. A drafter of several routes (`types.Routed`)
        proposes on the route whose chooser expects the most tokens per second at its own cap (a
        route not yet timed is tried first); when that cap is 0 the step is plain and every route
        asked learns its cost. A route passed over for its interval of steps is tried once at its
        cap or 1 (`CostAwareGamma.idle`), or a lookup priced out early in a text would never learn
        that a later stretch copies. Every route's chooser prices verify rows from one table: a
        pass costs what its rows cost whichever route drafted them, and a route seldom chosen
        would otherwise know only the row counts of its own few passes (a lookup timed only at
        its longest would price every shorter proposal at that)."""
        routes = self.drafter.routes(self.seq) if isinstance(self.drafter, Routed) else [""]
        asked = []
        for route in routes:
            if route not in self.choosers:
                longest = self.drafter.longest(route, self.gamma) if route else self.gamma
                chooser = self.memory.chooser(self.memory_key, route, longest)
                for rows, seconds in chooser.verify_s.items():
                    self.verify_s.setdefault(rows, seconds)
                chooser.verify_s = self.verify_s
                self.choosers[route] = chooser
            chooser = self.choosers[route]
            cap = chooser.next()
            if len(routes) == 1:
                rate = 0.0
            elif chooser.idle >= chooser.interval:
                cap, rate = max(cap, 1), float("inf")
            else:
                rate = chooser.rate(cap)
            asked.append((rate, -len(asked), route, chooser, cap))
        _, _, route, self.chooser, cap = max(asked, key=lambda a: a[:2])
        self.asked = [c for _, _, r, c, _ in asked if r != route]
        if route:
            self.drafter.use(route)
        return cap

    def accept(self, logits: Tensor, features: Tensor | None, verify_s: float) -> None:
        """The target's logits [rows, V] (and hidden states, for a feature drafter) for this
        sequence's rows, computed in a pass of `verify_s` seconds: accept the path plus the
        target's own next token, keep only their rows in the caches, emit, check for a stop."""
        started = time.perf_counter()
        tokens, parents = self.proposal.tokens, self.proposal.parents
        if self.sampling.greedy:
            path, next_token = accept_greedy(tokens, parents, logits)
        else:
            path, next_token = accept_sampling(tokens, parents, self.proposal.probs,
                                               probabilities(logits, self.sampling), self.generator)
        verify_s += time.perf_counter() - started
        self.stats.draft_s += self.draft_s
        self.stats.verify_s += verify_s
        depth = int(depths(parents).max()) if len(tokens) else 0
        self.stats.record_step(len(tokens), len(path), depth, self.route)
        if self.chosen:
            self.chooser.observe(self.cap, depth, len(path), self.draft_s, verify_s, len(tokens))
            for chooser in self.asked:
                if len(tokens):
                    chooser.passed()
                else:  # a plain step, for every route (its cost is in the shared table)
                    chooser.observe(0, 0, 0, 0.0, None)

        rows = torch.tensor([0] + [node + 1 for node in path])
        new = tokens[path].tolist() + [next_token]
        self.cache.keep(len(self.seq) - 1, rows)
        self.seq += new
        self.generated += new
        if isinstance(self.drafter, SeesVerify):
            self.drafter.verified(logits.argmax(-1))
        if self.drafter is not None:
            self.drafter.rollback(len(self.seq) - 1, None if features is None else features[rows],
                                  path)
        self._emit(len(new))

    def _emit(self, new: int) -> None:
        """Check the `new` last tokens for a stop, then stream what precedes it."""
        self.stop = self.stopper.first_stop(self.generated, len(self.generated) - new)
        upto = len(self.generated) if self.stop is None else self.stop[0]
        if self.on_tokens is not None and upto > self.sent:
            keep_going = self.on_tokens(self.generated[self.sent:upto])
            self.sent = upto
            if not keep_going and self.stop is None:
                self.stop = (upto, "cancelled")
        if self.stop is not None:
            self.stats.decode_s = time.perf_counter() - self.decode_started
            self.stats.new_tokens = self.stop[0]
            for route, chooser in self.choosers.items():
                self.memory.keep(self.memory_key, route, chooser)

    def result(self) -> tuple[list[int], str, DecodeStats]:
        """(new token ids, finish reason, stats) of a finished sequence."""
        keep, reason = self.stop
        return self.generated[:keep], reason, self.stats
