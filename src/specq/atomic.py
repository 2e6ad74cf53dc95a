"""Atomic writes: a reader (or a crash) never sees a half-written file or directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text("written by specq; `--force` may replace this folder\n")
        _publish_permissions(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / "x")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
