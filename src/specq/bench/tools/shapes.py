"""GGUF files of real models' shapes (benchmarks/shape_files.py): the exact tensor names, shapes,
types and metadata of a 3-8B model, with valid blocks of random values and the real tokenizer of a
family specq ships.

Why: no 3-8B model installs offline here, and what a pass costs depends on its shapes and block
types, not on the values in the blocks; both specq and llama.cpp run such a file (its text is
noise). Which tensor gets which type follows llama.cpp's quantizer for the file type
(`llama_tensor_get_type`): Q4_K_M's attn_v and ffn_down in Q6_K on the layers `more_bits` names,
the output in Q6_K (the embedding when the output is tied to it), and a row whose length is no
multiple of a K-quant's 256 falls back to a 32-block type. Checked against the Qwen2.5-Coder
1.5B and 0.5B files (tests/bench/test_shapes.py, `real`)."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from ...loading import builtins
from ...loading.formats.gguf_reader import SKIPPED, Header

# A shape's tokenizer family -> the built-in whose file holds it. Llama 3's 128k tokenizer ships
# with no package here: the Llama shape pads SmolLM2's list to its vocabulary.
TOKENIZERS = {"qwen": "qwen2.5-coder-1.5b", "smollm2": "smollm2-135m"}
TOKENIZER_PREFIX = "tokenizer."
ARRAYS = {"tokenizer.ggml.tokens": V.STRING, "tokenizer.ggml.merges": V.STRING,
          "tokenizer.ggml.token_type": V.INT32, "tokenizer.ggml.scores": V.FLOAT32}
# The token list's padding past the tokenizer's own tokens, as llama.cpp's converter writes it.
PADDING = {"tokenizer.ggml.tokens": "[PAD{}]".format,
           "tokenizer.ggml.token_type": lambda i: int(gguf.TokenType.UNUSED),
           "tokenizer.ggml.scores": lambda i: 0.0}
SCALAR_TYPES = {bool: V.BOOL, int: V.UINT32, float: V.FLOAT32, str: V.STRING}


@dataclass(frozen=True)
class Shape:
    """A model's shape as its GGUF file holds it (llama.cpp's architecture names)."""
    name: str
    arch: str  # "llama", "qwen2", "qwen3"
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int  # rows of the embedding (the token list is padded to it)
    context: int
    rope_base: float
    norm_eps: float
    tokenizer: str  # whose token list: a key of TOKENIZERS
    head_dim: int | None = None  # None: hidden / heads
    qkv_bias: bool = False
    qk_norm: bool = False
    tied: bool = False  # no output tensor: the embedding is the head
    llama3_rope: tuple[float, float, float, int] | None = None  # factor, low, high, old context

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def macs_per_row(self) -> int:
        """Multiply-adds of the linear layers and the head for one row of a pass (attention over
        the context left out: small beside them at a few hundred tokens)."""
        q, kv = self.heads * self.dim, self.kv_heads * self.dim
        layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.ffn
        return self.layers * layer + self.hidden * self.vocab


# From each model's config.json (Hugging Face), as llama.cpp's converter writes it.
SHAPES = {s.name: s for s in [
    Shape("qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 152064, 32768, 1e6, 1e-6, "qwen",
          qkv_bias=True),
    Shape("llama-3.1-8b", "llama", 32, 4096, 14336, 32, 8, 128256, 131072, 5e5, 1e-5, "smollm2",
          llama3_rope=(8.0, 1.0, 4.0, 8192)),
    Shape("qwen3-4b", "qwen3", 36, 2560, 9728, 32, 8, 151936, 40960, 1e6, 1e-6, "qwen",
          head_dim=128, qk_norm=True, tied=True),
    # The shipped files' own shapes: what the type rules are checked against.
    Shape("qwen2.5-coder-1.5b", "qwen2", 28, 1536, 8960, 12, 2, 151936, 32768, 1e6, 1e-6, "qwen",
          qkv_bias=True),
    Shape("qwen2.5-coder-0.5b", "qwen2", 24, 896, 4864, 14, 2, 151936, 32768, 1e6, 1e-6, "qwen",
          qkv_bias=True),
]}
# The 3-8B shapes a run of benchmarks/shape_files.py writes by default, with their file types.
DEFAULT_FILES = [("qwen2.5-7b", "Q4_K_M"), ("qwen2.5-7b", "Q4_0"), ("qwen2.5-7b", "Q8_0"),
                 ("llama-3.1-8b", "Q4_K_M"), ("qwen3-4b", "Q4_K_M")]


@dataclass(frozen=True)
class FileType:
    """A llama.cpp file type: its number in `general.file_type` and its tensors' types."""
    number: int
    base: T  # every matrix not named below
    more_bits: T | None  # attn_v and ffn_down on the layers `more_bits` names
    head: T  # the output (or the tied embedding)


FILE_TYPES = {"Q4_K_M": FileType(15, T.Q4_K, T.Q6_K, T.Q6_K),
              "Q4_0": FileType(2, T.Q4_0, None, T.Q6_K),
              "Q8_0": FileType(7, T.Q8_0, None, T.Q8_0)}
# A K-quant on rows that are no multiple of 256: llama.cpp's fallback.
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
# Where each block type keeps its float16 scales (byte ranges in a block): set to a small normal
# value so that the random codes give finite, modest weights.
SCALE_BYTES = {T.Q4_0: [(0, 2)], T.Q4_1: [(0, 2), (2, 4)], T.Q5_0: [(0, 2)],
               T.Q5_1: [(0, 2), (2, 4)], T.Q8_0: [(0, 2)], T.Q4_K: [(0, 2), (2, 4)],
               T.Q5_K: [(0, 2), (2, 4)], T.Q6_K: [(208, 210)]}
SCALE = np.float16(2.0 ** -14)


def more_bits(layer: int, layers: int) -> bool:
    """Whether Q4_K_M gives this layer's attn_v and ffn_down more bits. llama.cpp's
    `use_more_bits(i, n)` (the first and last eighth and every third) counts i in the order the
    quantizer meets the layers, and the converted files it reads list them sorted as text (blk.0,
    blk.1, blk.10, ...): the i-th layer met is the i-th of the numbers sorted as strings."""
    met = sorted(range(layers), key=str).index(layer)
    return met < layers // 8 or met >= 7 * layers // 8 or (met - layers // 8) % 3 == 2


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape: rows, columns) of every tensor, in the converter's order."""
    q, kv = s.heads * s.dim, s.kv_heads * s.dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (s.vocab, s.hidden))]
    if s.llama3_rope is not None:
        out.append(("rope_freqs.weight", (s.dim // 2,)))
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.hidden,)), (b + "attn_q.weight", (q, s.hidden)),
                (b + "attn_k.weight", (kv, s.hidden)), (b + "attn_v.weight", (kv, s.hidden))]
        if s.qkv_bias:
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.bias", (kv,))]
        if s.qk_norm:
            out += [(b + "attn_q_norm.weight", (s.dim,)), (b + "attn_k_norm.weight", (s.dim,))]
        out += [(b + "attn_output.weight", (s.hidden, q)), (b + "ffn_norm.weight", (s.hidden,)),
                (b + "ffn_gate.weight", (s.ffn, s.hidden)),
                (b + "ffn_up.weight", (s.ffn, s.hidden)),
                (b + "ffn_down.weight", (s.hidden, s.ffn))]
    out.append(("output_norm.weight", (s.hidden,)))
    if not s.tied:
        out.append(("output.weight", (s.vocab, s.hidden)))
    return out


def tensor_type(name: str, shape: tuple[int, ...], s: Shape, ft: FileType) -> T:
    """The type llama.cpp's quantizer gives this tensor in a file of type `ft`."""
    if len(shape) == 1:
        return T.F32  # norms, biases, rope factors
    if name == "output.weight" or (s.tied and name == "token_embd.weight"):
        kind = ft.head
    elif ft.more_bits is not None and name.split(".")[-2] in ("attn_v", "ffn_down") \
            and more_bits(int(name.split(".")[1]), s.layers):
        kind = ft.more_bits
    else:
        kind = ft.base
    block = gguf.GGML_QUANT_SIZES[kind][0]
    return FALLBACK.get(kind, kind) if shape[-1] % block else kind


def llama3_factors(s: Shape) -> np.ndarray:
    """Llama 3.1's rope_freqs: each frequency's divisor, as llama.cpp's converter computes it."""
    factor, low, high, old = s.llama3_rope
    freqs = s.rope_base ** -(np.arange(0, s.dim, 2, dtype=np.float64) / s.dim)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def random_blocks(kind: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] uint8: random codes, every float16 scale set to SCALE."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for start, end in SCALE_BYTES[kind]:
        data[:, :, start:end] = np.frombuffer(SCALE.tobytes(), dtype=np.uint8)
    return data.reshape(rows, -1)


def float_tensor(name: str, shape: tuple[int, ...], s: Shape) -> np.ndarray:
    if name == "rope_freqs.weight":
        return llama3_factors(s)
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=np.float32)
    return np.ones(shape, dtype=np.float32)  # a norm


def tokenizer_file(family: str) -> Path:
    """The built-in GGUF file whose tokenizer a shape borrows (the Qwen file needs `make
    setup-coder`)."""
    return builtins.BUILTIN_GGUF[TOKENIZERS[family]]()


def tokenizer_fields(source: Path, vocab: int) -> list[tuple[str, object, V, V | None]]:
    """(key, value, type, item type) of a GGUF file's tokenizer.* metadata, its token list padded
    to `vocab` entries. Read with specq's header reader (gguf's takes seconds on a vocabulary),
    which keeps values, not types: arrays get theirs from ARRAYS, scalars from their Python type."""
    header = Header(source)
    out = []
    for key, value in header.fields.items():
        if not key.startswith(TOKENIZER_PREFIX):
            continue
        if value is SKIPPED:
            value = header.strings(key)
        if key in ARRAYS:
            if key in PADDING:
                if len(value) > vocab:
                    raise ValueError(f"{source} holds {len(value)} tokens, more than {vocab}")
                value = list(value) + [PADDING[key](i) for i in range(len(value), vocab)]
            out.append((key, value, V.ARRAY, ARRAYS[key]))
        else:
            out.append((key, value, SCALAR_TYPES[type(value)], None))
    return out


def write(s: Shape, file_type: str, tokenizer: Path, out: Path, seed: int = 0) -> None:
    """Write `out` (atomically): the shape `s` at `file_type`, random blocks, `tokenizer`'s
    tokenizer (a GGUF file of the family) padded to the shape's vocabulary."""
    ft = FILE_TYPES[file_type]
    rng = np.random.default_rng(seed)
    layout = tensors(s)

    def body(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, s.arch)
        w.add_name(f"{s.name} shape, random weights")
        w.add_file_type(ft.number)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(s.context)
        w.add_embedding_length(s.hidden)
        w.add_block_count(s.layers)
        w.add_feed_forward_length(s.ffn)
        w.add_head_count(s.heads)
        w.add_head_count_kv(s.kv_heads)
        w.add_rope_freq_base(s.rope_base)
        w.add_layer_norm_rms_eps(s.norm_eps)
        if s.arch == "llama":  # the keys Llama files add (their converter's)
            w.add_rope_dimension_count(s.dim)
            w.add_vocab_size(s.vocab)
        if s.head_dim is not None:
            w.add_key_length(s.dim)
            w.add_value_length(s.dim)
        for key, value, vtype, sub in tokenizer_fields(tokenizer, s.vocab):
            w.add_key_value(key, value, vtype, sub)
        for name, shape in layout:
            kind = tensor_type(name, shape, s, ft)
            if kind == T.F32:
                w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * math.prod(shape))
            else:
                block, size = gguf.GGML_QUANT_SIZES[kind]
                nbytes = shape[0] * shape[1] // block * size
                w.add_tensor_info(name, (shape[0], shape[1] // block * size),
                                  np.dtype(np.uint8), nbytes, raw_dtype=kind)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, shape in layout:
            kind = tensor_type(name, shape, s, ft)
            data = float_tensor(name, shape, s) if kind == T.F32 else \
                random_blocks(kind, shape[0], shape[1], rng)
            w.write_tensor_data(data)
        w.close()

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        body(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp's file is the owner's alone
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
