"""A native model written as a Hugging Face folder of its architecture (specq and transformers
load it, GGUF converters read it)."""

from __future__ import annotations

import json
from pathlib import Path

from ... import atomic
from ...core.types import Model
from ...errors import SpecqError
from ...model.llama import Llama, native_to_hf_state_dict


def save_native(model: Model, out: Path | str) -> None:
    """Save a native model in its architecture's Hugging Face layout (loadable by specq and
    transformers), atomically."""
    atomic.write_dir(Path(out), lambda tmp: write_native(model, tmp))


def write_native(model: Model, directory: Path) -> None:
    """Write config, weights, tokenizer and generation config of a native model into `directory`:
    a Hugging Face folder of its architecture (LlamaForCausalLM, Qwen2ForCausalLM, ...) that
    AutoModelForCausalLM and GGUF converters read."""
    from safetensors.torch import save_file

    net = model.net
    if not isinstance(net, Llama):
        raise SpecqError("only native Llama models can be saved this way")
    # names the architecture, as converters and servers read it
    net.config.to_hf().save_pretrained(directory)
    save_file(native_to_hf_state_dict(net), directory / "model.safetensors",
              metadata={"format": "pt"})
    model.tokenizer.save_pretrained(directory)
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": sorted(model.eos_ids)}))
