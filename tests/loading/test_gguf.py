"""GGUF files: llama.cpp's layout read back exactly, corrupt files as one-line errors, and the
built-in target's first conversion (run from an empty cache, so CI always exercises it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specq.errors import SpecqError
from specq.loading.formats import gguf_io

from conftest import assert_speculative_is_plain, tiny_model, write_tiny_gguf


def test_float_gguf_reads_back_exactly(tmp_path):
    model = tiny_model(vocab=48, hidden=64)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, model)
    parsed = gguf_io.read(path)
    assert parsed.config == model.net.config
    state = parsed.float_state_dict()
    for name, value in model.net.state_dict().items():
        assert torch.equal(state[name], value), name  # q/k rows back in the Hugging Face order


def test_float32_copy_holds_the_dequantized_weights_and_the_metadata(tmp_path):
    """`write_float32` (llama.cpp's side of the F32 comparison): every tensor is F32 and equal,
    bit for bit, to gguf's dequantization of the source; every key/value is
    copied but the file type."""
    import gguf
    from gguf.quants import dequantize

    def extra(w) -> None:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(48)])
        w.add_token_scores([float(i) / 3 for i in range(48)])
        w.add_bos_token_id(1)

    model = tiny_model(vocab=48, hidden=64)
    src, dst = tmp_path / "tiny.Q4_1.gguf", tmp_path / "out" / "tiny.F32.gguf"
    write_tiny_gguf(src, model, "Q4_1", extra)
    gguf_io.write_float32(src, dst)
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(dst)

    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert {t.tensor_type.name for t in a.tensors} == {"Q4_1", "F32"}
    for ta, tb in zip(a.tensors, b.tensors):
        assert tb.tensor_type == gguf.GGMLQuantizationType.F32, tb.name
        expected = (np.asarray(ta.data) if ta.tensor_type.name == "F32"
                    else dequantize(np.asarray(ta.data), ta.tensor_type))
        assert (tb.shape.tolist() == ta.shape.tolist()
                and np.array_equal(np.asarray(tb.data), expected)), tb.name

    file_type = gguf.Keys.General.FILE_TYPE
    assert b.fields[file_type].contents() == gguf.LlamaFileType.ALL_F32
    for name, field in a.fields.items():
        if name.startswith("GGUF.") or name == file_type:
            continue
        assert (b.fields[name].types == field.types
                and b.fields[name].contents() == field.contents()), name
    assert set(b.fields) == set(a.fields)

    # the model specq builds from either file
    same, converted = gguf_io.read(src), gguf_io.read(dst)
    assert converted.config == same.config
    for name, value in same.float_state_dict().items():
        assert torch.equal(converted.float_state_dict()[name], value), name


@pytest.mark.parametrize("damage", ["empty", "random", "truncated"])
def test_corrupt_gguf_is_one_line(tmp_path, damage):
    path = tmp_path / "bad.gguf"
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    else:
        write_tiny_gguf(path, tiny_model(vocab=48, hidden=64))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecqError) as e:
        gguf_io.read(path)
    assert "\n" not in str(e.value) and "bad.gguf" in str(e.value)


def test_builtin_target_converts_from_an_empty_cache(tmp_path, monkeypatch):
    """The first run on a fresh machine converts the shipped GGUF file (no `accelerate`, no hub)."""
    import specq
    from specq.loading import builtins

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    path = builtins.BUILTINS["smollm2-135m"]()
    assert path == tmp_path / "smollm2-135m" and (path / "model.safetensors").is_file()
    target = specq.load("smollm2-135m")
    assert target.source == str(path)
    out = specq.generate(target, "The capital of France is", None, max_new_tokens=4)
    assert "Paris" in out.text  # a wrong q/k order or head would not answer this


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_file_precision_runs_the_files_own_blocks(tmp_path, qtype, fast):
    """@gguf: eager, Q4_0 / Q4_1 blocks on torch's int4 kernel (the file's codes, only the scales
    rounded to its bf16) and Q8_0 in bf16; on the fast path, every type on the int8-activation
    kernel with the file's own codes and scales. Logits stay close to the dequantized model."""
    from specq import backends
    from specq.kernels import int8dot
    from specq.weights.quant.modules import FileBlocks

    if fast and not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")

    model = tiny_model(vocab=48, hidden=64, scale=3.0)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, model, qtype)
    parsed = gguf_io.read(path)
    net, notes = gguf_io.load_at_file_precision(parsed)
    assert notes == []
    for module in (net.layers[0].attention.wqkv, net.layers[1].feed_forward.w2):
        assert isinstance(module, FileBlocks) and module.bits == (8 if qtype == "Q8_0" else 4)
    run = backends.runner(net, "kernels" if fast else "eager")
    if fast:
        assert len(run.kernels) == 2 * 4 + 1 and "int8dot" in run.kernels[net.output].name

    reference = parsed.float_state_dict()  # gguf's own dequantization, in the native layout
    for name in ("layers.0.attention.wqkv", "layers.1.feed_forward.w13", "output"):
        module = net.get_submodule(name)
        eye = torch.eye(module.in_features)
        weight = run.linear(module, eye).t()  # every column of the executed weight
        expected = reference[f"{name}.weight"]
        assert weight.shape == expected.shape
        # one-hot rows quantize to int8 exactly: the file's own weights, up to float rounding
        if fast:
            torch.testing.assert_close(weight, expected, rtol=1e-5, atol=1e-6)
        else:
            # bf16 scales/zeros (int4) or bf16 weights (Q8_0): within a few bf16 steps of each value
            assert torch.allclose(weight, expected, rtol=2 ** -6,
                                  atol=2 ** -6 * expected.abs().max().item()), name

    ids = torch.tensor([1, 5, 9, 2, 7, 3])
    float_net = tiny_model(vocab=48, hidden=64).net
    float_net.load_state_dict(reference)
    with torch.inference_mode():
        a, b = float_net(ids), run(ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 5 / 6


@pytest.mark.parametrize("suffix", ["", "@gguf"])
def test_corrupt_gguf_target_exits_2_before_anything_is_cached(tmp_path, monkeypatch,
                                                               capsys, suffix):
    from specq.cli import main

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(np.random.default_rng(1).bytes(1000))
    assert main(["generate", "hi", "--target", f"{bad}{suffix}", "--no-speculative"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.gguf" in err and "Traceback" not in err
    assert not list((tmp_path / "cache").glob("gguf/*"))  # no half-converted cache left behind


def tied_gguf(path, qtype: str, seed: int = 0, vocab: int = 48):
    """A tiny tied-head Llama (the 0.5B Qwen2.5's layout) written as a GGUF file of `qtype` linears;
    returns the float model it was written from."""
    import dataclasses

    from specq.core.types import Model
    from specq.model.llama import Llama

    model = tiny_model(vocab=vocab, hidden=64, scale=3.0, seed=seed)
    net = Llama(dataclasses.replace(model.net.config, tie_word_embeddings=True))
    net.load_state_dict({k: v for k, v in model.net.state_dict().items() if k != "output.weight"},
                        strict=False)
    model = Model(ref="tied", net=net.eval(), tokenizer=model.tokenizer, eos_ids=frozenset(),
                  source="random")
    write_tiny_gguf(path, model, qtype)
    return model


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "F16"])
def test_tied_embedding_stays_in_the_files_format(tmp_path, qtype, fast):
    """@gguf keeps no float copy of the embedding: its rows are looked up from the file, a quantized
    tied head runs the same blocks on the kernels, and the logits are bit for bit those of the same
    model with gguf's dequantized embedding as an `nn.Embedding` (how it was loaded before)."""
    import copy

    from specq import backends
    from specq.kernels import int8dot
    from specq.weights.embedding import FileEmbedding
    from specq.weights.quant.modules import FileBlocks

    if fast and not int8dot.available():
        pytest.skip("needs AVX2 and a C compiler")
    tied_gguf(tmp_path / "tied.gguf", qtype)
    parsed = gguf_io.read(tmp_path / "tied.gguf")
    assert parsed.config.tie_word_embeddings
    net, _ = gguf_io.load_at_file_precision(parsed)
    assert isinstance(net.tok_embeddings, FileEmbedding)
    assert isinstance(net.output, FileBlocks) == (qtype != "F16")
    floats = [n for n, p in net.named_parameters() if p.shape[0] == 48]
    # a float head is the only float copy
    assert floats == ([] if qtype != "F16" else ["output.weight"])
    assert not any(t.is_meta for t in (*net.parameters(), *net.buffers()))
    before = copy.deepcopy(net)
    before.tok_embeddings = torch.nn.Embedding.from_pretrained(
        parsed.float_tensor("token_embd.weight"))
    ids = torch.tensor([1, 5, 9, 2, 7, 3, 5])
    backend = "kernels" if fast else "eager"
    with torch.inference_mode():
        assert torch.equal(backends.runner(net, backend)(ids),
                           backends.runner(before, backend)(ids))


def _resident_bytes(path) -> int | None:
    """Bytes of `path`'s mappings resident in this process (Linux's smaps), else None."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    total, mapped = 0, False
    for line in lines:
        if line[:1] in "0123456789abcdef" and "-" in line.split()[0]:
            mapped = line.endswith(str(path))
        elif mapped and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_tied_head_leaves_no_file_pages_resident(tmp_path):
    """Packing a tied head reads the whole embedding from the file; those pages are unmapped once
    loading ends (the embedding's rows map again when looked up), so what stays resident is the
    packed weights, not the file besides. The embedding here is 272 pages of Q8_0."""
    path = tmp_path / "tied.gguf"
    tied_gguf(path, "Q8_0", vocab=16384)
    parsed = gguf_io.read(path)
    net, _ = gguf_io.load_at_file_precision(parsed)
    resident = _resident_bytes(path)
    if resident is None:
        pytest.skip("needs /proc/self/smaps")
    embedding_bytes = 16384 * 64 * 34 // 32
    assert resident < embedding_bytes // 8, resident


def test_tied_file_greedy_speculative_equals_plain(tmp_path):
    from specq import backends
    from specq.kernels import int8dot
    from specq.core.types import Model

    from conftest import perturbed

    float_model = tied_gguf(tmp_path / "tied.gguf", "Q8_0")
    net, _ = gguf_io.load_at_file_precision(gguf_io.read(tmp_path / "tied.gguf"))
    target = Model(ref="tied.gguf@gguf", net=net, tokenizer=float_model.tokenizer,
                   eos_ids=frozenset(), source="tied.gguf",
                   runner=backends.runner(net, "kernels" if int8dot.available() else "eager"))
    draft = perturbed(float_model, 0.3)
    assert_speculative_is_plain(target, draft)


def test_cached_tokenizer_gives_the_files_own_tokens(tmp_path, monkeypatch):
    """A GGUF file's tokenizer, reloaded from its cache as the generic backend (no Python copy of
    the vocabulary kept), encodes, decodes and applies the chat template as the tokenizer
    transformers builds from the file's metadata (the built-in file; the Qwen pair's
    in test_real_pair.py)."""
    from specq.loading import builtins

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path))
    assert_cached_tokenizer_is_the_files(builtins.BUILTIN_GGUF["smollm2-135m"](), monkeypatch)


TOKENIZER_TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
                   " leading space", "a" * 50, "Héllo wörld 你好 \t\t x<|im_end|><|endoftext|>",
                   "The capital of France is"]


def assert_cached_tokenizer_is_the_files(path, monkeypatch) -> None:
    """`gguf_load.tokenizer` (built once from the file, saved, reloaded) against what transformers
    built from the file's metadata on the way (one build: tens of seconds for
    a large vocabulary)."""
    from specq.loading.formats import gguf_load

    built, build = [], gguf_io.tokenizer
    monkeypatch.setattr(gguf_io, "tokenizer", lambda p: built.append(build(p)) or built[-1])
    cached = gguf_load.tokenizer(path)
    assert len(built) == 1 and type(cached).__name__ == "TokenizersBackend"
    assert_same_tokenizer(cached, built[0])


def assert_same_tokenizer(cached, reference) -> None:
    for text in TOKENIZER_TEXTS:
        ids = reference(text)["input_ids"]
        assert cached(text)["input_ids"] == ids, text
        assert cached.decode(ids) == reference.decode(ids)
    chat = [{"role": "user", "content": "Write a binary search in Python."}]
    assert (cached.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    assert (cached.eos_token_id, cached.bos_token_id, cached.pad_token_id, len(cached)) == \
           (reference.eos_token_id, reference.bos_token_id, reference.pad_token_id, len(reference))
    assert cached.get_vocab() == reference.get_vocab()
