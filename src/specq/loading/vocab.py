"""Which models may pair: a target scores tokens on its own, and a draft shares its vocabulary."""

from __future__ import annotations

import weakref
from pathlib import Path

from ..core.types import Draft, Model
from ..errors import SpecqError
from ..weights.narrow_head import NarrowHead
from . import file_spec
from .builtins import BUILTIN_GGUF, gguf_files_present, local_path
from .drafts import adapter, known
from .refs import ModelRef, model_ref

DRAFT_OPTIONS = "head{N}k and keep{N} make a cheaper draft of a GGUF file"


def check_target_ref(ref: str | ModelRef) -> None:
    """What a target's ref alone shows it cannot be: a GGUF file with a narrowed head or fewer
    layers (`@gguf-head{N}k`, `@gguf-keep{N}`) drafts, since it no longer scores as the file does.
    Read from the text: called before anything loads."""
    ref = ref if isinstance(ref, ModelRef) else model_ref(ref)
    if ref.skips is None and file_spec.names_file(ref.spec):
        spec = file_spec.parse(ref.spec)
        if spec.head_tokens or spec.keep_layers:
            raise SpecqError(f"'{ref.text}' is a draft, not a target ({DRAFT_OPTIONS}): give the "
                             f"target as {ref.name}@{file_spec.FileSpec(int4=spec.int4)}")


def check_names(draft: str | ModelRef, target: str | ModelRef) -> None:
    """A draft whose tokenizer differs from its target's, refused before either loads: the token
    lists are read from the GGUF files' headers or the folders' tokenizer.json (`known.identity`,
    cached). Only files with files and folders with folders are compared (a folder converted from
    a file may spell its tokens otherwise); the rest waits for `check_compatible` on the loaded
    models, as does a model this cannot read cheaply (a hub id, a file not yet assembled)."""
    draft = draft if isinstance(draft, ModelRef) else model_ref(draft)
    target = target if isinstance(target, ModelRef) else model_ref(target)
    paths = _tokenizer_path(draft), _tokenizer_path(target)
    if None in paths or paths[0].is_file() != paths[1].is_file():
        return
    try:
        ours, theirs = (known.identity(path)[0] for path in paths)
        rows, tokens = known.sizes(paths[0])[1], known.sizes(paths[1])[0]
    except (OSError, SpecqError):
        return  # unreadable here: the load says why
    if ours != theirs:
        raise SpecqError(f"draft '{draft.text}' and target '{target.text}' have different "
                         f"vocabularies (the token lists of {paths[0]} and {paths[1]} differ): a "
                         "draft must read its target's tokenizer")
    if rows < tokens:
        raise SpecqError(f"draft '{draft.text}' has {rows} embedding rows, fewer than the {tokens} "
                         f"tokens of target '{target.text}' (one tokenizer, padded further in the "
                         "target): a draft must read every token its target may emit")


def _tokenizer_path(ref: ModelRef) -> Path | None:
    """The GGUF file or model folder whose token list a ref reads, when one is on disk now (a
    built-in's file only once installed or assembled); None otherwise."""
    ref = ref.skips or ref
    if ref.is_self:
        return None
    if ref.name in BUILTIN_GGUF:
        return gguf_files_present().get(ref.name)
    path = local_path(ref.name)
    if path.suffix == ".gguf":
        return path if path.is_file() else None
    return path if path.is_dir() and not adapter.is_adapter(path) else None


def check_target(target: Model) -> None:
    """A model that can be a target: a loaded `Model` (a `Draft` only drafts: a feature draft reads
    another model's hidden states, `self@SPEC` is its target's own weights)."""
    if isinstance(target, Draft):
        raise SpecqError(f"'{target.ref}' is a {target.kind.name} draft: it drafts for a target "
                         "and cannot be one")
    if not isinstance(target, Model):
        raise SpecqError(f"the target must be a model from specq.load, got {type(target).__name__}")
    if isinstance(getattr(target.net, "output", None), NarrowHead):
        raise SpecqError(f"'{target.ref}' has a narrowed head (it scores only some tokens): a "
                         "draft, not a target")
    try:
        ref = model_ref(target.ref)
    except SpecqError:
        return  # not a ref specq parses (a model made in memory): nothing more to read from it
    check_target_ref(ref)  # fewer layers (@gguf-keep{N}) leave no mark on the loaded model


def check_compatible(draft: Model | Draft, target: Model) -> None:
    """The draft must give every token string the target's id and have an embedding row for
    every token of the target's tokenizer; padded vocab rows are allowed."""
    check_target(target)
    if not isinstance(draft, (Model, Draft)):
        raise SpecqError("the draft must be a model from specq.load or None, got "
                         f"{type(draft).__name__}")
    _check_same_vocabulary(draft, target)
    if draft.vocab_size < len(target.tokenizer):
        raise SpecqError(f"draft '{draft.ref}' has {draft.vocab_size} embedding rows, fewer than "
                         f"the {len(target.tokenizer)} tokens of target '{target.ref}'")


# (size, hash of the token -> id map) per tokenizer object: building and comparing two 49k-entry
# maps cost about 80 ms, which the server paid before every speculative request's first token
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocabulary_key(tokenizer) -> tuple[int, int]:
    size = len(tokenizer)  # a token added since the last call changes it
    known = _VOCABULARIES.get(tokenizer)
    if known is None or known[0] != size:
        known = (size, hash(frozenset(tokenizer.get_vocab().items())))
        _VOCABULARIES[tokenizer] = known
    return known


def _check_same_vocabulary(draft: Model | Draft, target: Model) -> None:
    if _vocabulary_key(draft.tokenizer) == _vocabulary_key(target.tokenizer):
        return
    dv, tv = draft.tokenizer.get_vocab(), target.tokenizer.get_vocab()
    if dv == tv:
        return
    differ = sorted((tok for tok in dv.keys() & tv.keys() if dv[tok] != tv[tok]),
                    key=lambda t: dv[t])
    only_draft = sorted(dv.keys() - tv.keys(), key=lambda t: dv[t])
    only_target = sorted(tv.keys() - dv.keys(), key=lambda t: tv[t])
    parts = []
    if differ:
        t = differ[0]
        parts.append(f"{len(differ)} tokens have different ids (e.g. {t!r}: draft {dv[t]}, target "
                     f"{tv[t]})")
    if only_draft:
        parts.append(f"{len(only_draft)} tokens only in the draft (e.g. {only_draft[0]!r})")
    if only_target:
        parts.append(f"{len(only_target)} tokens only in the target (e.g. {only_target[0]!r})")
    raise SpecqError(f"draft '{draft.ref}' and target '{target.ref}' have different vocabularies: "
                     + "; ".join(parts))
