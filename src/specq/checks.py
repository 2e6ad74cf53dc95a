"""Shared validators: a bad value becomes one SpecqError line, before any model is loaded.

Numbers are bounded by what the machine and torch accept (a seed beyond 64 bits overflows in
torch, 99999 threads crash OpenMP); paths are checked for what would fail or destroy data
later: unreadable or non-UTF-8 input, outputs that exist, folders specq did not write.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from .errors import SpecqError

# a signed 64-bit integer: torch.Generator.manual_seed and every RNG specq seeds
MAX_SEED = 2 ** 63 - 1
MAX_THREADS = 1024  # far above any CPU's cores; OpenMP crashes on much larger pools
MAX_COUNT = 2 ** 31 - 1  # steps, prompts, tokens, ...: beyond it an int overflows a kernel's int32
MARKER = ".specq-output"  # written into every folder specq publishes (`atomic.write_dir`)


def integer(name: str, value, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """`value` as an int in [minimum, maximum] (a bool or a float is not an int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecqError(f"{name} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise SpecqError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def real(name: str, value, minimum: float = -math.inf, maximum: float = math.inf) -> float:
    """`value` as a finite float in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecqError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise SpecqError(f"{name} must be a finite number{_within(minimum, maximum)}, got {value}")
    return float(value)


def text(name: str, value) -> str:
    """A str that encodes as UTF-8 (a command line with non-UTF-8 bytes gives lone surrogates)."""
    if not isinstance(value, str):
        raise SpecqError(f"{name} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecqError(f"{name} is not valid UTF-8") from None
    return value


def read_text(path: Path | str, what: str = "file") -> str:
    """A file's text, strictly UTF-8; any failure is one line naming the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecqError(f"cannot read {what} '{path}': {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise SpecqError(f"{what} '{path}' line {line}: not valid UTF-8 (byte "
                         f"{data[e.start]:#04x})") from None


def written_by_specq(path: Path) -> bool:
    """A folder specq published: its marker, or the files of a specq model folder written
    before markers existed (a distilled draft, a quantized model, a feature draft)."""
    return any((path / name).is_file() for name in (MARKER, "distill.json", "quant_config.json",
                                                    "feature_draft.json"))


def output(path: Path | str, force: bool, what: str = "output", folder: bool = True) -> Path:
    """Refuse an output that exists (unless `force`), a folder specq did not write (even with
    `force`), a file where a folder goes or the reverse, and a location that cannot be written."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if path.is_dir() != folder:
            raise SpecqError(f"{what} '{path}' exists and is a {'file' if folder else 'folder'}; "
                             f"a {'folder' if folder else 'file'} goes there")
        if not force:
            raise SpecqError(f"{what} '{path}' exists: add --force to replace it")
        if folder and not written_by_specq(path):
            raise SpecqError(f"{what} '{path}' is a folder specq did not write: it is never "
                             "replaced; choose another path")
    writable_parent(path, what)
    return path


def writable_parent(path: Path, what: str = "output") -> None:
    """The nearest existing ancestor of `path` is a folder this process may write into."""
    parent = Path(os.path.abspath(path)).parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SpecqError(f"cannot write {what} '{path}': '{parent}' is a file, not a folder")
    try:  # a real write: permission bits do not tell for root, read-only mounts or /proc
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise SpecqError(f"cannot write {what} '{path}': '{parent}' is not writable "
                         f"({e.strerror or e})") from None


def arg_int(minimum: int = 0, maximum: int = MAX_COUNT):
    """An argparse type: an integer in [minimum, maximum]."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{value}'") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(f"must be between {minimum} and {maximum}, got "
                                             f"{value}")
        return number
    return parse


def arg_float(minimum: float = -math.inf, maximum: float = math.inf, below_maximum: bool = False):
    """An argparse type: a finite number in [minimum, maximum], or [minimum, maximum)
    with `below_maximum`."""
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got '{value}'") from None
        if (not math.isfinite(number) or not minimum <= number <= maximum
            or (below_maximum and number == maximum)):
            raise argparse.ArgumentTypeError("expected a finite "
                                             f"number{_within(minimum, maximum, below_maximum)}, "
                                             f"got '{value}'")
        return number
    return parse


def arg_path(value: str) -> str:
    """An argparse type: a path that is not empty (an empty one would mean the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return value


def _within(minimum: float, maximum: float, below_maximum: bool = False) -> str:
    if (minimum, maximum) == (-math.inf, math.inf):
        return ""
    return f" in [{minimum:g}, {maximum:g}{')' if below_maximum else ']'}"
