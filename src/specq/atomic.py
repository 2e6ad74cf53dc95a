"""Atomic writes: a reader (or a crash) never sees a half-written file or directory, and what an
interrupted write left behind is removed by a later run (`sweep`).

A write goes to a temporary beside its target, named `.{name}.specq-tmp-{host}-{pid}-{random}`:
the name says that specq made it, on which machine and in which process, so a later run removes
it only once that process is gone (or, from another machine, after a day untouched), never from
under a concurrent run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
TEMPORARY = re.compile(r"^\..*\.specq-tmp-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[a-z0-9_]{8}$")
# what older versions named their temporaries (no owner in the name): `.{name}.{random}`,
# `.{name}.old.{random}`; removed only from the cache (`paths.cache_dir`), an hour untouched
UNOWNED = re.compile(r"^\..+\.(old\.)?[a-z0-9_]{8}$")
FOREIGN_AGE = 24 * 3600.0  # seconds untouched after which another machine's temporary is stale


def _prefix(name: str) -> str:
    return f".{name}.specq-tmp-{HOST}-{os.getpid()}-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_permissions(path: Path) -> None:
    """mkstemp/mkdtemp create 0600/0700 entries; give results the usual 0644/0755 (less umask)."""
    mask = _umask()
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            os.chmod(root, 0o755 & ~mask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644 & ~mask)
    else:
        os.chmod(path, 0o644 & ~mask)


def write_file(path: Path | str, write: Callable[[BinaryIO], None]) -> None:
    """Call write(binary file) on a temp file beside `path`, fsync, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _publish_permissions(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path | str, text: str) -> None:
    write_file(path, lambda f: f.write(text.encode()))


def write_dir(target: Path | str, write: Callable[[Path], None]) -> None:
    """Call write(tmp_dir), then swap tmp_dir into place (replacing an existing target). The
    folder gets the `checks.MARKER` file, so a later run knows specq wrote it
    (and may replace it)."""
    from .checks import MARKER

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(target.name), dir=target.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text("written by specq; `--force` may replace this folder\n")
        _publish_permissions(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=_prefix(f"{target.name}.old"), dir=target.parent))
            os.replace(target, old / "x")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _untouched(entry: os.DirEntry) -> float:
    """Seconds since anything in `entry` (a file, or a folder and what it holds) was written."""
    newest = entry.stat(follow_symlinks=False).st_mtime
    if entry.is_dir(follow_symlinks=False):
        for root, _, files in os.walk(entry.path):
            for name in files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except OSError:
                    pass
    return time.time() - newest


def _stale(entry: os.DirEntry, unowned_age: float | None) -> bool:
    if m := TEMPORARY.match(entry.name):
        here, pid = m["host"] == HOST, int(m["pid"])
        if here and pid == os.getpid():
            return False  # this process's own write, in flight
        return (here and not _running(pid)) or _untouched(entry) > FOREIGN_AGE
    return (unowned_age is not None and UNOWNED.match(entry.name) is not None
            and _untouched(entry) > unowned_age)


def _size(entry: os.DirEntry) -> int:
    if not entry.is_dir(follow_symlinks=False):
        return entry.stat(follow_symlinks=False).st_size
    return sum(os.lstat(os.path.join(root, f)).st_size
               for root, _, files in os.walk(entry.path) for f in files)


def sweep(folder: Path, unowned_age: float | None = None) -> int:
    """Remove the temporaries of interrupted writes from `folder` (not below it): specq's whose
    process is gone, and with `unowned_age` those older versions named without an owner, untouched
    for that many seconds. Returns the bytes freed; one line on stderr says so when any were."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(".")]
    except OSError:
        return 0
    freed = 0
    for entry in entries:
        try:
            if not _stale(entry, unowned_age):
                continue
            freed += _size(entry)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            continue  # gone meanwhile (another run swept it), or not ours to remove
    if freed:
        print(f"specq: removed {freed / 2**20:,.1f} MiB of temporary files that an interrupted "
              f"run left in {folder}", file=sys.stderr, flush=True)
    return freed
