"""The Llama family as configuration: per architecture, how its transformers config (`config.json`)
and its GGUF metadata map onto `llama.LlamaConfig` fields, and how its checkpoint's tensors map onto
the native layout.

Why a table: the architectures people run on CPUs differ from Llama in a handful of switches
(q/k/v biases, q/k norms, sliding-window layers with a rope base of their own, norms after
attention and feed-forward, GeGLU, scaled embeddings, a query scale, rope scaling, fused checkpoint
tensors), as vLLM's model registry and llama.cpp's per-architecture graph builders treat them. One
decoder reads the switches; a new architecture is one entry here plus a conformance test
(tests/model/test_architectures.py). What no switch covers is named by `unsupported`, and such a
model runs on transformers (`hf_backend.py`).

Only the Hugging Face tensor names are spelled out here: GGUF names come from the `gguf` library's
own map of them, the one llama.cpp's converter writes with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..errors import SpecqError
from . import rope

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # of the gate (transformers' names): SwiGLU, GeGLU
LAYER_TYPES = ("full_attention", "sliding_attention")

# A decoder layer's tensors: native name -> Hugging Face names (concatenated by rows, in order).
SEPARATE = {
    "attention_norm.weight": ("input_layernorm.weight",),
    "ffn_norm.weight": ("post_attention_layernorm.weight",),
    "attention.wqkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                              "self_attn.v_proj.weight"),
    "attention.wo.weight": ("self_attn.o_proj.weight",),
    "feed_forward.w13.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "feed_forward.w2.weight": ("mlp.down_proj.weight",),
}
# Phi-3: [q; k; v], [gate; up]
FUSED = SEPARATE | {"attention.wqkv.weight": ("self_attn.qkv_proj.weight",),
                    "feed_forward.w13.weight": ("mlp.gate_up_proj.weight",)}
# The tensors a feature adds (a `LlamaConfig` switch -> its tensors).
FEATURE_TENSORS = {
    "qkv_bias": {"attention.qkv_bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                        "self_attn.v_proj.bias")},
    "qk_norm": {"attention.q_norm.weight": ("self_attn.q_norm.weight",),
                "attention.k_norm.weight": ("self_attn.k_norm.weight",)},
    "post_norms": {"ffn_norm.weight": ("pre_feedforward_layernorm.weight",),
                   "post_attention_norm.weight": ("post_attention_layernorm.weight",),
                   "post_ffn_norm.weight": ("post_feedforward_layernorm.weight",)},
}
GLOBAL = {"tok_embeddings.weight": ("model.embed_tokens.weight",),
          "norm.weight": ("model.norm.weight",)}
HEAD = {"output.weight": ("lm_head.weight",)}


@dataclass(frozen=True)
class Architecture:
    """One architecture of the Llama family: its names in each file format
    and its fixed switches."""

    model_type: str  # transformers' config.model_type
    hf_class: str  # `architectures` in a saved config.json
    gguf: str  # llama.cpp's general.architecture
    layout: dict = field(default_factory=lambda: SEPARATE)  # the checkpoint's layer tensors
    features: dict = field(default_factory=dict)  # LlamaConfig switches every model of it has
    # sliding windows in config.json: none, all (every layer), layer_types, switched (layer_types,
    # on only with use_sliding_window)
    windows: str = "none"
    act_key: str = "hidden_act"  # config.json's name for the activation
    # a checkpoint norm weight w means the multiplier offset + w (Gemma's 1 + w)
    norm_offset: float = 0.0
    # llama.cpp's converter reorders q/k rows (its rope pairs adjacent dims)
    permuted_qk: bool = False
    # GGUF files without a sliding_window_pattern: every n-th layer global (0: none)
    gguf_global_every: int = 0
    # GGUF files without rope.freq_base_swa: the sliding layers' base
    gguf_local_theta: float | None = None


GEMMA3 = {"qk_norm": True, "post_norms": True, "scale_embeddings": True}
ARCHITECTURES = {a.model_type: a for a in (
    Architecture("llama", "LlamaForCausalLM", "llama", permuted_qk=True),  # Llama 2 / 3.x, SmolLM2
    Architecture("mistral", "MistralForCausalLM", "llama", windows="all", permuted_qk=True),
    Architecture("qwen2", "Qwen2ForCausalLM", "qwen2", features={"qkv_bias": True},
                 windows="switched"),
    Architecture("qwen3", "Qwen3ForCausalLM", "qwen3", features={"qk_norm": True},
                 windows="switched"),
    Architecture("gemma3_text", "Gemma3ForCausalLM", "gemma3", features=GEMMA3,
                 windows="layer_types", act_key="hidden_activation", norm_offset=1.0,
                 gguf_global_every=6, gguf_local_theta=10000.0),
    Architecture("phi3", "Phi3ForCausalLM", "phi3", layout=FUSED, windows="all"),
)}
# A GGUF architecture -> the model_type its files are read as (and the one with a window, where
# llama.cpp writes both as one: Mistral files are llama files with a window).
GGUF_ARCHITECTURES = {"llama": ("llama", "mistral"), "qwen2": ("qwen2", "qwen2"),
                      "qwen3": ("qwen3", "qwen3"), "gemma3": ("gemma3_text", "gemma3_text"),
                      "phi3": ("phi3", "phi3")}

# transformers config attributes that no switch covers: set (truthy) -> why the model
# runs on transformers.
REFUSED = {"attention_bias": "attention biases beyond q/k/v (attention_bias)",
           "mlp_bias": "feed-forward biases", "final_logit_softcapping": "final logit softcapping",
           "attn_logit_softcapping": "attention logit softcapping",
           "use_bidirectional_attention": "bidirectional attention"}


# ------------------------------------------------------------------ transformers configs

def _rope_parameters(hf) -> dict:
    """transformers' rope parameters: one dict, or one per layer type (Gemma 3)."""
    return (getattr(hf, "rope_parameters", None)
            or {"rope_theta": getattr(hf, "rope_theta", 10000.0)})


def _rope_type(params: dict) -> str:
    return params.get("rope_type", params.get("type", "default"))


def _scaling(params: dict) -> dict | None:
    """The rope scaling of one layer type's parameters, None when unscaled."""
    kind = _rope_type(params)
    return (None if kind == "default"
            else {"rope_type": kind, **{k: params[k] for k in rope.SCALING_KEYS[kind]}})


def _activation(hf) -> str:
    return getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu")


def _layer_types(hf) -> list[str]:
    """Each layer's type; configs without `layer_types` (Mistral, Phi-3) slide every layer
    when they have a window."""
    every = "sliding_attention" if getattr(hf, "sliding_window", None) else "full_attention"
    return getattr(hf, "layer_types", None) or [every] * hf.num_hidden_layers


def unsupported(hf) -> str | None:
    """Why the native decoder cannot run this transformers config exactly, or None when it can."""
    kind = getattr(hf, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} has no native entry (native: {', '.join(ARCHITECTURES)})"
    params = _rope_parameters(hf)
    per_type = [params[t] for t in LAYER_TYPES if t in params] or [params]
    for p in per_type:
        if _rope_type(p) not in ("default", *rope.SCALINGS):
            return f"rope scaling {_rope_type(p)!r} has no exact native implementation"
        if p.get("partial_rotary_factor", 1.0) != 1.0:
            return "partial rotary embeddings"
    if _rope_type(params.get("sliding_attention", {})) != "default":
        return "rope scaling on sliding-window layers"
    if _activation(hf) not in ACTIVATIONS:
        return f"activation {_activation(hf)!r}"
    for attribute, reason in REFUSED.items():
        if getattr(hf, attribute, None):
            return reason
    other = sorted(set(_layer_types(hf)) - set(LAYER_TYPES))
    return f"layer type {other[0]!r}" if other else None


def fields_from_hf(hf) -> dict:
    """`LlamaConfig` fields of a transformers config that `unsupported` accepts."""
    arch = ARCHITECTURES[hf.model_type]
    params = _rope_parameters(hf)
    full, local = params.get("full_attention", params), params.get("sliding_attention")
    window = getattr(hf, "sliding_window", None)
    sliding = (tuple(i for i, t in enumerate(_layer_types(hf)) if t == "sliding_attention")
               if window else ())
    heads = hf.num_attention_heads
    return dict(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers, num_heads=heads,
        num_kv_heads=hf.num_key_value_heads or heads, head_dim=getattr(hf, "head_dim", None)
        or hf.hidden_size // heads, rms_norm_eps=hf.rms_norm_eps,
        rope_theta=float(full.get("rope_theta", 10000.0)),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
        max_position_embeddings=hf.max_position_embeddings, architecture=arch.model_type,
        rope_scaling=_scaling(full),
        rope_local_theta=float(local["rope_theta"]) if local and sliding else None,
        sliding_window=window if sliding else None, sliding_layers=sliding,
        hidden_act=_activation(hf),
        query_pre_attn_scalar=getattr(hf, "query_pre_attn_scalar", None), **arch.features)


def hf_config(c):
    """The transformers config of a `LlamaConfig` (what `fields_from_hf` reads back as `c`), so that
    saved models load in transformers too."""
    from transformers import AutoConfig

    arch = ARCHITECTURES[c.architecture]
    full = {"rope_type": "default", "rope_theta": c.rope_theta, **(c.rope_scaling or {})}
    sliding = set(c.sliding_layers) if c.sliding_window else set()
    out = dict(architectures=[arch.hf_class], vocab_size=c.vocab_size, hidden_size=c.hidden_size,
               intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
               head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
               tie_word_embeddings=c.tie_word_embeddings,
               max_position_embeddings=c.max_position_embeddings,
               # the tokenizer's
               rope_parameters=full, bos_token_id=None, eos_token_id=None, pad_token_id=None,
               **{arch.act_key: c.hidden_act})
    if c.rope_local_theta is not None:
        out["rope_parameters"] = {"full_attention": full,
                                  "sliding_attention": {"rope_type": "default",
                                                        "rope_theta": c.rope_local_theta}}
    if c.query_pre_attn_scalar is not None:
        out["query_pre_attn_scalar"] = c.query_pre_attn_scalar
    if arch.windows == "all" and sliding not in (set(), set(range(c.num_layers))):
        raise ValueError(f"{c.architecture} slides every layer or none, not layers "
                         f"{sorted(sliding)}")
    if arch.windows == "none" and sliding:
        raise ValueError(f"{c.architecture} has no sliding windows")
    if arch.windows != "none":
        out["sliding_window"] = c.sliding_window if sliding else None
    if arch.windows in ("layer_types", "switched"):
        out["layer_types"] = [LAYER_TYPES[i in sliding] for i in range(c.num_layers)]
    if arch.windows == "switched":
        out["use_sliding_window"] = bool(sliding)
    return AutoConfig.for_model(arch.model_type, **out)


# ------------------------------------------------------------------ checkpoint tensors

def layer_tensors(c) -> dict[str, tuple[str, ...]]:
    """A decoder layer's native tensors -> their Hugging Face names (without the layer prefix)."""
    names = dict(ARCHITECTURES[c.architecture].layout)
    for switch, tensors in FEATURE_TENSORS.items():
        if getattr(c, switch):
            names.update(tensors)
    return names


def hf_tensor_names(c) -> dict[str, tuple[str, ...]]:
    """Every native parameter -> the Hugging Face tensors it is made of (rows concatenated)."""
    names = dict(GLOBAL) if c.tie_word_embeddings else GLOBAL | HEAD
    for i in range(c.num_layers):
        names.update({f"layers.{i}.{native}": tuple(f"model.layers.{i}.{h}" for h in hf)
                      for native, hf in layer_tensors(c).items()})
    return names


def part_rows(hf_name: str, c) -> int:
    """Rows of one part of a fused native tensor (split when saving)."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    sizes = {"q_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": c.intermediate_size,
             "up_proj": c.intermediate_size}
    return sizes[hf_name.rsplit(".", 2)[-2]]


def native_state_dict(sd: dict[str, Tensor], c) -> dict[str, Tensor]:
    """A Hugging Face state dict of architecture `c.architecture` in the native layout (norm
    weights as the multipliers they stand for). `sd` is emptied as it is read, so the parts of a
    fused tensor are freed once concatenated (a model's weights are not held twice)."""
    sd = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": sd.pop(k) for k in list(sd)}
    offset = ARCHITECTURES[c.architecture].norm_offset
    out = {}
    for native, hf in hf_tensor_names(c).items():
        parts = [sd.pop(h) for h in hf]
        tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
        del parts
        out[native] = (tensor.float() + offset
                       if offset and native.endswith("norm.weight") else tensor)
    if c.tie_word_embeddings:
        out["output.weight"] = out["tok_embeddings.weight"]
    return out


def hf_state_dict(sd: dict[str, Tensor], c) -> dict[str, Tensor]:
    """The inverse of `native_state_dict`: a native state dict in its
    architecture's checkpoint layout."""
    offset = ARCHITECTURES[c.architecture].norm_offset
    out = {}
    for native, hf in hf_tensor_names(c).items():
        tensor = sd[native] - offset if offset and native.endswith("norm.weight") else sd[native]
        parts = tensor.split([part_rows(h, c) for h in hf]) if len(hf) > 1 else (tensor,)
        out.update({h: p.contiguous() for h, p in zip(hf, parts)})
    return out


# ------------------------------------------------------------------ GGUF files

def gguf_tensor_names(c) -> dict[str, tuple[str, ...]]:
    """Every native parameter -> the GGUF tensors it is made of, as llama.cpp's
    converter names them."""
    import gguf

    arch = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[
        ARCHITECTURES[c.architecture].gguf]
    table = gguf.get_tensor_name_map(arch, c.num_layers)

    def name(hf: str) -> str:
        found = table.get_name(hf, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise ValueError(f"no GGUF name for {hf}")
        return found

    return {native: tuple(name(h) for h in hf) for native, hf in hf_tensor_names(c).items()}


def fields_from_gguf(arch: str, get, tensors: dict) -> dict:
    """`LlamaConfig` fields from a GGUF file's metadata (`get(key, default)`) and tensors (name ->
    gguf.ReaderTensor); what the native decoder cannot run exactly is a `SpecqError` naming it."""
    if arch not in GGUF_ARCHITECTURES:
        raise SpecqError(f"holds a {arch!r} model; specq reads GGUF files of "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    plain, windowed = (ARCHITECTURES[t] for t in GGUF_ARCHITECTURES[arch])

    def key(name: str, default=None):
        return get(f"{arch}.{name}", default)

    heads, hidden, layers = (int(key("attention.head_count")), int(key("embedding_length")),
                             int(key("block_count")))
    head_dim = int(key("attention.key_length", hidden // heads))
    window = int(key("attention.sliding_window", 0) or 0) or None
    sliding = _gguf_sliding_layers(key("attention.sliding_window_pattern", plain.gguf_global_every),
                                   layers) \
        if window else ()
    theta = float(key("rope.freq_base", 10000.0))
    refused = _gguf_refusal(key, tensors, head_dim, arch)
    if refused:
        raise SpecqError(f"uses {refused}, which the native decoder does not implement")
    scaling = _gguf_scaling(key, tensors, theta, head_dim, arch)
    local = key("rope.freq_base_swa", plain.gguf_local_theta) if sliding else None
    a = windowed if sliding else plain
    return dict(
        vocab_size=int(key("vocab_size", 0) or tensors["token_embd.weight"].shape[-1]),
        hidden_size=hidden, intermediate_size=int(key("feed_forward_length")), num_layers=layers,
        num_heads=heads, num_kv_heads=int(key("attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)), rope_theta=theta,
        tie_word_embeddings="output.weight" not in tensors,
        max_position_embeddings=int(key("context_length", 2048)), architecture=a.model_type,
        rope_scaling=scaling, rope_local_theta=None if local is None else float(local),
        sliding_window=window if sliding else None, sliding_layers=sliding,
        hidden_act=_GGUF_ACTIVATION[arch],
        query_pre_attn_scalar=_GGUF_QUERY_SCALAR[arch](hidden, heads, head_dim, layers),
        **a.features)


# tensors that are configuration (Llama 3.x's rope scaling)
GGUF_CONFIG_TENSORS = ("rope_freqs.weight",)
# What llama.cpp builds per architecture, where its files carry no key for it.
_GGUF_ACTIVATION = {"llama": "silu", "qwen2": "silu", "qwen3": "silu",
                    "gemma3": "gelu_pytorch_tanh", "phi3": "silu"}
# llama.cpp's gemma3: scores scaled by head_dim ** -0.5, but hidden / heads on the 27B
_GGUF_QUERY_SCALAR = {
    "gemma3": lambda hidden, heads, head_dim, layers: hidden // heads if layers == 62 else head_dim}
_GGUF_QUERY_SCALAR.update({a: lambda *_: None for a in GGUF_ARCHITECTURES
                           if a not in _GGUF_QUERY_SCALAR})


def _gguf_sliding_layers(pattern, layers: int) -> tuple[int, ...]:
    """Which layers slide, from llama.cpp's sliding_window_pattern: n -> every n-th layer global
    (0: none global), or one flag per layer (repeated)."""
    if isinstance(pattern, (list, tuple)):
        return tuple(i for i in range(layers) if pattern[i % len(pattern)])
    n = int(pattern)
    return tuple(i for i in range(layers) if n == 0 or i % n < n - 1)


def _gguf_refusal(key, tensors: dict, head_dim: int, arch: str) -> str | None:
    """What in a GGUF file the native decoder does not implement, or None."""
    kind = key("rope.scaling.type")
    if kind not in (None, "none", "linear"):
        return f"rope scaling {kind!r}"
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        return "partial rotary embeddings"
    for name, what in (("final_logit_softcapping", "final logit softcapping"),
                       ("attn_logit_softcapping", "attention logit softcapping")):
        if key(name):
            return what
    if not key("attention.causal", True):
        return "non-causal attention"
    if "rope_factors_long.weight" in tensors:
        return "longrope scaling"
    if "rope_freqs.weight" in tensors and arch != "llama":
        return "per-frequency rope factors"
    return None


def _gguf_scaling(key, tensors: dict, theta: float, head_dim: int, arch: str) -> dict | None:
    """The rope scaling of a GGUF file: linear from its metadata, Llama 3.x's from
    its rope_freqs tensor."""
    if key("rope.scaling.type") == "linear" and float(key("rope.scaling.factor", 1.0)) != 1.0:
        return {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    if "rope_freqs.weight" not in tensors:
        return None
    divisors = torch.from_numpy(np.asarray(tensors["rope_freqs.weight"].data,
                                           dtype=np.float64).reshape(-1))
    if torch.all(divisors == 1):
        return None
    scaling = rope.llama3_from_divisors(divisors, theta, head_dim)
    if scaling is None:
        raise SpecqError("holds rope_freqs that match no llama3 rope scaling")
    return scaling
