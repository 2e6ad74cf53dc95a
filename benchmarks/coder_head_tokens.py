"""The ranked token list behind a narrowed draft head for the Qwen2.5-Coder vocabulary
(`qwen2.5-coder-0.5b@gguf-head32k`, `loading/file_spec.py`): which tokens the 1.5B target writes.

    python benchmarks/coder_head_tokens.py answers   # the target's greedy answers (resumable JSONL)
    python benchmarks/coder_head_tokens.py rank      # rank tokens, write src/specq/assets/heads/
    python benchmarks/coder_head_tokens.py answers --held-out   # the answers to the held-out prompts
    python benchmarks/coder_head_tokens.py coverage [OLD.npy ...]  # how much of them each list's heads cover

Ranking: tokens of the target's own greedy answers (128 new tokens, chat template) on the bench's
code and edit prompts *past the first HELD_OUT of each* (those are where acceptance is measured) and on
every chat prompt of the training split (the held-out ones are the bench's chat set), by count; then
every other token by its frequency in two kinds of text summed: the Python sources of the installed
packages (sorted paths, up to SOURCE_CHARS characters) and English prose (the shipped Shakespeare
plays), so that a chat answer's everyday words are not ranked below rare identifiers; ties towards
lower ids. The loader always adds the file's special tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

HELD_OUT = 4  # the first code and edit prompts: acceptance is measured there, not ranked on
HELD_OUT_CHAT = 8  # held-out chat prompts answered for `coverage` (none is ranked on)
HEADS_K = (32, 48, 64)  # head sizes `coverage` reports, in thousands (1024) of tokens
SOURCE_CHARS = 24_000_000
RANKED = 65536  # ids written: any head up to 64k tokens takes a prefix
ANSWERS = Path("benchmarks/results/coder-head-answers.jsonl")
HELD_ANSWERS = Path("benchmarks/results/coder-head-held-answers.jsonl")
HEADS = Path("src/specq/assets/heads")
NAME = "qwen2.5-coder"  # HEADS / NAME.npy (ranked ids, int32) and NAME.json (what they were made for)


def prompts() -> list[tuple[str, int, str]]:
    from specq.bench.coding import CODE_TASKS, EDIT_TASKS
    from specq.data import chat_prompts

    return ([("code", i, t) for i, t in enumerate(CODE_TASKS) if i >= HELD_OUT]
            + [("edit", i, t) for i, t in enumerate(EDIT_TASKS) if i >= HELD_OUT]
            + [("chat", i, t) for i, t in enumerate(chat_prompts("train"))])


def held_out_prompts() -> list[tuple[str, int, str]]:
    """The prompts acceptance is measured on: the first HELD_OUT code and edit prompts and the first
    HELD_OUT_CHAT of the bench's chat set."""
    from specq.bench.prompts import load_set

    return [(p.set, p.index, p.text) for name, n in (("code", HELD_OUT), ("edit", HELD_OUT), ("chat", HELD_OUT_CHAT))
            for p in load_set(name, n)]


def answers(limit: int, held_out: bool = False) -> None:
    """Append the target's greedy answers not yet in ANSWERS (or HELD_ANSWERS: to the held-out
    prompts), speculative with the 0.5B: the same tokens."""
    path, todo = (HELD_ANSWERS, held_out_prompts()) if held_out else (ANSWERS, prompts())
    import torch

    import specq

    torch.set_num_threads(2)
    done = {(r["set"], r["index"]) for r in map(json.loads, path.read_text().splitlines())} if path.exists() else set()
    todo = [p for p in todo if p[:2] not in done][:limit]
    target, draft = specq.load("qwen2.5-coder-1.5b"), specq.load("qwen2.5-coder-0.5b")
    path.parent.mkdir(parents=True, exist_ok=True)
    for kind, index, text in todo:
        out = specq.generate(target, text, draft, gamma=2, max_new_tokens=128, chat=True)
        with path.open("a") as f:
            f.write(json.dumps({"set": kind, "index": index, "ids": out.token_ids}) + "\n")
        print(kind, index, len(out.token_ids), file=sys.stderr, flush=True)


def source_text() -> str:
    """Python sources of the installed packages, in sorted path order, up to SOURCE_CHARS characters."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text)
        if size >= SOURCE_CHARS:
            break
    return "".join(parts)


def token_counts(tok, text: str, vocab: int) -> np.ndarray:
    """How often each token id occurs in `text` (tokenized in pieces of a million characters)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for ids in tok([text[i:i + 1_000_000] for i in range(0, len(text), 1_000_000)], add_special_tokens=False)["input_ids"]:
        counts += np.bincount(ids, minlength=vocab)[:vocab]
    return counts


def rank() -> None:
    from specq import data
    from specq.loading import gguf_io
    from specq.loading.builtins import BUILTIN_GGUF
    from specq.loading.file_spec import vocabulary_digest
    from specq.loading.gguf_load import tokenizer as gguf_tokenizer

    path = BUILTIN_GGUF["qwen2.5-coder-1.5b"]()
    tok = gguf_tokenizer(path)
    vocab = gguf_io.read(path).config.vocab_size  # the head's rows (the tokenizer's ids and padding)
    answer_counts = np.zeros(vocab, dtype=np.int64)
    rows = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    for r in rows:
        answer_counts += np.bincount(r["ids"], minlength=vocab)
    text, prose = source_text(), "".join(data.shakespeare_texts())
    source_counts, prose_counts = token_counts(tok, text, vocab), token_counts(tok, prose, vocab)
    frequency = source_counts / source_counts.sum() + prose_counts / prose_counts.sum()
    order = np.lexsort((np.arange(vocab), -frequency, -answer_counts))[:RANKED]
    HEADS.mkdir(parents=True, exist_ok=True)
    np.save(HEADS / f"{NAME}.npy", order.astype(np.int32))
    meta = {"vocabulary_sha256": vocabulary_digest(tok), "vocab_size": vocab, "ranked": RANKED,
            "answers": len(rows), "answer_tokens": int(answer_counts.sum()),
            "answer_distinct": int((answer_counts > 0).sum()), "source_chars": len(text),
            "source_tokens": int(source_counts.sum()), "prose_chars": len(prose),
            "prose_tokens": int(prose_counts.sum()), "how": "benchmarks/coder_head_tokens.py"}
    (HEADS / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


def coverage(lists: list[Path]) -> None:
    """Per list (the shipped one first) and head size: the share of the target's tokens in its
    held-out answers (HELD_ANSWERS), per prompt set, that the head keeps (special tokens aside)."""
    rows = [json.loads(line) for line in HELD_ANSWERS.read_text().splitlines()]
    by_set = {kind: np.array([i for r in rows if r["set"] == kind for i in r["ids"]]) for kind in dict.fromkeys(r["set"] for r in rows)}
    print("| list | head | " + " | ".join(f"{kind} ({ids.size} tokens)" for kind, ids in by_set.items()) + " |")
    print("|---|---|" + "---|" * len(by_set))
    for path in [HEADS / f"{NAME}.npy", *lists]:
        order = np.load(path)
        for k in HEADS_K:
            kept = order[:k * 1024]
            print(f"| {path} | {k}k | " + " | ".join(f"{np.isin(ids, kept).mean():.3f}" for ids in by_set.values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("answers", "rank", "coverage"))
    parser.add_argument("lists", nargs="*", type=Path, help="coverage: other ranked lists (.npy) beside the shipped one")
    parser.add_argument("--limit", type=int, default=1000, help="answers: at most this many new prompts")
    parser.add_argument("--held-out", action="store_true", help="answers: to the held-out prompts, for coverage")
    args = parser.parse_args()
    if args.step == "answers":
        answers(args.limit, args.held_out)
    elif args.step == "rank":
        rank()
    else:
        coverage(args.lists)


if __name__ == "__main__":
    main()
