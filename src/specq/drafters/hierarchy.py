"""Hierarchical drafting (SpecMQuant, seed 002): a cheap draft's proposal is verified by an
intermediate model before the target sees it.

The lower drafter proposes (typically a token tree); the intermediate model verifies that proposal
in one pass, exactly as the target would (`acceptance.accept_greedy` / `accept_sampling` against
its own distributions), and what it accepts, plus its own next token, is the chain the target
verifies (cut at gamma tokens). The target never pays for the tree's rejected branches, and the
intermediate model, cheaper than the target and closer to it than the lower draft, filters them.

Lossless: the intermediate level's output follows its own distribution q exactly (the same
argument as the target's level), so the chain it hands up is a draft sampled from q, row by row,
and the target's usual verification against those q rows keeps the output the target's own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.acceptance import accept_greedy, accept_sampling, is_chain, verify_layout
from ..core.sampling import SamplingConfig, probabilities
from ..core.types import Drafter, Model, Proposal
from ..kernels.rows import ROW_BY_ROW_MAX
from ..model.llama import Llama


class HierarchicalDrafter:
    def __init__(self, lower: Drafter, middle: Model, target_vocab_size: int):
        if not isinstance(middle.net, Llama):
            raise ValueError("the intermediate level must run on specq's own Llama module")
        self.lower = lower
        self.net = middle.runner
        self.vocab = target_vocab_size
        self.needs_target_features = lower.needs_target_features
        self.cache = None
        # the lower proposal's nodes the intermediate level accepted
        self.lower_path: list[int] = []
        self.checked = self.passed = 0  # lower-level nodes this level verified, and accepted

    def nodes(self, gamma: int) -> int:
        return gamma  # the chain is cut at gamma tokens (a prefix of a draft is a draft)

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None) -> None:
        self.lower.start(prompt, capacity, features)
        # room for the lower level's largest proposal
        self.cache = self.net.new_cache(capacity + ROW_BY_ROW_MAX)
        if prompt.shape[0] > 1:  # like the target's: every token but the last
            self.net(prompt[:-1], self.cache)

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        low = self.lower.propose(seq, gamma, sampling, generator)
        if self.cache.length < len(seq) - 1:  # tokens the target accepted past our last chain
            self.net(torch.tensor(seq[self.cache.length:-1]), self.cache)
        start = self.cache.length
        ids = torch.cat([torch.tensor(seq[-1:]), low.tokens])
        tree = {} if is_chain(low.parents) else verify_layout(low.parents, start)
        logits = self._align(self.net(ids, self.cache, **tree))
        if sampling.greedy:
            path, token = accept_greedy(low.tokens, low.parents, logits)
            probs = None
        else:
            q = probabilities(logits, sampling)
            path, token = accept_sampling(low.tokens, low.parents, low.probs, q, generator)
            probs = q[[0] + [node + 1 for node in path]]  # the row each chain token was drawn from
        self.cache.keep(start, torch.tensor([0] + [node + 1 for node in path]))
        self.lower_path = path
        self.checked += len(low.tokens)
        self.passed += len(path)
        chain = torch.cat([low.tokens[path], torch.tensor([token])])[:gamma]
        return Proposal.chain(chain, None if probs is None else probs[:gamma])

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """The target accepted `path` of our chain: the lower drafter's accepted nodes are the
        first len(path) of those the intermediate level accepted."""
        self.cache.crop(min(self.cache.length, length))
        self.lower.rollback(length, features, self.lower_path[:len(path)])

    def _align(self, logits: Tensor) -> Tensor:
        """Intermediate logits on the target's vocabulary (drop extra rows,
        pad missing with -inf)."""
        v = logits.shape[-1]
        if v >= self.vocab:
            return logits[..., :self.vocab]
        return torch.nn.functional.pad(logits, (0, self.vocab - v), value=float("-inf"))
