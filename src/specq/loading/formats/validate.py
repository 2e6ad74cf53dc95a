"""A local model folder checked before its weights load, so every way it can be broken is one
`SpecqError` line instead of a traceback, a crash deep in a kernel, or, worse, a model that runs
on randomly initialized weights.

What is read: `config.json` (a JSON object that transformers parses), the tokenizer's files,
and each safetensors file's header (names and shapes, no tensor data). For the architectures the
native Llama module runs, the header must hold exactly the tensors the config implies, at the
config's shapes; other architectures load through transformers (`causal_lm`), where a weight
missing from or unexpected in the checkpoint is an error rather than a fresh initialization.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ...errors import SpecqError
from ...model.architectures import unsupported
from ...model.llama import Llama, LlamaConfig, native_to_hf_state_dict
from .. import precision
from ..drafts import adapter, folders

# a tokenizer transformers can build from the folder: a fast tokenizer's file, or a
# slow one's vocabulary
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# JSON objects
SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
# config fields that size a network: each must be a positive integer wherever a config has it
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number",
              bool: "true or false", type(None): "null"}
IGNORED = ("rotary_emb.inv_freq",)  # buffers older checkpoints hold and every loader recomputes


def check_dir(path: Path) -> None:
    """Any local model folder specq loads: one in specq's own format (`folders.py`: its config,
    tokenizer and weights), a quantized model, or a Hugging Face folder."""
    folder = folders.of(path)
    if folder is folders.ADAPTER:  # its base is a ref of its own (`refs.check_ref`)
        adapter.read(path)
    elif folder is not None and folder.weights:
        _json_object(path / folder.marker)
        _tokenizer(path)
        _headers([path / name for name in folder.weights])
    elif precision.is_quantized_dir(path):
        _json_object(path / precision.QUANT_CONFIG)
        _config(path)
        _tokenizer(path)
        _headers(_weight_files(path))
    else:
        check_hf_dir(path)


def check_hf_dir(path: Path) -> None:
    """A Hugging Face model folder: config, tokenizer, weights readable and, where the native Llama
    runs it (safetensors weights, `hf.load_dir`), exactly the tensors of its config."""
    config = _config(path)
    _tokenizer(path)
    shapes = _headers([f for f in _weight_files(path) if f.suffix == ".safetensors"])
    if unsupported(config) is None and shapes:
        if config.num_attention_heads % config.num_key_value_heads:
            raise SpecqError(f"'{path / 'config.json'}': num_key_value_heads "
                             f"({config.num_key_value_heads}) does not divide num_attention_heads "
                             f"({config.num_attention_heads})")
        _match(path, _native_shapes(LlamaConfig.from_hf(config), shapes), shapes)


def causal_lm(path, dtype: torch.dtype, local_only: bool):
    """transformers' model for a folder or hub id, refused when its checkpoint lacks weights the
    architecture has or holds weights it has not (transformers would initialize the missing ones
    randomly and print a report of many lines; the error is this one line)."""
    import transformers
    from transformers import AutoModelForCausalLM

    verbosity, bars = (transformers.logging.get_verbosity(),
                       transformers.logging.is_progress_bar_enabled())
    # the load report: its content is in the error below
    transformers.logging.set_verbosity(logging.ERROR)
    transformers.logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                           local_files_only=local_only,
                                                           output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise SpecqError(f"cannot load '{path}' with transformers: {_line(e)}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()
    problems = [f"{len(info[k])} weights {what} (e.g. {sorted(info[k])[0]})"
                for k, what in (("missing_keys", "missing from the checkpoint"),
                                ("unexpected_keys",
                                 "in the checkpoint that the architecture does not have"),
                                ("mismatched_keys", "of another shape"))
                if info.get(k)]
    if problems:
        raise SpecqError(f"'{path}' does not hold the weights of its config's architecture "
                         f"({type(model).__name__}): {'; '.join(problems)}")
    return model


# ---------------------------------------------------------------------------------- the parts


def _line(error: Exception) -> str:
    """An exception's message on one line (transformers' span several)."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    return text or type(error).__name__


def _json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_bytes())
    except OSError as e:
        raise SpecqError(f"cannot read '{path}': {e.strerror or e}") from None
    except ValueError as e:
        raise SpecqError(f"'{path}' is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise SpecqError(f"'{path}' holds {JSON_KINDS.get(type(value), 'a value')}, not a JSON "
                         "object")
    return value


def _config(path: Path):
    """config.json as transformers parses it, with every size it has a positive integer."""
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise SpecqError(f"'{path}' is not a Hugging Face model directory (no config.json)")
    raw = _json_object(path / "config.json")
    if not isinstance(raw.get("model_type"), str):
        raise SpecqError(f"'{path / 'config.json'}' names no architecture (no 'model_type')")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:
        # transformers raises many kinds (ValueError, KeyError, its dataclass validators)
        raise SpecqError(f"'{path / 'config.json'}': {_line(e)}") from None
    for name in SIZES:
        value = getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise SpecqError(f"'{path / 'config.json'}': {name} must be a positive integer, got "
                             f"{value!r}")
    return config


def _tokenizer(path: Path) -> None:
    """A tokenizer's files, and the settings files beside it, are what their loaders expect."""
    from tokenizers import Tokenizer

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise SpecqError(f"'{path}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    for name in SETTINGS_FILES:
        if (path / name).is_file():
            _json_object(path / name)
    if (path / "tokenizer.json").is_file():
        try:
            Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise SpecqError(f"'{path / 'tokenizer.json'}' is not a readable tokenizer "
                             f"({_line(e)})") from None


def _weight_files(path: Path) -> list[Path]:
    """The weight files of a folder: those its safetensors index names, else every safetensors or
    PyTorch file in it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json_object(index).get("weight_map")
        if (not isinstance(weight_map, dict)
            or not all(isinstance(f, str) for f in weight_map.values())):
            raise SpecqError(f"'{index}' has no 'weight_map' of tensor names to files")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise SpecqError(f"'{path}' lacks {missing[0]}, a weights file its index names")
        return files
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise SpecqError(f"'{path}' holds no weights (no .safetensors file)")
    return files


def _headers(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the files' safetensors headers; the header parse checks that the
    file is as long as its header says, so a truncated file is caught without reading it."""
    from safetensors import safe_open

    shapes = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                shapes.update({name: tuple(st.get_slice(name).get_shape()) for name in st.keys()})
        except Exception as e:  # safetensors raises its own SafetensorError, and OSError
            raise SpecqError(f"'{f}' is not a readable safetensors file ({_line(e)})") from None
    return shapes


def _native_shapes(config: LlamaConfig, present: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (names without `model.`) and shapes of a Hugging Face checkpoint of the config's
    architecture, as `write_native` saves them; a tied head may be stored as well."""
    with torch.device("meta"):
        net = Llama(config)
    expected = {k.removeprefix("model."): tuple(v.shape)
                for k, v in native_to_hf_state_dict(net).items()}
    if config.tie_word_embeddings and "lm_head.weight" in present:
        expected["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    return expected


def _match(path: Path, expected: dict[str, tuple], shapes: dict[str, tuple]) -> None:
    found = {k.removeprefix("model."): v for k, v in shapes.items() if not k.endswith(IGNORED)}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    problems = []
    if wrong:
        k = wrong[0]
        problems.append(f"{len(wrong)} of another shape (e.g. {k}: {_shape(found[k])}, "
                        f"the config says {_shape(expected[k])})")
    if missing:
        problems.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} the config has no place for (e.g. {unexpected[0]})")
    if problems:
        raise SpecqError(f"the weights in '{path}' do not match its config.json: "
                         f"{'; '.join(problems)}")


def _shape(shape: tuple) -> str:
    return "x".join(map(str, shape)) or "scalar"
