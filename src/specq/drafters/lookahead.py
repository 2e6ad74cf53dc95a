"""Lookahead decoding (Fu et al. 2024): guesses with no draft model, made by the target itself in
the verify passes it runs anyway.

Each proposal is a token tree under the root (the last token), verified in one target pass:

- a Jacobi window: a chain of `w` guesses for the next positions. At each of its rows the target
  says what follows that guess (`verified`: every row's argmax, past a rejection too), and those
  choices are the next step's guesses (one Jacobi iteration per step, shifted by what was
  accepted, the end padded from the pool). Where the window has converged on the target's own
  text, the chain is accepted as it stands.
- up to `g` candidates that continue the root: the latest continuation of the text's last few
  tokens (prompt lookup, as `ngram.py`; as deep as the tree, since copied text goes on), then the
  pool's latest n-grams that start with the root (n - 1 tokens each).

The pool holds n-grams of `n` tokens, keyed by their first: every n-gram of the prompt and the
text so far, and those the window's trajectory leaves. A slot of the window remembers the guesses
it came from (each the target's choice after the one before it, one iteration earlier), so a
slot's last n - 1 guesses and the target's new choice form an n-gram the target itself wrote, a
position at a time: the n-grams lookahead decoding collects from its 2D window, kept here with one
row per slot. The pool is bounded: `LookaheadDraft.pool` n-grams in all, the latest `g` per
first token.

Candidates sharing a prefix share its rows (a trie), so greedy acceptance follows the longest
match. The nodes are chosen, not sampled: point masses (`Proposal.probs` None), which sampling
verifies exactly (`acceptance.accept_sampling`). `gamma` caps the depth of each step's tree.

Spelled `lookahead[:w=W][:n=N][:g=G]` wherever a draft is named (parsed by `loading/refs.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..checks import integer
from ..core.gamma import MAX_GAMMA
from ..core.sampling import SamplingConfig
from ..core.types import Proposal
from ..errors import SpecqError
from .ngram import DEFAULT_N_MAX, DEFAULT_N_MIN, NgramIndex

NAME = "lookahead"
# Window length, n-gram length and candidates per step. Every node is a verify row, and on a CPU
# each row costs, so the tree stays small: at most 4 (window) + 4 (the text's continuation) + 2 * 2
# = 12 nodes (fewer where candidates share a prefix or the text has no match), 13 rows. Short
# n-grams (two proposed tokens each) leave rows for more of them: the first token of a candidate
# decides most of what it brings.
DEFAULT_W = 4
DEFAULT_N = 3
DEFAULT_G = 3
DEFAULT_POOL = 4096  # n-grams kept in all, the least recently refreshed first token's out first
NO_TREES = ("a lookahead draft proposes its own token trees (its window and n-grams): no tree "
            "shape goes with it")


@dataclass(frozen=True, eq=False)
class LookaheadDraft:
    """A draft of its own kind: a Jacobi window of `w` guesses, and up to `g` n-grams of `n` tokens
    (the root, then n - 1 proposed) from a pool of at most `pool` n-grams."""

    w: int = DEFAULT_W
    n: int = DEFAULT_N
    g: int = DEFAULT_G
    pool: int = DEFAULT_POOL
    fallback: ClassVar[None] = None  # it always proposes: no model drafts in its place

    def __post_init__(self):
        integer("w", self.w, 1, MAX_GAMMA)
        integer("n", self.n, 2, MAX_GAMMA + 1)
        integer("g", self.g, 0, MAX_GAMMA)
        integer("the pool size", self.pool, 1)
        if self.nodes(self.depth) > MAX_GAMMA:
            raise SpecqError(f"w={self.w}, n={self.n}, g={self.g} verify up to "
                             f"{self.nodes(self.depth)} guessed tokens a step; a lookahead draft "
                             f"verifies at most {MAX_GAMMA}")

    @property
    def ref(self) -> str:
        """The canonical spelling (`lookahead:w=4:n=3:g=3`)."""
        return f"{NAME}:w={self.w}:n={self.n}:g={self.g}"

    @property
    def depth(self) -> int:
        """The deepest tree it proposes: its window or an n-gram's n - 1 tokens."""
        return max(self.w, self.n - 1)

    def longest(self, gamma: int) -> int:
        """The run's longest proposal: its own depth (gamma "auto" chooses each step's up to it)."""
        return self.depth

    def nodes(self, gamma: int) -> int:
        """The most nodes of a proposal at most `gamma` deep: the window, the text's continuation
        (as deep as the tree) and g - 1 n-grams."""
        text = min(self.depth, gamma) if self.g else 0
        return min(self.w, gamma) + text + max(self.g - 1, 0) * min(self.n - 1, gamma)


class NgramPool:
    """The latest n-grams by their first token: up to `per_token` continuations of each (most
    recent first) and `size` in all. When full, the first token refreshed longest ago loses its
    oldest n-gram."""

    def __init__(self, size: int, per_token: int):
        self.size, self.per_token = size, per_token
        self.grams: OrderedDict[int, list[tuple[int, ...]]] = OrderedDict()  # oldest key first
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def add(self, gram: tuple[int, ...]) -> None:
        first, rest = gram[0], gram[1:]
        kept = self.grams.pop(first, [])
        if rest in kept:
            kept.remove(rest)
            self.count -= 1
        kept.insert(0, rest)
        self.count += 1
        if len(kept) > self.per_token:
            kept.pop()
            self.count -= 1
        self.grams[first] = kept
        while self.count > self.size:
            oldest = next(iter(self.grams))
            self.grams[oldest].pop()
            self.count -= 1
            if not self.grams[oldest]:
                del self.grams[oldest]

    def after(self, token: int) -> list[tuple[int, ...]]:
        """The continuations kept of `token`, most recent first."""
        return self.grams.get(token, [])


class LookaheadDrafter:
    """Proposes the window and the candidates as one trie; learns the window's next guesses from
    the verify pass (`types.SeesVerify`) and the settled text with the next proposal."""

    needs_target_features = False

    def __init__(self, draft: LookaheadDraft):
        self.draft = draft
        self.start(torch.empty(0, dtype=torch.long), 0)

    def nodes(self, gamma: int) -> int:
        return self.draft.nodes(gamma)

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None = None) -> None:
        self.index = NgramIndex(DEFAULT_N_MIN, DEFAULT_N_MAX)
        self.pool = NgramPool(self.draft.pool, max(self.draft.g, 1))
        # the window: per slot, the guesses it came from (the last n - 1, ending in its guess);
        # slot i guesses position `first + i`
        self.window: list[tuple[int, ...]] = []
        self.first = 0
        self.spine: list[int] = []  # the window's nodes in the proposal being verified
        self._settle(prompt.tolist())

    def _settle(self, seq: list[int]) -> None:
        """Index the tokens of `seq` not seen yet, and pool the n-grams that end at them."""
        seen, n = len(self.index), self.draft.n
        self.index.extend(seq[seen:])
        for end in range(max(seen, n - 1), len(seq)):
            self.pool.add(tuple(seq[end - n + 1:end + 1]))

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        self._settle(seq)
        root, position = seq[-1], len(seq) - 1
        self.window = self.window[max(0, position + 1 - self.first):]  # drop settled positions
        self.first = position + 1
        while len(self.window) < self.draft.w:
            self.window.append((self._guess(self.window[-1][-1] if self.window else root),))
        trie = _Trie()
        for candidate in self._candidates(root, gamma):
            trie.insert(candidate)
        self.spine = trie.insert([slot[-1] for slot in self.window[:gamma]])
        return Proposal(torch.tensor(trie.tokens, dtype=torch.long),
                        torch.tensor(trie.parents, dtype=torch.long), None)

    def _guess(self, before: int) -> int:
        """A new slot's first guess: what the pool last saw after `before`, else `before` again."""
        after = self.pool.after(before)
        return after[0][0] if after else before

    def _candidates(self, root: int, gamma: int) -> list[tuple[int, ...]]:
        """Up to g continuations of `root`, at most `gamma` deep: the text's latest continuation
        of its last tokens (as deep as the tree), then the pool's n-grams, most recent first (none
        a prefix of one before it: it would add no row)."""
        match = tuple(self.index.continuation(min(self.draft.depth, gamma)))
        out = [match] if match else []
        for rest in self.pool.after(root):
            gram = rest[:gamma]
            if not any(kept[:len(gram)] == gram for kept in out):
                out.append(gram)
        return out[:self.draft.g]

    def verified(self, choices: Tensor) -> None:
        """The target's choice after each guess of the window is the guess for the position after
        it: one Jacobi iteration. Each slot's trajectory and that choice make an n-gram."""
        if not self.spine:
            return  # a plain step: nothing of the window was verified
        choices = choices.tolist()
        n, moved = self.draft.n, []
        for slot, node in zip(self.window, self.spine):
            gram = slot + (choices[node + 1],)
            if len(gram) == n:
                self.pool.add(gram)
            moved.append(gram[-(n - 1):])
        self.window = moved + self.window[len(moved) + 1:]  # unverified slots keep their guesses
        self.first += 1
        self.spine = []

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """Nothing to forget: the window moves in `verified`, and the settled tokens are indexed
        with the next proposal."""
        self.spine = []


class _Trie:
    """Token paths from the root merged on their common prefixes: nodes in topological order."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node

    def insert(self, path) -> list[int]:
        """Add a path; its nodes, root's child first."""
        nodes, parent = [], -1
        for token in path:
            node = self.children.get((parent, token))
            if node is None:
                node = self.children[(parent, token)] = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(parent)
            nodes.append(node)
            parent = node
        return nodes
