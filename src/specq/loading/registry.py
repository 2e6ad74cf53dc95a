"""Which draft to use for a target at a given precision.

A drafts directory holds `manifest.json`: entries mapping (target, target precision) to a draft
model directory (relative to the manifest) calibrated for that precision, and optionally the
precision the draft itself runs at (`draft_spec`, e.g. a feature draft at `int8-head8`, a cheaper
draft with the same acceptance, measured in docs/fastpath.md). specq reads two: the
drafts shipped in the package, and the user's (`$SPECQ_CACHE/drafts`, where `specq calibrate`
writes). Selection: the exact precision if any draft has it, else the nearest precision with a
warning. "Nearest" compares quantization step sizes, 2^-bits: how far a quantized target moves
from full precision scales with its step, so int8 (the closest to fp32 in docs/benchmarks.md,
section 1) is near fp32, and int3 near int4, where counting bits would have put int8 next to
int4. The manifest is rewritten atomically, so a crash mid-write leaves the old one intact.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import atomic
from ..errors import SpecqError
from ..model import feature_draft

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Entry:
    target: str  # base target name, e.g. "smollm2-135m"
    precision: str  # target precision spec it was calibrated on, e.g. "int4-g64-gptq"
    draft: str  # draft directory, relative to the manifest's directory
    # keyword-only: a positional dict once landed in draft_spec and made the selected ref unloadable
    draft_spec: str = field(default="", kw_only=True)  # the precision the draft runs at (e.g. "int8-head8"); "": as stored
    info: dict = field(default_factory=dict, compare=False, kw_only=True)


def precision_bits(spec: str) -> float:
    """Weight bits of a precision spec, for 'nearest precision' (fp32 32, bf16 16, int4 4, ...)."""
    if spec in ("fp32", "bf16", "fp16"):
        return {"fp32": 32, "bf16": 16, "fp16": 16}[spec]
    if spec == "gguf":  # a GGUF file at its own precision: the built-in's is Q4_1, 4-bit blocks
        return 4
    m = re.match(r"int(\d)", spec)
    if not m:
        raise SpecqError(f"unknown precision '{spec}' in the draft registry")
    return int(m.group(1))


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
        raise SpecqError(f"draft registry {path} is corrupt ({type(e).__name__}: {e}); fix or delete it") from None


def add(directory: Path | str, entry: Entry) -> None:
    """Add or replace the entry for (target, precision, draft)."""
    entries = [e for e in read(directory) if (e.target, e.precision, e.draft) != (entry.target, entry.precision, entry.draft)]
    entries.append(entry)
    text = json.dumps({"drafts": [asdict(e) for e in entries]}, indent=1) + "\n"
    atomic.write_text(Path(directory) / MANIFEST, text)


def is_draft_dir(path: Path) -> bool:
    """A model directory specq can load as a draft: Hugging Face layout or a feature draft."""
    return (path / "config.json").exists() or feature_draft.is_feature_draft(path)


def select(directories: list[Path], target: str, precision: str,
           quantizable: bool = False) -> tuple[Path, Entry, bool] | None:
    """(draft dir, entry, exact?) for the target at this precision, or None if none is known.
    Later entries win ties (the user's calibrated drafts over the shipped ones). `quantizable`
    leaves out feature drafts, which run only at a float precision or with RTN weights."""
    candidates = [(Path(d) / e.draft, e) for d in directories for e in read(d)
                  if e.target == target and is_draft_dir(Path(d) / e.draft)
                  and not (quantizable and feature_draft.is_feature_draft(Path(d) / e.draft))]
    if not candidates:
        return None
    exact = [c for c in candidates if c[1].precision == precision]
    if exact:
        path, entry = exact[-1]
        return path, entry, True
    step = 2.0 ** -precision_bits(precision)
    path, entry = min(reversed(candidates), key=lambda c: abs(2.0 ** -precision_bits(c[1].precision) - step))
    return path, entry, False
