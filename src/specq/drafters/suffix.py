"""Earlier runs' text for n-gram drafts: a suffix cache across the generations of one target.

An agent's loop, an edit asked again, a tool call that recurs: a request often writes text an
earlier request wrote, text its own prompt does not hold. `SuffixCache` keeps the token sequences
(prompt and output) of finished runs; the n-gram drafter (`ngram.py`) proposes what followed the
current text's last tokens there, on the steps where the current text itself has no match (the
same request is the better source). vLLM's suffix decoding does this with a suffix tree; here each
pair of tokens keys a chain of its occurrences, newest first, as LZ77's hash chains do: one index
matches any n from 2 to the drafter's n_max, and a lookup compares at most MAX_CHAIN of them.

Whoever runs many generations keeps one and passes it to each (`generate(..., suffix_cache=)`):
`ModelPool` one per target precision and key (so `specq serve` one per served model and API key:
requests never see another key's text), the bench one per cell and repeat.

Layout: the texts one after another in one buffer, each ended by SEP, at global positions that are
never reused (buffer index = position - floor). `head[pair]` is the newest position that follows
`pair`, `prev[p]` the one before p with the same pair. Bounded by `max_tokens` slots: a new text
first drops the oldest ones, and every head that pointed into them; a chain walk stops at the
first position below `floor`. So a lookup never proposes an evicted token or a shifted position.
"""

from __future__ import annotations

import threading
from array import array
from collections import deque

from ..checks import integer
from ..errors import SpecqError

SEP = -1  # ends each text: no token id equals it, so no match or continuation crosses texts
GRAM = 2  # tokens in a key: the shortest match the cache serves
# earlier occurrences of a pair one lookup compares, newest first: a frequent pair (`self.`) has
# a long chain, and what an edit loop repeats is its latest text
MAX_CHAIN = 16
# slots kept per cache when the owner does not say (a token each, one per text's end): the index
# costs two array slots per token and a dictionary entry per distinct pair
DEFAULT_TOKENS = 1 << 18
MIN_TOKENS = GRAM + 2  # room for one pair, the token after it, and its text's end


def check_tokens(name: str, tokens: int) -> int:
    """A cache size an owner takes: 0 (no cache) or at least MIN_TOKENS."""
    integer(name, tokens)
    if 0 < tokens < MIN_TOKENS:
        raise SpecqError(f"{name} must be 0 (no suffix cache) or at least {MIN_TOKENS}, "
                         f"got {tokens}")
    return tokens


def _key(a: int, b: int) -> int:
    return a << 32 | b


class SuffixCache:
    """Finished runs' token sequences, at most `max_tokens` slots (oldest dropped first);
    thread-safe: a server's requests end and look up from several threads."""

    def __init__(self, max_tokens: int = DEFAULT_TOKENS):
        self.max_tokens = integer("the suffix cache's size in tokens", max_tokens, MIN_TOKENS)
        self._lock = threading.Lock()
        self._tokens = array("q")  # from position floor on: the texts, each followed by SEP
        self._prev = array("q")  # the same positions: the previous one after the same pair, or -1
        self._head: dict[int, int] = {}  # pair -> the newest position after it
        self._floor = 0  # the position of the buffer's first slot
        self._texts: deque[int] = deque()  # each text's slots (its SEP included), oldest first

    def __len__(self) -> int:
        """Slots held: tokens, and one per text."""
        return len(self._tokens)

    def add(self, tokens: list[int]) -> None:
        """Keep a finished run's text (prompt and output ids), first dropping the oldest texts
        that leave it no room; a text longer than the cache keeps its end."""
        tokens = list(tokens)[-(self.max_tokens - 1):]
        if len(tokens) <= GRAM:
            return  # no pair with a token after it: nothing to look up
        with self._lock:
            self._drop(len(self._tokens) + len(tokens) + 1 - self.max_tokens)
            base = self._floor + len(self._tokens)  # the position of tokens[0]
            prev = [-1] * GRAM
            for i in range(GRAM, len(tokens)):
                key = _key(tokens[i - 2], tokens[i - 1])
                prev.append(self._head.get(key, -1))
                self._head[key] = base + i
            self._tokens.extend(tokens)
            self._tokens.append(SEP)
            self._prev.extend(prev)
            self._prev.append(-1)
            self._texts.append(len(tokens) + 1)

    def _drop(self, slots: int) -> None:
        """Drop the oldest texts until at least `slots` slots are free, and their heads."""
        cut = 0
        while cut < slots and self._texts:
            end = cut + self._texts.popleft()
            for i in range(cut + GRAM, end - 1):  # the text's keyed positions (its SEP is not)
                key = _key(self._tokens[i - 2], self._tokens[i - 1])
                if self._head.get(key) == self._floor + i:  # no newer text has this pair
                    del self._head[key]
            cut = end
        del self._tokens[:cut]
        del self._prev[:cut]
        self._floor += cut

    def continuation(self, tail: list[int], n_min: int, k: int) -> list[int]:
        """Up to k tokens that followed, in the texts held, the newest occurrence of the longest
        suffix of `tail` (at least max(n_min, GRAM) tokens, at most all of `tail`) among the
        newest MAX_CHAIN occurrences of its last GRAM tokens; [] when there is none."""
        shortest = max(n_min, GRAM)
        if len(tail) < shortest:
            return []
        with self._lock:
            tokens, floor = self._tokens, self._floor
            position = self._head.get(_key(tail[-2], tail[-1]), -1)
            best, longest = -1, shortest - 1
            for _ in range(MAX_CHAIN):
                if position < floor:  # none, or dropped with its text
                    break
                at = position - floor
                n = GRAM
                while n < len(tail) and at - n > 0 and tokens[at - n - 1] == tail[-n - 1]:
                    n += 1
                if n > longest:
                    best, longest = at, n
                    if n == len(tail):
                        break
                position = self._prev[at]
            if best < 0:
                return []
            out = []
            for token in tokens[best:best + k]:
                if token == SEP:
                    break
                out.append(token)
            return out
