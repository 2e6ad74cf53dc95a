"""Drafters propose tokens; the loop in `decode.py` verifies them. A drafter implements the
`Drafter` protocol (`base.py`):

    start(prompt_ids, capacity, features)   prefill its own state
    propose(seq, gamma, sampling, gen)      -> Proposal(tokens [N], parents [N], probs [N, V] or None)
    rollback(length, features, path)        keep seq[:length + 1] and the accepted path, forget the rest

`features` are the target's final hidden states of the rows it just ran (prompt, or the root and
accepted nodes of a verify pass) when the drafter sets `needs_target_features`, else None.

New drafters plug in without touching the loop.
"""

from ..errors import SpecqError
from ..model.feature_draft import FeatureDraft
from ..model.llama import Llama
from .base import DEFAULT_GAMMA, Drafter, Proposal
from .fallback import FallbackDrafter
from .feature import FeatureDrafter
from .hierarchy import HierarchicalDrafter
from .ngram import NO_TREES, NgramDraft, NgramDrafter
from .sequence import DEFAULT_DRAFT_CONFIDENCE, SequenceDrafter
from .tree import TreeShape

__all__ = ["Drafter", "FallbackDrafter", "FeatureDrafter", "HierarchicalDrafter", "NgramDraft", "NgramDrafter",
           "Proposal", "SequenceDrafter", "TreeShape", "for_levels", "for_pair"]


def for_pair(draft, target, min_confidence: float = DEFAULT_DRAFT_CONFIDENCE, tree: TreeShape | None = None,
             gamma: int = DEFAULT_GAMMA):
    """The drafter a loaded draft model calls for: a feature draft reads the target's hidden
    states (native Llama targets only), any other draft runs as a sequence draft. `tree`: propose
    dynamic token trees of that shape instead of chains (native Llama models only). An
    `NgramDraft` looks its proposals up, its fallback model (proposing up to `gamma` deep) where
    nothing matches."""
    if isinstance(draft, NgramDraft):
        if draft.fallback is None:
            if tree is not None:
                raise SpecqError(NO_TREES)
            return NgramDrafter(draft)
        return FallbackDrafter(NgramDrafter(draft), for_pair(draft.fallback, target, min_confidence, tree), gamma)
    if tree is not None and not isinstance(target.net, Llama):
        raise SpecqError(f"token trees need a Llama-architecture target on specq's own module, not '{target.ref}'")
    if isinstance(draft.net, FeatureDraft):
        if not isinstance(target.net, Llama):
            raise SpecqError(f"feature draft '{draft.ref}' needs a Llama-architecture target, not '{target.ref}'")
        return FeatureDrafter(draft.net.attach(target.net), min_confidence, tree)
    if tree is not None and not isinstance(draft.net, Llama):
        raise SpecqError(f"token trees need a Llama-architecture draft on specq's own module, not '{draft.ref}'")
    return SequenceDrafter(draft, target.vocab_size, min_confidence, tree)


def for_levels(drafts: list, target, min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
               tree: TreeShape | None = None, gamma: int = DEFAULT_GAMMA):
    """A drafter for a hierarchy of loaded drafts, cheapest first: the first proposes (a tree if
    `tree`), each next one verifies what the levels below proposed (`hierarchy.py`). One draft is
    just `for_pair`; an n-gram draft can only be the first."""
    drafter = for_pair(drafts[0], target, min_confidence, tree, gamma)
    for middle in drafts[1:]:
        if isinstance(middle, NgramDraft):
            raise SpecqError("an n-gram draft can only be the first (cheapest) level of a hierarchy")
        if not isinstance(middle.net, Llama):
            raise SpecqError(f"an intermediate draft level needs a Llama-architecture model on specq's own "
                             f"module, not '{middle.ref}'")
        drafter = HierarchicalDrafter(drafter, middle, target.vocab_size)
    return drafter
