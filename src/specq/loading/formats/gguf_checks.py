"""What a GGUF file's header says, checked against what its architecture needs before any of it
is used, so that a crafted or damaged header is one `SpecqError` line naming the key or tensor and
the file, never a ZeroDivisionError, a numpy reshape error or a model that runs on misread bytes.

The reader (`gguf_reader.Header`) has checked the structure already (alignment, tensor types and
dimensions, data packed inside the file). Here, on the header alone (no tensor data is read):
1. each metadata key specq or the tokenizer reads, by the table `KEYS`: its type and range;
2. what the values need of each other (head counts dividing, the vocabulary the token table's and
   the embedding's);
3. each tensor's shape against the one the config implies, and its type one specq can read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...errors import SpecqError
from ...model import architectures
from ...weights.gguf_formats import FORMATS
from .gguf_reader import LIMIT, SKIPPED, Header

# types without a row in `gguf_formats` that gguf's dequantization reads
DEQUANTIZED_BY_GGUF = ("IQ1_M", "NVFP4")


@dataclass(frozen=True)
class Rule:
    what: str  # a valid value, as the error line says it
    ok: Callable[[object], bool]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _array(item: Callable[[object], bool]) -> Callable[[object], bool]:
    # the reader's arrays of scalars hold values of one type: the first one shows it
    return lambda v: isinstance(v, list) and (not v or item(v[0]))


SIZE = Rule("a positive integer below 2**31", lambda v: _int(v) and 0 < v < LIMIT)
COUNT = Rule("an integer from 0 to 2**31 - 1", lambda v: _int(v) and 0 <= v < LIMIT)
POSITIVE = Rule("a positive finite number", lambda v: _number(v) and v > 0)
NONNEGATIVE = Rule("a finite number, 0 or more", lambda v: _number(v) and v >= 0)
FLAG = Rule("true or false", lambda v: isinstance(v, bool))
TEXT = Rule("a string", lambda v: isinstance(v, str))
NAME = Rule("a non-empty string", lambda v: isinstance(v, str) and bool(v))
STRINGS = Rule("an array of strings", lambda v: v is SKIPPED)
INTEGERS = Rule("an array of integers", _array(_int))
NUMBERS = Rule("an array of numbers", _array(lambda x: isinstance(x, (int, float))
                                              and not isinstance(x, bool)))
PATTERN = Rule("a count of layers or a non-empty array of per-layer flags",
               lambda v: COUNT.ok(v) or isinstance(v, list) and bool(v)
               and isinstance(v[0], (bool, int)))

# Every key specq reads (`architectures.fields_from_gguf`, `file_spec`, `drafts/select.py`) or
# transformers reads to build the tokenizer; ARCH stands for the file's general.architecture.
# general.alignment is the reader's (it lays the tensors out by it).
KEYS = {
    "general.architecture": NAME,
    "ARCH.block_count": SIZE,
    "ARCH.context_length": SIZE,
    "ARCH.embedding_length": SIZE,
    "ARCH.feed_forward_length": SIZE,
    "ARCH.vocab_size": SIZE,
    "ARCH.attention.head_count": SIZE,
    "ARCH.attention.head_count_kv": SIZE,
    "ARCH.attention.key_length": SIZE,
    "ARCH.attention.value_length": SIZE,
    "ARCH.attention.layer_norm_rms_epsilon": POSITIVE,
    "ARCH.attention.sliding_window": COUNT,
    "ARCH.attention.sliding_window_pattern": PATTERN,
    "ARCH.attention.causal": FLAG,
    "ARCH.rope.dimension_count": SIZE,
    "ARCH.rope.freq_base": POSITIVE,
    "ARCH.rope.freq_base_swa": POSITIVE,
    "ARCH.rope.scaling.type": TEXT,
    "ARCH.rope.scaling.factor": POSITIVE,
    "ARCH.final_logit_softcapping": NONNEGATIVE,
    "ARCH.attn_logit_softcapping": NONNEGATIVE,
    "tokenizer.ggml.model": NAME,
    "tokenizer.ggml.pre": TEXT,
    "tokenizer.ggml.tokens": STRINGS,
    "tokenizer.ggml.merges": STRINGS,
    "tokenizer.ggml.token_type": INTEGERS,
    "tokenizer.ggml.scores": NUMBERS,
    "tokenizer.ggml.precompiled_charsmap": INTEGERS,
    "tokenizer.ggml.bos_token_id": COUNT,
    "tokenizer.ggml.eos_token_id": COUNT,
    "tokenizer.ggml.unknown_token_id": COUNT,
    "tokenizer.ggml.padding_token_id": COUNT,
    "tokenizer.ggml.add_bos_token": FLAG,
    "tokenizer.ggml.add_eos_token": FLAG,
    "tokenizer.ggml.add_space_prefix": FLAG,
    "tokenizer.chat_template": TEXT,
}
REQUIRED = ("ARCH.block_count", "ARCH.embedding_length",
            "ARCH.feed_forward_length", "ARCH.attention.head_count")
# a tokenizer is built from these (`tokenizer`)
TOKENIZER = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")
TOKEN_IDS = ("bos", "eos", "unknown", "padding")


def config_fields(header: Header) -> dict:
    """`LlamaConfig` fields of the file's architecture, from metadata checked key by key (`KEYS`)
    and as a whole: one line naming the key and the file for the first value that is wrong."""
    path, fields = header.path, header.fields
    arch = _value(header, "general.architecture", NAME)
    if arch not in architectures.GGUF_ARCHITECTURES:
        raise SpecqError(f"'{path}': general.architecture is {_shown(arch)}, a model specq does "
                         f"not read (it reads {', '.join(architectures.GGUF_ARCHITECTURES)})")
    for pattern in REQUIRED:
        _value(header, pattern.replace("ARCH", arch), KEYS[pattern])
    for pattern, rule in KEYS.items():
        if pattern.replace("ARCH", arch) in fields:
            _value(header, pattern.replace("ARCH", arch), rule)
    _sizes(header, arch)
    tensors = {t.name: t for t in header.tensors}
    try:
        return architectures.fields_from_gguf(arch, fields.get, tensors)
    except SpecqError as e:
        raise SpecqError(f"'{path}' {e}") from None


def tensors(path: Path, config, present: dict, native_shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the model reads, at the shape `native_shapes` (native parameter -> shape, of a
    network of `config`) implies for it and of a type specq reads; no tensor left unused."""
    hf = architectures.hf_tensor_names(config)
    used = architectures.gguf_tensor_names(config)
    for native, parts in used.items():
        shape = native_shapes[native]
        for hf_name, name in zip(hf[native], parts):
            if name not in present:
                raise SpecqError(f"'{path}' is missing tensors (e.g. {name}): truncated or not a "
                                 f"full {config.architecture} model")
            expected = ((architectures.part_rows(hf_name, config), *shape[1:]) if len(parts) > 1
                        else shape)
            _tensor(path, present[name], expected)
    names = {p for parts in used.values() for p in parts}
    unused = sorted(set(present) - names - set(architectures.GGUF_CONFIG_TENSORS))
    if unused:  # e.g. biases the decoder has no place for: refuse rather than drop them
        raise SpecqError(f"'{path}' holds tensors the native decoder does not use (e.g. "
                         f"{unused[0]})")
    if "rope_freqs.weight" in present:
        _tensor(path, present["rope_freqs.weight"], (config.head_dim // 2,), ("F32",))


def tokenizer(header: Header) -> None:
    """The keys a tokenizer is built from are there (their values: `config_fields`): a model and
    its tokens, and merges or the scores they are derived from."""
    missing = [key for key in TOKENIZER if key not in header.fields]
    if missing:
        raise SpecqError(f"'{header.path}' has no tokenizer (no {missing[0]})")
    if not {"tokenizer.ggml.merges", "tokenizer.ggml.scores"} & header.fields.keys():
        raise SpecqError(f"'{header.path}' has no tokenizer.ggml.merges (nor the "
                         "tokenizer.ggml.scores to derive them from)")


# ---------------------------------------------------------------------------------- the parts


def _value(header: Header, key: str, rule: Rule):
    """A key's value, refused when missing or not what `rule` allows."""
    if key not in header.fields:
        raise SpecqError(f"'{header.path}' lacks {key}, which specq needs to build the model")
    value = header.fields[key]
    if not rule.ok(value):
        raise SpecqError(f"'{header.path}': {key} must be {rule.what}, got {_shown(value)}")
    return value


def _sizes(header: Header, arch: str) -> None:
    """What the values need of each other (their types and ranges are checked)."""
    path, fields = header.path, header.fields

    def key(name: str, default=None):
        return fields.get(f"{arch}.{name}", default)

    def refuse(text: str):
        raise SpecqError(f"'{path}': {text}")

    heads, hidden = key("attention.head_count"), key("embedding_length")
    kv_heads = key("attention.head_count_kv", heads)
    if key("block_count") > len(header.tensors):
        refuse(f"{arch}.block_count ({key('block_count')}) is more layers than the file has "
               f"tensors ({len(header.tensors)})")
    if heads % kv_heads:
        refuse(f"{arch}.attention.head_count_kv ({kv_heads}) does not divide "
               f"{arch}.attention.head_count ({heads})")
    if key("attention.key_length") is None and hidden % heads:
        refuse(f"{arch}.attention.head_count ({heads}) does not divide {arch}.embedding_length "
               f"({hidden})")
    head_dim = key("attention.key_length", hidden // heads)
    if head_dim % 2:
        which = "attention.key_length" if key("attention.key_length") else "attention.head_count"
        refuse(f"{arch}.{which} ({key(which)}) gives heads of {head_dim} dimensions: rope "
               "rotates pairs of them")
    if key("attention.value_length", head_dim) != head_dim:
        refuse(f"{arch}.attention.value_length ({key('attention.value_length')}) differs from "
               f"the key length ({head_dim}); the native decoder needs them equal")
    pattern = key("attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) > key("block_count"):
        refuse(f"{arch}.attention.sliding_window_pattern has {len(pattern)} flags for "
               f"{key('block_count')} layers")
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        refuse("has no token embedding (token_embd.weight)")
    rows = embedding.shape[-1]
    if key("vocab_size", rows) != rows:
        refuse(f"{arch}.vocab_size ({key('vocab_size')}) is not the embedding's {rows} rows")
    tokens = header.string_count("tokenizer.ggml.tokens")
    if tokens not in (None, rows):
        refuse(f"tokenizer.ggml.tokens holds {tokens} tokens for the embedding's {rows} rows")
    for name in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if name in fields and len(fields[name]) != rows:
            refuse(f"{name} holds {len(fields[name])} values for {rows} tokens")
    for which in TOKEN_IDS:
        name = f"tokenizer.ggml.{which}_token_id"
        if fields.get(name, 0) >= rows:
            refuse(f"{name} ({fields[name]}) is past the vocabulary's {rows} tokens")


def _tensor(path: Path, tensor, expected: tuple[int, ...], types: tuple[str, ...] = ()) -> None:
    """A tensor of the shape (rows first) and, where given, one of the types expected."""
    shape = tuple(reversed(tensor.shape))
    if shape != expected:
        raise SpecqError(f"'{path}': tensor {tensor.name} is {_dims(shape)}, where the header's "
                         f"sizes make it {_dims(expected)}")
    kind = tensor.tensor_type.name
    if kind not in (types or (*FORMATS, *DEQUANTIZED_BY_GGUF)):
        raise SpecqError(f"'{path}': tensor {tensor.name} is of type {kind}, which specq does not "
                         "read as weights")


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _shown(value) -> str:
    """A value as an error line shows it: short, on one line."""
    if value is SKIPPED:
        return "an array of strings"
    if isinstance(value, list):
        return f"an array of {len(value)} values"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
