"""What the runner times: an `Engine` turns a prompt into a `Result` (tokens, text, stats), the same
for specq's own decoding in this process (`SpecqEngine`), transformers' assisted generation (the
peer, `runner.hf_assisted`) and a server that speaks the OpenAI API (`openai_engine.py`). The
runner pairs, repeats and stores results without knowing which engine made them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..core.stats import DecodeStats
from ..drafters.suffix import SuffixCache
from .prompts import Prompt


@dataclass
class Result:
    token_ids: list[int]  # empty when the engine returns text alone
    text: str
    finish_reason: str
    stats: DecodeStats  # what the engine measured or reported (see each engine)
    extra: dict = field(default_factory=dict)  # stored with the run as is


class Engine(Protocol):
    def generate(self, prompt: Prompt, max_tokens: int, repeat: int = 0) -> Result:
        """One generation; runs of one `repeat` share what carries over between prompts (a
        suffix cache); repeat -1, the untimed warm-up, shares nothing."""
        ...


class SpecqEngine:
    """specq's decoding in this process: `run(prompt_ids, max_tokens, suffix_cache)` is one
    generation (speculative, plain or the peer's), `text` the answer's text; with `suffix_cache`,
    one suffix cache per repeat, which the prompts of that repeat fill in turn."""

    def __init__(self, run: Callable, ids: dict[Prompt, list[int]],
                 text: Callable[[list[int]], str], suffix_cache: bool = False):
        self.run, self.ids, self.text = run, ids, text
        self.caches: dict[int, SuffixCache] = {}
        self.suffix_cache = suffix_cache

    def generate(self, prompt: Prompt, max_tokens: int, repeat: int = 0) -> Result:
        cache = (self.caches.setdefault(repeat, SuffixCache())
                 if self.suffix_cache and repeat >= 0 else None)
        out = self.run(self.ids[prompt], max_tokens, cache)
        return Result(out.token_ids, self.text(out.token_ids), out.finish_reason, out.stats)
