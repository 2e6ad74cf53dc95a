"""Where specq keeps what it builds once per machine: converted models, quantized weights, compiled
kernels, drafts made here (`$SPECQ_CACHE`, default ~/.cache/specq)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("SPECQ_CACHE", Path.home() / ".cache" / "specq"))


def file_key(path: Path) -> str:
    """A cache key for what is derived from a user's file: its name, and a digest of its path, size
    and modification time (a file changed in place gets a new key)."""
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return f"{path.stem}-{digest[:12]}"
