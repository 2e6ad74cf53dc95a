"""A model ref -> a runnable `Model` and its tokenizer (`specq.load`, any ref: `kinds.load`).

A reference is a built-in name (`smollm2-135m`), a local Hugging Face directory, a `.gguf`
file, or a hub id (works only online). The architectures of `model/architectures.py`'s table run on
the lean native module (`llama.py`); anything else runs through transformers (`hf_backend.py`).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import replace
from pathlib import Path

import torch

from .. import backends
from ..core.types import Model
from ..errors import SpecqError
from ..model.llama import Llama
from ..paths import cache_dir
from . import file_spec, precision
from .builtins import BUILTINS
from .drafts import adapter, known
from .formats import hf
from .formats.gguf_load import model_at_file_precision
from .refs import ModelRef, check_adapter_precision, gguf_file, model_ref, resolve


def load_model(ref: ModelRef, backend: str | None = backends.DEFAULT) -> Model:
    """Load a model ref: `smollm2-135m`, `./dir`, `file.gguf`, `org/name` (online), each
    optionally with `@spec`: a float precision (fp32, bf16, fp16), a quantization spec (`int8`,
    `int4-g128-gptq`, ...; see `specq.weights.quant.spec`) or `gguf` (a GGUF file's own blocks).
    Quantized weights are cached. The network goes on `backend` (`specq.backends`: kernels, eager,
    compiled) for good, as its `runner`; None leaves it on torch's ops (an eager runner), for code
    that quantizes, trains or saves the weights, or makes a runner itself."""
    model = _load(ref)
    _remember(ref)
    if backend is not None:
        model.runner = backends.runner(model.net, backend)
        model.info["backend"] = model.runner.backend
    _return_freed_heap()
    return model


def _remember(ref: ModelRef) -> None:
    """A user's own GGUF file or model folder, noted as known (`drafts/known.py`): a later target
    with its tokenizer may draft with it. Built-ins are known already; hub ids are not files."""
    if ref.name in BUILTINS:
        return
    path = Path(ref.name).expanduser()
    if path.suffix == ".gguf" and path.is_file() or path.is_dir() and not adapter.is_adapter(path):
        known.remember(ref.base, path)


def _return_freed_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; nothing elsewhere). A
    load parses a tokenizer.json of several MB and builds transient tables; glibc keeps what they
    freed mapped, so without this a loaded model stays resident with tens of
    MiB it no longer uses."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _load(ref: ModelRef) -> Model:
    name, spec_text = ref.name, ref.spec
    # as `resolve`: a built-in name is never a folder
    if name not in BUILTINS and adapter.is_adapter(name):
        return _load_adapter(ref, name, spec_text)
    text = ref.base  # a draft's window is the draft's (`kinds.load`)
    if file_spec.names_file(spec_text):
        return model_at_file_precision(text, gguf_file(name), file_spec.parse(spec_text))
    spec = precision.parse(spec_text)
    started = time.perf_counter()
    source = resolve(name)
    if isinstance(source, str):  # a hub id
        if not spec.is_float:
            raise SpecqError(f"quantize hub model '{name}' from a local copy (save it to a "
                             "directory first)")
        net, tok, eos = hf.load_from_hub(name, spec.dtype)
        return Model(ref=text, net=net, tokenizer=tok, eos_ids=hf.eos_set(eos, tok),
                     source=f"hub:{name}", precision=str(spec),
                     info={"load_s": time.perf_counter() - started})
    if precision.is_quantized_dir(source):
        net, saved_spec = precision.load_quantized_dir(source)
        if spec_text != "fp32" and str(spec) != saved_spec:
            raise SpecqError(f"'{name}' holds {saved_spec} weights, not {spec}")
        tok, eos = hf.tokenizer_and_eos(source)
        return Model(ref=text, net=net, tokenizer=tok, eos_ids=hf.eos_set(eos, tok),
                     source=str(source), precision=saved_spec,
                     info={"load_s": time.perf_counter() - started})
    if spec.is_float:
        net, tok, eos = hf.load_dir(source, spec.dtype, local_only=True)
    else:
        cached = precision.cached_quantized_dir(cache_dir(), name, Path(source), spec)
        net, damaged = None, None
        if cached.is_dir():
            try:
                net, _ = precision.load_quantized_dir(cached)
                tok, eos = hf.tokenizer_and_eos(source)
            except SpecqError as e:  # damaged, or written by an older specq: quantize again
                damaged = str(e)
        if net is None:
            # a `-qad` model is built by `specq qad`, not here
            precision.check_plain(spec, name, damaged)
            if damaged:
                precision.announce(f"ignoring a stale or damaged quantization cache ({damaged})")
            net, tok, eos = hf.load_dir(source, torch.float32, local_only=True)
            precision.check_quantizable(net, spec)
            precision.announce(f"quantizing {name} to {spec} (once; cached in {cached.parent})")
            made = precision.quantize_net(net, tok, spec)
            precision.save_quantized_dir(net, spec, tok, hf.eos_set(eos, tok), cached, made)
    return Model(ref=text, net=net, tokenizer=tok, eos_ids=hf.eos_set(eos, tok), source=str(source),
                 precision=str(spec), info={"load_s": time.perf_counter() - started})


def _load_adapter(ref: ModelRef, path: str, spec_text: str) -> Model:
    """An adapter folder's base at `spec_text` with the adapter merged (`adapter.py`): on a GGUF
    file into its 4-bit body (made once and cached), at a float precision into the float weights."""
    check_adapter_precision(path, spec_text)
    merged = adapter.read(path)
    if file_spec.names_file(spec_text):
        return model_at_file_precision(ref.base, gguf_file(merged.base), file_spec.parse(spec_text),
                                       merged)
    model = _load(model_ref(f"{merged.base}@{spec_text}"))
    if not isinstance(model.net, Llama):
        raise SpecqError(f"adapter '{path}': its base '{merged.base}' does not run on specq's "
                         "native decoder")
    adapter.merge_float(model.net, merged, adapter.native_weights(merged, model.net))
    return replace(model, ref=ref.base, source=str(merged.path))
