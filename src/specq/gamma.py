"""gamma "auto": choose each step's draft length from what this run has measured.

A fixed gamma pays only where the draft agrees with the target often enough for its cost. That
depends on the pair, the target's precision (a packed int4 target steps faster, so the same draft
costs relatively more), the text and the machine. `CostAwareGamma` picks, before every step, the
length g in 0..max_gamma with the most expected tokens per second:

    E(g) / (base + per_token * g),   E(g) = 1 + sum_{i<=g} prod_{j<=i} a_j

- a_j: this run's conditional acceptance at draft position j, with a prior of 1/2 so an unseen
  position is neither trusted nor written off.
- base, per_token: a least-squares line through (tokens drafted, step seconds) of the steps so
  far, recent steps weighted most (the machine's load drifts). per_token holds a draft forward
  and one more verify row; one line over all steps is far steadier than per-length averages.
- g = 0 is plain decoding. The line needs steps of two lengths, so the run starts with a plain
  step and a full proposal, and when the last PROBE_EVERY steps all drafted the same number of
  tokens the next one drafts another (one token while plain decoding wins: a stretch the draft
  predicts well, code or a repeated phrase, is noticed).

Any choice of g is lossless: the verify pass decides what is emitted, g only how much is proposed.
"""

from __future__ import annotations

from collections import deque

from .errors import SpecqError
from .stats import DecodeStats

AUTO = "auto"
AUTO_MAX_GAMMA = 4  # the longest proposal "auto" considers
MAX_GAMMA = 64  # the longest fixed proposal
PROBE_EVERY = 8
DECAY = 0.95  # weight of a step's timing per newer step: about the last 20 steps count


def parse(gamma: int | str) -> tuple[int, bool]:
    """(the longest proposal, whether each step's length is chosen) for gamma N or "auto"."""
    if gamma == AUTO:
        return AUTO_MAX_GAMMA, True
    if isinstance(gamma, str) and gamma.isdigit():
        return int(gamma), False
    if isinstance(gamma, int) and not isinstance(gamma, bool):
        return gamma, False
    raise SpecqError(f"gamma must be a whole number or '{AUTO}', got {gamma!r}")


def sort_key(gamma: int | str | None) -> tuple[bool, int]:
    """Orders table rows: no gamma (plain), then 1, 2, ..., then "auto"."""
    return gamma == AUTO, gamma if isinstance(gamma, int) else 0


class CostAwareGamma:
    def __init__(self, max_gamma: int = AUTO_MAX_GAMMA):
        self.max_gamma = max_gamma
        self.lengths: set[int] = set()  # draft lengths timed so far
        self.recent: deque[int] = deque(maxlen=PROBE_EVERY)
        # recency-weighted sums over steps of 1, k, s, k*k, k*s (k tokens drafted, s seconds)
        self.w = self.wk = self.ws = self.wkk = self.wks = 0.0

    def next(self, stats: DecodeStats) -> int:
        """The draft length for the next step."""
        line = self.cost_line()
        if line is None:  # plain first, then a full proposal: two points for the line
            return 0 if not self.lengths else self.max_gamma
        base, per_token = line
        g = max(range(self.max_gamma + 1), key=lambda g: self.expected_tokens(stats, g) / (base + per_token * g))
        if len(self.recent) == PROBE_EVERY and len(set(self.recent)) == 1:  # one length lately: inform the line
            return 1 if g == 0 else 0
        return g

    def observe(self, drafted: int, seconds: float) -> None:
        """Record one step: how many tokens it drafted and what drafting plus verifying took."""
        self.lengths.add(drafted)
        self.recent.append(drafted)
        k, s, d = drafted, seconds, DECAY
        self.w, self.wk, self.ws = d * self.w + 1, d * self.wk + k, d * self.ws + s
        self.wkk, self.wks = d * self.wkk + k * k, d * self.wks + k * s

    def cost_line(self) -> tuple[float, float] | None:
        """(base, per_token) seconds by weighted least squares, or None until two different
        lengths have been timed."""
        if len(self.lengths) < 2:
            return None
        mean_k, mean_s = self.wk / self.w, self.ws / self.w
        var, cov = self.wkk - self.wk * mean_k, self.wks - self.wk * mean_s
        per_token = max(0.0, cov / var) if var > 1e-12 else 0.0
        return max(mean_s - per_token * mean_k, 1e-9), per_token

    def expected_tokens(self, stats: DecodeStats, g: int) -> float:
        expected, reach = 1.0, 1.0
        for j in range(g):
            reach *= (stats.accepted_at[j] + 1) / (stats.reached_at[j] + 2)
            expected += reach
        return expected
