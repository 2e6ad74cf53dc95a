"""Mixed-precision serving: one target at several precisions, each request naming its precision
and getting the draft calibrated for it.

    pool = specq.ModelPool("smollm2-135m")
    pool.generate("Why is the sea salty?", precision="int4-g64-gptq", chat=True)

Models load on first use and stay loaded; the draft comes from the registries (exact precision,
else the nearest, with a warning), as for `specq generate`, unless the pool is given one draft for
every precision. Loading is thread-safe (`specq serve` runs one worker thread per precision). Each
target keeps gamma auto's estimates across its runs (`gamma_memory`; keyed inside by the draft).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import replace

from .. import checks
from ..api import Generation, generate
from ..core.gamma import GammaMemory
from ..core.types import Draft, Model
from ..drafters import lookahead, ngram
from ..loading import precision as precisions
from ..loading.drafts.select import select_draft
from ..loading.kinds import load
from ..loading.refs import free_ref, model_ref


class ModelPool:
    def __init__(self, target: str, speculative: bool = True, draft: str | None = None):
        self.target = model_ref(checks.text("the target", target)).name
        self.speculative = speculative
        # None: the registry's
        self.draft = None if draft is None else checks.text("the draft", draft)
        self._lock = threading.RLock()
        self._targets: dict[str, Model] = {}
        self._memories: dict[str, GammaMemory] = {}  # per target precision
        self._drafts: dict[tuple[str, str], Model] = {}
        self._pairs: dict[str, tuple[Model, Model | None, str | None]] = {}

    def target_model(self, precision: str = "fp32") -> Model:
        spec = precisions.canonical(precision)
        with self._lock:
            if spec not in self._targets:
                self._targets[spec] = load(f"{self.target}@{spec}")
            return self._targets[spec]

    def gamma_memory(self, precision: str = "fp32") -> GammaMemory:
        """gamma auto's estimates for the target at `precision`, kept across its runs (each draft's
        under its own key): the pool's `generate` and a server's engine start each run from them."""
        spec = precisions.canonical(precision)
        with self._lock:
            return self._memories.setdefault(spec, GammaMemory())

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
                # `self@SPEC`: this target
                self._drafts[key] = load(ref, target=f"{self.target}@{key[0]}")
            return self._drafts[key]

    def models(self, precision: str = "fp32") -> tuple[Model, Model | None, str | None]:
        """(target at `precision`, its draft or None, a note on how the draft was chosen)."""
        spec = precisions.canonical(precision)
        with self._lock:
            if spec not in self._pairs:
                target = self.target_model(spec)
                if not self.speculative:
                    draft_ref, note = None, None
                elif self.draft is not None:
                    draft_ref, note = self.draft, f"draft {self.draft} (given)"
                else:
                    draft_ref, note = select_draft(f"{self.target}@{spec}")
                self._pairs[spec] = (target, self.draft_model(spec, draft_ref)
                                     if draft_ref else None, note)
            return self._pairs[spec]

    def generate(self, prompt: str | list[int], precision: str = "fp32", **options) -> Generation:
        """`specq.generate` on the target at `precision` with the draft selected for it."""
        target, draft, note = self.models(precision)
        # none, or another precision's
        if self.speculative and note and note.startswith("no draft"):
            warnings.warn(note, stacklevel=2)
        memory = {"gamma_memory": self.gamma_memory(precision)}
        return generate(target, prompt, draft, **memory | options)
