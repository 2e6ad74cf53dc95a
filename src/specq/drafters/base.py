"""What every drafter shares: the default gamma, and how a model draft chooses its next token. What
a drafter is (`Drafter`) and what it proposes (`Proposal`) are the loop's (`core/types.py`)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.gamma import AUTO
from ..core.sampling import SamplingConfig, probabilities, sample

# Draft tokens per step when the caller does not say: "auto", each step's length (0, plain
# decoding, up to AUTO_MAX_GAMMA) chosen from the run's measured acceptance and costs, so that
# speculation is on where it pays and off where it does not: no fixed gamma is best for every
# target, draft and text (docs/performance.md, "gamma `auto` against fixed gammas"). Sampling keeps
# a fixed gamma: the tokens a seed draws depend on the steps' lengths, and auto's follow timings, so
# a seeded request would no longer repeat its output. A tree's default is its own depth.
DEFAULT_GAMMA = AUTO
# the best fixed gamma measured with the shipped drafts (docs/benchmarks.md at 4a89039)
SAMPLING_GAMMA = 2


def default_gamma(tree, greedy: bool) -> int | str:
    """gamma when the caller gives none: a tree's (`tree.TreeShape`) own depth; for chains "auto"
    when greedy, SAMPLING_GAMMA when sampling."""
    return tree.depth if tree is not None else DEFAULT_GAMMA if greedy else SAMPLING_GAMMA


def choose(logits: Tensor, sampling: SamplingConfig, generator: torch.Generator,
           min_confidence: float) -> tuple[Tensor, Tensor | None, bool]:
    """One draft token from [1, V] logits: (token [1], its processed distribution q [1, V] or
    None when greedy, whether the draft's probability for it reaches `min_confidence`)."""
    if sampling.greedy:
        token = logits.argmax(dim=-1)
        return (token, None,
                not min_confidence or bool(logits.softmax(-1)[0, token] >= min_confidence))
    q = probabilities(logits, sampling)
    token = sample(q, generator)
    return token, q, bool(q[0, token] >= min_confidence)
