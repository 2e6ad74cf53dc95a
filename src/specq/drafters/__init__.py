"""Drafters propose tokens; the loop in `decode.py` verifies them. A drafter only needs:

    start(prompt_ids, capacity)             prefill its own state
    propose(seq, gamma, sampling, gen)      -> Proposal(tokens [g], probs [g, V] or None)
    rollback(length)                        forget everything past seq[:length]

New drafters plug in without touching the loop.
"""

from .base import Proposal
from .sequence import SequenceDrafter

__all__ = ["Proposal", "SequenceDrafter"]
