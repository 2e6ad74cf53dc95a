"""The feature drafter: a `FeatureDraft` proposes from the target's own hidden states.

Row r of the draft's cache holds (token x_{r+1}, target feature f_r). The target's cache holds
every token but the last, so before a proposal the target has produced f_0 .. f_{L-2} for a
sequence of length L, and rows up to L-2 can be fed with true features; row L-2 yields the first
draft token. Later rows use the draft's own predicted features and are dropped at rollback, when
the verify pass has delivered the true ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.sampling import SamplingConfig
from ..core.types import Proposal
from ..model.feature_draft import FeatureDraft
from .base import choose
from .tree import TreeShape, grow


class FeatureDrafter:
    needs_target_features = True  # the loop passes the target's hidden states to start / rollback

    def __init__(self, draft: FeatureDraft, min_confidence: float = 0.0,
                 tree: TreeShape | None = None):
        self.net = draft
        self.min_confidence = min_confidence
        self.tree = tree
        self.cache = None
        self.features: Tensor | None = None  # [capacity, hidden]: the target's f_0, f_1, ... so far
        self.true_rows = 0  # draft cache rows computed from true features

    def nodes(self, gamma: int) -> int:
        return self.tree.size if self.tree else gamma

    def start(self, prompt: Tensor, capacity: int, features: Tensor) -> None:
        self.cache = self.net.new_cache(capacity
                                        + (self.tree.topk * self.tree.depth if self.tree else 0))
        self.features = features.new_zeros(capacity, features.shape[-1])
        self.features[:len(features)] = features
        if prompt.shape[0] > 1:  # rows 0 .. P-2; row P-1 needs the first generated token
            self.net(prompt[1:], self.features[:prompt.shape[0] - 1], self.cache)
        self.true_rows = self.cache.length

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        last_row = len(seq) - 2  # (f_{L-2}, x_{L-1}) predicts x_L
        rows = torch.arange(self.cache.length, last_row + 1)
        ids = torch.tensor(seq, dtype=torch.long)[rows + 1]
        features = self.features[rows]
        if self.tree:
            return self._tree(ids, features, gamma)
        tokens, dists = [], []
        for step in range(gamma):
            logits, hidden = self.net(ids, features, self.cache)
            if step == 0:
                self.true_rows = self.cache.length
            last = logits[-1:]  # over the head's subset; outside it the draft's probability is 0
            # greedy picks within the subset (then maps the id); sampling needs q over
            # the whole vocabulary
            token, q, confident = choose(last if sampling.greedy else self.net.full_vocab(last),
                                         sampling, generator, self.min_confidence)
            if q is None:
                token = self.net.vocab_ids[token]
            else:
                dists.append(q)
            tokens.append(token)
            ids, features = token, hidden[-1:]
            if not confident:
                break
        return Proposal.chain(torch.cat(tokens), torch.cat(dists) if dists else None)

    def _tree(self, ids: Tensor, features: Tensor, depth: int) -> Proposal:
        """The tree is grown over the head's subset ids, then mapped to the target's."""
        logits, hidden = self.net(ids, features, self.cache)
        self.true_rows = self.cache.length
        root_row = self.true_rows - 1  # a node at depth d has the row position root_row + d
        fed_hidden = [hidden[-1:]]  # index 0: the root's predicted feature, then each fed node's

        def expand(tokens: Tensor, parent_rows: Tensor, depths: Tensor, mask: Tensor) -> Tensor:
            parent_features = torch.cat([fed_hidden[int(r) + 1] for r in parent_rows])
            logits, hidden = self.net(self.net.vocab_ids[tokens], parent_features, self.cache,
                                      positions=root_row + depths, mask=mask)
            fed_hidden.extend(hidden.split(1))
            return logits.log_softmax(-1)

        proposal = grow(logits[-1].log_softmax(-1), expand, self.tree, depth)
        return proposal._replace(tokens=self.net.vocab_ids[proposal.tokens])

    def rollback(self, length: int, features: Tensor, path: list[int]) -> None:
        """seq[:length + 1] is settled; `features` are the target's for the root and accepted
        nodes, ending at position length - 1 (the target's cache holds all but the last token). A
        cache row r (x_{r+1}, f_r) stays only if both are settled and f_r was true; a tree's rows
        never stay."""
        self.cache.crop(min(self.true_rows, length, self.cache.length))
        self.features[length - len(features):length] = features
