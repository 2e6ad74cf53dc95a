"""Mixed-precision serving: one target at several precisions, each request naming its precision
and getting the draft calibrated for it.

    pool = specq.ModelPool("smollm2-135m")
    pool.generate("Why is the sea salty?", precision="int4-g64-gptq", chat=True)

Models load on first use and stay loaded; the draft is each precision's default, as for `specq
generate` (`loading/drafts/default.py`: the registries' draft for that precision, else the nearest,
else a smaller model with the target's tokenizer, behind an n-gram lookup), unless the pool is
given one draft for every precision. Loading is thread-safe (`specq serve` runs one worker thread
per precision). Each target keeps gamma auto's estimates across its runs (`gamma_memory`; keyed
inside by the draft), and its earlier runs' text for n-gram drafts per key (`suffix_cache`: whose
runs see whose).
"""

from __future__ import annotations

import threading
from dataclasses import replace

from .. import checks
from ..api import Generation, generate
from ..core.gamma import GammaMemory
from ..core.types import Draft, Model
from ..drafters import lookahead, ngram
from ..drafters.suffix import DEFAULT_TOKENS, SuffixCache, check_tokens
from ..loading import precision as precisions
from ..loading.drafts.default import load_default
from ..loading.kinds import load
from ..loading.refs import default_precision, free_ref, model_ref


class ModelPool:
    def __init__(self, target: str, speculative: bool = True, draft: str | None = None,
                 suffix_tokens: int = DEFAULT_TOKENS):
        self.target = model_ref(checks.text("the target", target)).name
        self.speculative = speculative
        # None: the registry's
        self.draft = None if draft is None else checks.text("the draft", draft)
        self._lock = threading.RLock()
        self._targets: dict[str, Model] = {}
        self._memories: dict[str, GammaMemory] = {}  # per target precision
        # tokens of earlier runs kept per target precision and key (0: no suffix cache)
        self.suffix_tokens = check_tokens("suffix_tokens", suffix_tokens)
        self._suffixes: dict[tuple[str, str], SuffixCache] = {}
        self._drafts: dict[tuple[str, str], Model] = {}
        self._pairs: dict[str, tuple[Model, Model | None, str | None]] = {}

    def spec(self, precision: str | None = None) -> str:
        """A precision spelled canonically; None: the target's own, as `specq generate` runs it (a
        GGUF file's `gguf`, else fp32: `refs.default_precision`)."""
        return precisions.canonical(default_precision(self.target) if precision is None
                                    else precision)

    def target_model(self, precision: str | None = None) -> Model:
        spec = self.spec(precision)
        with self._lock:
            if spec not in self._targets:
                self._targets[spec] = load(f"{self.target}@{spec}")
            return self._targets[spec]

    def gamma_memory(self, precision: str | None = None) -> GammaMemory:
        """gamma auto's estimates for the target at `precision`, kept across its runs (each draft's
        under its own key): the pool's `generate` and a server's engine start each run from them."""
        spec = self.spec(precision)
        with self._lock:
            return self._memories.setdefault(spec, GammaMemory())

    def suffix_cache(self, precision: str | None = None, key: str = "") -> SuffixCache | None:
        """The earlier runs' text of `key` on the target at `precision`, where n-gram drafts also
        look; runs of one key never see another key's (the server's key is the request's API
        key). None when the pool keeps none (suffix_tokens 0)."""
        if not self.suffix_tokens:
            return None
        slot = (self.spec(precision), key)
        with self._lock:
            if slot not in self._suffixes:
                self._suffixes[slot] = SuffixCache(self.suffix_tokens)
            return self._suffixes[slot]

    def draft_model(self, precision: str, ref: str
                    ) -> Model | Draft | ngram.NgramDraft | lookahead.LookaheadDraft:
        """Draft `ref` for the target at `precision`. Each precision gets its own copy: a feature
        draft binds to its target's embedding, and precisions may decode at the same time. An
        n-gram or lookahead draft loads nothing; an n-gram draft's fallback model is loaded like
        any other draft."""
        lookup = free_ref(ref)
        if lookup is not None:
            fallback = lookup.fallback
            return lookup.draft if fallback is None else \
                replace(lookup.draft, fallback=self.draft_model(precision, fallback.text))
        key = (precisions.canonical(precision), ref)
        with self._lock:
            if key not in self._drafts:
                # `self@SPEC`: this target (`self@skip`: its layers, beside it)
                self._drafts[key] = load(ref, target=self.target_model(key[0]))
            return self._drafts[key]

    def models(self, precision: str | None = None) -> tuple[Model, Model | None, str | None]:
        """(target at `precision`, its draft or None, a note on how the draft was chosen)."""
        spec = self.spec(precision)
        with self._lock:
            if spec not in self._pairs:
                target = self.target_model(spec)
                if not self.speculative:
                    draft, note = None, None
                elif self.draft is not None:
                    draft, note = (self.draft_model(spec, self.draft),
                                   f"draft {self.draft} (given)")
                else:
                    draft, note = load_default(f"{self.target}@{spec}",
                                               lambda ref: self.draft_model(spec, ref))
                self._pairs[spec] = (target, draft, note)
            return self._pairs[spec]

    def generate(self, prompt: str | list[int], precision: str | None = None, key: str = "",
                 **options) -> Generation:
        """`specq.generate` on the target at `precision` with the draft selected for it, from and
        into `key`'s earlier runs (`suffix_cache`)."""
        target, draft, _ = self.models(precision)
        kept = {"gamma_memory": self.gamma_memory(precision),
                "suffix_cache": self.suffix_cache(precision, key)}
        return generate(target, prompt, draft, **kept | options)
