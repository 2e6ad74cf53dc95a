"""Which draft to use for a target at a given precision.

A drafts directory holds `manifest.json`: entries mapping (target, target precision) to a draft
model directory (relative to the manifest, or absolute) registered for that precision, and
optionally the precision the draft itself runs at (`draft_spec`, e.g. a feature draft at
`int8-head8`). specq reads two: the drafts shipped in the package, and the user's
(`$SPECQ_CACHE/drafts`), which changes only when asked (`--register`, `specq drafts add|remove`).

Selection (`select`; docs/reference.md, "The draft registry"):
1. an entry for the target's exact precision: the user's before the shipped ones, and within a
   manifest the later entry; for a GGUF file, an entry for its file type (`Q2_K`, `Q3_K_M`: a
   draft calibrated on one such file serves every file of that model and type) before one for
   any file;
2. else a *shipped* entry of the nearest precision, with a note: the shipped drafts' use at
   precisions they were not registered for is what the docs measured, while a user's draft is
   known only at the precision it was registered for, so it never stands in for another;
3. else none (plain decoding).
"Nearest" compares quantization step sizes, 2^-bits: how far a quantized target moves from full
precision scales with its step, so int8 is near fp32, and int3 near int4, where counting bits
would have put int8 next to int4; a GGUF file's bits are its file type's (Q2_K 2, Q6_K 6, any
file without a type 4). The manifest is rewritten atomically, so a crash mid-write
leaves the old one intact.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import atomic
from ...errors import SpecqError
from ...paths import cache_dir
from . import folders

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Entry:
    target: str  # base target name, e.g. "smollm2-135m"
    precision: str  # the target precision it is registered for, e.g. "int4-g64-gptq"
    # draft directory, relative to the manifest's directory (or absolute); or a built-in's name
    draft: str
    # keyword-only: a positional dict once landed in draft_spec and made the selected ref unloadable
    # the precision the draft runs at (e.g. "int8-head8"); "": as stored
    draft_spec: str = field(default="", kw_only=True)
    # `draft` names a built-in model (e.g. a packaged GGUF file)
    builtin: bool = field(default=False, kw_only=True)
    # for a GGUF file precision: only files of this type (e.g. "Q2_K"); "": any file
    file_type: str = field(default="", kw_only=True)
    info: dict = field(default_factory=dict, compare=False, kw_only=True)


def user_dir() -> Path:
    """The user's drafts directory, which `--register` and `specq drafts add|remove` change."""
    return cache_dir() / "drafts"


def precision_bits(spec: str, file_type: str = "") -> float:
    """Weight bits of a precision spec, for 'nearest precision' (fp32 32, bf16 16, int4 4, ...); a
    GGUF file's are its `file_type`'s where known."""
    if spec in ("fp32", "bf16", "fp16"):
        return {"fp32": 32, "bf16": 16, "fp16": 16}[spec]
    if spec.split("-")[0] == "gguf":
        return file_type_bits(file_type)
    m = re.match(r"int(\d)", spec)
    if not m:
        raise SpecqError(f"unknown precision '{spec}' in the draft registry")
    return int(m.group(1))


def file_type_bits(file_type: str) -> float:
    """Bits of a GGUF file type's main blocks (`Q2_K` 2, `IQ3_XXS` 3, `TQ1_0` 1, `BF16` 16); a file
    whose type is unknown counts as 4-bit, the type most files are."""
    if file_type in ("F32", "F16", "BF16"):
        return {"F32": 32, "F16": 16, "BF16": 16}[file_type]
    m = re.match(r"T?I?Q(\d)", file_type)
    return int(m.group(1)) if m else 4


def read(directory: Path | str, required: bool = False) -> list[Entry]:
    """The entries of a drafts directory; none if it has no manifest, unless `required`."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        if required:
            raise SpecqError(f"no draft registry at {path}")
        return []
    try:
        raw = json.loads(path.read_text())
        return [Entry(**e) for e in raw["drafts"]]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SpecqError(f"draft registry {path} is corrupt ({type(e).__name__}: {e}); fix or "
                         "delete it") from None


def add(directory: Path | str, entry: Entry) -> None:
    """Add or replace the entry for (target, precision, file type, draft)."""
    _write(directory, [e for e in read(directory) if _key(e) != _key(entry)] + [entry])


def _key(e: Entry) -> tuple:
    return e.target, e.precision, e.file_type, e.draft


def register(target: str, precision: str, draft: Path | str, info: dict | None = None,
             draft_spec: str = "", file_type: str = "") -> Entry:
    """Add a draft folder to the user's registry for (target, precision[, GGUF file type]): by its
    name when it lies in the registry's folder, else by its absolute path."""
    path, home = Path(draft).resolve(), user_dir().resolve()
    entry = Entry(target, precision, path.name if path.parent == home else str(path),
                  draft_spec=draft_spec, file_type=file_type, info=info or {})
    add(user_dir(), entry)
    return entry


def remove(directory: Path | str, entries: list[Entry]) -> None:
    """Drop these entries from a drafts directory's manifest (the draft folders stay)."""
    gone = {_key(e) for e in entries}
    _write(directory, [e for e in read(directory) if _key(e) not in gone])


def _write(directory: Path | str, entries: list[Entry]) -> None:
    text = json.dumps({"drafts": [asdict(e) for e in entries]}, indent=1) + "\n"
    atomic.write_text(Path(directory) / MANIFEST, text)


def draft_path(directory: Path | str, entry: Entry) -> Path:
    """The draft folder an entry names (relative to its manifest, or absolute); a
    built-in's name as is."""
    return Path(entry.draft) if entry.builtin else Path(directory) / entry.draft


def is_draft_dir(path: Path) -> bool:
    """A folder specq can load as a draft (`folders.FOLDERS`: a model's or a feature draft's)."""
    return folders.of(path) is not None


def candidates(directory: Path | str, target: str,
               quantizable: bool = False) -> list[tuple[Path, Entry]]:
    """(draft dir, entry) of every usable entry for `target` in a drafts
    directory, in manifest order:
    the folder exists, and with `quantizable` it can be quantized by every method (a feature draft
    runs only at a float precision or with RTN weights; a built-in is what it is)."""
    return [(draft_path(directory, e), e) for e in read(directory)
            if e.target == target and (e.builtin or is_draft_dir(draft_path(directory, e)))
            and not (quantizable
                     and (e.builtin or not folders.of(draft_path(directory, e)).quantizable))]


def select(shipped: Path | str, user: Path | str, target: str, precision: str,
           quantizable: bool = False, file_type: str = "") -> tuple[Path, Entry, bool] | None:
    """(draft dir, entry, exact?) for the target at this precision (a GGUF file: of `file_type`,
    "" when unknown) by the rule in the module docstring, or None if no draft may be used."""
    exact = [c for d in (shipped, user) for c in candidates(d, target, quantizable)
             if c[1].precision == precision and c[1].file_type in ("", file_type)]
    if exact:
        path, entry = ([c for c in exact if c[1].file_type] or exact)[-1]
        return path, entry, True
    stand_ins = candidates(shipped, target, quantizable)
    if not stand_ins:
        return None
    step = 2.0 ** -precision_bits(precision, file_type)
    path, entry = min(reversed(stand_ins), key=lambda c: abs(
        2.0 ** -precision_bits(c[1].precision, c[1].file_type) - step))
    return path, entry, False
