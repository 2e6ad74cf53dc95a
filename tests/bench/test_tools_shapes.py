"""GGUF files of real models' shapes (bench/tools/shapes.py): the type rules of llama.cpp's
quantizer, files specq loads and runs, and (real) the shipped Qwen files' own headers."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import specq
from specq.bench.tools import shapes
from specq.loading.formats import packaged
from specq.loading.formats.gguf_reader import Header

T = gguf.GGMLQuantizationType
# Tiny shapes with every switch the table's real shapes use (K-quant rows: hidden 256).
TINY = {
    "llama3": shapes.Shape("tiny-llama3", "llama", 3, 256, 512, 4, 2, 49160, 2048, 5e5, 1e-5,
                           "smollm2", llama3_rope=(8.0, 1.0, 4.0, 8192)),
    "qwen2": shapes.Shape("tiny-qwen2", "qwen2", 2, 256, 512, 4, 2, 49152, 2048, 1e6, 1e-6,
                          "smollm2", qkv_bias=True),
    "qwen3": shapes.Shape("tiny-qwen3", "qwen3", 2, 256, 512, 4, 2, 49152, 2048, 1e6, 1e-6,
                          "smollm2", head_dim=128, qk_norm=True, tied=True),
}


def test_more_bits_follows_the_order_the_quantizer_meets_the_layers():
    """The layers whose attn_v and ffn_down are Q6_K in the shipped Q4_K_M files (read from their
    headers): not llama.cpp's rule on the layer number, but on the layer's place in text order."""
    assert {i for i in range(28) if shapes.more_bits(i, 28)} == {0, 1, 5, 6, 7, 8, 9, 10, 13, 16,
                                                                  19, 21, 24, 27}
    assert {i for i in range(24) if shapes.more_bits(i, 24)} == {0, 1, 3, 6, 7, 8, 9, 10, 13, 16,
                                                                  19, 21}


def test_types_follow_the_file_type():
    s = shapes.SHAPES["qwen2.5-7b"]
    kinds = {name: shapes.tensor_type(name, shape, s, shapes.FILE_TYPES["Q4_K_M"])
             for name, shape in shapes.tensors(s)}
    assert kinds["output.weight"] == T.Q6_K and kinds["token_embd.weight"] == T.Q4_K
    assert kinds["blk.0.attn_v.weight"] == T.Q6_K and kinds["blk.2.attn_v.weight"] == T.Q4_K
    assert kinds["blk.0.attn_q.bias"] == T.F32
    tied = shapes.SHAPES["qwen3-4b"]
    assert "output.weight" not in dict(shapes.tensors(tied))
    assert shapes.tensor_type("token_embd.weight", (tied.vocab, tied.hidden), tied,
                              shapes.FILE_TYPES["Q4_K_M"]) == T.Q6_K  # the tied head
    q8 = {shapes.tensor_type(n, sh, s, shapes.FILE_TYPES["Q8_0"]) for n, sh in shapes.tensors(s)}
    assert q8 == {T.Q8_0, T.F32}
    narrow = shapes.Shape("narrow", "qwen2", 1, 896, 4864, 14, 2, 1000, 64, 1e6, 1e-6, "qwen")
    assert shapes.tensor_type("blk.0.attn_q.weight", (896, 896), narrow,
                              shapes.FILE_TYPES["Q4_K_M"]) == T.Q5_0  # 896 % 256: fallback


def test_7b_shape_holds_the_7b_parameter_count():
    s = shapes.SHAPES["qwen2.5-7b"]
    params = sum(int(np.prod(shape)) for _, shape in shapes.tensors(s))
    assert 7.6e9 < params < 7.7e9  # Qwen2.5-7B: 7.62 B
    s = shapes.SHAPES["llama-3.1-8b"]
    assert 8.0e9 < sum(int(np.prod(shape)) for _, shape in shapes.tensors(s)) < 8.1e9  # 8.03 B


@pytest.mark.parametrize("tiny,file_type", [("llama3", "Q4_K_M"), ("qwen2", "Q4_0"),
                                            ("qwen3", "Q8_0"), ("qwen3", "Q4_K_M")])
def test_written_file_has_the_shape_and_runs(tmp_path, tiny, file_type):
    s = TINY[tiny]
    path = tmp_path / "f.gguf"
    shapes.write(s, file_type, shapes.tokenizer_file(s.tokenizer), path)
    header = Header(path)
    written = {t.name: (t.tensor_type, tuple(reversed(t.shape))) for t in header.tensors}
    assert written == {name: (shapes.tensor_type(name, shape, s, shapes.FILE_TYPES[file_type]),
                              shape) for name, shape in shapes.tensors(s)}
    tokens = header.strings("tokenizer.ggml.tokens")
    assert len(tokens) == s.vocab and tokens[0] == "<|endoftext|>"
    block = next(t for t in header.tensors if t.tensor_type not in (T.F32,))
    weights = gguf.quants.dequantize(np.asarray(block.data), block.tensor_type)
    assert np.isfinite(weights).all() and 0 < np.abs(weights).max() < 1
    model = specq.load(str(path))
    assert model.net.config.num_layers == s.layers and model.net.config.head_dim == s.dim
    if s.llama3_rope is not None:
        assert model.net.config.rope_scaling["rope_type"] == "llama3"
    out = specq.generate(model, "Hello", None, max_new_tokens=3)
    assert len(out.token_ids) == 3


@pytest.mark.real
@pytest.mark.parametrize("name,f", [("qwen2.5-coder-1.5b", packaged.QWEN_CODER_1_5B),
                                    ("qwen2.5-coder-0.5b", packaged.QWEN_CODER_0_5B)])
def test_table_reproduces_the_shipped_files(name, f):
    """Every tensor's name, shape and type as in the real Q4_K_M files (the 0.5B's rows of 896
    fall back from K-quants), and their config keys."""
    s = shapes.SHAPES[name]
    header = Header(packaged.path(f))
    real = {t.name: (t.tensor_type, tuple(reversed(t.shape))) for t in header.tensors}
    assert real == {n: (shapes.tensor_type(n, sh, s, shapes.FILE_TYPES["Q4_K_M"]), sh)
                    for n, sh in shapes.tensors(s)}
    assert len(header.strings("tokenizer.ggml.tokens")) == s.vocab
    key = header.fields.__getitem__
    assert (key("qwen2.block_count"), key("qwen2.embedding_length"),
            key("qwen2.feed_forward_length"), key("qwen2.attention.head_count"),
            key("qwen2.attention.head_count_kv"), key("qwen2.context_length"),
            key("qwen2.rope.freq_base")) == (s.layers, s.hidden, s.ffn, s.heads, s.kv_heads,
                                             s.context, s.rope_base)
