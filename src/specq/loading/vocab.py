"""Which models may pair: a target scores tokens on its own, and a draft shares its vocabulary."""

from __future__ import annotations

import weakref

from ..core.types import Draft, Model
from ..errors import SpecqError
from ..weights.narrow_head import NarrowHead


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
