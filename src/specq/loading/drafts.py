"""Which draft a target gets when none is named (the registries, `registry.select`), and draft
refs that name the target's own weights (`self@SPEC`)."""

from __future__ import annotations

from pathlib import Path

from . import precision, registry
from .builtins import ASSETS, SHIPPED_DRAFTS
from .refs import SELF, split_ref


def draft_dirs() -> list[Path]:
    """Draft registries: the shipped one, then the user's (drafts registered on request)."""
    return [ASSETS / "drafts", registry.user_dir()]


def select_draft(target_ref: str, quantizable: bool = False) -> tuple[str | None, str | None]:
    """(draft ref, note) for a target ref by `registry.select`'s rule: registered for the target's
    exact precision, else a shipped draft of the nearest precision (the note says so), else (None,
    note). `quantizable`: only drafts that can be quantized by every method (not feature drafts: RTN only)."""
    name, spec = split_ref(target_ref)
    spec = precision.canonical(spec)
    found = registry.select(*draft_dirs(), name, spec, quantizable)
    if found is None:
        unused = sorted({e.precision for _, e in registry.candidates(registry.user_dir(), name, quantizable)})
        return None, (f"no draft registered for {name}@{spec}: plain decoding" + (
            f" (your registry's drafts for {', '.join(unused)} are used only at those precisions: pass --draft, "
            f"or register one for {spec} with `specq drafts add`)" if unused else ""))
    path, entry, exact = found
    at = f"@{entry.draft_spec}" if entry.draft_spec else ""
    ref = (entry.draft if entry.builtin else _draft_ref(path)) + at
    if exact:
        return ref, f"draft {entry.draft}{at} (registered for {name}@{spec})"
    return ref, (f"no draft registered for {name}@{spec}; using the shipped {entry.draft}{at} "
                 f"(registered for {entry.precision}, the nearest precision)")


def known_drafts(target: str) -> set[str]:
    """Refs of every draft the registries hold for a target name, at any precision."""
    return {e.draft if e.builtin else _draft_ref(path) for d in draft_dirs() for path, e in registry.candidates(d, target)}


def _draft_ref(path: Path) -> str:
    """A shipped draft by its built-in name (portable), any other by its path."""
    return path.name if path.parent == ASSETS / "drafts" and path.name in SHIPPED_DRAFTS else str(path)


def default_draft_ref(target_ref: str, quantizable: bool = False) -> str | None:
    """The registry's draft for this target ref, or None."""
    return select_draft(target_ref, quantizable)[0]


def resolve_draft_ref(draft_ref: str, target_ref: str) -> str:
    """`self@SPEC` -> the target's own model at SPEC (QSPEC-style self-speculation: no draft to train
    or ship, the same tokenizer by construction); any other draft ref unchanged."""
    name, spec = split_ref(draft_ref)
    return f"{split_ref(target_ref)[0]}@{spec}" if name == SELF else draft_ref
