"""N-gram (prompt lookup) drafts: the continuation of the last few tokens' latest earlier match.

No model runs. Text that repeats what came before (an edited file, a quoted passage, code that
reuses its names, a list that keeps its pattern) is proposed back from the prompt and the text
so far; elsewhere nothing matches and the step is a plain one. The nodes are chosen, not
sampled, so each is a point mass (`Proposal.probs` None): sampling verifies them exactly
(`acceptance.accept_sampling`).

Spelled `ngram[:n=N|n=MIN-MAX][:k=K][:c=C][+MODEL]` wherever a draft is named (parsed by
`loading/refs.py`): match the last N tokens first, then fewer down to MIN, propose up to K;
up to C where the text copies its source (the match agrees over more than N tokens);
`+MODEL`: that model draft proposes on the steps with no match (`fallback.py`). Given a
`SuffixCache` (`suffix.py`), a step with no match in the current text looks in earlier runs' text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import Tensor

from ..checks import integer
from ..core.gamma import MAX_GAMMA
from ..core.sampling import SamplingConfig
from ..core.types import EMPTY, Draft, Model, Proposal
from ..errors import SpecqError
from .suffix import SuffixCache

NAME = "ngram"
LOOKUP, COPY = "lookup", "copy"  # its routes (`types.Routed`): a match, a copy under way
# Shortest n-gram matched. A one-token match fires on most steps, after any token seen before,
# mostly in unrelated contexts: every token it proposes costs a verify row, and in `ngram+MODEL`
# it would leave the model no step to draft. Two tokens already point at text that repeats.
DEFAULT_N_MIN = 2
# Longest n-gram matched, tried first (the most specific context wins); 3 as in the OpenVINO GenAI
# prompt-lookup runs specq is compared with.
DEFAULT_N_MAX = 3
# Tokens proposed per match: drafting is free but each token is a verify row, and a repeat tends
# to break within a few tokens. 4 is inside the 3-5 that peers' prompt-lookup setups propose
# (vLLM's ngram examples, OpenVINO GenAI's 5). With gamma "auto" a lookup is capped at its own k,
# not at the model drafts' AUTO_MAX_GAMMA: a longer k lets auto go further where text is copied.
DEFAULT_K = 4
# Tokens proposed where the text copies its source (its match agrees over more than n_max tokens:
# an edited file returned whole, a passage quoted again, a loop that repeats its output). A copy
# tends to go on, a lookup costs no drafting, and a verify pass costs less per row the more rows
# it has, so a copy proposes far more than a match; gamma "auto" still chooses each step's length
# on its own route. 0: no copy route (every match proposes up to k).
DEFAULT_COPY = 16
# the longest n-gram an index keys (a match this long is a copy: any longer adds nothing)
MAX_N = 64
NO_TREES = ("an n-gram draft proposes chains; token trees need a model draft (ngram+MODEL grows "
            "the model's)")


@dataclass(frozen=True, eq=False)
class NgramDraft:
    """A draft of its own kind: lookup in the prompt and the text so far. Match the last `n_max`
    tokens first, then fewer down to `n_min`; propose up to `k` tokens, or up to `copy` where the
    match agrees with the text's end over more than `n_max` tokens (0: no such route).
    `fallback`: a loaded model draft that proposes on the steps where nothing matches."""

    n_max: int = DEFAULT_N_MAX
    n_min: int = DEFAULT_N_MIN
    k: int = DEFAULT_K
    fallback: Model | Draft | None = None
    copy: int = DEFAULT_COPY

    def __post_init__(self):
        integer("n", self.n_max, 1, MAX_N)
        integer("the smallest n (MIN of n=MIN-MAX, at most MAX)", self.n_min, 1, self.n_max)
        integer("k", self.k, 1, MAX_GAMMA)
        integer("c", self.copy, 0, MAX_GAMMA)
        if self.fallback is not None and not isinstance(self.fallback, (Model, Draft)):
            raise SpecqError(f"an n-gram draft's fallback must be a model from specq.load, got "
                             f"{type(self.fallback).__name__}")

    @property
    def ref(self) -> str:
        """The canonical spelling (`ngram:n=2-3:k=4:c=16`, `+MODEL` with a fallback); `c=0`
        spelled too, or it would read back as the default copy length."""
        own = f"{NAME}:n={self.n_min}-{self.n_max}:k={self.k}:c={self.copy}"
        return own if self.fallback is None else f"{own}+{self.fallback.ref}"

    def longest(self, gamma: int) -> int:
        """The run's longest proposal with this draft as its only level: k or its copy length
        (gamma "auto" chooses up to each per step, whatever the model drafts' cap), or the
        fallback's `gamma` where that is longer."""
        own = max(self.k, self.copy)
        return own if self.fallback is None else max(own, gamma)


def draft_models(draft) -> list:
    """The models of a draft (one level, a list of levels, or None): a model level itself, a
    model-free draft's `fallback` (an n-gram draft's, if any; a lookahead draft has none)."""
    out = []
    for level in draft if isinstance(draft, list) else [] if draft is None else [draft]:
        model = getattr(level, "fallback", level)
        if model is not None:
            out.append(model)
    return out


class NgramIndex:
    """Where each n-gram (n_min <= n <= n_max tokens) of a growing token sequence last occurred
    with a token after it: `latest[gram]` is that token's position. A gram is keyed when the
    token after it arrives, so the sequence's own last tokens never match themselves, and each
    token costs n_max - n_min + 1 dictionary writes however long the sequence grows."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # `token`'s position: it follows every gram ending there
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self.latest[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def match(self) -> int | None:
        """Where the continuation starts of the latest earlier occurrence of the sequence's last
        n tokens, for the largest n that has one; None when no n from n_max to n_min does."""
        for n in range(min(self.n_max, len(self.tokens)), self.n_min - 1, -1):
            start = self.latest.get(tuple(self.tokens[-n:]))
            if start is not None:
                return start
        return None

    def copies(self, start: int) -> bool:
        """Whether the match at `start` agrees with the sequence's end over more than n_max
        tokens (its longest n-gram and the token before it): the text is copying that source."""
        n, tokens = self.n_max + 1, self.tokens
        return start >= n and len(tokens) >= n and tokens[start - n:start] == tokens[-n:]

    def continuation(self, k: int) -> list[int]:
        """Up to k tokens that followed the match ([] when none)."""
        start = self.match()
        return [] if start is None else self.follow(start, k)

    def follow(self, start: int, k: int) -> list[int]:
        """The k tokens from position `start` on. Where they run into the end of the sequence (a
        repeating run, whose latest match ends just before the last tokens) the match goes on
        over the tokens proposed so far: the run keeps its period."""
        tokens, length, out = self.tokens, len(self.tokens), []
        for i in range(start, start + k):
            out.append(tokens[i] if i < length else out[i - length])
        return out


class NgramDrafter:
    """Proposes the continuation of the latest match; its index learns each settled token once.
    Where the prompt and the text so far have none, `earlier` (a shared `SuffixCache`, if any)
    is looked up: what followed the same last tokens in an earlier run.

    Its proposals take one of two routes, priced apart by gamma "auto" (`types.Routed`): COPY
    where the match agrees with the text's end over more than n_max tokens (the text copies that
    source, and tends to go on doing so: up to `copy` tokens), LOOKUP for a shorter match or an
    earlier run's text (up to k). Pooled, the short matches' misses (a two-token match fires in
    unrelated contexts too) would price a copy's long proposals out."""

    needs_target_features = False

    def __init__(self, draft: NgramDraft, earlier: SuffixCache | None = None):
        self.draft, self.earlier = draft, earlier
        self.index = NgramIndex(draft.n_min, draft.n_max)
        self.looked_up: tuple[int, list[int]] = (-1, [])  # (text length, `earlier`'s k tokens)
        self.found: tuple[int, int | None, bool] = (-1, None, False)  # (length, start, copies)
        self.last = LOOKUP  # the route of the last proposal

    def nodes(self, gamma: int) -> int:
        return min(gamma, max(self.draft.k, self.draft.copy))

    def start(self, prompt: Tensor, capacity: int, features: Tensor | None = None) -> None:
        self.index = NgramIndex(self.draft.n_min, self.draft.n_max)
        self.index.extend(prompt.tolist())
        self.looked_up = (-1, [])
        self.found = (-1, None, False)

    def _match(self, seq: list[int]) -> tuple[int | None, bool]:
        """(where the match's continuation starts or None, whether it copies), once per length."""
        self.index.extend(seq[len(self.index):])  # every token of seq is settled
        length = len(self.index)
        if self.found[0] != length:
            start = self.index.match()
            copies = start is not None and self.draft.copy > 0 and self.index.copies(start)
            self.found = (length, start, copies)
        return self.found[1:]

    def route_after(self, seq: list[int]) -> str | None:
        """The route of what `propose` would propose after `seq` (every token so far): COPY,
        LOOKUP, or None when nothing matches, in the text or in earlier runs'."""
        start, copies = self._match(seq)
        if start is None:
            return LOOKUP if self._earlier() else None
        return COPY if copies else LOOKUP

    def routes(self, seq: list[int]) -> list[str]:
        """This step's route (LOOKUP where nothing matches: `propose` then proposes nothing)."""
        return [self.route_after(seq) or LOOKUP]

    def use(self, route: str) -> None:
        """Nothing to choose: the text decides the route."""

    def proposed(self) -> str:
        return self.last

    def longest(self, route: str, gamma: int) -> int:
        return min(gamma, self.draft.copy if route == COPY else self.draft.k)

    def propose(self, seq: list[int], gamma: int, sampling: SamplingConfig,
                generator: torch.Generator) -> Proposal:
        """Nothing when no n-gram matches: the loop then takes a plain step."""
        start, copies = self._match(seq)
        self.last = COPY if copies else LOOKUP
        n = self.longest(self.last, gamma)
        tokens = self._earlier()[:n] if start is None else self.index.follow(start, n)
        return Proposal.chain(torch.tensor(tokens, dtype=torch.long)) if tokens else EMPTY

    def _earlier(self) -> list[int]:
        """Up to k tokens from `earlier` after the text's last n_max tokens ([] without a cache);
        looked up once per text length (`route_after`, then `propose`)."""
        if self.earlier is None:
            return []
        length = len(self.index)
        if self.looked_up[0] != length:
            tail = self.index.tokens[-self.draft.n_max:]
            self.looked_up = (length, self.earlier.continuation(tail, self.draft.n_min,
                                                                self.draft.k))
        return self.looked_up[1]

    def rollback(self, length: int, features: Tensor | None, path: list[int]) -> None:
        """Nothing to forget: the index holds settled tokens only (it takes the accepted ones,
        and the target's next, with the next proposal)."""
