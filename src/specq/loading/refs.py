"""Refs as users write them, parsed once into the types the rest of specq asks.

A model ref is `NAME[@SPEC][:window=W]`: NAME a built-in, a local folder, a `.gguf` file or a hub
id (in a draft also `self`: the target's own weights at SPEC); SPEC a precision (`fp32`, `int8`,
`int4-g64-gptq`, ...) or a GGUF file's own blocks with options (`gguf[-int4][-head32k]`,
`file_spec`); a window W makes a model draft read only the prompt's last W tokens. In a draft,
`MODEL@skip[=LAYERS]` is some of MODEL's own layers (`layer_skip`; MODEL a model ref without a
window, e.g. `self`, `self@gguf-int4`). A draft ref is
one level or several joined by commas, cheapest first (a hierarchy): a level is a model ref or, as
the first level only, an n-gram draft `ngram[:n=N|n=MIN-MAX][:k=K][:c=C][+MODEL]` (prompt lookup;
`+MODEL`: a model draft on the steps with no match); or, alone, a lookahead draft
`lookahead[:w=W][:n=N][:g=G]` (the target's own Jacobi guesses, no model).

Parsing reads the text (and, for an adapter folder, which precision it defaults to); `check_ref`
also reads a local folder's files, so a bad ref fails before any model loads. `resolve` and
`gguf_file` say where a model's weights are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..drafters import lookahead
from ..drafters.lookahead import LookaheadDraft
from ..drafters.ngram import DEFAULT_COPY, DEFAULT_K, DEFAULT_N_MAX, DEFAULT_N_MIN, NAME, NgramDraft
from ..errors import SpecqError
from . import file_spec, layer_skip, precision
from .builtins import BUILTIN_GGUF, BUILTINS, PACKAGED_GGUF
from .drafts import adapter
from .formats import validate
from .formats.gguf_load import float_dir

FILE_PRECISION = precision.FILE_PRECISION  # `name@gguf`: run a GGUF file's own quantized tensors
SELF = "self"  # the draft ref `self@SPEC`: the target's own weights at SPEC (self-speculation)
WINDOW = ":window="  # MODEL:window=W, a model draft that reads only the prompt's last W tokens
WINDOW_APPLIES = "a window applies to model drafts (a model, self@SPEC), not to {}"
NGRAM_ABOUT = "an n-gram draft (prompt lookup, no model)"
LOOKAHEAD_ABOUT = "a lookahead draft (the target's own Jacobi guesses, no model)"


@dataclass(frozen=True)
class ModelRef:
    """A model as a ref names it. Why a window: a draft model pays for its own prefill of the whole
    prompt, a cost plain decoding does not have; a draft that reads only the prompt's end drafts
    from less context for a fraction of that cost, and since the target verifies every token the
    output is the same."""

    text: str  # as written: a loaded model's `ref`
    name: str
    spec: str  # the precision as written, else the name's own (`default_precision`)
    window: int | None = None

    @property
    def is_self(self) -> bool:
        """Whether it names the target's own weights (`self@SPEC`, `self...@skip`)."""
        return self.name == SELF or (self.skips is not None and self.skips.is_self)

    @property
    def skips(self) -> ModelRef | None:
        """The model whose layers a layer-skip draft (`MODEL@skip...`) runs; None for other refs."""
        return model_ref(self.name) if layer_skip.names_skip(self.spec) else None

    @property
    def has_spec(self) -> bool:
        """Whether the ref gives its precision (`@SPEC`) rather than taking the name's own."""
        return "@" in self.base

    @property
    def base(self) -> str:
        """The ref without its window (what loads)."""
        return self.text if self.window is None else self.text.rpartition(WINDOW)[0]

    @property
    def parsed_spec(self):
        """The spec parsed: a `file_spec.FileSpec` (a GGUF file's own blocks), a
        `layer_skip.SkipSpec` (its model's own spec checked too) or a quant spec."""
        if self.skips is not None:
            self.skips.parsed_spec  # noqa: B018 (a bad spec is an error here)
            return layer_skip.parse(self.spec)
        if file_spec.names_file(self.spec):
            return file_spec.parse(self.spec)
        return precision.parse(self.spec)

    def for_target(self, target: str) -> ModelRef:
        """`self@SPEC` as the target's own model at SPEC (QSPEC-style self-speculation: no draft to
        train or ship, the same tokenizer by construction); `self@skip` as the target's own ref
        `TARGET@skip` (its layers, beside it: `layer_skip`); any other ref as it is."""
        if not self.is_self:
            return self
        if self.skips is not None:
            base = target if self.name == SELF else self.skips.for_target(target).text
            return ModelRef(f"{base}@{self.spec}{self._window}", base, self.spec, self.window)
        name = split_ref(target)[0]
        return ModelRef(f"{name}@{self.spec}{self._window}", name, self.spec, self.window)

    def canonical(self, spec: str | None = None) -> str:
        """`name@spec` at `spec` when given, else at its own, spelled canonically; its window (a
        layer-skip draft: its model's at `spec`)."""
        if self.skips is not None:
            base = self.name if self.name == SELF else self.skips.canonical(spec)
            return f"{base}@{layer_skip.parse(self.spec)}{self._window}"
        return f"{self.name}@{precision.canonical(spec or self.spec)}{self._window}"

    @property
    def _window(self) -> str:
        return "" if self.window is None else f"{WINDOW}{self.window}"


@dataclass(frozen=True)
class NgramRef:
    """An n-gram draft as a ref names it: its n and k (`draft`, no fallback yet) and the model
    draft that proposes where nothing matches."""

    text: str
    draft: NgramDraft
    fallback: ModelRef | None = None

    def for_target(self, target: str) -> NgramRef:
        """Spelled canonically (`ngram` -> `ngram:n=2-3:k=4:c=16`), a fallback `self@SPEC`
        resolved."""
        fallback = None if self.fallback is None else self.fallback.for_target(target)
        text = self.draft.ref + ("" if fallback is None else "+" + fallback.text)
        return NgramRef(text, self.draft, fallback)

    def canonical(self, spec: str | None = None) -> str:
        """Spelled canonically, its fallback at `spec` when given (an n-gram has no precision)."""
        fallback = self.fallback
        return self.draft.ref + ("" if fallback is None else "+" + fallback.canonical(spec))


@dataclass(frozen=True)
class LookaheadRef:
    """A lookahead draft as a ref names it. It has no fallback: it always proposes."""

    text: str
    draft: LookaheadDraft
    fallback = None

    def for_target(self, target: str) -> LookaheadRef:
        """Spelled canonically (`lookahead` -> `lookahead:w=4:n=3:g=3`)."""
        return LookaheadRef(self.draft.ref, self.draft)

    def canonical(self, spec: str | None = None) -> str:
        """Spelled canonically (a lookahead draft has no precision)."""
        return self.draft.ref


Level = ModelRef | NgramRef | LookaheadRef


@dataclass(frozen=True)
class DraftRef:
    """A draft as a ref names it: its levels, cheapest first (several: a hierarchy, each level
    verifying what the ones below proposed; an n-gram level only first)."""

    text: str
    levels: tuple[Level, ...]

    @property
    def lookup(self) -> NgramRef | LookaheadRef | None:
        """The level that loads no model of its own (an n-gram draft, always the first level, or a
        lookahead draft, always alone), or None."""
        return self.levels[0] if isinstance(self.levels[0], (NgramRef, LookaheadRef)) else None

    @property
    def lookup_alone(self) -> bool:
        """One draft without a model (an n-gram draft alone, a lookahead draft): its own k or
        shape is the draft length, it has no early stop."""
        return len(self.levels) == 1 and self.lookup is not None and self.lookup.fallback is None

    @property
    def grows_trees(self) -> bool:
        """Whether the lowest level has a model to grow token trees (a lookup proposes chains, a
        lookahead draft its own trees)."""
        return self.lookup is None or self.lookup.fallback is not None

    @property
    def models(self) -> list[ModelRef]:
        """The model refs among the levels, cheapest first (an n-gram level's fallback)."""
        out = [level.fallback if isinstance(level, (NgramRef, LookaheadRef)) else level
               for level in self.levels]
        return [model for model in out if model is not None]

    def for_target(self, target: str) -> DraftRef:
        """Each `self@SPEC` resolved for the target ref and each n-gram level spelled canonically:
        one name per configuration."""
        levels = tuple(level.for_target(target) for level in self.levels)
        return DraftRef(",".join(level.text for level in levels), levels)

    def build(self, load: Callable[[str], object]):
        """What `generate` takes: a model, an `NgramDraft`, a `LookaheadDraft`, or a list of
        levels (a hierarchy);
        `load` turns each model ref (its text) into a loaded model or draft."""
        out = []
        for level in self.levels:
            if isinstance(level, ModelRef):
                out.append(load(level.text))
            else:
                out.append(level.draft if level.fallback is None else
                           replace(level.draft, fallback=load(level.fallback.text)))
        return out[0] if len(out) == 1 else out


def model_ref(text: str) -> ModelRef:
    """A model ref's parts, checked as text (`check_ref` also reads a local folder)."""
    if not isinstance(text, str):
        raise SpecqError(f"a model reference is a string (a name, a path or a hub id), "
                         f"got {type(text).__name__}")
    base, window = split_window(text)
    name, spec = split_ref(base.strip())
    if not name:
        raise SpecqError(f"empty model reference '{base}'")
    if layer_skip.names_skip(spec):
        inner = model_ref(name)
        if inner.skips is not None or inner.window is not None:
            raise SpecqError(f"'{text}': a layer-skip draft is MODEL@{layer_skip.FORM.split()[0]}"
                             "[=LAYERS] with MODEL a model without a window or skip of its own")
    return ModelRef(text, name, spec, window)


def split_window(text: str) -> tuple[str, int | None]:
    """`MODEL:window=W` -> (MODEL, W); any other text -> (text, None)."""
    base, sep, value = text.rpartition(WINDOW)
    if not sep:
        return text, None
    if not (value.isascii() and value.isdigit() and int(value) > 0 and base.strip()):
        raise SpecqError(f"draft '{text}': write MODEL{WINDOW}W with W a whole number of tokens "
                         "above 0")
    return base, int(value)


def names_ngram(text: str) -> bool:
    """Whether a level names an n-gram draft (with or without options, precision or fallback)."""
    return text == NAME or text.startswith((NAME + ":", NAME + "+", NAME + "@"))


def ngram_ref(text: str) -> NgramRef | None:
    """`ngram[:n=N|n=MIN-MAX][:k=K][:c=C][+MODEL]` parsed (`n=N` matches down to 2 tokens, N if
    smaller; `c=0`: no copy route), or None when the text names no n-gram draft."""
    if not names_ngram(text):
        return None
    own, plus, fallback = text.partition("+")
    if plus and not fallback.strip():
        raise SpecqError(f"draft '{text}': give a model draft after '+' (ngram+MODEL)")
    if names_lookahead(fallback):
        raise SpecqError(f"draft '{text}': the draft after '+' is a model draft, not "
                         f"{LOOKAHEAD_ABOUT}")
    name, *options = own.split(":")
    if name != NAME:
        raise SpecqError(f"draft '{text}': an n-gram draft has no precision; "
                         f"write {NAME}[:n=N][:k=K]")
    values = _options(text, options, NGRAM_ABOUT, ("n", "k", "c"), "n=N or n=MIN-MAX, k=K, c=C")
    n_min, n_max = DEFAULT_N_MIN, DEFAULT_N_MAX
    if "n" in values:
        low, dash, high = values["n"].partition("-")
        n_max = _whole(text, "n", high if dash else low)
        n_min = _whole(text, "n", low) if dash else min(DEFAULT_N_MIN, n_max)
    k = _whole(text, "k", values["k"]) if "k" in values else DEFAULT_K
    copy = _whole(text, "c", values["c"]) if "c" in values else DEFAULT_COPY
    try:
        draft = NgramDraft(n_max, n_min, k, copy=copy)
    except SpecqError as e:
        raise SpecqError(f"draft '{text}': {e}") from None
    return NgramRef(text, draft, model_ref(fallback) if fallback else None)


def names_lookahead(text: str) -> bool:
    """Whether a level names a lookahead draft (with or without options, precision or model)."""
    name = lookahead.NAME
    return text == name or text.startswith((name + ":", name + "+", name + "@"))


def lookahead_ref(text: str) -> LookaheadRef | None:
    """`lookahead[:w=W][:n=N][:g=G]` parsed, or None when the text names no lookahead draft."""
    if not names_lookahead(text):
        return None
    usage = f"write {lookahead.NAME}[:w=W][:n=N][:g=G]"
    if "+" in text:
        raise SpecqError(f"draft '{text}': a lookahead draft always proposes, it takes no model "
                         f"after '+'; {usage}")
    name, *options = text.split(":")
    if name != lookahead.NAME:
        raise SpecqError(f"draft '{text}': a lookahead draft has no precision; {usage}")
    values = _options(text, options, LOOKAHEAD_ABOUT, ("w", "n", "g"), "w=W, n=N, g=G")
    numbers = {key: _whole(text, key, value) for key, value in values.items()}
    try:
        draft = LookaheadDraft(**numbers)
    except SpecqError as e:
        raise SpecqError(f"draft '{text}': {e}") from None
    return LookaheadRef(text, draft)


def free_ref(text: str) -> NgramRef | LookaheadRef | None:
    """A draft that loads no model of its own (an n-gram draft, maybe with a model fallback, or a
    lookahead draft) parsed, or None when the text names a model."""
    return lookahead_ref(text) or ngram_ref(text)


def _options(text: str, options: list[str], about: str, keys: tuple[str, ...],
             listing: str) -> dict[str, str]:
    """`key=value` options of a draft with no model, each of `keys` at most once."""
    values: dict[str, str] = {}
    for option in options:
        key, eq, value = option.partition("=")
        if f":{key}=" == WINDOW:
            raise SpecqError(f"'{text}': " + WINDOW_APPLIES.format(about))
        if key not in keys or not eq:
            raise SpecqError(f"draft '{text}': unknown option '{option}' (options: {listing})")
        if key in values:
            raise SpecqError(f"draft '{text}': option '{key}' given twice")
        values[key] = value
    return values


def _whole(text: str, key: str, value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise SpecqError(f"draft '{text}': {key} must be a whole number"
                         + " or MIN-MAX" * (key == "n") + f", got '{value}'")
    return int(value)


def level(text: str) -> Level:
    """One level of a draft ref: an n-gram or lookahead draft, or a model ref."""
    lookup = free_ref(text) if isinstance(text, str) else None
    return model_ref(text) if lookup is None else lookup


def draft_ref(text: str) -> DraftRef:
    """A draft ref's levels, cheapest first, each checked as text."""
    if not isinstance(text, str):
        model_ref(text)  # raises: says what a ref is
    levels = []
    for i, part in enumerate(text.split(",")):
        if not part.strip():
            raise SpecqError(f"draft '{text}': an empty level")
        if i and re.fullmatch(r"\d+(-\d+)?", part.strip()) and isinstance(levels[-1], ModelRef) \
                and levels[-1].skips is not None:
            raise SpecqError(f"draft '{text}': join the layers a layer-skip draft skips with '+' "
                             "(skip=3-9+14); a comma starts another level")
        levels.append(level(part))
        if i and isinstance(levels[-1], NgramRef):
            raise SpecqError(f"draft '{text}': an n-gram draft can only be the first (cheapest) "
                             "level")
        if isinstance(levels[-1], LookaheadRef) and "," in text:
            raise SpecqError(f"draft '{text}': {LOOKAHEAD_ABOUT} is a draft alone, not a level "
                             "of a hierarchy")
    return DraftRef(text, tuple(levels))


def split_ref(ref: str) -> tuple[str, str]:
    """`name@spec` -> (name, spec); an `@` with nothing after it is an error. Without a spec a GGUF
    file (a `.gguf` path, or a built-in shipped as one alone) runs at its own precision, anything
    else at fp32."""
    name, sep, spec = ref.rpartition("@")
    if sep and not spec.strip():
        raise SpecqError(f"'{ref}' ends in '@' with no precision after it: give one (e.g. "
                         f"{name or 'NAME'}@int8) or leave the '@' out")
    return (name, spec) if sep else (ref, default_precision(ref))


def default_precision(name: str) -> str:
    """A GGUF file's own precision, an adapter's base's (on a file: its 4-bit body, which can hold
    the merged weights), else fp32."""
    if name not in BUILTINS and adapter.is_adapter(name):  # a built-in name is never a folder
        base = default_precision(adapter.base_ref(name))
        return f"{FILE_PRECISION}-int4" if base == FILE_PRECISION else base
    return FILE_PRECISION if name in PACKAGED_GGUF or name.endswith(".gguf") else "fp32"


def check_ref(ref: str | ModelRef) -> None:
    """What loading checks before reading any weights: the ref's form, its precision and a local
    folder's files (`validate.check_dir`), so a bad ref fails before another model loads."""
    ref = ref if isinstance(ref, ModelRef) else model_ref(ref)
    ref.parsed_spec  # noqa: B018 (a bad spec is an error here)
    if ref.skips is not None:
        if ref.name != SELF:
            check_ref(ref.skips)
        return
    if ref.is_self:
        return
    path = Path(ref.name).expanduser()
    names_model(ref.name)
    if ref.name not in BUILTINS and path.is_dir():
        validate.check_dir(path)
        if adapter.is_adapter(path):  # its base is checked as a ref of its own
            check_adapter_precision(ref.name, ref.spec)
            check_ref(adapter.base_ref(path))


def names_model(name: str) -> None:
    """That a name can name a model, from the name and what is at its path (nothing is read): a
    built-in, a local folder, a `.gguf` file or a hub id (org/name, left to the hub)."""
    path = Path(name).expanduser()
    if name in BUILTINS:
        return
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecqError(f"GGUF file not found: {path}")
        return
    if path.is_dir():
        return
    if path.exists():
        raise SpecqError(f"'{path}' is neither a model directory nor a .gguf file")
    if "/" in name and not name.startswith((".", "/", "~")):
        return
    raise SpecqError(f"unknown model '{name}': not a built-in ({', '.join(BUILTINS)}), "
                     "a local directory, a .gguf file or a hub id (org/name)")


def check_adapter_precision(name: str, spec: str) -> None:
    """An adapter merges into float weights or a GGUF file's 4-bit body; no other spec holds it."""
    if file_spec.names_file(spec):
        if not file_spec.parse(spec).int4:
            raise SpecqError(f"adapter '{name}' changes the weights of its GGUF base, whose own "
                             "blocks cannot hold them: load it at gguf-int4 (the default), with "
                             "any other option after it, or at fp32")
    elif not precision.parse(spec).is_float:
        raise SpecqError(f"adapter '{name}': load it at a float precision (fp32, bf16) or, on a "
                         f"GGUF file, at gguf-int4; not at {precision.parse(spec)}")


def resolve(name: str) -> Path | str:
    """A local directory holding the model, or the hub id itself."""
    names_model(name)
    path = Path(name).expanduser()
    if name in BUILTINS:
        return BUILTINS[name]()
    if path.suffix == ".gguf":
        return float_dir(path)
    if path.is_dir():
        validate.check_dir(path)
        return path
    return name  # a hub id


def gguf_file(name: str) -> Path:
    """The GGUF file a `name@gguf` ref runs: a built-in shipped as one, or a `.gguf` path."""
    if name in BUILTIN_GGUF:
        return BUILTIN_GGUF[name]()
    if not name.endswith(".gguf"):
        raise SpecqError(f"'@{FILE_PRECISION}' runs a GGUF file at its own precision; '{name}' is "
                         "not a .gguf file or a built-in shipped as one "
                         f"({', '.join(BUILTIN_GGUF)})")
    path = Path(name).expanduser()
    if not path.is_file():
        raise SpecqError(f"GGUF file not found: {path}")
    return path
