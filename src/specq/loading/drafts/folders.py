"""What a draft folder holds, told by the file that marks it: a feature draft's own config, a LoRA
adapter's (peft's format: a model once merged into its base, `adapter.py`), or a Hugging Face config
(a model: a sequence draft, or a target). The registry, the folder checks and
`specq drafts` read folders here, below the kinds table (`loading/kinds.py`) that loads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...model import feature_draft
from . import adapter


@dataclass(frozen=True)
class Folder:
    kind: str  # the draft kind (`kinds.KINDS`) a folder of this sort loads as
    marker: str  # the file that says so
    # specq's own format: its weight files ((): a Hugging Face folder's)
    weights: tuple[str, ...] = ()
    quantizable: bool = True  # by every method (a feature draft takes RTN only)


FEATURE = Folder("feature", feature_draft.CONFIG_FILE, (feature_draft.WEIGHTS_FILE,),
                 quantizable=False)
# at a float precision or a file's gguf-int4 only
ADAPTER = Folder("sequence", adapter.CONFIG, quantizable=False)
MODEL = Folder("sequence", "config.json")
FOLDERS = (FEATURE, ADAPTER, MODEL)  # tried in this order


def of(path: Path | str) -> Folder | None:
    """The sort of draft folder `path` is, or None (not a draft folder)."""
    return next((f for f in FOLDERS if (Path(path) / f.marker).is_file()), None)
