"""Acceptance of a draft tree: which drafted tokens the target keeps, and the token it adds.

A proposal is a tree of N nodes in topological order: `tokens` [N] and `parents` [N], each node's
parent index or -1 under the root (the last committed token, not a node); siblings in the order
they are tried. A chain is parents [-1, 0, ..., g-2]. The target's verify pass gives N + 1 rows:
row 0 is the root's, row i + 1 is node i's, so a node's parent row is `parents[i] + 1`.

Sampling is multi-candidate rejection sampling (SpecInfer, Miao et al. 2024). At a row whose
target distribution is r, child x drawn from q_x is kept with probability min(1, r(x)/q_x(x)); on
rejection r becomes normalize(max(0, r - q_x)) and the next sibling is tried; when no child is
kept the next token is drawn from r. Each try is the chain kernel's exact step with r as its
target, so by induction over the siblings what leaves the row follows p[row], and by induction
over the depth the emitted tokens follow the target alone. This needs each child, given the tries
before it, to be distributed as its own q row: true for siblings drawn i.i.d. from one q and kept
in the order drawn (repeats included), and for deterministic children (q None: point masses).
Siblings sorted by probability after drawing, or deduplicated, are not.
Greedy is the limit: follow the child whose token is the target's argmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .sampling import residual, sample


def chain_parents(g: int) -> Tensor:
    """parents [g] of a chain of g nodes: each node's parent is the one before it."""
    return torch.arange(-1, g - 1)


def is_chain(parents: Tensor) -> bool:
    """Whether parents [N] is a chain, so a prefix crop is enough to roll the cache back."""
    return parents.tolist() == list(range(-1, len(parents) - 1))


def depths(parents: Tensor) -> Tensor:
    """Depth [N] of each node (children of the root are at 1): position offsets of the verify rows
    from the root's position."""
    out: list[int] = []
    for parent in _checked(parents):
        out.append(1 if parent < 0 else out[parent] + 1)
    return torch.tensor(out, dtype=torch.long)


def tree_mask(parents: Tensor) -> Tensor:
    """Attention mask [N+1, N+1] among the verify rows (row 0 = root, row i+1 = node i): row a
    sees row b iff b is a or one of its ancestors, so each node attends to its own prefix only."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[0, 0] = True
    for node, parent in enumerate(_checked(parents)):
        mask[node + 1] = mask[parent + 1]
        mask[node + 1, node + 1] = True
    return mask


def verify_layout(parents: Tensor, root_position: int) -> dict[str, Tensor]:
    """The target forward's `positions` and `mask` for the root (at `root_position`) and a tree's
    nodes: each node sits at the root's position plus its depth and sees its ancestors."""
    return {"positions": root_position
            + torch.cat([torch.zeros(1, dtype=torch.long), depths(parents)]),
            "mask": tree_mask(parents)}


def accept_greedy(tokens: Tensor, parents: Tensor, logits: Tensor) -> tuple[list[int], int]:
    """tokens [N], parents [N], target logits [N+1, V] -> (accepted nodes from the root down,
    next token). From the root, follow the child whose token is the target's argmax at the
    current row; the argmax at the last accepted row is the next token."""
    best = logits.argmax(dim=-1).tolist()
    children = _children(parents)
    drafted = tokens.tolist()
    path: list[int] = []
    row = 0
    while True:
        match = next((child for child in children[row] if drafted[child] == best[row]), None)
        if match is None:
            return path, best[row]
        path.append(match)
        row = match + 1


def accept_sampling(tokens: Tensor, parents: Tensor, q: Tensor | None, p: Tensor,
                    generator: torch.Generator) -> tuple[list[int], int]:
    """tokens [N], parents [N], draft distributions q [N, V] (row i: what node i was drawn from;
    None for deterministic nodes), processed target distributions p [N+1, V] -> (accepted nodes
    from the root down, next token), with the emitted tokens following p exactly.

    One uniform per node is drawn up front, so a chain consumes the generator as
    the chain kernel before trees did (kept as a reference in tests/test_acceptance.py) and, given
    the same state, returns the same result.
    A token the target gives probability 0 is never accepted, even where q_x(x) = 0 too (the
    chain kernel accepts it there; the contract makes that event impossible: x was drawn from q_x).
    `residual` keeps r when max(0, r - q_x) is all zero: that happens only if r == q_x, where a
    drawn x is accepted with probability 1, so a rejection before it has probability 0 and what
    follows cannot change the output distribution. A deterministic sibling repeating a rejected
    token is never kept: the rejection took that token's mass out of r."""
    children = _children(parents)
    drafted = tokens.tolist()
    u = torch.rand(len(drafted), generator=generator).tolist()
    path: list[int] = []
    row, r = 0, p[0]
    while True:
        for child in children[row]:
            x = drafted[child]
            q_child = q[child] if q is not None else _point_mass(x, r)
            # u < min(1, r(x)/q_x(x)) as u < 1; the ratio is inf when only q_x(x) is 0 (kept) and
            # nan when both are (never kept: nan compares false)
            if u[child] < float(r[x] / q_child[x]):
                path.append(child)
                row, r = child + 1, p[child + 1]
                break
            r = residual(r, q_child)
        else:
            return path, int(sample(r, generator))


def _point_mass(token: int, like: Tensor) -> Tensor:
    """What a deterministically chosen node was "drawn" from."""
    mass = torch.zeros_like(like)
    mass[token] = 1.0
    return mass


def _checked(parents: Tensor) -> list[int]:
    """parents as a list, after checking the topological order everything here relies on."""
    out = parents.tolist()
    for node, parent in enumerate(out):
        if not -1 <= parent < node:
            raise ValueError(f"node {node} has parent {parent}; it must be -1 or an earlier node")
    return out


def _children(parents: Tensor) -> list[list[int]]:
    """Children of each verify row (0 = root, i + 1 = node i), in the order they are tried."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(_checked(parents)):
        children[parent + 1].append(node)
    return children
