"""Drafters propose tokens; the loop in `decode.py` verifies them. A drafter implements the
`Drafter` protocol (`base.py`):

    start(prompt_ids, capacity, features)   prefill its own state
    propose(seq, gamma, sampling, gen)      -> Proposal(tokens [N], parents [N],
                                            probs [N, V] or None)
    rollback(length, features, path)        keep seq[:length + 1] and the accepted
                                            path, forget the rest
    verified(choices)                       optional (`SeesVerify`): the target's argmax at
                                            every verify row, before rollback

`features` are the target's final hidden states of the rows it just ran (prompt, or the root and
accepted nodes of a verify pass) when the drafter sets `needs_target_features`, else None.

New drafters plug in without touching the loop. Which drafter a loaded draft makes for a
target is its kind's (`loading/kinds.py`: `for_pair`, `for_levels`).
"""

from ..core.types import Drafter, Proposal
from .fallback import FallbackDrafter
from .feature import FeatureDrafter
from .hierarchy import HierarchicalDrafter
from .lookahead import LookaheadDraft, LookaheadDrafter
from .ngram import NgramDraft, NgramDrafter
from .sequence import SequenceDrafter
from .tree import TreeShape

__all__ = ["Drafter", "FallbackDrafter", "FeatureDrafter", "HierarchicalDrafter", "LookaheadDraft",
           "LookaheadDrafter", "NgramDraft", "NgramDrafter", "Proposal", "SequenceDrafter",
           "TreeShape"]
