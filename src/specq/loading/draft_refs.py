"""Draft refs as users write them (`--draft`, bench configs, `specq serve`) -> what `generate` takes.

A ref is one level or several joined by commas, cheapest first (a hierarchy). A level is a model
ref (`self@SPEC`: the target's own weights at SPEC; `MODEL:window=W`: drafting from the prompt's
last W tokens) or, as the first level only, an n-gram draft (`ngram[:n=N|n=MIN-MAX][:k=K]`,
`+MODEL` for a model draft on the steps with no match).
`split` checks the text alone, so a bad ref fails before any model loads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..core.types import Model
from ..drafters import ngram
from ..errors import SpecqError
from .drafts import resolve_draft_ref


def split(ref: str) -> list[str]:
    """The levels of a draft ref, cheapest first, each n-gram level's options checked."""
    levels = ref.split(",")
    for i, level in enumerate(levels):
        if not level.strip():
            raise SpecqError(f"draft '{ref}': an empty level")
        if ngram.is_ngram(level):
            if i:
                raise SpecqError(f"draft '{ref}': an n-gram draft can only be the first (cheapest) level")
            ngram.parse(level)
    return levels


def ngram_alone(ref: str) -> bool:
    """Whether the ref is one n-gram draft without a model (then its k is the draft length and
    there is no model to grow trees)."""
    return ngram.is_ngram(ref) and "," not in ref and ngram.parse(ref)[1] is None


def model_refs(ref: str) -> list[str]:
    """The model refs among a draft ref's levels, cheapest first (an n-gram level's fallback)."""
    out = []
    for level in split(ref):
        model = ngram.parse(level)[1] if ngram.is_ngram(level) else level
        if model is not None:
            out.append(model)
    return out


def resolve(ref: str, target_ref: str) -> str:
    """The ref with each `self@SPEC` resolved for the target and each n-gram level spelled
    canonically (`ngram` -> `ngram:n=2-3:k=4`): one name per configuration."""
    out = []
    for level in split(ref):
        if not ngram.is_ngram(level):
            out.append(resolve_draft_ref(level, target_ref))
            continue
        spec, model = ngram.parse(level)
        out.append(spec.ref + ("" if model is None else "+" + resolve_draft_ref(model, target_ref)))
    return ",".join(out)


def build(ref: str, target_ref: str, load: Callable[[str], Model]):
    """The draft `generate` takes for a ref: a model, an `NgramDraft`, or a list of levels (a
    hierarchy); `load` turns each model ref into a model."""
    out = []
    for level in split(ref):
        if not ngram.is_ngram(level):
            out.append(load(resolve_draft_ref(level, target_ref)))
            continue
        spec, model = ngram.parse(level)
        out.append(spec if model is None else replace(spec, fallback=load(resolve_draft_ref(model, target_ref))))
    return out[0] if len(out) == 1 else out
