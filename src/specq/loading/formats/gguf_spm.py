"""A SentencePiece-style tokenizer (BPE with byte fallback over SentencePiece's ▁: Llama 2,
Mistral, Phi-3, Gemma) as llama.cpp's `llama` vocabulary, read from tokenizer.json alone.

llama.cpp keeps no merges for it: it joins the adjacent pair whose union scores highest. So the
scores are derived from the merges: the normal tokens score as SentencePiece scores its pieces,
minus their order, and the tokens the merges make take those scores in the order the merges first
make them. Where the ids follow the merges (Gemma's), that is the tokenizer.model's own scores,
which llama.cpp's converter copies; a token early in the ids and late in the merges scores late.
(llama.cpp's converter, given tokenizer.json alone, writes -1000 for every score: gguf-py's
LlamaHfVocab.) Whether llama.cpp puts a ▁ before the text (`add_space_prefix`) is read from how
the tokenizer spells spaces.
"""

from __future__ import annotations

import json

from ...errors import SpecqError
from .gguf_reader import TokenType

OTHER_SCORE = -1000.0  # control, user-defined and unused tokens (llama.cpp's converter's)


def is_spm(spec: dict) -> bool:
    """Whether a tokenizer.json is BPE with byte fallback (else byte-level, or refused)."""
    return spec["model"]["type"] == "BPE" and bool(spec["model"].get("byte_fallback"))


def space_prefix(spec: dict) -> bool:
    """llama.cpp's `add_space_prefix` for a BPE-with-byte-fallback tokenizer.json: spaces become ▁
    by a normalizer (Replace, after a Prepend of ▁ where a prefix is added: Llama 2's legacy form,
    Gemma's) or by a Metaspace pre-tokenizer that does not split words (transformers' Llama
    class). SpecqError for a pipeline llama.cpp does not run. A Metaspace adds no ▁ before text
    that starts with a space, nor (its `first` scheme) after a special token; llama.cpp, as
    SentencePiece, does: those texts tokenize one ▁ apart."""
    model = spec["model"]
    odd = [k for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix",
                       "ignore_merges") if model.get(k)]
    if odd:
        raise SpecqError(f"the tokenizer's BPE sets {', '.join(odd)}, which llama.cpp's "
                         "SentencePiece tokenizer does not run")
    norm, pre = _parts(spec.get("normalizer")), spec.get("pre_tokenizer")
    if not norm and pre and pre["type"] == "Metaspace" and pre.get("replacement") == "▁":
        if pre.get("split", True):
            raise SpecqError("the tokenizer's Metaspace splits words, which llama.cpp's "
                             "SentencePiece tokenizer does not")
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space") else "never")
        return scheme != "never"
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    prepend = {"type": "Prepend", "prepend": "▁"}
    if norm in ([replace], [prepend, replace]) and (pre is None or _splits_spaces(pre)):
        return norm[0] == prepend
    raise SpecqError("the tokenizer's normalizer and pre-tokenizer are none llama.cpp's "
                     "SentencePiece tokenizer runs ("
                     f"{json.dumps({'normalizer': spec.get('normalizer'), 'pre': pre})[:120]})")


def _parts(normalizer: dict | None) -> list[dict]:
    if normalizer is None:
        return []
    return normalizer["normalizers"] if normalizer["type"] == "Sequence" else [normalizer]


def _splits_spaces(pre: dict) -> bool:
    """Gemma's pre-tokenizer: a split at spaces, which the normalizer has made ▁ (so it never
    splits)."""
    return pre["type"] == "Split" and pre["pattern"] == {"String": " "} and not pre.get("invert")


def scores(merges: list[tuple[str, str]], tokens: list[str], types: list[int]) -> list[float]:
    """Each token's score (see the module's docstring): bytes 0, what is not a normal token
    OTHER_SCORE. SpecqError where llama.cpp's joining by score cannot follow the merges."""
    out = [0.0 if t == TokenType.BYTE else OTHER_SCORE for t in types]
    normal = [i for i, t in enumerate(types) if t == TokenType.NORMAL]
    for order, i in enumerate(normal):
        out[i] = -float(order)
    ids = {tokens[i]: i for i in normal}
    made = [ids[a + b] for a, b in merges if a + b in ids]  # in rank order
    _check(merges, made, ids, tokens)
    first = list(dict.fromkeys(made))
    for i, score in zip(first, sorted((out[i] for i in first), reverse=True)):
        out[i] = score
    return out


def _check(merges, made: list[int], ids: dict[str, int], tokens: list[str]) -> None:
    """llama.cpp joins any two adjacent tokens that make a third, the one that scores highest
    first: that is the merges' order only if every split of a token into two tokens is a merge (as
    in a tokenizer.json converted from a sentencepiece model) and the merges making one token rank
    together."""
    pairs = {(a, b) for a, b in merges}
    for token in ids:
        for k in range(1, len(token)):
            a, b = token[:k], token[k:]
            if a in ids and b in ids and (a, b) not in pairs:
                raise SpecqError(f"the tokenizer's merges lack one llama.cpp makes: {a!r} + {b!r} "
                                 f"makes {token!r}, so llama.cpp would tokenize differently")
    seen, last = set(), None
    for i in made:
        if i != last and i in seen:
            raise SpecqError(f"the tokenizer's merges that make {tokens[i]!r} do not rank "
                             "together; llama.cpp ranks a merge by what it makes, so it would "
                             "tokenize differently")
        seen.add(i)
        last = i
