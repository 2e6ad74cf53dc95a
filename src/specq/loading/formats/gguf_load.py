"""A GGUF file as specq runs it: at its own precision (its blocks on the packed kernels, the
tokenizer from its metadata, cached), or converted once to a float safetensors folder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ... import caches
from ...core.types import Model
from ...model.llama import Llama
from ...paths import cache_dir, file_key
from .. import file_spec, precision
from ..drafts.adapter import Adapter
from . import gguf_io
from .hf import eos_set
from .save import write_native

TOKENIZER = ("tokenizer.json", "tokenizer_config.json")  # a cached tokenizer's files
CONVERTED = ("config.json", "model.safetensors", *TOKENIZER)  # a converted folder's
# How `gguf_io.tokenizer` builds a file's tokenizer; raised when that changes, so the caches that
# hold one (the tokenizer's, the converted folder's) are built again, not reused stale.
# 2: a Gemma file's runs of spaces are whole tokens, as in llama.cpp.
TOKENIZER_BUILD = 2


def convert(gguf: Path, target: Path) -> None:
    """A GGUF file -> a Hugging Face directory of its architecture's float weights
    (safetensors), atomically.
    The file is checked first, so a corrupt one is one error line and no announcement."""
    parsed = gguf_io.read(gguf)
    print(f"specq: converting {gguf.name} to a safetensors cache in {target} (once, under a "
          "minute)",
          file=sys.stderr, flush=True)
    tok = gguf_io.tokenizer(gguf)
    net = Llama(parsed.config)
    net.load_state_dict(parsed.float_state_dict())
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    model = Model(ref=str(gguf), net=net.eval(), tokenizer=tok, eos_ids=frozenset(eos),
                  source=str(gguf))
    caches.write_dir(target, lambda tmp: write_native(model, tmp))


def _key(path: Path) -> str:
    """The key of a cache that holds the file's tokenizer: the file's, and how it was built."""
    return f"{file_key(path)}-t{TOKENIZER_BUILD}"


def float_dir(gguf: Path) -> Path:
    """A converted cache for a user's GGUF file, keyed by its path, size and mtime (converted
    again when damaged: `caches`)."""
    target = cache_dir() / "gguf" / _key(gguf)
    if not caches.usable(target, CONVERTED):
        convert(gguf, target)
    return target


def model_at_file_precision(ref: str, path: Path, spec: file_spec.FileSpec,
                            merged: Adapter | None = None) -> Model:
    """`x.gguf@gguf` or a built-in shipped as GGUF: the file's own blocks on the packed kernels,
    no float round trip and no second quantization (unless `spec` asks for a 4-bit body or a
    narrowed head: `file_spec`, or an adapter is `merged` into it); the tokenizer and chat template
    come from the file's metadata (built once, cached): the file alone is enough."""
    started = time.perf_counter()
    parsed = gguf_io.read(path)  # a corrupt file fails here, before the tokenizer is built
    tok = tokenizer(path)
    cached = file_spec.cached_int4_body(parsed, spec, merged.digest if merged else None)
    net, notes = gguf_io.load_at_file_precision(parsed, cached)
    file_spec.apply(net, parsed, spec, tok, merged, cached=bool(cached))
    for note in notes:
        precision.announce(f"{path.name}: {note}")
    return Model(ref=ref, net=net, tokenizer=tok, eos_ids=eos_set([], tok),
                 source=str(merged.path if merged else path), precision=str(spec),
                 info={"load_s": time.perf_counter() - started})


def tokenizer(path: Path):
    """A GGUF file's tokenizer, chat template and EOS id (the tokenizer's: transformers reads it
    from the file's metadata). transformers builds the tokenizer from the file in tens of seconds
    for a large vocabulary, so it is saved once under $SPECQ_CACHE (keyed like the file's converted
    cache) and reloaded from there in about a second. Reloaded as the generic `TokenizersBackend`,
    straight from the saved tokenizer.json (which holds the whole pipeline): the architecture's own
    class (Qwen2Tokenizer, ...) rebuilds it from a Python copy of the vocabulary and merges that it
    keeps, tens of MiB resident for a 150k-token vocabulary, for the same token ids
    (tests/loading/test_gguf.py compares the two)."""
    from transformers import TokenizersBackend

    cached = cache_dir() / "tokenizers" / _key(path)
    if not caches.usable(cached, TOKENIZER):  # built again when damaged
        tok = gguf_io.tokenizer(path)
        caches.write_dir(cached, tok.save_pretrained)
    return TokenizersBackend.from_pretrained(cached, local_files_only=True)
