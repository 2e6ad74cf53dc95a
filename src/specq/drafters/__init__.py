"""Drafters propose tokens; the loop in `decode.py` verifies them. A drafter only needs:

    start(prompt_ids, capacity, features)   prefill its own state
    propose(seq, gamma, sampling, gen)      -> Proposal(tokens [g], probs [g, V] or None)
    rollback(length, features)              forget everything past seq[:length]

`features` are the target's final hidden states of the rows it just ran (prompt, or the accepted
rows of a verify pass) when the drafter sets `needs_target_features`, else None.

New drafters plug in without touching the loop.
"""

from ..errors import SpecqError
from ..feature_draft import FeatureDraft
from ..llama import Llama
from .base import Proposal
from .feature import FeatureDrafter
from .sequence import DEFAULT_DRAFT_CONFIDENCE, SequenceDrafter

__all__ = ["FeatureDrafter", "Proposal", "SequenceDrafter", "for_pair"]


def for_pair(draft, target, min_confidence: float = DEFAULT_DRAFT_CONFIDENCE):
    """The drafter a loaded draft model calls for: a feature draft reads the target's hidden
    states (native Llama targets only), any other draft runs as a sequence draft."""
    if isinstance(draft.net, FeatureDraft):
        if not isinstance(target.net, Llama):
            raise SpecqError(f"feature draft '{draft.ref}' needs a Llama-architecture target, not '{target.ref}'")
        return FeatureDrafter(draft.net.attach(target.net), min_confidence)
    return SequenceDrafter(draft, target.vocab_size, min_confidence)
