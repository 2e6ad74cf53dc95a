"""Put a loaded model at a precision spec: a float dtype, or quantized weights.

Quantizing with GPTQ or AWQ takes minutes, so the result is saved once under
`$SPECQ_CACHE/quantized/` (atomically) and later loads take seconds. Calibration text is the
training split of the shipped Shakespeare corpus.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from .. import atomic, caches
from ..errors import SpecqError
from ..model.llama import Llama, LlamaConfig
from ..paths import in_cache
from . import file_spec

QUANT_CONFIG = "quant_config.json"
QUANTIZED = ("config.json", "model.safetensors", QUANT_CONFIG)  # a quantized folder's own files


# `name@gguf`: a GGUF file's own quantized tensors (`models.load_model`)
FILE_PRECISION = file_spec.FILE_PRECISION
CALIB_LEN = 512  # tokens per GPTQ/AWQ calibration window, unless the model's context is shorter


def canonical(spec_text: str) -> str:
    """The canonical spelling of a precision: the parsed spec's, or a GGUF file's (`file_spec`)."""
    if not isinstance(spec_text, str):
        raise SpecqError("a precision is a string such as 'fp32' or 'int4-g64-gptq', got "
                         f"{spec_text!r}")
    return str(file_spec.parse(spec_text) if file_spec.names_file(spec_text) else parse(spec_text))


def is_float(spec_text: str) -> bool:
    """Whether a precision keeps float weights (`gguf` files hold quantized blocks)."""
    return not file_spec.names_file(spec_text) and parse(spec_text).is_float


def parse(spec_text: str):
    from ..weights.quant import parse_spec

    if not isinstance(spec_text, str):
        raise SpecqError("a precision is a string such as 'fp32' or 'int4-g64-gptq', got "
                         f"{spec_text!r}")
    try:
        return parse_spec(spec_text)
    except ValueError as e:
        raise SpecqError(str(e)) from None


def calibration_token_ids(tokenizer, n_samples: int = 32, seq_len: int = 512,
                          seed: int = 0) -> list[torch.Tensor]:
    from ..data import shakespeare_texts, split
    from ..weights.quant import calibration_samples

    train, _ = split(shakespeare_texts())
    stream = []
    for text in train:  # enough text for the windows asked for, and no more
        stream.append(torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long))
        if sum(len(t) for t in stream) >= 4 * n_samples * seq_len:
            break
    return calibration_samples(stream, n_samples=n_samples, seq_len=seq_len, seed=seed)


def quantize_net(net: Llama, tokenizer, spec, n_samples: int = 32, seq_len: int | None = None,
                 progress: bool = True) -> dict | None:
    """Quantize a native model in place (calibrating GPTQ/AWQ on corpus text in windows of
    `seq_len` tokens; default CALIB_LEN, or the model's context if shorter). Returns how GPTQ/AWQ
    calibrated, for quant_config.json's provenance (None for RTN): their codes depend on the
    thread count too, which orders the float sums of the activations they calibrate on."""
    from ..weights.quant import quantize_model

    check_plain(spec)
    if not isinstance(net, Llama):
        raise SpecqError("quantization needs a Llama-architecture model (the native module)")
    context = net.config.max_position_embeddings
    seq_len = min(CALIB_LEN, context) if seq_len is None else seq_len
    # positions past the trained ones, and an attention matrix that grows with seq_len^2
    if seq_len > context:
        raise SpecqError(f"calibration windows of {seq_len} tokens (--calib-len) do not fit the "
                         f"model's context of {context} tokens")
    try:
        calibration = (calibration_token_ids(tokenizer, n_samples, seq_len)
                       if spec.method in ("gptq", "awq") else None)
        quantize_model(net, spec, calibration=calibration, progress=progress)
    except ValueError as e:
        raise SpecqError(str(e)) from None
    if calibration is None:
        return None
    return {"calibration": {"windows": n_samples, "tokens": seq_len,
                            "threads": torch.get_num_threads()}}


def check_plain(spec, name: str = "MODEL", damaged: str | None = None) -> None:
    """A `-qad` spec names codes that only `specq qad` makes (minutes of training): loading one that
    is not built yet (or whose cache is `damaged`: what is wrong), or quantizing to one, is a
    one-line error that says how to make it."""
    from ..weights.quant.spec import without_qad

    if spec.qad:
        state = (f"is damaged ({damaged}): make it again" if damaged
                 else "is not built: make it once")
        raise SpecqError(f"{name}@{spec} {state} with `specq qad {name} {without_qad(spec)}` "
                         "(quantization-aware distillation, minutes on a CPU; docs/guide.md)")


def check_quantizable(net: Llama, spec) -> None:
    """Raise the one-line error `quantize_net` would raise for this spec's group sizes, before any
    work (and before the 'quantizing' announcement), so a bad spec stays one stderr line."""
    import warnings

    from ..weights.quant.apply import layer_group_sizes, quant_targets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback groups are announced by the quantization itself
        try:
            layer_group_sizes(quant_targets(net, spec), spec)
        except ValueError as e:
            raise SpecqError(str(e)) from None


def save_quantized_dir(net: Llama, spec, tokenizer, eos_ids, out: Path | str,
                       provenance: dict | None = None) -> None:
    """A self-contained quantized model directory: HF config + tokenizer + specq quant weights
    (`provenance`: into quant_config.json); stamped when it is the cache's (`caches`)."""
    from ..weights.quant import save_quantized

    def write(tmp: Path) -> None:
        save_quantized(net, spec, tmp / "weights", provenance)
        for f in (tmp / "weights").iterdir():
            f.rename(tmp / f.name)
        (tmp / "weights").rmdir()
        net.config.to_hf().save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(eos_ids)}))

    (caches.write_dir if in_cache(out) else atomic.write_dir)(Path(out), write)


def is_quantized_dir(path: Path) -> bool:
    return (path / QUANT_CONFIG).is_file()


def load_quantized_dir(path: Path) -> tuple[Llama, str]:
    """A native model from a directory written by `save_quantized_dir`, and its spec; the cache's
    are checked against their stamps first (a damaged one is an error naming what is wrong)."""
    from transformers import AutoConfig

    from ..weights.quant import load_quantized, read_spec

    if in_cache(path) and (why := caches.damage(path, QUANTIZED)):
        raise SpecqError(f"cannot load quantized model from '{path}': {why}")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):  # the float weights the checkpoint replaces are never allocated
        net = Llama(LlamaConfig.from_hf(config))
    try:
        load_quantized(net, path)
        spec = read_spec(path)
    except (ValueError, KeyError, OSError) as e:
        raise SpecqError(f"cannot load quantized model from '{path}': {e}") from None
    return net.eval(), str(spec)


def cached_quantized_dir(cache_root: Path, base_name: str, source: Path, spec) -> Path:
    """Where `base_name@spec` lives in the cache, keyed by the base weights' identity."""
    weights = sorted(source.glob("*.safetensors"))
    ident = "|".join(f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    digest = hashlib.sha256(f"{source.resolve()}|{ident}".encode()).hexdigest()[:12]
    safe = base_name.replace("/", "_")
    return cache_root / "quantized" / f"{safe}-{digest}@{spec}"


def announce(message: str) -> None:
    print(f"specq: {message}", file=sys.stderr, flush=True)
