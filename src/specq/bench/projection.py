"""Projected decoding speed of speculation from measured parts: a target's verify pass cost by row
count, a draft's cost per token, and what a run measured of acceptance. Pure arithmetic, so a
speed can be projected onto a target that was never run with the draft (a file of a 7-8B model's
shapes) and checked first on a pair that was (`tools/projection.py`).

Every cost is in one-row steps of the target (its plain decoding step = 1.0), every speed in
tokens per one-row step: plain decoding runs at 1 / (1 + its loop overhead), so a speed over that
is a speedup over plain decoding.

- A chain draft at cap g (`Chain`): per position i = 1..G, the share of steps that drafted at
  least i tokens and the share that had at least i accepted. A step emits 1 + sum of the second up
  to g; it costs a verify pass of 1 + (tokens drafted) rows, the draft's cost per drafted token and
  the loop's overhead. A draft that stops early (its confidence) drafts fewer rows than g.
- A run of several routes (`ngram+MODEL`: a free lookup where the text repeats, the model
  elsewhere, plain steps where neither pays): each route covers the share of the text it covered
  when measured, at its own speed (`mix`).
- A measured run re-priced (`replay`): its verify passes by row count at another target's costs,
  and its measured drafting and overhead.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PassCosts:
    """A target's verify pass cost by row count, in one-row steps, from the counts measured: linear
    between them, along the last two counts' line beyond the largest, and never below what fewer
    rows cost (a pass of more rows does all the work of one of fewer; a cheaper figure is noise)."""

    measured: Mapping[int, float]  # rows -> cost in one-row steps (rows 1 -> 1.0)

    def __post_init__(self):
        if self.measured.get(1) != 1.0 or len(self.measured) < 2:
            raise ValueError("pass costs need the one-row step (1.0) and at least one more count")
        if any(n < 1 or c <= 0 for n, c in self.measured.items()):
            raise ValueError(f"pass costs must be positive at positive row counts: {self.measured}")

    @property
    def table(self) -> dict[int, float]:
        """The measured counts, each at least the cost of every smaller count."""
        out, highest = {}, 0.0
        for n in sorted(self.measured):
            highest = out[n] = max(highest, self.measured[n])
        return out

    def __call__(self, rows: float) -> float:
        table = self.table
        counts = sorted(table)
        if rows <= 1:
            return 1.0
        i = min(bisect.bisect_left(counts, rows), len(counts) - 1)  # beyond: the last segment
        lo, hi = counts[i - 1], counts[i]
        return table[lo] + (rows - lo) / (hi - lo) * (table[hi] - table[lo])


@dataclass(frozen=True)
class Chain:
    """Per step, at positions 1..G: the share of steps that drafted at least i tokens, and the share
    that had at least i accepted."""

    drafted: tuple[float, ...]
    accepted: tuple[float, ...]

    def __post_init__(self):
        if len(self.drafted) != len(self.accepted):
            raise ValueError("a chain needs as many drafted as accepted shares")
        pairs = list(zip(self.drafted, self.accepted))
        if any(not 0 <= a <= d <= 1 for d, a in pairs):
            raise ValueError(f"shares must satisfy 0 <= accepted <= drafted <= 1: {pairs}")
        for name, shares in (("drafted", self.drafted), ("accepted", self.accepted)):
            if any(b > a for a, b in zip(shares, shares[1:])):
                raise ValueError(f"{name} shares must not grow with the position: {shares}")

    @classmethod
    def from_counts(cls, drafted_at: Sequence[int], accepted_at: Sequence[int],
                    steps: int) -> Chain:
        """From a fixed-gamma run of one drafter: steps that drafted position i, steps that had it
        accepted, and all its steps (a step whose draft stopped before position 1 included)."""
        return cls(tuple(d / steps for d in drafted_at), tuple(a / steps for a in accepted_at))

    @classmethod
    def from_rates(cls, conditional: Sequence[float]) -> Chain:
        """From acceptance at each position given the ones before were accepted, for a draft that
        drafts every position up to its cap (no early stop)."""
        accepted, share = [], 1.0
        for a in conditional:
            share *= a
            accepted.append(share)
        return cls((1.0,) * len(accepted), tuple(accepted))

    @property
    def longest(self) -> int:
        return len(self.drafted)

    def tokens(self, gamma: int) -> float:
        """Tokens a step at cap `gamma` emits: the accepted ones and the target's own."""
        return 1.0 + sum(self.accepted[:self._cap(gamma)])

    def drafted_tokens(self, gamma: int) -> float:
        return sum(self.drafted[:self._cap(gamma)])

    def rows(self, gamma: int) -> dict[int, float]:
        """The verify pass's row count -> its share of the steps at cap `gamma`."""
        gamma = self._cap(gamma)
        at_least = [1.0, *self.drafted[:gamma], 0.0]  # drafted at least k, k = 0..gamma+1
        return {1 + k: at_least[k] - at_least[k + 1] for k in range(gamma + 1)
                if at_least[k] > at_least[k + 1]}

    def _cap(self, gamma: int) -> int:
        if not 0 <= gamma <= self.longest:
            raise ValueError(f"gamma {gamma} is outside the measured positions 0..{self.longest}")
        return gamma


def chain_cost(chain: Chain, gamma: int, costs: PassCosts, draft: float,
               overhead: float = 0.0) -> float:
    """One step's cost at cap `gamma`, in one-row steps: its verify pass, `draft` per drafted token
    and the loop's `overhead`."""
    verify = sum(share * costs(rows) for rows, share in chain.rows(gamma).items())
    return verify + draft * chain.drafted_tokens(gamma) + overhead


def chain_speed(chain: Chain, gamma: int, costs: PassCosts, draft: float,
                overhead: float = 0.0) -> float:
    """Tokens per one-row step of a chain at cap `gamma` (0: plain decoding)."""
    return chain.tokens(gamma) / chain_cost(chain, gamma, costs, draft, overhead)


def best_gamma(chain: Chain, costs: PassCosts, draft: float, overhead: float = 0.0) -> int:
    """The cap in 0..the measured positions with the most tokens per step (the shortest of
    equals)."""
    speeds = [chain_speed(chain, g, costs, draft, overhead) for g in range(chain.longest + 1)]
    return speeds.index(max(speeds))


def route_speed(steps: float, drafted: float, accepted: float, costs: PassCosts,
                draft: float = 0.0, overhead: float = 0.0) -> float:
    """Tokens per one-row step of a route as measured (a lookup's proposals, plain steps): its
    mean tokens per step over its mean step, the pass priced at its mean row count."""
    rows = 1.0 + drafted / steps
    return (1.0 + accepted / steps) / (costs(rows) + draft * drafted / steps + overhead)


def mix(shares: Mapping[str, float], speeds: Mapping[str, float]) -> float:
    """Tokens per one-row step of a run whose routes each cover `shares` of its text at `speeds`:
    the time of each route's text, added up."""
    total = sum(shares.values())
    if total <= 0:
        raise ValueError("no route covers any text")
    return total / sum(share / speeds[route] for route, share in shares.items() if share)


def replay(passes: Mapping[int, float], tokens: float, costs: PassCosts, extra: float) -> float:
    """Tokens per one-row step of a measured run re-priced: `passes` verify passes by row count at
    `costs`, plus `extra` steps of drafting and overhead, for the `tokens` it emitted."""
    return tokens / (sum(n * costs(rows) for rows, n in passes.items()) + extra)
