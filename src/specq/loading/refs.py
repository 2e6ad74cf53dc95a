"""Model references as users write them: `name@spec`, where name is a built-in, a local folder,
a `.gguf` file or a hub id, checked before any weights load and resolved to where the weights are."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecqError
from . import adapter, file_spec, precision, validate
from .builtins import BUILTIN_GGUF, BUILTINS, PACKAGED_GGUF
from .gguf_load import float_dir

FILE_PRECISION = precision.FILE_PRECISION  # `name@gguf`: run a GGUF file's own quantized tensors
SELF = "self"  # the draft ref `self@SPEC`: the target's own weights at SPEC (self-speculation)


def split_ref(ref: str) -> tuple[str, str]:
    """`name@spec` -> (name, spec); an `@` with nothing after it is an error. Without a spec a GGUF
    file (a `.gguf` path, or a built-in shipped as one alone) runs at its own precision, anything
    else at fp32."""
    name, sep, spec = ref.rpartition("@")
    if sep and not spec.strip():
        raise SpecqError(f"'{ref}' ends in '@' with no precision after it: give one (e.g. {name or 'NAME'}@int8) "
                         "or leave the '@' out")
    return (name, spec) if sep else (ref, default_precision(ref))


def default_precision(name: str) -> str:
    """A GGUF file's own precision, an adapter's base's (on a file: its 4-bit body, which can hold
    the merged weights), else fp32."""
    if name not in BUILTINS and adapter.is_adapter(name):  # a built-in name is never a folder
        base = default_precision(adapter.base_ref(name))
        return f"{FILE_PRECISION}-int4" if base == FILE_PRECISION else base
    return FILE_PRECISION if name in PACKAGED_GGUF or name.endswith(".gguf") else "fp32"


def parts(ref: str) -> tuple[str, str]:
    """(name, spec) of a ref that must be a non-empty string."""
    if not isinstance(ref, str):
        raise SpecqError(f"a model reference is a string (a name, a path or a hub id), got {type(ref).__name__}")
    name, spec = split_ref(ref.strip())
    if not name:
        raise SpecqError(f"empty model reference '{ref}'")
    return name, spec


WINDOW = ":window="  # MODEL:window=W, a model draft that reads only the prompt's last W tokens


def split_window(ref: str) -> tuple[str, int | None]:
    """`MODEL:window=W` -> (MODEL, W); any other ref -> (ref, None). Why a window: a draft model
    pays for its own prefill of the whole prompt, a cost plain decoding does not have; a draft that
    reads only the prompt's end drafts from less context for a fraction of that cost, and since the
    target verifies every token the output is the same."""
    if not isinstance(ref, str):
        return ref, None  # `parts` says what a ref must be
    base, sep, value = ref.rpartition(WINDOW)
    if not sep:
        return ref, None
    if not (value.isascii() and value.isdigit() and int(value) > 0) or not base.strip():
        raise SpecqError(f"draft '{ref}': write MODEL{WINDOW}W with W a whole number of tokens above 0")
    return base, int(value)


def check_ref(ref: str) -> None:
    """What `load` checks before reading any weights: the ref's form, its precision and a local
    folder's files (`validate.check_dir`), so a bad ref fails before another model loads."""
    name, spec = parts(split_window(ref)[0])
    file_spec.parse(spec) if file_spec.names_file(spec) else precision.parse(spec)
    path = Path(name).expanduser()
    if name not in BUILTINS and name != SELF and path.is_dir():
        validate.check_dir(path)
        if adapter.is_adapter(path):  # its base is checked as a ref of its own
            check_adapter_precision(name, spec)
            check_ref(adapter.base_ref(path))


def check_adapter_precision(name: str, spec: str) -> None:
    """An adapter merges into float weights or a GGUF file's 4-bit body; no other spec holds it."""
    if file_spec.names_file(spec):
        if not file_spec.parse(spec).int4:
            raise SpecqError(f"adapter '{name}' changes the weights of its GGUF base, whose own blocks cannot hold "
                             f"them: load it at gguf-int4 (the default), with any other option after it, or at fp32")
    elif not precision.parse(spec).is_float:
        raise SpecqError(f"adapter '{name}': load it at a float precision (fp32, bf16) or, on a GGUF file, at "
                         f"gguf-int4; not at {precision.parse(spec)}")


def resolve(name: str) -> Path | str:
    """A local directory holding the model, or the hub id itself."""
    path = Path(name).expanduser()
    if name in BUILTINS:
        return BUILTINS[name]()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecqError(f"GGUF file not found: {path}")
        return float_dir(path)
    if path.is_dir():
        validate.check_dir(path)
        return path
    if path.exists():
        raise SpecqError(f"'{path}' is neither a model directory nor a .gguf file")
    if "/" in name and not name.startswith((".", "/", "~")):
        return name
    raise SpecqError(f"unknown model '{name}': not a built-in ({', '.join(BUILTINS)}), "
                     "a local directory, a .gguf file or a hub id (org/name)")


def gguf_file(name: str) -> Path:
    """The GGUF file a `name@gguf` ref runs: a built-in shipped as one, or a `.gguf` path."""
    if name in BUILTIN_GGUF:
        return BUILTIN_GGUF[name]()
    if not name.endswith(".gguf"):
        raise SpecqError(f"'@{FILE_PRECISION}' runs a GGUF file at its own precision; '{name}' is not a .gguf file "
                         f"or a built-in shipped as one ({', '.join(BUILTIN_GGUF)})")
    path = Path(name).expanduser()
    if not path.is_file():
        raise SpecqError(f"GGUF file not found: {path}")
    return path
