"""Where specq keeps what it builds once per machine: converted models, quantized weights, compiled
kernels, drafts made here (`$SPECQ_CACHE`, default ~/.cache/specq)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import atomic

UNOWNED_AGE = 3600.0  # seconds untouched after which an older version's temporary is stale
# where older versions' atomic writes left their temporaries (besides the folder itself)
WRITTEN = ("drafts", "files", "gguf", "gguf-int4", "layer-skip", "quantized", "tokenizers")
_swept: set[Path] = set()


def cache_dir() -> Path:
    """The cache folder. The first call of a process for a folder also removes what interrupted
    runs left in it and in its subfolders (`atomic.sweep`): a listing of each, milliseconds."""
    root = Path(os.environ.get("SPECQ_CACHE", Path.home() / ".cache" / "specq"))
    if root not in _swept:
        _swept.add(root)
        atomic.sweep(root, UNOWNED_AGE)
        for folder in _subfolders(root):
            atomic.sweep(folder, UNOWNED_AGE if folder.name in WRITTEN else None)
    return root


def _subfolders(root: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(root)
                if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return []


def in_cache(path: Path | str) -> bool:
    """Whether `path` lies in the cache folder (what specq keeps there is stamped: `caches`)."""
    return Path(path).resolve().is_relative_to(cache_dir().resolve())


def file_key(path: Path) -> str:
    """A cache key for what is derived from a user's file: its name, and a digest of its path, size
    and modification time (a file changed in place gets a new key)."""
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return f"{path.stem}-{digest[:12]}"
