"""The models specq knows on this machine, and which tokenizer each reads: where a target with no
registered draft finds one (`default.py`).

Known are the built-ins' files already on disk, the drafts of the registries, and every GGUF file
or model folder loaded before (`remember`, kept in `$SPECQ_CACHE/known_models.json`, the most
recent MAX_REMEMBERED). A model's tokenizer is told by its vocabulary: the token strings in id
order, a file's trailing padding tokens left out (a Qwen2.5 7B file pads its list to 152,064, a
0.5B file to 151,936: the same tokenizer), hashed. What a file's identity and size are is cached by
its path, size and modification time, so a file changed in place is read again.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ... import atomic
from ...errors import SpecqError
from ...paths import cache_dir
from ..builtins import ASSETS, SHIPPED_DRAFTS, gguf_files_present
from ..formats.gguf_reader import Header
from . import folders, registry

KNOWN = "known_models.json"
MAX_REMEMBERED = 64
PADDING = re.compile(r"\[PAD\d+\]|<pad_\d+>|<\|PAD_\d+\|>")  # filler after a vocabulary's tokens
WEIGHTS = ("*.safetensors", "*.bin", "*.gguf", "*.pt")
_lock = threading.Lock()


@dataclass(frozen=True)
class Known:
    """A model specq can load by `ref`, the tokenizer it reads, and the bytes of its weights (what
    a step reads: on a CPU its cost)."""

    ref: str
    path: str  # resolved: one model known twice (a built-in, a file named by its path) is one
    tokenizer: str
    weight_bytes: int
    tokens: int  # its token list's length, padding included
    rows: int  # its embedding's rows: the tokens it can read (a draft must read all its target's)


def identity(path: Path) -> tuple[str, int]:
    """(tokenizer identity, weight bytes) of a GGUF file or a model folder; cached by stamp."""
    return _looked_up(path)[:2]


def sizes(path: Path) -> tuple[int, int]:
    """(tokens, embedding rows) of a GGUF file or a model folder; cached by stamp. Two files of
    one tokenizer may pad it to different lengths (Qwen2.5's 0.5B-3B files to 151,936, its 7B to
    152,064): a draft must have a row for each of its target's tokens."""
    return _looked_up(path)[2:]


def _looked_up(path: Path) -> tuple[str, int, int, int]:
    with _lock:
        table = _read()
        before = dict(table)
        found = _identity(table, Path(path))
        if table != before:
            _write(table)
    return found


def remember(ref: str, path: Path) -> None:
    """Note a GGUF file or model folder that loaded, under the ref it loaded by: a later target
    with its tokenizer may draft with it. Best effort: a cache that cannot be written is skipped."""
    try:
        with _lock:
            table = _read()
            _identity(table, Path(path))
            key = str(Path(path).resolve())
            table[key] = table.pop(key) | {"ref": ref}  # the most recent last
            named = [k for k, v in table.items() if v.get("ref")]
            for old in named[:-MAX_REMEMBERED]:
                del table[old]
            _write(table)
    except (OSError, SpecqError):
        pass


def models() -> list[Known]:
    """Every model known here with a readable tokenizer: the registries' drafts, the built-ins'
    files on disk, the models loaded before; each path once (the first ref found)."""
    found, seen = [], set()
    files = gguf_files_present()
    for directory in (ASSETS / "drafts", registry.user_dir()):
        try:
            entries = registry.read(directory)
        except SpecqError:
            continue
        for e in entries:
            if not e.builtin and folders.of(registry.draft_path(directory, e)) != folders.MODEL:
                continue  # a feature draft or an adapter drafts only for its own target
            path = files.get(e.draft) if e.builtin else registry.draft_path(directory, e)
            name = e.draft if e.builtin or e.draft in SHIPPED_DRAFTS else str(path)
            ref = name + (f"@{e.draft_spec}" if e.draft_spec else "")
            if path is not None:
                found.append((ref, Path(path)))
    found += [(f"{name}@gguf", path) for name, path in files.items()]  # the file, as it is
    out = []
    with _lock:
        table = _read()
        before = dict(table)
        found += [(v["ref"], Path(k)) for k, v in table.items() if v.get("ref")]
        for ref, path in found:
            try:
                key = str(path.resolve())
                if key in seen:
                    continue
                seen.add(key)
                out.append(Known(ref, key, *_identity(table, path)))
            except (OSError, SpecqError):
                continue  # gone or unreadable since: not a candidate
        if table != before:
            _write(table)
    return out


def _identity(table: dict, path: Path) -> tuple[str, int, int, int]:
    """(tokenizer identity, weight bytes, tokens, rows) from the table read; a model changed or
    new (or noted by an older specq, without its sizes) gets a new entry (the table is written
    back only when one did)."""
    path = path.resolve()
    stamp = _stamp(path)
    entry = table.get(str(path))
    if entry is None or entry.get("stamp") != stamp or "rows" not in entry:
        tokens = _tokens(path)
        entry = table[str(path)] = {"stamp": stamp, "tokenizer": _vocabulary_hash(tokens),
                                    "bytes": _weight_bytes(path), "tokens": len(tokens),
                                    "rows": _rows(path, len(tokens)),
                                    "ref": (entry or {}).get("ref")}
    return entry["tokenizer"], entry["bytes"], entry["tokens"], entry["rows"]


def _stamp(path: Path) -> list[int]:
    """What changes when the model changes: a file's size and time, a folder's tokenizer's and
    weights' (the newest)."""
    files = [path] if path.is_file() else [f for f in _weight_files(path)] + [
        f for f in (path / "tokenizer.json", path / "tokenizer.model") if f.is_file()]
    if not files:
        raise SpecqError(f"'{path}' holds no model files")
    stats = [f.stat() for f in files]
    return [sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats)]


def _weight_files(folder: Path) -> list[Path]:
    return [f for pattern in WEIGHTS for f in folder.glob(pattern)]


def _weight_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size
                                                          for f in _weight_files(path))


def _tokens(path: Path) -> list[str]:
    return Header(path).strings("tokenizer.ggml.tokens") if path.is_file() else \
        _folder_tokens(path)


def _rows(path: Path, tokens: int) -> int:
    """A model's embedding rows: a GGUF file's token list (its header checks says they match), a
    folder's config.json vocab_size (its tokenizer may list fewer: the rest is padding)."""
    if path.is_file():
        return tokens
    try:
        return int(json.loads((path / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return tokens


def _vocabulary_hash(tokens: list[str]) -> str:
    """A hash of the token strings in id order, trailing padding left out."""
    tokens = list(tokens)
    while tokens and (not tokens[-1] or PADDING.fullmatch(tokens[-1])):
        tokens.pop()
    digest = hashlib.sha256()
    for token in tokens:
        digest.update(token.encode() + b"\0")
    return digest.hexdigest()[:32]


def _folder_tokens(folder: Path) -> list[str]:
    """A Hugging Face folder's tokens in id order, from its tokenizer.json (vocabulary and added
    tokens); an id no token has is an empty string."""
    file = folder / "tokenizer.json"
    try:
        data = json.loads(file.read_text())
        vocab = data["model"]["vocab"]
        pairs = (vocab.items() if isinstance(vocab, dict)
                 else ((piece, i) for i, (piece, *_) in enumerate(vocab)))
        ids = dict(pairs) | {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise SpecqError(f"'{folder}' has no readable tokenizer.json") from None
    tokens = [""] * (max(ids.values(), default=-1) + 1)
    for token, i in ids.items():
        tokens[i] = token
    return tokens


def _read() -> dict:
    """The table, its entries that do not read as entries left out (damaged: seen again)."""
    try:
        table = json.loads((cache_dir() / KNOWN).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or damaged: rebuilt as models are seen
    return ({k: v for k, v in table.items() if _entry(v)} if isinstance(table, dict) else {})


def _entry(v) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("tokenizer"), str)
            and isinstance(v.get("bytes"), int) and isinstance(v.get("ref"), (str, type(None)))
            and all(isinstance(v.get(k, 0), int) for k in ("tokens", "rows")))


def _write(table: dict) -> None:
    try:
        atomic.write_text(cache_dir() / KNOWN, json.dumps(table, indent=1) + "\n")
    except OSError:
        pass
