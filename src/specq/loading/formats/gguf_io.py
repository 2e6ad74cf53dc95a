"""Read GGUF files (llama.cpp's format) of the Llama family (llama, and Mistral written as llama;
qwen2, qwen3, gemma3, phi3: `model/architectures.py`) with the `gguf` library.

Why not transformers' GGUF loader: it needs `accelerate` only for this path, dequantizes every
tensor to fp32, and cannot hand back the file's own quantized blocks. Reading the file here
gives both: float weights for the one-off safetensors conversion, and the raw blocks of every
format `weights.gguf_formats` lists for running the file at its own precision (`name@gguf`). The
tokenizer still comes from transformers, which builds it from the file's metadata
without `accelerate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ...errors import SpecqError
from ...model import architectures
from ...model.llama import Llama, LlamaConfig
from ...weights.gguf_formats import FORMATS, kernel_weight
from . import gguf_checks
from .gguf_reader import Header, TokenType

if TYPE_CHECKING:
    from ...weights.quant.modules import FileBlocks


@dataclass
class GGUFFile:
    """A parsed GGUF file: the native config and its tensors by GGUF name (still
    in the file's format)."""

    path: Path
    config: LlamaConfig
    tensors: dict  # name -> gguf.ReaderTensor
    header: Header | None = field(default=None, repr=False)  # the mapped file the tensors view
    # dequantized once (a tied embedding is read twice)
    _floats: dict = field(default_factory=dict, repr=False)

    def qtype(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored rows, de-permuted like `float_tensor`
        (quantized: the byte blocks)."""
        data = np.asarray(self.tensors[name].data)
        return _unpermute(data, name, self.config)

    def float_tensor(self, name: str) -> Tensor:
        """The tensor dequantized to float32, in the Hugging Face row order."""
        if name not in self._floats:
            data = float32_array(self.tensors[name])
            self._floats[name] = torch.from_numpy(np.array(_unpermute(data, name, self.config),
                                                           dtype=np.float32))
        return self._floats[name]

    def native_names(self) -> dict[str, tuple[str, ...]]:
        """Each native parameter name -> the GGUF tensors it is made of (concatenated by rows)."""
        return architectures.gguf_tensor_names(self.config)

    def float_state_dict(self) -> dict[str, Tensor]:
        """Every weight dequantized to float32, in the native module's fused layout."""
        sd = {name: torch.cat([self.float_tensor(p) for p in parts])
              if len(parts) > 1 else self.float_tensor(parts[0])
              for name, parts in self.native_names().items()}
        if self.config.tie_word_embeddings:
            sd["output.weight"] = sd["tok_embeddings.weight"]
        return sd


def _unpermute(rows: np.ndarray, name: str, config: LlamaConfig) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (its rope pairs adjacent dims; HF's rotates halves)
    where its converter applies it (llama files; not qwen2, qwen3, gemma3, phi3). Rows are output
    features (of weights and biases), so the same permutation applies to float rows
    and quantized blocks."""
    if not architectures.ARCHITECTURES[config.architecture].permuted_qk:
        return rows
    if ".attn_q." in name:
        heads = config.num_heads
    elif ".attn_k." in name:
        heads = config.num_kv_heads
    else:
        return rows
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _field(reader, key: str, default=None):
    """A metadata value from the `gguf` library's reader (`write_float32` copies
    every field with it)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    if field.types and field.types[0].name == "ARRAY":
        return field.contents()
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    if value.dtype == np.float32:  # 1e-5 stored as float32: read back the 1e-5 it was written from
        return float(str(value[0]))
    return value.tolist()[0]


def read(path: Path) -> GGUFFile:
    """Parse a GGUF file's header; a corrupt or truncated file, one whose values do not make a model
    of its architecture (`gguf_checks`), or one of an architecture the native decoder does not run,
    is a one-line error. No tensor data is read."""
    path = Path(path)
    header = Header(path)  # a bad magic, truncated header or tensor data: one line
    config = LlamaConfig(**gguf_checks.config_fields(header))
    tensors = {t.name: t for t in header.tensors}
    with torch.device("meta"), _NoInit():  # shapes only
        shapes = {name: tuple(t.shape) for name, t in Llama(config).state_dict().items()}
    gguf_checks.tensors(path, config, tensors, shapes)
    return GGUFFile(path, config, tensors, header)


def tokenizer(path: Path):
    """The file's tokenizer, built by transformers from the GGUF metadata (slow: cache it)."""
    from transformers import AutoTokenizer

    header = Header(path)
    gguf_checks.tokenizer(header)
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:
        line = " ".join(str(e).split())[:200]
        raise SpecqError(f"cannot build a tokenizer from '{path}' ({type(e).__name__}: "
                         f"{line})") from None
    _restore_user_defined(tok, header)
    return tok


def _restore_user_defined(tok, header: Header) -> None:
    """llama.cpp matches a user-defined token whole in the raw text, and a Gemma file spells its
    runs of spaces (user-defined tokens) with spaces. transformers respells them with ▁ for its
    vocabulary, then looks for the file's spelling to add them and misses, so a run of spaces
    tokenizes by merges, apart from llama.cpp past 31 spaces. They are added here as the ▁ runs
    the normalizer makes of spaces."""
    from tokenizers import AddedToken

    types = header.fields.get("tokenizer.ggml.token_type")
    if not isinstance(types, list):
        return
    vocab, added = tok.get_vocab(), tok.added_tokens_decoder
    tokens = header.strings("tokenizer.ggml.tokens")
    missing = [AddedToken(respelled, normalized=True, special=False)
               for i, (token, kind) in enumerate(zip(tokens, types))
               if kind == TokenType.USER_DEFINED and i not in added
               and vocab.get(respelled := token.replace(" ", "▁")) == i and respelled != token]
    if missing:
        tok.add_tokens(missing)


def float32_array(tensor) -> np.ndarray:
    """A GGUF tensor as float32 in the file's own row order (no q/k de-permutation), as llama.cpp
    would read it back from an F32 file."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    data = np.asarray(tensor.data)
    if tensor.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        data = dequantize(data, tensor.tensor_type)
    return np.ascontiguousarray(data, dtype=np.float32)


def write_float32(src: Path, dst: Path) -> None:
    """Write GGUF file `src` again as `dst` with every tensor dequantized to float32 and its
    metadata copied (the file type set to all-F32). Why: so llama.cpp can run exactly the float
    weights that specq's fp32 model is converted from, for a like-for-like comparison. Tensors are
    dequantized one at a time (the F32 file can be several times the source's size);
    `dst` appears atomically."""
    import gguf

    read(src)  # a file whose header fails the checks: one line, and nothing written
    reader = gguf.GGUFReader(src)
    arch = _field(reader, "general.architecture")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        try:
            _copy_metadata(reader, writer)
            for t in reader.tensors:
                shape = _float32_shape(t)
                writer.add_tensor_info(t.name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t in reader.tensors:
                writer.write_tensor_data(float32_array(t))
        finally:
            writer.close()
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no partial file


def _float32_shape(tensor) -> tuple[int, ...]:
    """The numpy shape (outermost first) of a GGUF tensor once dequantized."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def _copy_metadata(reader, writer) -> None:
    """Every key/value of `reader` onto `writer` (the file type set to all-F32), but the fields the
    writer writes itself (GGUF.*, general.architecture)."""
    import gguf

    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == gguf.Keys.General.ARCHITECTURE:
            continue
        vtype = f.types[0]
        sub_type = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if f.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        elif f.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(value)
        writer.add_key_value(f.name, value, vtype, sub_type=sub_type)


# ------------------------------------------------------------------ the file's own precision

def _kernel_weight(g: GGUFFile, parts: tuple[str, ...]) -> FileBlocks | None:
    """These (row-concatenated) tensors as one `FileBlocks`, or None when one of them is a float
    type or has no row in `gguf_formats`."""
    from ...weights.quant.modules import FileBlocks

    formats = [FORMATS.get(g.qtype(p)) for p in parts]
    if any(f is None or f.kernel is None for f in formats):
        return None
    kind = "+".join(dict.fromkeys(f.name for f in formats))
    return FileBlocks(kernel_weight([(f.name, g.raw(p)) for f, p in zip(formats, parts)]), kind)


def _note(qtype: str) -> str | None:
    """What to tell the user about a weight tensor of this type that runs dequantized (float types:
    nothing)."""
    if qtype not in FORMATS:
        return f"{qtype} tensors run dequantized to float32 (specq has no kernel for {qtype})"
    return None if FORMATS[qtype].floats else f"{qtype} tensors run dequantized to float32"


class _NoInit(TorchFunctionMode):
    """Skip torch.nn.init's initializers (in this thread only). Why: on meta tensors they do nothing
    useful, and `normal_` there imports torch's compiler, seconds of a load."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return (*args, *kwargs.values())[0]  # the tensor, left as it is
        return func(*args, **kwargs)


def _drop_read_pages(g: GGUFFile) -> None:
    """Unmap the file's pages converted so far: they are not read again (the embedding's rows are
    looked up from the file and map again when read)."""
    if g.header is not None:
        g.header.drop_pages()


def load_at_file_precision(g: GGUFFile, given: dict[str, nn.Module] | None = None):
    """A native Llama whose linear layers (the tied head included) run the file's own blocks, any
    format of `weights.gguf_formats`, as `FileBlocks` (the int8-activation kernel on the fast path);
    the token embedding stays the file's rows (`FileEmbedding`, looked up row by row); float tensors
    and norms are float32 (other types: dequantized by gguf). The model is built on the meta device
    and each weight converted tensor by tensor, so no float copy of the whole model is ever made.
    `given` (module name -> module) takes the place of those modules' tensors, which are not read
    (a cached 4-bit body: `file_spec.cached_int4_body`).
    Returns (net, notes): a note for each quantized tensor type that runs dequantized to float32."""
    from ...weights.embedding import FileEmbedding

    with torch.device("meta"), _NoInit():  # shapes only: every tensor below comes from the file
        net = Llama(g.config)
    floats, notes = {}, set()
    names = g.native_names()
    (embedding,) = names.pop("tok_embeddings.weight")
    net.tok_embeddings = FileEmbedding(np.asarray(g.raw(embedding)).view(np.uint8),
                                       g.qtype(embedding), g.config.hidden_size)
    if g.config.tie_word_embeddings:
        names["output.weight"] = (embedding,)
    for name, parts in names.items():
        _drop_read_pages(g)
        blocks = (given or {}).get(name.removesuffix(".weight"))
        if (blocks is None and name.endswith(("wqkv.weight", "wo.weight", "w13.weight", "w2.weight",
                                              "output.weight"))):
            blocks = _kernel_weight(g, parts)
        if blocks is not None:
            net.set_submodule(name.removesuffix(".weight"), blocks)
            continue
        floats[name] = (torch.cat([g.float_tensor(p) for p in parts])
                        if len(parts) > 1 else g.float_tensor(parts[0]))
        if not name.endswith("norm.weight"):
            notes.update(note for p in parts if (note := _note(g.qtype(p))))
    _drop_read_pages(g)  # the last one too: a tied head is packed from the whole embedding
    missing, unexpected = net.load_state_dict(floats, strict=False, assign=True)
    left = [n for n, t in (*net.named_parameters(), *net.named_buffers()) if t.is_meta]
    if unexpected or missing or left:
        raise SpecqError(f"'{g.path}': tensors do not fit the model "
                         f"({(unexpected or missing or left)[0]})")
    return net.eval(), sorted(notes)
