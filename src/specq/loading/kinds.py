"""Draft kinds: what a draft can be, keyed by what its ref (parsed: `refs.py`) or its folder says,
and for each kind how it loads, the drafter it makes for a target, how its network runs alone, how
it is scored against its target and how it is saved (training: `training/students.py`).

| kind       | named by                                       | loads as                         |
|------------|------------------------------------------------|----------------------------------|
| `ngram`    | `ngram[:n=N or n=MIN-MAX][:k=K][:c=C][+MODEL]` | `NgramDraft` (MODEL by its kind) |
| `skip`     | `MODEL@skip[=LAYERS]` (`self@skip`)            | `Draft`: some of MODEL's layers  |
| `lookahead`| `lookahead[:w=W][:n=N][:g=G]`                  | `LookaheadDraft` (no model)      |
| `self`     | `self@SPEC`                                    | `Draft`: the target's own at SPEC|
| `feature`  | a folder with `feature_draft.json`             | `Draft` (EAGLE style)            |
| `sequence` | any other: built-in, folder, .gguf, hub        | `Model` (it can be a target too) |

Drafters: `NgramDrafter` (ngram), `LookaheadDrafter` (lookahead), `SequenceDrafter` (skip, self,
sequence), `FeatureDrafter` (feature).

A model draft (sequence, self or skip) named `REF:window=W` drafts from the prompt's last W tokens.

`load` here is `specq.load`: any ref, a target's or a draft's. Only a `Model` can be a target.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from .. import atomic, backends
from ..core.gamma import LONGEST_DEFAULT
from ..core.types import Draft, Kind, Model
from ..drafters import lookahead, ngram
from ..drafters.fallback import FallbackDrafter
from ..drafters.feature import FeatureDrafter
from ..drafters.hierarchy import HierarchicalDrafter
from ..drafters.sequence import DEFAULT_DRAFT_CONFIDENCE, SequenceDrafter
from ..drafters.suffix import SuffixCache
from ..drafters.tree import TreeShape
from ..errors import SpecqError
from ..model import feature_draft
from ..model.llama import Llama
from ..weights.quant import quantize_model
from . import layer_skip, precision
from .builtins import local_path
from .drafts import folders
from .formats import hf, validate
from .formats.save import write_native
from .models import load_model
from .refs import (LOOKAHEAD_ABOUT, NGRAM_ABOUT, SELF, WINDOW_APPLIES, Level, LookaheadRef,
                   ModelRef, NgramRef, level, model_ref)


def _trees_need_a_native(target: Model, tree: TreeShape | None) -> None:
    if tree is not None and not isinstance(target.net, Llama):
        raise SpecqError("token trees need a Llama-architecture target on specq's own module, not "
                         f"'{target.ref}'")


# ------------------------------------------------------------------------------ sequence (and self)


def _sequence_drafter(draft, target: Model, min_confidence: float, tree: TreeShape | None,
                      gamma: int, suffix_cache: SuffixCache | None):
    _trees_need_a_native(target, tree)
    if tree is not None and not isinstance(draft.net, Llama):
        raise SpecqError("token trees need a Llama-architecture draft on specq's own module, not "
                         f"'{draft.ref}'")
    return SequenceDrafter(draft, target.vocab_size, min_confidence, tree,
                           draft.info.get("draft_window"))


def _sequence_rows(net, ids: Tensor, cache):
    return net(ids, cache, last_only=True)


def _sequence_logits(target_net, draft_net, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return target_net(ids, None)[:-1], draft_net(ids, None)[:-1], ids[1:]


def _load_self(ref: ModelRef, backend: str | None, target) -> Draft:
    """`self@SPEC`: the target's own model at SPEC (QSPEC-style self-speculation: no draft to train
    or ship, the same tokenizer by construction)."""
    if target is None:
        raise SpecqError(f"'{ref.base}' is the target's own weights at {ref.spec}: "
                         f"load it with its target (specq.load('{ref.base}', target=...))")
    target_ref = target if isinstance(target, str) else target.ref
    return Draft(SELF_KIND, load_model(ref.for_target(target_ref), backend))


def _load_skip(ref: ModelRef, backend: str | None, target) -> Draft:
    """`MODEL@skip[=LAYERS]` (`layer_skip.py`): some of MODEL's layers. Beside a loaded target
    that MODEL names (`self@skip`, or the target's own ref), the target's modules on its runner's
    kernels; else MODEL loads first (`self@SPEC` as the target's own weights at SPEC)."""
    inner, spec = ref.skips, layer_skip.parse(ref.spec)
    if inner.is_self and target is None:
        raise SpecqError(f"'{ref.base}' runs the target's own layers: load it with its target "
                         f"(specq.load('{ref.base}', target=...))")
    given = target.ref if isinstance(target, Model) else target
    named = model_ref(given) if ref.name == SELF else inner.for_target(given)
    shared = isinstance(target, Model) and named.canonical() == model_ref(given).canonical()
    base = target if shared else load_model(named, backend)
    return Draft(SKIP, layer_skip.draft(base, spec, ref.for_target(given).base if given
                                        else ref.base))


# ------------------------------------------------------------------------------ feature


def _load_feature(ref: ModelRef, backend: str | None, target=None) -> Draft:
    """A feature draft at a float precision, or with RTN integer weights (one small layer and a
    head: quantized at load, in seconds, not cached)."""
    started = time.perf_counter()
    name = ref.name
    spec = precision.parse(ref.spec)
    if not spec.is_float and spec.method != "rtn":
        raise SpecqError(f"'{name}' is a feature draft: it runs at a float precision (fp32, bf16) "
                         f"or with RTN integer weights (e.g. int8-head8), not {spec}")
    from transformers import AutoTokenizer

    source = local_path(name)
    validate.check_dir(source)
    net = feature_draft.load(source, spec.dtype or torch.float32)
    if not spec.is_float:
        quantize_model(net, spec, progress=False)
    tok = AutoTokenizer.from_pretrained(source, local_files_only=True)
    # no config.json: generation_config.json only
    eos = hf.generation_eos(source, None, local_only=True)
    model = Model(ref=ref.base, net=net, tokenizer=tok, eos_ids=hf.eos_set(eos, tok),
                  source=str(source), precision=str(spec),
                  info={"load_s": time.perf_counter() - started})
    if backend is not None:
        model.runner = backends.runner(net, backend)
        model.info["backend"] = model.runner.backend
    return Draft(FEATURE, model)


def _feature_drafter(draft: Draft, target: Model, min_confidence: float, tree: TreeShape | None,
                     gamma: int, suffix_cache: SuffixCache | None):
    _trees_need_a_native(target, tree)
    if not isinstance(target.net, Llama):
        raise SpecqError(f"feature draft '{draft.ref}' needs a Llama-architecture target, not "
                         f"'{target.ref}'")
    draft.net.attach(target.net)  # the target's token embedding, shared
    return FeatureDrafter(draft.runner, min_confidence, tree)


def _feature_rows(net, ids: Tensor, cache):
    """Its rows also read target states: any of that shape cost the same."""
    return net(ids, torch.zeros(len(ids), net.config.hidden_size), cache)


def _feature_logits(target_net, draft_net, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Row r (token r+1, the target's state at r) predicts the token after r+1, so it is scored
    from position 1 on (the first step of every proposal)."""
    logits, hidden = target_net(ids, None, return_hidden=True)
    draft_net.net.attach(target_net.net)
    draft_logits, _ = draft_net(ids[1:-1], hidden[:-2])
    return logits[1:-1], draft_net.full_vocab(draft_logits), ids[2:]


def _write_feature(draft: Draft, directory: Path, info: dict | None) -> None:
    feature_draft.write(draft.net, directory, draft.tokenizer, draft.eos_ids, info)


def _is_feature(ref: Level) -> bool:
    return isinstance(ref, ModelRef) and folders.of(local_path(ref.name)) is folders.FEATURE


# ------------------------------------------------------------------------------ ngram


def _load_ngram(ref: NgramRef, backend: str | None, target) -> ngram.NgramDraft:
    if ref.fallback is None:
        return ref.draft
    return replace(ref.draft, fallback=_load(ref.fallback, backend, target))


def _ngram_drafter(draft: ngram.NgramDraft, target: Model, min_confidence: float,
                   tree: TreeShape | None, gamma: int, suffix_cache: SuffixCache | None):
    """Its proposals are looked up (in the text, then in `suffix_cache`'s earlier runs); its
    fallback model (proposing up to `gamma` deep) drafts where nothing matches."""
    if draft.fallback is None:
        if tree is not None:
            raise SpecqError(ngram.NO_TREES)
        return ngram.NgramDrafter(draft, suffix_cache)
    return FallbackDrafter(ngram.NgramDrafter(draft, suffix_cache),
                           for_pair(draft.fallback, target, min_confidence, tree), gamma)


# ------------------------------------------------------------------------------ lookahead


def _lookahead_drafter(draft: lookahead.LookaheadDraft, target: Model, min_confidence: float,
                       tree: TreeShape | None, gamma: int, suffix_cache: SuffixCache | None):
    if tree is not None:
        raise SpecqError(lookahead.NO_TREES)
    return lookahead.LookaheadDrafter(draft)


# ------------------------------------------------------------------------------ the table

NGRAM = Kind("ngram", NGRAM_ABOUT, lambda ref: isinstance(ref, NgramRef), _load_ngram,
             _ngram_drafter)
SKIP = Kind("skip", "a layer-skip draft (some of a model's own layers, no copy of its weights)",
            lambda ref: isinstance(ref, ModelRef) and ref.skips is not None, _load_skip,
            _sequence_drafter, rows=_sequence_rows, next_token_logits=_sequence_logits,
            verifies=True)
LOOKAHEAD = Kind("lookahead", LOOKAHEAD_ABOUT, lambda ref: isinstance(ref, LookaheadRef),
                 lambda ref, backend, target=None: ref.draft, _lookahead_drafter)
SELF_KIND = Kind("self", "a self draft (the target's own weights at another precision)",
                 lambda ref: isinstance(ref, ModelRef) and ref.is_self, _load_self,
                 _sequence_drafter, rows=_sequence_rows, next_token_logits=_sequence_logits,
                 verifies=True)
FEATURE = Kind("feature", "a feature draft (EAGLE style: it reads the target's hidden states)",
               _is_feature, _load_feature, _feature_drafter, rows=_feature_rows,
               next_token_logits=_feature_logits, write=_write_feature)
SEQUENCE = Kind("sequence", "a sequence draft (a model of its own)", lambda ref: True,
                lambda ref, backend, target=None: load_model(ref, backend), _sequence_drafter,
                rows=_sequence_rows, next_token_logits=_sequence_logits,
                write=lambda draft, directory, info: write_native(draft, directory),
                verifies=True, transformers=True, is_model=True)
# recognized in this order: sequence takes the rest
KINDS = {k.name: k for k in (NGRAM, LOOKAHEAD, SKIP, SELF_KIND, FEATURE, SEQUENCE)}
# loaded drafts that are not a `Draft`, by type
LOADED = {Model: SEQUENCE, ngram.NgramDraft: NGRAM, lookahead.LookaheadDraft: LOOKAHEAD}


def recognize(ref: str) -> Kind:
    """The kind of draft a ref names, from its text or the folder it names (nothing loads)."""
    return _recognized(level(ref))


def _recognized(ref: Level) -> Kind:
    return next(kind for kind in KINDS.values() if kind.recognizes(ref))


def kind_of(draft) -> Kind:
    """The kind of a loaded draft: a `Draft`'s own, a `Model`'s (sequence), an `NgramDraft`'s or
    a `LookaheadDraft`'s."""
    if isinstance(draft, Draft):
        return draft.kind
    kind = LOADED.get(type(draft))
    if kind is None:
        raise SpecqError("a draft is a model or draft from specq.load, an n-gram draft "
                         "(specq.NgramDraft), a lookahead draft (specq.LookaheadDraft) or a list "
                         f"of them, got {type(draft).__name__}")
    return kind


def as_kind(kind: Kind, model: Model) -> Model | Draft:
    """A model as a draft of `kind` (what `load` gives for one): a sequence draft
    is the model itself."""
    return model if kind.is_model else Draft(kind, model)


def load(ref: str, backend: str | None = backends.DEFAULT, target: Model | str | None = None):
    """Load any ref: a model (a target, or a sequence draft: a `Model`), or a draft of another kind
    (`self@SPEC` needs `target`: a loaded target or its ref; an n-gram draft loads its fallback
    model only). `backend`: as `models.load_model` (None: no backend yet, for code that trains or
    saves). `MODEL:window=W` is MODEL drafting from the prompt's last W tokens (`refs.ModelRef`)."""
    return _load(level(ref), backend, target)


def _load(ref: Level, backend: str | None, target):
    kind = _recognized(ref)
    window = ref.window if isinstance(ref, ModelRef) else None
    if window is not None and kind not in (SEQUENCE, SELF_KIND, SKIP):
        raise SpecqError(f"'{ref.text}': " + WINDOW_APPLIES.format(kind.about))
    loaded = kind.load(ref, backend, target)
    if window is None:
        return loaded
    model = loaded if kind.is_model else loaded.model
    return as_kind(kind, replace(model, ref=ref.text, info={**model.info, "draft_window": window}))


def save(draft: Model | Draft, out: Path | str, info: dict | None = None) -> None:
    """Save a draft in its kind's own format, atomically."""
    kind = kind_of(draft)
    if kind.write is None:
        raise SpecqError(f"{kind.about} has no weights of its own to save")
    atomic.write_dir(Path(out), lambda tmp: kind.write(draft, tmp, info))


def for_pair(draft, target: Model, min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
             tree: TreeShape | None = None, gamma: int = LONGEST_DEFAULT,
             suffix_cache: SuffixCache | None = None):
    """The drafter a loaded draft makes for `target`, by its kind. `tree`: propose dynamic token
    trees of that shape instead of chains (native Llama models only). `suffix_cache`: earlier
    runs' text, where an n-gram draft also looks (other kinds ignore it)."""
    return kind_of(draft).drafter(draft, target, min_confidence, tree, gamma, suffix_cache)


def for_levels(drafts: list, target: Model, min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
               tree: TreeShape | None = None, gamma: int = LONGEST_DEFAULT,
               suffix_cache: SuffixCache | None = None):
    """A drafter for a hierarchy of loaded drafts, cheapest first: the first proposes (a tree if
    `tree`), each next one verifies what the levels below proposed (`hierarchy.py`). One draft is
    just `for_pair`; only a kind that scores tokens on its own can be a level above the first."""
    if len(drafts) > 1 and kind_of(drafts[0]) is LOOKAHEAD:
        raise SpecqError(f"{LOOKAHEAD_ABOUT} is a draft alone, not a level of a hierarchy")
    drafter = for_pair(drafts[0], target, min_confidence, tree, gamma, suffix_cache)
    for middle in drafts[1:]:
        kind = kind_of(middle)
        if not kind.verifies:
            raise SpecqError(f"{kind.about} can only be the first (cheapest) level of a hierarchy")
        if not isinstance(middle.net, Llama):
            raise SpecqError("an intermediate draft level needs a Llama-architecture model on "
                             f"specq's own module, not '{middle.ref}'")
        drafter = HierarchicalDrafter(drafter, middle, target.vocab_size)
    return drafter
