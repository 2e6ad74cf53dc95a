from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Proposal(NamedTuple):
    tokens: Tensor  # [g] draft token ids
    probs: Tensor | None  # [g, V] processed draft distributions q (None when greedy)


EMPTY = Proposal(torch.empty(0, dtype=torch.long), None)
