"""Dynamic draft trees (EAGLE-2, Li et al. 2024): grow by the draft's own confidence, keep the best.

A chain spends the whole verify pass on one guess per position; where the draft's first choice
is wrong its second is often right. `grow` builds a tree depth by depth: the `topk` nodes of the
newest depth with the highest cumulative draft log-probability (the draft's estimate that the
whole path is accepted) are fed to the draft, each proposes its `topk` best children, and so on.
Finally the `size` nodes with the highest cumulative log-probability among all those proposed are
kept. A child never scores above its parent, so the kept nodes always form a tree.

Nodes are chosen, not sampled, so a proposal carries no draft distributions: sampling verifies
each candidate as a point mass (`acceptance.accept_sampling`), which keeps the output exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..core.types import Proposal


@dataclass(frozen=True)
class TreeShape:
    """`size` draft nodes at most, `depth` levels at most (the proposal length cap), `topk`
    children per expanded node and expanded nodes per level."""

    size: int
    depth: int
    topk: int

    def __post_init__(self):
        for name in ("size", "depth", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"tree {name} must be at least 1, got {getattr(self, name)}")


# The best tree measured on the 2-core CPU this project runs on (docs/trees.md at 4a89039): small,
# because a verify pass there costs more with every row. Chains measured faster still and stay the
# default; `--tree N` sets the size.
DEFAULT_TREE = TreeShape(size=4, depth=3, topk=2)

# Expand: (tokens [k] of the nodes to feed, their parents' fed rows [k] (-1: the root), depths [k],
# mask [k, fed + k] over the rows fed so far and these) -> the draft's log-probabilities [k, V]
# for each node's children. The drafter keeps the fed rows (its tree cache) until rollback.
Expand = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def grow(root_logprobs: Tensor, expand: Expand, shape: TreeShape,
         depth: int | None = None) -> Proposal:
    """The dynamic tree under the root whose children's log-probabilities are `root_logprobs` [V];
    `depth` caps shape.depth (gamma auto)."""
    depth = min(shape.depth, depth or shape.depth)
    top = root_logprobs.topk(min(shape.topk, root_logprobs.shape[-1]))
    tokens, parents, scores, depths = (top.indices.tolist(), [-1] * len(top.indices),
                                       top.values.tolist(), [1] * len(top.indices))
    fed_row: dict[int, int] = {}  # node -> its row among the fed ones
    fed_nodes: list[int] = []
    newest = list(range(len(tokens)))
    for level in range(2, depth + 1):
        frontier = sorted(newest, key=lambda i: -scores[i])[:shape.topk]
        for node in frontier:
            fed_row[node] = len(fed_nodes)
            fed_nodes.append(node)
        mask = torch.zeros(len(frontier), len(fed_nodes), dtype=torch.bool)
        for r, node in enumerate(frontier):
            ancestor = node
            while ancestor != -1:
                mask[r, fed_row[ancestor]] = True
                ancestor = parents[ancestor]
        logprobs = expand(torch.tensor([tokens[i] for i in frontier]),
                          torch.tensor([fed_row.get(parents[i], -1) for i in frontier]),
                          torch.tensor([depths[i] for i in frontier]), mask)
        best = logprobs.topk(min(shape.topk, logprobs.shape[-1]), dim=-1)
        newest = []
        for r, node in enumerate(frontier):
            for token, logprob in zip(best.indices[r].tolist(), best.values[r].tolist()):
                newest.append(len(tokens))
                tokens.append(token)
                parents.append(node)
                scores.append(scores[node] + logprob)
                depths.append(level)
    return _best_subtree(tokens, parents, scores, depths, shape.size)


def _best_subtree(tokens: list[int], parents: list[int], scores: list[float], depths: list[int],
                  size: int) -> Proposal:
    """The `size` best nodes, in topological order (by depth, siblings best first), renumbered."""
    # a child never outscores its parent; on a tie the shallower node (the parent) comes first
    keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i]))[:size]
    order = sorted(keep, key=lambda i: (depths[i], -scores[i]))
    index = {node: i for i, node in enumerate(order)}
    return Proposal(torch.tensor([tokens[i] for i in order], dtype=torch.long),
                    torch.tensor([index[parents[i]] if parents[i] != -1 else -1 for i in order],
                                 dtype=torch.long),
                    None)
