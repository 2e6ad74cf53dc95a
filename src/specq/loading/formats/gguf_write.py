"""A native model specq made (quantized by `specq quantize` or `specq qad`, or a float draft from
`specq distill` / `calibrate`) as a GGUF file llama.cpp runs: the reader's inverse (`gguf_io`),
driven by the same table (`model/architectures.py`: config keys, tensor names, llama.cpp's q/k row
order), the tokenizer and chat template in the metadata (`gguf_vocab`).

Integer weights become GGUF blocks holding specq's own numbers (`weights.gguf_blocks`: Q4_0, Q4_1,
Q8_0), so the file is the model bit for bit; float tensors keep their dtype (F32, BF16, F16; norms
and biases F32). What has no exact form is refused in one line. The file is read back before it
is moved into place: its config must be the model's (else the writer and the reader disagree).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...core.types import Model
from ...errors import SpecqError
from ...model import architectures, rope
from ...model.llama import Llama, LlamaConfig
from ...weights import gguf_blocks
from ...weights.quant.modules import QuantLinear
from ...weights.quant.rtn import QuantizedWeight
from ...weights.quant.spec import QuantSpec
from . import gguf_io, gguf_vocab

FLOAT_TYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
              "Q4_1": "MOSTLY_Q4_1", "Q8_0": "MOSTLY_Q8_0"}


def check_spec(spec: QuantSpec) -> None:
    """Refuse, before any model loads, a spec whose weights no GGUF block holds exactly."""
    if spec.is_float:
        return
    try:
        gguf_blocks.block_type(spec.bits, spec.symmetric)
        gguf_blocks.check_group(spec.group_size)
    except ValueError as e:
        raise SpecqError(f"{spec} has no exact GGUF form: {e}") from None


def check_model(model: Model) -> None:
    """Refuse, before a loaded model is quantized for a GGUF file, one `write` would refuse for
    what it is or for its tokenizer."""
    gguf_vocab.check(model.tokenizer, _native(model).config.vocab_size)


def _native(model: Model) -> Llama:
    if not isinstance(model.net, Llama):
        raise SpecqError("only native models (the Llama family) are written to GGUF")
    return model.net


def write(model: Model, out: Path) -> Counter:
    """Write `model` (a native Llama) to the GGUF file `out`, atomically; the count of tensors
    written per GGUF type."""
    import gguf

    net = _native(model)
    c = net.config
    tensors = _tensors(net)
    tied = "output.weight" not in tensors
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(tmp, architectures.ARCHITECTURES[c.architecture].gguf)
    try:
        try:
            _add_config(writer, c, Path(model.source).name if model.source else model.ref)
            gguf_vocab.add_tokenizer(writer, model.tokenizer, c.vocab_size, model.eos_ids)
            counts = Counter(kind for _, kind in tensors.values())
            weights = Counter(kind for name, (array, kind) in tensors.items() if array.ndim == 2)
            writer.add_file_type(int(gguf.LlamaFileType[FILE_TYPES[weights.most_common(1)[0][0]]]))
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            for name, (array, kind) in tensors.items():
                writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType[kind])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        _check_read_back(tmp, dataclasses.replace(c, tie_word_embeddings=tied))
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no partial file
    return counts


def _check_read_back(path: Path, expected: LlamaConfig) -> None:
    """The written file's config as specq reads it must be the model's."""
    got = gguf_io.read(path).config
    if got != expected:
        diff = {f.name: (getattr(expected, f.name), getattr(got, f.name))
                for f in dataclasses.fields(expected)
                if getattr(expected, f.name) != getattr(got, f.name)}
        raise RuntimeError(f"the written GGUF reads back as another config: {diff}")


# ------------------------------------------------------------------ metadata

def _add_config(writer, c: LlamaConfig, name: str) -> None:
    """The architecture's config keys, as `architectures.fields_from_gguf` reads them."""
    arch = architectures.ARCHITECTURES[c.architecture]
    derived = architectures._GGUF_QUERY_SCALAR[arch.gguf](c.hidden_size, c.num_heads, c.head_dim,
                                                          c.num_layers)
    if c.query_pre_attn_scalar not in (None, derived):
        raise SpecqError(f"a query scale of {c.query_pre_attn_scalar} has no GGUF key "
                         f"({arch.gguf} files imply {derived})")
    if c.hidden_act != architectures._GGUF_ACTIVATION[arch.gguf]:
        raise SpecqError(f"{arch.gguf} files imply the activation "
                         f"{architectures._GGUF_ACTIVATION[arch.gguf]}, not {c.hidden_act}")
    if c.rope_scaling is not None and c.rope_scaling["rope_type"] not in ("linear", "llama3"):
        raise SpecqError(f"rope scaling {c.rope_scaling['rope_type']!r} has no GGUF form here")
    writer.add_name(name)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_vocab_size(c.vocab_size)
    if c.rope_scaling is not None and c.rope_scaling["rope_type"] == "linear":
        writer.add_rope_scaling_type("linear")
        writer.add_rope_scaling_factor(float(c.rope_scaling["factor"]))
    if c.sliding_window and c.sliding_layers:
        writer.add_sliding_window(c.sliding_window)
        sliding = [i in c.sliding_layers for i in range(c.num_layers)]
        implied = architectures._gguf_sliding_layers(arch.gguf_global_every, c.num_layers)
        if tuple(c.sliding_layers) != implied:
            writer.add_sliding_window_pattern(sliding)
        if c.rope_local_theta is not None:
            writer.add_rope_freq_base_swa(c.rope_local_theta)


# ------------------------------------------------------------------ tensors

def _tensors(net: Llama) -> dict[str, tuple[np.ndarray, str]]:
    """Every GGUF tensor of `net`: name -> (array as written, GGUF type name)."""
    c = net.config
    hf_names, gguf_names = architectures.hf_tensor_names(c), architectures.gguf_tensor_names(c)
    if c.tie_word_embeddings and isinstance(net.output, QuantLinear):  # a head quantized apart
        hf_names["output.weight"], gguf_names["output.weight"] = ("lm_head.weight",), (
            "output.weight",)
    floats = dict(net.state_dict())
    out = {}
    for native, parts in gguf_names.items():
        sizes = ([architectures.part_rows(h, c) for h in hf_names[native]] if len(parts) > 1
                 else None)
        if native in floats:
            out.update(_floats(floats[native], parts, sizes, c))
            continue
        module = net.get_submodule(native.removesuffix(".weight"))
        if isinstance(module, QuantLinear):
            if module.bias is not None:
                raise SpecqError(f"{native}: a quantized layer's bias has no GGUF tensor here")
            out.update(_quantized(module.quantized(), parts, sizes, c))
        else:
            raise SpecqError(f"{native} is a {type(module).__name__}, which specq does not write "
                             "to GGUF (a GGUF file already? use it as it is)")
    if c.rope_scaling is not None and c.rope_scaling["rope_type"] == "llama3":
        divisors = rope.inv_freq(c.rope_theta, c.head_dim) / rope.inv_freq(c.rope_theta, c.head_dim,
                                                                           c.rope_scaling)
        out["rope_freqs.weight"] = (divisors.float().numpy(), "F32")
    return out


def _permutation(name: str, rows: int, c: LlamaConfig) -> Tensor | None:
    """llama.cpp's q/k row order (its rope pairs adjacent dims) as row indices, where the
    architecture's files use it; `gguf_io._unpermute` undoes it."""
    if not architectures.ARCHITECTURES[c.architecture].permuted_qk:
        return None
    heads = (c.num_heads if ".attn_q." in name else c.num_kv_heads if ".attn_k." in name
             else None)
    if heads is None:
        return None
    return torch.arange(rows).view(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)


def _rows(total: int, parts: tuple[str, ...], sizes: list[int] | None):
    """(GGUF name, row slice) of each part of a row-concatenated native tensor."""
    if sizes is None:
        return [(parts[0], slice(0, total))]
    starts = np.cumsum([0, *sizes])
    return [(p, slice(int(a), int(b))) for p, a, b in zip(parts, starts[:-1], starts[1:])]


def _quantized(qw: QuantizedWeight, parts, sizes, c) -> dict[str, tuple[np.ndarray, str]]:
    out = {}
    for name, rows in _rows(qw.codes.shape[0], parts, sizes):
        index = torch.arange(qw.codes.shape[0])[rows]
        perm = _permutation(name, len(index), c)
        if perm is not None:
            index = index[perm]
        part = QuantizedWeight(qw.codes[index], qw.scales[index],
                               None if qw.zeros is None else qw.zeros[index], qw.bits,
                               qw.group_size)
        try:
            kind, blocks = gguf_blocks.to_blocks(part)
        except ValueError as e:
            raise SpecqError(f"{name} has no exact GGUF form: {e}; make it with `specq quantize "
                             "--format gguf` (scales whose offsets fp16 holds) or at a -sym spec "
                             "(Q4_0)") from None
        out[name] = (blocks, kind)
    return out


def _floats(tensor: Tensor, parts, sizes, c) -> dict[str, tuple[np.ndarray, str]]:
    tensor = tensor.detach()
    if tensor.dtype not in FLOAT_TYPES:
        raise SpecqError(f"{parts[0]}: dtype {tensor.dtype} has no GGUF type here")
    out = {}
    for name, rows in _rows(tensor.shape[0], parts, sizes):
        part = tensor[rows]
        perm = _permutation(name, part.shape[0], c)
        if perm is not None:
            part = part[perm]
        kind = FLOAT_TYPES[part.dtype] if part.ndim == 2 else "F32"  # norms, biases: F32
        part = part.float() if kind == "F32" else part
        array = (part.contiguous().view(torch.int16).numpy().view(np.uint16) if kind == "BF16"
                 else part.contiguous().numpy())
        out[name] = (array, kind)
    return out

