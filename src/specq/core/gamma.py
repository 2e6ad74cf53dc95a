"""gamma "auto": choose each step's draft length from what this run has measured.

A fixed gamma pays only where the draft agrees with the target often enough for its cost. That
depends on the pair, the target's precision (a packed int4 target steps faster, so the same draft
costs relatively more), the text and the machine. `CostAwareGamma` picks, before every step, the
cap g in 0..max_gamma on the proposal length with the most expected tokens per second:

    tokens(g) / (draft_s * drafted(g) + verify_s(1 + drafted(g)))

- tokens(g) = 1 + sum_{j<g} R_j, with R_j the share of steps allowed past position j whose
  proposal had more than j tokens accepted; drafted(g) = sum_{j<g} D_j, with D_j the share that
  drafted more than j tokens. Both count what happened under a cap, so a drafter that stops early
  on low confidence (`--draft-confidence`) is priced at what it really drafts, and the tie
  between its confidence and acceptance is in the data. A position not yet seen is estimated as
  half the one before (neither trusted nor written off).
- draft_s: seconds per draft forward, not timed on a proposal right after a plain step: that one
  first feeds the drafter the tokens it missed (a longer forward after a plain stretch), and
  counting it would price drafting out for good; verify_s(n): seconds of an n-row verify pass, per
  row count, interpolated between the counts seen. Verify cost is not a line in n on the fast path
  (one extra row costs most of what four do), so each count is timed on its own. Timings are
  recency-weighted (the machine's load drifts) and robust to a stall (a shared VM's hiccup times
  one pass at several times its cost): a new timing counts at most OUTLIER times the estimate, and
  a row count is never priced above a larger one timed cheaper. Else one stall prices its row
  count out, and a count not chosen is not timed again.
- g = 0 is plain decoding. The run starts with a full proposal (the drafter is in step with the
  sequence right after prefill); plain decoding is weighed only once MIN_EVIDENCE steps have
  drafted (one unlucky first proposal would otherwise price the draft out for many steps, each
  later probe being a single draw), and first timed with a plain step. When the last
  `interval` steps all had the same cap, the next one tries one token more (one token
  while plain decoding wins: a stretch the draft predicts well, code or a repeated phrase, is
  noticed). A probe is not free (after plain steps the drafter first catches up on the tokens it
  missed), so each probe that leaves the choice where it was doubles the interval, from
  PROBE_EVERY up to MAX_PROBE_EVERY steps, and a changed choice resets it.

A drafter of several routes (`ngram+MODEL`: a free lookup where the text repeats, a model
elsewhere; a lookup's copies and short matches; `types.Routed`) gets one chooser per route: a
lookup's cost and acceptance say nothing about the model's, and one mean of both would price the
lookup too high and the model too low. Their verify costs are one table (`decode.Sequence`): a
pass costs what its rows cost, whichever route drafted them. Each step proposes on the route with
the most expected tokens per second (`rate`); a plain step is taken only where no route beats it.

`GammaMemory` carries a chooser from one run to the next of the same target and draft in a
process (a server's requests, a bench's prompts; whoever runs them keeps one memory per target and
passes it to each run): costs in full and acceptance at a quarter of its
weight, so a run starts from them instead of from a warm-up and its own text soon outweighs the
last one's. A run after one that had evidence enough to weigh plain decoding weighs it from its
first step (a draft that does not pay on this machine costs each run its MIN_EVIDENCE drafting
steps otherwise: on short requests that alone made the default slower than plain decoding), and
probes from PROBE_EVERY steps on, so a text that suits the draft is still found.

Any choice of g is lossless: the verify pass decides what is emitted, g only how much is proposed.
"""

from __future__ import annotations

import bisect
import copy
from collections import deque

from ..errors import SpecqError

AUTO = "auto"
AUTO_MAX_GAMMA = 4  # the longest proposal "auto" considers
LONGEST_DEFAULT = AUTO_MAX_GAMMA  # the longest proposal the default plans for
MAX_GAMMA = 64  # the longest fixed proposal
PROBE_EVERY = 8  # steps with one cap before trying one token more ...
MAX_PROBE_EVERY = 64  # ... doubled after each probe that changed nothing, up to this
RECENT = 0.2  # weight of the newest timing in a recency-weighted mean (about the last 10 count)
# a new timing counts at most this times the estimate (a lasting slowdown still
# shows in a few steps)
OUTLIER = 1.5
COUNT_DECAY = 0.97  # weight of a step's outcome per newer step: acceptance drifts with the text
MIN_EVIDENCE = 4  # steps that drafted before plain decoding is weighed against drafting
# the weight of an earlier run's acceptance counts in the next run's chooser
CARRIED_ACCEPTANCE = 0.25
# choosers a GammaMemory keeps, the most recently kept (a server's requests may vary their sampling)
MAX_KEPT = 64


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


def _recent_mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - RECENT) * old + RECENT * min(new, OUTLIER * old)


class CostAwareGamma:
    def __init__(self, max_gamma: int = AUTO_MAX_GAMMA):
        self.max_gamma = max_gamma
        self.recent_caps: deque[int] = deque(maxlen=MAX_PROBE_EVERY)
        self.interval = PROBE_EVERY  # steps with one cap before the next probe
        self.probed_from: int | None = None  # the choice a probe just tried one more than
        # per position j, recency-weighted counts over steps whose cap passed j
        self.allowed = [0.0] * max_gamma
        self.drafted_past = [0.0] * max_gamma  # ... that drafted more than j tokens
        self.accepted_past = [0.0] * max_gamma  # ... that had more than j accepted
        self.draft_s: float | None = None  # one draft forward (a level of a tree)
        self.width: float | None = None  # nodes drafted per level, recency-weighted (a chain: 1)
        self.verify_s: dict[int, float] = {}  # rows -> one verify pass
        self.drafting_steps = 0  # steps that drafted, ever (not decayed)
        self.idle = 0  # steps in a row another route proposed on (`passed`)

    def next(self) -> int:
        """The cap on the next step's proposal length."""
        if self.draft_s is None:
            return self.max_gamma
        weigh_plain = self.drafting_steps >= MIN_EVIDENCE
        if weigh_plain and 1 not in self.verify_s:
            return 0
        best = max(range(0 if weigh_plain else 1, self.max_gamma + 1), key=self.tokens_per_second)
        if self.probed_from is not None:  # the step after a probe: did it change anything?
            self.interval = (min(2 * self.interval, MAX_PROBE_EVERY)
                             if best == self.probed_from else PROBE_EVERY)
            self.probed_from = None
        recent = list(self.recent_caps)[-self.interval:]
        if len(recent) == self.interval and set(recent) == {best} and best < self.max_gamma:
            self.probed_from = best
            return best + 1  # one cap lately: learn what one more token would bring
        return best

    def rate(self, cap: int) -> float:
        """Expected tokens per second of a step at `cap`; infinite while a cost it needs is untimed
        (such a step is the one that times it)."""
        if (cap > 0 and self.draft_s is None) or not self.verify_s:
            return float("inf")
        return self.tokens_per_second(cap)

    def passed(self) -> None:
        """Another route proposed this step. After `interval` such steps in a row this route is
        tried once (`decode.Sequence`), and the next wait is twice as long."""
        self.idle += 1

    def observe(self, cap: int, drafted: int, accepted: int, draft_s: float,
                verify_s: float | None, nodes: int | None = None) -> None:
        """Record one step: its cap, how deep it drafted and how many tokens were accepted, the
        seconds drafting and verifying took (verifying None: timed already, in a `verify_s`
        table this chooser shares), and the nodes it drafted (a tree's, more than its depth; a
        chain's are its depth). Verify rows are priced per node: a tree drafter (EAGLE trees,
        lookahead's window and n-grams) verifies `width` nodes per level, and pricing its rows
        by depth alone would price its passes far too low."""
        nodes = drafted if nodes is None else nodes
        self.recent_caps.append(cap)
        self.drafting_steps += drafted > 0
        if self.idle >= self.interval:  # the try after passing: the next one waits longer
            self.interval = min(2 * self.interval, MAX_PROBE_EVERY)
        self.idle = 0
        for j in range(self.max_gamma):
            self.allowed[j] *= COUNT_DECAY
            self.drafted_past[j] *= COUNT_DECAY
            self.accepted_past[j] *= COUNT_DECAY
        for j in range(min(cap, self.max_gamma)):
            self.allowed[j] += 1
            self.drafted_past[j] += drafted > j
            self.accepted_past[j] += accepted > j
        if (drafted and (self.draft_s is None or len(self.recent_caps) < 2
                         or self.recent_caps[-2] != 0)):
            self.draft_s = _recent_mean(self.draft_s, draft_s / drafted)
        if drafted:
            share = nodes / drafted
            self.width = share if self.width is None else (1 - RECENT) * self.width + RECENT * share
        if verify_s is not None:
            self.verify_s[nodes + 1] = _recent_mean(self.verify_s.get(nodes + 1), verify_s)

    def tokens_per_second(self, g: int) -> float:
        tokens, drafted = self.expected(g)
        return tokens / ((self.draft_s or 0.0) * drafted
                         + self.verify_cost(1 + drafted * (self.width or 1.0)))

    def expected(self, g: int) -> tuple[float, float]:
        """(tokens emitted, tokens drafted) expected of a step with cap g."""
        tokens, drafted, accept, draft = 1.0, 0.0, 1.0, 1.0
        for j in range(g):  # an unseen position: half the one before (one pseudo-step)
            accept = (self.accepted_past[j] + accept / 2) / (self.allowed[j] + 1)
            draft = (self.drafted_past[j] + draft / 2) / (self.allowed[j] + 1)
            tokens, drafted = tokens + accept, drafted + draft
        return tokens, drafted

    def verify_cost(self, rows: float) -> float:
        """Seconds of a verify pass of `rows` rows: linear between the row counts timed, the
        nearest one's beyond them; each count at most what a larger count was timed at."""
        counts = sorted(self.verify_s)
        cost, cheapest = {}, float("inf")
        for n in reversed(counts):
            cheapest = cost[n] = min(cheapest, self.verify_s[n])
        i = bisect.bisect_left(counts, rows)
        if i == 0:
            return cost[counts[0]]
        if i == len(counts):
            return cost[counts[-1]]
        lo, hi = counts[i - 1], counts[i]
        share = (rows - lo) / (hi - lo)
        return (1 - share) * cost[lo] + share * cost[hi]


class GammaMemory:
    """gamma auto's choosers kept from finished runs, per (draft key, route): a run of the same
    target and draft starts from what the last one learned. Each run takes a copy (runs side by
    side in a server learn apart) and gives it back when it ends (the last one kept wins)."""

    def __init__(self):
        self._kept: dict[tuple[str, str], CostAwareGamma] = {}

    def chooser(self, key: str, route: str, max_gamma: int) -> CostAwareGamma:
        """A chooser for a new run: the kept one's costs, its acceptance at CARRIED_ACCEPTANCE of
        its weight (the machine's costs carry over; how well the draft agrees is the text's, and a
        position a run seldom drafts past would keep another text's rate for long), its evidence
        for weighing plain decoding, and probes from PROBE_EVERY again: a new text may suit the
        draft better, and a run that starts plain would otherwise learn that only by probes up to
        MAX_PROBE_EVERY steps apart."""
        kept = self._kept.get((key, route))
        if kept is None or kept.max_gamma != max_gamma:
            return CostAwareGamma(max_gamma)
        chooser = copy.deepcopy(kept)
        for counts in (chooser.allowed, chooser.drafted_past, chooser.accepted_past):
            counts[:] = [CARRIED_ACCEPTANCE * c for c in counts]
        chooser.recent_caps.clear()
        chooser.probed_from = None
        chooser.idle = 0
        chooser.interval = PROBE_EVERY
        return chooser

    def keep(self, key: str, route: str, chooser: CostAwareGamma) -> None:
        self._kept.pop((key, route), None)
        self._kept[(key, route)] = chooser
        while len(self._kept) > MAX_KEPT:
            self._kept.pop(next(iter(self._kept)))
