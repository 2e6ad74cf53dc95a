"""GGUF out: specq's integer weights as Q4_0 / Q4_1 / Q8_0 blocks that gguf dequantizes to
specq's weights bit for bit, the written file loaded back by specq with the source's greedy
output and tokenizer, llama.cpp's greedy tokens on it (where a build is present), and the
refusals as one line before any model loads."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

import specq
from specq import backends
from specq.cli import main
from specq.core.types import Model
from specq.kernels import int8dot
from specq.loading.formats import gguf_io, gguf_write
from specq.loading.formats.save import save_native
from specq.loading.kinds import load
from specq.weights import gguf_blocks
from specq.weights.quant import quantize_model
from specq.weights.quant.rtn import QuantizedWeight, fp16_offsets, quantize_rtn

from conftest import GGUF_TOKENS, add_bpe_tokenizer, tiny_model, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = len(GGUF_TOKENS)
TEMPLATE = "{% for m in messages %}<|im_end|>{{ m['content'] }}{% endfor %}"
TEXTS = ["abc ab ba", "Hello World 123", "  leading spaces\tand tabs", "zzz<|im_end|>x"]
# spec -> the GGUF type of its body
SPECS = {"int4-g32-rtn": "Q4_1", "int4-g64-rtn-sym": "Q4_0", "int3-g32-rtn": "Q4_1",
         "int2-g32-rtn-sym": "Q4_0", "int8": "Q8_0", "int8-g32": "Q8_0", "int6-g32-rtn": "Q8_0"}


def _backend() -> str:
    return "kernels" if int8dot.available() else "eager"


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer (GGUF_TOKENS) as transformers builds it from a llama GGUF file,
    with a chat template."""
    path = tmp_path_factory.mktemp("tok") / "tok.gguf"
    write_tiny_gguf(path, tiny_model(vocab=VOCAB), extra=add_bpe_tokenizer)
    tok = gguf_io.tokenizer(path)
    tok.chat_template = TEMPLATE
    return tok


def _model(tok, seed: int = 0, **switches) -> Model:
    model = tiny_model(vocab=VOCAB, hidden=64, scale=3.0, seed=seed, eos=(VOCAB - 1,), **switches)
    model.tokenizer = tok
    return model


def _quantized(model: Model, spec: str) -> Model:
    with fp16_offsets():
        quantize_model(model.net, spec, progress=False)
    model.runner = backends.runner(model.net, _backend())
    return model


@pytest.mark.parametrize("spec", SPECS)
def test_blocks_dequantize_to_specqs_weights_bit_for_bit(spec):
    """gguf's dequantization of the blocks equals specq's dequantized weight exactly."""
    from specq.weights.quant.spec import parse_spec

    s = parse_spec(spec)
    torch.manual_seed(0)
    weight = torch.randn(48, 256) * torch.rand(48, 1) * 0.1  # rows of many magnitudes
    with fp16_offsets():
        qw = quantize_rtn(weight, s.bits, s.group_size or 256, s.symmetric)
    kind, blocks = gguf_blocks.to_blocks(qw)
    assert kind == SPECS[spec]
    got = dequantize(blocks, GGMLQuantizationType[kind])
    assert torch.equal(torch.from_numpy(np.asarray(got, dtype=np.float32)), qw.dequantize())


def test_bf16_grid_offsets_are_refused_and_fp16_offsets_hold_them():
    """A bf16 scale of 8 significant bits times a zero point of 15 needs 12 bits, more than fp16's
    11: Q4_1 cannot hold that offset, and to_blocks says so; the default grid makes such groups,
    `fp16_offsets` never does."""
    scale = torch.tensor([[255 / 128]], dtype=torch.bfloat16)  # 1.1111111b
    qw = QuantizedWeight(torch.full((1, 32), 3, dtype=torch.int16), scale,
                         torch.tensor([[15]], dtype=torch.uint8), 4, 32)
    with pytest.raises(ValueError, match="zero-point offsets"):
        gguf_blocks.to_blocks(qw)
    torch.manual_seed(1)
    weight = torch.randn(256, 256) * 0.05
    with pytest.raises(ValueError, match="not fp16 values"):
        gguf_blocks.to_blocks(quantize_rtn(weight, 4, 32, symmetric=False))
    with fp16_offsets():
        gguf_blocks.to_blocks(quantize_rtn(weight, 4, 32, symmetric=False))


ARCHS = {"llama": {}, "qwen2": {"architecture": "qwen2", "qkv_bias": True},
         "qwen3": {"architecture": "qwen3", "qk_norm": True},
         "mistral": {"architecture": "mistral", "sliding_window": 4, "sliding_layers": (0, 1)}}


@pytest.mark.parametrize("arch, spec", [(arch, "int4-g32-rtn") for arch in ARCHS]
                         + [("llama", "int4-g32-rtn-sym-head8"), ("qwen2", "int8")])
def test_written_file_is_the_model(tmp_path, monkeypatch, bpe_tokenizer, arch, spec):
    """specq reads the file back as the same config, gguf's dequantization of every tensor is the
    model's weight, and the file at its own precision decodes greedily as the source does (qwen2:
    with q/k/v biases; qwen3: q/k norms; llama and mistral: q/k rows in llama.cpp's order; mistral:
    a sliding window shorter than the output)."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    switches = ARCHS[arch]
    tok = bpe_tokenizer
    if arch.startswith("qwen"):  # transformers reads a qwen file's tokenizer as Qwen2's
        gguf_write.write(_model(tok, **switches), tmp_path / "tok.gguf")
        tok = gguf_io.tokenizer(tmp_path / "tok.gguf")
        tok.chat_template = TEMPLATE
    source = _quantized(_model(tok, **switches), spec)
    path = tmp_path / "model.gguf"
    counts = gguf_write.write(source, path)
    body = {"int4-g32-rtn": "Q4_1", "int4-g32-rtn-sym-head8": "Q4_0", "int8": "Q8_0"}[spec]
    assert counts[body] == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert counts["Q8_0"] == (1 if "head8" in spec else 14 if spec == "int8" else 0)
    parsed = gguf_io.read(path)
    assert parsed.config == source.net.config
    state = parsed.float_state_dict()
    for name, module in source.net.named_modules():
        if hasattr(module, "quantized"):
            assert torch.equal(state[f"{name}.weight"], module.quantized().dequantize()), name
    for name, value in source.net.named_parameters():
        assert torch.equal(state[name], value.detach()), name

    loaded = load(str(path), _backend())
    for prompt in ([1, 2, 3], [5, 9, 11, 40, 2]):
        a = specq.generate(source, prompt, None, max_new_tokens=24, ignore_eos=True)
        b = specq.generate(loaded, prompt, None, max_new_tokens=24, ignore_eos=True)
        assert a.token_ids == b.token_ids
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == tok.encode(text), text
    chat = [{"role": "user", "content": "ab c"}]
    assert (loaded.tokenizer.apply_chat_template(chat, tokenize=False)
            == tok.apply_chat_template(chat, tokenize=False))


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_calibrated_grids_are_written_exactly(tmp_path, bpe_tokenizer, method):
    """GPTQ and AWQ fit their grids through the same rounding: inside `fp16_offsets` every
    asymmetric layer is Q4_1 that gguf dequantizes to the model's weights."""
    model = _model(bpe_tokenizer)
    calibration = [torch.randint(0, VOCAB, (48,), generator=torch.Generator().manual_seed(i))
                   for i in range(4)]
    with fp16_offsets():
        quantize_model(model.net, f"int4-g32-{method}", calibration=calibration, progress=False)
    assert gguf_write.write(model, tmp_path / "m.gguf")["Q4_1"] == 2 * 7
    state = gguf_io.read(tmp_path / "m.gguf").float_state_dict()
    for name in ("layers.0.attention.wqkv", "layers.1.feed_forward.w13"):
        expected = model.net.get_submodule(name).quantized().dequantize()
        assert torch.equal(state[f"{name}.weight"], expected), name


def test_float_draft_keeps_its_dtype(tmp_path, bpe_tokenizer):
    """A float model (a distilled draft) is written in its own dtype: bf16 weights as BF16, norms
    as F32; gguf reads back the same values."""
    model = _model(bpe_tokenizer)
    model.net.to(torch.bfloat16)
    counts = gguf_write.write(model, tmp_path / "draft.gguf")
    assert counts["BF16"] == 2 * 7 + 2 and counts["F32"] == 2 * 2 + 1  # + embedding, head, norms
    state = gguf_io.read(tmp_path / "draft.gguf").float_state_dict()
    for name, value in model.net.state_dict().items():
        assert torch.equal(state[name], value.float()), name


def _run(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_cli_quantize_and_export_write_files_specq_runs(tmp_path, monkeypatch, capsys,
                                                        bpe_tokenizer):
    """`specq quantize --format gguf` writes the fp16-offset grid's model (the in-process one, bit
    for bit); `specq export-gguf` writes a saved quantized folder as it is."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    save_native(_model(bpe_tokenizer), tmp_path / "float")
    out = tmp_path / "q.gguf"
    code, err = _run(capsys, "quantize", str(tmp_path / "float"), "int4-g32-rtn", "--format",
                     "gguf", "--out", str(out))
    assert code == 0, err
    expected = _quantized(_model(bpe_tokenizer), "int4-g32-rtn")
    state = gguf_io.read(out).float_state_dict()
    assert torch.equal(state["layers.0.attention.wqkv.weight"],
                       expected.net.layers[0].attention.wqkv.quantized().dequantize())

    assert main(["quantize", str(tmp_path / "float"), "int4-g32-rtn-sym", "--out",
                 str(tmp_path / "qdir")]) == 0
    code, err = _run(capsys, "export-gguf", str(tmp_path / "qdir"), "--out",
                     str(tmp_path / "e.gguf"))
    assert code == 0, err
    saved = load(str(tmp_path / "qdir"), None).net
    state = gguf_io.read(tmp_path / "e.gguf").float_state_dict()
    assert torch.equal(state["layers.1.feed_forward.w2.weight"],
                       saved.layers[1].feed_forward.w2.quantized().dequantize())


@pytest.mark.parametrize("argv, message", [
    (["quantize", "MISSING", "int4-g16-rtn", "--format", "gguf", "--out", "x.gguf"],
     "not a multiple of GGUF's blocks of 32"),
    (["quantize", "MISSING", "int8-asym", "--format", "gguf", "--out", "x.gguf"],
     "asymmetric int8"),
    (["quantize", "MISSING", "int4-g32-rtn", "--format", "gguf", "--out", "x.bin"], "*.gguf"),
    (["quantize", "MISSING", "int4-g32-rtn", "--format", "gguf", "--out", "exists.gguf"],
     "exists: add --force"),
    (["export-gguf", "MISSING", "--out", "exists.gguf"], "exists: add --force"),
])
def test_bad_input_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys, argv,
                                                      message):
    """A model ref that does not exist would fail to load: these fail first, on their own line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists.gguf").write_bytes(b"x")
    code, err = _run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "exists.gguf").read_bytes() == b"x"


def test_default_grid_asymmetric_folder_is_refused_in_one_line(tmp_path, monkeypatch, capsys,
                                                               bpe_tokenizer):
    """A folder quantized without --format gguf (bf16 scales) whose Q4_1 offsets fp16 cannot hold:
    one line that says how to get an exact file; nothing written."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    model = _model(bpe_tokenizer)
    with torch.no_grad():
        model.net.layers[0].attention.wqkv.weight.copy_(torch.randn(128, 64) * 0.05)
    save_native(model, tmp_path / "float")
    assert _run(capsys, "quantize", str(tmp_path / "float"), "int4-g32-rtn", "--out",
                str(tmp_path / "qdir"))[0] == 0
    code, err = _run(capsys, "export-gguf", str(tmp_path / "qdir"), "--out",
                     str(tmp_path / "e.gguf"))
    assert code == 2 and "--format gguf" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*.tmp"))


# ------------------------------------------------------------------ llama.cpp

def _llama_cpp():
    """llama.cpp's Python binding (llama-cpp-python, built against the same llama.cpp; docs/
    performance.md says how), or skip."""
    try:
        import llama_cpp
    except (ImportError, OSError):  # not installed, or its library not found
        pytest.skip("no llama.cpp binding: pip install llama-cpp-python (LLAMA_CPP_LIB_PATH "
                    "names a build's libraries)")
    return llama_cpp


def _llama_cpp_agrees(path, model: Model, prompt: str, min_cosine: float, margin: float | None,
                      n: int = 32) -> None:
    """llama.cpp reads the file as specq does, judged along specq's greedy continuation: at every
    position its logits point the same way as specq's (cosine of the centred logits at least
    `min_cosine`; a misread tensor gives about 0), and where `margin` is given its top token is
    specq's wherever specq's top two are more than `margin` apart. Free-running tokens may part at
    a near-tie: llama.cpp quantizes activations its own way and keeps its KV cache in float16
    (and specq's decode steps and full passes can split a tie of a few thousandths differently)."""
    llama_cpp = _llama_cpp()
    ids = model.tokenizer.encode(prompt)
    seq = ids + specq.generate(model, prompt, None, max_new_tokens=n, ignore_eos=True).token_ids
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False,
                          logits_all=True)
    assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids
    llm.eval(seq)
    theirs = torch.tensor(np.array(llm.scores[:len(seq)]))[len(ids) - 1:-1]  # [n, vocab]
    with torch.no_grad():
        ours = model.runner(torch.tensor(seq))[len(ids) - 1:-1].float()  # [n, vocab]

    def centred(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True)

    cosine = torch.nn.functional.cosine_similarity(centred(theirs), centred(ours), dim=-1)
    assert cosine.min() >= min_cosine
    if margin is not None:
        top2 = ours.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > margin
        assert clear.float().mean() >= 0.75, "too many near-ties for the comparison to say much"
        assert torch.equal(theirs.argmax(-1)[clear], ours.argmax(-1)[clear])


@pytest.mark.llamacpp
@pytest.mark.parametrize("spec", ["int4-g32-rtn", "int4-g32-rtn-sym", "int8-g32"])
def test_llama_cpp_greedy_tokens_match_specqs(tmp_path, monkeypatch, bpe_tokenizer, spec):
    """llama.cpp runs the written file on its own kernels as specq runs the model (a tiny random
    model's near-ties are many: logits only)."""
    _llama_cpp()
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    source = _quantized(_model(bpe_tokenizer), spec)
    gguf_write.write(source, tmp_path / "model.gguf")
    _llama_cpp_agrees(tmp_path / "model.gguf", source, "abcab", min_cosine=0.95, margin=None)


@pytest.mark.real
@pytest.mark.llamacpp
def test_real_target_in_llama_cpp(tmp_path, monkeypatch):
    """The built-in target at int4-g32-rtn-sym, written by `specq quantize --format gguf`: specq
    runs the file as the model it quantized, and llama.cpp decodes it as specq does."""
    from specq.loading import precision

    _llama_cpp()
    out = tmp_path / "smol.gguf"
    assert main(["quantize", "smollm2-135m", "int4-g32-rtn-sym", "--format", "gguf", "--out",
                 str(out)]) == 0
    source = load("smollm2-135m", None)
    with fp16_offsets():
        precision.quantize_net(source.net, source.tokenizer, precision.parse("int4-g32-rtn-sym"))
    source.runner = backends.runner(source.net, _backend())
    prompt = "The capital of France is"
    assert (specq.generate(load(str(out)), prompt, None, max_new_tokens=32).token_ids
            == specq.generate(source, prompt, None, max_new_tokens=32).token_ids)
    _llama_cpp_agrees(out, source, prompt, min_cosine=0.99, margin=0.5)


@pytest.mark.parametrize("normalizer, written", [(None, True), ("NFC", True), ("NFKC", False),
                                                 ("Lowercase", False)])
def test_only_normalizers_llama_cpp_needs_not_run_are_written(bpe_tokenizer, normalizer, written):
    """Qwen2.5's tokenizer.json carries an NFC normalizer that llama.cpp's converter drops (text
    in NFC, as typed, tokenizes the same); one that changes ordinary text is refused."""
    import json

    from specq.errors import SpecqError
    from specq.loading.formats import gguf_vocab

    spec = json.loads(bpe_tokenizer.backend_tokenizer.to_str())
    spec["normalizer"] = {"type": normalizer} if normalizer else None
    if written:
        assert gguf_vocab.pre_name(spec) == "qwen2"
    else:
        with pytest.raises(SpecqError, match=f"a {normalizer} normalizer"):
            gguf_vocab.pre_name(spec)
