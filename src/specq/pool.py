"""Mixed-precision serving: one target at several precisions, each request naming its precision
and getting the draft calibrated for it.

    pool = specq.ModelPool("smollm2-135m")
    pool.generate("Why is the sea salty?", precision="int4-g64-gptq", chat=True)

Models load on first use and stay loaded; the draft comes from the registries (exact precision,
else the nearest, with a warning), as for `specq generate`.
"""

from __future__ import annotations

import warnings

from . import checks
from . import precision as precisions
from .api import Generation, generate
from .models import Model, load, select_draft, split_ref


class ModelPool:
    def __init__(self, target: str, speculative: bool = True):
        self.target = split_ref(checks.text("the target", target))[0]
        self.speculative = speculative
        self._models: dict[str, Model] = {}
        self._pairs: dict[str, tuple[Model, Model | None, str | None]] = {}

    def _load(self, ref: str) -> Model:
        if ref not in self._models:
            self._models[ref] = load(ref)
        return self._models[ref]

    def models(self, precision: str = "fp32") -> tuple[Model, Model | None, str | None]:
        """(target at `precision`, its draft or None, a note on how the draft was chosen)."""
        spec = str(precisions.parse(precision))
        if spec not in self._pairs:
            target = self._load(f"{self.target}@{spec}")
            draft_ref, note = select_draft(f"{self.target}@{spec}") if self.speculative else (None, None)
            self._pairs[spec] = (target, self._load(draft_ref) if draft_ref else None, note)
        return self._pairs[spec]

    def generate(self, prompt: str | list[int], precision: str = "fp32", **options) -> Generation:
        """`specq.generate` on the target at `precision` with the draft selected for it."""
        target, draft, note = self.models(precision)
        if self.speculative and note and note.startswith("no draft"):  # none, or another precision's
            warnings.warn(note, stacklevel=2)
        return generate(target, prompt, draft, **options)
