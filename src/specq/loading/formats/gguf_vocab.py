"""A model's tokenizer as GGUF metadata, the way llama.cpp's converter writes it: tokens, token
types, special ids, whether encoding adds BOS / EOS, the chat template; for a byte-level BPE
tokenizer (`tokenizer.ggml.model` gpt2) its merges and the pre-tokenizer's name in llama.cpp
(`tokenizer.ggml.pre`), read from the tokenizer's own pre-tokenizer rather than guessed; for BPE
with byte fallback over SentencePiece's ▁ (llama) scores in place of merges (`gguf_spm`). What
llama.cpp would tokenize differently is refused in one line.
"""

from __future__ import annotations

import json
import re

from ...errors import SpecqError
from . import gguf_spm
from .gguf_reader import TokenType

# A tokenizer.json pre-tokenizer (its parts, as `_shape` gives them) -> the `tokenizer.ggml.pre`
# whose regexes llama.cpp runs for it (llama-vocab.cpp).
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_QWEN2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
           "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
PRE = {
    (("ByteLevel", _GPT2),): "gpt-2",
    (("Digits", True), ("ByteLevel", _GPT2)): "smollm",
    (("Split", _QWEN2), ("ByteLevel", None)): "qwen2",
    (("Split", _LLAMA3), ("ByteLevel", None)): "llama-bpe",
}
BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")  # byte fallback's tokens
# Normalizers llama.cpp's converter writes no trace of and llama.cpp does not run: Qwen2's NFC
# changes no text already in NFC (what editors and the web write), so it is written as llama.cpp's
# own converter writes it.
HARMLESS_NORMALIZERS = (None, "NFC")


def _shape(pre: dict | None) -> tuple:
    """A pre-tokenizer's parts: (type, what decides its splits); ByteLevel with its regex, GPT-2's,
    or None where it only maps bytes."""
    parts = pre.get("pretokenizers", []) if pre and pre["type"] == "Sequence" else [pre]
    shape = []
    for p in parts:
        if p is None:
            return ()
        if p["type"] == "ByteLevel":
            if p.get("add_prefix_space"):
                return ()
            shape.append(("ByteLevel", _GPT2 if p.get("use_regex", True) else None))
        elif p["type"] == "Split" and p.get("behavior") == "Isolated" and not p.get("invert"):
            shape.append(("Split", p["pattern"].get("Regex")))
        elif p["type"] == "Digits":
            shape.append(("Digits", bool(p.get("individual_digits"))))
        else:
            return ()
    return tuple(shape)


def pre_name(spec: dict) -> str:
    """llama.cpp's name for a byte-level BPE tokenizer.json's pre-tokenizer (SpecqError: none
    runs it)."""
    model = spec["model"]
    if model["type"] != "BPE":
        raise SpecqError("only BPE tokenizers are written to GGUF, byte-level (llama.cpp's gpt2) "
                         f"or with byte fallback (its llama): this one is {model['type']}")
    normalizer = (spec.get("normalizer") or {}).get("type")
    if normalizer not in HARMLESS_NORMALIZERS:
        raise SpecqError(f"a byte-level BPE tokenizer with a {normalizer} normalizer has no GGUF "
                         f"form llama.cpp runs ({json.dumps(spec['normalizer'])[:120]})")
    name = PRE.get(_shape(spec.get("pre_tokenizer")))
    if name is None:
        raise SpecqError("the tokenizer's pre-tokenizer is none llama.cpp names "
                         f"({json.dumps(spec.get('pre_tokenizer'))[:120]})")
    return name


def add_tokenizer(writer, tok, vocab_size: int, eos_ids: frozenset[int]) -> None:
    """Write `tok` (a fast transformers tokenizer) onto a gguf.GGUFWriter for a model of
    `vocab_size` rows (ids past the tokenizer's are written as unused [PAD<i>] tokens)."""
    for add, value in _vocabulary(tok, vocab_size):
        getattr(writer, add)(value)
    _add_specials(writer, tok, eos_ids)
    template = getattr(tok, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)


def check(tok, vocab_size: int) -> None:
    """Refuse, before a model is quantized for a GGUF file, a tokenizer `add_tokenizer` would."""
    _vocabulary(tok, vocab_size)


def _vocabulary(tok, vocab_size: int) -> list[tuple[str, object]]:
    """The tokenizer's model, tokens, types and how llama.cpp joins them (merges, or scores), as
    GGUFWriter calls; SpecqError for a tokenizer llama.cpp would tokenize differently."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise SpecqError(f"the tokenizer ({type(tok).__name__}) has no tokenizer.json to write")
    spec = json.loads(backend.to_str())
    spm = gguf_spm.is_spm(spec)
    tokens, types = _tokens(tok, vocab_size, spm)
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in spec["model"].get("merges", [])]
    calls = [("add_tokenizer_model", "llama" if spm else "gpt2"),
             ("add_tokenizer_pre", "default" if spm else pre_name(spec)),
             ("add_token_list", tokens), ("add_token_types", types)]
    if spm:
        return calls + [("add_add_space_prefix", gguf_spm.space_prefix(spec)),
                        ("add_token_scores", gguf_spm.scores(merges, tokens, types))]
    return calls + [("add_token_merges", [" ".join(m) for m in merges])]


def _tokens(tok, vocab_size: int, spm: bool) -> tuple[list[str], list[int]]:
    """Each id's token and type: an added token is control (special) or user-defined, which
    llama.cpp matches in the raw text, so a SentencePiece one is spelled with spaces, not ▁ (as
    llama.cpp's converter writes them); byte fallback's <0xXX> are bytes."""
    vocab = tok.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise SpecqError(f"the tokenizer has ids up to {max(vocab.values())}, past the model's "
                         f"{vocab_size} rows")
    reverse = {i: t for t, i in vocab.items()}
    added = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        token = reverse.get(i, f"[PAD{i}]")
        if i not in reverse:
            kind = TokenType.UNUSED
        elif i in added:
            kind = TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED
            token = token.replace("▁", " ") if spm and kind == TokenType.USER_DEFINED else token
        else:
            kind = TokenType.BYTE if spm and BYTE_TOKEN.fullmatch(token) else TokenType.NORMAL
        tokens.append(token)
        types.append(kind)
    return tokens, types


def _add_specials(writer, tok, eos_ids: frozenset[int]) -> None:
    """Special token ids, whether encoding adds BOS and EOS (as the tokenizer does), the model's end
    tokens: the tokenizer's EOS, another end id of the model as llama.cpp's end-of-turn."""
    for add, i in ((writer.add_bos_token_id, tok.bos_token_id),
                   (writer.add_eos_token_id, tok.eos_token_id),
                   (writer.add_unk_token_id, tok.unk_token_id),
                   (writer.add_pad_token_id, tok.pad_token_id)):
        if i is not None:
            add(int(i))
    ids = tok("a", add_special_tokens=True)["input_ids"]
    writer.add_add_bos_token(tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id])
    writer.add_add_eos_token(tok.eos_token_id is not None and ids[-1:] == [tok.eos_token_id])
    others = sorted(eos_ids - {tok.eos_token_id})
    if tok.eos_token_id is None and others:
        writer.add_eos_token_id(others.pop(0))
    if others:
        writer.add_eot_token_id(others[0])
