"""Where specq keeps what it builds once per machine: converted models, quantized weights, compiled
kernels, drafts made here (`$SPECQ_CACHE`, default ~/.cache/specq)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("SPECQ_CACHE", Path.home() / ".cache" / "specq"))
