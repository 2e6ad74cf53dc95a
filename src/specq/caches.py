"""Integrity stamps: what specq keeps in its cache is used as it was written, or rebuilt.

Each cache entry (a file, or a folder of files) is written with a stamp: per file its size, its
modification time and a blake2b digest of BLOCKS blocks of BLOCK bytes spread evenly over it, the
first and the last among them (the whole file when it is smaller). Checking it costs a stat and a
few MiB read, milliseconds, at every use. It catches a file deleted, truncated, emptied or
rewritten through the file system (which moves its modification time), and damage inside the
sampled blocks by any means. It does not catch bytes outside the sampled blocks changed without
the modification time moving (a disk's own decay, a write whose time was set back): the packaged
model files also record the change time, which no user can set back, and their sha256 decides
(`formats/packaged.py`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from . import atomic
from .checks import MARKER

STAMP = ".specq-stamp.json"  # in a stamped folder; beside a stamped file as `.{name}{STAMP}`
BLOCK, BLOCKS = 1 << 16, 64
HEADER_LIMIT = 100 << 20  # bytes: safetensors' own limit on a header


def sidecar(path: Path) -> Path:
    return path / STAMP if path.is_dir() else path.with_name(f".{path.name}{STAMP}")


def _sample(path: Path, size: int) -> str:
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as f:
        if size <= BLOCK * BLOCKS:
            h.update(f.read())
        else:
            for i in range(BLOCKS):
                f.seek(i * (size - BLOCK) // (BLOCKS - 1))
                h.update(f.read(BLOCK))
    return h.hexdigest()


def file_stamp(path: Path, ctime: bool = False) -> dict:
    """A file's size, modification time (and with `ctime` its change time) and sampled digest."""
    st = path.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if ctime:
        stamp["ctime_ns"] = st.st_ctime_ns
    return stamp | {"sample": _sample(path, st.st_size)}


def _files(path: Path) -> dict[str, Path]:
    if not path.is_dir():
        return {path.name: path}
    return {f.relative_to(path).as_posix(): f for f in sorted(path.rglob("*"))
            if f.is_file() and f.name not in (STAMP, MARKER)}  # the marker: `atomic.write_dir`'s


def stamp(path: Path, ctime: bool = False) -> None:
    """Record the entry at `path` as it is now."""
    files = {name: file_stamp(f, ctime) for name, f in _files(path).items()}
    atomic.write_text(sidecar(path), json.dumps({"files": files}, indent=1) + "\n")


def saved_stamp(path: Path) -> dict | None:
    """The stamps recorded for the entry at `path` by file name, or None (none, or unreadable)."""
    try:
        files = json.loads(sidecar(path).read_text())["files"]
        return files if isinstance(files, dict) and files else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def difference(name: str, was: dict, now: dict) -> str | None:
    """What differs between two stamps of the file `name`, as a phrase, or None."""
    if now["size"] != was.get("size"):
        return f"{name} holds {now['size']:,} bytes, not the {was.get('size', 0):,} written"
    if now["sample"] != was.get("sample"):
        return f"{name}'s bytes differ from those written"
    if now["mtime_ns"] != was.get("mtime_ns") or now.get("ctime_ns") != was.get("ctime_ns"):
        return f"{name} was changed after specq wrote it"
    return None


def damage(path: Path, required: tuple[str, ...] = ()) -> str | None:
    """None when the cache entry at `path` is as specq wrote it, else what is wrong, as a phrase.
    An entry with no stamp (written by an older version) is checked for its shape instead
    (`shape`) and stamped when it passes."""
    if not path.exists():
        return "missing"
    saved = saved_stamp(path)
    if saved is None:
        if (why := shape(path, required)) is None:
            try:
                stamp(path)
            except OSError:
                pass  # a read-only cache: checked for its shape again next time
        return why
    for name in [*required, *saved]:
        f = path / name if path.is_dir() else path
        try:
            if name not in saved or (why := difference(name, saved[name],
                                                       file_stamp(f, "ctime_ns" in saved[name]))):
                return why or f"{name} was not written with it"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as e:
            return f"{name} cannot be read ({e.strerror})"
    return None


def shape(path: Path, required: tuple[str, ...] = ()) -> str | None:
    """What is wrong with an entry's files as files (the `required` ones missing or holding
    nothing, JSON that does not parse, safetensors shorter or longer than their headers say), or
    None."""
    files = _files(path)
    for name in required:
        if name not in files:
            return f"{name} is missing"
    for name, f in files.items():
        try:
            if f.suffix == ".json":
                if not json.loads(f.read_text()) and name in required:
                    return f"{name} holds no data"
            elif f.suffix == ".safetensors" and (why := _safetensors(f)):
                return f"{name} {why}"
        except (OSError, ValueError):
            return f"{name} cannot be read or parsed"
    return None


def _safetensors(path: Path) -> str | None:
    """What is wrong with a safetensors file's length against its header (truncation is its
    common damage), or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(size - 8, HEADER_LIMIT):
            return "is not a safetensors file"
        header = json.loads(f.read(n))
    try:
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (KeyError, TypeError, IndexError, AttributeError):
        return "is not a safetensors file"
    return None if 8 + n + end == size else (f"holds {size:,} bytes where its header says "
                                             f"{8 + n + end:,}")


def usable(path: Path, required: tuple[str, ...] = ()) -> bool:
    """Whether the cache entry at `path` can be used as it is; a damaged one (not a missing one)
    is said on stderr, in one line, to be rebuilt, as the caller then does."""
    why = damage(path, required)
    if why is not None and why != "missing":
        print(f"specq: the cache entry {path} is damaged ({why}); rebuilding it",
              file=sys.stderr, flush=True)
    return why is None


def write_dir(target: Path, write: Callable[[Path], None]) -> None:
    """`atomic.write_dir`, the folder stamped before it is published."""
    atomic.write_dir(target, lambda tmp: (write(tmp), stamp(tmp)))


def write_file(path: Path, write: Callable[[BinaryIO], None], ctime: bool = False) -> None:
    """`atomic.write_file`, then the file stamped (with its change time when `ctime`)."""
    atomic.write_file(path, write)
    stamp(path, ctime)
