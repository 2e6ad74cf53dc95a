"""Hugging Face model folders and hub ids: the native module where `model/architectures.py`
covers the architecture, transformers otherwise; EOS ids from the generation config."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
from torch import nn

from ...errors import SpecqError
from ...model.architectures import unsupported
from ...model.hf_backend import HFCausalLM
from ...model.llama import Llama, LlamaConfig, hf_to_native_state_dict
from ...weights.quant.checkpoint import assign_state, read_safetensors
from .. import precision
from . import validate


def load_dir(path: Path | str, dtype: torch.dtype,
             local_only: bool) -> tuple[nn.Module, object, list[int]]:
    """(network, tokenizer, EOS ids) of a Hugging Face folder (or a hub id)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path, local_files_only=local_only)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    weights = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    why_not = (unsupported(config)
               or (None if weights else "its weights are not in local .safetensors files"))
    if why_not is None:
        native = LlamaConfig.from_hf(config)
        state = {}
        for f in weights:
            state.update(read_safetensors(f))
        with torch.device("meta"):  # the files' tensors become the weights: none allocated twice
            net = Llama(native)
        try:
            assign_state(net, hf_to_native_state_dict(state, native))
        except ValueError as e:
            raise SpecqError(f"'{path}': {e}") from None
        net = net.to(dtype).eval()
    else:
        # a broken checkpoint fails here, before the note
        hf = validate.causal_lm(path, dtype, local_only)
        precision.announce(f"{path} runs on transformers, without specq's kernels: {why_not}")
        net = HFCausalLM(hf)
    return net, tokenizer, generation_eos(path, config, local_only)


def generation_eos(path, config, local_only: bool) -> list[int]:
    """The EOS ids of `generation_config.json`, else the config's."""
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


def load_from_hub(name: str, dtype: torch.dtype):
    """From the local Hugging Face cache if it is there, else from the hub; offline -> one line."""
    try:
        return load_dir(name, dtype, local_only=True)
    except Exception:
        pass
    if not _hub_reachable():
        raise SpecqError(f"'{name}' is not a built-in, a local path or in the Hugging Face cache, "
                         "and the hub cannot be reached (offline)")
    try:
        return load_dir(name, dtype, local_only=False)
    except Exception as e:  # unknown id, gated repo: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecqError(f"could not load '{name}' from the Hugging Face hub: {first}") from None


def tokenizer_and_eos(path: Path):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return tok, generation_eos(path, AutoConfig.from_pretrained(path, local_files_only=True), True)


def eos_set(eos: list[int], tokenizer) -> frozenset[int]:
    """The EOS ids given and the tokenizer's own."""
    ids = set(eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
