"""Layer-skip drafts: `MODEL@skip[=LAYERS]`, some of a model's own decoder layers as its draft
(self-speculation by skipping layers, as Draft & Verify, SWIFT and LayerSkip do), with no training
and, beside its target, no second copy of any weight.

    self@skip              the target's layers, those to skip chosen by a short calibration
                           (`skip_calibration.py`), once per model file, then cached
    self@skip=3-9+14       the target without layers 3 to 9 and 14 ('+' joins; a comma would
                           start another level of a draft hierarchy)
    self@SPEC@skip         the layers of the target's own weights at SPEC (a copy at SPEC,
                           e.g. `self@gguf-int4@skip`), chosen for that model's own output
    MODEL@skip             any model's layers, as `self@...` resolves to for its target

Beside a loaded target whose ref is MODEL's (`self@skip` resolves to the target's own ref) the draft
runs the target's modules on the target's runner's kernels (`backends.subset`), with a KV cache of
its own layers only; elsewhere MODEL loads on its own first.

The calibrated choice is kept in `$SPECQ_CACHE/layer-skip/` as a small JSON file, keyed by the
model's precision and its files' paths, sizes and modification times (a file changed in place is
calibrated again); an entry that does not read back as a valid choice is calibrated again.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import atomic, backends
from ..core.types import Model
from ..errors import SpecqError
from ..model.llama import Llama
from ..paths import cache_dir
from . import skip_calibration

SKIP = "skip"
FORM = f"{SKIP} or {SKIP}=LAYERS, the layers skipped: N or A-B joined by '+' (e.g. skip=3-9+14)"
CACHE_FORM = 1  # in the cache's key: raise it when the calibration chooses differently


@dataclass(frozen=True)
class SkipSpec:
    skipped: tuple[int, ...] | None = None  # None: chosen by calibration

    def __str__(self) -> str:
        return SKIP if self.skipped is None else f"{SKIP}={spans(self.skipped)}"


def names_skip(spec_text: str) -> bool:
    """Whether a ref's spec names a layer-skip draft (`skip`, `skip=...`)."""
    return spec_text == SKIP or spec_text.startswith(SKIP + "=")


def parse(spec_text: str) -> SkipSpec:
    """`skip` or `skip=LAYERS` -> SkipSpec; anything else one line. Whether the model has the
    layers is for `draft` to check."""
    if spec_text == SKIP:
        return SkipSpec()
    head, eq, listed = spec_text.partition("=")
    layers: set[int] = set()
    for part in listed.split("+") if head == SKIP and eq else [spec_text]:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise SpecqError(f"bad layer-skip spec '{spec_text}' (at '{part}'): {FORM}")
        layers.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return SkipSpec(tuple(sorted(layers)))


def spans(layers: tuple[int, ...]) -> str:
    """(3, 4, 5, 9) -> '3-5+9'."""
    out: list[list[int]] = []
    for i in layers:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return "+".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def draft(base: Model, spec: SkipSpec, ref: str) -> Model:
    """The model `ref` names: `base`'s layers less those `spec` skips, on `base`'s runner."""
    if not isinstance(base.net, Llama):
        raise SpecqError(f"'{ref}': a layer-skip draft runs some of a model's layers on specq's "
                         f"native decoder (the Llama family), which does not run '{base.ref}'")
    total = len(base.net.layers)
    info: dict = {}
    if spec.skipped is None:
        if total < 3:
            raise SpecqError(f"'{ref}': '{base.ref}' has {total} layers, none between the first "
                             "and the last for a calibration to skip: list those to skip (skip=N)")
        choice = chosen(base)
        kept = tuple(choice["kept"])
        info["calibration"] = {k: v for k, v in choice.items() if k != "kept"}
    else:
        if spec.skipped[-1] >= total or len(spec.skipped) == total:
            raise SpecqError(f"'{ref}': '{base.ref}' has {total} layers (0-{total - 1}); skip "
                             "some of them, not all")
        kept = tuple(i for i in range(total) if i not in spec.skipped)
    info |= {"kept_layers": list(kept), "layers": total, "skipped": spans(
        tuple(i for i in range(total) if i not in kept)) or "none"}
    return Model(ref=ref, net=base.net, tokenizer=base.tokenizer, eos_ids=base.eos_ids,
                 source=base.source, precision=base.precision, info=base.info | info,
                 runner=backends.subset(base.runner, kept))


def chosen(model: Model) -> dict:
    """The calibrated choice for `model` (`kept` layers, `agreement`, `gain`, `tokens`,
    `seconds`): the cache's, else calibrated now and cached."""
    path = cache_dir() / "layer-skip" / f"{identity(model)}.json"
    choice = _read(path, len(model.net.layers))
    if choice is not None:
        return choice
    print(f"specq: calibrating a layer-skip self draft for {model.ref} (once, cached in "
          f"{path.parent}): ", end="", file=sys.stderr, flush=True)
    found = skip_calibration.calibrate(model)
    total = len(model.net.layers)
    choice = {"kept": list(found.kept), "agreement": round(found.agreement, 4),
              "gain": round(found.gain, 4), "tokens": found.tokens,
              "seconds": round(found.seconds, 1)}
    print(f"keeps {len(found.kept)} of {total} layers "
          f"(skip={spans(tuple(i for i in range(total) if i not in found.kept))}), "
          f"agreement {found.agreement:.2f} on {found.tokens} tokens, predicted "
          f"{found.gain:.2f}x{' (no gain: other drafts may do better)' * (found.gain <= 1)}, "
          f"{found.seconds:.0f} s", file=sys.stderr, flush=True)
    atomic.write_text(path, json.dumps({"form": CACHE_FORM, "layers": total, **choice}))
    return choice


def _read(path: Path, total: int) -> dict | None:
    """A cached choice for a model of `total` layers, or None where there is none or it does not
    read as one (a damaged entry is calibrated again, never trusted)."""
    try:
        saved = json.loads(path.read_text())
        kept = saved["kept"]
        valid = (saved["form"] == CACHE_FORM and saved["layers"] == total
                 and all(type(i) is int for i in kept) and len(kept) >= 2
                 and kept == sorted(set(kept)) and 0 == kept[0] and kept[-1] == total - 1
                 and all(isinstance(saved[k], (int, float))
                         for k in ("agreement", "gain", "tokens", "seconds")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {k: saved[k] for k in ("kept", "agreement", "gain", "tokens", "seconds")} \
        if valid else None


def identity(model: Model) -> str:
    """A cache key for `model`'s weights at its precision: its source's name and a digest of the
    precision and the source's files (paths, sizes, modification times), or, for weights that no
    local file holds, of the weights themselves."""
    h = hashlib.sha256(f"{CACHE_FORM}:{model.precision}".encode())
    source = Path(model.source)
    files = (sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir()
             else [source] if source.is_file() else [])
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    if not files:
        for t in model.net.state_dict().values():
            h.update(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", source.stem or "model")[:40]
    return f"{stem}-{h.hexdigest()[:16]}"
