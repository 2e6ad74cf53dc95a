"""Which draft a target gets when none is named (the registries, `registry.select`; a GGUF file by
its path, the drafts of the built-in it quantizes again)."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf

from ...errors import SpecqError
from .. import file_spec, precision
from ..builtins import ASSETS, SHIPPED_DRAFTS, gguf_files_present
from ..formats.gguf_reader import Header
from ..refs import model_ref
from . import registry

# What a GGUF header says of its model apart from how the weights are quantized: the architecture's
# shape (keys under the architecture's name) and the tokenizer's (the token list itself is not read)
SHAPE_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv")
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id")
# llama.cpp's file types (`general.file_type`) by number, named as users write them ("Q2_K")
FILE_TYPES = {int(t): t.name.removeprefix("MOSTLY_").removeprefix("ALL_")
              for t in gguf.LlamaFileType if t.name != "GUESSED"}


def draft_dirs() -> list[Path]:
    """Draft registries: the shipped one, then the user's (drafts registered on request)."""
    return [ASSETS / "drafts", registry.user_dir()]


def select_draft(target_ref: str, quantizable: bool = False) -> tuple[str | None, str | None]:
    """(draft ref, note) for a target ref by `registry.select`'s rule: registered for the target's
    exact precision, else a shipped draft of the nearest precision (the note says so), else (None,
    note). `quantizable`: only drafts that can be quantized by every method (not
    feature drafts: RTN only)."""
    target = model_ref(target_ref)
    name, spec = target.name, precision.canonical(target.spec)
    kind = file_type(name) if file_spec.names_file(spec) else ""
    found = registry.select(*draft_dirs(), name, spec, quantizable, kind)
    twin = same_model(Path(name)) if found is None and name.endswith(".gguf") else None
    if twin is not None:
        found = registry.select(*draft_dirs(), twin, spec, quantizable, kind)
    if found is None:
        unused = sorted({e.precision for _, e in registry.candidates(registry.user_dir(), name,
                                                                     quantizable)})
        return None, (f"no draft registered for {name}@{spec}: plain decoding" + (
            f" (your registry's drafts for {', '.join(unused)} are used only at those precisions: "
            f"pass --draft, or register one for {spec} with `specq drafts add`)" if unused else ""))
    path, entry, exact = found
    at = f"@{entry.draft_spec}" if entry.draft_spec else ""
    ref = (entry.draft if entry.builtin else _draft_ref(path)) + at
    files = f", {entry.file_type} files" if entry.file_type else ""
    if twin is not None and exact:
        return ref, (f"draft {entry.draft}{at} (registered for {twin}@{entry.precision}{files}; "
                     f"'{name}' has {twin}'s architecture, shape and tokenizer)")
    if exact:
        return ref, f"draft {entry.draft}{at} (registered for {name}@{spec}{files})"
    mine = f"{name}@{spec}" + (f" ({kind})" if kind else "")
    owner = f"{twin}@" if twin is not None else ""
    return ref, (f"no draft registered for {mine}; using the shipped {entry.draft}{at} "
                 f"(registered for {owner}{entry.precision}{files}, the nearest precision)")


def file_type(name: str) -> str:
    """The llama.cpp file type (`general.file_type`: "Q2_K", "Q4_K_M", ...) of the GGUF file a
    target name means (a path, or a built-in's file on disk); "" when there is none or it does
    not say."""
    path = Path(name) if name.endswith(".gguf") else gguf_files_present().get(name)
    try:
        return _file_type((str(Path(path).resolve()), *_stamp(Path(path)))) if path else ""
    except OSError:
        return ""


@functools.lru_cache(maxsize=64)
def _file_type(file: tuple) -> str:
    try:
        number = Header(Path(file[0])).fields.get("general.file_type")
    except SpecqError:
        return ""
    return FILE_TYPES.get(number, "") if isinstance(number, int) else ""


def same_model(path: Path) -> str | None:
    """The built-in whose GGUF file has this file's architecture, shape and tokenizer (so its drafts
    read the same tokens; the draft's vocabulary is still checked at load), or None. Only built-ins
    whose file is already on disk count, and a file that does not parse is no one's."""
    try:
        files = [(name, str(file), *_stamp(file)) for name, file in gguf_files_present().items()]
        return _same_model((str(path.resolve()), *_stamp(path)), tuple(files))
    except OSError:
        return None


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=64)  # a server asks per request; a changed file changes the key
def _same_model(file: tuple, builtins: tuple) -> str | None:
    try:
        mine = _identity(Path(file[0]))
        return next((name for name, path, *_ in builtins if _identity(Path(path)) == mine), None)
    except SpecqError:
        return None


def _identity(path: Path) -> tuple:
    """A GGUF file's model apart from its quantization: architecture, shape keys, tokenizer keys and
    the token embedding's shape (its vocabulary size)."""
    header = Header(path)
    arch = header.fields.get("general.architecture")
    embedding = next((t.shape for t in header.tensors if t.name == "token_embd.weight"), None)
    return (arch, *(header.fields.get(f"{arch}.{key}") for key in SHAPE_KEYS),
            *(header.fields.get(key) for key in TOKENIZER_KEYS), embedding)


def known_drafts(target: str) -> set[str]:
    """Refs of every draft the registries hold for a target name, at any precision."""
    return {e.draft if e.builtin else _draft_ref(path) for d in draft_dirs()
            for path, e in registry.candidates(d, target)}


def _draft_ref(path: Path) -> str:
    """A shipped draft by its built-in name (portable), any other by its path."""
    return (path.name
            if path.parent == ASSETS / "drafts" and path.name in SHIPPED_DRAFTS else str(path))


def default_draft_ref(target_ref: str, quantizable: bool = False) -> str | None:
    """The registry's draft for this target ref, or None."""
    return select_draft(target_ref, quantizable)[0]
