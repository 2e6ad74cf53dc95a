"""The classic sequence draft: a small model proposes gamma tokens one after another."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.sampling import SamplingConfig
from ..core.types import Model, Proposal
from ..weights.narrow_head import NarrowHead
from .base import choose
from .tree import TreeShape, grow

# The early stop used unless the caller picks one. transformers (assistant_confidence_threshold)
# and llama.cpp (--draft-p-min) stop early by default too: with a draft that is often wrong, every
# low-confidence token drafted costs a draft step and a verify row and is rarely accepted (measured
# in docs/benchmarks.md at 4a89039, section 2). 0 turns it off: every proposal is then exactly
# gamma tokens.
DEFAULT_DRAFT_CONFIDENCE = 0.4


class SequenceDrafter:
    """`min_confidence` > 0 ends a proposal early once the draft's probability for the token it
    just drafted falls below it (as transformers' assistant_confidence_threshold): a weak draft
    then wastes fewer draft steps and verify rows. Output is unaffected: only the count changes.
    `window`: the draft reads only the prompt's last `window` tokens (its prefill costs that many,
    not the whole prompt; its positions start there), then everything it drafts from."""

    needs_target_features = False

    def __init__(self, draft: Model, target_vocab_size: int, min_confidence: float = 0.0,
                 tree: TreeShape | None = None, window: int | None = None):
        self.net = draft.runner
        self.vocab = target_vocab_size
        self.min_confidence = min_confidence
        self.tree = tree
        self.cache = None
        self.tree_start: int | None = None  # where the last tree's rows begin in the cache
        self.base = 0  # len(seq) at the last proposal
        self.window = window
        self.skipped = 0  # prompt tokens before the window: seq[i] sits at cache row i - skipped
        # A narrowed head's kept rows, where a greedy chain may choose among them alone: the -inf
        # rest of a whole-vocabulary row changes no argmax, yet filling and reading it costs a step
        # of a small draft a measurable share (docs/drafts.md at 4a89039).
        head = getattr(draft.net, "output", None)
        self.kept = (head if isinstance(head, NarrowHead)
                     and int(head.keep.max()) < target_vocab_size else None)

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None = None) -> None:
        self.skipped = max(0, prompt.shape[0] - 1 - self.window) if self.window else 0
        # a rollback before any proposal (another drafter's step) keeps the prefill
        self.base = prompt.shape[0]
        tree_rows = self.tree.topk * self.tree.depth if self.tree else 0
        self.cache = self.net.new_cache(capacity - self.skipped + tree_rows)
        # the last prompt token is fed with the first proposal
        if prompt.shape[0] - self.skipped > 1:
            self.net(prompt[self.skipped:-1], self.cache)

    def nodes(self, gamma: int) -> int:
        return self.tree.size if self.tree else gamma

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
        pending = torch.tensor(seq[self.skipped + self.cache.length:], dtype=torch.long)
        self.base = len(seq)  # the proposal's first token goes to position base
        if self.tree:
            return self._tree(pending, gamma)
        tokens, dists = [], []
        kept = self.kept if sampling.greedy else None
        for _ in range(gamma):
            if kept is not None:
                # [1, kept tokens]
                logits = self.net(pending, self.cache, last_only=True, head=kept.rows)
                index, q, confident = choose(logits, sampling, generator, self.min_confidence)
                token = kept.keep[index]
            else:
                logits = self._align(self.net(pending, self.cache, last_only=True))
                token, q, confident = choose(logits, sampling, generator, self.min_confidence)
            if q is not None:
                dists.append(q)
            tokens.append(token)
            pending = token
            if not confident:
                break
        return Proposal.chain(torch.cat(tokens), torch.cat(dists) if dists else None)

    def _tree(self, pending: Tensor, depth: int) -> Proposal:
        root = self._align(self.net(pending, self.cache, last_only=True))[0].log_softmax(-1)
        self.tree_start = start = self.cache.length  # the root sits at position start - 1

        def expand(tokens: Tensor, parent_rows: Tensor, depths: Tensor, mask: Tensor) -> Tensor:
            logits = self.net(tokens, self.cache, positions=start - 1 + depths, mask=mask)
            return self._align(logits).log_softmax(-1)

        return grow(root, expand, self.tree, depth)

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """A chain's rows are in sequence order and the rows of its accepted tokens (`path`) stay;
        a tree's rows are dropped (the accepted path is fed again with the next proposal)."""
        keep = self.base + len(path) - self.skipped if self.tree_start is None else self.tree_start
        self.cache.crop(min(self.cache.length, keep, length - self.skipped))
        self.tree_start = None
