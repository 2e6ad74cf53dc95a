"""A model's tokenizer as GGUF metadata, the way llama.cpp's converter writes a byte-level BPE
tokenizer (`tokenizer.ggml.model` gpt2): tokens, token types, merges, special ids, the chat
template, and the pre-tokenizer's name in llama.cpp (`tokenizer.ggml.pre`), read from the
tokenizer's own pre-tokenizer rather than guessed. What llama.cpp would tokenize differently is
refused in one line.
"""

from __future__ import annotations

import json

from ...errors import SpecqError

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
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # gguf.TokenType
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
    """llama.cpp's name for a tokenizer.json's pre-tokenizer (SpecqError: none runs it)."""
    model = spec["model"]
    normalizer = (spec.get("normalizer") or {}).get("type")
    fallback = model.get("byte_fallback")
    if model["type"] != "BPE" or fallback or normalizer not in HARMLESS_NORMALIZERS:
        kind = model["type"] + (" with byte fallback" if model.get("byte_fallback") else "")
        raise SpecqError("only byte-level BPE tokenizers (llama.cpp's gpt2) are written to GGUF "
                         f"here (this one: {kind}"
                         f"{f', a {normalizer} normalizer' if normalizer else ''})")
    name = PRE.get(_shape(spec.get("pre_tokenizer")))
    if name is None:
        raise SpecqError("the tokenizer's pre-tokenizer is none llama.cpp names "
                         f"({json.dumps(spec.get('pre_tokenizer'))[:120]})")
    return name


def add_tokenizer(writer, tok, vocab_size: int, eos_ids: frozenset[int]) -> None:
    """Write `tok` (a fast transformers tokenizer) onto a gguf.GGUFWriter for a model of
    `vocab_size` rows (ids past the tokenizer's are written as unused [PAD<i>] tokens)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise SpecqError(f"the tokenizer ({type(tok).__name__}) has no tokenizer.json to write")
    spec = json.loads(backend.to_str())
    pre = pre_name(spec)
    vocab = tok.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise SpecqError(f"the tokenizer has ids up to {max(vocab.values())}, past the model's "
                         f"{vocab_size} rows")
    reverse = {i: t for t, i in vocab.items()}
    added = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        tokens.append(reverse[i])
        types.append(NORMAL if i not in added else CONTROL if added[i].special else USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    _add_specials(writer, tok, eos_ids)
    template = getattr(tok, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)


def _add_specials(writer, tok, eos_ids: frozenset[int]) -> None:
    """Special token ids, whether encoding adds BOS (as the tokenizer does), and the model's end
    tokens: the tokenizer's EOS, another end id of the model as llama.cpp's end-of-turn."""
    for add, i in ((writer.add_bos_token_id, tok.bos_token_id),
                   (writer.add_eos_token_id, tok.eos_token_id),
                   (writer.add_unk_token_id, tok.unk_token_id),
                   (writer.add_pad_token_id, tok.pad_token_id)):
        if i is not None:
            add(int(i))
    ids = tok("a", add_special_tokens=True)["input_ids"]
    writer.add_add_bos_token(tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id])
    others = sorted(eos_ids - {tok.eos_token_id})
    if tok.eos_token_id is None and others:
        writer.add_eos_token_id(others.pop(0))
    if others:
        writer.add_eot_token_id(others[0])
