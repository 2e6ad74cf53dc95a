"""The draft a target gets when none is named, chosen by what the target has:

1. the draft registered for it (`select.select_draft`: the registries, a GGUF twin of a built-in);
2. else the smallest model specq knows (`known.py`: built-ins, registered drafts, files loaded
   before) that reads the target's tokenizer and is at most half its size: any Qwen2.5 target
   gets the 0.5B Coder file once that is installed;
3. always an n-gram lookup over the prompt and the text so far in front of it (`ngram+MODEL`), or
   the lookup alone where there is no model.

Nothing here is a promise of speed: gamma "auto" prices each route every step against plain
decoding (`core.decode.Sequence._choose`), so a route that does not pay on this text, this
machine and this precision drafts nothing, and the steps are plain. The choice reads refs and
headers only; the caller loads it, and falls back to the lookup alone if the model does not load
(`load_default`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...drafters import ngram
from ...errors import SpecqError
from ..builtins import BUILTIN_GGUF
from ..refs import draft_ref, gguf_file, model_ref
from . import known
from .select import select_draft

AUTO = "auto"  # a draft named so: this module's choice
LARGEST_SHARE = 0.5  # a model draft found by its tokenizer is at most this share of the target


@dataclass(frozen=True)
class Choice:
    ref: str  # a draft ref: `ngram+MODEL`, or `ngram`
    note: str  # one line: what was chosen and why


def choose(target_ref: str) -> Choice:
    """The default draft of a target ref (read from refs, the registries and file headers)."""
    registered, note = select_draft(target_ref)
    if registered is not None:
        return Choice(f"{ngram.NAME}+{registered}", f"{note}; an n-gram lookup first where the "
                                                    "text repeats")
    found = compatible(target_ref)
    if found is not None:
        return Choice(f"{ngram.NAME}+{found.ref}", (
            f"draft {found.ref}: no draft registered for {model_ref(target_ref).canonical()}, "
            f"and {found.ref} reads its tokenizer at {found.weight_bytes / 2**20:.0f} MiB of "
            "weights; an n-gram lookup first where the text repeats"))
    return Choice(ngram.NAME, f"{note.replace(': plain decoding', '')} and no smaller model "
                              "that reads all its tokens is known here: n-gram lookup (plain steps "
                              "where nothing repeats)")


def compatible(target_ref: str) -> known.Known | None:
    """The smallest known model that reads the target's tokenizer, has a row for each of its
    tokens (padding included) and is at most LARGEST_SHARE of its weight bytes (a draft as large as
    its target buys nothing on a CPU), or None."""
    path = weights_path(target_ref)
    if path is None:
        return None
    try:
        tokenizer, size = known.identity(path)
        tokens, _ = known.sizes(path)
    except (OSError, SpecqError):
        return None
    mine = str(path.resolve())
    fits = [m for m in known.models() if m.tokenizer == tokenizer and m.path != mine
            and m.weight_bytes <= LARGEST_SHARE * size and m.rows >= tokens]
    return min(fits, key=lambda m: m.weight_bytes, default=None)


def weights_path(target_ref: str) -> Path | None:
    """The GGUF file or model folder a target ref reads its tokenizer from (a built-in shipped as a
    GGUF file: that file, at any precision); None for a hub id or a ref that names nothing here.
    Nothing is converted or dequantized to find it."""
    name = model_ref(target_ref).name
    try:
        if name in BUILTIN_GGUF or name.endswith(".gguf"):
            return gguf_file(name)
    except (OSError, SpecqError):
        return None
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def load_default(target_ref: str, load: Callable[[str], object]) -> tuple[object, str]:
    """(the default draft loaded with `load`, the note that says what it is). A model that does
    not load as this target's draft (another vocabulary after all, a file gone) leaves the lookup
    alone, and the note says why: the default never stops a run that plain decoding would make."""
    choice = choose(target_ref)
    try:
        return draft_ref(choice.ref).for_target(target_ref).build(load), choice.note
    except SpecqError as e:
        return (draft_ref(ngram.NAME).build(load),
                f"{choice.note.split(';')[0]} did not load ({e}): n-gram lookup alone")
